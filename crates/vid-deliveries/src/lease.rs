//! Claims (leases) of due deliveries, and giving them back.
//!
//! Invariant: a delivery is leased exactly while it is `pending` with
//! `locked_until` set (its request is open, or answered and its outcome not
//! yet written); `locked_until` is the claim token every later write of the
//! holder filters on.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Bytea, Integer, Nullable, Text, Timestamptz};
use diesel_async::AsyncPgConnection;
use vid_core::{DeliveryId, EndpointId, EventId, TenantId};
use vid_db::schema::webhook_deliveries as dl;
use vid_db::RunQueryDsl;

use crate::{EndpointForSend, EndpointStatus};

/// Class of the per-endpoint advisory locks: a lease is only ever taken
/// under the transaction-scoped lock `(ENDPOINT_LOCK_CLASS,
/// hashtext(endpoint_id))`, so the count of leases each leasing statement
/// sees for its endpoint is exact across replicas. The two-`int4` key form
/// is its own key space (`pg_locks.objsubid = 2`), apart from the one-`bigint`
/// keys (the migration lock). Written as a literal into the leasing
/// functions ([`LEASING_FUNCTIONS`]); a hash collision only makes two
/// endpoints share a lock.
pub const ENDPOINT_LOCK_CLASS: i32 = 0x7668_6b64; // "vhkd"

/// The migration that defines both leasing functions,
/// `webhook_deliveries_claim` ([`claim`]) and
/// `webhook_deliveries_insert_leasing` ([`crate::fanin::fan_in_leasing`]),
/// with the reasons for their shape. Each is one round trip in autocommit:
/// a first statement takes the per-endpoint locks ([`ENDPOINT_LOCK_CLASS`])
/// without waiting, a second one counts the leases and leases in a snapshot
/// taken after the locks are held (a VOLATILE PL/pgSQL function takes one
/// per statement under READ COMMITTED), so it sees every lease the previous
/// holder committed. The locks last to the end of the transaction: the call
/// itself in autocommit, or the caller's transaction, which must then be
/// READ COMMITTED (under REPEATABLE READ or SERIALIZABLE a leasing call
/// raises `invalid_transaction_state`, SQLSTATE 25000: one snapshot for the
/// whole transaction could predate the locks and miss another holder's
/// leases), and short (`now()` is its start: a lease written by a
/// transaction open longer than the lease is expired at once).
/// `vid_db::pool` sets READ COMMITTED on every connection.
/// The claim defined there has since been replaced by [`CLAIM_FUNCTION`].
pub const LEASING_FUNCTIONS: &str = include_str!("../../vid-db/migrations/2026-12-05-000200_webhook_leasing_functions/up.sql");

/// The migration that replaces `webhook_deliveries_claim` with its current
/// form: [`LEASING_FUNCTIONS`]' claim, whose UPDATE looks the chosen rows up
/// by primary key rather than through the partial index
/// `webhook_deliveries_claimable` (statistics taken before a backlog made
/// that plan read the whole backlog on every claim: O(backlog × batch)).
pub const CLAIM_FUNCTION: &str = include_str!("../../vid-db/migrations/2026-12-05-000210_webhook_claim_by_primary_key/up.sql");

/// The migration that adds the claim that leaves out the caller's leases
/// whose requests are over ([`claim_answered`]): the five-argument
/// `webhook_deliveries_claim`, [`CLAIM_FUNCTION`]'s claim otherwise. The
/// three-argument one stays for replicas of the previous release; since
/// [`CLAIM_ONE_BODY`] it is this one with nothing answered. Its body has
/// since been replaced by [`CLAIM_BY_KEY_FUNCTION`]'s.
pub const CLAIM_ANSWERED_FUNCTION: &str = include_str!("../../vid-db/migrations/2026-12-05-000220_webhook_claim_answered/up.sql");

/// The migration that makes the three-argument `webhook_deliveries_claim`
/// (kept for replicas of the previous release during a rolling update) a
/// SQL function that calls [`CLAIM_ANSWERED_FUNCTION`]'s with empty arrays,
/// so there is one claim body to maintain.
pub const CLAIM_ONE_BODY: &str = include_str!("../../vid-db/migrations/2026-12-05-000230_webhook_claim_one_body/up.sql");

