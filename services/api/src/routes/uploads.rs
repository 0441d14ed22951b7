//! `/uploads`: direct-to-storage multipart uploads (design §1; S3 multipart upload API).
//!
//! An upload's `status` (column `uploads.status`) moves
//! `created` → `completing` → `completed`, or ends `aborted` (`DELETE`) or
//! `expired` (not completed by `expires_at`). `completing` falls back to
//! `created` when storage refuses to assemble the parts.
//!
//! PostgreSQL decides every race; storage follows:
//!
//! - **Per-tenant cap.** `POST /uploads` locks the tenant's row
//!   (`SELECT … FOR NO KEY UPDATE`, which does not block foreign-key checks)
//!   in the transaction that counts the tenant's uploads in flight and inserts
//!   the new one, so parallel creates are serialised per tenant and the cap
//!   holds exactly.
//! - **complete vs DELETE.** Each moves the row with a guarded `UPDATE … WHERE
//!   status IN (…)`. Whichever commits first wins; the loser answers `409`
//!   (`upload_completed` to the DELETE, `upload_aborted` to the complete) and
//!   cleans up after itself: a complete that assembled the object and then
//!   lost deletes it (S3 DeleteObject), so an aborted upload never leaves data.
//!   DELETE changes the row first and then aborts in storage.
//! - **Expiry.** `expires_at` is enforced by the handlers at request time;
//!   the janitor ([`crate::janitor`]) then aborts the multipart upload.

use std::time::Duration;

use actix_web::http::header::{HeaderValue, RETRY_AFTER};
use actix_web::{web, FromRequest, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use vid_core::messages::TranscodeJob;
use vid_core::operation::OperationStatus;
use vid_core::upload::{
    CompleteUpload, CompletedPart, CreateUpload, CreatedUpload, SignParts, SignedParts, StoredPart, UploadState, UploadStatus,
};
use vid_core::video::VideoStatus;
use vid_core::{OperationId, Problem, TenantId, UploadId, VideoId};
use vid_db::schema::{operations, tenants, uploads, videos};
use vid_db::RunQueryDsl;
use vid_infra::amqp::RK_JOB;

use crate::auth::Tenant;
use crate::error::{problem_response, ApiError, ApiResult};
use crate::routes::operations::{load_operation, operation_location, OperationRow};
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

/// `Retry-After` of `429 too_many_uploads`, in seconds (RFC 9110 §10.2.3).
///
/// A slot frees when one of the tenant's uploads is completed or aborted, or
/// reaches its `expires_at` (uploads past it no longer count), none of which
/// the api can predict. 30 s is a hint: short enough for a client finishing
/// another upload meanwhile, long enough that waiting clients poll gently.
pub const TOO_MANY_UPLOADS_RETRY_AFTER_SECONDS: u64 = 30;

/// Largest `complete` body, in bytes: the limit of every JSON body of the api (`413 body_too_large`).
pub const MAX_COMPLETE_BODY_BYTES: usize = 64 * 1024;

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
    /// The status as stored.
    fn stored_status(&self) -> UploadStatus {
        UploadStatus::parse(&self.status).unwrap_or(UploadStatus::Aborted)
    }

    /// The status at `now`, as clients see it: a `created` upload whose
    /// `expires_at` has passed is `expired` although the janitor has not
    /// recorded it yet.
    fn status_at(&self, now: DateTime<Utc>) -> UploadStatus {
        match self.stored_status() {
            UploadStatus::Created if self.expires_at <= now => UploadStatus::Expired,
            status => status,
        }
    }

    fn part_range(&self, n: u32) -> (u64, u64) {
        storage::part_range(self.size_bytes as u64, self.part_size as u64, n)
    }

    /// Part numbers storage does not hold with their exact size.
    fn missing_parts(&self, stored: &[StoredPart]) -> Vec<u32> {
        (1..=self.part_count as u32)
            .filter(|n| {
                let (_, len) = self.part_range(*n);
                !stored.iter().any(|p| p.part_number == *n && p.size_bytes == len)
            })
            .collect()
    }
}

