//! Claims (leases) of due deliveries, and giving them back.
//!
//! Invariant: a delivery is in flight exactly while it is `pending` with
//! `locked_until` set; `locked_until` is the claim token every later write
//! of the holder filters on.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Integer, Text, Timestamptz};
use diesel_async::AsyncPgConnection;
use vid_core::{DeliveryId, EndpointId, EventId, TenantId};
use vid_db::schema::webhook_deliveries as dl;
use vid_db::RunQueryDsl;

/// Advisory-lock key serialising claims across replicas, so that the
/// per-endpoint in-flight count each claim sees is exact.
const CLAIM_LOCK_KEY: i64 = 0x7669_645f_776b_6864; // "vid_wkhd"

/// A delivery leased by this process.
#[derive(Debug, Clone, QueryableByName)]
pub struct Claimed {
    /// `dlv_…`
    #[diesel(sql_type = Text)]
    pub id: DeliveryId,
    /// Target endpoint.
    #[diesel(sql_type = Text)]
    pub endpoint_id: EndpointId,
    /// Owner.
    #[diesel(sql_type = Text)]
    pub tenant_id: TenantId,
    /// The event (also the `Webhook-Id`).
    #[diesel(sql_type = Text)]
    pub event_id: EventId,
    /// The exact body.
    #[diesel(sql_type = Text)]
    pub payload: String,
    /// Attempts made before this one.
    #[diesel(sql_type = Integer)]
    pub attempt_count: i32,
    /// A resend requested through the api: no retries after this attempt.
    #[diesel(sql_type = Bool)]
    pub manual_retry: bool,
    /// The lease; also the claim token.
    #[diesel(sql_type = Timestamptz)]
    pub locked_until: DateTime<Utc>,
}

impl Claimed {
    /// The 1-based number of the attempt about to be made.
    pub fn attempt_number(&self) -> i32 {
        self.attempt_count + 1
    }
}

/// The claim statement ([`claim`]); `$1` per-endpoint bound, `$2` batch
/// limit, `$3` lease in ms. Its status literals are `DeliveryStatus::Pending`
/// (checked by a test).
const CLAIM_SQL: &str = r#"
WITH RECURSIVE pending_endpoints(endpoint_id) AS (
    -- Every endpoint with a claimable delivery, by a skip scan of the partial
    -- index webhook_deliveries_claimable: one index probe per endpoint,
    -- however long each endpoint's backlog is.
    SELECT min(endpoint_id) FROM webhook_deliveries WHERE status = 'pending' AND locked_until IS NULL
    UNION ALL
    SELECT (SELECT min(d.endpoint_id) FROM webhook_deliveries d
            WHERE d.status = 'pending' AND d.locked_until IS NULL AND d.endpoint_id > p.endpoint_id)
    FROM pending_endpoints p WHERE p.endpoint_id IS NOT NULL
),
open_endpoints AS (
    SELECT p.endpoint_id,
           LEAST($1, COALESCE(e.concurrency_limit, $1)) - (SELECT count(*) FROM webhook_deliveries f
                 WHERE f.endpoint_id = p.endpoint_id AND f.status = 'pending'
                   AND f.locked_until IS NOT NULL AND f.locked_until >= now()) AS free
    FROM pending_endpoints p
    JOIN webhook_endpoints e ON e.id = p.endpoint_id
    WHERE e.throttled_until IS NULL OR e.throttled_until <= now()
),
chosen AS (
    SELECT c.id, c.next_attempt_at
    FROM open_endpoints o
    CROSS JOIN LATERAL (
        SELECT d.id, d.next_attempt_at
        FROM webhook_deliveries d
        WHERE d.endpoint_id = o.endpoint_id AND d.status = 'pending' AND d.locked_until IS NULL
          AND d.next_attempt_at <= now()
        ORDER BY d.next_attempt_at, d.id
        LIMIT GREATEST(o.free, 0)
    ) c
    ORDER BY c.next_attempt_at, c.id
    LIMIT $2
)
UPDATE webhook_deliveries d
SET locked_until = now() + $3 * interval '1 millisecond', updated_at = now()
FROM chosen
WHERE d.id = chosen.id AND d.locked_until IS NULL
RETURNING d.id, d.endpoint_id, d.tenant_id, d.event_id, d.payload, d.attempt_count, d.manual_retry, d.locked_until