/// The migration that added the thirteen-argument
/// `webhook_deliveries_insert_leasing` ([`crate::fanin::fan_in_leasing`]),
/// which leaves the caller's answered leases out of each endpoint's count
/// as the claim does ([`CLAIM_ANSWERED_FUNCTION`]; migration 000260), with
/// the eleven-argument one a SQL function calling it with empty arrays.
/// Its body was 000250's: the lock statement groups the new deliveries by
/// endpoint before testing each endpoint (nothing older due, a free slot),
/// instead of testing it once per new delivery (000240), and the "nothing
/// older due" tests are scalar subqueries in the order of
/// `webhook_deliveries_claimable`, so each is one index probe per endpoint
/// whether or not the table has statistics, never a scan of every
/// claimable delivery or of the table. [`FANIN_LEASING_FUNCTION`] has
/// since replaced that body.
pub const FANIN_ANSWERED_FUNCTION: &str = include_str!("../../vid-db/migrations/2026-12-06-000260_webhook_fanin_answered/up.sql");

/// The migration whose thirteen-argument fan-in insert is in force
/// (000270): [`FANIN_ANSWERED_FUNCTION`]'s statements as static PL/pgSQL,
/// parsed once a session and planned once (`plan_cache_mode =
/// force_generic_plan`, `enable_seqscan = off`, both for the function's
/// calls only) instead of parsed and planned on every call under `EXECUTE`.
/// Every base-table read is a probe by key, so a plan reads about the same
/// whatever statistics it was made from (one state is known where it does
/// not: statistics that see every row as a live lease, where an endpoint's
/// leases are counted through `webhook_deliveries_endpoint`; BENCHMARKS.md,
/// 2026-12-06 sixth session): the endpoints and the answered
/// leases by primary key alone in `LATERAL … LIMIT 1` subqueries, an
/// endpoint's open leases counted in the order of `webhook_deliveries_leased`
/// up to a cap, its due deliveries in the order of
/// `webhook_deliveries_claimable`. While the statistics of
/// `webhook_deliveries` describe fewer than 1,000 rows (where a probe by key
/// and a scan of a whole index are estimated alike) each call is planned
/// anew ([`YOUNG_STATISTICS_GUARD`]). Its body has since moved to
/// [`FANIN_AHEAD_FUNCTION`]'s sixteen-argument function.
pub const FANIN_LEASING_FUNCTION: &str = include_str!("../../vid-db/migrations/2026-12-06-000270_webhook_fanin_by_key/up.sql");

/// The migration whose sixteen-argument fan-in insert is in force (000300):
/// [`FANIN_LEASING_FUNCTION`]'s, which may also lease ahead of the bound
/// for an endpoint whose every live lease is the caller's
/// ([`crate::fanin::LeaseFresh::ahead`]; the migration gives why the bound
/// on open requests stays exact across replicas). The thirteen-argument
/// function becomes a SQL function calling it without leasing ahead.
pub const FANIN_AHEAD_FUNCTION: &str = include_str!("../../vid-db/migrations/2026-12-06-000300_webhook_fanin_ahead/up.sql");

/// The migration whose five-argument `webhook_deliveries_claim` is in force
/// (000290): [`CLAIM_ANSWERED_FUNCTION`]'s claim planned once a session and
/// reading by key as [`FANIN_LEASING_FUNCTION`] does, the endpoints with a
/// claimable delivery read by a statement of their own first (none: the
/// claim ends there).
pub const CLAIM_BY_KEY_FUNCTION: &str = include_str!("../../vid-db/migrations/2026-12-06-000290_webhook_claim_by_key/up.sql");

