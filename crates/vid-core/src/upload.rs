//! The upload resource: a direct-to-storage S3 multipart upload
//! (design §"大文件上传：别经过你的服务器").
//!
//! The API never sees the bytes: `POST /uploads` answers with one presigned
//! UploadPart URL per part; the client PUTs parts straight to storage, in
//! parallel, re-sending only failed parts; `POST /uploads/{id}/complete` has
//! storage assemble them (S3 CompleteMultipartUpload).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{OperationId, UploadId, VideoId};

/// `POST /uploads` request body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateUpload {
    /// Total size of the file in bytes: at least 1, at most the configured
    /// `uploads.max_size_bytes` (default 200 MiB, the default malware-scan
    /// limit; the k8s and compose deployments allow 2047 MiB). Larger: `422 file_too_large`.
    #[cfg_attr(feature = "openapi", schema(example = 10485760, minimum = 1))]
    pub size_bytes: u64,
    /// Media type of the file, on the configured allow-list (e.g. `video/mp4`).
    #[cfg_attr(feature = "openapi", schema(example = "video/mp4"))]
    pub content_type: String,
    /// The client's file name, kept for display only: at most 255 bytes (UTF-8),
    /// without control characters (Unicode category Cc), format characters
    /// (Cf: bidirectional overrides such as U+202E, zero-width characters,
    /// U+FEFF) or line/paragraph separators (Zl, Zp); else `422 invalid_filename`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(example = "clip.mp4"))]
    pub filename: Option<String>,
    /// The playback IDs the video gets when it becomes ready, one per entry
    /// (Mux's `playback_policy`). Absent: `["public"]`. `[]`: none (add one
    /// later with `POST /videos/{id}/playback-ids`). A repeated policy gives
    /// one id. Unknown values: `400 invalid_json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(example = json!(["public"])))]
    pub playback_policy: Option<Vec<crate::playback::PlaybackPolicy>>,
    /// Whether static MP4 renditions are made besides the adaptive stream
    /// (Mux's `mp4_support`). Absent: `standard`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mp4_support: Option<crate::video::Mp4Support>,
    /// The poster's time in seconds from the start (issue 20): the poster is
    /// the first frame at or after it; past the end, the last frame. A JSON
    /// number ≥ 0 (negative: `422 invalid_poster_time`). Absent: a
    /// representative frame (among the storyboard instants of the first
    /// third, the one with the most luma variance, so not a black opening).
    /// Kept as the JSON number (exact, comparable) for the `Idempotency-Key` check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>, example = 12.5, minimum = 0))]
    pub poster_time: Option<serde_json::Number>,
    /// The origin of the web page that uploads with the `client_token`
    /// (`scheme://host[:port]`, as browsers send it in `Origin`; Mux's
    /// `cors_origin`): the api's CORS answers on the client-token routes allow
    /// only it. Absent: no cross-origin page may use them. Not an origin
    /// (a path, query, user info, another scheme): `422 invalid_cors_origin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(example = "https://app.example.com"))]
    pub cors_origin: Option<String>,
}

text_state! {
    /// Where an upload is in its life.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    #[serde(rename_all = "snake_case")]
    pub enum UploadStatus {
        /// Parts may be PUT.
        Created = "created",
        /// `complete` is assembling the parts (briefly: if storage refuses, the
        /// upload is `created` again); `parts:sign` answers `409 upload_completing` meanwhile.
        Completing = "completing",
        /// Assembled; a transcode operation exists.
        Completed = "completed",
        /// Aborted by the client (`DELETE /uploads/{id}`).
        Aborted = "aborted",
        /// Not completed by its `expires_at`: signing and completing are refused
        /// from that instant on, and the janitor aborts the multipart upload.
        Expired = "expired",
    }
}

/// One part to PUT: bytes `offset..offset+length` of the file, to `url`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PartUrl {
    /// 1-based S3 part number.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub part_number: u32,
    /// Byte offset of the part in the file.
    pub offset: u64,
    /// Exact length of the part in bytes; send it as `Content-Length`.
    pub length: u64,
    /// Presigned S3 UploadPart URL (HTTP `PUT`), valid for this part only.
    pub url: String,
    /// When `url` stops working (RFC 3339, whole seconds): the signature's own
    /// expiry (`X-Amz-Date` + `X-Amz-Expires`), so storage accepts the URL until
    /// exactly then. Renew with `POST /uploads/{id}/parts:sign`.
    pub expires_at: DateTime<Utc>,
}

/// `201` answer to `POST /uploads`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedUpload {
    /// `upl_…`
    pub id: UploadId,
    /// Always `created` here.
    pub status: UploadStatus,
    /// Declared total size in bytes.
    pub size_bytes: u64,
    /// Size of every part but the last, in bytes (≥ 5 MiB unless there is one part).
    pub part_size: u64,
    /// One entry per part, in part-number order.
    pub parts: Vec<PartUrl>,
    /// When the part URLs in `parts` expire (RFC 3339): the earliest of their
    /// `expires_at`, by default 15 minutes from now. This is the part URL
    /// expiry, not the upload's: the upload itself stays open longer (24 h by
    /// default; `GET /uploads/{id}` shows its `expires_at`). Renew URLs with
    /// `POST /uploads/{id}/parts:sign`.
    pub expires_at: DateTime<Utc>,
    /// A bearer token (`vidu_…`) for a browser: good only for this upload's
    /// `GET`, `parts:sign`, `complete` and `DELETE`, and for following the
    /// operation it becomes (`GET /operations/{id}`, `:wait`, `/events`),
    /// until the upload's `expires_at` or, once completed, until the operation
    /// is terminal plus `uploads.client_token_grace_seconds` (10 min). Hand it,
    /// never the API key, to the page. Shown once (only its hash is stored);
    /// an idempotent replay of the create answers a new one.
    #[cfg_attr(feature = "openapi", schema(example = "vidu_3q2-7wEXAMPLEtokenXXXXXXXXXXXXXXXXXXXXXXXX"))]
    pub client_token: String,
}

