//! Endpoint operations beyond configuration, and the delivery log:
//!
//! - `POST /webhook-endpoints/{id}:rotate-secret`: a new secret (shown once);
//!   the old one keeps signing for `webhooks.secret_rotation_overlap_seconds`;
//! - `POST /webhook-endpoints/{id}:enable`: re-enable; the paused backlog is delivered;
//! - `GET /webhook-endpoints/{id}/deliveries`: recent deliveries with their attempts;
//! - `POST /webhook-endpoints/{id}/deliveries/{delivery_id}:retry`: send once more.
//!
//! `webhook_deliveries` and `webhook_attempts` belong to the webhook-dispatcher;
//! these handlers only read them, or hand a delivery back to its scheduler
//! (`status = pending`, due now), which the dispatcher picks up on its next poll.

use std::collections::HashMap;

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::AsyncConnection;
use serde::{Deserialize, Serialize};
use vid_core::event::EventType;
use vid_core::{DeliveryId, EndpointId, EventId};
use vid_db::schema::{webhook_attempts as at, webhook_deliveries as dl, webhook_endpoints as ep};
use vid_db::RunQueryDsl;
use vid_webhooks::Secret;

use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::endpoints::EndpointRow;
use crate::routes::operations::page;
use crate::routes::parse_id;
use crate::state::AppState;

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
    ep::table
        .filter(ep::id.eq(id))
        .filter(ep::tenant_id.eq(&tenant.id))
        .filter(ep::deleted_at.is_null())
        .select(EndpointRow::as_select())
        .first(&mut conn)
        .await
        .optional()?
        .ok_or(ApiError::NotFound("webhook endpoint"))
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
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn rotate_secret(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: EndpointId = parse_id(&path)?;
    load(&state, &tenant, &id).await?;
    let secret = Secret::generate();
    let sealed = state.sealing_key.seal(id.as_str(), secret.as_str().as_bytes()).map_err(|e| ApiError::Internal(e.into()))?;
    let overlap = i64::try_from(state.settings.webhooks.secret_rotation_overlap_seconds).unwrap_or(i64::MAX / 2);
    let now = Utc::now();
    let expires = now + chrono::Duration::seconds(overlap);
    let mut conn = state.db.get().await?;
    // Both columns in one statement: the old value moves as it was (sealed under the same id).
    let updated = diesel::update(ep::table.filter(ep::id.eq(&id)).filter(ep::tenant_id.eq(&tenant.id)).filter(ep::deleted_at.is_null()))
        .set((
            ep::previous_secret_sealed.eq(ep::secret_sealed.nullable()),
            ep::previous_secret_expires_at.eq(expires),
            ep::secret_sealed.eq(&sealed),
            ep::updated_at.eq(now),
        ))
        .execute(&mut conn)
        .await?;
    if updated == 0 {
        return Err(ApiError::NotFound("webhook endpoint"));
    }
    Ok(HttpResponse::Ok().json(RotatedSecret { id, secret: secret.as_str().to_owned(), previous_secret_expires_at: expires }))
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
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn enable_endpoint(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: EndpointId = parse_id(&path)?;
    load(&state, &tenant, &id).await?;
    let mut conn = state.db.get().await?;
    let tenant_id = tenant.id.clone();
    let ep_id = id.clone();
    conn.transaction::<(), ApiError, _>(|conn| {
        async move {
            let now = Utc::now();
            diesel::update(ep::table.filter(ep::id.eq(&ep_id)).filter(ep::tenant_id.eq(&tenant_id)).filter(ep::status.eq("disabled")))
                .set((
                    ep::status.eq("enabled"),
                    ep::disabled_reason.eq(None::<String>),
                    ep::disabled_at.eq(None::<DateTime<Utc>>),
                    ep::consecutive_failures.eq(0),
                    ep::failing_since.eq(None::<DateTime<Utc>>),
                    ep::throttled_until.eq(None::<DateTime<Utc>>),
                    ep::concurrency_limit.eq(None::<i32>),
                    ep::updated_at.eq(now),
                ))
                .execute(conn)
                .await?;
            diesel::update(
                dl::table.filter(dl::endpoint_id.eq(&ep_id)).filter(dl::tenant_id.eq(&tenant_id)).filter(dl::status.eq("paused")),
            )
            .set((
                dl::status.eq("pending"),
                dl::next_attempt_at.eq(now),
                dl::locked_until.eq(None::<DateTime<Utc>>),
                dl::updated_at.eq(now),
            ))
            .execute(conn)
            .await?;
            Ok(())
        }
        .scope_boxed()
    })
    .await?;
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

#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = dl)]
struct DeliveryRow {
    id: DeliveryId,
    endpoint_id: EndpointId,
    event_id: EventId,
    event_type: String,
    status: String,
    attempt_count: i32,
    next_attempt_at: Option<DateTime<Utc>>,
    last_attempt_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = at)]
struct AttemptRow {
    delivery_id: String,
    attempt_number: i32,
    started_at: DateTime<Utc>,
    duration_ms: i32,
    response_status: Option<i32>,
    error_class: Option<String>,
    error_detail: Option<String>,
    response_body: Option<String>,
    next_attempt_at: Option<DateTime<Utc>>,
}

/// One HTTP try, as the delivery log shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AttemptView {
    /// 1-based.
    pub attempt_number: i32,
    /// When it ran (RFC 3339).
    pub started_at: DateTime<Utc>,
    /// How long it took, in ms.
    pub duration_ms: i32,
    /// The HTTP status, if the endpoint answered.
    pub response_status: Option<i32>,
    /// `dns`, `connect`, `timeout`, `tls`, `blocked_address`, `redirect` or `http`; `null` on success.
    pub error_class: Option<String>,
    /// Details of the error (e.g. the refused address, the redirect target).
    pub error_detail: Option<String>,
    /// The first 1 KiB of the response body.
    pub response_body: Option<String>,
    /// When the next attempt was scheduled; `null` if none.
    pub next_attempt_at: Option<DateTime<Utc>>,
}

