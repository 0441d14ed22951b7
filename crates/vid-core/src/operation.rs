//! The operation resource: a long-running job answered with `202 Accepted`
//! and `Location: /operations/{id}` (design §"长任务：先返回 202").

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{OperationId, Problem, VideoId};

text_state! {
    /// Where an operation is in its life. `succeeded`, `failed` and `cancelled` are terminal.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    #[serde(rename_all = "snake_case")]
    pub enum OperationStatus {
        /// Accepted, waiting for a worker.
        Pending = "pending",
        /// A worker holds it; `progress` moves.
        Running = "running",
        /// Finished; `result` is set.
        Succeeded = "succeeded",
        /// Finished with an error; `error` is set.
        Failed = "failed",
        /// Cancelled by the caller; `error` has code `cancelled`.
        Cancelled = "cancelled",
    }
}

impl OperationStatus {
    /// Whether no further change can happen.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

text_state! {
    /// The step a running transcode is in, shown as `metadata.phase`.
    ///
    /// Ordered as the pipeline runs (`Queued` < `Downloading` < … < `Done`); like
    /// `progress`, the phase an operation shows never moves backwards.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    #[serde(rename_all = "snake_case")]
    pub enum Phase {
        /// Queued, no worker yet.
        Queued = "queued",
        /// Fetching the source from storage.
        Downloading = "downloading",
        /// Scanning the source for malware.
        Scanning = "scanning",
        /// Reading container and stream metadata, validating limits.
        Probing = "probing",
        /// Decoding and encoding the renditions.
        Transcoding = "transcoding",
        /// Writing renditions and poster to storage.
        Uploading = "uploading",
        /// Nothing left to do.
        Done = "done",
    }
}

/// Extra, non-contractual facts about a running operation.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OperationMetadata {
    /// The current phase, once a worker has started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The video this operation produces.
    pub video_id: Option<VideoId>,
    /// The malware scan of the source, once it ran (`clean`) or was turned
    /// off (`skipped`). An infected source fails with `malware_detected`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scan: Option<ScanOutcome>,
    /// For an ingest (`POST /ingests`): the bytes the ingest worker has
    /// downloaded from `source_url` (and the fraction, when the size is known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download: Option<crate::ingest::DownloadProgress>,
}

text_state! {
    /// The result of the malware scan that runs before any decoding, shown as `metadata.scan`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    #[serde(rename_all = "snake_case")]
    pub enum ScanOutcome {
        /// The scanner found nothing.
        Clean = "clean",
        /// Scanning is turned off (`scanner.enabled = false`, development only):
        /// the source was not scanned.
        Skipped = "skipped",
    }
}

/// What a succeeded transcode produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OperationResult {
    /// The video that was produced.
    pub video_id: VideoId,
    /// The API path of that video, e.g. `/videos/vid_…`.
    pub video: String,
    /// The renditions written, tallest first.
    pub renditions: Vec<RenditionRef>,
}

/// A short reference to one rendition inside an operation's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RenditionRef {
    /// Rendition name, e.g. `720p`.
    pub name: String,
    /// Output width in pixels.
    pub width: u32,
    /// Output height in pixels.
    pub height: u32,
    /// Storage key of the MP4 in the media bucket.
    pub storage_key: String,
}

/// The operation resource: `GET /operations/{id}`.
///
/// `progress` is an integer percentage that never decreases and stays at most
/// 99 until `status` is terminal. `result` is set only on success, `error` only
/// on failure or cancel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Operation {
    /// `op_…`
    pub id: OperationId,
    /// See [`OperationStatus`].
    pub status: OperationStatus,
    /// 0–100, integer percent.
    pub progress: u8,
    /// When the operation was accepted (RFC 3339).
    pub created_at: DateTime<Utc>,
    /// When it last changed (RFC 3339).
    pub updated_at: DateTime<Utc>,
    /// Set when `status` is `succeeded`.
    pub result: Option<OperationResult>,
    /// Set when `status` is `failed` or `cancelled`; an RFC 9457 problem.
    pub error: Option<Problem>,
    /// Phase and other non-contractual facts.
    #[serde(default)]
    pub metadata: OperationMetadata,
}

