//! `POST /uploads/{id}/complete`: assemble the parts, then one transaction
//! turns the upload into a video and its transcode operation
//! ([`crate::domain::upload::finalize`]).

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use vid_core::upload::{CompleteUpload, CompletedPart, StoredPart, UploadStatus};
use vid_core::{OperationId, UploadId};

use super::shared::{accepted, load_upload, part_range, refusal, MAX_COMPLETE_BODY_BYTES};
use crate::auth::{Tenant, UploadCaller};
use crate::domain::upload::{self, Finalized};
use crate::error::{codes, ApiError, ApiResult};
use crate::routes::common::parse_id;
use crate::routes::operations::operation_location;
use crate::state::AppState;
use crate::storage;
use crate::store::{self, uploads::UploadRow};

/// `POST /uploads/{id}/complete` → `202 Accepted`, `Location: /operations/{op}`.
///
/// The body is optional. No body (zero bytes), `{}` or `null`: storage's own
/// list of the parts is used. A body that is present must be a valid
/// `CompleteUpload` sent as `application/json` and is never ignored:
/// malformed JSON, an unknown field, a wrong type or a bare array is `400
/// invalid_json`, another media type `415 unsupported_media_type`; its
/// `parts` must list every part 1..N exactly once (else `400 invalid_parts`,
/// e.g. for `{"parts":[]}`), each with the ETag storage answered to its PUT.
///
/// Checks that parts 1..N are all present with their expected sizes (and,
/// when the body lists them, that the ETags match in any order and quoting),
/// marks the upload `completing`, has storage assemble them (S3
/// CompleteMultipartUpload), checks the assembled size (S3 HeadObject), then
/// in ONE transaction marks the upload completed, creates the video and its
/// `pending` operation, and queues the transcode job in the outbox. Repeating
/// the call returns the same operation. If storage refuses to assemble
/// (a part was sent again after being listed), the upload is `created` again.
///
/// Errors: `invalid_json`, `invalid_parts` (400); `body_too_large` (413);
/// `unsupported_media_type` (415); (409:) `upload_incomplete` (with
/// `missing_parts`), `part_size_mismatch` (with `parts`), `etag_mismatch`
/// (with `part_number`: a listed ETag differs from storage's, or a part
/// changed while the upload was being completed; check the parts with `GET
/// /uploads/{id}` and complete again), `size_mismatch`, `upload_aborted`
/// (also when a DELETE committed first; nothing is left in storage),
/// `upload_expired` (also as soon as `expires_at` has passed);
/// `unavailable` (503).
#[utoipa::path(
    post,
    path = "/uploads/{id}/complete",
    tag = "uploads",
    security(("api_key" = []), ("client_token" = [])),
    params(("id" = vid_core::UploadId, Path, description = "The upload."), ("Idempotency-Key" = Option<String>, Header, description = "1–255 visible ASCII characters. Makes a retry safe: the first answer is stored for 24 h and replayed (with `Idempotent-Replayed: true`) to a request with the same key and body.", min_length = 1, max_length = 255)),
    request_body(content = Option<CompleteUpload>, description = "Optional. No body (zero bytes), `{}` or `null`: the server completes with the parts storage lists. Otherwise a valid `CompleteUpload` as `application/json` listing every part 1..N once with its ETag; an invalid body is `400 invalid_json` (`415` for another media type), never ignored."),
    responses(
        (status = 202, description = "Accepted: the transcode operation.", body = vid_core::operation::Operation,
            headers(("Location" = String, description = "`/operations/{op}`"))),
        (status = 400, response = crate::error::responses::BadRequest),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 409, response = crate::error::responses::Conflict),
        (status = 413, response = crate::error::responses::PayloadTooLarge),
        (status = 415, response = crate::error::responses::UnsupportedMediaType),
        (status = 422, response = crate::error::responses::Unprocessable),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
