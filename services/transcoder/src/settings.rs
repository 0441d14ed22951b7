//! Settings of the transcoder: `[telemetry]`, `[amqp]`, `[s3]` and `[transcoder]`
//! from `config/default.toml`, the profile file and `VID__…` variables.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use vid_infra::settings::{AmqpSettings, S3Settings, TelemetrySettings};

use crate::media::Limits;

/// Everything the transcoder reads. `Debug` is safe to log: secrets are redacted.
#[derive(Debug, Clone, Deserialize)]
pub struct Settings {
    /// Logging.
    pub telemetry: TelemetrySettings,
    /// RabbitMQ.
    pub amqp: AmqpSettings,
    /// The media bucket.
    pub s3: S3Settings,
    /// `[transcoder]`.
    pub transcoder: TranscoderSettings,
}

/// `[transcoder]` (env: `VID__TRANSCODER__<KEY>`).
#[derive(Debug, Clone, Deserialize)]
pub struct TranscoderSettings {
    /// Address of the `/healthz` + `/readyz` server, e.g. `127.0.0.1:9101`.
    pub health_listen: SocketAddr,
    /// Jobs worked on at once (= AMQP prefetch), at least 1.
    pub concurrency: u16,
    /// Local scratch directory; each job works in `<work_dir>/<operation id>/`, removed afterwards.
    pub work_dir: PathBuf,
    /// Longest accepted source, seconds.
    pub max_duration_seconds: f64,
    /// Widest accepted source (coded), pixels.
    pub max_width: u32,
    /// Tallest accepted source (coded), pixels.
    pub max_height: u32,
    /// A child with no progress for this long is killed: `transcode_stalled`.
    pub stall_timeout_seconds: u64,
    /// Ladder rungs (short side in pixels), e.g. `[1080, 720, 480, 360]`.
    pub ladder: Vec<u32>,
    /// On SIGTERM, how long running jobs may take to finish before they are
    /// killed and requeued. Optional; default 30 s.
    #[serde(default = "default_grace")]
    pub shutdown_grace_seconds: u64,
    /// Sleep before a transient failure's `basic_nack(requeue)`, seconds. Optional; default 3 s.
    #[serde(default = "default_retry_backoff")]
    pub retry_backoff_seconds: f64,
}

fn default_grace() -> u64 {
    30
}

fn default_retry_backoff() -> f64 {
    3.0
}

impl TranscoderSettings {
    /// The media limits.
    pub fn limits(&self) -> Limits {
        Limits { max_duration_seconds: self.max_duration_seconds, max_width: self.max_width, max_height: self.max_height }
    }

    /// [`Self::stall_timeout_seconds`] as a duration.
    pub fn stall_timeout(&self) -> Duration {
        Duration::from_secs(self.stall_timeout_seconds.max(1))
    }
}

impl Settings {
    /// Loads the settings (see `vid_infra::settings::load`).
    pub fn load() -> anyhow::Result<Self> {
        vid_infra::settings::load()
    }
}
