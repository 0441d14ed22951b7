//! `GET /uploads/{id}`, `POST /uploads/{id}/parts:sign` and `DELETE /uploads/{id}`.

use std::time::Duration;

use actix_web::{web, HttpResponse};
use chrono::Utc;
use vid_core::upload::{SignParts, SignedParts, UploadState, UploadStatus};
use vid_core::UploadId;

use super::shared::{load_upload, missing_parts, part_range, refusal};
use crate::auth::UploadCaller;
use crate::error::{codes, ApiError, ApiResult};
use crate::routes::common::parse_id;
use crate::state::AppState;
use crate::storage;
use crate::store;

/// `GET /uploads/{id}`: the upload's status and, while `created` or
/// `completing`, the parts storage holds (S3 ListParts) and those still missing.
///
/// `status` is the status at the time of the request: an upload past its
/// `expires_at` reads `expired` at once. `expires_at` is the upload's own
/// expiry (not the part URLs'). Errors: `not_found` (404), `unavailable` (503).
#[utoipa::path(
    get,
    path = "/uploads/{id}",
    tag = "uploads",
    security(("api_key" = []), ("client_token" = [])),
    params(("id" = vid_core::UploadId, Path, description = "The upload.")),
    responses(
        (status = 200, description = "The upload.", body = UploadState),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
pub async fn get_upload(state: web::Data<AppState>, caller: UploadCaller, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let tenant = caller.tenant;
    let id: UploadId = parse_id(&path)?;
    let row = load_upload(&state, &tenant, &id).await?;
    let status = row.status_at(Utc::now());
    let (parts, missing) = match status {
        UploadStatus::Created | UploadStatus::Completing => {
            match storage::list_parts(&state, &row.storage_key, &row.s3_upload_id).await? {
                Some(parts) => {
                    let missing = missing_parts(&row, &parts);
                    (parts, missing)
                }
                // Storage has assembled the parts (a complete is finishing): nothing to send.
                None if status == UploadStatus::Completing => (Vec::new(), Vec::new()),
                None => (Vec::new(), missing_parts(&row, &[])),
            }
        }
        _ => (Vec::new(), Vec::new()),
    };
    Ok(HttpResponse::Ok().json(UploadState {
        id: row.id.clone(),
        status,
        size_bytes: row.size_bytes as u64,
        content_type: row.content_type.clone(),
        part_size: row.part_size as u64,
        part_count: row.part_count as u32,
        parts,
        missing_parts: missing,
        video_id: row.video_id.clone(),
        operation_id: row.operation_id.clone(),
        created_at: row.created_at,
        expires_at: row.expires_at,
    }))
}

/// `POST /uploads/{id}/parts:sign`: fresh presigned S3 UploadPart URLs for just the named parts.
///
/// Errors: `invalid_part_numbers` (400); `upload_aborted`, `upload_expired`
/// (also as soon as the upload's `expires_at` has passed),
/// `upload_completing` (a `complete` is running; retry once it answered),
/// `upload_completed` (409); `unavailable` (503).
#[utoipa::path(
    post,
    path = "/uploads/{id}/parts:sign",
    tag = "uploads",
    security(("api_key" = []), ("client_token" = [])),
    params(("id" = vid_core::UploadId, Path, description = "The upload.")),
    request_body = SignParts,
    responses(
        (status = 200, description = "Fresh URLs for the named parts.", body = SignedParts),
        (status = 400, response = crate::error::responses::BadRequest),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 409, response = crate::error::responses::Conflict),
        (status = 413, response = crate::error::responses::PayloadTooLarge),
        (status = 415, response = crate::error::responses::UnsupportedMediaType),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
pub async fn sign_parts(
    state: web::Data<AppState>,
    caller: UploadCaller,
    path: web::Path<String>,
    body: crate::routes::common::Json<SignParts>,
) -> ApiResult<HttpResponse> {
    let tenant = caller.tenant;
    let id: UploadId = parse_id(&path)?;
    let row = load_upload(&state, &tenant, &id).await?;
    let status = row.status_at(Utc::now());
    if status != UploadStatus::Created {
        return Err(refusal(&row, status));
    }
    let mut numbers = body.into_inner().part_numbers;
    numbers.sort_unstable();
    numbers.dedup();
    if numbers.is_empty() || numbers.iter().any(|n| *n == 0 || *n > row.part_count as u32) {
        return Err(ApiError::new(
            codes::INVALID_PART_NUMBERS,
            format!("part_numbers must be a non-empty list of numbers from 1 to {}", row.part_count),
        ));
    }
    let ttl = Duration::from_secs(state.settings.uploads.part_url_ttl_seconds);
    let mut parts = Vec::with_capacity(numbers.len());
    for n in numbers {
        let (offset, length) = part_range(&row, n);
        parts.push(storage::presign_part(&state, &row.storage_key, &row.s3_upload_id, n, length, offset, ttl).await?);
    }
    Ok(HttpResponse::Ok().json(SignedParts { parts }))
}

/// `DELETE /uploads/{id}`: aborts the upload; `204`. Idempotent.
///
/// Marks the upload `aborted`, then has storage drop it (S3
/// AbortMultipartUpload, and S3 DeleteObject for an object a concurrent
/// `complete` may have assembled). An upload already `aborted` or `expired`
/// answers `204` again (repeating the storage calls, so a DELETE that failed
/// with `503` after the upload was marked can simply be retried).
///
/// Errors: `upload_completed` (409) when the upload is completed, including
/// when a `complete` running at the same time committed first: the upload is
/// then a video and stays one; `unavailable` (503).
#[utoipa::path(
    delete,
    path = "/uploads/{id}",
    tag = "uploads",
    security(("api_key" = []), ("client_token" = [])),
    params(("id" = vid_core::UploadId, Path, description = "The upload.")),
    responses(
        (status = 204, description = "Aborted (or already aborted or expired)."),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 409, response = crate::error::responses::Conflict),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
pub async fn abort_upload(state: web::Data<AppState>, caller: UploadCaller, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let tenant = caller.tenant;
    let id: UploadId = parse_id(&path)?;
    let mut row = load_upload(&state, &tenant, &id).await?;
    if store::uploads::OPEN.contains(&row.status) {
        let mut conn = state.db.get().await?;
        let aborted = store::uploads::move_status(&mut conn, &id, &store::uploads::OPEN, UploadStatus::Aborted, None).await?;
        drop(conn);
        if aborted {
            row.status = UploadStatus::Aborted;
        } else {
            // Something else moved it first: a complete (then it is a video
            // now), another DELETE or the janitor.
            row = load_upload(&state, &tenant, &id).await?;
        }
    }
    match row.status {
        UploadStatus::Completed => return Err(refusal(&row, UploadStatus::Completed)),
        UploadStatus::Created | UploadStatus::Completing => {
            return Err(ApiError::Internal(anyhow::anyhow!("upload {id} is still {} after being aborted", row.status)))
        }
        UploadStatus::Aborted | UploadStatus::Expired => {}
    }
    storage::abort_multipart(&state, &row.storage_key, &row.s3_upload_id).await?;
    storage::delete_object(&state, &row.storage_key).await?;
    Ok(HttpResponse::NoContent().finish())
}