/// One event to one endpoint, with its attempts.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeliveryView {
    /// `dlv_…`
    pub id: DeliveryId,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The event (also the `Webhook-Id`).
    pub event_id: EventId,
    /// The event type.
    pub event_type: String,
    /// `pending`, `succeeded`, `failed` or `paused`.
    pub status: String,
    /// Attempts made.
    pub attempt_count: i32,
    /// When the next attempt is due, if pending.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When the last attempt ran.
    pub last_attempt_at: Option<DateTime<Utc>>,
    /// When the delivery was created.
    pub created_at: DateTime<Utc>,
    /// Oldest first.
    pub attempts: Vec<AttemptView>,
}

impl DeliveryView {
    fn new(d: DeliveryRow, attempts: Vec<AttemptView>) -> Self {
        Self {
            id: d.id,
            endpoint_id: d.endpoint_id,
            event_id: d.event_id,
            event_type: d.event_type,
            status: d.status,
            attempt_count: d.attempt_count,
            next_attempt_at: d.next_attempt_at,
            last_attempt_at: d.last_attempt_at,
            created_at: d.created_at,
            attempts,
        }
    }
}

async fn attempts_of(conn: &mut vid_db::PooledConn, ids: &[String]) -> ApiResult<HashMap<String, Vec<AttemptView>>> {
    let rows: Vec<AttemptRow> = at::table
        .filter(at::delivery_id.eq_any(ids))
        .order((at::delivery_id, at::attempt_number))
        .select(AttemptRow::as_select())
        .load(conn)
        .await?;
    let mut map: HashMap<String, Vec<AttemptView>> = HashMap::new();
    for a in rows {
        map.entry(a.delivery_id).or_default().push(AttemptView {
            attempt_number: a.attempt_number,
            started_at: a.started_at,
            duration_ms: a.duration_ms,
            response_status: a.response_status,
            error_class: a.error_class,
            error_detail: a.error_detail,
            response_body: a.response_body,
            next_attempt_at: a.next_attempt_at,
        });
    }
    Ok(map)
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
        (status = 200, description = "A page of deliveries, newest first, each with its attempts.", body = crate::routes::Page<DeliveryView>),
        (status = 400, response = crate::openapi::BadRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
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
    let limit = crate::routes::page_size(query.limit);
    let mut q = dl::table.filter(dl::endpoint_id.eq(&id)).filter(dl::tenant_id.eq(&tenant.id)).into_boxed();
    if let Some(s) = &query.status {
        if !["pending", "succeeded", "failed", "paused"].contains(&s.as_str()) {
            return Err(ApiError::bad_request("invalid_status", format!("unknown delivery status `{s}`")));
        }
        q = q.filter(dl::status.eq(s.clone()));
    }
    if let Some(t) = &query.event_type {
        let t = EventType::parse(t).ok_or_else(|| ApiError::bad_request("invalid_event_type", format!("unknown event type `{t}`")))?;
        q = q.filter(dl::event_type.eq(t.as_str()));
    }
    if let Some(cursor) = &query.cursor {
        let cursor: DeliveryId = cursor.parse().map_err(|_| ApiError::bad_request("invalid_cursor", "cursor is not a delivery id"))?;
        q = q.filter(dl::id.lt(cursor));
    }
    let mut conn = state.db.get().await?;
    let rows: Vec<DeliveryRow> = q.order(dl::id.desc()).limit(limit + 1).select(DeliveryRow::as_select()).load(&mut conn).await?;
    let page = page(rows, limit, |r| r.id.to_string(), |r| r);
    let ids: Vec<String> = page.data.iter().map(|d| d.id.to_string()).collect();
    let mut attempts = attempts_of(&mut conn, &ids).await?;
    let data: Vec<DeliveryView> = page
        .data
        .into_iter()
        .map(|d| {
            let a = attempts.remove(d.id.as_str()).unwrap_or_default();
            DeliveryView::new(d, a)
        })
        .collect();
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
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 409, response = crate::openapi::Conflict),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn retry_delivery(state: web::Data<AppState>, tenant: Tenant, path: web::Path<(String, String)>) -> ApiResult<HttpResponse> {
    let (raw_ep, raw_dl) = path.into_inner();
    let id: EndpointId = parse_id(&raw_ep)?;
    let delivery_id: DeliveryId = parse_id(&raw_dl)?;
    let endpoint = load(&state, &tenant, &id).await?;
    if endpoint.status != "enabled" {
        return Err(ApiError::conflict("endpoint_disabled", format!("endpoint {id} is disabled; enable it first")));
    }
    let mut conn = state.db.get().await?;
    let target = dl::table.filter(dl::id.eq(&delivery_id)).filter(dl::endpoint_id.eq(&id)).filter(dl::tenant_id.eq(&tenant.id));
    let now = Utc::now();
    // One statement, answered with the row it wrote: the dispatcher is
    // notified at commit and may have sent (and recorded) the attempt before
    // a second read, which would then no longer show what this call did.
    // `manual_retry` reads the row from before the update (SQL `SET`
    // expressions see the old row): one more attempt for `failed`/`succeeded`.
    let row: DeliveryRow = diesel::update(target)
        .set((
            dl::status.eq("pending"),
            dl::next_attempt_at.eq(now),
            // OR keeps a concurrent `:retry`'s one-shot mark: the second of
            // two calls sees `pending` and must not put the delivery back on
            // the full retry schedule.
            dl::manual_retry.eq(dl::manual_retry.or(dl::status.eq_any(["failed", "succeeded"]))),
            dl::updated_at.eq(now),
        ))
        .returning(DeliveryRow::as_returning())
        .get_result(&mut conn)
        .await
        .optional()?
        .ok_or(ApiError::NotFound("delivery"))?;
    let mut attempts = attempts_of(&mut conn, &[row.id.to_string()]).await?;
    let a = attempts.remove(row.id.as_str()).unwrap_or_default();
    Ok(HttpResponse::Accepted().json(DeliveryView::new(row, a)))
}
