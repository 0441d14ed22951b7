//! Endpoint operations beyond configuration, and the delivery log:
//!
//! - `POST /webhook-endpoints/{id}:rotate-secret`: a new secret (shown once);
//!   the old one keeps signing for `webhooks.secret_rotation_overlap_seconds`;
//! - `POST /webhook-endpoints/{id}:enable`: re-enable; the paused backlog is delivered;
//! - `GET /webhook-endpoints/{id}/deliveries`: recent deliveries with their attempts;
//! - `POST /webhook-endpoints/{id}/deliveries/{delivery_id}:retry`: send once more.
//!
//! The delivery state machine lives in `vid_deliveries` (shared with the
//! dispatcher): `:retry` and `:enable` are its transitions, made through
//! [`crate::store::deliveries`]; the dispatcher is notified at commit.

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use vid_core::delivery::{DeliveryStatus, DeliveryView};
use vid_core::endpoint::EndpointStatus;
use vid_core::event::EventType;
use vid_core::{DeliveryId, EndpointId};
use vid_webhooks::Secret;

use crate::auth::Tenant;
use crate::error::{codes, ApiError, ApiResult};
use crate::routes::common::page;
use crate::routes::common::parse_id;
use crate::state::AppState;
use crate::store::deliveries::{self as store, DeliveryFilter};
use crate::store::endpoints::{self as endpoints, EndpointRow};

/// Routes of this module.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/webhook-endpoints/{id:[^/:]+}:rotate-secret").route(web::post().to(rotate_secret)))
        .service(web::resource("/webhook-endpoints/{id:[^/:]+}:enable").route(web::post().to(enable_endpoint)))
        .service(web::resource("/webhook-endpoints/{id:[^/:]+}/deliveries").route(web::get().to(list_deliveries)))
        .service(
            web::resource("/webhook-endpoints/{id:[^/:]+}/deliveries/{delivery_id:[^/:]+}:retry").route(web::post().to(retry_delivery)),
        );
}

/// Checks that the endpoint exists, is not deleted and belongs to the tenant.
async fn load(state: &AppState, tenant: &Tenant, id: &EndpointId) -> ApiResult<EndpointRow> {
    let mut conn = state.db.get().await?;
    endpoints::find(&mut conn, &tenant.id, id).await?.ok_or(ApiError::NotFound("webhook endpoint"))
}

/// `200` answer to `:rotate-secret`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RotatedSecret {
    /// The endpoint.
    pub id: EndpointId,
    /// The new `whsec_…` secret, shown this once.
    pub secret: String,
    /// Until when deliveries also carry a signature with the previous secret (RFC 3339).
    pub previous_secret_expires_at: DateTime<Utc>,
}