/// The lines with which [`FANIN_AHEAD_FUNCTION`], [`CLAIM_BY_KEY_FUNCTION`]
/// and `webhook_deliveries_record_successes`
/// ([`crate::outcome::RECORD_SUCCESSES_FUNCTION`]) plan each call anew
/// (`force_custom_plan`, for the call) while the statistics of
/// `webhook_deliveries` describe fewer than 1,000 rows: analysed or
/// vacuumed nearly empty, every index scan is estimated at one page, a probe
/// by key ties with a scan of a whole index, and a plan made then would be
/// kept as the table grows until its next analysis.
pub const YOUNG_STATISTICS_GUARD: &str =
    "    IF (SELECT c.reltuples FROM pg_class c WHERE c.oid = 'webhook_deliveries'::regclass) BETWEEN 0 AND 999 THEN
        PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
    END IF;
";

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

/// The sweep of expired leases ([`release_expired`]).
const RELEASE_EXPIRED_SQL: &str = "UPDATE webhook_deliveries SET locked_until = NULL, updated_at = now() \
     WHERE status = 'pending' AND locked_until IS NOT NULL AND locked_until < now()";

/// [`claim`]'s statement: the leasing function's rows, columns named (a
/// cached statement must keep its result type). `$4`/`$5`: the caller's
/// leases whose requests are over ([`claim_answered`]).
pub const CLAIM_SQL: &str = "SELECT id, endpoint_id, tenant_id, event_id, payload, attempt_count, manual_retry, locked_until \
     FROM webhook_deliveries_claim($1, $2, $3, $4, $5)";

/// The sending fields of the endpoint `e` ([`EndpointForSend`]), as the
/// columns `ep_…` of [`EndpointColumns`]: a string literal, for `concat!`
/// into a statement that joins `webhook_endpoints e`.
macro_rules! endpoint_columns {
    () => {
        "e.url AS ep_url, e.signature_format AS ep_signature_format, e.status AS ep_status, \
         e.deleted_at AS ep_deleted_at, e.secret_sealed AS ep_secret_sealed, \
         e.previous_secret_sealed AS ep_previous_secret_sealed, \
         e.previous_secret_expires_at AS ep_previous_secret_expires_at"
    };
}
pub(crate) use endpoint_columns;

/// [`claim_for_send`]'s statement: [`CLAIM_SQL`]'s rows with their
/// endpoint's sending fields ([`endpoint_columns`]), read in the
/// statement's snapshot (taken before the function's own statements: the
/// endpoint as it was just before the claim). NULL endpoint columns: no
/// such endpoint.
pub const CLAIM_FOR_SEND_SQL: &str = concat!(
    "SELECT c.id, c.endpoint_id, c.tenant_id, c.event_id, c.payload, c.attempt_count, c.manual_retry, c.locked_until, ",
    endpoint_columns!(),
    " FROM webhook_deliveries_claim($1, $2, $3, $4, $5) c LEFT JOIN webhook_endpoints e ON e.id = c.endpoint_id"
);

/// A leased delivery and its endpoint as the leasing statement read it
/// (`None`: no such endpoint): what the dispatcher needs to send it.
pub type ClaimedForSend = (Claimed, Option<EndpointForSend>);

/// The `ep_…` columns of [`endpoint_columns`], all NULL when the join found
/// no endpoint (or was not made).
#[derive(Debug, QueryableByName)]
pub(crate) struct EndpointColumns {
    #[diesel(sql_type = Nullable<Text>)]
    ep_url: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    ep_signature_format: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    ep_status: Option<EndpointStatus>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    ep_deleted_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Bytea>)]
    ep_secret_sealed: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Bytea>)]
    ep_previous_secret_sealed: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    ep_previous_secret_expires_at: Option<DateTime<Utc>>,
}

impl EndpointColumns {
    /// The endpoint `id`, if the row has it (its non-NULL columns are set).
    pub(crate) fn into_endpoint(self, id: &EndpointId) -> Option<EndpointForSend> {
        let (Some(url), Some(signature_format), Some(status), Some(secret_sealed)) =
            (self.ep_url, self.ep_signature_format, self.ep_status, self.ep_secret_sealed)
        else {
            return None;
        };
        Some(EndpointForSend {
            id: id.clone(),
            url,
            signature_format,
            status,
            deleted_at: self.ep_deleted_at,
            secret_sealed,
            previous_secret_sealed: self.ep_previous_secret_sealed,
            previous_secret_expires_at: self.ep_previous_secret_expires_at,
        })
    }
}