/// The `409` for an upload in `status`, which forbids the request: `upload_aborted`,
/// `upload_expired`, `upload_completed` or `upload_completing`.
fn refusal(row: &UploadRow, status: UploadStatus) -> ApiError {
    match status {
        UploadStatus::Aborted => ApiError::conflict("upload_aborted", format!("upload {} was aborted; start a new upload", row.id)),
        UploadStatus::Expired => ApiError::conflict(
            "upload_expired",
            format!("upload {} expired at {} without being completed; start a new upload", row.id, row.expires_at.to_rfc3339()),
        ),
        UploadStatus::Completed => ApiError::conflict(
            "upload_completed",
            match &row.video_id {
                Some(video) => format!("upload {} is completed: it became video {video} and can no longer be changed or aborted", row.id),
                None => format!("upload {} is completed and can no longer be changed or aborted", row.id),
            },
        ),
        UploadStatus::Completing | UploadStatus::Created => ApiError::conflict(
            "upload_completing",
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
fn normalize_content_type(ct: &str) -> String {
    ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase()
}

/// Whether `name` is acceptable as a display filename: at most 255 bytes, and
/// no [`unsafe_to_display`](crate::routes::unsafe_to_display) character.
pub fn is_valid_filename(name: &str) -> bool {
    name.len() <= 255 && !name.chars().any(crate::routes::unsafe_to_display)
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
/// Creates the multipart upload in storage (S3 CreateMultipartUpload) and
/// presigns S3 UploadPart for each part. The answer's `expires_at` is when the
/// part URLs expire (15 min by default), not the upload (24 h by default; see
/// `GET /uploads/{id}`).
///
/// Errors: `invalid_json` (400); `invalid_size` (0 bytes), `file_too_large`
/// (above `uploads.max_size_bytes`), `unsupported_content_type`,
/// `invalid_filename` (over 255 bytes, or a control, format or line-separator
/// character) (422); `too_many_uploads` (429, with `Retry-After: 30` and the
/// `limit` and `in_flight` members) when the tenant already has its maximum
/// of uploads in flight (`created` or `completing`, not past `expires_at`);
/// `unavailable` (503) when storage or the database is down.
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
    let owned = req.clone();
    crate::idempotency::once(&state, &tenant, &http, "POST /uploads", &req, move |state, tenant| async move {
        create_upload_once(&state, &tenant, owned).await
    })
    .await
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
        if !is_valid_filename(name) {
            return Err(ApiError::unprocessable(
                "invalid_filename",
                "filename must be at most 255 bytes, without control characters, Unicode format characters (e.g. U+202E, \
                 zero-width characters) or line separators",
            ));
        }
    }
    // A cheap early refusal, before storage is involved; the check that holds
    // under concurrency is the one in `insert_within_cap`.
    if let Some(cap) = tenant.max_uploads_in_flight {
        let mut conn = state.db.get().await?;
        let in_flight = count_in_flight(&mut conn, &tenant.id, Utc::now()).await?;
        if in_flight >= cap as i64 {
            return Ok(too_many_uploads(in_flight, cap));
        }
    }

    let (part_size, part_count) = storage::plan_parts(req.size_bytes, limits.target_part_size_bytes);
    let id = UploadId::generate();
    let key = source_key(&tenant.id, &id);
    let s3_upload_id = storage::create_multipart(state, &key, &content_type).await?;
    let expires_at = Utc::now() + chrono::Duration::seconds(limits.expire_after_seconds as i64);
    let new = NewUpload {
        id: &id,
        tenant: &tenant.id,
        size_bytes: req.size_bytes,
        content_type: &content_type,
        filename: req.filename.as_deref(),
        part_size,
        part_count,
        key: &key,
        s3_upload_id: &s3_upload_id,
        expires_at,
    };
    let refused = match insert_within_cap(state, &new).await {
        Ok(refused) => refused,
        Err(e) => {
            discard_multipart(state, &key, &s3_upload_id).await;
            return Err(e);
        }
    };
    if let Some((in_flight, cap)) = refused {
        discard_multipart(state, &key, &s3_upload_id).await;
        return Ok(too_many_uploads(in_flight, cap));
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

/// The values of a new `uploads` row.
struct NewUpload<'a> {
    id: &'a UploadId,
    tenant: &'a TenantId,
    size_bytes: u64,
    content_type: &'a str,
    filename: Option<&'a str>,
    part_size: u64,
    part_count: u32,
    key: &'a str,
    s3_upload_id: &'a str,
    expires_at: DateTime<Utc>,
}

/// The tenant's uploads in flight at `now`: `created` or `completing`, not past `expires_at`.
async fn count_in_flight(conn: &mut AsyncPgConnection, tenant: &TenantId, now: DateTime<Utc>) -> QueryResult<i64> {
    uploads::table
        .filter(uploads::tenant_id.eq(tenant))
        .filter(uploads::status.eq_any([UploadStatus::Created.as_str(), UploadStatus::Completing.as_str()]))
        .filter(uploads::expires_at.gt(now))
        .count()
        .get_result(conn)
        .await
}

/// Inserts the upload unless the tenant's cap is reached; `Some((in_flight,
/// cap))` when refused. For a tenant with a cap, one transaction holds the
/// tenant's row (`FOR NO KEY UPDATE`) around the count and the insert, so its
/// concurrent creates are serialised and never exceed the cap; a tenant
/// without one takes no such lock.
async fn insert_within_cap(state: &AppState, new: &NewUpload<'_>) -> ApiResult<Option<(i64, i32)>> {
    let mut conn = state.db.get().await?;
    let refused = conn
        .transaction::<Option<(i64, i32)>, ApiError, _>(|conn| {
            async move {
                // Only a tenant with a cap serialises its creates on its row
                // (FOR NO KEY UPDATE, so the count below sees every earlier
                // insert); without one, creates run side by side (the insert's
                // foreign-key check takes only FOR KEY SHARE).
                let capped: Option<i32> =
                    tenants::table.filter(tenants::id.eq(new.tenant)).select(tenants::max_uploads_in_flight).first(conn).await?;
                let cap = match capped {
                    Some(_) => {
                        tenants::table
                            .filter(tenants::id.eq(new.tenant))
                            .select(tenants::max_uploads_in_flight)
                            .for_no_key_update()
                            .first::<Option<i32>>(conn)
                            .await?
                    }
                    None => None,
                };
                if let Some(cap) = cap {
                    let in_flight = count_in_flight(conn, new.tenant, Utc::now()).await?;
                    if in_flight >= cap as i64 {
                        return Ok(Some((in_flight, cap)));
                    }
                }
                diesel::insert_into(uploads::table)
                    .values((
                        uploads::id.eq(new.id),
                        uploads::tenant_id.eq(new.tenant),
                        uploads::status.eq(UploadStatus::Created.as_str()),
                        uploads::size_bytes.eq(new.size_bytes as i64),
                        uploads::content_type.eq(new.content_type),
                        uploads::filename.eq(new.filename),
                        uploads::part_size.eq(new.part_size as i64),
                        uploads::part_count.eq(new.part_count as i32),
                        uploads::storage_key.eq(new.key),
                        uploads::s3_upload_id.eq(new.s3_upload_id),
                        uploads::expires_at.eq(new.expires_at),
                    ))
                    .execute(conn)
                    .await?;
                Ok(None)
            }
            .scope_boxed()
        })
        .await?;
    Ok(refused)
}

/// Aborts a multipart upload no row refers to (best effort: the bucket's
/// lifecycle rule aborts incomplete multipart uploads anyway).
async fn discard_multipart(state: &AppState, key: &str, s3_upload_id: &str) {
    if storage::abort_multipart(state, key, s3_upload_id).await.is_err() {
        tracing::warn!(key, "could not abort a multipart upload no upload refers to; the bucket lifecycle rule will");
    }
}

/// The `429 too_many_uploads` answer, with `Retry-After` and the `limit` and
/// `in_flight` extension members.
fn too_many_uploads(in_flight: i64, cap: i32) -> HttpResponse {
    let problem = Problem::new(429, "too_many_uploads", "Too many uploads")
        .with_detail(format!(
            "{in_flight} uploads are in flight (created or completing); the limit is {cap}: complete or abort one, or retry later"
        ))
        .with_extension("limit", cap)
        .with_extension("in_flight", in_flight);
    let mut resp = problem_response(problem);
    resp.headers_mut().insert(RETRY_AFTER, HeaderValue::from(TOO_MANY_UPLOADS_RETRY_AFTER_SECONDS));
    resp
}

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
    let status = row.status_at(Utc::now());
    let (parts, missing) = match status {
        UploadStatus::Created | UploadStatus::Completing => {
            match storage::list_parts(&state, &row.storage_key, &row.s3_upload_id).await? {
                Some(parts) => {
                    let missing = row.missing_parts(&parts);
                    (parts, missing)
                }
                // Storage has assembled the parts (a complete is finishing): nothing to send.
                None if status == UploadStatus::Completing => (Vec::new(), Vec::new()),
                None => (Vec::new(), row.missing_parts(&[])),
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
    let status = row.status_at(Utc::now());
    if status != UploadStatus::Created {
        return Err(refusal(&row, status));
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
    let mut row = load_upload(&state, &tenant, &id).await?;
    if matches!(row.stored_status(), UploadStatus::Created | UploadStatus::Completing) {
        let mut conn = state.db.get().await?;
        let aborted = diesel::update(
            uploads::table
                .filter(uploads::id.eq(&id))
                .filter(uploads::status.eq_any([UploadStatus::Created.as_str(), UploadStatus::Completing.as_str()])),
        )
        .set((uploads::status.eq(UploadStatus::Aborted.as_str()), uploads::updated_at.eq(Utc::now())))
        .execute(&mut conn)
        .await?;
        drop(conn);
        if aborted == 1 {
            row.status = UploadStatus::Aborted.as_str().to_owned();
        } else {
            // Something else moved it first: a complete (then it is a video
            // now), another DELETE or the janitor.
            row = load_upload(&state, &tenant, &id).await?;
        }
    }
    match row.stored_status() {
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
    security(("api_key" = [])),
    params(("id" = vid_core::UploadId, Path, description = "The upload."), ("Idempotency-Key" = Option<String>, Header, description = "1–255 visible ASCII characters. Makes a retry safe: the first answer is stored for 24 h and replayed (with `Idempotent-Replayed: true`) to a request with the same key and body.", min_length = 1, max_length = 255)),
    request_body(content = Option<CompleteUpload>, description = "Optional. No body (zero bytes), `{}` or `null`: the server completes with the parts storage lists. Otherwise a valid `CompleteUpload` as `application/json` listing every part 1..N once with its ETag; an invalid body is `400 invalid_json` (`415` for another media type), never ignored."),
    responses(
        (status = 202, description = "Accepted: the transcode operation.", body = vid_core::operation::Operation,
            headers(("Location" = String, description = "`/operations/{op}`"))),
        (status = 400, response = crate::openapi::BadRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 409, response = crate::openapi::Conflict),
        (status = 413, response = crate::openapi::PayloadTooLarge),
        (status = 415, response = crate::openapi::UnsupportedMediaType),
        (status = 422, response = crate::openapi::Unprocessable),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn complete_upload(
    state: web::Data<AppState>,
    tenant: Tenant,
    http: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> ApiResult<HttpResponse> {
    let id: UploadId = parse_id(&path)?;
    let body = match complete_body(&http, payload).await {
        Ok(body) => body,
        Err(problem) => return Ok(problem),
    };
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
/// and `null` means no part list. `Err` is the problem response to send:
/// `400 invalid_json`, `413 body_too_large` or `415 unsupported_media_type`.
async fn complete_body(http: &HttpRequest, payload: web::Payload) -> Result<CompleteUpload, HttpResponse> {
    let bytes = crate::routes::read_body(payload, MAX_COMPLETE_BODY_BYTES).await?;
    if bytes.is_empty() {
        return Ok(CompleteUpload::default());
    }
    let mut replay = actix_web::dev::Payload::from(bytes);
    match web::Json::<Option<CompleteUpload>>::from_request(http, &mut replay).await {
        Ok(json) => Ok(json.into_inner().unwrap_or_default()),
        Err(e) => Err(e.error_response()),
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
            return Err(ApiError::Conflict {
                code: "size_mismatch",
                detail: format!("the assembled object has {size} bytes; {} were declared", row.size_bytes),
                extensions: vec![("declared_size", row.size_bytes.into()), ("stored_size", size.into())],
            })
        }
        None => return nothing_in_storage(state, tenant, &row).await,
    }

    match finalize(state, tenant, &row).await? {
        Finalized::Created(op) => {
            state.outbox_notify.notify_one();
            Ok(HttpResponse::Accepted().insert_header(("Location", operation_location(&op.id))).json(op))
        }
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
        return Err(ApiError::bad_request(
            "invalid_parts",
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
    diesel::update(
        uploads::table
            .filter(uploads::id.eq(&row.id))
            .filter(uploads::status.eq_any([UploadStatus::Created.as_str(), UploadStatus::Completing.as_str()])),
    )
    .set((uploads::status.eq(UploadStatus::Expired.as_str()), uploads::updated_at.eq(Utc::now())))
    .execute(&mut conn)
    .await?;
    drop(conn);
    let current = load_upload(state, tenant, &row.id).await?;
    match (current.stored_status(), &current.operation_id) {
        (UploadStatus::Completed, Some(op_id)) => accepted(state, tenant, op_id).await,
        (UploadStatus::Expired, _) => {
            Err(ApiError::conflict("upload_expired", format!("storage no longer holds the parts of upload {}; start a new upload", row.id)))
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
    let marked = diesel::update(
        uploads::table
            .filter(uploads::id.eq(&row.id))
            .filter(uploads::status.eq(UploadStatus::Created.as_str()))
            .filter(uploads::expires_at.gt(now)),
    )
    .set((uploads::status.eq(UploadStatus::Completing.as_str()), uploads::updated_at.eq(now)))
    .execute(&mut conn)
    .await?;
    drop(conn);
    if marked == 1 {
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
        diesel::update(uploads::table.filter(uploads::id.eq(id)).filter(uploads::status.eq(UploadStatus::Completing.as_str())))
            .set((uploads::status.eq(UploadStatus::Created.as_str()), uploads::updated_at.eq(Utc::now())))
            .execute(&mut conn)
            .await?;
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
    ApiError::Conflict {
        code: "etag_mismatch",
        detail: format!(
            "{which} was sent again while the upload was being completed, so storage refused to assemble it; the upload is \
             `created` again: check the parts with GET /uploads/{} and complete again",
            row.id
        ),
        extensions: changed.map(|n| vec![("part_number", n.into())]).unwrap_or_default(),
    }
}

fn check_parts(row: &UploadRow, stored: &[StoredPart], given: Option<&[CompletedPart]>) -> ApiResult<()> {
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
    for g in given.unwrap_or_default() {
        let matches =
            stored.iter().any(|p| p.part_number == g.part_number && storage::normalize_etag(&p.etag) == storage::normalize_etag(&g.etag));
        if !matches {
            return Err(ApiError::Conflict {
                code: "etag_mismatch",
                detail: format!("part {} does not have ETag {}", g.part_number, g.etag),
                extensions: vec![("part_number", g.part_number.into())],
            });
        }
    }
    Ok(())
}

/// How [`finalize`] ended.
enum Finalized {
    /// The operation this call created, as committed (`pending`): the 202
    /// describes what was accepted, not what a fast transcoder made of it since.
    Created(Box<vid_core::operation::Operation>),
    /// The upload's operation, created by a concurrent complete.
    Operation(OperationId),
    /// The upload was aborted or expired first; nothing was created.
    Lost(UploadStatus),
}

/// The one transaction that turns an assembled upload into a video, a pending
/// operation and a queued transcode job. Concurrent callers serialise on the
/// upload row; the loser gets the winner's operation id. An upload that was
/// aborted or expired first is left alone ([`Finalized::Lost`]).
async fn finalize(state: &AppState, tenant: &Tenant, row: &UploadRow) -> ApiResult<Finalized> {
    let mut conn = state.db.get().await?;
    let topology = state.topology.clone();
    let finalized = conn
        .transaction::<Finalized, ApiError, _>(|conn| {
            async move {
                let claimed = diesel::update(
                    uploads::table.filter(uploads::id.eq(&row.id)).filter(uploads::status.eq_any(["created", "completing"])),
                )
                .set(uploads::status.eq(UploadStatus::Completed.as_str()))
                .execute(conn)
                .await?;
                if claimed == 0 {
                    let (status, existing): (String, Option<OperationId>) =
                        uploads::table.filter(uploads::id.eq(&row.id)).select((uploads::status, uploads::operation_id)).first(conn).await?;
                    return Ok(match existing {
                        Some(op_id) => Finalized::Operation(op_id),
                        None => Finalized::Lost(UploadStatus::parse(&status).unwrap_or(UploadStatus::Aborted)),
                    });
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
                let created = operations::table
                    .filter(operations::id.eq(&op_id))
                    .select(OperationRow::as_select())
                    .first(conn)
                    .await?
                    .into_operation();
                Ok(Finalized::Created(Box::new(created)))
            }
            .scope_boxed()
        })
        .await?;
    Ok(finalized)
}

async fn accepted(state: &AppState, tenant: &Tenant, op_id: &OperationId) -> ApiResult<HttpResponse> {
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
