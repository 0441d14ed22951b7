//! Recording an attempt's outcome: the attempt row, the delivery's next
//! state ([`decide`]), and the endpoint's health ([`crate::health`]).
//!
//! Invariant: only the holder of the lease writes the delivery (every update
//! filters on `locked_until = token`); the attempt row is written even when
//! the lease was lost, since the request did go out.

use std::sync::atomic::{AtomicBool, Ordering};

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text, Timestamptz};
use diesel_async::AsyncPgConnection;
use vid_db::schema::webhook_deliveries as dl;
use vid_db::RunQueryDsl;

use crate::decision::{decide, AttemptRecord, Decision, HealthRules};
use crate::health::{self, Disabled};
use crate::lease::Claimed;
use crate::DeliveryStatus;

/// What [`record`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The delivery's new status.
    pub status: DeliveryStatus,
    /// The lease had been lost (another replica owns the delivery now); nothing but the attempt was written.
    pub lease_lost: bool,
    /// The endpoint was disabled by this outcome, with this reason.
    pub disabled: Option<String>,
    /// The rule that disabled it: `gone`, `failed_deliveries` or
    /// `failing_too_long` (the `reason` label of `webhook_endpoints_disabled_total`).
    pub disabled_rule: Option<&'static str>,
}

/// Records an attempt and applies its consequences, in one transaction:
/// the attempt row; the delivery's status, counters and next attempt
/// ([`decide`]); the endpoint's health ([`health::after_success`],
/// [`health::after_failure`]: success resets it and raises its
/// `concurrency_limit` by one; 429/503 throttle it; 410 or the
/// [`HealthRules`] disable it through [`health::disable`]).
pub async fn record(conn: &mut AsyncPgConnection, c: &Claimed, a: &AttemptRecord, rules: HealthRules) -> anyhow::Result<Recorded> {
    use diesel_async::scoped_futures::ScopedFutureExt;
    use diesel_async::AsyncConnection;
    let (c, a) = (c.clone(), a.clone());
    conn.transaction::<Recorded, anyhow::Error, _>(|conn| {
        async move {
            let now = Utc::now();
            let health = health::lock(conn, &c.endpoint_id).await?;
            let enabled = health.as_ref().is_some_and(|h| h.enabled());
            let d = decide(&a, c.manual_retry, enabled, now);
            insert_attempt(conn, &c, &a, d.next_at).await?;
            let recorded = |disabled: Option<Disabled>| Recorded {
                status: d.status,
                lease_lost: false,
                disabled_rule: disabled.as_ref().map(|x| x.rule),
                disabled: disabled.map(|x| x.reason),
            };
            if settle_attempt(conn, &c, &a, d, now).await? == 0 {
                return Ok(Recorded { lease_lost: true, ..recorded(None) });
            }
            let Some(health) = health else { return Ok(recorded(None)) };
            if a.success {
                health::after_success(conn, &c.endpoint_id, now, rules.per_endpoint).await?;
                return Ok(recorded(None));
            }
            let disabled = health::after_failure(conn, &c, &a, &health, d, now, rules).await?;
            Ok(recorded(disabled))
        }
        .scope_boxed()
    })
    .await
}

/// The `webhook_attempts` row of one attempt (idempotent per attempt number).
async fn insert_attempt(
    conn: &mut AsyncPgConnection,
    c: &Claimed,
    a: &AttemptRecord,
    next_at: Option<DateTime<Utc>>,
) -> QueryResult<usize> {
    diesel::sql_query(
        "INSERT INTO webhook_attempts (id, delivery_id, endpoint_id, attempt_number, started_at, duration_ms, \
         response_status, error_class, error_detail, response_body, next_attempt_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (delivery_id, attempt_number) DO NOTHING",
    )
    .bind::<Text, _>(vid_core::AttemptId::generate())
    .bind::<Text, _>(&c.id)
    .bind::<Text, _>(&c.endpoint_id)
    .bind::<Integer, _>(c.attempt_number())
    .bind::<Timestamptz, _>(a.started_at)
    .bind::<Integer, _>(a.duration_ms)
    .bind::<Nullable<Integer>, _>(a.response_status.map(i32::from))
    .bind::<Nullable<Text>, _>(a.error_class)
    .bind::<Nullable<Text>, _>(a.error_detail.as_deref())
    .bind::<Nullable<Text>, _>(a.response_body.as_deref())
    .bind::<Nullable<Timestamptz>, _>(next_at)
    .execute(conn)
    .await
}

