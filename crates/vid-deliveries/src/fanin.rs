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
use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable, Text, Timestamptz};
use diesel_async::AsyncPgConnection;
use vid_core::{DeliveryId, EndpointId, EventId, TenantId};
use vid_db::RunQueryDsl;

use crate::lease::{endpoint_columns, Claimed, ClaimedForSend, EndpointColumns};
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
/// `(event_id, endpoint_id)` key): the SELECT of [`fan_in`]. Ordered by
/// (event id, endpoint id), so every fan-in inserts (and locks) its pairs in
/// the same order: the message fan-in and the reconciliation inserting
/// overlapping pairs at once wait for each other instead of deadlocking.
///
/// The events are read by primary key first (a `MATERIALIZED` CTE), so the
/// cost is the batch's, never the tenant's history: joined directly, the
/// planner ANDed the `events_pkey` probe with a bitmap scan of
/// `events_tenant_created` over every event of the tenant since the
/// endpoint's creation (43,584 index entries for a batch of 64 after one
/// bench run; 18 ms a call at 16,000 deliveries, issue 22).
pub fn missing_sql() -> String {
    format!(
        "WITH e AS MATERIALIZED ( \
             SELECT id, tenant_id, event_type, payload, created_at, resource_id FROM events WHERE id = ANY($1)) \
         SELECT e.id AS event_id, e.tenant_id, e.event_type, e.payload, w.id AS endpoint_id, w.status \
         FROM e JOIN webhook_endpoints w ON {MATCH} \
         WHERE NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id AND d.endpoint_id = w.id) \
         ORDER BY e.id, w.id"
    )
}

/// [`missing_sql`], built once (a cached statement's text is `'static`).
static MISSING_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(missing_sql);

/// Leasing the new deliveries of a fan-in in its own insert ([`fan_in_leasing`]):
/// what the caller's claim would have asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseFresh {
    /// The per-endpoint bound (`per_endpoint_concurrency`), as [`crate::lease::claim`] takes it.
    pub per_endpoint: i32,
    /// At most this many deliveries leased in all (the caller's free slots).
    pub limit: i32,
    /// The lease, in milliseconds.
    pub lease_ms: i64,
    /// The caller's leases whose requests are over but whose outcome is not
    /// recorded yet, as (delivery, claim token): left out of their
    /// endpoints' counts, each only while it is still that very lease, as
    /// [`crate::lease::claim_answered`] does. Empty: every lease counts.
    pub answered: Vec<(DeliveryId, DateTime<Utc>)>,
    /// Leasing ahead of the bound; `None`: the bound alone.
    pub ahead: Option<Ahead>,
}

/// Leasing ahead of the per-endpoint bound (migration 000300,
/// [`crate::lease::FANIN_AHEAD_FUNCTION`]). An endpoint that is
/// unthrottled, at its full concurrency (`concurrency_limit` not lowered by
/// a 429/503), with nothing older due, and whose live leases number no more
/// than the caller's count of its own, gets all its new pending deliveries
/// leased (at most `max` in all; [`LeaseFresh::limit`] still bounds those
/// leased within the bound, and the endpoints locked), whatever
/// `per_endpoint`: the caller
/// then holds more leases than the bound and must itself open at most
/// `per_endpoint` requests to that endpoint. No other replica leases for it
/// meanwhile (its leasing statements count these leases), so the bound on
/// open requests stays exact across replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ahead {
    /// At most this many leased in all, ahead of the bound or within it (0:
    /// no leasing ahead, and [`LeaseFresh::limit`] alone caps the call).
    pub max: i32,
    /// The caller's live leases per endpoint (an endpoint not listed: none).
    /// A count must never exceed the caller's live leases of that endpoint
    /// in the database: a lease counted after the statement that ends it
    /// was sent, or with under a second left, would let another replica's
    /// lease pass for the caller's. A low count only leases within the bound.
    pub own: Vec<(EndpointId, i64)>,
}

