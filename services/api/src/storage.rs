//! The S3 calls the api makes (S3 API actions named on each function).
//!
//! Every transport or server failure is `503 unavailable` with a generic
//! `detail` ([`STORAGE_UNAVAILABLE`]): the S3 error itself (bucket, key
//! layout, tenant and upload ids, SDK internals) is logged at WARN — inside
//! the request's span, so with its `request_id` — and never sent to the
//! client. Answers that mean something to the caller are returned as values:
//! a multipart upload storage no longer knows (`NoSuchUpload`), a part list
//! storage refuses (`InvalidPart`/`InvalidPartOrder`, see [`Completion`]).

use std::time::Duration;

use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use chrono::{DateTime, Utc};
use vid_core::upload::{PartUrl, StoredPart};

use crate::error::ApiError;
use crate::state::AppState;

/// S3 refuses parts smaller than this, except the last (S3 multipart limits).
pub const MIN_PART_SIZE: u64 = 5 * 1024 * 1024;
/// S3 allows at most this many parts per upload.
pub const MAX_PARTS: u64 = 10_000;
const MIB: u64 = 1024 * 1024;

/// Chooses the part size (bytes) and part count for a file of `size` bytes:
/// `target` rounded up to at least 5 MiB, raised (in whole MiB) so the count
/// stays ≤ 10,000. The last part may be smaller.
pub fn plan_parts(size: u64, target: u64) -> (u64, u32) {
    let mut part_size = target.max(MIN_PART_SIZE);
    let needed = size.div_ceil(MAX_PARTS);
    if part_size < needed {
        part_size = needed.div_ceil(MIB) * MIB;
    }
    let count = size.div_ceil(part_size).max(1);
    (part_size, count as u32)
}

/// Byte range `(offset, length)` of part `n` (1-based).
pub fn part_range(size: u64, part_size: u64, n: u32) -> (u64, u64) {
    let offset = (n as u64 - 1) * part_size;
    (offset, part_size.min(size - offset))
}

/// The `detail` of every storage `503 unavailable`: nothing about the bucket,
/// keys or the S3 error reaches the client.
pub const STORAGE_UNAVAILABLE: &str = "storage is unavailable; retry later";

/// Logs the S3 failure of `action` at WARN (with the request id of the
/// enclosing request span) and returns the generic `503 unavailable`.
fn unavailable(action: &str, e: impl std::fmt::Display) -> ApiError {
    tracing::warn!(s3_action = action, error = %e, "storage call failed; answering 503 unavailable");
    ApiError::Unavailable(STORAGE_UNAVAILABLE.to_owned())
}

/// The start of a presigned URL's validity: now, truncated to the whole
/// second. SigV4 writes its signing time (`X-Amz-Date`) in whole seconds and
/// storage refuses the URL from `X-Amz-Date + X-Amz-Expires` on, so the
/// signature is made with this time and the expiry the api announces is
/// computed from it: exactly the instant storage starts refusing, never later.
fn signing_start() -> (std::time::SystemTime, DateTime<Utc>) {
    let now = Utc::now();
    let start = DateTime::<Utc>::from_timestamp(now.timestamp(), 0).unwrap_or(now);
    (start.into(), start)
}

/// A presigning configuration valid for `ttl` from [`signing_start`], and the
/// instant it expires.
fn presigning(ttl: Duration) -> Result<(PresigningConfig, DateTime<Utc>), ApiError> {
    let (start, start_utc) = signing_start();
    let config = PresigningConfig::builder().start_time(start).expires_in(ttl).build().map_err(|e| ApiError::Internal(e.into()))?;
    let expires_at = start_utc + chrono::Duration::from_std(ttl).map_err(|e| ApiError::Internal(e.into()))?;
    Ok((config, expires_at))
}

