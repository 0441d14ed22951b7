//! The api's settings (see `config/default.toml` for every default).

use serde::Deserialize;
use vid_infra::settings::{AmqpSettings, DatabaseSettings, S3Settings, TelemetrySettings};
use vid_infra::SecretString;

/// Everything the api reads from `config/` and `VID__…` variables.
#[derive(Debug, Clone, Deserialize)]
pub struct Settings {
    /// Logs.
    pub telemetry: TelemetrySettings,
    /// PostgreSQL.
    pub database: DatabaseSettings,
    /// RabbitMQ.
    pub amqp: AmqpSettings,
    /// The media bucket.
    pub s3: S3Settings,
    /// HTTP listener.
    pub api: HttpSettings,
    /// Upload limits.
    pub uploads: UploadSettings,
    /// Operation supervision.
    pub operations: OperationSettings,
    /// Webhook endpoint policy.
    pub webhooks: WebhookSettings,
    /// `[ingest]`: the SSRF policy of `POST /ingests` source URLs, shared with
    /// the ingest worker (`require_https`, `allow_cidrs`, `allowed_ports`;
    /// unknown keys refused). Absent: http(s), global addresses only, any port.
    #[serde(default)]
    pub ingest: vid_netguard::UrlPolicy,
}

/// `[api]`
#[derive(Debug, Clone, Deserialize)]
pub struct HttpSettings {
    /// `host:port` to bind; port 0 picks a free port (tests).
    pub listen: String,
    /// Public base URL for absolute links; empty for relative `Location` headers.
    pub public_url: String,
    /// After SIGTERM, open `:wait` calls and operation event streams keep
    /// going for this many seconds, then end cleanly (`:wait` answers
    /// `timeout` with the current state; a stream ends, and the client
    /// reconnects with `Last-Event-ID` to another replica). Below the HTTP
    /// server's 30 s shutdown limit, so no response is ever cut.
    #[serde(default = "default_stream_drain_seconds")]
    pub stream_drain_seconds: u64,
    /// The playback service's public origin (and path prefix, if any), e.g.
    /// `https://stream.example.com`: every playback ID's `hls_url` is
    /// `<playback_base_url>/play/{pb}.m3u8` and its `dash_url`
    /// `<playback_base_url>/play/{pb}.mpd` (a trailing `/` is ignored). Only
    /// the api reads it (`VID__API__PLAYBACK_BASE_URL`); the playback service's
    /// own settings are in `[playback]`. Must be an absolute `http(s)://` URL
    /// (checked by [`crate::Application::build`]).
    #[serde(default = "default_playback_base_url")]
    pub playback_base_url: String,
}

fn default_stream_drain_seconds() -> u64 {
    20
}

fn default_playback_base_url() -> String {
    "http://127.0.0.1:8090".to_owned()
}

impl HttpSettings {
    /// Checks [`HttpSettings::playback_base_url`]: an absolute `http://` or
    /// `https://` URL with a host, without query or fragment.
    ///
    /// Errors: a message naming the setting and the value.
    pub fn check_playback_base_url(&self) -> anyhow::Result<()> {
        let raw = self.playback_base_url.as_str();
        let rest = raw.strip_prefix("https://").or_else(|| raw.strip_prefix("http://"));
        let host = rest.map(|r| r.split('/').next().unwrap_or_default());
        let ok = host.is_some_and(|h| !h.is_empty() && !h.contains('@'))
            && !raw.contains(['?', '#'])
            && !raw.chars().any(|c| c.is_whitespace() || c.is_control());
        anyhow::ensure!(
            ok,
            "api.playback_base_url must be an absolute http(s) URL without query or fragment, e.g. https://stream.example.com (got `{raw}`)"
        );
        Ok(())
    }
}

/// `[uploads]`
#[derive(Debug, Clone, Deserialize)]
pub struct UploadSettings {
    /// Largest accepted `size_bytes`.
    pub max_size_bytes: u64,
    /// Accepted `content_type`s (compared case-insensitively, parameters ignored).
    pub allowed_content_types: Vec<String>,
    /// Preferred part size in bytes; raised to keep within 10,000 parts, never below 5 MiB.
    pub target_part_size_bytes: u64,
    /// Lifetime of each presigned part URL, in seconds.
    pub part_url_ttl_seconds: u64,
    /// An upload not completed within this many seconds is aborted and marked `expired`.
    pub expire_after_seconds: u64,
    /// Lifetime of rendition and poster download URLs, in seconds.
    pub download_url_ttl_seconds: u64,
    /// How long an upload's client token (`vidu_…`) keeps working for its
    /// operation after the operation became terminal, in seconds (issue 21;
    /// until then it works until the upload's `expires_at`, or, once completed,
    /// while the operation runs).
    #[serde(default = "default_client_token_grace_seconds")]
    pub client_token_grace_seconds: u64,
}

