//! Ingest from a URL (issue 21, item 4): `POST /ingests` and the messages
//! between the api and the ingest worker (`services/ingest`).
//!
//! Flow: the api checks `source_url` with the SSRF guard (`vid-netguard`),
//! creates the upload (no parts), its video and operation (`pending`, phase
//! `downloading`) and stages an [`IngestJob`] in its outbox. The ingest
//! worker downloads the source into storage at `source_key` (an S3 multipart
//! upload) and answers with [`IngestReport`]s; after
//! [`IngestReportKind::Downloaded`] the api publishes the transcode job, so
//! from there the source is an upload like any other.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::messages::Mp4Support;
use crate::{OperationId, Problem, TenantId, UploadId, VideoId};

/// `POST /ingests` request body. Unknown fields are refused (`400 invalid_json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateIngest {
    /// Where to download the source from: an absolute `http` or `https` URL
    /// (WHATWG URL syntax), at most 2048 bytes, without user name, password
    /// or `#fragment`. Its host must be, and resolve only to, globally
    /// routable addresses (the webhooks' SSRF guard); an IP literal in any
    /// notation that is not is refused at once with `422 blocked_address`.
    #[cfg_attr(feature = "openapi", schema(example = "https://media.example.com/clip.mp4"))]
    pub source_url: String,
    /// Media type of the source, on the `uploads.allowed_content_types` list.
    /// Absent: taken from the answer's `Content-Type` when that is on the
    /// list, else sniffed from the first bytes (ISO BMFF `ftyp`, EBML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(example = "video/mp4"))]
    pub content_type: Option<String>,
    /// Display filename, with the rules of `POST /uploads` (`422 invalid_filename`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(example = "clip.mp4"))]
    pub filename: Option<String>,
    /// The most bytes to download: at least 1, at most (and by default)
    /// `uploads.max_size_bytes`. A larger body fails the operation with
    /// `source_too_large`, whatever `Content-Length` said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(example = 104857600, minimum = 1))]
    pub max_size_bytes: Option<u64>,
}

/// Download progress of an ingest, shown as `metadata.download` while and
/// after the ingest worker fetches the source.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DownloadProgress {
    /// Bytes received so far.
    pub bytes_downloaded: u64,
    /// The size announced by the source (`Content-Length`), if any; not
    /// trusted for the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<u64>,
    /// `bytes_downloaded / total_bytes` in 0..=1, when the size is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
}

impl DownloadProgress {
    /// Progress of `bytes_downloaded` out of `total_bytes` (fraction capped at 1).
    pub fn new(bytes_downloaded: u64, total_bytes: Option<u64>) -> Self {
        let fraction = total_bytes.filter(|t| *t > 0).map(|t| (bytes_downloaded as f64 / t as f64).min(1.0));
        Self { bytes_downloaded, total_bytes, fraction }
    }
}

/// api → ingest worker: download one source. Published through the api's
/// outbox in the transaction that created the operation (attempt 1), and
/// again by the api's janitor while the operation still awaits its source
/// past `operations.ingest_redrive_after_seconds` (a lost job: attempt + 1,
/// rebuilt from what the operation's rows hold); consumed from
/// `P.ingest.jobs` with manual acks. A copy whose source is already stored
/// downloads nothing (the worker asks storage first) and reports
/// `downloaded` again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngestJob {
    /// The operation to report on.
    pub operation_id: OperationId,
    /// The video being produced.
    pub video_id: VideoId,
    /// The upload row standing for the source.
    pub upload_id: UploadId,
    /// Owner.
    pub tenant_id: TenantId,
    /// The URL as normalised by the api's check (WHATWG serialisation).
    pub source_url: String,
    /// Key of the source object to write in the media bucket.
    pub source_key: String,
    /// The most bytes to accept.
    pub max_size_bytes: u64,
    /// The declared media type, if the request named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// Media types the source may have (`uploads.allowed_content_types`),
    /// for the `Content-Type` header and sniffing.
    pub allowed_content_types: Vec<String>,
    /// Static MP4s or not (carried to the transcode job by the api).
    #[serde(default)]
    pub mp4_support: Mp4Support,
    /// How many times the api published this job: 1 at `POST /ingests`, +1
    /// per re-drive (`operations.job_attempt`). For logs; absent: 1.
    #[serde(default = "first_attempt")]
    pub attempt: i32,
}

fn first_attempt() -> i32 {
    1
}

/// ingest worker → api (`P.ingest.reports`): one step of an ingest. May
/// arrive twice or out of order; the api ignores reports on terminal
/// operations and the progress shown never moves backwards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IngestReport {
    /// The operation this is about.
    pub operation_id: OperationId,
    /// Which worker sent it (hostname/pid), for logs.
    pub worker: String,
    /// When the worker emitted it.
    pub emitted_at: DateTime<Utc>,
    /// What happened.
    #[serde(flatten)]
    pub kind: IngestReportKind,
}

/// The body of an [`IngestReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum IngestReportKind {
    /// Bytes received so far (also a heartbeat).
    Progress {
        /// Bytes so far.
        bytes_downloaded: u64,
        /// `Content-Length` of the final answer, if it had one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total_bytes: Option<u64>,
    },
    /// The whole body is in storage at the job's `source_key`
    /// (CompleteMultipartUpload returned).
    Downloaded {
        /// Bytes stored.
        size_bytes: u64,
        /// The media type: declared, else from `Content-Type`, else sniffed.
        content_type: String,
    },
    /// The ingest failed for good; nothing is left in storage.
    Failed {
        /// Problem with a stable code: `source_unreachable`,
        /// `source_too_large`, `blocked_address`, `source_http_error`
        /// (extension member `source_status`), `source_timeout`,
        /// `too_many_redirects`, `source_empty`, `ingest_storage_failed`, …
        error: Problem,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_tagged_by_kind_and_round_trip() {
        let r = IngestReport {
            operation_id: OperationId::generate(),
            worker: "w/1".into(),
            emitted_at: Utc::now(),
            kind: IngestReportKind::Progress { bytes_downloaded: 10, total_bytes: None },
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!((v["kind"].as_str(), v["bytes_downloaded"].as_u64()), (Some("progress"), Some(10)));
        assert!(v.get("total_bytes").is_none());
        assert_eq!(serde_json::from_value::<IngestReport>(v).unwrap(), r);
        let failed = IngestReport { kind: IngestReportKind::Failed { error: Problem::new(422, "source_too_large", "Too large") }, ..r };
        assert_eq!(serde_json::from_str::<IngestReport>(&serde_json::to_string(&failed).unwrap()).unwrap(), failed);
    }

    #[test]
    fn unknown_request_fields_are_refused_and_progress_has_a_fraction_only_with_a_size() {
        assert!(serde_json::from_str::<CreateIngest>(r#"{"source_url":"https://a.example/x","size_bytes":1}"#).is_err());
        let p = DownloadProgress::new(50, Some(200));
        assert_eq!(p.fraction, Some(0.25));
        assert_eq!(DownloadProgress::new(50, None).fraction, None);
        assert_eq!(DownloadProgress::new(500, Some(200)).fraction, Some(1.0));
    }
}
