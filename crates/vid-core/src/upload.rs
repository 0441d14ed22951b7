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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateUpload {
    /// Total size of the file in bytes; 1 to the configured maximum (default 20 GiB).
    #[cfg_attr(feature = "openapi", schema(example = 10485760))]
    pub size_bytes: u64,
    /// Media type of the file, on the configured allow-list (e.g. `video/mp4`).
    #[cfg_attr(feature = "openapi", schema(example = "video/mp4"))]
    pub content_type: String,
    /// The client's file name, kept for display only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(example = "clip.mp4"))]
    pub filename: Option<String>,
}

/// Where an upload is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum UploadStatus {
    /// Parts may be PUT.
    Created,
    /// `complete` is assembling the parts.
    Completing,
    /// Assembled; a transcode operation exists.
    Completed,
    /// Aborted by the client (`DELETE /uploads/{id}`).
    Aborted,
    /// Not completed in time; aborted by the janitor.
    Expired,
}

impl UploadStatus {
    /// The wire and database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Completing => "completing",
            Self::Completed => "completed",
            Self::Aborted => "aborted",
            Self::Expired => "expired",
        }
    }

    /// Parses the wire spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "created" => Self::Created,
            "completing" => Self::Completing,
            "completed" => Self::Completed,
            "aborted" => Self::Aborted,
            "expired" => Self::Expired,
            _ => return None,
        })
    }
}

/// One part to PUT: bytes `offset..offset+length` of the file, to `url`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PartUrl {
    /// 1-based S3 part number.
    pub part_number: u32,
    /// Byte offset of the part in the file.
    pub offset: u64,
    /// Exact length of the part in bytes; send it as `Content-Length`.
    pub length: u64,
    /// Presigned S3 UploadPart URL (HTTP `PUT`), valid for this part only.
    pub url: String,
    /// When `url` stops working (RFC 3339).
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
    /// When the part URLs expire (RFC 3339); renew with `parts:sign`.
    pub expires_at: DateTime<Utc>,
}

/// A part storage already holds (S3 ListParts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StoredPart {
    /// 1-based part number.
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
    /// Parts storage holds (only while `created`).
    pub parts: Vec<StoredPart>,
    /// Part numbers still to send (only while `created`).
    pub missing_parts: Vec<u32>,
    /// The video, once completed.
    pub video_id: Option<VideoId>,
    /// The transcode operation, once completed.
    pub operation_id: Option<OperationId>,
    /// RFC 3339.
    pub created_at: DateTime<Utc>,
    /// When an uncompleted upload is aborted by the janitor (RFC 3339).
    pub expires_at: DateTime<Utc>,
}

/// A part the client names in `complete`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CompletedPart {
    /// 1-based part number.
    pub part_number: u32,
    /// The ETag storage answered to the PUT, quoted or not.
    pub etag: String,
}

/// Optional `POST /uploads/{id}/complete` body. Without it the server lists the parts itself.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CompleteUpload {
    /// Parts in any order.
    #[serde(default)]
    pub parts: Option<Vec<CompletedPart>>,
}

/// `POST /uploads/{id}/parts:sign` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SignParts {
    /// The 1-based part numbers to sign again.
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
