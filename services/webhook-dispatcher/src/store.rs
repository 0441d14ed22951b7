//! Every SQL statement of the dispatcher, so the state machine is in one place.
//!
//! Delivery states (`webhook_deliveries.status`):
//!
//! ```text
//!            fan-in (endpoint enabled)          2xx
//!   event ───────────────────────────▶ pending ─────▶ succeeded
//!     │                                 │  ▲   │
//!     │ fan-in (endpoint disabled)      │  │   │ retries exhausted
//!     ▼                                 │  │   ▼
//!   paused ◀────── endpoint disabled ───┘  │  failed
//!     └──────────── api `:enable` ─────────┘
//! ```
//!
//! A delivery is *claimed* by setting `locked_until` (a lease); the lease
//! value doubles as the claim token, so only the claimer records the outcome.
//! `api :retry` turns a `failed`/`succeeded` delivery back into `pending` with
//! `manual_retry = true`: exactly one more attempt.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable, Text, Timestamptz};
use diesel_async::AsyncPgConnection;
use vid_core::event::{EndpointEventData, Event, EventData, EventType};
use vid_core::{DeliveryId, EndpointId, EventId, TenantId};
use vid_db::schema::{events, webhook_deliveries as dl, webhook_endpoints as ep};
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

/// Claims up to `limit` due deliveries, at most `per_endpoint` in flight per
/// endpoint counting every replica's leases, oldest due first.
///
/// Runs under a transaction-scoped advisory lock, so two replicas' claims do
/// not interleave (a claim is one short statement). Endpoints that answered
/// 429/503 are skipped until their `throttled_until`, and afterwards get
/// only their `concurrency_limit` slots (halved by the 429/503, one more per
/// recorded success; see [`record`]) instead of `per_endpoint`. Only unleased
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
            diesel::sql_query("SELECT pg_advisory_xact_lock($1)").bind::<BigInt, _>(CLAIM_LOCK_KEY).execute(conn).await?;
            diesel::sql_query(
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
"#,
            )
            .bind::<BigInt, _>(i64::from(per_endpoint))
            .bind::<BigInt, _>(i64::from(limit))
            .bind::<BigInt, _>(lease_ms)
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
    diesel::sql_query(
        "UPDATE webhook_deliveries SET locked_until = NULL, updated_at = now() \
         WHERE status = 'pending' AND locked_until IS NOT NULL AND locked_until < now()",
    )
    .execute(conn)
    .await
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
pub async fn postpone(conn: &mut AsyncPgConnection, c: &Claimed, delay: chrono::Duration) -> QueryResult<usize> {
    let now = Utc::now();
    diesel::update(dl::table.filter(dl::id.eq(&c.id)).filter(dl::locked_until.eq(c.locked_until)))
        .set((dl::locked_until.eq(None::<DateTime<Utc>>), dl::next_attempt_at.eq(now + delay), dl::updated_at.eq(now)))
        .execute(conn)
        .await
}

/// What the attempt needs to know about the endpoint.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = ep)]
pub struct EndpointForSend {
    /// `ep_…`
    pub id: EndpointId,
    /// URL as registered.
    pub url: String,
    /// `webhook-signature` or `standard-webhooks`.
    pub signature_format: String,
    /// `enabled` or `disabled`.
    pub status: String,
    /// Set when deleted.
    pub deleted_at: Option<DateTime<Utc>>,
    /// Current secret, sealed with the endpoint id as context.
    pub secret_sealed: Vec<u8>,
    /// Previous secret during a rotation overlap.
    pub previous_secret_sealed: Option<Vec<u8>>,
    /// End of the rotation overlap.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
}

/// Loads an endpoint for sending.
pub async fn load_endpoint(conn: &mut AsyncPgConnection, id: &EndpointId) -> QueryResult<Option<EndpointForSend>> {
    ep::table.filter(ep::id.eq(id)).select(EndpointForSend::as_select()).first(conn).await.optional()
}

