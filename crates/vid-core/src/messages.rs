//! Messages between the services, carried by RabbitMQ as JSON.
//!
//! Every message is published with publisher confirms, `delivery_mode = 2`
//! (persistent), and consumed with manual acks; see `vid-infra::amqp` for the
//! queue topology. Consumers must be idempotent: a message may arrive twice.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::event::Event;
use crate::operation::{Phase, ScanOutcome};
pub use crate::video::Mp4Support;
use crate::video::{Poster, Rendition, SourceMetadata};
use crate::{OperationId, Problem, TenantId, VideoId};

/// api → transcoder: transcode one uploaded source. Published through the api's outbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscodeJob {
    /// The operation to report on.
    pub operation_id: OperationId,
    /// The video being produced.
    pub video_id: VideoId,
    /// Owner of the source and outputs.
    pub tenant_id: TenantId,
    /// Key of the assembled source object in the media bucket.
    pub source_key: String,
    /// Declared size of the source in bytes.
    pub source_size_bytes: u64,
    /// Key prefix for outputs, ending in `/` (e.g. `tenants/ten_…/videos/vid_…/`).
    pub output_prefix: String,
    /// The api's publish count for this operation: 1 for the job `complete`
    /// publishes, n+1 for the n-th re-drive (issue 24's protocol). For logs
    /// and metrics; echoed in every [`TranscodeReport`]. Absent in older
    /// messages: 1.
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// Whether static MP4 renditions are made besides the stream (issue 19;
    /// Mux's `mp4_support`). Absent: `standard`.
    #[serde(default)]
    pub mp4_support: Mp4Support,
    /// The poster's time in seconds (`POST /uploads`' `poster_time`; finite,
    /// ≥ 0; past the end: the last frame). Absent: the transcoder's
    /// representative-frame rule (issue 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poster_time: Option<f64>,
}

/// The adaptive stream a transcode packaged (issue 19): CMAF objects, one per
/// segment, and their manifests, all under `prefix`. Every URI inside the
/// manifests is relative, so the stream can be served under any stable URL.
/// The api stores it as `videos.stream` (JSON); the playback service reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOutputs {
    /// Key prefix of every object of the stream, ending in `/`
    /// (`<output_prefix>stream/`).
    pub prefix: String,
    /// Key of the HLS master playlist (RFC 8216), `<prefix>master.m3u8`.
    pub hls_master_key: String,
    /// Key of the static DASH MPD (ISO/IEC 23009-1), `<prefix>manifest.mpd`.
    pub dash_manifest_key: String,
    /// Target segment duration, milliseconds.
    pub segment_duration_ms: u32,
    /// Objects stored under `prefix` (segments, headers, playlists).
    pub objects: u32,
    /// Their total size in bytes.
    pub size_bytes: u64,
    /// The storyboard, thumbnail frames and poster under `prefix` (issue
    /// 20). Absent from streams packaged before: their image URLs answer 404.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<StreamImages>,
}

/// The images a transcode keeps with a stream (issue 20), all under
/// [`StreamOutputs::prefix`]: `storyboard.jpg` (sprite sheet), `storyboard.vtt`
/// (WebVTT, cues → `storyboard.jpg#xywh=x,y,w,h`), `storyboard.json` (Mux's
/// shape), `poster.jpg`, and `frames/<ms>.jpg`, the tallest rung's frame at
/// each instant of [`Self::frames_ms`] (the thumbnails' sources). The
/// playback service writes its resized thumbnails to
/// `<prefix>thumbnails/<ms>_<width>.jpg`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamImages {
    /// Storyboard interval, milliseconds (the instants are its multiples).
    pub interval_ms: u64,
    /// Tile width in pixels (160).
    pub tile_width: u32,
    /// Tile height in pixels (even).
    pub tile_height: u32,
    /// Instants (ms, ascending) with a frame `frames/<ms>.jpg`: every
    /// storyboard instant, then the last frame's time.
    pub frames_ms: Vec<u64>,
    /// Width of the frames in pixels (the tallest rung's, upright).
    pub frame_width: u32,
    /// Height of the frames in pixels.
    pub frame_height: u32,
    /// The video's duration, milliseconds.
    pub duration_ms: u64,
}