/// [`fan_in_leasing`]'s insert: `webhook_deliveries_insert_leasing`
/// ([`crate::lease::FANIN_LEASING_FUNCTION`]), one round trip. `$1`–`$8` the new
/// deliveries as arrays, in the insert order; `$9` the per-endpoint bound,
/// `$10` how many may be leased in all (0: none, no lock is taken and no
/// endpoint read), `$11` the lease in ms, `$12`/`$13` the caller's answered
/// leases (ids, claim tokens; [`LeaseFresh::answered`]), `$14` how many may be
/// leased ahead of the bound and `$15`/`$16` the caller's live leases per
/// endpoint ([`Ahead`]). A delivery is inserted leased when
/// its endpoint is unthrottled and has no unleased delivery already due (so
/// the oldest due is still sent first: the claim's order), it fits both in
/// the endpoint's free slots (counted exactly as the claim counts them) and
/// in `$10`, and the function got that endpoint's lock without waiting
/// ([`crate::lease::ENDPOINT_LOCK_CLASS`]). A leased row comes with its
/// endpoint's sending fields (as [`crate::lease::CLAIM_FOR_SEND_SQL`] reads
/// them; NULL for an unleased row, whose endpoint is not read).
const INSERT_SQL: &str = concat!(
    "SELECT c.id, c.endpoint_id, c.tenant_id, c.event_id, c.payload, c.attempt_count, c.manual_retry, c.locked_until, ",
    endpoint_columns!(),
    " FROM webhook_deliveries_insert_leasing($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) c \
     LEFT JOIN webhook_endpoints e ON c.locked_until IS NOT NULL AND e.id = c.endpoint_id"
);

/// A row [`INSERT_SQL`] inserted; leased when `locked_until` is set.
#[derive(Debug, QueryableByName)]
struct Inserted {
    #[diesel(sql_type = Text)]
    id: DeliveryId,
    #[diesel(sql_type = Text)]
    endpoint_id: EndpointId,
    #[diesel(sql_type = Text)]
    tenant_id: TenantId,
    #[diesel(sql_type = Text)]
    event_id: EventId,
    #[diesel(sql_type = Text)]
    payload: String,
    #[diesel(sql_type = Integer)]
    attempt_count: i32,
    #[diesel(sql_type = Bool)]
    manual_retry: bool,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    locked_until: Option<DateTime<Utc>>,
    #[diesel(embed)]
    endpoint: EndpointColumns,
}

/// Creates the missing deliveries of the recorded events `ids`: one per
/// endpoint matching [`MATCH`] that has none yet, in its [`initial_state`],
/// with the event's stored payload. Ids not in `events` insert nothing.
/// Two statements, each prepared once per connection
/// ([`vid_db::cached_sql_query`]), in the caller's transaction if it has one (one `SELECT`
/// with the rule, then one multi-row insert with `ON CONFLICT (event_id,
/// endpoint_id) DO NOTHING`, so a concurrent fan-in of the same event
/// cannot duplicate a delivery).
///
/// Errors: the database's.
pub async fn fan_in(conn: &mut AsyncPgConnection, ids: &[EventId]) -> QueryResult<FannedIn> {
    // Leases nothing, so it takes no lock.
    Ok(insert_leasing(conn, ids, |_| None).await?.0)
}

/// [`fan_in`], and the claim of the new deliveries in the same insert
/// (issue 22, "claim at fan-in"): `lease` is called with the number of new
/// `pending` deliveries (after the `SELECT`, before the insert) and returns
/// what the caller would claim ([`LeaseFresh`]; `None` or a `limit` of 0:
/// lease nothing). The insert ([`INSERT_SQL`], one statement) first takes,
/// without waiting, the per-endpoint locks ([`crate::lease::claim`] takes
/// the same) of at most `limit` of the new deliveries' endpoints, only of
/// those it could lease for (not throttled, nothing older due, a free
/// slot), in insert order, held to the end of the transaction, so the
/// per-endpoint bound stays exact across replicas; an endpoint whose lock
/// another transaction holds at that moment (a claim, another fan-in, or an
/// endpoint sharing its lock's hash) gets its deliveries unleased (due now:
/// the scheduler claims them once woken). With [`LeaseFresh::ahead`], an
/// endpoint no one else holds a lease of may be leased beyond the bound
/// (see there). A leased delivery is exactly what
/// [`crate::lease::claim_answered`] with the same [`LeaseFresh::answered`]
/// would have returned for it (same bound, lease, token, order rule). Returns what was inserted and the leased deliveries with their endpoints (as [`crate::lease::claim_for_send`] returns them), in
/// insert order. The leases are real once the insert commits: at once in
/// autocommit, or with the caller's transaction (which then also holds the
/// endpoint locks until it ends, and is aborted by an error here).
///
/// Errors: the database's; leasing (a `limit` above 0) inside a REPEATABLE
/// READ or SERIALIZABLE transaction: `invalid_transaction_state` (SQLSTATE
/// 25000), raised before anything is inserted, since the bound needs a
/// snapshot taken after the endpoint locks.
pub async fn fan_in_leasing(
    conn: &mut AsyncPgConnection,
    ids: &[EventId],
    lease: impl FnOnce(usize) -> Option<LeaseFresh> + Send,
) -> QueryResult<(FannedIn, Vec<ClaimedForSend>)> {
    insert_leasing(conn, ids, lease).await
}