fn default_client_token_grace_seconds() -> u64 {
    600
}

/// `[operations]`
#[derive(Debug, Clone, Deserialize)]
pub struct OperationSettings {
    /// A running operation with no report for this long is failed (`worker_lost`).
    pub heartbeat_timeout_seconds: u64,
    /// Open `:wait` calls plus event streams one tenant may hold on one api
    /// process; past it the answer is `429 too_many_watchers`.
    #[serde(default = "default_max_watchers_per_tenant")]
    pub max_watchers_per_tenant: usize,
    /// Open `:wait` calls plus event streams one client token (`vidu_…`,
    /// issue 21) may hold on one api process, counted before (and also
    /// toward) the tenant's bound; past it: `429 too_many_watchers`.
    #[serde(default = "default_max_watchers_per_client_token")]
    pub max_watchers_per_client_token: usize,
    /// The longest `POST /operations/{id}:wait` holds, in seconds (a body's
    /// `timeout_seconds` above it is cut to it). Keep it below the idle
    /// timeout of every proxy in front of the api.
    #[serde(default = "default_max_wait_seconds")]
    pub max_wait_seconds: u64,
    /// A `pending` operation (no `Started` accepted) whose job was last
    /// published this many seconds ago has it published again (attempt + 1).
    #[serde(default = "default_redrive_after_seconds")]
    pub redrive_after_seconds: u64,
    /// Re-drives before a `pending` operation may fail as `job_lost`.
    #[serde(default = "default_max_redrives")]
    pub max_redrives: u32,
    /// ...and the age (seconds since `complete`) it must also have reached.
    #[serde(default = "default_job_lost_after_seconds")]
    pub job_lost_after_seconds: u64,
    /// An ingest still awaiting its source (no `downloaded` report) with no
    /// sign of life for this long (its job last published, or its last
    /// download report, this many seconds ago) has its job published again
    /// (attempt + 1, at most `max_redrives` times): the job was lost. Keep it
    /// above the ingest worker's `idle_timeout_ms` and above any wait in its
    /// queue the backlog should show.
    #[serde(default = "default_ingest_redrive_after_seconds")]
    pub ingest_redrive_after_seconds: u64,
    /// An ingest still awaiting its source this many seconds after
    /// `POST /ingests` fails as `job_lost` (its total deadline), whatever its
    /// re-drives; a worker still downloading it is told to stop (cancel
    /// broadcast). Keep it above the worker's `total_timeout_seconds`.
    #[serde(default = "default_ingest_lost_after_seconds")]
    pub ingest_lost_after_seconds: u64,
    /// Seconds between janitor passes.
    #[serde(default = "default_janitor_interval_seconds")]
    pub janitor_interval_seconds: u64,
}

fn default_redrive_after_seconds() -> u64 {
    1800
}

fn default_max_redrives() -> u32 {
    8
}

fn default_job_lost_after_seconds() -> u64 {
    86400
}

fn default_ingest_redrive_after_seconds() -> u64 {
    900
}

fn default_ingest_lost_after_seconds() -> u64 {
    21600
}

fn default_janitor_interval_seconds() -> u64 {
    30
}

fn default_max_watchers_per_tenant() -> usize {
    100
}

fn default_max_wait_seconds() -> u64 {
    60
}

fn default_max_watchers_per_client_token() -> usize {
    4
}

/// `[webhooks]`
#[derive(Debug, Clone, Deserialize)]
pub struct WebhookSettings {
    /// CIDRs endpoint URLs may resolve to although not globally routable.
    pub allow_cidrs: Vec<ipnet::IpNet>,
    /// Refuse `http://` endpoint URLs.
    pub require_https: bool,
    /// The ports endpoint URLs may use (empty: any): what the network lets the
    /// dispatcher reach; see `vid_netguard::UrlPolicy::allowed_ports`.
    #[serde(default)]
    pub allowed_ports: Vec<u16>,
    /// 64 hex characters: the AES-256-GCM key sealing endpoint secrets.
    pub secret_key: SecretString,
    /// How long a rotated-out secret keeps signing, in seconds.
    pub secret_rotation_overlap_seconds: u64,
}