/// A row of [`CLAIM_FOR_SEND_SQL`].
#[derive(QueryableByName)]
struct ClaimedRow {
    #[diesel(embed)]
    claimed: Claimed,
    #[diesel(embed)]
    endpoint: EndpointColumns,
}

/// Claims up to `limit` due deliveries, at most `per_endpoint` in flight per
/// endpoint counting every replica's leases, oldest due first; the lease
/// runs `lease_ms` milliseconds.
///
/// One round trip: [`CLAIM_SQL`] (the five-argument function of [`CLAIM_ANSWERED_FUNCTION`], which is [`CLAIM_FUNCTION`]'s claim when nothing is answered), prepared once
/// per connection ([`vid_db::cached_sql_query`]), in autocommit (or the caller's short READ
/// COMMITTED transaction: then the endpoint locks are held until it ends, and an
/// error here aborts it). It takes the per-endpoint locks ([`ENDPOINT_LOCK_CLASS`]) of up to `limit`
/// endpoints with due deliveries, skipping any another replica's claim or
/// fan-in is leasing at that moment, then leases among those endpoints
/// only. Replicas serving different endpoints never wait for each other,
/// and no claim waits for another's advisory lock (its `UPDATE` may still
/// wait on a row lock, e.g. behind an endpoint being disabled, for at most
/// its `lock_timeout` of 2 s: then it fails and the scheduler claims
/// again). Endpoints that answered 429/503 are skipped until their
/// `throttled_until`, and afterwards get only their `concurrency_limit`
/// slots (halved by the 429/503, one more per recorded success; see
/// [`crate::outcome::record`]) instead of `per_endpoint`. Only unleased
/// deliveries are claimed; expired leases are first put back by
/// [`release_expired`]. Its cost grows with the number of endpoints that
/// have claimable deliveries, not with their backlogs nor with what is in
/// flight (index skip scan, then index probes per endpoint, on the partial
/// index `webhook_deliveries_claimable`; see migration
/// `2026-11-30-000040_dispatcher_claimable_index`). Returns fewer than
/// `limit` when fewer are due, the bounds are full, or an endpoint was
/// skipped; the caller claims again when woken. A delivery that stopped
/// being claimable (paused, settled, leased elsewhere) while the `UPDATE`
/// waited for its row lock is not leased.
///
/// Errors: the database's (a `lock_timeout` among them); `per_endpoint` or
/// `lease_ms` below 1, or a negative `limit`: `invalid_parameter_value`
/// (SQLSTATE 22023), raised before anything is read; a `limit` above 0
/// inside a REPEATABLE READ or SERIALIZABLE transaction:
/// `invalid_transaction_state` (SQLSTATE 25000).
pub async fn claim(conn: &mut AsyncPgConnection, per_endpoint: i32, limit: i32, lease_ms: i64) -> QueryResult<Vec<Claimed>> {
    claim_answered(conn, per_endpoint, limit, lease_ms, &[]).await
}

/// [`claim`], with the bound counting requests open at the receiver rather
/// than outcomes not yet written: `answered` are leases of the caller's
/// (delivery id, claim token) whose request is over and answered (the
/// dispatcher passes its 2xx answers only: a timed-out request may still be
/// running at the receiver, and a 429/503 throttles the endpoint only once
/// recorded) and whose outcome is not recorded yet. A delivery listed twice
/// counts once. Each endpoint's count of
/// leases leaves out those that are, in the count's own snapshot, still
/// exactly that lease (same token, `pending`, unexpired), so a stale or
/// wrong entry frees nothing: a lease expired, recorded or taken by another
/// replica meanwhile counts as before. Every replica leaves out only its
/// own, so the requests open at an endpoint never exceed its bound; the
/// table may hold up to the bound plus the caller's answered leases of it
/// (at most its `max_in_flight`). One round trip, [`CLAIM_SQL`]
/// ([`CLAIM_ANSWERED_FUNCTION`]); an empty `answered` is [`claim`].
///
/// Errors: as [`claim`].
pub async fn claim_answered(
    conn: &mut AsyncPgConnection,
    per_endpoint: i32,
    limit: i32,
    lease_ms: i64,
    answered: &[(DeliveryId, DateTime<Utc>)],
) -> QueryResult<Vec<Claimed>> {
    claim_statement(CLAIM_SQL, per_endpoint, limit, lease_ms, answered).load(conn).await
}

