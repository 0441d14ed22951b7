//! `POST /uploads`: a new upload, within the tenant's cap on uploads in flight.

use std::time::Duration;

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use vid_core::playback::{PlaybackPolicy, DEFAULT_POLICIES};
use vid_core::upload::{CreateUpload, CreatedUpload, UploadStatus};
use vid_core::UploadId;

use super::shared::{is_valid_filename, normalize_content_type, source_key, TOO_MANY_UPLOADS_RETRY_AFTER_SECONDS};
use crate::auth::Tenant;
use crate::error::{codes, ApiError, ApiResult};
use crate::state::AppState;
use crate::storage;
use crate::store::{self, uploads::NewUpload};

/// `POST /uploads` → `201 Created` with one presigned UploadPart URL per part.
///
/// Creates the multipart upload in storage (S3 CreateMultipartUpload) and
/// presigns S3 UploadPart for each part. The answer's `expires_at` is when the
/// part URLs expire (15 min by default), not the upload (24 h by default; see
/// `GET /uploads/{id}`).
///
/// `playback_policy` (absent: `["public"]`; `[]`: none; a repeated policy
/// counts once) and `mp4_support` (absent: `standard`) are stored on the
/// upload and copied to its video at `complete`; the video gets one playback
/// ID per policy when it becomes ready with a stream, and its transcode job
/// carries the `mp4_support`. Both are part of the body an
/// `Idempotency-Key` compares.
///
/// The answer carries a `client_token` (`vidu_…`) for a browser, scoped to
/// this upload and its operation (see `CreatedUpload.client_token`); with
/// `cors_origin` the client-token routes answer that page origin's CORS
/// requests (preflights included).
///
/// Errors: `invalid_json` (400, also for an unknown `playback_policy` or
/// `mp4_support` value); `invalid_size` (0 bytes), `file_too_large`
/// (above `uploads.max_size_bytes`), `unsupported_content_type`,
/// `invalid_filename` (over 255 bytes, or a control, format or line-separator
/// character), `invalid_cors_origin` (not `scheme://host[:port]`), `invalid_poster_time` (negative) (422); `too_many_uploads` (429, with `Retry-After: 30` and the
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
        (status = 400, response = crate::error::responses::BadRequest),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 409, response = crate::error::responses::Conflict),
        (status = 413, response = crate::error::responses::PayloadTooLarge),
        (status = 415, response = crate::error::responses::UnsupportedMediaType),
        (status = 422, response = crate::error::responses::Unprocessable),
        (status = 429, response = crate::error::responses::TooManyRequests),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
pub async fn create_upload(
    state: web::Data<AppState>,
    tenant: Tenant,
    http: HttpRequest,
    body: crate::routes::common::Json<CreateUpload>,
) -> ApiResult<HttpResponse> {
    let req = body.into_inner();
    let owned = req.clone();
    let answer = crate::idempotency::once(&state, &tenant, &http, "POST /uploads", &req, move |state, tenant| async move {
        create_upload_once(&state, &tenant, owned).await
    })
    .await?;
    with_client_token(&state, answer).await
}

/// Adds a fresh `client_token` to a `201` answer (also to an idempotent
/// replay): the token is minted after the answer was stored for replays, so
/// the idempotency table never holds it in plain text (issue 21). Other
/// answers pass unchanged.
async fn with_client_token(state: &AppState, answer: HttpResponse) -> ApiResult<HttpResponse> {
    if answer.status() != actix_web::http::StatusCode::CREATED {
        return Ok(answer);
    }
    let status = answer.status();
    let headers = answer.headers().clone();
    let bytes = actix_web::body::to_bytes(answer.into_body())
        .await
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("reading the create answer: {e}")))?;
    let mut created: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| ApiError::Internal(e.into()))?;
    let id: UploadId = created["id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("the create answer has no upload id")))?;
    let mut conn = state.db.get().await?;
    created["client_token"] = serde_json::Value::String(crate::auth::issue_client_token(&mut conn, &id).await?);
    let mut out = HttpResponse::build(status);
    for (name, value) in headers.iter().filter(|(name, _)| *name != actix_web::http::header::CONTENT_LENGTH) {
        out.append_header((name.clone(), value.clone()));
    }
    Ok(out.json(created))
}