/// Whether an S3 error says the multipart upload no longer exists.
fn is_no_such_upload<E: ProvideErrorMetadata>(e: &aws_sdk_s3::error::SdkError<E>) -> bool {
    e.as_service_error().and_then(|s| s.code()) == Some("NoSuchUpload")
}

/// S3 CreateMultipartUpload; returns the storage's upload id.
///
/// Errors: `503 unavailable` (logged).
pub async fn create_multipart(state: &AppState, key: &str, content_type: &str) -> Result<String, ApiError> {
    let out = state
        .s3
        .create_multipart_upload()
        .bucket(&state.settings.s3.bucket)
        .key(key)
        .content_type(content_type)
        .send()
        .await
        .map_err(|e| unavailable("CreateMultipartUpload", aws_sdk_s3::error::DisplayErrorContext(e)))?;
    out.upload_id().map(str::to_owned).ok_or_else(|| unavailable("CreateMultipartUpload", "no UploadId returned"))
}

/// Presigns S3 UploadPart for part `part_number` (1-based) of `length` bytes
/// at byte `offset` of the file, binding its part number and exact
/// `Content-Length` into the signature, valid for `ttl`. The returned
/// `expires_at` is the signature's own expiry (`X-Amz-Date + X-Amz-Expires`,
/// see `signing_start`). Errors: `500 internal` if signing fails.
pub async fn presign_part(
    state: &AppState,
    key: &str,
    upload_id: &str,
    part_number: u32,
    length: u64,
    offset: u64,
    ttl: Duration,
) -> Result<PartUrl, ApiError> {
    let (config, expires_at) = presigning(ttl)?;
    let req = state
        .presigner
        .upload_part()
        .bucket(&state.settings.s3.bucket)
        .key(key)
        .upload_id(upload_id)
        .part_number(part_number as i32)
        .content_length(length as i64)
        .presigned(config)
        .await
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("presigning UploadPart: {e}")))?;
    Ok(PartUrl { part_number, offset, length, url: req.uri().to_owned(), expires_at })
}

/// Presigns S3 GetObject for a download link valid for `ttl`; returns the URL
/// and the signature's own expiry (see `signing_start`).
pub async fn presign_get(state: &AppState, key: &str, ttl: Duration) -> Result<(String, DateTime<Utc>), ApiError> {
    let (config, expires_at) = presigning(ttl)?;
    let req = state
        .presigner
        .get_object()
        .bucket(&state.settings.s3.bucket)
        .key(key)
        .presigned(config)
        .await
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("presigning GetObject: {e}")))?;
    Ok((req.uri().to_owned(), expires_at))
}

/// S3 ListParts, following pagination; the parts in ascending part number.
/// `Ok(None)` when storage no longer knows the upload (`NoSuchUpload`).
///
/// Errors: `503 unavailable` (logged).
pub async fn list_parts(state: &AppState, key: &str, upload_id: &str) -> Result<Option<Vec<StoredPart>>, ApiError> {
    let mut parts = Vec::new();
    let mut marker: Option<String> = None;
    loop {
        let resp = state
            .s3
            .list_parts()
            .bucket(&state.settings.s3.bucket)
            .key(key)
            .upload_id(upload_id)
            .set_part_number_marker(marker.clone())
            .send()
            .await;
        let out = match resp {
            Ok(out) => out,
            Err(e) if is_no_such_upload(&e) => return Ok(None),
            Err(e) => return Err(unavailable("ListParts", aws_sdk_s3::error::DisplayErrorContext(e))),
        };
        for p in out.parts() {
            parts.push(StoredPart {
                part_number: p.part_number().unwrap_or(0) as u32,
                size_bytes: p.size().unwrap_or(0) as u64,
                etag: p.e_tag().unwrap_or_default().to_owned(),
            });
        }
        match (out.is_truncated(), out.next_part_number_marker()) {
            (Some(true), Some(next)) => marker = Some(next.to_owned()),
            _ => break,
        }
    }
    parts.sort_by_key(|p| p.part_number);
    Ok(Some(parts))
}