/// Answered leases as the leasing functions take them: the delivery ids
/// (`text[]`) and the claim tokens (`timestamptz[]`), in the same order.
pub(crate) fn answered_arrays(answered: &[(DeliveryId, DateTime<Utc>)]) -> (Vec<&str>, Vec<DateTime<Utc>>) {
    answered.iter().map(|(id, token)| (id.as_str(), *token)).unzip()
}

/// `sql` ([`CLAIM_SQL`] or [`CLAIM_FOR_SEND_SQL`]) with the claim's five binds.
fn claim_statement<'a>(
    sql: &'static str,
    per_endpoint: i32,
    limit: i32,
    lease_ms: i64,
    answered: &'a [(DeliveryId, DateTime<Utc>)],
) -> vid_db::CachedQuery<'a> {
    let (ids, tokens) = answered_arrays(answered);
    vid_db::cached_sql_query(sql)
        .bind::<BigInt, _>(i64::from(per_endpoint))
        .bind::<BigInt, _>(i64::from(limit))
        .bind::<BigInt, _>(lease_ms)
        .bind::<Array<Text>, _>(ids)
        .bind::<Array<Timestamptz>, _>(tokens)
}

/// [`claim_answered`], each lease with its endpoint's sending fields read
/// in the same round trip ([`CLAIM_FOR_SEND_SQL`], one row per lease), so
/// the caller need not load them ([`crate::load_endpoints`]) before
/// sending. The endpoint is as the statement's snapshot saw it, taken just
/// before the claim's own statements; `None` if it did not exist then. A
/// change committed while the claim ran (an `:enable`, a new endpoint, a
/// delete) is not in it: a caller that would settle a lease on what it
/// shows (missing, disabled, deleted) reads the endpoint again first, as
/// the dispatcher does.
///
/// Errors: as [`claim`].
pub async fn claim_for_send(
    conn: &mut AsyncPgConnection,
    per_endpoint: i32,
    limit: i32,
    lease_ms: i64,
    answered: &[(DeliveryId, DateTime<Utc>)],
) -> QueryResult<Vec<ClaimedForSend>> {
    let rows: Vec<ClaimedRow> = claim_statement(CLAIM_FOR_SEND_SQL, per_endpoint, limit, lease_ms, answered).load(conn).await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let endpoint = r.endpoint.into_endpoint(&r.claimed.endpoint_id);
            (r.claimed, endpoint)
        })
        .collect())
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
        for sql in [
            LEASING_FUNCTIONS,
            CLAIM_FUNCTION,
            CLAIM_ANSWERED_FUNCTION,
            CLAIM_BY_KEY_FUNCTION,
            FANIN_ANSWERED_FUNCTION,
            FANIN_LEASING_FUNCTION,
            FANIN_AHEAD_FUNCTION,
            RELEASE_EXPIRED_SQL,
        ] {
            assert!(sql.contains(&pending), "{sql}");
            let named = sql.matches("status = '").count();
            assert_eq!(sql.matches(&pending).count(), named, "{sql}");
        }
    }

    /// The claim bounds how long it can wait on a row lock; the insert does
    /// not (it waits for a concurrent insert of the same row).
    #[test]
    fn the_claim_bounds_its_lock_waits() {
        let claim = &LEASING_FUNCTIONS[LEASING_FUNCTIONS.find("CREATE FUNCTION webhook_deliveries_claim").unwrap()..];
        let insert = claim.find("CREATE FUNCTION webhook_deliveries_insert_leasing").unwrap();
        assert!(claim[..insert].contains("SET lock_timeout = '2s'"));
        assert!(!claim[insert..].contains("lock_timeout"), "the fan-in waits for a concurrent insert of the same row");
        assert!(CLAIM_FUNCTION.contains("CREATE OR REPLACE FUNCTION webhook_deliveries_claim("));
        assert!(CLAIM_FUNCTION.contains("SET lock_timeout = '2s'"), "the replaced claim keeps its bound");
        assert!(CLAIM_ANSWERED_FUNCTION.contains("SET lock_timeout = '2s'"), "the five-argument claim too");
        assert!(CLAIM_BY_KEY_FUNCTION.contains("SET lock_timeout = '2s'"), "and its body in force");
        // The three-argument claim is the five-argument one, whose bound applies to the call.
        assert!(
            CLAIM_ONE_BODY.contains("FROM webhook_deliveries_claim(per_endpoint, max_leases, lease_ms, '{}'::text[], '{}'::timestamptz[])")
        );
        assert!(!CLAIM_ONE_BODY.contains("pg_try_advisory_xact_lock"), "a second claim body");
        assert!(FANIN_ANSWERED_FUNCTION.contains("CREATE FUNCTION webhook_deliveries_insert_leasing("));
        assert!(FANIN_LEASING_FUNCTION.contains("CREATE OR REPLACE FUNCTION webhook_deliveries_insert_leasing("));
        for sql in [FANIN_ANSWERED_FUNCTION, FANIN_LEASING_FUNCTION, FANIN_AHEAD_FUNCTION] {
            assert!(!sql.contains("lock_timeout"), "the fan-in waits for a concurrent insert of the same row");
        }
        // The thirteen-argument fan-in is the sixteen-argument one, not leasing ahead.
        let wrapper =
            &FANIN_AHEAD_FUNCTION[FANIN_AHEAD_FUNCTION.find("CREATE OR REPLACE FUNCTION webhook_deliveries_insert_leasing(").unwrap()..];
        assert!(wrapper.contains("answered_ids, answered_tokens, 0, '{}'::text[], '{}'::bigint[]) c"), "{wrapper}");
        assert!(!wrapper.contains("pg_try_advisory_xact_lock"), "a second fan-in body");
        // The eleven-argument fan-in is the thirteen-argument one with nothing answered.
        let wrapper = &FANIN_ANSWERED_FUNCTION
            [FANIN_ANSWERED_FUNCTION.find("CREATE OR REPLACE FUNCTION webhook_deliveries_insert_leasing(").unwrap()..];
        assert!(wrapper.contains("statuses, due, per_endpoint, max_leases, lease_ms,\n                                           '{}'::text[], '{}'::timestamptz[]) c"), "{wrapper}");
        assert!(!wrapper.contains("pg_try_advisory_xact_lock"), "a second fan-in body");
    }

    /// The fan-in's "nothing older due" tests are scalar subqueries in the
    /// index's order (a `NOT EXISTS` may become an anti join that scans
    /// every claimable delivery per endpoint; without the `ORDER BY`, an
    /// analysed table gets a sequential scan per endpoint; migration
    /// 000250). What they read is tested against a database
    /// (`a_fan_out_tests_each_endpoint_not_the_backlog`).
    #[test]
    fn the_fan_ins_due_tests_probe_per_endpoint() {
        let body = &FANIN_AHEAD_FUNCTION[FANIN_AHEAD_FUNCTION.find("CREATE FUNCTION webhook_deliveries_insert_leasing(").unwrap()..];
        assert!(!body.contains("NOT EXISTS"), "{body}");
        assert_eq!(body.matches("AND b.next_attempt_at <= now()").count(), 2);
        assert_eq!(body.matches("ORDER BY b.next_attempt_at LIMIT 1) IS NULL").count(), 2, "the lock statement's test and the insert's");
    }

    /// Leasing ahead (000300) tests that the endpoint's every live lease is
    /// the caller's by reading them in the order of
    /// `webhook_deliveries_leased`, capped at one more than the caller's
    /// count (never all of a large backlog), only at full concurrency, in
    /// both statements; not leasing ahead, the bound applies as before.
    #[test]
    fn the_lease_ahead_test_is_capped_and_in_both_statements() {
        let body = &FANIN_AHEAD_FUNCTION[FANIN_AHEAD_FUNCTION.find("CREATE FUNCTION webhook_deliveries_insert_leasing(").unwrap()..];
        assert_eq!(body.matches("ORDER BY f.locked_until LIMIT COALESCE(o.n, 0) + 1) s) <= COALESCE(o.n, 0)").count(), 2, "{body}");
        assert_eq!(body.matches("max_ahead > 0 AND COALESCE(e.concurrency_limit, per_endpoint) >= per_endpoint").count(), 2);
        assert_eq!(body.matches("LEFT JOIN own o ON o.endpoint_id = ").count(), 2);
    }

    /// Every lock the functions take is of [`ENDPOINT_LOCK_CLASS`].
    #[test]
    fn the_functions_name_the_lock_class() {
        for (sql, locks) in [
            (LEASING_FUNCTIONS, 2),
            (CLAIM_FUNCTION, 1),
            (CLAIM_ANSWERED_FUNCTION, 1),
            (CLAIM_BY_KEY_FUNCTION, 1),
            (FANIN_ANSWERED_FUNCTION, 1),
            (FANIN_LEASING_FUNCTION, 1),
            (FANIN_AHEAD_FUNCTION, 1),
        ] {
            let calls = sql.matches("pg_try_advisory_xact_lock(").count();
            let ours = sql.matches(&format!("pg_try_advisory_xact_lock({ENDPOINT_LOCK_CLASS}, hashtext(")).count();
            assert_eq!((calls, ours), (locks, locks));
        }
    }

    /// The fan-in and the claim in force are planned once a session
    /// (000270, now 000300; 000290), except on young statistics, and probe by key so
    /// that a plan cannot read a whole table or index whatever statistics it
    /// was made with: no `EXECUTE`, both settings and the guard, and no base
    /// table in a join (each read is a scalar or `LATERAL … LIMIT 1`
    /// subquery; an answered lease by primary key alone). What they read is
    /// tested against a database (`a_fan_in_after_unseen_growth_reads_by_key`,
    /// `a_claim_after_unseen_growth_reads_by_key`).
    #[test]
    fn the_functions_in_force_are_planned_once_and_probe_by_key() {
        for (sql, name) in [
            (FANIN_AHEAD_FUNCTION, "CREATE FUNCTION webhook_deliveries_insert_leasing("),
            (CLAIM_BY_KEY_FUNCTION, "CREATE OR REPLACE FUNCTION webhook_deliveries_claim("),
        ] {
            let body = &sql[sql.find(name).unwrap()..];
            // The fan-in's file ends with the thirteen-argument wrapper: its body only.
            let body = body.find("\nCREATE OR REPLACE FUNCTION").map_or(body, |end| &body[..end]);
            assert!(!body.contains("EXECUTE"), "{body}");
            assert!(
                body.contains("SET plan_cache_mode = force_generic_plan\nSET enable_seqscan = off\nAS $$\n#variable_conflict use_column\n")
            );
            assert_eq!(body.matches(YOUNG_STATISTICS_GUARD).count(), 1, "the guard: {name}");
            for table in ["webhook_deliveries", "webhook_endpoints"] {
                assert!(!body.contains(&format!("JOIN {table}")), "{table} in a join: {name}");
            }
            assert_eq!(
                body.matches("WHERE l.id = a.id LIMIT 1) f\n").count(),
                2,
                "an answered lease by primary key alone, in both statements: {name}"
            );
            assert_eq!(body.matches("WHERE k.id = ").count(), 2, "an endpoint by primary key, in both statements: {name}");
            assert_eq!(
                body.matches("ORDER BY f.locked_until LIMIT LEAST(per_endpoint, 2147483647) + cardinality(answered_ids)) s)").count(),
                2,
                "capped counts: {name}"
            );
        }
    }
}