/// Writes the [`Decision`] to the delivery, if the lease is still ours
/// (returns 0 otherwise); clears the lease and the manual-retry mark.
async fn settle_attempt(
    conn: &mut AsyncPgConnection,
    c: &Claimed,
    a: &AttemptRecord,
    d: Decision,
    now: DateTime<Utc>,
) -> QueryResult<usize> {
    diesel::update(dl::table.filter(dl::id.eq(&c.id)).filter(dl::locked_until.eq(c.locked_until)))
        .set((
            dl::status.eq(d.status),
            dl::attempt_count.eq(c.attempt_number()),
            dl::next_attempt_at.eq(d.next_at),
            dl::last_attempt_at.eq(a.started_at),
            dl::locked_until.eq(None::<DateTime<Utc>>),
            dl::manual_retry.eq(false),
            dl::updated_at.eq(now),
        ))
        .execute(conn)
        .await
}

/// Ends a claim without an attempt: `paused` (endpoint disabled meanwhile)
/// or `failed` (endpoint deleted). Returns 0 if the lease was lost.
pub async fn settle_without_attempt(conn: &mut AsyncPgConnection, c: &Claimed, status: DeliveryStatus) -> QueryResult<usize> {
    diesel::update(dl::table.filter(dl::id.eq(&c.id)).filter(dl::locked_until.eq(c.locked_until)))
        .set((
            dl::status.eq(status),
            dl::locked_until.eq(None::<DateTime<Utc>>),
            dl::next_attempt_at.eq(None::<DateTime<Utc>>),
            dl::updated_at.eq(Utc::now()),
        ))
        .execute(conn)
        .await
}

/// The migration that defines `webhook_deliveries_record_successes`, the
/// function [`record_successes`] calls (2026-12-06-000280): one statement
/// that writes the attempts, marks the deliveries `succeeded` and resets
/// their endpoints' health, planned once a session with `enable_seqscan =
/// off` and the deliveries named by primary key (each call planned anew
/// while the table's statistics are young,
/// [`crate::lease::YOUNG_STATISTICS_GUARD`]), so what it reads does not
/// depend on the statistics (before, a cached statement's plan made on a
/// young table scanned the whole table for every batch). Its status
/// literal is `DeliveryStatus::Succeeded` and its refresh interval
/// [`HEALTH_REFRESH`] (checked by tests).
pub const RECORD_SUCCESSES_FUNCTION: &str =
    include_str!("../../vid-db/migrations/2026-12-06-000280_webhook_record_successes_by_key/up.sql");

/// [`record_successes`]' statement: `$1`–`$9` the attempts as arrays (attempt
/// ids, delivery ids, endpoint ids, claim tokens, attempt numbers, start
/// times, durations in ms, HTTP statuses, response bodies), `$10` the
/// per-endpoint concurrency ([`RECORD_SUCCESSES_FUNCTION`]).
const RECORD_SUCCESSES_SQL: &str = "SELECT webhook_deliveries_record_successes($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) AS updated";

