//! Fan-in: one delivery row per recorded event and matching endpoint.
//!
//! ONE rule decides which endpoints an event goes to ([`MATCH`]), and ONE
//! function applies it ([`fan_in`]): the dispatcher's message fan-in, the
//! `webhook_endpoint.disabled` event ([`crate::health::disable`]) and the
//! reconciliation ([`crate::reconcile`]) all call it. The event is read from
//! `events` (PostgreSQL is the truth; a message only names the event), so
//! both paths see the same `created_at`, type, resource and payload.
//!
//! Invariants: `(event_id, endpoint_id)` is unique, so fanning an event in
//! twice (a redelivered message, a reconciliation racing the message, two
//! replicas) inserts nothing the second time; a delivery to an enabled
//! endpoint starts `pending` and due now, one to a disabled endpoint starts
//! `paused` ([`initial_state`]), so `:enable` re-arms it.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, Text};
use diesel_async::AsyncPgConnection;
use vid_core::{DeliveryId, EndpointId, EventId, TenantId};
use vid_db::schema::webhook_deliveries as dl;
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

/// The endpoint-matching rule, as the join condition between an event `e`
/// (`events`) and an endpoint `w` (`webhook_endpoints`). An endpoint gets
/// the event when all hold:
///
/// - same tenant, and not deleted (`deleted_at IS NULL`);
/// - created no later than the event (`w.created_at <= e.created_at`): an
///   endpoint never receives what happened before it existed, however late
///   the fan-in runs;
/// - subscribed: `event_types` NULL (everything) or containing the type;
/// - for a `webhook_endpoint.disabled` event: not the disabled endpoint
///   itself (`e.resource_id`), and enabled. Any other event also goes to a
///   disabled (not deleted) endpoint, where it waits `paused` until `:enable`.
///
/// Subscription and status are read when the fan-in runs (they have no
/// history); `created_at` fixes the time. Shared by every fan-in path.
pub const MATCH: &str = "w.tenant_id = e.tenant_id \
     AND w.deleted_at IS NULL \
     AND w.created_at <= e.created_at \
     AND (w.event_types IS NULL OR e.event_type = ANY(w.event_types)) \
     AND (e.event_type <> 'webhook_endpoint.disabled' OR (w.id <> e.resource_id AND w.status = 'enabled'))";

/// A matching (event, endpoint) pair that has no delivery yet.
#[derive(Debug, QueryableByName)]
struct Missing {
    #[diesel(sql_type = Text)]
    event_id: EventId,
    #[diesel(sql_type = Text)]
    tenant_id: TenantId,
    #[diesel(sql_type = Text)]
    event_type: String,
    #[diesel(sql_type = Text)]
    payload: String,
    #[diesel(sql_type = Text)]
    endpoint_id: EndpointId,
    #[diesel(sql_type = Text)]
    status: EndpointStatus,
}

/// What one fan-in inserted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FannedIn {
    /// Delivery rows inserted.
    pub deliveries: usize,
    /// Distinct events that got at least one new delivery, in no particular order.
    pub events: Vec<EventId>,
}

/// The pairs of the events `$1` (a text array of ids) and the endpoints
/// matching [`MATCH`] that have no delivery yet (one index probe each on the
/// `(event_id, endpoint_id)` key): the SELECT of [`fan_in`].
pub fn missing_sql() -> String {
    format!(
        "SELECT e.id AS event_id, e.tenant_id, e.event_type, e.payload, w.id AS endpoint_id, w.status \
         FROM events e JOIN webhook_endpoints w ON {MATCH} \
         WHERE e.id = ANY($1) \
           AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id AND d.endpoint_id = w.id)"
    )
}

/// Rows per multi-row `INSERT` (8 parameters a row, far below PostgreSQL's 65,535).
const INSERT_CHUNK: usize = 2000;

/// Creates the missing deliveries of the recorded events `ids`: one per
/// endpoint matching [`MATCH`] that has none yet, in its [`initial_state`],
/// with the event's stored payload. Ids not in `events` insert nothing.
/// Runs in the caller's transaction (one `SELECT` with the rule, then
/// multi-row `INSERT … ON CONFLICT (event_id, endpoint_id) DO NOTHING`, so
/// a concurrent fan-in of the same event cannot duplicate a delivery).
///
/// Errors: the database's.
pub async fn fan_in(conn: &mut AsyncPgConnection, ids: &[EventId]) -> QueryResult<FannedIn> {
    if ids.is_empty() {
        return Ok(FannedIn::default());
    }
    let missing: Vec<Missing> = diesel::sql_query(missing_sql()).bind::<Array<Text>, _>(ids).load(conn).await?;
    if missing.is_empty() {
        return Ok(FannedIn::default());
    }
    let now = Utc::now();
    let rows: Vec<_> = missing
        .into_iter()
        .map(|m| {
            let (status, due) = initial_state(m.status, now);
            (
                dl::id.eq(DeliveryId::generate()),
                dl::tenant_id.eq(m.tenant_id),
                dl::endpoint_id.eq(m.endpoint_id),
                dl::event_id.eq(m.event_id),
                dl::event_type.eq(m.event_type),
                dl::payload.eq(m.payload),
                dl::status.eq(status),
                dl::next_attempt_at.eq(due),
            )
        })
        .collect();
    let mut out = FannedIn::default();
    for chunk in rows.chunks(INSERT_CHUNK) {
        let events: Vec<EventId> = diesel::insert_into(dl::table)
            .values(chunk)
            .on_conflict((dl::event_id, dl::endpoint_id))
            .do_nothing()
            .returning(dl::event_id)
            .get_results(conn)
            .await?;
        out.deliveries += events.len();
        out.events.extend(events);
    }
    out.events.sort();
    out.events.dedup();
    Ok(out)
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

    #[test]
    fn the_rule_names_the_stored_literals() {
        assert!(MATCH.contains(&format!("'{}'", vid_core::event::EventType::WebhookEndpointDisabled.as_str())));
        assert!(MATCH.contains(&format!("w.status = '{}'", EndpointStatus::Enabled.as_str())));
    }
}
