//! The playback service's settings: `[telemetry]`, `[database]`, `[s3]` (the
//! shared sections) and `[playback]`, loaded by `vid_infra::settings::load`
//! like every other service. Sections of other services are ignored, and so
//! are `[playback]` keys this service does not read (`base_url` is the api's:
//! the public origin it writes into `hls_url`/`dash_url`).

use serde::Deserialize;
use vid_infra::settings::{DatabaseSettings, S3Settings, TelemetrySettings};

/// Everything the playback service reads.
#[derive(Debug, Clone, Deserialize)]
pub struct Settings {
    /// Logs.
    pub telemetry: TelemetrySettings,
    /// PostgreSQL: `playback_ids` joined to `videos`, read only.
    pub database: DatabaseSettings,
    /// The media bucket, read only.
    pub s3: S3Settings,
    /// `[playback]`.
    pub playback: PlaybackSettings,
}

/// `[playback]` (see `config/default.toml` for the reasons behind the defaults).
#[derive(Debug, Clone, Deserialize)]
pub struct PlaybackSettings {
    /// Address to bind, e.g. `127.0.0.1:8090` (`127.0.0.1:0` picks a free port).
    pub listen: String,
    /// How long one replica remembers the answer of a playback-id lookup
    /// (found or not), milliseconds. Bounds how long a deleted playback ID
    /// keeps working on this replica after its row is deleted. 0: every
    /// request reads PostgreSQL.
    #[serde(default = "default_lookup_cache_ms")]
    pub lookup_cache_ms: u64,
    /// At most this many remembered lookups per replica (past it, expired
    /// entries are dropped, then everything).
    #[serde(default = "default_lookup_cache_entries")]
    pub lookup_cache_entries: usize,
    /// Bytes of manifest objects (playlists, MPDs: immutable once the video
    /// is ready) one replica keeps in memory. 0: no manifest cache.
    #[serde(default = "default_manifest_cache_bytes")]
    pub manifest_cache_bytes: usize,
    /// Bytes of kept frames and stored thumbnails (issue 20; immutable,
    /// each written under its video's prefix) one replica keeps in memory,
    /// apart from the manifests so image traffic never evicts a playlist.
    /// An object over an eighth of it is served but not kept (as for
    /// manifests). 0: every image is read from storage.
    #[serde(default = "default_image_cache_bytes")]
    pub image_cache_bytes: usize,
    /// `Cache-Control: max-age` of playlists and MPDs, seconds: also how long
    /// a CDN in front may keep serving a deleted playback ID's manifests.
    #[serde(default = "default_manifest_max_age_seconds")]
    pub manifest_max_age_seconds: u32,
    /// `Cache-Control: max-age` of init and media segments, seconds
    /// (immutable objects).
    #[serde(default = "default_media_max_age_seconds")]
    pub media_max_age_seconds: u32,
    /// After SIGTERM, in-flight requests (a segment being streamed) get this
    /// long to finish, seconds.
    #[serde(default = "default_shutdown_grace_seconds")]
    pub shutdown_grace_seconds: u64,
    /// HTTP worker threads; 0: one per CPU core.
    #[serde(default)]
    pub workers: usize,
}

fn default_lookup_cache_ms() -> u64 {
    1000
}
fn default_lookup_cache_entries() -> usize {
    100_000
}
fn default_manifest_cache_bytes() -> usize {
    64 * 1024 * 1024
}
fn default_image_cache_bytes() -> usize {
    32 * 1024 * 1024
}
fn default_manifest_max_age_seconds() -> u32 {
    10
}
fn default_media_max_age_seconds() -> u32 {
    31_536_000
}
fn default_shutdown_grace_seconds() -> u64 {
    20
}