/// [`fan_in_leasing`]'s body.
async fn insert_leasing(
    conn: &mut AsyncPgConnection,
    ids: &[EventId],
    lease: impl FnOnce(usize) -> Option<LeaseFresh> + Send,
) -> QueryResult<(FannedIn, Vec<ClaimedForSend>)> {
    if ids.is_empty() {
        return Ok(Default::default());
    }
    let missing: Vec<Missing> = vid_db::cached_sql_query(MISSING_SQL.as_str()).bind::<Array<Text>, _>(ids).load(conn).await?;
    if missing.is_empty() {
        return Ok(Default::default());
    }
    let pending = missing.iter().filter(|m| m.status == EndpointStatus::Enabled).count();
    let lease = if pending > 0 { lease(pending).filter(|l| l.limit > 0 || l.ahead.as_ref().is_some_and(|a| a.max > 0)) } else { None };
    let LeaseFresh { per_endpoint, limit, lease_ms, answered, ahead } =
        lease.unwrap_or(LeaseFresh { per_endpoint: 1, limit: 0, lease_ms: 0, answered: Vec::new(), ahead: None });
    let (answered_ids, answered_tokens) = crate::lease::answered_arrays(&answered);
    let max_ahead = ahead.as_ref().map_or(0, |a| i64::from(a.max.max(0)));
    let (own_ids, own_counts): (Vec<&str>, Vec<i64>) = ahead.iter().flat_map(|a| &a.own).map(|(e, n)| (e.as_str(), (*n).max(0))).unzip();
    let now = Utc::now();
    let n = missing.len();
    let (mut ids, mut tenants, mut endpoints, mut events, mut types, mut payloads, mut statuses, mut due) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for m in missing {
        let (status, at) = initial_state(m.status, now);
        ids.push(DeliveryId::generate().as_str().to_owned());
        tenants.push(m.tenant_id.as_str().to_owned());
        endpoints.push(m.endpoint_id.as_str().to_owned());
        events.push(m.event_id.as_str().to_owned());
        types.push(m.event_type);
        payloads.push(m.payload);
        statuses.push(status.as_str());
        due.push(at);
    }
    let inserted: Vec<Inserted> = vid_db::cached_sql_query(INSERT_SQL)
        .bind::<Array<Text>, _>(ids)
        .bind::<Array<Text>, _>(tenants)
        .bind::<Array<Text>, _>(endpoints)
        .bind::<Array<Text>, _>(events)
        .bind::<Array<Text>, _>(types)
        .bind::<Array<Text>, _>(payloads)
        .bind::<Array<Text>, _>(statuses)
        .bind::<Array<Nullable<Timestamptz>>, _>(due)
        .bind::<BigInt, _>(i64::from(per_endpoint.max(1)))
        .bind::<BigInt, _>(i64::from(limit.max(0)))
        .bind::<BigInt, _>(lease_ms)
        .bind::<Array<Text>, _>(answered_ids)
        .bind::<Array<Timestamptz>, _>(answered_tokens)
        .bind::<BigInt, _>(max_ahead)
        .bind::<Array<Text>, _>(own_ids)
        .bind::<Array<BigInt>, _>(own_counts)
        .load(conn)
        .await?;
    let mut out = FannedIn { deliveries: inserted.len(), events: Vec::with_capacity(inserted.len()) };
    let mut leased = Vec::new();
    for r in inserted {
        out.events.push(r.event_id.clone());
        if let Some(locked_until) = r.locked_until {
            let endpoint = r.endpoint.into_endpoint(&r.endpoint_id);
            let claimed = Claimed {
                id: r.id,
                endpoint_id: r.endpoint_id,
                tenant_id: r.tenant_id,
                event_id: r.event_id,
                payload: r.payload,
                attempt_count: r.attempt_count,
                manual_retry: r.manual_retry,
                locked_until,
            };
            leased.push((claimed, endpoint));
        }
    }
    out.events.sort();
    out.events.dedup();
    Ok((out, leased))
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
