//! Settings of the transcoder: `[telemetry]`, `[amqp]`, `[s3]`, `[transcoder]` and `[scanner]`
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
    /// `[scanner]`: the malware scan before any decoding. Missing section: the
    /// defaults, i.e. enabled (a file is never silently unscanned).
    #[serde(default)]
    pub scanner: ScannerSettings,
}

/// `[scanner]` (env: `VID__SCANNER__<KEY>`): clamd, reached with `INSTREAM`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct ScannerSettings {
    /// Scan every source before it is probed. `false` (development only): the
    /// scan is skipped and the operation shows `metadata.scan = "skipped"`.
    pub enabled: bool,
    /// clamd's address: `host:port` (its `TCPSocket`/`TCPAddr`) or
    /// `unix:/path/clamd.sock` (its `LocalSocket`).
    pub address: String,
    /// clamd's `StreamMaxLength`, in bytes; keep both equal. Larger sources are
    /// not scanned and fail with `file_too_large_to_scan` (fail closed).
    pub stream_max_length_bytes: u64,
    /// Bytes per `INSTREAM` chunk.
    pub chunk_bytes: usize,
    /// Connecting to clamd may take this long.
    pub connect_timeout_seconds: f64,
    /// Each chunk write may take this long.
    pub io_timeout_seconds: f64,
    /// After the last chunk, clamd has this long to answer.
    pub scan_timeout_seconds: f64,
    /// Retries after a failed attempt (clamd unreachable, timed out, errored);
    /// once spent, the operation fails with `scan_unavailable`.
    pub retry_attempts: u32,
    /// Sleep before the first retry; doubles with each retry.
    pub retry_backoff_seconds: f64,
    /// Upper bound of that sleep.
    pub retry_backoff_max_seconds: f64,
    /// Infected sources are moved (copy, then delete) under
    /// `<quarantine_prefix><tenant>/…`; nothing ever presigns a URL there.
    /// Empty: they are deleted instead.
    pub quarantine_prefix: String,
}

impl Default for ScannerSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            address: "127.0.0.1:3310".into(),
            stream_max_length_bytes: 200 * 1024 * 1024,
            chunk_bytes: 256 * 1024,
            connect_timeout_seconds: 5.0,
            io_timeout_seconds: 30.0,
            scan_timeout_seconds: 300.0,
            retry_attempts: 5,
            retry_backoff_seconds: 2.0,
            retry_backoff_max_seconds: 30.0,
            quarantine_prefix: "quarantine/".into(),
        }
    }
}

impl ScannerSettings {
    /// The clamd client these settings describe.
    pub fn client(&self) -> crate::scan::Client {
        let secs = |s: f64| Duration::from_secs_f64(s.max(0.001));
        crate::scan::Client {
            address: crate::scan::Address::parse(&self.address),
            connect_timeout: secs(self.connect_timeout_seconds),
            io_timeout: secs(self.io_timeout_seconds),
            reply_timeout: secs(self.scan_timeout_seconds),
            chunk_bytes: self.chunk_bytes,
            max_stream_bytes: self.stream_max_length_bytes,
        }
    }

    /// The sleep before retry number `n` (0-based).
    pub fn backoff(&self, n: u32) -> Duration {
        let s = self.retry_backoff_seconds.max(0.0) * 2f64.powi(n.min(30) as i32);
        Duration::from_secs_f64(s.min(self.retry_backoff_max_seconds.max(0.0)))
    }
}

/// `[transcoder]` (env: `VID__TRANSCODER__<KEY>`).
#[derive(Debug, Clone, Deserialize)]
pub struct TranscoderSettings {
    /// Address of the `/healthz` + `/readyz` server, e.g. `127.0.0.1:9101`.
    pub health_listen: SocketAddr,
    /// Jobs worked on at once (= AMQP prefetch), at least 1.
    pub concurrency: u16,
    /// Local scratch directory; each job works in `<work_dir>/<operation id>/`,
    /// locked by `<operation id>.lock` beside it and removed afterwards. Job
    /// directories left by a killed process are removed when a worker starts;
    /// processes may share one work dir (see `crate::workdir`).
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
    /// Target segment duration of the streaming packaging (CMAF, HLS, DASH),
    /// seconds; also the GOP: one IDR frame per segment in every rung.
    /// Optional; default 4 s.
    #[serde(default = "default_segment_seconds")]
    pub segment_seconds: f64,
}

fn default_segment_seconds() -> f64 {
    4.0
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