/// The statement [`record_successes`] ran before migration 000280 (same
/// binds and result), kept for a rolling update's window only: a dispatcher
/// of this release that starts before the migration Job has applied 000280
/// records with it ([`record_function_present`]) instead of failing to
/// record until its leases expire and the deliveries are sent again.
/// Remove it one release after 000280.
const RECORD_SUCCESSES_BEFORE_000280_SQL: &str = r#"
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::int[], $6::timestamptz[], $7::int[], $8::int[], $9::text[])
        AS t(attempt_id, delivery_id, endpoint_id, token, attempt_number, started_at, duration_ms, response_status, response_body)
),
attempts AS (
    INSERT INTO webhook_attempts (id, delivery_id, endpoint_id, attempt_number, started_at, duration_ms, response_status, response_body)
    SELECT attempt_id, delivery_id, endpoint_id, attempt_number, started_at, duration_ms, response_status, response_body FROM input
    ON CONFLICT (delivery_id, attempt_number) DO NOTHING
),
updated AS (
    UPDATE webhook_deliveries d
    SET status = 'succeeded', attempt_count = i.attempt_number, next_attempt_at = NULL, last_attempt_at = i.started_at,
        locked_until = NULL, manual_retry = false, updated_at = now()
    FROM input i
    WHERE d.id = i.delivery_id AND d.locked_until = i.token
    RETURNING d.endpoint_id
),
stale AS (
    -- Endpoints whose health this batch changes: failures to reset, a
    -- lowered concurrency_limit to raise, or a last_success_at more than
    -- HEALTH_REFRESH old. Locked in id order, so two batches of successes
    -- never lock the same endpoints in opposite orders (no deadlock between
    -- them); NO KEY UPDATE, as an UPDATE's own lock, so a fan-in's foreign
    -- key check (KEY SHARE) on the endpoint never waits for it.
    SELECT e.id FROM webhook_endpoints e
    WHERE e.id IN (SELECT endpoint_id FROM updated)
      AND (e.consecutive_failures <> 0 OR e.failing_since IS NOT NULL OR e.concurrency_limit IS NOT NULL
           OR e.last_success_at IS NULL OR e.last_success_at < now() - interval '1 second')
    ORDER BY e.id
    FOR NO KEY UPDATE
),
health AS (
    UPDATE webhook_endpoints e
    SET last_success_at = now(), consecutive_failures = 0, failing_since = NULL,
        concurrency_limit = CASE WHEN e.concurrency_limit IS NULL OR e.concurrency_limit + 1 >= $10 THEN NULL
                                 ELSE e.concurrency_limit + 1 END
    FROM stale WHERE e.id = stale.id
)
SELECT count(*) AS updated FROM updated
"#;

/// Whether this process has seen `webhook_deliveries_record_successes`
/// ([`record_function_present`]); once seen, it is assumed (migrations are
/// not rolled back under running dispatchers).
static RECORD_FUNCTION_SEEN: AtomicBool = AtomicBool::new(false);

/// Whether `conn`'s database has `webhook_deliveries_record_successes`
/// (migration 000280), by `to_regprocedure` on its signature: one catalog
/// lookup, no error when absent. Errors: the database's.
pub async fn record_function_present(conn: &mut AsyncPgConnection) -> QueryResult<bool> {
    #[derive(QueryableByName)]
    struct Present {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        present: bool,
    }
    let r: Present = vid_db::cached_sql_query(
        "SELECT to_regprocedure('webhook_deliveries_record_successes(text[], text[], text[], timestamptz[], integer[], timestamptz[], integer[], integer[], text[], integer)') IS NOT NULL AS present",
    )
    .get_result(conn)
    .await?;
    Ok(r.present)
}