/// Body of `POST /operations/{id}:wait` (the body is optional; `{}` and no
/// body mean "the defaults").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WaitOperation {
    /// How long to wait at most, in seconds: default 30, values above the
    /// api's `operations.max_wait_seconds` (60 by default) are treated as it,
    /// `0` answers at once. A 32-bit unsigned integer (the
    /// schema's bounds are exactly what the api parses; larger is a `400`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 4294967295_u64))]
    pub timeout_seconds: Option<u32>,
    /// Answer as soon as the operation's revision is greater than this (the
    /// `revision` of a previous answer, so a change between two calls is not
    /// missed). Default: the revision when the call arrives, i.e. "wait for
    /// the next change".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
}

/// Why `POST /operations/{id}:wait` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// The operation changed (status, progress or phase) since the call
    /// started, or since the `revision` given; possibly into a terminal status.
    Changed,
    /// Nothing changed before `timeout_seconds` passed.
    Timeout,
    /// The operation was already terminal when the call arrived (and not
    /// newer than a given `revision`): nothing will ever change.
    Terminal,
}

/// Answer of `POST /operations/{id}:wait`:
/// `{"operation": {...}, "reason": "changed"|"timeout"|"terminal", "revision": 7}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WaitResponse {
    /// The operation as it is now.
    pub operation: Operation,
    /// Why the call answered.
    pub reason: WaitReason,
    /// The operation's revision: a per-operation number that grows with every
    /// change; the `id:` of its Server-Sent Events. Pass it back as
    /// [`WaitOperation::revision`] to wait for the next change.
    pub revision: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_round_trips_with_the_documented_shape() {
        let op = Operation {
            id: OperationId::generate(),
            status: OperationStatus::Running,
            progress: 40,
            created_at: "2026-10-15T09:12:00Z".parse().unwrap(),
            updated_at: "2026-10-15T09:12:30Z".parse().unwrap(),
            result: None,
            error: None,
            metadata: OperationMetadata {
                phase: Some(Phase::Transcoding),
                video_id: Some(VideoId::generate()),
                scan: Some(ScanOutcome::Clean),
                download: None,
            },
        };
        let v = serde_json::to_value(&op).unwrap();
        for key in ["id", "status", "progress", "created_at", "result", "error"] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert_eq!(v["status"], "running");
        assert_eq!(v["created_at"], "2026-10-15T09:12:00Z");
        assert_eq!(v["metadata"]["phase"], "transcoding");
        assert_eq!(v["metadata"]["scan"], "clean");
        assert_eq!(serde_json::from_value::<Operation>(v).unwrap(), op);
    }

    #[test]
    fn wait_bodies_have_the_documented_shape() {
        assert_eq!(serde_json::from_str::<WaitOperation>("{}").unwrap(), WaitOperation::default());
        assert!(serde_json::from_str::<WaitOperation>(r#"{"timeout":1}"#).is_err());
        assert_eq!(serde_json::to_value(WaitReason::Timeout).unwrap(), "timeout");
        assert_eq!(serde_json::to_value(WaitReason::Changed).unwrap(), "changed");
        assert_eq!(serde_json::to_value(WaitReason::Terminal).unwrap(), "terminal");
    }

    #[test]
    fn statuses_parse_and_know_whether_they_are_terminal() {
        for s in [
            OperationStatus::Pending,
            OperationStatus::Running,
            OperationStatus::Succeeded,
            OperationStatus::Failed,
            OperationStatus::Cancelled,
        ] {
            assert_eq!(OperationStatus::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        assert!(!OperationStatus::Running.is_terminal());
        assert!(OperationStatus::Cancelled.is_terminal());
        assert_eq!(OperationStatus::parse("done"), None);
    }
}