pub async fn complete_upload(
    state: web::Data<AppState>,
    caller: UploadCaller,
    http: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> ApiResult<HttpResponse> {
    let tenant = caller.tenant;
    let id: UploadId = parse_id(&path)?;
    let body = complete_body(&http, payload).await?;
    let route = format!("POST /uploads/{id}/complete");
    let owned = body.clone();
    crate::idempotency::once(&state, &tenant, &http, &route, &body, move |state, tenant| async move {
        complete_upload_once(&state, &tenant, id, owned).await
    })
    .await
}

/// Reads `complete`'s optional body. Zero bytes → no part list. Otherwise the
/// app's JSON rules apply exactly as to every other JSON body (`JsonConfig`
/// in `lib.rs`: `application/json`, at most 64 KiB, unknown fields refused),
/// and `null` means no part list; any other non-object (an array) is refused. Errors ([`crate::error::json_error`]):
/// `400 invalid_json`, `413 body_too_large` or `415 unsupported_media_type`.
async fn complete_body(http: &HttpRequest, payload: web::Payload) -> ApiResult<CompleteUpload> {
    let bytes = crate::routes::common::read_body(payload, MAX_COMPLETE_BODY_BYTES).await?;
    if bytes.is_empty() {
        return Ok(CompleteUpload::default());
    }
    let mut replay = actix_web::dev::Payload::from(bytes);
    let parsed = web::JsonBody::<Box<serde_json::value::RawValue>>::new(http, &mut replay, None, true).limit(MAX_COMPLETE_BODY_BYTES).await;
    let raw = parsed.map_err(|e| crate::error::json_error(&e))?;
    match raw.get().trim() {
        "null" => Ok(CompleteUpload::default()),
        // An object only (serde would also read a JSON array positionally),
        // from the text (a duplicate key is refused).
        text => crate::routes::common::object_from_str(text),
    }
}

async fn complete_upload_once(state: &AppState, tenant: &Tenant, id: UploadId, body: CompleteUpload) -> ApiResult<HttpResponse> {
    let row = load_upload(state, tenant, &id).await?;
    match (row.status_at(Utc::now()), &row.operation_id) {
        (UploadStatus::Completed, Some(op_id)) => return accepted(state, tenant, op_id).await,
        (UploadStatus::Created | UploadStatus::Completing, _) => {}
        (status, _) => return Err(refusal(&row, status)),
    }
    if let Some(listed) = &body.parts {
        check_listed(&row, listed)?;
    }

    let stored = storage::list_parts(state, &row.storage_key, &row.s3_upload_id).await?;
    match stored {
        Some(stored) => {
            check_parts(&row, &stored, body.parts.as_deref())?;
            if let Some(op_id) = begin_completing(state, tenant, &row).await? {
                return accepted(state, tenant, &op_id).await;
            }
            let completion = storage::complete_multipart(state, &row.storage_key, &row.s3_upload_id, &stored).await;
            match completion {
                Ok(storage::Completion::Assembled) => {}
                Ok(storage::Completion::UnknownUpload) => {
                    tracing::info!(upload = %id, "storage already assembled or dropped this upload; checking the object");
                }
                Ok(storage::Completion::PartsChanged) => {
                    reopen(state, &id).await;
                    return Err(parts_changed(state, &row, &stored).await);
                }
                Err(e) => {
                    reopen(state, &id).await;
                    return Err(e);
                }
            }
        }
        None => {
            // Storage forgot the multipart upload: either a previous complete
            // assembled it (then the object exists) or it was aborted.
            tracing::info!(upload = %id, "multipart upload unknown to storage; checking the object");
        }
    }

    match storage::object_size(state, &row.storage_key).await? {
        Some(size) if size == row.size_bytes as u64 => {}
        Some(size) => {
            return Err(ApiError::new(
                codes::SIZE_MISMATCH,
                format!("the assembled object has {size} bytes; {} were declared", row.size_bytes),
            )
            .with_extension("declared_size", row.size_bytes)
            .with_extension("stored_size", size))
        }
        None => return nothing_in_storage(state, tenant, &row).await,
    }

    let mut conn = state.db.get().await?;
    let finalized = upload::finalize(&mut conn, &state.outbox, &row).await?;
    drop(conn);
    match finalized {
        Finalized::Created(op) => Ok(HttpResponse::Accepted().insert_header(("Location", operation_location(&op.id))).json(op)),
        Finalized::Operation(op_id) => accepted(state, tenant, &op_id).await,
        Finalized::Lost(status) => {
            // Aborted (or expired) while storage assembled the parts: the
            // object must not outlive the upload.
            if storage::delete_object(state, &row.storage_key).await.is_err() {
                tracing::warn!(upload = %id, key = %row.storage_key, "could not delete the source object of an aborted upload");
            }
            Err(refusal(&row, status))
        }
    }
}

/// A `parts` list given to `complete` must name every part 1..N exactly once:
/// `400 invalid_parts` otherwise (an empty list included).
fn check_listed(row: &UploadRow, listed: &[CompletedPart]) -> ApiResult<()> {
    let count = row.part_count as u32;
    let mut numbers: Vec<u32> = listed.iter().map(|p| p.part_number).collect();
    numbers.sort_unstable();
    if !numbers.iter().copied().eq(1..=count) {
        return Err(ApiError::new(
            codes::INVALID_PARTS,
            format!(
                "parts must list each part number from 1 to {count} exactly once ({} given), or be left out to complete with the parts storage holds",
                listed.len()
            ),
        ));
    }
    Ok(())
}

/// Storage holds neither the multipart upload nor the object: answer what
/// the row says, marking a still open upload `expired` (storage dropped it,
/// e.g. by its lifecycle rule).
async fn nothing_in_storage(state: &AppState, tenant: &Tenant, row: &UploadRow) -> ApiResult<HttpResponse> {
    let mut conn = state.db.get().await?;
    store::uploads::move_status(&mut conn, &row.id, &store::uploads::OPEN, UploadStatus::Expired, None).await?;
    drop(conn);
    let current = load_upload(state, tenant, &row.id).await?;
    match (current.status, &current.operation_id) {
        (UploadStatus::Completed, Some(op_id)) => accepted(state, tenant, op_id).await,
        (UploadStatus::Expired, _) => {
            Err(ApiError::new(codes::UPLOAD_EXPIRED, format!("storage no longer holds the parts of upload {}; start a new upload", row.id)))
        }
        (status, _) => Err(refusal(&current, status)),
    }
}

/// Marks the upload `completing` (only from `created`, before `expires_at`).
/// `Ok(Some(op))` when another complete finished meanwhile; `Ok(None)` to go
/// on (also when another complete is running: storage and the final
/// transaction decide between the two).
async fn begin_completing(state: &AppState, tenant: &Tenant, row: &UploadRow) -> ApiResult<Option<OperationId>> {
    let now = Utc::now();
    let mut conn = state.db.get().await?;
    let marked = store::uploads::move_status(&mut conn, &row.id, &[UploadStatus::Created], UploadStatus::Completing, Some(now)).await?;
    drop(conn);
    if marked {
        return Ok(None);
    }
    let current = load_upload(state, tenant, &row.id).await?;
    match (current.status_at(now), &current.operation_id) {
        (UploadStatus::Completing | UploadStatus::Created, _) => Ok(None),
        (UploadStatus::Completed, Some(op_id)) => Ok(Some(op_id.clone())),
        (status, _) => Err(refusal(&current, status)),
    }
}

/// Puts an upload whose assembly failed back to `created`, so its parts can
/// be listed, signed and completed again. A failure here is logged: the row
/// stays `completing` and the janitor expires it after its `expires_at`.
async fn reopen(state: &AppState, id: &UploadId) {
    let reopened = async {
        let mut conn = state.db.get().await?;
        store::uploads::move_status(&mut conn, id, &[UploadStatus::Completing], UploadStatus::Created, None).await?;
        Ok::<_, ApiError>(())
    }
    .await;
    if let Err(e) = reopened {
        tracing::warn!(upload = %id, error = %e, "could not put the upload back to `created` after a failed complete");
    }
}

/// The `409 etag_mismatch` for parts storage refused at assembly (S3
/// `InvalidPart`): a part was sent again after `complete` listed it. Names the
/// first part whose ETag changed (`part_number`), when storage can still say.
async fn parts_changed(state: &AppState, row: &UploadRow, listed: &[StoredPart]) -> ApiError {
    let now = storage::list_parts(state, &row.storage_key, &row.s3_upload_id).await.ok().flatten().unwrap_or_default();
    let changed = listed.iter().map(|p| p.part_number).find(|n| {
        let before = listed.iter().find(|p| p.part_number == *n).map(|p| storage::normalize_etag(&p.etag));
        let after = now.iter().find(|p| p.part_number == *n).map(|p| storage::normalize_etag(&p.etag));
        before != after
    });
    let which = changed.map(|n| format!("part {n}")).unwrap_or_else(|| "a part".to_owned());
    let error = ApiError::new(
        codes::ETAG_MISMATCH,
        format!(
            "{which} was sent again while the upload was being completed, so storage refused to assemble it; the upload is \
             `created` again: check the parts with GET /uploads/{} and complete again",
            row.id
        ),
    );
    match changed {
        Some(n) => error.with_extension("part_number", n),
        None => error,
    }
}

fn check_parts(row: &UploadRow, stored: &[StoredPart], given: Option<&[CompletedPart]>) -> ApiResult<()> {
    let count = row.part_count as u32;
    let missing: Vec<u32> = (1..=count).filter(|n| !stored.iter().any(|p| p.part_number == *n)).collect();
    if !missing.is_empty() {
        return Err(ApiError::new(codes::UPLOAD_INCOMPLETE, format!("{} of {count} parts are missing: {:?}", missing.len(), missing))
            .with_extension("missing_parts", serde_json::json!(missing)));
    }
    let wrong: Vec<serde_json::Value> = stored
        .iter()
        .filter(|p| p.part_number >= 1 && p.part_number <= count)
        .filter_map(|p| {
            let (_, expected) = part_range(row, p.part_number);
            (p.size_bytes != expected)
                .then(|| serde_json::json!({"part_number": p.part_number, "expected_size": expected, "stored_size": p.size_bytes}))
        })
        .collect();
    if !wrong.is_empty() {
        return Err(ApiError::new(codes::PART_SIZE_MISMATCH, format!("{} part(s) have the wrong size; re-send them", wrong.len()))
            .with_extension("parts", serde_json::Value::Array(wrong)));
    }
    for g in given.unwrap_or_default() {
        let matches =
            stored.iter().any(|p| p.part_number == g.part_number && storage::normalize_etag(&p.etag) == storage::normalize_etag(&g.etag));
        if !matches {
            return Err(ApiError::new(codes::ETAG_MISMATCH, format!("part {} does not have ETag {}", g.part_number, g.etag))
                .with_extension("part_number", g.part_number));
        }
    }
    Ok(())
}
