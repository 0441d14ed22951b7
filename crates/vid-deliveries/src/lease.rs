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

/// Class of the per-endpoint advisory locks: a lease is only ever taken
/// under the transaction-scoped lock `(ENDPOINT_LOCK_CLASS,
/// hashtext(endpoint_id))`, so the in-flight count each leasing statement
/// sees for its endpoint is exact across replicas. The two-`int4` key form
/// is its own key space (`pg_locks.objsubid = 2`), apart from the one-`bigint`
/// keys (the migration lock). Written into the SQL by `try_lock_endpoint!`;
/// a hash collision only makes two endpoints share a lock.
pub const ENDPOINT_LOCK_CLASS: i32 = 0x7668_6b64; // "vhkd"

/// `pg_try_advisory_xact_lock(ENDPOINT_LOCK_CLASS, hashtext(<id>))` as SQL
/// text, for an expression naming an endpoint id; never waits (another
/// holder is leasing that endpoint right now: skip it, it is served).
macro_rules! try_lock_endpoint {
    ($id:literal) => {
        concat!("pg_try_advisory_xact_lock(1986554724, hashtext(", $id, "))")
    };
}

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

/// The first statement of a claim ([`claim`]): sets, for the transaction
/// only, `plan_cache_mode = force_custom_plan` (see [`CLAIM_SQL`]),
/// `lock_timeout = 2s` and `idle_in_transaction_session_timeout = 10s` (see
/// below), and takes the
/// per-endpoint locks, without waiting, of at most `$1` endpoints that have
/// a due, unleased delivery, are not throttled and have a free slot under
/// the bound `$2` (counted before the lock, so possibly stale; the claim
/// counts again under it), oldest due first. An endpoint locked by another
/// replica's claim or fan-in is skipped (it is being served; its deliveries
/// stay claimable) and takes no place of the `$1`; so do full and throttled
/// endpoints, so they never crowd out others (no head-of-line blocking).
/// The lock is tried only on the rows of the materialized, ordered CTE, up
/// to the `LIMIT` (plan: `Limit -> CTE Scan (Filter: try_lock)`), so at most
/// `$1` locks are held. Returns the locked ids. It is a statement of its own
/// because the claim must run in a snapshot taken after the locks are held
/// (READ COMMITTED takes one per statement), so it sees every lease of the
/// previous holder.
///
/// **How long locks can be held.** While a transaction holds an endpoint's
/// lock, every other replica skips that endpoint, so a stall must not last.
/// Both leasing statements set, for their transaction only,
/// `idle_in_transaction_session_timeout = 10s`: it ends the session of a
/// replica that stopped between its statements (a host gone mid-transaction
/// would otherwise hold the locks until TCP keepalive notices, hours by
/// default). The claim also sets `lock_timeout = 2s`: it ends a claim whose
/// `UPDATE` waits on a row lock (e.g. a session idle in a transaction that
/// touched those rows). Both roll back, which frees the locks; the
/// scheduler logs the failed claim and claims again. A healthy leasing
/// transaction is a few round trips (milliseconds), far inside both.
const LOCK_SQL: &str = concat!(
    r#"
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
due_endpoints AS MATERIALIZED (
    SELECT p.endpoint_id
    FROM pending_endpoints p
    JOIN webhook_endpoints e ON e.id = p.endpoint_id
    CROSS JOIN LATERAL (SELECT min(d.next_attempt_at) AS oldest FROM webhook_deliveries d
                        WHERE d.endpoint_id = p.endpoint_id AND d.status = 'pending' AND d.locked_until IS NULL) o
    WHERE (e.throttled_until IS NULL OR e.throttled_until <= now()) AND o.oldest <= now()
      AND LEAST($2, COALESCE(e.concurrency_limit, $2)) > (SELECT count(*) FROM webhook_deliveries f
                 WHERE f.endpoint_id = p.endpoint_id AND f.status = 'pending'
                   AND f.locked_until IS NOT NULL AND f.locked_until >= now())
    ORDER BY o.oldest, p.endpoint_id
)
SELECT set_config('plan_cache_mode', 'force_custom_plan', true) AS plan_cache_mode,
       set_config('lock_timeout', '2s', true) AS lock_timeout,
       set_config('idle_in_transaction_session_timeout', '10s', true) AS idle_timeout,
       ARRAY(SELECT u.endpoint_id FROM due_endpoints u WHERE "#,
    try_lock_endpoint!("u.endpoint_id"),
    r#" LIMIT $1) AS locked
"#
);

/// The claim statement proper ([`claim`]), run after [`LOCK_SQL`]: `$1`
/// per-endpoint bound, `$2` batch limit, `$3` lease in ms, `$4` the
/// endpoints this transaction holds the locks of (a text array). Its status
/// literals are `DeliveryStatus::Pending` (checked by a test).
const CLAIM_SQL: &str = r#"
WITH open_endpoints AS (
    SELECT e.id AS endpoint_id,
           LEAST($1, COALESCE(e.concurrency_limit, $1)) - (SELECT count(*) FROM webhook_deliveries f
                 WHERE f.endpoint_id = e.id AND f.status = 'pending'
                   AND f.locked_until IS NOT NULL AND f.locked_until >= now()) AS free
    FROM webhook_endpoints e
    WHERE e.id = ANY($4::text[])
      AND (e.throttled_until IS NULL OR e.throttled_until <= now())
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

/// One bound value of a [`Prepared`] statement.
#[derive(Debug, Clone)]
enum Bind {
    BigInt(i64),
    Texts(Vec<String>),
}

/// Which fixed SQL a [`Prepared`] statement runs (one type per statement:
/// diesel keys its prepared-statement cache by this type).
trait FixedSql: 'static {
    /// The SQL; its `$1`…`$9` are the binds, in any order and repeated at will.
    const SQL: &'static str;
}

/// The lock statement's marker ([`LOCK_SQL`]).
struct LockSql;
impl FixedSql for LockSql {
    const SQL: &'static str = LOCK_SQL;
}

/// The claim statement's marker ([`CLAIM_SQL`]).
struct ClaimSql;
impl FixedSql for ClaimSql {
    const SQL: &'static str = CLAIM_SQL;
}

/// A statement with fixed SQL that diesel prepares once per connection
/// and then only executes (`sql_query` never caches, and parses and plans
/// it again every time). PostgreSQL still plans the claim for each call's
/// values: [`LOCK_SQL`] sets `plan_cache_mode = force_custom_plan` for the
/// transaction, since the claim's generic plan is several times slower
/// (its `LIMIT`s and counts are unknown to it).
struct Prepared<S: FixedSql> {
    binds: Vec<Bind>,
    _sql: std::marker::PhantomData<S>,
}

impl<S: FixedSql> Prepared<S> {
    fn new(binds: Vec<Bind>) -> Self {
        Prepared { binds, _sql: std::marker::PhantomData }
    }
}

impl<S: FixedSql> diesel::query_builder::QueryId for Prepared<S> {
    type QueryId = S;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<S: FixedSql> diesel::query_builder::Query for Prepared<S> {
    type SqlType = diesel::sql_types::Untyped;
}

impl<S: FixedSql> diesel::query_builder::QueryFragment<diesel::pg::Pg> for Prepared<S> {
    /// `S::SQL` with each `$n` bound where it stands (diesel numbers binds
    /// in order, so a parameter used twice is bound twice).
    fn walk_ast<'b>(&'b self, mut out: diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>) -> QueryResult<()> {
        let mut rest = S::SQL;
        while let Some(at) = rest.find('$') {
            out.push_sql(&rest[..at]);
            let n = rest.as_bytes().get(at + 1).and_then(|b| b.checked_sub(b'1')).map(usize::from);
            match n.and_then(|n| self.binds.get(n)) {
                Some(Bind::BigInt(v)) => out.push_bind_param::<BigInt, _>(v)?,
                Some(Bind::Texts(v)) => out.push_bind_param::<Array<Text>, _>(v)?,
                None => unreachable!("every $n of a fixed statement has its bind"),
            }
            rest = &rest[at + 2..];
        }
        out.push_sql(rest);
        Ok(())
    }
}

/// [`LOCK_SQL`]'s one row.
#[derive(Debug, QueryableByName)]
struct Locked {
    #[diesel(sql_type = Text)]
    #[allow(dead_code)]
    plan_cache_mode: String,
    #[diesel(sql_type = Text)]
    #[allow(dead_code)]
    lock_timeout: String,
    #[diesel(sql_type = Text)]
    #[allow(dead_code)]
    idle_timeout: String,
    #[diesel(sql_type = Array<Text>)]
    locked: Vec<String>,
}

/// The fan-in's lock statement ([`try_lock_for_fan_in`]): `$1` the
/// endpoints of the new `pending` deliveries in insert order, `$2` how many
/// may be locked, `$3` the per-endpoint bound. Only endpoints the insert
/// could lease for are tried: not throttled, no unleased delivery already
/// due (the insert leaves those to the claim, oldest first) and a free slot
/// (counted before the lock; the insert counts again under it). As in
/// [`LOCK_SQL`], the lock is tried on the materialized rows only, up to the
/// `LIMIT`, so at most `$2` locks are held however many endpoints a batch
/// reaches. Sets `idle_in_transaction_session_timeout` for the transaction
/// (see [`LOCK_SQL`]); no `lock_timeout`, so a fan-in still waits for a
/// concurrent insert of the same delivery (`ON CONFLICT`) to commit.
const FAN_IN_LOCK_SQL: &str = concat!(
    r#"
WITH wanted AS MATERIALIZED (
    SELECT u.id
    FROM unnest($1::text[]) WITH ORDINALITY AS u(id, ord)
    JOIN webhook_endpoints e ON e.id = u.id
    WHERE (e.throttled_until IS NULL OR e.throttled_until <= now())
      AND NOT EXISTS (SELECT 1 FROM webhook_deliveries b
                      WHERE b.endpoint_id = u.id AND b.status = 'pending' AND b.locked_until IS NULL
                        AND b.next_attempt_at <= now())
      AND LEAST($3, COALESCE(e.concurrency_limit, $3)) > (SELECT count(*) FROM webhook_deliveries f
                 WHERE f.endpoint_id = u.id AND f.status = 'pending'
                   AND f.locked_until IS NOT NULL AND f.locked_until >= now())
    ORDER BY u.ord
)
SELECT set_config('idle_in_transaction_session_timeout', '10s', true) AS idle_timeout,
       ARRAY(SELECT w.id FROM wanted w WHERE "#,
    try_lock_endpoint!("w.id"),
    r#" LIMIT $2) AS locked
"#
);

/// Takes, without waiting, the per-endpoint locks (held to the caller's
/// commit) of at most `limit` of `endpoints` (distinct, in insert order)
/// that a fan-in could lease for ([`FAN_IN_LOCK_SQL`]), and returns those
/// it got: an endpoint whose lock another transaction holds (a claim or a
/// fan-in leasing it right now) is left out. Only a delivery of a returned
/// endpoint may be leased in this transaction, by a statement after this one.
pub(crate) async fn try_lock_for_fan_in(
    conn: &mut AsyncPgConnection,
    endpoints: &[&str],
    limit: i32,
    per_endpoint: i32,
) -> QueryResult<Vec<String>> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        #[allow(dead_code)]
        idle_timeout: String,
        #[diesel(sql_type = Array<Text>)]
        locked: Vec<String>,
    }
    let row: Row = diesel::sql_query(FAN_IN_LOCK_SQL)
        .bind::<Array<Text>, _>(endpoints)
        .bind::<BigInt, _>(i64::from(limit))
        .bind::<BigInt, _>(i64::from(per_endpoint))
        .get_result(conn)
        .await?;
    Ok(row.locked)
}

