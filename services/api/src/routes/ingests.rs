//! `POST /ingests`: a video from a URL (issue 21, item 4).
//!
//! The api never fetches the URL. It checks it with the webhooks' SSRF guard
//! (`vid-netguard`, policy `[ingest]`): scheme, userinfo, fragment, port and
//! every IP-literal notation, without DNS. The ingest worker
//! (`services/ingest`) resolves the host, checks every address again,
//! connects only to checked ones and re-checks every redirect target.

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use vid_core::ingest::CreateIngest;
use vid_core::playback::DEFAULT_POLICIES;
use vid_core::UploadId;
use vid_netguard::WebhookUrl;

use crate::auth::Tenant;
use crate::domain::ingest::{self, IngestLimits};
use crate::error::{codes, ApiError, ApiResult};
use crate::routes::operations::operation_location;
use crate::routes::uploads::shared::normalize_content_type;
use crate::routes::uploads::{is_valid_filename, source_key};
use crate::state::AppState;
use crate::store::ingests::NewIngestUpload;

/// Routes of this module.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/ingests").route(web::post().to(create_ingest)));
}

/// `POST /ingests` → `202 Accepted`, `Location: /operations/{op}`.
///
/// Checks the request, then in ONE transaction creates the upload standing
/// for the source (status `completed`, no parts), its video and its
/// `pending` operation (`metadata.phase` `downloading`), and queues the
/// ingest job. The ingest worker downloads the source into storage (an S3
/// multipart upload, the size limit enforced while streaming), showing
/// `metadata.download` (bytes so far, and the fraction when the source
/// announced its size); then the source is transcoded like an upload's
/// (scan, probe, transcode, webhooks). A failed download fails the operation
/// with `source_unreachable`, `source_too_large`, `blocked_address` (a
/// redirect to, or a name resolving to, a refused address),
/// `source_http_error` (with `source_status`), `source_timeout`,
/// `too_many_redirects` (more than 5), `source_empty` or
/// `unsupported_content_type`.
///
/// Errors: `invalid_json` (400: also an unknown field); the URL guard's
/// codes (422): `invalid_url`, `scheme_not_allowed` (not http/https),
/// `https_required`, `port_not_allowed`, `userinfo_not_allowed`,
/// `fragment_not_allowed`, `missing_host`, `host_not_allowed` (e.g.
/// `localhost`), `blocked_address` (a private, loopback, link-local, … IP
/// literal in any notation: `10.0.0.1`, `0x0a000001`, `012.0.0.1`,
/// `167772161`, `[::ffff:10.0.0.1]`, `[fd00::1]`, `169.254.169.254`,
/// `0.0.0.0`); `invalid_size` (`max_size_bytes` 0), `file_too_large` (above
/// `uploads.max_size_bytes`), `unsupported_content_type`,
/// `invalid_filename` (422); `unavailable` (503).
#[utoipa::path(
    post,
    path = "/ingests",
    tag = "ingests",
    security(("api_key" = [])),
    params(("Idempotency-Key" = Option<String>, Header, description = "1–255 visible ASCII characters. Makes a retry safe: the first answer is stored for 24 h and replayed (with `Idempotent-Replayed: true`) to a request with the same key and body.", min_length = 1, max_length = 255)),
    request_body = CreateIngest,
    responses(
        (status = 202, description = "Accepted: the ingest's operation.", body = vid_core::operation::Operation,
            headers(("Location" = String, description = "`/operations/{op}`"))),
        (status = 400, response = crate::error::responses::BadRequest),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 409, response = crate::error::responses::Conflict),
        (status = 413, response = crate::error::responses::PayloadTooLarge),
        (status = 415, response = crate::error::responses::UnsupportedMediaType),
        (status = 422, response = crate::error::responses::Unprocessable),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
