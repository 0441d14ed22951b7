//! What the upload handlers share: refusals, keys, part arithmetic, the 202.
//! A leaf below `uploads/`: handlers import it, it imports no handler.

use actix_web::HttpResponse;
use vid_core::upload::{StoredPart, UploadStatus};
use vid_core::{OperationId, TenantId, UploadId};

use crate::auth::Tenant;
use crate::error::{codes, ApiError, ApiResult};
use crate::routes::operations::{load_operation, operation_location};
use crate::state::AppState;
use crate::storage;
use crate::store::{self, uploads::UploadRow};

/// `Retry-After` of `429 too_many_uploads`, in seconds (RFC 9110 §10.2.3).
///
/// A slot frees when one of the tenant's uploads is completed or aborted, or
/// reaches its `expires_at` (uploads past it no longer count), none of which
/// the api can predict. 30 s is a hint: short enough for a client finishing
/// another upload meanwhile, long enough that waiting clients poll gently.
pub const TOO_MANY_UPLOADS_RETRY_AFTER_SECONDS: u64 = 30;

/// Largest `complete` body, in bytes: the limit of every JSON body of the api (`413 body_too_large`).
pub const MAX_COMPLETE_BODY_BYTES: usize = crate::routes::common::MAX_JSON_BODY_BYTES;

/// The `409` for an upload in `status`, which forbids the request: `upload_aborted`,
/// `upload_expired`, `upload_completed` or `upload_completing`.
pub(crate) fn refusal(row: &UploadRow, status: UploadStatus) -> ApiError {
    match status {
        UploadStatus::Aborted => ApiError::new(codes::UPLOAD_ABORTED, format!("upload {} was aborted; start a new upload", row.id)),
        UploadStatus::Expired => ApiError::new(
            codes::UPLOAD_EXPIRED,
            format!("upload {} expired at {} without being completed; start a new upload", row.id, row.expires_at.to_rfc3339()),
        ),
        UploadStatus::Completed => ApiError::new(
            codes::UPLOAD_COMPLETED,
            match &row.video_id {
                Some(video) => format!("upload {} is completed: it became video {video} and can no longer be changed or aborted", row.id),
                None => format!("upload {} is completed and can no longer be changed or aborted", row.id),
            },
        ),
        UploadStatus::Completing | UploadStatus::Created => ApiError::new(
            codes::UPLOAD_COMPLETING,
            format!(
                "upload {} is being completed; wait for the answer to `complete` (if storage refuses, the upload is `created` again)",
                row.id
            ),
        ),
    }
}

/// The storage key of an upload's source object.
pub fn source_key(tenant: &TenantId, upload: &UploadId) -> String {
    format!("tenants/{tenant}/uploads/{upload}/source")
}

/// Normalises a media type for the allow-list: lower case, parameters dropped.
pub(crate) fn normalize_content_type(ct: &str) -> String {
    ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase()
}

/// Whether `name` is acceptable as a display filename: at most 255 bytes, and
/// no [`unsafe_to_display`](crate::routes::common::unsafe_to_display) character.
pub fn is_valid_filename(name: &str) -> bool {
    name.len() <= 255 && !name.chars().any(crate::routes::common::unsafe_to_display)
}

/// Loads a tenant's upload; `404` for anyone else's.
pub(super) async fn load_upload(state: &AppState, tenant: &Tenant, id: &UploadId) -> ApiResult<UploadRow> {
    let mut conn = state.db.get().await?;
    store::uploads::get(&mut conn, &tenant.id, id).await?.ok_or(ApiError::NotFound("upload"))
}

/// Offset and length of part `n` (1-based) of the upload.
pub(super) fn part_range(row: &UploadRow, n: u32) -> (u64, u64) {
    storage::part_range(row.size_bytes as u64, row.part_size as u64, n)
}

/// Part numbers storage does not hold with their exact size.
pub(super) fn missing_parts(row: &UploadRow, stored: &[StoredPart]) -> Vec<u32> {
    (1..=row.part_count as u32)
        .filter(|n| {
            let (_, len) = part_range(row, *n);
            !stored.iter().any(|p| p.part_number == *n && p.size_bytes == len)
        })
        .collect()
}

/// The `202 Accepted` of `complete` for the upload's operation, with `Location`.
pub(super) async fn accepted(state: &AppState, tenant: &Tenant, op_id: &OperationId) -> ApiResult<HttpResponse> {
    let op = load_operation(state, tenant, op_id).await?;
    Ok(HttpResponse::Accepted().insert_header(("Location", operation_location(op_id))).json(op))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filenames_refuse_control_format_and_separator_characters() {
        for ok in ["clip.mp4", "clip é 日本.mp4", "🎬 take 2.mp4", "مرحبا.mp4", "a b\u{a0}c.mp4"] {
            assert!(is_valid_filename(ok), "{ok:?}");
        }
        // Cc, Cf (bidi override and isolate, zero-width space/joiner, BOM, soft hyphen), Zl, Zp.
        for bad in [
            "a\u{0}b",
            "a\nb",
            "a\u{7f}b",
            "x\u{202E}4pm.exe",
            "x\u{2066}y",
            "a\u{200B}b",
            "a\u{200D}b",
            "\u{FEFF}a",
            "a\u{AD}b",
            "a\u{2028}b",
            "a\u{2029}b",
        ] {
            assert!(!is_valid_filename(bad), "{bad:?}");
        }
        assert!(is_valid_filename(&"a".repeat(255)));
        assert!(!is_valid_filename(&"a".repeat(256)));
        assert!(!is_valid_filename(&"é".repeat(128)), "the limit is in bytes");
    }
}