/// Loads several endpoints for sending, in one query (a claimed batch's
/// endpoints). Ids that do not exist are simply missing from the result.
pub async fn load_endpoints(conn: &mut AsyncPgConnection, ids: &[EndpointId]) -> QueryResult<Vec<EndpointForSend>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    ep::table.filter(ep::id.eq_any(ids)).select(EndpointForSend::as_select()).load(conn).await
}

/// How many deliveries wait for a retry: `pending` with a next attempt in the
/// future (the `webhook_retry_backlog` gauge). One index scan of the partial
/// index `webhook_deliveries_due`.
pub async fn retry_backlog(conn: &mut AsyncPgConnection) -> QueryResult<i64> {
    dl::table.filter(dl::status.eq("pending")).filter(dl::next_attempt_at.gt(diesel::dsl::now)).count().get_result(conn).await
}

/// Ends a claim without an attempt: `status` is `paused` (endpoint disabled
/// meanwhile) or `failed` (endpoint deleted).
pub async fn settle_without_attempt(conn: &mut AsyncPgConnection, c: &Claimed, status: &str) -> QueryResult<usize> {
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

/// Creates one delivery of an event per matching endpoint of the tenant
/// (not deleted; `event_types` NULL or containing the type; not `exclude`):
/// `pending` and due now for enabled endpoints, `paused` for disabled ones
/// (or skipped when `only_enabled`). Redelivered events are harmless:
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
        q = q.filter(ep::status.eq("enabled"));
    }
    let targets: Vec<(EndpointId, String)> = q.select((ep::id, ep::status)).load(conn).await?;
    if targets.is_empty() {
        return Ok(0);
    }
    let now = Utc::now();
    let rows: Vec<_> = targets
        .into_iter()
        .map(|(endpoint_id, status)| {
            let enabled = status == "enabled";
            (
                dl::id.eq(DeliveryId::generate()),
                dl::tenant_id.eq(tenant_id.clone()),
                dl::endpoint_id.eq(endpoint_id),
                dl::event_id.eq(event_id.clone()),
                dl::event_type.eq(event_type.as_str()),
                dl::payload.eq(payload.to_owned()),
                dl::status.eq(if enabled { "pending" } else { "paused" }),
                dl::next_attempt_at.eq(if enabled { Some(now) } else { None }),
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
/// containing the type) gets a delivery, `pending` and due now if enabled,
/// `paused` if disabled. Returns how many rows were inserted (redelivered
/// events insert nothing).
pub async fn insert_deliveries_batch(conn: &mut AsyncPgConnection, batch: &[NewEvent<'_>]) -> QueryResult<usize> {
    if batch.is_empty() {
        return Ok(0);
    }
    let mut tenants: Vec<&TenantId> = batch.iter().map(|e| e.tenant_id).collect();
    tenants.sort();
    tenants.dedup();
    let endpoints: Vec<(EndpointId, TenantId, String, Option<Vec<String>>)> = ep::table
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
            let enabled = status == "enabled";
            rows.push((
                dl::id.eq(DeliveryId::generate()),
                dl::tenant_id.eq(e.tenant_id.clone()),
                dl::endpoint_id.eq(endpoint_id.clone()),
                dl::event_id.eq(e.event_id.clone()),
                dl::event_type.eq(e.event_type.as_str()),
                dl::payload.eq(e.payload.to_owned()),
                dl::status.eq(if enabled { "pending" } else { "paused" }),
                dl::next_attempt_at.eq(if enabled { Some(now) } else { None }),
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

/// Records successful attempts in ONE statement (so one round trip and one
/// commit for a whole batch): their `webhook_attempts` rows, their
/// deliveries `succeeded` (only where the lease is still the claim token),
/// and the health of their endpoints reset (`last_success_at`,
/// `consecutive_failures = 0`, `failing_since = NULL`, `concurrency_limit`
/// one higher, back to NULL at `per_endpoint`), exactly what [`record`]
/// does for one success. Every record must have `success`.
/// Returns how many deliveries were updated; the others had lost their lease
/// (their attempt row is still written, as [`record`] does).
pub async fn record_successes(conn: &mut AsyncPgConnection, batch: &[(Claimed, AttemptRecord)], per_endpoint: i32) -> QueryResult<usize> {
    if batch.is_empty() {
        return Ok(0);
    }
    debug_assert!(batch.iter().all(|(_, a)| a.success));
    let n = batch.len();
    let mut attempt_ids = Vec::with_capacity(n);
    let mut delivery_ids = Vec::with_capacity(n);
    let mut endpoint_ids = Vec::with_capacity(n);
    let mut tokens = Vec::with_capacity(n);
    let mut numbers = Vec::with_capacity(n);
    let mut started = Vec::with_capacity(n);
    let mut durations = Vec::with_capacity(n);
    let mut statuses = Vec::with_capacity(n);
    let mut bodies = Vec::with_capacity(n);
    for (c, a) in batch {
        attempt_ids.push(vid_core::AttemptId::generate().as_str().to_owned());
        delivery_ids.push(c.id.as_str());
        endpoint_ids.push(c.endpoint_id.as_str());
        tokens.push(c.locked_until);
        numbers.push(c.attempt_number());
        started.push(a.started_at);
        durations.push(a.duration_ms);
        statuses.push(a.response_status.map(i32::from));
        bodies.push(a.response_body.as_deref());
    }
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        updated: i64,
    }
    let count: Count = diesel::sql_query(
        r#"
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
health AS (
    UPDATE webhook_endpoints e
    SET last_success_at = now(), consecutive_failures = 0, failing_since = NULL,
        concurrency_limit = CASE WHEN e.concurrency_limit IS NULL OR e.concurrency_limit + 1 >= $10 THEN NULL
                                 ELSE e.concurrency_limit + 1 END
    WHERE e.id IN (SELECT DISTINCT endpoint_id FROM updated)
)
SELECT count(*) AS updated FROM updated
"#,
    )
    .bind::<Array<Text>, _>(attempt_ids)
    .bind::<Array<Text>, _>(delivery_ids)
    .bind::<Array<Text>, _>(endpoint_ids)
    .bind::<Array<Timestamptz>, _>(tokens)
    .bind::<Array<Integer>, _>(numbers)
    .bind::<Array<Timestamptz>, _>(started)
    .bind::<Array<Integer>, _>(durations)
    .bind::<Array<Nullable<Integer>>, _>(statuses)
    .bind::<Array<Nullable<Text>>, _>(bodies)
    .bind::<Integer, _>(per_endpoint)
    .get_result(conn)
    .await?;
    Ok(usize::try_from(count.updated).unwrap_or(0))
}

/// The endpoint columns the outcome bookkeeping reads, locked for update.
#[derive(Debug, Clone, QueryableByName)]
struct EndpointHealth {
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Integer)]
    consecutive_failures: i32,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    failing_since: Option<DateTime<Utc>>,
}

/// How an attempt went, as recorded.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    /// When the attempt started.
    pub started_at: DateTime<Utc>,
    /// How long it took, in ms.
    pub duration_ms: i32,
    /// HTTP status, if answered.
    pub response_status: Option<u16>,
    /// Error class, unless it succeeded.
    pub error_class: Option<&'static str>,
    /// Details (transport error, `Location` of a redirect).
    pub error_detail: Option<String>,
    /// First bytes of the body.
    pub response_body: Option<String>,
    /// 2xx.
    pub success: bool,
    /// The delay before the next attempt, computed by [`crate::retry::next_delay`];
    /// `None` when no retry is left.
    pub retry_in: Option<std::time::Duration>,
}

/// Rules for an endpoint's health: when to disable it, and the concurrency
/// it returns to after a 429/503 slow-down (see the crate docs).
#[derive(Debug, Clone, Copy)]
pub struct HealthRules {
    /// Deliveries in a row that ended `failed`.
    pub failed_deliveries: i32,
    /// Seconds of failures without a success.
    pub failing_seconds: i64,
    /// The configured per-endpoint concurrency (`per_endpoint_concurrency`):
    /// the most attempts in flight to one endpoint, and the ceiling its
    /// `concurrency_limit` climbs back to.
    pub per_endpoint: i32,
}

/// What [`record`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorded {
    /// The delivery's new status.
    pub status: String,
    /// The lease had been lost (another replica owns the delivery now); nothing but the attempt was written.
    pub lease_lost: bool,
    /// The endpoint was disabled by this outcome, with this reason.
    pub disabled: Option<String>,
    /// The rule that disabled it: `gone`, `failed_deliveries` or
    /// `failing_too_long` (the `reason` label of `webhook_endpoints_disabled_total`).
    pub disabled_rule: Option<&'static str>,
}

/// Records an attempt and applies its consequences, in one transaction:
/// the attempt row; the delivery's status, counters and next attempt; the
/// endpoint's health (success resets it and raises its `concurrency_limit`
/// by one; 429/503 throttle it: no attempt before the retry is due, and on
/// the first of a throttle its concurrency limit is halved, at least 1; 410
/// or the [`HealthRules`] disable it, pausing its pending deliveries and
/// emitting `webhook_endpoint.disabled` to the tenant's other enabled
/// endpoints).
pub async fn record(conn: &mut AsyncPgConnection, c: &Claimed, a: &AttemptRecord, rules: HealthRules) -> anyhow::Result<Recorded> {
    use diesel_async::scoped_futures::ScopedFutureExt;
    use diesel_async::AsyncConnection;
    let c = c.clone();
    let a = a.clone();
    conn.transaction::<Recorded, anyhow::Error, _>(|conn| {
        async move {
            let now = Utc::now();
            let health: Option<EndpointHealth> =
                diesel::sql_query("SELECT status, consecutive_failures, failing_since FROM webhook_endpoints WHERE id = $1 FOR UPDATE")
                    .bind::<Text, _>(&c.endpoint_id)
                    .get_result(conn)
                    .await
                    .optional()?;
            let endpoint_enabled = health.as_ref().is_some_and(|h| h.status == "enabled");

            let gone = a.response_status == Some(410);
            let throttle = matches!(a.response_status, Some(429 | 503));
            let (status, next_at, exhausted) = if a.success {
                ("succeeded", None, false)
            } else if c.manual_retry {
                ("failed", None, false)
            } else if gone {
                ("paused", None, false)
            } else {
                match a.retry_in {
                    Some(d) => {
                        let at = now + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::hours(1));
                        (if endpoint_enabled { "pending" } else { "paused" }, Some(at), false)
                    }
                    None => ("failed", None, true),
                }
            };

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
            .await?;

            let updated = diesel::update(dl::table.filter(dl::id.eq(&c.id)).filter(dl::locked_until.eq(c.locked_until)))
                .set((
                    dl::status.eq(status),
                    dl::attempt_count.eq(c.attempt_number()),
                    dl::next_attempt_at.eq(next_at),
                    dl::last_attempt_at.eq(a.started_at),
                    dl::locked_until.eq(None::<DateTime<Utc>>),
                    dl::manual_retry.eq(false),
                    dl::updated_at.eq(now),
                ))
                .execute(conn)
                .await?;
            if updated == 0 {
                return Ok(Recorded { status: status.to_owned(), lease_lost: true, ..Default::default() });
            }
            let Some(health) = health else {
                return Ok(Recorded { status: status.to_owned(), ..Default::default() });
            };

            let target = ep::table.filter(ep::id.eq(&c.endpoint_id));
            if a.success {
                diesel::sql_query(
                    "UPDATE webhook_endpoints SET last_success_at = $2, consecutive_failures = 0, failing_since = NULL, \
                     concurrency_limit = CASE WHEN concurrency_limit IS NULL OR concurrency_limit + 1 >= $3 THEN NULL \
                                              ELSE concurrency_limit + 1 END \
                     WHERE id = $1",
                )
                .bind::<Text, _>(&c.endpoint_id)
                .bind::<Timestamptz, _>(now)
                .bind::<Integer, _>(rules.per_endpoint)
                .execute(conn)
                .await?;
                return Ok(Recorded { status: status.to_owned(), ..Default::default() });
            }

            let failing_since = health.failing_since.unwrap_or(a.started_at);
            let consecutive = health.consecutive_failures + i32::from(exhausted);
            diesel::update(target)
                .set((ep::failing_since.eq(failing_since), ep::consecutive_failures.eq(consecutive)))
                .execute(conn)
                .await?;
            if throttle {
                // Halve the concurrency once per throttle (the answers to the
                // rest of the same burst find the throttle already running),
                // and hold every attempt until this retry is due.
                diesel::sql_query(
                    "UPDATE webhook_endpoints SET \
                     concurrency_limit = CASE WHEN throttled_until IS NULL OR throttled_until <= now() \
                                              THEN GREATEST(1, LEAST(COALESCE(concurrency_limit, $3), $3) / 2) \
                                              ELSE concurrency_limit END, \
                     throttled_until = CASE WHEN $2::timestamptz IS NULL THEN throttled_until \
                                            ELSE GREATEST(COALESCE(throttled_until, $2), $2) END \
                     WHERE id = $1",
                )
                .bind::<Text, _>(&c.endpoint_id)
                .bind::<Nullable<Timestamptz>, _>(next_at)
                .bind::<Integer, _>(rules.per_endpoint)
                .execute(conn)
                .await?;
            }

            let (reason, rule) = if health.status != "enabled" {
                (None, None)
            } else if gone {
                (Some("the endpoint answered 410 Gone".to_owned()), Some("gone"))
            } else if exhausted && consecutive >= rules.failed_deliveries {
                (Some(format!("{consecutive} deliveries in a row failed after every retry")), Some("failed_deliveries"))
            } else if (now - failing_since).num_seconds() >= rules.failing_seconds {
                (Some(format!("no successful delivery for {} h", rules.failing_seconds / 3600)), Some("failing_too_long"))
            } else {
                (None, None)
            };
            if let Some(reason) = &reason {
                disable(conn, &c.tenant_id, &c.endpoint_id, reason).await?;
            }
            Ok(Recorded { status: status.to_owned(), lease_lost: false, disabled: reason, disabled_rule: rule })
        }
        .scope_boxed()
    })
    .await
}

/// Disables an endpoint inside the caller's transaction: status, reason and
/// time; its pending deliveries become `paused` (kept, not dropped); a
/// `webhook_endpoint.disabled` event is recorded in `events` and delivered to
/// the tenant's other enabled endpoints.
///
/// This is the one place the dispatcher writes `events` (otherwise the api's
/// table): the event is born here, so its deliveries are created directly in
/// the same transaction instead of going through the api's outbox and queue.
pub async fn disable(conn: &mut AsyncPgConnection, tenant_id: &TenantId, endpoint_id: &EndpointId, reason: &str) -> QueryResult<Event> {
    let now = Utc::now();
    diesel::update(ep::table.filter(ep::id.eq(endpoint_id)))
        .set((ep::status.eq("disabled"), ep::disabled_reason.eq(reason), ep::disabled_at.eq(now), ep::updated_at.eq(now)))
        .execute(conn)
        .await?;
    diesel::update(dl::table.filter(dl::endpoint_id.eq(endpoint_id)).filter(dl::status.eq("pending")))
        .set((dl::status.eq("paused"), dl::updated_at.eq(now)))
        .execute(conn)
        .await?;
    let event = Event {
        id: EventId::generate(),
        type_: EventType::WebhookEndpointDisabled,
        created: now.timestamp(),
        data: EventData::Endpoint(EndpointEventData { endpoint_id: endpoint_id.clone(), reason: reason.to_owned() }),
    };
    let payload = serde_json::to_string(&event).expect("events serialise");
    diesel::insert_into(events::table)
        .values((
            events::id.eq(&event.id),
            events::tenant_id.eq(tenant_id),
            events::event_type.eq(event.type_.as_str()),
            events::resource_id.eq(endpoint_id.as_str()),
            events::payload.eq(&payload),
        ))
        .execute(conn)
        .await?;
    insert_deliveries(conn, tenant_id, &event.id, event.type_, &payload, Some(endpoint_id), true).await?;
    Ok(event)
}
