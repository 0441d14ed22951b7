//! The delivery log (`webhook_deliveries`, `webhook_attempts`) as the api
//! reads it, and the two transitions a customer may ask for, which belong to
//! the shared state machine (`vid_deliveries::manual`): `:retry` and `:enable`.
//!
//! The api never writes these tables any other way.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use vid_core::delivery::{AttemptView, DeliveryStatus, DeliveryView};
use vid_core::event::EventType;
use vid_core::{DeliveryId, EndpointId, TenantId};
use vid_db::schema::{webhook_attempts as at, webhook_deliveries as dl};
use vid_db::{PooledConn, RunQueryDsl};
pub use vid_deliveries::manual::{enable, retry};
pub use vid_deliveries::DeliveryRecord;

/// Filters of the delivery log, already parsed.
#[derive(Debug, Default)]
pub struct DeliveryFilter {
    /// Only deliveries in this status.
    pub status: Option<DeliveryStatus>,
    /// Only deliveries of this event type.
    pub event_type: Option<EventType>,
    /// Only deliveries older than this one (the previous page's cursor).
    pub before: Option<DeliveryId>,
}

/// Up to `limit` deliveries of the tenant's endpoint, newest first.
pub async fn list(
    conn: &mut PooledConn,
    tenant: &TenantId,
    endpoint: &EndpointId,
    f: &DeliveryFilter,
    limit: i64,
) -> QueryResult<Vec<DeliveryRecord>> {
    let mut q = dl::table.filter(dl::endpoint_id.eq(endpoint)).filter(dl::tenant_id.eq(tenant)).into_boxed();
    if let Some(s) = f.status {
        q = q.filter(dl::status.eq(s));
    }
    if let Some(t) = f.event_type {
        q = q.filter(dl::event_type.eq(t.as_str()));
    }
    if let Some(cursor) = &f.before {
        q = q.filter(dl::id.lt(cursor.clone()));
    }
    q.order(dl::id.desc()).limit(limit).select(DeliveryRecord::as_select()).load(conn).await
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

/// The attempts of each delivery in `ids`, oldest first, keyed by delivery id (one query).
pub async fn attempts_of(conn: &mut PooledConn, ids: &[String]) -> QueryResult<HashMap<String, Vec<AttemptView>>> {
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

/// The wire view of a delivery row with its attempts.
pub fn view(d: DeliveryRecord, attempts: Vec<AttemptView>) -> DeliveryView {
    DeliveryView {
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

/// The given deliveries as views, each with its attempts (one more query), in the same order.
pub async fn with_attempts(conn: &mut PooledConn, rows: Vec<DeliveryRecord>) -> QueryResult<Vec<DeliveryView>> {
    let ids: Vec<String> = rows.iter().map(|d| d.id.to_string()).collect();
    let mut attempts = attempts_of(conn, &ids).await?;
    Ok(rows
        .into_iter()
        .map(|d| {
            let a = attempts.remove(d.id.as_str()).unwrap_or_default();
            view(d, a)
        })
        .collect())
}