/// What S3 CompleteMultipartUpload answered, when it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// The parts were assembled into the object.
    Assembled,
    /// `NoSuchUpload`: storage no longer knows the multipart upload (a
    /// previous complete assembled it, or it was aborted).
    UnknownUpload,
    /// `InvalidPart` or `InvalidPartOrder`: the part list does not match what
    /// storage holds, i.e. a part was re-sent (new ETag) after it was listed.
    /// Nothing was assembled; the multipart upload is intact.
    PartsChanged,
}

/// S3 CompleteMultipartUpload with `parts` (number and ETag) in ascending order.
///
/// Errors: `503 unavailable` for any other failure (logged, see the module docs).
pub async fn complete_multipart(state: &AppState, key: &str, upload_id: &str, parts: &[StoredPart]) -> Result<Completion, ApiError> {
    let mut sorted: Vec<&StoredPart> = parts.iter().collect();
    sorted.sort_by_key(|p| p.part_number);
    let completed = CompletedMultipartUpload::builder()
        .set_parts(Some(sorted.iter().map(|p| CompletedPart::builder().part_number(p.part_number as i32).e_tag(&p.etag).build()).collect()))
        .build();
    match state
        .s3
        .complete_multipart_upload()
        .bucket(&state.settings.s3.bucket)
        .key(key)
        .upload_id(upload_id)
        .multipart_upload(completed)
        .send()
        .await
    {
        Ok(_) => Ok(Completion::Assembled),
        Err(e) if is_no_such_upload(&e) => Ok(Completion::UnknownUpload),
        Err(e) if matches!(e.as_service_error().and_then(|s| s.code()), Some("InvalidPart" | "InvalidPartOrder")) => {
            tracing::info!(error = %aws_sdk_s3::error::DisplayErrorContext(&e), "storage refused the part list of CompleteMultipartUpload");
            Ok(Completion::PartsChanged)
        }
        Err(e) => Err(unavailable("CompleteMultipartUpload", aws_sdk_s3::error::DisplayErrorContext(e))),
    }
}

/// S3 HeadObject; the object's size in bytes, or `None` if it does not exist.
///
/// Errors: `503 unavailable` (logged).
pub async fn object_size(state: &AppState, key: &str) -> Result<Option<u64>, ApiError> {
    match state.s3.head_object().bucket(&state.settings.s3.bucket).key(key).send().await {
        Ok(out) => Ok(Some(out.content_length().unwrap_or(0) as u64)),
        Err(e) if e.as_service_error().map(|s| s.is_not_found()).unwrap_or(false) => Ok(None),
        Err(e) => Err(unavailable("HeadObject", aws_sdk_s3::error::DisplayErrorContext(e))),
    }
}

/// S3 DeleteObject. Deleting a key that does not exist succeeds (S3 answers `204` either way).
///
/// Errors: `503 unavailable` (logged).
pub async fn delete_object(state: &AppState, key: &str) -> Result<(), ApiError> {
    match state.s3.delete_object().bucket(&state.settings.s3.bucket).key(key).send().await {
        Ok(_) => Ok(()),
        Err(e) if e.as_service_error().and_then(|s| s.code()) == Some("NoSuchKey") => Ok(()),
        Err(e) => Err(unavailable("DeleteObject", aws_sdk_s3::error::DisplayErrorContext(e))),
    }
}

