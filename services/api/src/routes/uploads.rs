//! `/uploads`: direct-to-storage multipart uploads (design §1; S3 multipart upload API).

use std::time::Duration;

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::AsyncConnection;
use vid_core::messages::TranscodeJob;
use vid_core::operation::OperationStatus;
use vid_core::upload::{CompleteUpload, CreateUpload, CreatedUpload, SignParts, SignedParts, StoredPart, UploadState, UploadStatus};
use vid_core::video::VideoStatus;
use vid_core::{OperationId, TenantId, UploadId, VideoId};
use vid_db::schema::{operations, uploads, videos};
use vid_db::RunQueryDsl;
use vid_infra::amqp::RK_JOB;

use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::operations::{load_operation, operation_location};
use crate::routes::parse_id;
use crate::state::AppState;
use crate::storage;

/// Routes of this module.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/uploads").route(web::post().to(create_upload)))
        .service(web::resource("/uploads/{id}").route(web::get().to(get_upload)).route(web::delete().to(abort_upload)))
        .service(web::resource("/uploads/{id}/parts:sign").route(web::post().to(sign_parts)))
        .service(web::resource("/uploads/{id}/complete").route(web::post().to(complete_upload)));
}

/// A row of `uploads`.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = uploads)]
pub struct UploadRow {
    pub id: UploadId,
    pub tenant_id: TenantId,
    pub status: String,
    pub size_bytes: i64,
    pub content_type: String,
    pub filename: Option<String>,
    pub part_size: i64,
    pub part_count: i32,
    pub storage_key: String,
    pub s3_upload_id: String,
    pub video_id: Option<VideoId>,
    pub operation_id: Option<OperationId>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

impl UploadRow {
    fn status(&self) -> UploadStatus {
        UploadStatus::parse(&self.status).unwrap_or(UploadStatus::Aborted)
    }