/// How stale `webhook_endpoints.last_success_at` may get while an endpoint
/// is healthy: [`record_successes`] writes an endpoint's health row only
/// when the batch changes it (failure counters to reset, a lowered
/// `concurrency_limit` to raise) or its `last_success_at` is older than
/// this, not once per batch. At thousands of deliveries a second to one
/// endpoint, that row was rewritten (and locked, and logged) a few hundred
/// times a second for a timestamp (issue 22). Written into the SQL (`'1 second'`).
pub const HEALTH_REFRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// Records successful attempts in ONE statement (so one round trip and one
/// commit for a whole batch; prepared once per connection,
/// [`vid_db::cached_sql_query`], calling [`RECORD_SUCCESSES_FUNCTION`]): their `webhook_attempts` rows, their
/// deliveries `succeeded` (only where the lease is still the claim token),
/// and the health of their endpoints reset (`last_success_at`,
/// `consecutive_failures = 0`, `failing_since = NULL`, `concurrency_limit`
/// one higher, back to NULL at `per_endpoint`), as [`record`] does for one
/// success, except that a healthy endpoint's `last_success_at` is only
/// refreshed once it is [`HEALTH_REFRESH`] old. Which endpoints need a
/// write is read in the statement's snapshot: a failure or 429 recorded
/// concurrently and committed after it is left standing (as if it came
/// after the successes; the next batch resets it). Endpoint rows are locked
/// in id order, so concurrent calls cannot deadlock with each other (a
/// failure's transaction locks the endpoint before its deliveries and can
/// still meet one in a deadlock: PostgreSQL ends one, and the recorder
/// retries it; both writes are idempotent). Every record must have `success`.
/// Returns how many deliveries were updated; the others had lost their lease
/// (their attempt row is still written, as [`record`] does). On a database
/// without migration 000280 (a rolling update whose migration Job has not
/// finished) it runs the statement from before it.
pub async fn record_successes(conn: &mut AsyncPgConnection, batch: &[(Claimed, AttemptRecord)], per_endpoint: i32) -> QueryResult<usize> {
    if batch.is_empty() {
        return Ok(0);
    }
    debug_assert!(batch.iter().all(|(_, a)| a.success));
    // `AtomicBool::load` by path: diesel's `RunQueryDsl::load` is in scope.
    let sql = if AtomicBool::load(&RECORD_FUNCTION_SEEN, Ordering::Relaxed) || record_function_present(conn).await? {
        RECORD_FUNCTION_SEEN.store(true, Ordering::Relaxed);
        RECORD_SUCCESSES_SQL
    } else {
        RECORD_SUCCESSES_BEFORE_000280_SQL
    };
    record_successes_with(conn, sql, batch, per_endpoint).await
}

/// [`record_successes`] with the statement before migration 000280
/// ([`RECORD_SUCCESSES_BEFORE_000280_SQL`]), as a dispatcher of this release
/// runs it on a database the migration has not reached yet. Public for the
/// test of that window.
#[doc(hidden)]
pub async fn record_successes_before_000280(
    conn: &mut AsyncPgConnection,
    batch: &[(Claimed, AttemptRecord)],
    per_endpoint: i32,
) -> QueryResult<usize> {
    record_successes_with(conn, RECORD_SUCCESSES_BEFORE_000280_SQL, batch, per_endpoint).await
}