"#;

/// The claim as a statement diesel prepares once per connection and then
/// only executes (its SQL is fixed, so it is safe to cache; `sql_query`
/// never is, and parses it again every time). PostgreSQL still plans it
/// for each call's values: [`lock_claims`] sets `plan_cache_mode =
/// force_custom_plan` for the transaction, since the generic plan of this
/// statement is several times slower (its `LIMIT`s and counts are unknown
/// to it). Binds: per-endpoint bound, batch limit, lease in ms (`bigint`).
#[derive(Debug, Clone, Copy)]
struct ClaimQuery {
    per_endpoint: i64,
    limit: i64,
    lease_ms: i64,
}

impl diesel::query_builder::QueryId for ClaimQuery {
    type QueryId = ClaimQuery;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl diesel::query_builder::Query for ClaimQuery {
    type SqlType = diesel::sql_types::Untyped;
}

impl diesel::query_builder::QueryFragment<diesel::pg::Pg> for ClaimQuery {
    /// [`CLAIM_SQL`] with each `$n` bound where it stands (diesel numbers
    /// binds in order, so a parameter used twice is bound twice).
    fn walk_ast<'b>(&'b self, mut out: diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>) -> QueryResult<()> {
        let mut rest = CLAIM_SQL;
        while let Some(at) = rest.find('$') {
            out.push_sql(&rest[..at]);
            let value = match rest.as_bytes().get(at + 1) {
                Some(b'1') => &self.per_endpoint,
                Some(b'2') => &self.limit,
                Some(b'3') => &self.lease_ms,
                _ => unreachable!("CLAIM_SQL names $1, $2 and $3 only"),
            };
            out.push_bind_param::<BigInt, _>(value)?;
            rest = &rest[at + 2..];
        }
        out.push_sql(rest);
        Ok(())
    }
}

/// Takes the claims' transaction-scoped advisory lock (held to the
/// caller's commit): [`claim`] and the leasing fan-in
/// ([`crate::fanin::fan_in_leasing`]) run one at a time across replicas, and
/// each statement after it sees every earlier claim's leases. In the same
/// statement, `plan_cache_mode = force_custom_plan` for the rest of the
/// transaction (`SET LOCAL`; see [`ClaimQuery`]).
pub(crate) async fn lock_claims(conn: &mut AsyncPgConnection) -> QueryResult<()> {
    diesel::sql_query("SELECT pg_advisory_xact_lock($1), set_config('plan_cache_mode', 'force_custom_plan', true)")
        .bind::<BigInt, _>(CLAIM_LOCK_KEY)
        .execute(conn)
        .await
        .map(drop)
}

/// The sweep of expired leases ([`release_expired`]).
const RELEASE_EXPIRED_SQL: &str = "UPDATE webhook_deliveries SET locked_until = NULL, updated_at = now() \
     WHERE status = 'pending' AND locked_until IS NOT NULL AND locked_until < now()";

