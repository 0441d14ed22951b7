//! The video resource: `GET /videos/{id}`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{OperationId, VideoId};

text_state! {
    /// A video's life: `processing` until its operation is terminal.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    #[serde(rename_all = "snake_case")]
    pub enum VideoStatus {
        /// The source is uploaded; the transcode has not finished.
        Processing = "processing",
        /// Renditions are available.
        Ready = "ready",
        /// The transcode failed; see the operation's `error`.
        Failed = "failed",
        /// The transcode was cancelled.
        Cancelled = "cancelled",
    }
}

text_state! {
    /// [`crate::messages::TranscodeJob::mp4_support`] and `POST /uploads`' `mp4_support`:
    /// `"standard"` (static MP4 renditions, the default) or `"none"` (the
    /// adaptive stream only). Mux's name and spellings.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    #[serde(rename_all = "snake_case")]
    pub enum Mp4Support {
        /// One H.264/AAC MP4 per rung (`+faststart`), from the stream's packets.
        #[default]
        Standard = "standard",
        /// No MP4 renditions.
        None = "none",
    }
}

/// What the probe read from the source before any encoding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SourceMetadata {
    /// Container format as named by libavformat, e.g. `mov,mp4,m4a,3gp,3g2,mj2`.
    pub container: String,
    /// Duration in seconds; `None` when the container does not say and decoding did not tell.
    pub duration_seconds: Option<f64>,
    /// Coded width in pixels, before rotation.
    pub width: u32,
    /// Coded height in pixels, before rotation.
    pub height: u32,
    /// Display rotation in degrees clockwise (0, 90, 180, 270), from the display matrix.
    pub rotation: i32,
    /// Video codec name, e.g. `h264`.
    pub video_codec: String,
    /// Audio codec name, or `None` for a video without audio.
    pub audio_codec: Option<String>,
    /// Average frame rate in frames per second, when known.
    pub frame_rate: Option<f64>,
    /// Source size in bytes.
    pub size_bytes: u64,
}

/// One encoded output of the ladder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Rendition {
    /// Ladder rung name, e.g. `720p`.
    pub name: String,
    /// Width in pixels (even).
    pub width: u32,
    /// Height in pixels (even).
    pub height: u32,
    /// Average total bitrate in bits per second.
    pub bitrate: u64,
    /// Object size in bytes.
    pub size_bytes: u64,
    /// `video/mp4`.
    pub content_type: String,
    /// Key in the media bucket.
    pub storage_key: String,
    /// A presigned GET URL, valid until `url_expires_at`; only in API answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// When `url` stops working.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_expires_at: Option<DateTime<Utc>>,
}

/// The poster image (JPEG) taken from the first seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Poster {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Key in the media bucket.
    pub storage_key: String,
    /// A presigned GET URL; only in API answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// The video resource.
///
/// `version` starts at 1 and increases by one on every change; events carry it
/// so receivers can drop late, older events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Video {
    /// `vid_…`
    pub id: VideoId,
    /// See [`VideoStatus`].
    pub status: VideoStatus,
    /// Monotonic change counter, starting at 1.
    pub version: i64,
    /// The operation that produces this video.
    pub operation_id: OperationId,
    /// The client's file name, when it gave one.
    pub filename: Option<String>,
    /// Declared content type of the source.
    pub content_type: String,
    /// Probe results, once probed.
    pub source: Option<SourceMetadata>,
    /// Encoded outputs, tallest first; empty until ready.
    pub renditions: Vec<Rendition>,
    /// The poster, once ready.
    pub poster: Option<Poster>,
    /// Whether `renditions` (static MP4s) are made: `standard` or `none`.
    #[serde(default)]
    pub mp4_support: Mp4Support,
    /// The video's playback IDs with their stable HLS and DASH URLs, oldest
    /// first: those of `playback_policy` are made when the video becomes
    /// ready; one added with `POST /videos/{id}/playback-ids` is listed at
    /// once, whatever the status, but its URLs answer 404 until the video is
    /// ready (and for ever on a failed or cancelled video).
    #[serde(default)]
    pub playback_ids: Vec<crate::playback::PlaybackIdView>,
    /// RFC 3339.
    pub created_at: DateTime<Utc>,
    /// RFC 3339.
    pub updated_at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn video_round_trips() {
        let v = Video {
            id: VideoId::generate(),
            status: VideoStatus::Ready,
            version: 3,
            operation_id: OperationId::generate(),
            filename: Some("a.mp4".into()),
            content_type: "video/mp4".into(),
            source: Some(SourceMetadata {
                container: "mov,mp4,m4a,3gp,3g2,mj2".into(),
                duration_seconds: Some(5.5),
                width: 1280,
                height: 720,
                rotation: 90,
                video_codec: "h264".into(),
                audio_codec: None,
                frame_rate: Some(25.0),
                size_bytes: 1000,
            }),
            renditions: vec![Rendition {
                name: "720p".into(),
                width: 1280,
                height: 720,
                bitrate: 2_500_000,
                size_bytes: 999,
                content_type: "video/mp4".into(),
                storage_key: "k".into(),
                url: None,
                url_expires_at: None,
            }],
            poster: None,
            mp4_support: Default::default(),
            playback_ids: vec![],
            created_at: Utc::now(),
            updated_at: Utc::now(),
        };
        let json = serde_json::to_value(&v).unwrap();
        assert_eq!(json["status"], "ready");
        assert!(json["renditions"][0].get("url").is_none());
        assert_eq!(serde_json::from_value::<Video>(json).unwrap(), v);
        assert_eq!(VideoStatus::parse("ready"), Some(VideoStatus::Ready));
    }
}