    fn part_range(&self, n: u32) -> (u64, u64) {
        storage::part_range(self.size_bytes as u64, self.part_size as u64, n)
    }
}

/// The storage key of an upload's source object.
pub fn source_key(tenant: &TenantId, upload: &UploadId) -> String {
    format!("tenants/{tenant}/uploads/{upload}/source")
}

/// Normalises a media type for the allow-list: lower case, parameters dropped.
fn normalize_content_type(ct: &str) -> String {
    ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase()
}

async fn load_upload(state: &AppState, tenant: &Tenant, id: &UploadId) -> ApiResult<UploadRow> {
    let mut conn = state.db.get().await?;
    uploads::table
        .filter(uploads::id.eq(id))
        .filter(uploads::tenant_id.eq(&tenant.id))
        .select(UploadRow::as_select())
        .first(&mut conn)
        .await
        .optional()?
        .ok_or(ApiError::NotFound("upload"))
}

/// `POST /uploads` → `201 Created` with one presigned UploadPart URL per part.
///
/// Errors: `invalid_size` (0 bytes), `file_too_large`, `unsupported_content_type` (422);
/// `too_many_uploads` (429) past the tenant's in-flight cap; `storage_unavailable` (503).
#[utoipa::path(
    post,
    path = "/uploads",
    tag = "uploads",
    security(("api_key" = [])),
    params(("Idempotency-Key" = Option<String>, Header, description = "1–255 visible ASCII characters. Makes a retry safe: the first answer is stored for 24 h and replayed (with `Idempotent-Replayed: true`) to a request with the same key and body.", min_length = 1, max_length = 255)),
    request_body = CreateUpload,
    responses(
        (status = 201, description = "Created: one presigned UploadPart URL per part.", body = CreatedUpload,
            headers(("Location" = String, description = "`/uploads/{id}`")),
            links(("GetUpload" = (operation_id = "get_upload", parameters(("id" = "$response.body#/id")))), ("SignParts" = (operation_id = "sign_parts", parameters(("id" = "$response.body#/id")))), ("CompleteUpload" = (operation_id = "complete_upload", parameters(("id" = "$response.body#/id")))), ("AbortUpload" = (operation_id = "abort_upload", parameters(("id" = "$response.body#/id")))))),
        (status = 400, response = crate::openapi::BadRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 409, response = crate::openapi::Conflict),
        (status = 413, response = crate::openapi::PayloadTooLarge),
        (status = 415, response = crate::openapi::UnsupportedMediaType),
        (status = 422, response = crate::openapi::Unprocessable),
        (status = 429, response = crate::openapi::TooManyRequests),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn create_upload(
    state: web::Data<AppState>,
    tenant: Tenant,
    http: HttpRequest,
    body: web::Json<CreateUpload>,
) -> ApiResult<HttpResponse> {
    let req = body.into_inner();
    crate::idempotency::once(&state, &tenant, &http, "POST /uploads", &req, || create_upload_once(&state, &tenant, req.clone())).await
}

async fn create_upload_once(state: &AppState, tenant: &Tenant, req: CreateUpload) -> ApiResult<HttpResponse> {
    let limits = &state.settings.uploads;
    if req.size_bytes == 0 {
        return Err(ApiError::unprocessable("invalid_size", "size_bytes must be at least 1"));
    }
    if req.size_bytes > limits.max_size_bytes {
        return Err(ApiError::unprocessable(
            "file_too_large",
            format!("size_bytes {} exceeds the maximum of {} bytes", req.size_bytes, limits.max_size_bytes),
        ));
    }
    let content_type = normalize_content_type(&req.content_type);
    if !limits.allowed_content_types.iter().any(|t| t.eq_ignore_ascii_case(&content_type)) {
        return Err(ApiError::unprocessable(
            "unsupported_content_type",
            format!("content_type `{}` is not accepted; use one of {}", req.content_type, limits.allowed_content_types.join(", ")),
        ));
    }
    if let Some(name) = &req.filename {
        if name.len() > 255 || name.chars().any(char::is_control) {
            return Err(ApiError::unprocessable("invalid_filename", "filename must be at most 255 bytes without control characters"));
        }
    }
    if let Some(cap) = tenant.max_uploads_in_flight {
        let mut conn = state.db.get().await?;
        let in_flight: i64 = uploads::table
            .filter(uploads::tenant_id.eq(&tenant.id))
            .filter(uploads::status.eq_any(["created", "completing"]))
            .count()
            .get_result(&mut conn)
            .await?;
        if in_flight >= cap as i64 {
            return Err(ApiError::TooManyRequests(format!("{in_flight} uploads are in flight; the limit is {cap}")));
        }
    }

    let (part_size, part_count) = storage::plan_parts(req.size_bytes, limits.target_part_size_bytes);
    let id = UploadId::generate();
    let key = source_key(&tenant.id, &id);
    let s3_upload_id = storage::create_multipart(state, &key, &content_type).await?;
    let expires_at = Utc::now() + chrono::Duration::seconds(limits.expire_after_seconds as i64);

    {
        let mut conn = state.db.get().await?;
        diesel::insert_into(uploads::table)
            .values((
                uploads::id.eq(&id),
                uploads::tenant_id.eq(&tenant.id),
                uploads::status.eq(UploadStatus::Created.as_str()),
                uploads::size_bytes.eq(req.size_bytes as i64),
                uploads::content_type.eq(&content_type),
                uploads::filename.eq(&req.filename),
                uploads::part_size.eq(part_size as i64),
                uploads::part_count.eq(part_count as i32),
                uploads::storage_key.eq(&key),
                uploads::s3_upload_id.eq(&s3_upload_id),
                uploads::expires_at.eq(expires_at),
            ))
            .execute(&mut conn)
            .await?;
    }

    let ttl = Duration::from_secs(limits.part_url_ttl_seconds);
    let mut parts = Vec::with_capacity(part_count as usize);
    for n in 1..=part_count {
        let (offset, length) = storage::part_range(req.size_bytes, part_size, n);
        parts.push(storage::presign_part(state, &key, &s3_upload_id, n, length, offset, ttl).await?);
    }
    let url_expiry = parts.iter().map(|p| p.expires_at).min().unwrap_or_else(Utc::now);
    let created = CreatedUpload {
        id: id.clone(),
        status: UploadStatus::Created,
        size_bytes: req.size_bytes,
        part_size,
        parts,
        expires_at: url_expiry,
    };
    Ok(HttpResponse::Created().insert_header(("Location", format!("/uploads/{id}"))).json(created))
}

/// `GET /uploads/{id}`: status and, while `created`, the parts storage holds (S3 ListParts).
#[utoipa::path(
    get,
    path = "/uploads/{id}",
    tag = "uploads",
    security(("api_key" = [])),
    params(("id" = vid_core::UploadId, Path, description = "The upload.")),
    responses(
        (status = 200, description = "The upload.", body = UploadState),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn get_upload(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: UploadId = parse_id(&path)?;
    let row = load_upload(&state, &tenant, &id).await?;
    let mut parts = Vec::new();
    let mut missing = Vec::new();
    if row.status() == UploadStatus::Created {
        parts = storage::list_parts(&state, &row.storage_key, &row.s3_upload_id).await?.unwrap_or_default();
        missing = (1..=row.part_count as u32)
            .filter(|n| {
                let (_, len) = row.part_range(*n);
                !parts.iter().any(|p| p.part_number == *n && p.size_bytes == len)
            })
            .collect();
    }
    Ok(HttpResponse::Ok().json(UploadState {
        id: row.id.clone(),
        status: row.status(),
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

fn refuse_if_closed(row: &UploadRow) -> ApiResult<()> {
    match row.status() {
        UploadStatus::Aborted => Err(ApiError::conflict("upload_aborted", format!("upload {} was aborted", row.id))),
        UploadStatus::Expired => Err(ApiError::conflict("upload_expired", format!("upload {} expired at {}", row.id, row.expires_at))),
        _ => Ok(()),
    }
}

/// `POST /uploads/{id}/parts:sign`: fresh URLs for just the named parts.
///
/// Errors: `invalid_part_numbers` (400), `upload_aborted`/`upload_expired`/`upload_completed` (409).
#[utoipa::path(
    post,
    path = "/uploads/{id}/parts:sign",
    tag = "uploads",
    security(("api_key" = [])),
    params(("id" = vid_core::UploadId, Path, description = "The upload.")),
    request_body = SignParts,
    responses(
        (status = 200, description = "Fresh URLs for the named parts.", body = SignedParts),
        (status = 400, response = crate::openapi::BadRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 409, response = crate::openapi::Conflict),
        (status = 413, response = crate::openapi::PayloadTooLarge),
        (status = 415, response = crate::openapi::UnsupportedMediaType),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn sign_parts(
    state: web::Data<AppState>,
    tenant: Tenant,
    path: web::Path<String>,
    body: web::Json<SignParts>,
) -> ApiResult<HttpResponse> {
    let id: UploadId = parse_id(&path)?;
    let row = load_upload(&state, &tenant, &id).await?;
    refuse_if_closed(&row)?;
    if row.status() != UploadStatus::Created {
        return Err(ApiError::conflict("upload_completed", "the upload is already completed; nothing to sign"));
    }
    let mut numbers = body.into_inner().part_numbers;
    numbers.sort_unstable();
    numbers.dedup();
    if numbers.is_empty() || numbers.iter().any(|n| *n == 0 || *n > row.part_count as u32) {
        return Err(ApiError::bad_request(
            "invalid_part_numbers",
            format!("part_numbers must be a non-empty list of numbers from 1 to {}", row.part_count),
        ));
    }
    let ttl = Duration::from_secs(state.settings.uploads.part_url_ttl_seconds);
    let mut parts = Vec::with_capacity(numbers.len());
    for n in numbers {
        let (offset, length) = row.part_range(n);
        parts.push(storage::presign_part(&state, &row.storage_key, &row.s3_upload_id, n, length, offset, ttl).await?);
    }
    Ok(HttpResponse::Ok().json(SignedParts { parts }))
}

/// `DELETE /uploads/{id}`: S3 AbortMultipartUpload; `204`. Idempotent.
#[utoipa::path(
    delete,
    path = "/uploads/{id}",
    tag = "uploads",
    security(("api_key" = [])),
    params(("id" = vid_core::UploadId, Path, description = "The upload.")),
    responses(
        (status = 204, description = "Aborted (or already aborted or expired)."),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 409, response = crate::openapi::Conflict),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn abort_upload(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: UploadId = parse_id(&path)?;
    let row = load_upload(&state, &tenant, &id).await?;
    match row.status() {
        UploadStatus::Completed => {
            return Err(ApiError::conflict("upload_completed", "a completed upload cannot be aborted; delete the video instead"))
        }
        UploadStatus::Aborted | UploadStatus::Expired => return Ok(HttpResponse::NoContent().finish()),
        UploadStatus::Created | UploadStatus::Completing => {}
    }
    storage::abort_multipart(&state, &row.storage_key, &row.s3_upload_id).await?;
    let mut conn = state.db.get().await?;
    diesel::update(uploads::table.filter(uploads::id.eq(&id)).filter(uploads::status.eq_any(["created", "completing"])))
        .set((uploads::status.eq(UploadStatus::Aborted.as_str()), uploads::updated_at.eq(Utc::now())))
        .execute(&mut conn)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

/// `POST /uploads/{id}/complete` → `202 Accepted`, `Location: /operations/{op}`.
///
/// Checks that parts 1..N are all present with their expected sizes (and, when
/// the body lists them, that the ETags match in any order and quoting), has
/// storage assemble them (S3 CompleteMultipartUpload), checks the assembled
/// size (S3 HeadObject), then in ONE transaction marks the upload completed,
/// creates the video and its `pending` operation, and queues the transcode
/// job in the outbox. Repeating the call returns the same operation.
///
/// Errors (409): `upload_incomplete` (with `missing_parts`), `part_size_mismatch`
/// (with `parts`), `etag_mismatch`, `size_mismatch`, `upload_aborted`, `upload_expired`.
#[utoipa::path(
    post,
    path = "/uploads/{id}/complete",
    tag = "uploads",
    security(("api_key" = [])),
    params(("id" = vid_core::UploadId, Path, description = "The upload."), ("Idempotency-Key" = Option<String>, Header, description = "1–255 visible ASCII characters. Makes a retry safe: the first answer is stored for 24 h and replayed (with `Idempotent-Replayed: true`) to a request with the same key and body.", min_length = 1, max_length = 255)),
    request_body(content = Option<CompleteUpload>, description = "Optional: the parts with the ETags storage answered. Without a (valid) body the server lists the parts itself."),
    responses(
        (status = 202, description = "Accepted: the transcode operation.", body = vid_core::operation::Operation,
            headers(("Location" = String, description = "`/operations/{op}`"))),
        (status = 400, response = crate::openapi::BadRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 409, response = crate::openapi::Conflict),
        (status = 422, response = crate::openapi::Unprocessable),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn complete_upload(
    state: web::Data<AppState>,
    tenant: Tenant,
    http: HttpRequest,
    path: web::Path<String>,
    body: Option<web::Json<CompleteUpload>>,
) -> ApiResult<HttpResponse> {
    let id: UploadId = parse_id(&path)?;
    let body = body.map(|b| b.into_inner()).unwrap_or_default();
    let route = format!("POST /uploads/{id}/complete");
    crate::idempotency::once(&state, &tenant, &http, &route, &body, || complete_upload_once(&state, &tenant, id.clone(), body.clone()))
        .await
}

async fn complete_upload_once(state: &AppState, tenant: &Tenant, id: UploadId, body: CompleteUpload) -> ApiResult<HttpResponse> {
    let row = load_upload(state, tenant, &id).await?;
    refuse_if_closed(&row)?;
    if let (UploadStatus::Completed, Some(op_id)) = (row.status(), &row.operation_id) {
        return accepted(state, tenant, op_id).await;
    }

    let stored = storage::list_parts(state, &row.storage_key, &row.s3_upload_id).await?;
    match stored {
        Some(stored) => {
            check_parts(&row, &stored, body.parts)?;
            mark_completing(state, &id).await?;
            let assembled = storage::complete_multipart(state, &row.storage_key, &row.s3_upload_id, &stored).await?;
            if !assembled {
                tracing::info!(upload = %id, "storage already assembled this upload; checking the object");
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
            return Err(ApiError::Conflict {
                code: "size_mismatch",
                detail: format!("the assembled object has {size} bytes; {} were declared", row.size_bytes),
                extensions: vec![("declared_size", row.size_bytes.into()), ("stored_size", size.into())],
            })
        }
        None => return Err(ApiError::conflict("upload_expired", "storage no longer holds this upload's parts; start a new upload")),
    }

    let op_id = finalize(state, tenant, &row).await?;
    state.outbox_notify.notify_one();
    accepted(state, tenant, &op_id).await
}

fn check_parts(row: &UploadRow, stored: &[StoredPart], given: Option<Vec<vid_core::upload::CompletedPart>>) -> ApiResult<()> {
    let count = row.part_count as u32;
    let missing: Vec<u32> = (1..=count).filter(|n| !stored.iter().any(|p| p.part_number == *n)).collect();
    if !missing.is_empty() {
        return Err(ApiError::Conflict {
            code: "upload_incomplete",
            detail: format!("{} of {count} parts are missing: {:?}", missing.len(), missing),
            extensions: vec![("missing_parts", serde_json::json!(missing))],
        });
    }
    let wrong: Vec<serde_json::Value> = stored
        .iter()
        .filter(|p| p.part_number >= 1 && p.part_number <= count)
        .filter_map(|p| {
            let (_, expected) = row.part_range(p.part_number);
            (p.size_bytes != expected)
                .then(|| serde_json::json!({"part_number": p.part_number, "expected_size": expected, "stored_size": p.size_bytes}))
        })
        .collect();
    if !wrong.is_empty() {
        return Err(ApiError::Conflict {
            code: "part_size_mismatch",
            detail: format!("{} part(s) have the wrong size; re-send them", wrong.len()),
            extensions: vec![("parts", serde_json::Value::Array(wrong))],
        });
    }
    if let Some(given) = given {
        for g in &given {
            let matches = stored
                .iter()
                .any(|p| p.part_number == g.part_number && storage::normalize_etag(&p.etag) == storage::normalize_etag(&g.etag));
            if !matches {
                return Err(ApiError::Conflict {
                    code: "etag_mismatch",
                    detail: format!("part {} does not have ETag {}", g.part_number, g.etag),
                    extensions: vec![("part_number", g.part_number.into())],
                });
            }
        }
    }
    Ok(())
}

async fn mark_completing(state: &AppState, id: &UploadId) -> ApiResult<()> {
    let mut conn = state.db.get().await?;
    diesel::update(uploads::table.filter(uploads::id.eq(id)).filter(uploads::status.eq("created")))
        .set((uploads::status.eq(UploadStatus::Completing.as_str()), uploads::updated_at.eq(Utc::now())))
        .execute(&mut conn)
        .await?;
    Ok(())
}

/// The one transaction that turns an assembled upload into a video, a pending
/// operation and a queued transcode job. Concurrent callers serialise on the
/// upload row; the loser gets the winner's operation id.
async fn finalize(state: &AppState, tenant: &Tenant, row: &UploadRow) -> ApiResult<OperationId> {
    let mut conn = state.db.get().await?;
    let topology = state.topology.clone();
    let op_id = conn
        .transaction::<OperationId, ApiError, _>(|conn| {
            async move {
                let claimed = diesel::update(
                    uploads::table.filter(uploads::id.eq(&row.id)).filter(uploads::status.eq_any(["created", "completing"])),
                )
                .set(uploads::status.eq(UploadStatus::Completed.as_str()))
                .execute(conn)
                .await?;
                if claimed == 0 {
                    let existing: Option<OperationId> =
                        uploads::table.filter(uploads::id.eq(&row.id)).select(uploads::operation_id).first(conn).await?;
                    return existing.ok_or_else(|| ApiError::conflict("upload_aborted", "the upload was aborted meanwhile"));
                }
                let video_id = VideoId::generate();
                let op_id = OperationId::generate();
                let now = Utc::now();
                diesel::insert_into(videos::table)
                    .values((
                        videos::id.eq(&video_id),
                        videos::tenant_id.eq(&tenant.id),
                        videos::upload_id.eq(&row.id),
                        videos::operation_id.eq(&op_id),
                        videos::status.eq(VideoStatus::Processing.as_str()),
                        videos::filename.eq(&row.filename),
                        videos::content_type.eq(&row.content_type),
                        videos::source_key.eq(&row.storage_key),
                    ))
                    .execute(conn)
                    .await?;
                diesel::insert_into(operations::table)
                    .values((
                        operations::id.eq(&op_id),
                        operations::tenant_id.eq(&tenant.id),
                        operations::video_id.eq(&video_id),
                        operations::status.eq(OperationStatus::Pending.as_str()),
                        operations::phase.eq("queued"),
                    ))
                    .execute(conn)
                    .await?;
                diesel::update(uploads::table.filter(uploads::id.eq(&row.id)))
                    .set((uploads::video_id.eq(&video_id), uploads::operation_id.eq(&op_id), uploads::updated_at.eq(now)))
                    .execute(conn)
                    .await?;
                let job = TranscodeJob {
                    operation_id: op_id.clone(),
                    video_id: video_id.clone(),
                    tenant_id: tenant.id.clone(),
                    source_key: row.storage_key.clone(),
                    source_size_bytes: row.size_bytes as u64,
                    output_prefix: format!("tenants/{}/videos/{}/", tenant.id, video_id),
                };
                crate::outbox::enqueue(
                    conn,
                    &topology.transcode_exchange(),
                    RK_JOB,
                    serde_json::to_string(&job).expect("jobs serialise"),
                    Some(op_id.as_str()),
                )
                .await?;
                Ok(op_id)
            }
            .scope_boxed()
        })
        .await?;
    Ok(op_id)
}

async fn accepted(state: &AppState, tenant: &Tenant, op_id: &OperationId) -> ApiResult<HttpResponse> {
    let op = load_operation(state, tenant, op_id).await?;
    Ok(HttpResponse::Accepted().insert_header(("Location", operation_location(op_id))).json(op))
}