/// The `attempt` of a job message that has none: the first publish.
fn first_attempt() -> u32 {
    1
}

/// transcoder → api: one step of a job. Reports for the same operation may
/// arrive out of order or twice; the api applies them monotonically (progress
/// never decreases, a terminal status is never overwritten).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscodeReport {
    /// The operation this is about.
    pub operation_id: OperationId,
    /// The video this is about.
    pub video_id: VideoId,
    /// Which worker sent it (hostname/pid), for logs.
    pub worker: String,
    /// When the worker emitted it.
    pub emitted_at: DateTime<Utc>,
    /// The run that sent it: a ULID (26 Crockford base-32 characters) the
    /// transcoder mints each time it takes a delivery of a job message, so
    /// two copies of one job, or a redelivery, are two runs. Every report of
    /// a run carries it; the api lets the latest `Started` run own the
    /// operation (issue 24). Absent in reports of older transcoders: "".
    #[serde(default)]
    pub run_id: String,
    /// The job's [`TranscodeJob::attempt`], echoed. Absent in older reports: 1.
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// What happened.
    #[serde(flatten)]
    pub kind: ReportKind,
}

/// The body of a [`TranscodeReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReportKind {
    /// A worker took the job (also a heartbeat).
    Started,
    /// Progress in the current phase (also a heartbeat).
    Progress {
        /// Current phase.
        phase: Phase,
        /// Whole-job progress, 0–99.
        percent: u8,
    },
    /// The source passed the malware scan (`clean`), or scanning is turned
    /// off (`skipped`); sent once, before probing. (An infected source ends
    /// in `Failed` with code `malware_detected` instead.)
    Scanned {
        /// What the scan found.
        outcome: ScanOutcome,
    },
    /// Every output is in storage.
    Succeeded {
        /// What the probe read.
        source: SourceMetadata,
        /// Outputs, tallest first.
        renditions: Vec<Rendition>,
        /// Poster image.
        poster: Option<Poster>,
        /// The adaptive stream (HLS + DASH over CMAF), stored by the api as
        /// `videos.stream`. Absent from older transcoders' reports: such a
        /// video has no stream and its playback URLs answer 404.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stream: Option<StreamOutputs>,
    },
    /// The job failed permanently (bad media, limits, crash budget exhausted).
    Failed {
        /// Problem details with a stable code, e.g. `unsupported_media`.
        error: Problem,
        /// Probe results if the file got that far.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<SourceMetadata>,
    },
}

/// api → webhook-dispatcher: an event was committed; fan it out to the
/// tenant's endpoints. Published through the api's outbox after the change
/// that caused it committed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventPublished {
    /// Whose endpoints receive it.
    pub tenant_id: TenantId,
    /// The event.
    pub event: Event,
    /// The exact JSON body to send (and sign): identical on every attempt.
    pub payload: String,
}