pub async fn create_ingest(
    state: web::Data<AppState>,
    tenant: Tenant,
    http: HttpRequest,
    body: crate::routes::common::Json<CreateIngest>,
) -> ApiResult<HttpResponse> {
    let req = body.into_inner();
    let owned = req.clone();
    crate::idempotency::once(&state, &tenant, &http, "POST /ingests", &req, move |state, tenant| async move {
        create_ingest_once(&state, &tenant, owned).await
    })
    .await
}

/// A request that passed every check.
struct Checked {
    url: WebhookUrl,
    max_size_bytes: u64,
    content_type: Option<String>,
}

/// Checks an ingest request: the URL through the SSRF guard (no DNS), the
/// size limit and the optional media type and filename. Errors (422): the
/// guard's code, `invalid_size`, `file_too_large`, `unsupported_content_type`,
/// `invalid_filename`.
fn check_request(state: &AppState, req: &CreateIngest) -> ApiResult<Checked> {
    let url = WebhookUrl::parse(&req.source_url, &state.settings.ingest).map_err(|e| {
        let detail = e.to_string().replace("webhooks may only target", "ingests may only fetch from");
        ApiError::unprocessable(e.code(), format!("source_url refused: {detail}"))
    })?;
    let limits = &state.settings.uploads;
    let max_size_bytes = match req.max_size_bytes {
        Some(0) => return Err(ApiError::new(codes::INVALID_SIZE, "max_size_bytes must be at least 1")),
        Some(n) if n > limits.max_size_bytes => {
            return Err(ApiError::new(
                codes::FILE_TOO_LARGE,
                format!("max_size_bytes {n} exceeds the maximum of {} bytes", limits.max_size_bytes),
            ))
        }
        Some(n) => n,
        None => limits.max_size_bytes,
    };
    let content_type = match &req.content_type {
        None => None,
        Some(ct) => {
            let normalized = normalize_content_type(ct);
            if !limits.allowed_content_types.iter().any(|t| t.eq_ignore_ascii_case(&normalized)) {
                return Err(ApiError::new(
                    codes::UNSUPPORTED_CONTENT_TYPE,
                    format!("content_type `{ct}` is not accepted; use one of {}", limits.allowed_content_types.join(", ")),
                ));
            }
            Some(normalized)
        }
    };
    if req.filename.as_deref().is_some_and(|name| !is_valid_filename(name)) {
        return Err(ApiError::new(
            codes::INVALID_FILENAME,
            "filename must be at most 255 bytes, without control characters, Unicode format characters (e.g. U+202E, \
             zero-width characters) or line separators",
        ));
    }
    Ok(Checked { url, max_size_bytes, content_type })
}

async fn create_ingest_once(state: &AppState, tenant: &Tenant, req: CreateIngest) -> ApiResult<HttpResponse> {
    let checked = check_request(state, &req)?;
    let limits = &state.settings.uploads;
    let id = UploadId::generate();
    let key = source_key(&tenant.id, &id);
    // Until the download tells, the row shows the declared type or the first allowed one.
    let shown_type = checked.content_type.clone().or_else(|| limits.allowed_content_types.first().cloned()).unwrap_or_default();
    let new = NewIngestUpload {
        id: &id,
        tenant: &tenant.id,
        source_url: checked.url.as_str(),
        content_type: &shown_type,
        filename: req.filename.as_deref(),
        key: &key,
        expires_at: Utc::now() + chrono::Duration::seconds(limits.expire_after_seconds as i64),
        playback_policy: DEFAULT_POLICIES,
        mp4_support: Default::default(),
    };
    let job_limits = IngestLimits {
        max_size_bytes: checked.max_size_bytes,
        declared_content_type: checked.content_type.as_deref(),
        allowed_content_types: &limits.allowed_content_types,
    };
    let mut conn = state.db.get().await?;
    let op = ingest::create(&mut conn, &state.outbox, &new, &job_limits).await?;
    tracing::info!(operation_id = %op.id, upload_id = %id, host = %checked.url.host(), "ingest accepted");
    Ok(HttpResponse::Accepted().insert_header(("Location", operation_location(&op.id))).json(op))
}