/// Claims up to `limit` due deliveries, at most `per_endpoint` in flight per
/// endpoint counting every replica's leases, oldest due first; the lease
/// runs `lease_ms` milliseconds.
///
/// Runs under a transaction-scoped advisory lock, so two replicas' claims do
/// not interleave (a claim is one short statement). Endpoints that answered
/// 429/503 are skipped until their `throttled_until`, and afterwards get
/// only their `concurrency_limit` slots (halved by the 429/503, one more per
/// recorded success; see [`crate::outcome::record`]) instead of `per_endpoint`. Only unleased
/// deliveries are claimed; expired leases are first put back by
/// [`release_expired`]. Its cost grows with the number of endpoints that
/// have claimable deliveries, not with their backlogs nor with what is in
/// flight (index skip scan, then an index range scan per endpoint, both on
/// the partial index `webhook_deliveries_claimable`; see migration
/// `2026-11-30-000040_dispatcher_claimable_index`).
pub async fn claim(conn: &mut AsyncPgConnection, per_endpoint: i32, limit: i32, lease_ms: i64) -> QueryResult<Vec<Claimed>> {
    use diesel_async::scoped_futures::ScopedFutureExt;
    use diesel_async::AsyncConnection;
    conn.transaction(|conn| {
        async move {
            lock_claims(conn).await?;
            ClaimQuery { per_endpoint: i64::from(per_endpoint), limit: i64::from(limit), lease_ms }.load(conn).await
        }
        .scope_boxed()
    })
    .await
}

/// Puts expired leases back (a crashed or stalled replica's deliveries):
/// every `pending` delivery whose `locked_until` has passed gets
/// `locked_until = NULL`, which makes it claimable again (and notifies
/// every dispatcher through the `webhook_deliveries_due` trigger). The old
/// holder's token no longer matches, so if it still records an outcome it
/// finds its lease lost, as when another replica claims it. One statement
/// on the partial index `webhook_deliveries_leased` (in-flight rows only).
/// Returns how many leases were released.
pub async fn release_expired(conn: &mut AsyncPgConnection) -> QueryResult<usize> {
    diesel::sql_query(RELEASE_EXPIRED_SQL).execute(conn).await
}

/// Gives leases back without an attempt (shutdown): the deliveries are due
/// again at once. One statement for all of them; a lease is only released
/// if it is still the given token. Returns how many were released.
pub async fn release(conn: &mut AsyncPgConnection, leases: &[(DeliveryId, DateTime<Utc>)]) -> QueryResult<usize> {
    if leases.is_empty() {
        return Ok(0);
    }
    let ids: Vec<&str> = leases.iter().map(|(id, _)| id.as_str()).collect();
    let tokens: Vec<DateTime<Utc>> = leases.iter().map(|(_, t)| *t).collect();
    diesel::sql_query(
        "UPDATE webhook_deliveries d SET locked_until = NULL, updated_at = now() \
         FROM unnest($1::text[], $2::timestamptz[]) AS l(id, token) \
         WHERE d.id = l.id AND d.locked_until = l.token",
    )
    .bind::<Array<Text>, _>(ids)
    .bind::<Array<Timestamptz>, _>(tokens)
    .execute(conn)
    .await
}

/// Releases a lease and pushes the delivery back by `delay` (an internal
/// error before the attempt, e.g. the database was briefly unreachable).
/// Returns 0 if the lease was lost meanwhile.
pub async fn postpone(conn: &mut AsyncPgConnection, c: &Claimed, delay: chrono::Duration) -> QueryResult<usize> {
    let now = Utc::now();
    diesel::update(dl::table.filter(dl::id.eq(&c.id)).filter(dl::locked_until.eq(c.locked_until)))
        .set((dl::locked_until.eq(None::<DateTime<Utc>>), dl::next_attempt_at.eq(now + delay), dl::updated_at.eq(now)))
        .execute(conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeliveryStatus;

    /// The raw statements name the status by its typed spelling, and no other.
    #[test]
    fn raw_statements_use_the_typed_status() {
        let pending = format!("status = '{}'", DeliveryStatus::Pending);
        for sql in [CLAIM_SQL, RELEASE_EXPIRED_SQL] {
            assert!(sql.contains(&pending), "{sql}");
            let named = sql.matches("status = '").count();
            assert_eq!(sql.matches(&pending).count(), named, "{sql}");
        }
    }
}