/// The sweep of expired leases ([`release_expired`]).
const RELEASE_EXPIRED_SQL: &str = "UPDATE webhook_deliveries SET locked_until = NULL, updated_at = now() \
     WHERE status = 'pending' AND locked_until IS NOT NULL AND locked_until < now()";

/// Claims up to `limit` due deliveries, at most `per_endpoint` in flight per
/// endpoint counting every replica's leases, oldest due first; the lease
/// runs `lease_ms` milliseconds.
///
/// Two statements in one transaction: [`LOCK_SQL`] takes the per-endpoint
/// locks ([`ENDPOINT_LOCK_CLASS`]) of up to `limit` endpoints with due
/// deliveries, skipping any another replica's claim or fan-in is leasing
/// at that moment, then [`CLAIM_SQL`] leases among those endpoints only.
/// Replicas serving different endpoints never wait for each other, and no
/// claim waits for another's advisory lock (its `UPDATE` may still wait on
/// a row lock, e.g. behind an endpoint being disabled, for at most
/// 2 s, [`LOCK_SQL`]: then it fails and is retried). Endpoints that answered 429/503 are skipped
/// until their `throttled_until`, and afterwards get only their
/// `concurrency_limit` slots (halved by the 429/503, one more per recorded
/// success; see [`crate::outcome::record`]) instead of `per_endpoint`. Only
/// unleased deliveries are claimed; expired leases are first put back by
/// [`release_expired`]. Its cost grows with the number of endpoints that
/// have claimable deliveries, not with their backlogs nor with what is in
/// flight (index skip scan, then index probes per endpoint, on the partial
/// index `webhook_deliveries_claimable`; see migration
/// `2026-11-30-000040_dispatcher_claimable_index`). Returns fewer than
/// `limit` when fewer are due, the bounds are full, or an endpoint was
/// skipped; the caller claims again when woken.
pub async fn claim(conn: &mut AsyncPgConnection, per_endpoint: i32, limit: i32, lease_ms: i64) -> QueryResult<Vec<Claimed>> {
    use diesel_async::scoped_futures::ScopedFutureExt;
    use diesel_async::AsyncConnection;
    conn.transaction(|conn| {
        async move {
            let locked: Locked = Prepared::<LockSql>::new(vec![Bind::BigInt(i64::from(limit)), Bind::BigInt(i64::from(per_endpoint))])
                .get_result(conn)
                .await?;
            if locked.locked.is_empty() {
                return Ok(Vec::new());
            }
            Prepared::<ClaimSql>::new(vec![
                Bind::BigInt(i64::from(per_endpoint)),
                Bind::BigInt(i64::from(limit)),
                Bind::BigInt(lease_ms),
                Bind::Texts(locked.locked),
            ])
            .load(conn)
            .await
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
        for sql in [LOCK_SQL, FAN_IN_LOCK_SQL, CLAIM_SQL, RELEASE_EXPIRED_SQL] {
            assert!(sql.contains(&pending), "{sql}");
            let named = sql.matches("status = '").count();
            assert_eq!(sql.matches(&pending).count(), named, "{sql}");
        }
    }

    /// Both leasing statements bound how long their locks can be held.
    #[test]
    fn leasing_statements_bound_how_long_locks_are_held() {
        let idle = "set_config('idle_in_transaction_session_timeout', '10s', true)";
        assert!(LOCK_SQL.contains(idle) && FAN_IN_LOCK_SQL.contains(idle));
        assert!(LOCK_SQL.contains("set_config('lock_timeout', '2s', true)"));
        assert!(!FAN_IN_LOCK_SQL.contains("lock_timeout'"), "the fan-in waits for a concurrent insert of the same row");
    }

    /// The macro's literal lock class is [`ENDPOINT_LOCK_CLASS`].
    #[test]
    fn the_lock_sql_names_the_class() {
        let call = format!("pg_try_advisory_xact_lock({ENDPOINT_LOCK_CLASS}, hashtext(");
        assert!(try_lock_endpoint!("x").starts_with(&call));
        assert!(LOCK_SQL.contains(&format!("{call}u.endpoint_id))")));
    }
}
