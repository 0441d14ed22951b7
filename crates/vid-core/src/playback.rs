//! Playback IDs and the stable playback URLs (issue 19).
//!
//! A ready video is played through `pb_…` ids, never through storage URLs:
//!
//! ```text
//! GET <playback base>/play/{pb}.m3u8                 HLS master playlist (RFC 8216 §4.3.4)
//! GET <playback base>/play/{pb}.mpd                  DASH MPD (ISO/IEC 23009-1), static
//! GET <playback base>/play/{pb}/{track}/index.m3u8   HLS media playlist of one track
//! GET <playback base>/play/{pb}/{track}/init.mp4     its CMAF header
//! GET <playback base>/play/{pb}/{track}/seg-NNNNN.m4s  its segments
//! ```
//!
//! `{track}` is a rung name (`720p`, …) or `audio`. The URLs work for as long
//! as the playback ID exists, need no API key (a `public` id is itself the
//! capability) and never show the bucket, the key layout or a tenant id.
//! The api writes the `playback_ids` table; the playback service only reads it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::PlaybackId;

text_state! {
    /// Who may play through a playback ID (Mux's `playback_policy`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    #[serde(rename_all = "snake_case")]
    pub enum PlaybackPolicy {
        /// Anyone who has the URL: the id is the capability.
        Public = "public",
        /// Every URL also needs a short JWT signed with one of the tenant's
        /// signing keys (issue 20).
        Signed = "signed",
    }
}

/// One playback ID of a video, as `GET /videos/{id}` and
/// `POST /videos/{id}/playback-ids` answer it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlaybackIdView {
    /// `pb_…`
    pub id: PlaybackId,
    /// See [`PlaybackPolicy`].
    pub policy: PlaybackPolicy,
    /// The HLS master playlist: `<playback base>/play/{id}.m3u8`. Stable.
    pub hls_url: String,
    /// The DASH MPD: `<playback base>/play/{id}.mpd`. Stable.
    pub dash_url: String,
    /// RFC 3339.
    pub created_at: DateTime<Utc>,
}

impl PlaybackIdView {
    /// The view of playback ID `id` served from `base` (the playback
    /// service's public origin and path prefix, without a trailing `/`,
    /// e.g. `https://stream.example.com`).
    pub fn new(base: &str, id: PlaybackId, policy: PlaybackPolicy, created_at: DateTime<Utc>) -> Self {
        let base = base.trim_end_matches('/');
        Self { hls_url: hls_url(base, &id), dash_url: dash_url(base, &id), id, policy, created_at }
    }
}

/// `POST /videos/{id}/playback-ids` request body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreatePlaybackId {
    /// The new id's policy.
    pub policy: PlaybackPolicy,
}

/// The master playlist URL of `id` under `base` (no trailing `/`).
pub fn hls_url(base: &str, id: &PlaybackId) -> String {
    format!("{base}/play/{id}.m3u8")
}

/// The MPD URL of `id` under `base` (no trailing `/`).
pub fn dash_url(base: &str, id: &PlaybackId) -> String {
    format!("{base}/play/{id}.mpd")
}

/// The `aud` claim of a playback token (issue 20): which kind of resource
/// a token opens. A token for one audience opens nothing of another, so a
/// thumbnail token shared on a social card cannot play the video.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Audience {
    /// `v`: the stream (manifests, init segments, media segments).
    Video,
    /// `t`: `thumbnail.jpg`.
    Thumbnail,
    /// `s`: `storyboard.jpg`, `.vtt`, `.json`.
    Storyboard,
    /// `g`: `poster.jpg`.
    Poster,
}

impl Audience {
    /// Every audience.
    pub const ALL: [Audience; 4] = [Self::Video, Self::Thumbnail, Self::Storyboard, Self::Poster];

    /// The claim's value: `v`, `t`, `s` or `g`.
    pub fn claim(self) -> &'static str {
        match self {
            Self::Video => "v",
            Self::Thumbnail => "t",
            Self::Storyboard => "s",
            Self::Poster => "g",
        }
    }

    /// Parses a claim value (exact, case-sensitive).
    pub fn from_claim(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.claim() == s)
    }
}

/// Playback policies a `POST /uploads` without `playback_policy` gets.
pub const DEFAULT_POLICIES: &[PlaybackPolicy] = &[PlaybackPolicy::Public];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_hang_off_the_base_without_a_double_slash() {
        let id: PlaybackId = "pb_01jd8x4m3v0k2q6s7t9w1y5zab".parse().unwrap();
        let v = PlaybackIdView::new("http://127.0.0.1:8090/", id, PlaybackPolicy::Public, Utc::now());
        assert_eq!(v.hls_url, "http://127.0.0.1:8090/play/pb_01jd8x4m3v0k2q6s7t9w1y5zab.m3u8");
        assert_eq!(v.dash_url, "http://127.0.0.1:8090/play/pb_01jd8x4m3v0k2q6s7t9w1y5zab.mpd");
        assert_eq!(serde_json::to_value(v).unwrap()["policy"], "public");
        for a in Audience::ALL {
            assert_eq!(Audience::from_claim(a.claim()), Some(a));
        }
        assert_eq!(Audience::from_claim("V"), None);
        for p in PlaybackPolicy::ALL {
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
        }
    }
}