/// api → every transcoder (fan-out): stop this operation's work if you hold it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelTranscode {
    /// The cancelled operation.
    pub operation_id: OperationId,
    /// `None`: stop every run of the operation (the customer's `:cancel`).
    /// `Some(r)`: stop only the run `r` (a [`TranscodeReport::run_id`]); a
    /// transcoder holding the operation under another run ignores it.
    /// Absent from the JSON when `None`, so older transcoders read it as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{EventData, EventType, VideoEventData};
    use crate::EventId;

    #[test]
    fn reports_are_tagged_by_kind_and_round_trip() {
        let r = TranscodeReport {
            operation_id: OperationId::generate(),
            video_id: VideoId::generate(),
            worker: "w1".into(),
            emitted_at: Utc::now(),
            run_id: "01JDQ8Z6V8W3K5N2P4R6T8X0YA".into(),
            attempt: 2,
            kind: ReportKind::Progress { phase: Phase::Transcoding, percent: 42 },
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["kind"], "progress");
        assert_eq!(v["percent"], 42);
        assert_eq!((v["run_id"].as_str(), v["attempt"].as_u64()), (Some("01JDQ8Z6V8W3K5N2P4R6T8X0YA"), Some(2)));
        assert_eq!(serde_json::from_value::<TranscodeReport>(v).unwrap(), r);

        let scanned = TranscodeReport { kind: ReportKind::Scanned { outcome: ScanOutcome::Skipped }, ..r.clone() };
        let v = serde_json::to_value(&scanned).unwrap();
        assert_eq!((v["kind"].as_str(), v["outcome"].as_str()), (Some("scanned"), Some("skipped")));
        assert_eq!(serde_json::from_value::<TranscodeReport>(v).unwrap(), scanned);

        let failed = TranscodeReport {
            kind: ReportKind::Failed { error: Problem::new(422, "no_video_stream", "No video stream"), source: None },
            ..r
        };
        let back: TranscodeReport = serde_json::from_str(&serde_json::to_string(&failed).unwrap()).unwrap();
        assert_eq!(back, failed);
    }

    #[test]
    fn job_event_and_cancel_round_trip() {
        let job = TranscodeJob {
            operation_id: OperationId::generate(),
            video_id: VideoId::generate(),
            tenant_id: TenantId::generate(),
            source_key: "tenants/t/uploads/u/source".into(),
            source_size_bytes: 10,
            output_prefix: "tenants/t/videos/v/".into(),
            attempt: 3,
            mp4_support: Mp4Support::None,
            poster_time: Some(2.5),
        };
        assert_eq!(serde_json::to_value(&job).unwrap()["mp4_support"], "none");
        assert_eq!(serde_json::from_str::<TranscodeJob>(&serde_json::to_string(&job).unwrap()).unwrap(), job);
        let event = Event {
            id: EventId::generate(),
            type_: EventType::VideoReady,
            created: 5,
            data: EventData::Video(VideoEventData { video_id: job.video_id.clone(), operation_id: job.operation_id.clone(), version: 2 }),
        };
        let msg = EventPublished { tenant_id: job.tenant_id.clone(), payload: serde_json::to_string(&event).unwrap(), event };
        assert_eq!(serde_json::from_str::<EventPublished>(&serde_json::to_string(&msg).unwrap()).unwrap(), msg);
        let c = CancelTranscode { operation_id: job.operation_id.clone(), run_id: None };
        let json = serde_json::to_string(&c).unwrap();
        assert!(!json.contains("run_id"), "a cancel of every run has no run_id: {json}");
        assert_eq!(serde_json::from_str::<CancelTranscode>(&json).unwrap(), c);
        let targeted = CancelTranscode { operation_id: job.operation_id, run_id: Some("01JDQ8Z6V8W3K5N2P4R6T8X0YA".into()) };
        let v = serde_json::to_value(&targeted).unwrap();
        assert_eq!(v["run_id"], "01JDQ8Z6V8W3K5N2P4R6T8X0YA");
        assert_eq!(serde_json::from_value::<CancelTranscode>(v).unwrap(), targeted);
    }

    /// Messages from before issue 24 (no `attempt`, `run_id`) still parse:
    /// attempt 1, run "", cancel of every run.
    #[test]
    fn messages_without_the_run_fields_still_parse() {
        let op = OperationId::generate();
        let vid = VideoId::generate();
        let ten = TenantId::generate();
        let job: TranscodeJob = serde_json::from_value(serde_json::json!({
            "operation_id": op, "video_id": vid, "tenant_id": ten,
            "source_key": "tenants/t/uploads/u/source", "source_size_bytes": 7, "output_prefix": "tenants/t/videos/v/"
        }))
        .unwrap();
        assert_eq!((job.attempt, job.source_size_bytes, job.mp4_support, job.poster_time), (1, 7, Mp4Support::Standard, None));
        let report: TranscodeReport = serde_json::from_value(serde_json::json!({
            "operation_id": op, "video_id": vid, "worker": "old/1", "emitted_at": "2026-12-01T15:00:00Z",
            "kind": "progress", "phase": "transcoding", "percent": 40
        }))
        .unwrap();
        assert_eq!((report.run_id.as_str(), report.attempt), ("", 1));
        assert_eq!(report.kind, ReportKind::Progress { phase: Phase::Transcoding, percent: 40 });
        let cancel: CancelTranscode = serde_json::from_value(serde_json::json!({ "operation_id": op })).unwrap();
        assert_eq!(cancel, CancelTranscode { operation_id: op, run_id: None });
    }
}