/// Deletes every object whose key starts with `prefix` (S3 ListObjectsV2,
/// page by page, then DeleteObject for each key, 8 at once); returns how
/// many were deleted. Used for a late run's stream (its `stream/` prefix
/// holds one object per CMAF segment, header and manifest). An object
/// written under the prefix while this runs may be left.
///
/// Errors: `503 unavailable` (logged) when a listing or a delete fails; the
/// objects deleted before it stay deleted.
pub async fn delete_prefix(state: &AppState, prefix: &str) -> Result<u64, ApiError> {
    let mut deleted = 0u64;
    let mut token: Option<String> = None;
    loop {
        let page = state
            .s3
            .list_objects_v2()
            .bucket(&state.settings.s3.bucket)
            .prefix(prefix)
            .set_continuation_token(token.take())
            .send()
            .await
            .map_err(|e| unavailable("ListObjectsV2", aws_sdk_s3::error::DisplayErrorContext(e)))?;
        let keys: Vec<String> = page.contents().iter().filter_map(|o| o.key().map(str::to_owned)).collect();
        for batch in keys.chunks(8) {
            let mut deletes = Vec::with_capacity(batch.len());
            for key in batch {
                deletes.push(delete_object(state, key));
            }
            for r in futures::future::join_all(deletes).await {
                r?;
                deleted += 1;
            }
        }
        match page.next_continuation_token() {
            Some(next) if page.is_truncated() == Some(true) => token = Some(next.to_owned()),
            _ => return Ok(deleted),
        }
    }
}

/// S3 AbortMultipartUpload; an upload storage already forgot counts as aborted.
///
/// Errors: `503 unavailable` (logged).
pub async fn abort_multipart(state: &AppState, key: &str, upload_id: &str) -> Result<(), ApiError> {
    match state.s3.abort_multipart_upload().bucket(&state.settings.s3.bucket).key(key).upload_id(upload_id).send().await {
        Ok(_) => Ok(()),
        Err(e) if is_no_such_upload(&e) => Ok(()),
        Err(e) => Err(unavailable("AbortMultipartUpload", aws_sdk_s3::error::DisplayErrorContext(e))),
    }
}

/// Strips the quotes S3 puts around ETags, so `"abc"` and `abc` compare equal.
pub fn normalize_etag(etag: &str) -> &str {
    etag.trim().trim_start_matches("W/").trim_matches('"')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_plan_respects_s3_limits() {
        const GIB: u64 = 1024 * MIB;
        assert_eq!(plan_parts(1, 16 * MIB), (16 * MIB, 1));
        assert_eq!(plan_parts(16 * MIB, 16 * MIB), (16 * MIB, 1));
        assert_eq!(plan_parts(16 * MIB + 1, 16 * MIB), (16 * MIB, 2));
        assert_eq!(plan_parts(5 * GIB, 16 * MIB), (16 * MIB, 320));
        // Below the S3 minimum, the target is raised to 5 MiB.
        assert_eq!(plan_parts(12 * MIB, MIB), (5 * MIB, 3));
        // 1 TiB at 16 MiB would be 65,536 parts: the part size grows instead.
        let (ps, n) = plan_parts(1024 * GIB, 16 * MIB);
        assert!(n as u64 <= MAX_PARTS && ps % MIB == 0 && ps * n as u64 >= 1024 * GIB, "{ps} {n}");
        assert_eq!(part_range(20, 8, 3), (16, 4));
        assert_eq!(part_range(16, 8, 2), (8, 8));
    }

    #[test]
    fn presigned_urls_expire_at_their_whole_second_signing_time_plus_ttl() {
        let (system, start) = signing_start();
        let after = Utc::now();
        assert_eq!(start.timestamp_subsec_nanos(), 0);
        assert!(start <= after && after - start < chrono::Duration::seconds(2));
        assert_eq!(DateTime::<Utc>::from(system), start);
        let (_, expires_at) = presigning(Duration::from_secs(900)).unwrap();
        assert_eq!(expires_at.timestamp_subsec_nanos(), 0);
        assert!(expires_at <= Utc::now() + chrono::Duration::seconds(900));
    }

    #[test]
    fn etags_compare_in_any_quoting() {
        assert_eq!(normalize_etag("\"abc\""), "abc");
        assert_eq!(normalize_etag("abc"), "abc");
        assert_eq!(normalize_etag(" W/\"abc\" "), "abc");
    }
}