/// A part storage already holds (S3 ListParts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StoredPart {
    /// 1-based part number.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub part_number: u32,
    /// Size in bytes as stored.
    pub size_bytes: u64,
    /// The part's ETag as storage reports it.
    pub etag: String,
}

/// `GET /uploads/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UploadState {
    /// `upl_…`
    pub id: UploadId,
    /// See [`UploadStatus`].
    pub status: UploadStatus,
    /// Declared total size in bytes.
    pub size_bytes: u64,
    /// Media type.
    pub content_type: String,
    /// Size of every part but the last.
    pub part_size: u64,
    /// Number of parts.
    pub part_count: u32,
    /// Parts storage holds (S3 ListParts), while `created` or `completing`;
    /// empty in the other states and once storage has assembled the parts.
    pub parts: Vec<StoredPart>,
    /// Part numbers (1-based) still to send, or to send again because storage
    /// holds them with the wrong size: while `created` or `completing`; empty otherwise.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub missing_parts: Vec<u32>,
    /// The video, once completed.
    pub video_id: Option<VideoId>,
    /// The transcode operation, once completed.
    pub operation_id: Option<OperationId>,
    /// RFC 3339.
    pub created_at: DateTime<Utc>,
    /// When the upload itself expires (RFC 3339): from then on `parts:sign` and
    /// `complete` answer `409 upload_expired`, `status` reads `expired`, and
    /// the janitor aborts the multipart upload. By default 24 h after
    /// creation. This is not the expiry of the part URLs (see `PartUrl.expires_at`).
    pub expires_at: DateTime<Utc>,
}

/// A part the client names in `complete`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CompletedPart {
    /// 1-based part number.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub part_number: u32,
    /// The ETag storage answered to the PUT, quoted or not.
    pub etag: String,
}

/// Optional `POST /uploads/{id}/complete` body. Without it (no body, `{}` or
/// `null`) the server completes with the parts storage lists. A body that is
/// present must be valid (else `400 invalid_json`, `415` for a non-JSON
/// media type): it is never ignored.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CompleteUpload {
    /// Every part 1..N exactly once, in any order, each with the ETag storage
    /// answered to its PUT; the upload completes only if storage holds exactly
    /// those ETags (else `409 etag_mismatch`). An empty list, a missing,
    /// repeated or out-of-range part number: `400 invalid_parts`.
    #[serde(default)]
    pub parts: Option<Vec<CompletedPart>>,
}

/// `POST /uploads/{id}/parts:sign` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SignParts {
    /// The 1-based part numbers to sign again (1..N, at least one).
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub part_numbers: Vec<u32>,
}

/// `POST /uploads/{id}/parts:sign` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SignedParts {
    /// Fresh URLs for just the requested parts.
    pub parts: Vec<PartUrl>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_upload_refuses_unknown_fields() {
        let ok: CreateUpload = serde_json::from_str(r#"{"size_bytes":10,"content_type":"video/mp4"}"#).unwrap();
        assert_eq!(ok.filename, None);
        assert!(serde_json::from_str::<CreateUpload>(r#"{"size_bytes":10,"content_type":"video/mp4","x":1}"#).is_err());
        assert!(serde_json::from_str::<CreateUpload>(r#"{"size_bytes":"10","content_type":"video/mp4"}"#).is_err());
    }

    #[test]
    fn created_upload_round_trips() {
        let c = CreatedUpload {
            id: UploadId::generate(),
            status: UploadStatus::Created,
            size_bytes: 20,
            part_size: 10,
            parts: vec![PartUrl { part_number: 1, offset: 0, length: 10, url: "http://x".into(), expires_at: Utc::now() }],
            expires_at: Utc::now(),
            client_token: "vidu_x".into(),
        };
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["status"], "created");
        assert_eq!(serde_json::from_value::<CreatedUpload>(v).unwrap(), c);
        for s in ["created", "completing", "completed", "aborted", "expired"] {
            assert_eq!(UploadStatus::parse(s).unwrap().as_str(), s);
        }
    }

    #[test]
    fn complete_body_is_optional_and_strict() {
        assert_eq!(serde_json::from_str::<CompleteUpload>("{}").unwrap(), CompleteUpload::default());
        let c: CompleteUpload = serde_json::from_str(r#"{"parts":[{"part_number":2,"etag":"\"a\""}]}"#).unwrap();
        assert_eq!(c.parts.unwrap()[0].part_number, 2);
        let s: SignParts = serde_json::from_str(r#"{"part_numbers":[1,3]}"#).unwrap();
        assert_eq!(s.part_numbers, vec![1, 3]);
        assert!(serde_json::from_str::<SignParts>(r#"{"parts":[1]}"#).is_err());
    }
}
