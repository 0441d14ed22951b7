//! `/events`: every event recorded for the tenant, so receivers can catch up.

use actix_web::{web, HttpResponse};
use diesel::prelude::*;
use vid_core::event::{Event, EventType};
use vid_core::EventId;
use vid_db::schema::events;
use vid_db::RunQueryDsl;

use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::operations::page;
use crate::routes::{parse_id, PageQuery};
use crate::state::AppState;

/// Routes of this module.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/events", web::get().to(list_events)).route("/events/{id}", web::get().to(get_event));
}

fn parse_payload(payload: &str) -> ApiResult<Event> {
    serde_json::from_str(payload).map_err(|e| ApiError::Internal(anyhow::anyhow!("stored event does not parse: {e}")))
}

/// `GET /events/{id}`: the event exactly as it was sent.
#[utoipa::path(
    get,
    path = "/events/{id}",
    tag = "events",
    security(("api_key" = [])),
    params(("id" = EventId, Path, description = "The event.")),
    responses(
        (status = 200, description = "The event exactly as it was sent.", body = Event),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn get_event(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: EventId = parse_id(&path)?;
    let mut conn = state.db.get().await?;
    let payload: String = events::table
        .filter(events::id.eq(&id))
        .filter(events::tenant_id.eq(&tenant.id))
        .select(events::payload)
        .first(&mut conn)
        .await
        .optional()?
        .ok_or(ApiError::NotFound("event"))?;
    Ok(HttpResponse::Ok().content_type("application/json").body(payload))
}

/// `GET /events?type=&limit=&cursor=`: newest first.
#[utoipa::path(
    get,
    path = "/events",
    tag = "events",
    security(("api_key" = [])),
    params(("type" = Option<EventType>, Query, description = "Only events of this type."), ("limit" = Option<i64>, Query, description = "Page size; clamped to 1–100 (default 20)."), ("cursor" = Option<EventId>, Query, description = "The `next_cursor` of the previous page: items older than this event.")),
    responses(
        (status = 200, description = "A page of events, newest first.", body = crate::routes::Page<Event>),
        (status = 400, response = crate::openapi::BadRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn list_events(state: web::Data<AppState>, tenant: Tenant, query: web::Query<PageQuery>) -> ApiResult<HttpResponse> {
    let limit = query.limit();
    let mut q = events::table.filter(events::tenant_id.eq(&tenant.id)).into_boxed();
    if let Some(t) = &query.type_ {
        let t = EventType::parse(t).ok_or_else(|| ApiError::bad_request("invalid_event_type", format!("unknown event type `{t}`")))?;
        q = q.filter(events::event_type.eq(t.as_str()));
    }
    if let Some(cursor) = &query.cursor {
        let cursor: EventId = cursor.parse().map_err(|_| ApiError::bad_request("invalid_cursor", "cursor is not an event id"))?;
        q = q.filter(events::id.lt(cursor));
    }
    let mut conn = state.db.get().await?;
    let rows: Vec<(EventId, String)> =
        q.order(events::id.desc()).limit(limit + 1).select((events::id, events::payload)).load(&mut conn).await?;
    let page = page(rows, limit, |r| r.0.to_string(), |r| r.1);
    let data = page.data.iter().map(|p| parse_payload(p)).collect::<ApiResult<Vec<Event>>>()?;
    Ok(HttpResponse::Ok().json(serde_json::json!({"data": data, "next_cursor": page.next_cursor})))
}