/// [`record_successes`]' body with `sql`, one of its two statements.
async fn record_successes_with(
    conn: &mut AsyncPgConnection,
    sql: &'static str,
    batch: &[(Claimed, AttemptRecord)],
    per_endpoint: i32,
) -> QueryResult<usize> {
    let attempt_ids: Vec<String> = batch.iter().map(|_| vid_core::AttemptId::generate().as_str().to_owned()).collect();
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        updated: i64,
    }
    let count: Count = vid_db::cached_sql_query(sql)
        .bind::<Array<Text>, _>(attempt_ids)
        .bind::<Array<Text>, _>(batch.iter().map(|(c, _)| c.id.as_str()).collect::<Vec<_>>())
        .bind::<Array<Text>, _>(batch.iter().map(|(c, _)| c.endpoint_id.as_str()).collect::<Vec<_>>())
        .bind::<Array<Timestamptz>, _>(batch.iter().map(|(c, _)| c.locked_until).collect::<Vec<_>>())
        .bind::<Array<Integer>, _>(batch.iter().map(|(c, _)| c.attempt_number()).collect::<Vec<_>>())
        .bind::<Array<Timestamptz>, _>(batch.iter().map(|(_, a)| a.started_at).collect::<Vec<_>>())
        .bind::<Array<Integer>, _>(batch.iter().map(|(_, a)| a.duration_ms).collect::<Vec<_>>())
        .bind::<Array<Nullable<Integer>>, _>(batch.iter().map(|(_, a)| a.response_status.map(i32::from)).collect::<Vec<_>>())
        .bind::<Array<Nullable<Text>>, _>(batch.iter().map(|(_, a)| a.response_body.as_deref()).collect::<Vec<_>>())
        .bind::<Integer, _>(per_endpoint)
        .get_result(conn)
        .await?;
    Ok(usize::try_from(count.updated).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn attempt(status: Option<u16>, retry_in: Option<Duration>) -> AttemptRecord {
        AttemptRecord {
            started_at: Utc::now(),
            duration_ms: 1,
            response_status: status,
            error_class: None,
            error_detail: None,
            response_body: None,
            success: status.is_some_and(|s| (200..300).contains(&s)),
            retry_in,
        }
    }

    #[test]
    fn outcomes_move_the_delivery_as_the_state_machine_says() {
        let now = Utc::now();
        let later = Some(Duration::from_secs(5));
        let d = decide(&attempt(Some(200), None), true, false, now);
        assert_eq!((d.status, d.next_at, d.exhausted), (DeliveryStatus::Succeeded, None, false));
        assert_eq!(decide(&attempt(Some(500), later), true, true, now).status, DeliveryStatus::Failed, "a manual retry is one attempt");
        assert_eq!(decide(&attempt(Some(410), later), false, true, now).status, DeliveryStatus::Paused);
        let d = decide(&attempt(Some(500), later), false, true, now);
        assert_eq!((d.status, d.next_at, d.exhausted), (DeliveryStatus::Pending, Some(now + chrono::Duration::seconds(5)), false));
        let d = decide(&attempt(None, later), false, false, now);
        assert_eq!((d.status, d.next_at), (DeliveryStatus::Paused, Some(now + chrono::Duration::seconds(5))), "disabled meanwhile");
        let d = decide(&attempt(Some(503), None), false, true, now);
        assert_eq!((d.status, d.next_at, d.exhausted), (DeliveryStatus::Failed, None, true));
    }

    #[test]
    fn the_health_refresh_in_the_sql_is_the_constant() {
        let interval = format!("e.last_success_at < now() - interval '{} second'", HEALTH_REFRESH.as_secs());
        assert!(HEALTH_REFRESH.subsec_nanos() == 0 && RECORD_SUCCESSES_FUNCTION.contains(&interval), "{interval}");
        assert!(RECORD_SUCCESSES_BEFORE_000280_SQL.contains(&interval), "{interval}");
    }

    #[test]
    fn the_batch_statement_uses_the_typed_status() {
        for sql in [RECORD_SUCCESSES_FUNCTION, RECORD_SUCCESSES_BEFORE_000280_SQL] {
            assert_eq!(sql.matches("status = '").count(), 1);
            assert!(sql.contains(&format!("status = '{}'", DeliveryStatus::Succeeded)));
        }
    }

    /// The function reads the batch's deliveries by primary key with
    /// sequential scans off, planned once a session except on young
    /// statistics (what it reads is tested against a database:
    /// `recording_after_unseen_growth_reads_by_key`).
    #[test]
    fn the_batch_function_reads_deliveries_by_key() {
        let body =
            &RECORD_SUCCESSES_FUNCTION[RECORD_SUCCESSES_FUNCTION.find("CREATE FUNCTION webhook_deliveries_record_successes(").unwrap()..];
        assert!(body.contains("SET plan_cache_mode = force_generic_plan\nSET enable_seqscan = off\nAS $$\n#variable_conflict use_column\n"));
        assert!(body.contains("WHERE d.id = ANY(delivery_ids) AND d.id = i.delivery_id AND d.locked_until = i.token"));
        assert!(!body.contains("EXECUTE"));
        assert_eq!(body.matches(crate::lease::YOUNG_STATISTICS_GUARD).count(), 1, "planned anew on young statistics");
        assert!(RECORD_SUCCESSES_SQL.contains("webhook_deliveries_record_successes($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"));
    }
}
