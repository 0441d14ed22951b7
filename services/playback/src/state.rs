//! What every request handler shares.

use std::sync::Arc;

use crate::cache::{LookupCache, ManifestCache};
use crate::settings::Settings;

/// Shared state (cheap to clone).
#[derive(Clone)]
pub struct AppState {
    /// PostgreSQL, read only.
    pub db: vid_db::Pool,
    /// The media bucket's client (reads only).
    pub s3: aws_sdk_s3::Client,
    /// Recent playback-ID lookups.
    pub lookups: Arc<LookupCache>,
    /// Manifest objects.
    pub manifests: Arc<ManifestCache>,
    /// Kept frames and stored thumbnails (a second cache of the same kind,
    /// its own budget: `playback.image_cache_bytes`).
    pub images: Arc<ManifestCache>,
    /// Parsed public keys of signing keys (never whether a key exists).
    pub signing_keys: Arc<crate::cache::KeyCache>,
    /// `Cache-Control` of manifests: `public, max-age=<manifest_max_age_seconds>`.
    pub manifest_cache_control: Arc<str>,
    /// `Cache-Control` of media: `public, max-age=<media_max_age_seconds>, immutable`.
    pub media_cache_control: Arc<str>,
    /// The settings.
    pub settings: Arc<Settings>,
}