/// `POST /webhook-endpoints/{id}:rotate-secret` → `200` with the new secret.
///
/// The current secret becomes the previous one, valid for
/// `webhooks.secret_rotation_overlap_seconds` (default 24 h): meanwhile every
/// delivery is signed with both (`t=…,v1=<new>,v1=<old>`). Rotating again
/// during an overlap drops the oldest secret.
#[utoipa::path(
    post,
    path = "/webhook-endpoints/{id}:rotate-secret",
    tag = "webhook-endpoints",
    security(("api_key" = [])),
    params(("id" = EndpointId, Path, description = "The webhook endpoint.")),
    responses(
        (status = 200, description = "The new secret, shown this once.", body = RotatedSecret),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn rotate_secret(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: EndpointId = parse_id(&path)?;
    load(&state, &tenant, &id).await?;
    let secret = Secret::generate();
    let sealed = state.sealing_key.seal(id.as_str(), secret.as_str().as_bytes()).map_err(|e| ApiError::Internal(e.into()))?;
    let overlap = i64::try_from(state.settings.webhooks.secret_rotation_overlap_seconds).unwrap_or(i64::MAX / 2);
    let expires = Utc::now() + chrono::Duration::seconds(overlap);
    let mut conn = state.db.get().await?;
    if endpoints::rotate_secret(&mut conn, &tenant.id, &id, &sealed, expires).await? == 0 {
        return Err(ApiError::NotFound("webhook endpoint"));
    }
    // A one-time secret: no cache may keep it (RFC 9111 §5.2.2.5).
    Ok(HttpResponse::Ok().insert_header(("Cache-Control", "no-store")).json(RotatedSecret {
        id,
        secret: secret.as_str().to_owned(),
        previous_secret_expires_at: expires,
    }))
}

/// `POST /webhook-endpoints/{id}:enable` → `200` with the endpoint.
///
/// For a disabled endpoint: clears the disabled state, the failure counters
/// and any throttling (`429`/`503` slow-down), and makes every `paused`
/// delivery `pending` and due now, so the backlog kept while it was disabled
/// is delivered. For an enabled endpoint nothing about it changes (its
/// throttling and failure counters stay, so `:enable` cannot be used to skip
/// a receiver's `Retry-After`); only deliveries still `paused` (one fanned in
/// while an enable was committing) are resumed.
#[utoipa::path(
    post,
    path = "/webhook-endpoints/{id}:enable",
    tag = "webhook-endpoints",
    security(("api_key" = [])),
    params(("id" = EndpointId, Path, description = "The webhook endpoint.")),
    responses(
        (status = 200, description = "The enabled endpoint.", body = vid_core::endpoint::Endpoint),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn enable_endpoint(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: EndpointId = parse_id(&path)?;
    load(&state, &tenant, &id).await?;
    let mut conn = state.db.get().await?;
    store::enable(&mut conn, &tenant.id, &id).await?;
    drop(conn);
    Ok(HttpResponse::Ok().json(load(&state, &tenant, &id).await?.into_endpoint()))
}

/// Query of `GET /webhook-endpoints/{id}/deliveries`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesQuery {
    /// `pending`, `succeeded`, `failed` or `paused`.
    pub status: Option<String>,
    /// An event type, e.g. `video.ready`.
    pub event_type: Option<String>,
    /// Page size, 1–100 (default 20).
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// Parses the delivery log's filters: 400 `invalid_status`,
/// `invalid_event_type` or `invalid_cursor` for a value that names nothing.
fn delivery_filter(query: &DeliveriesQuery) -> ApiResult<DeliveryFilter> {
    let status = match &query.status {
        Some(s) => {
            Some(DeliveryStatus::parse(s).ok_or_else(|| ApiError::new(codes::INVALID_STATUS, format!("unknown delivery status `{s}`")))?)
        }
        None => None,
    };
    let event_type = match &query.event_type {
        Some(t) => Some(EventType::parse(t).ok_or_else(|| ApiError::new(codes::INVALID_EVENT_TYPE, format!("unknown event type `{t}`")))?),
        None => None,
    };
    let before = match &query.cursor {
        Some(c) => Some(c.parse::<DeliveryId>().map_err(|_| ApiError::new(codes::INVALID_CURSOR, "cursor is not a delivery id"))?),
        None => None,
    };
    Ok(DeliveryFilter { status, event_type, before })
}

/// `GET /webhook-endpoints/{id}/deliveries?status=&event_type=&limit=&cursor=`:
/// newest first, each with its attempts. Errors: `invalid_status`,
/// `invalid_event_type`, `invalid_cursor` (400).
#[utoipa::path(
    get,
    path = "/webhook-endpoints/{id}/deliveries",
    tag = "webhook-endpoints",
    security(("api_key" = [])),
    params(("id" = EndpointId, Path, description = "The webhook endpoint."), ("status" = Option<String>, Query, description = "`pending`, `succeeded`, `failed` or `paused`."), ("event_type" = Option<EventType>, Query, description = "Only deliveries of this event type."), ("limit" = Option<i64>, Query, description = "Page size; clamped to 1–100 (default 20)."), ("cursor" = Option<DeliveryId>, Query, description = "The `next_cursor` of the previous page.")),
    responses(
        (status = 200, description = "A page of deliveries, newest first, each with its attempts.", body = crate::routes::common::Page<DeliveryView>),
        (status = 400, response = crate::error::responses::BadRequest),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn list_deliveries(
    state: web::Data<AppState>,
    tenant: Tenant,
    path: web::Path<String>,
    query: web::Query<DeliveriesQuery>,
) -> ApiResult<HttpResponse> {
    let id: EndpointId = parse_id(&path)?;
    load(&state, &tenant, &id).await?;
    let limit = crate::routes::common::page_size(query.limit);
    let filter = delivery_filter(&query)?;
    let mut conn = state.db.get().await?;
    let rows = store::list(&mut conn, &tenant.id, &id, &filter, limit + 1).await?;
    let page = page(rows, limit, |r| r.id.to_string(), |r| r);
    let data = store::with_attempts(&mut conn, page.data).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "data": data, "next_cursor": page.next_cursor })))
}

/// `POST /webhook-endpoints/{id}/deliveries/{delivery_id}:retry` → `202` with the delivery.
///
/// The delivery becomes `pending` and due now. A `failed` or `succeeded`
/// delivery gets exactly one more attempt (no retry schedule after it); a
/// `pending` one is simply brought forward. While the endpoint is throttled
/// (`throttled_until` on the endpoint, after a `429`/`503`) the attempt
/// waits until then. Errors: `endpoint_disabled`
/// (409: enable the endpoint first).
#[utoipa::path(
    post,
    path = "/webhook-endpoints/{id}/deliveries/{delivery_id}:retry",
    tag = "webhook-endpoints",
    security(("api_key" = [])),
    params(("id" = EndpointId, Path, description = "The webhook endpoint."), ("delivery_id" = DeliveryId, Path, description = "The delivery.")),
    responses(
        (status = 202, description = "The delivery, pending and due now.", body = DeliveryView),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 409, response = crate::error::responses::Conflict),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn retry_delivery(state: web::Data<AppState>, tenant: Tenant, path: web::Path<(String, String)>) -> ApiResult<HttpResponse> {
    let (raw_ep, raw_dl) = path.into_inner();
    let id: EndpointId = parse_id(&raw_ep)?;
    let delivery_id: DeliveryId = parse_id(&raw_dl)?;
    let endpoint = load(&state, &tenant, &id).await?;
    if endpoint.status != EndpointStatus::Enabled {
        return Err(ApiError::new(codes::ENDPOINT_DISABLED, format!("endpoint {id} is disabled; enable it first")));
    }
    let mut conn = state.db.get().await?;
    let row = store::retry(&mut conn, &tenant.id, &id, &delivery_id).await?.ok_or(ApiError::NotFound("delivery"))?;
    let view = store::with_attempts(&mut conn, vec![row]).await?.pop().expect("one row in, one view out");
    Ok(HttpResponse::Accepted().json(view))
}