/// Checks a create request against the limits; returns the normalised
/// content type. Errors (422): `invalid_size`, `file_too_large`,
/// `unsupported_content_type`, `invalid_filename`. Both playback policies
/// pass: `signed` needs no signing key yet (as at Mux, the key can come
/// later; until then no token validates).
fn check_request(limits: &crate::settings::UploadSettings, req: &CreateUpload) -> ApiResult<String> {
    if req.size_bytes == 0 {
        return Err(ApiError::new(codes::INVALID_SIZE, "size_bytes must be at least 1"));
    }
    if req.size_bytes > limits.max_size_bytes {
        return Err(ApiError::new(
            codes::FILE_TOO_LARGE,
            format!("size_bytes {} exceeds the maximum of {} bytes", req.size_bytes, limits.max_size_bytes),
        ));
    }
    let content_type = normalize_content_type(&req.content_type);
    if !limits.allowed_content_types.iter().any(|t| t.eq_ignore_ascii_case(&content_type)) {
        return Err(ApiError::new(
            codes::UNSUPPORTED_CONTENT_TYPE,
            format!("content_type `{}` is not accepted; use one of {}", req.content_type, limits.allowed_content_types.join(", ")),
        ));
    }
    if let Some(origin) = &req.cors_origin {
        crate::cors::parse_cors_origin(origin)?;
    }
    poster_time(req)?;
    if req.filename.as_deref().is_some_and(|name| !is_valid_filename(name)) {
        return Err(ApiError::new(
            codes::INVALID_FILENAME,
            "filename must be at most 255 bytes, without control characters, Unicode format characters (e.g. U+202E, \
             zero-width characters) or line separators",
        ));
    }
    Ok(content_type)
}

/// `poster_time` in seconds: a JSON number is always finite; it must be ≥ 0.
/// Errors: `422 invalid_poster_time`.
fn poster_time(req: &CreateUpload) -> ApiResult<Option<f64>> {
    match req.poster_time.as_ref().map(|n| n.as_f64().unwrap_or(f64::NAN)) {
        Some(t) if !(t.is_finite() && t >= 0.0) => {
            Err(ApiError::new(codes::INVALID_POSTER_TIME, "poster_time must be a number of seconds ≥ 0"))
        }
        t => Ok(t),
    }
}

/// The playback policies to store: as asked with repeats dropped, or
/// `["public"]` when the request has none.
fn playback_policies(req: &CreateUpload) -> Vec<PlaybackPolicy> {
    match &req.playback_policy {
        Some(asked) => crate::domain::distinct_policies(asked.clone()),
        None => DEFAULT_POLICIES.to_vec(),
    }
}

/// Creates the upload: the multipart upload in storage, its row (within the
/// tenant's cap), then one presigned UploadPart URL per part.
async fn create_upload_once(state: &AppState, tenant: &Tenant, req: CreateUpload) -> ApiResult<HttpResponse> {
    let limits = &state.settings.uploads;
    let content_type = check_request(limits, &req)?;
    // A cheap early refusal, before storage is involved; the check that holds
    // under concurrency is the one in `insert_within_cap`.
    if let Some(cap) = tenant.max_uploads_in_flight {
        let mut conn = state.db.get().await?;
        let in_flight = store::uploads::count_in_flight(&mut conn, &tenant.id, Utc::now()).await?;
        if in_flight >= cap as i64 {
            return Err(too_many_uploads(in_flight, cap));
        }
    }

    let (part_size, part_count) = storage::plan_parts(req.size_bytes, limits.target_part_size_bytes);
    let id = UploadId::generate();
    let key = source_key(&tenant.id, &id);
    let s3_upload_id = storage::create_multipart(state, &key, &content_type).await?;
    let expires_at = Utc::now() + chrono::Duration::seconds(limits.expire_after_seconds as i64);
    let policies = playback_policies(&req);
    let cors_origin = req.cors_origin.as_deref().map(crate::cors::parse_cors_origin).transpose()?;
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
        playback_policy: &policies,
        mp4_support: req.mp4_support.unwrap_or_default(),
        cors_origin: cors_origin.as_deref(),
        poster_time: poster_time(&req)?,
    };
    let inserted = async {
        let mut conn = state.db.get().await?;
        Ok::<_, ApiError>(store::uploads::insert_within_cap(&mut conn, &new).await?)
    };
    match inserted.await {
        Ok(None) => {}
        Ok(Some((in_flight, cap))) => {
            discard_multipart(state, &key, &s3_upload_id).await;
            return Err(too_many_uploads(in_flight, cap));
        }
        Err(e) => {
            discard_multipart(state, &key, &s3_upload_id).await;
            return Err(e);
        }
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
        client_token: String::new(),
    };
    // Stored for idempotent replays without the token; `with_client_token` adds one.
    let mut body = serde_json::to_value(&created).map_err(|e| ApiError::Internal(e.into()))?;
    body.as_object_mut().map(|o| o.remove("client_token"));
    Ok(HttpResponse::Created().insert_header(("Location", format!("/uploads/{id}"))).json(body))
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
fn too_many_uploads(in_flight: i64, cap: i32) -> ApiError {
    ApiError::new(
        codes::TOO_MANY_UPLOADS,
        format!("{in_flight} uploads are in flight (created or completing); the limit is {cap}: complete or abort one, or retry later"),
    )
    .with_extension("limit", cap)
    .with_extension("in_flight", in_flight)
    .with_retry_after(TOO_MANY_UPLOADS_RETRY_AFTER_SECONDS)
}
