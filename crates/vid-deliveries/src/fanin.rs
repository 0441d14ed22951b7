//! Fan-in: one delivery row per event and matching endpoint.
//!
//! Invariants: `(event_id, endpoint_id)` is unique, so a redelivered event
//! inserts nothing; a delivery to an enabled endpoint starts `pending` and
//! due now, one to a disabled endpoint starts `paused` ([`initial_state`]).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Bool, Text};
use diesel_async::AsyncPgConnection;
use vid_core::event::EventType;
use vid_core::{DeliveryId, EndpointId, EventId, TenantId};
use vid_db::schema::{webhook_deliveries as dl, webhook_endpoints as ep};
use vid_db::RunQueryDsl;

use crate::{DeliveryStatus, EndpointStatus};

/// The state a new delivery starts in: `pending` and due at `now` for an
/// enabled endpoint, `paused` with no due time for a disabled one.
pub fn initial_state(endpoint: EndpointStatus, now: DateTime<Utc>) -> (DeliveryStatus, Option<DateTime<Utc>>) {
    match endpoint {
        EndpointStatus::Enabled => (DeliveryStatus::Pending, Some(now)),
        EndpointStatus::Disabled => (DeliveryStatus::Paused, None),
    }
}

/// Creates one delivery of an event per matching endpoint of the tenant
/// (not deleted; `event_types` NULL or containing the type; not `exclude`):
/// see [`initial_state`] (disabled endpoints are skipped when
/// `only_enabled`). Redelivered events are harmless:
/// `(event_id, endpoint_id)` is unique and conflicts are ignored.
/// Returns how many rows were inserted.
#[allow(clippy::too_many_arguments)]
pub async fn insert_deliveries(
    conn: &mut AsyncPgConnection,
    tenant_id: &TenantId,
    event_id: &EventId,
    event_type: EventType,
    payload: &str,
    exclude: Option<&EndpointId>,
    only_enabled: bool,
) -> QueryResult<usize> {
    let mut q = ep::table
        .filter(ep::tenant_id.eq(tenant_id))
        .filter(ep::deleted_at.is_null())
        .filter(ep::event_types.is_null().or(diesel::dsl::sql::<Bool>("").bind::<Text, _>(event_type.as_str()).sql(" = ANY(event_types)")))
        .into_boxed();
    if let Some(x) = exclude {
        q = q.filter(ep::id.ne(x));
    }
    if only_enabled {
        q = q.filter(ep::status.eq(EndpointStatus::Enabled));
    }
    let targets: Vec<(EndpointId, EndpointStatus)> = q.select((ep::id, ep::status)).load(conn).await?;
    if targets.is_empty() {
        return Ok(0);
    }
    let now = Utc::now();
    let rows: Vec<_> = targets
        .into_iter()
        .map(|(endpoint_id, status)| {
            let (status, due) = initial_state(status, now);
            (
                dl::id.eq(DeliveryId::generate()),
                dl::tenant_id.eq(tenant_id.clone()),
                dl::endpoint_id.eq(endpoint_id),
                dl::event_id.eq(event_id.clone()),
                dl::event_type.eq(event_type.as_str()),
                dl::payload.eq(payload.to_owned()),
                dl::status.eq(status),
                dl::next_attempt_at.eq(due),
            )
        })
        .collect();
    diesel::insert_into(dl::table).values(rows).on_conflict((dl::event_id, dl::endpoint_id)).do_nothing().execute(conn).await
}

/// One event to fan in ([`insert_deliveries_batch`]).
#[derive(Debug, Clone, Copy)]
pub struct NewEvent<'a> {
    /// Owner of the event and of the endpoints it goes to.
    pub tenant_id: &'a TenantId,
    /// The event (unique per endpoint among deliveries).
    pub event_id: &'a EventId,
    /// Its type (matched against `event_types`).
    pub event_type: EventType,
    /// The exact body.
    pub payload: &'a str,
}

/// Rows per multi-row `INSERT` (8 parameters a row, far below PostgreSQL's 65,535).
const INSERT_CHUNK: usize = 2000;

/// [`insert_deliveries`] for many events at once, in the caller's
/// transaction: one query for every tenant's endpoints, then multi-row
/// `INSERT … ON CONFLICT (event_id, endpoint_id) DO NOTHING` statements.
/// Same rules: every matching endpoint (not deleted; `event_types` NULL or
/// containing the type) gets a delivery in its [`initial_state`]. Returns
/// how many rows were inserted (redelivered events insert nothing).
pub async fn insert_deliveries_batch(conn: &mut AsyncPgConnection, batch: &[NewEvent<'_>]) -> QueryResult<usize> {
    if batch.is_empty() {
        return Ok(0);
    }
    let mut tenants: Vec<&TenantId> = batch.iter().map(|e| e.tenant_id).collect();
    tenants.sort();
    tenants.dedup();
    let endpoints: Vec<(EndpointId, TenantId, EndpointStatus, Option<Vec<String>>)> = ep::table
        .filter(ep::tenant_id.eq_any(tenants))
        .filter(ep::deleted_at.is_null())
        .select((ep::id, ep::tenant_id, ep::status, ep::event_types))
        .load(conn)
        .await?;
    if endpoints.is_empty() {
        return Ok(0);
    }
    let now = Utc::now();
    let mut rows = Vec::new();
    for e in batch {
        for (endpoint_id, tenant_id, status, types) in &endpoints {
            if tenant_id != e.tenant_id || types.as_ref().is_some_and(|t| !t.iter().any(|t| t == e.event_type.as_str())) {
                continue;
            }
            let (status, due) = initial_state(*status, now);
            rows.push((
                dl::id.eq(DeliveryId::generate()),
                dl::tenant_id.eq(e.tenant_id.clone()),
                dl::endpoint_id.eq(endpoint_id.clone()),
                dl::event_id.eq(e.event_id.clone()),
                dl::event_type.eq(e.event_type.as_str()),
                dl::payload.eq(e.payload.to_owned()),
                dl::status.eq(status),
                dl::next_attempt_at.eq(due),
            ));
        }
    }
    let mut inserted = 0;
    for chunk in rows.chunks(INSERT_CHUNK) {
        inserted +=
            diesel::insert_into(dl::table).values(chunk).on_conflict((dl::event_id, dl::endpoint_id)).do_nothing().execute(conn).await?;
    }
    Ok(inserted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_deliveries_start_pending_or_paused() {
        let now = Utc::now();
        assert_eq!(initial_state(EndpointStatus::Enabled, now), (DeliveryStatus::Pending, Some(now)));
        assert_eq!(initial_state(EndpointStatus::Disabled, now), (DeliveryStatus::Paused, None));
    }
}
