//! The endpoint health columns the dispatcher maintains: `consecutive_failures`,
//! `failing_since`, `last_success_at`, `throttled_until`,
//! `concurrency_limit`, and disabling (`status`, `disabled_reason`,
//! `disabled_at`). Re-enabling is [`crate::manual::enable`].
//!
//! Invariants: an attempt's health bookkeeping runs in the transaction that
//! records the attempt, with the endpoint row locked ([`lock`]); only an
//! enabled endpoint is disabled, and disabling pauses its `pending`
//! deliveries in the same transaction.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Integer, Nullable, Text, Timestamptz};
use diesel_async::AsyncPgConnection;
use vid_core::event::{EndpointEventData, Event, EventData, EventType};
use vid_core::{EndpointId, EventId, TenantId};
use vid_db::schema::{events, webhook_deliveries as dl, webhook_endpoints as ep};
use vid_db::RunQueryDsl;

use crate::lease::Claimed;
use crate::outcome::{AttemptRecord, Decision, HealthRules};
use crate::{DeliveryStatus, EndpointStatus};

/// The endpoint columns the outcome bookkeeping reads, locked for update.
#[derive(Debug, Clone, QueryableByName)]
pub struct EndpointHealth {
    /// Enabled or disabled.
    #[diesel(sql_type = Text)]
    pub status: EndpointStatus,
    /// Deliveries in a row that ended `failed` since the last success.
    #[diesel(sql_type = Integer)]
    pub consecutive_failures: i32,
    /// The first failure since the last success.
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub failing_since: Option<DateTime<Utc>>,
}

impl EndpointHealth {
    /// Deliveries to it are attempted.
    pub fn enabled(&self) -> bool {
        self.status == EndpointStatus::Enabled
    }
}

/// Locks the endpoint's row for the rest of the transaction and reads its
/// health; `None` if the endpoint does not exist.
pub async fn lock(conn: &mut AsyncPgConnection, id: &EndpointId) -> QueryResult<Option<EndpointHealth>> {
    diesel::sql_query("SELECT status, consecutive_failures, failing_since FROM webhook_endpoints WHERE id = $1 FOR UPDATE")
        .bind::<Text, _>(id)
        .get_result(conn)
        .await
        .optional()
}

/// A success: `last_success_at = now`, the failure counters reset, and
/// `concurrency_limit` one higher (NULL again once it reaches `per_endpoint`).
pub async fn after_success(conn: &mut AsyncPgConnection, id: &EndpointId, now: DateTime<Utc>, per_endpoint: i32) -> QueryResult<usize> {
    diesel::sql_query(
        "UPDATE webhook_endpoints SET last_success_at = $2, consecutive_failures = 0, failing_since = NULL, \
         concurrency_limit = CASE WHEN concurrency_limit IS NULL OR concurrency_limit + 1 >= $3 THEN NULL \
                                  ELSE concurrency_limit + 1 END \
         WHERE id = $1",
    )
    .bind::<Text, _>(id)
    .bind::<Timestamptz, _>(now)
    .bind::<Integer, _>(per_endpoint)
    .execute(conn)
    .await
}

/// Why an endpoint was disabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disabled {
    /// Shown as `disabled_reason`.
    pub reason: String,
    /// `gone`, `failed_deliveries` or `failing_too_long`.
    pub rule: &'static str,
}

/// Whether a failed attempt disables its endpoint (pure): only an enabled
/// one; at once on 410; when `consecutive` given-up deliveries reach
/// `failed_deliveries` (counted only when this one gave up); or when it has
/// been failing since `failing_since` for `failing_seconds`.
pub fn disable_rule(
    health: &EndpointHealth,
    a: &AttemptRecord,
    d: Decision,
    consecutive: i32,
    failing_since: DateTime<Utc>,
    now: DateTime<Utc>,
    rules: HealthRules,
) -> Option<Disabled> {
    let (reason, rule) = if !health.enabled() {
        return None;
    } else if a.gone() {
        ("the endpoint answered 410 Gone".to_owned(), "gone")
    } else if d.exhausted && consecutive >= rules.failed_deliveries {
        (format!("{consecutive} deliveries in a row failed after every retry"), "failed_deliveries")
    } else if (now - failing_since).num_seconds() >= rules.failing_seconds {
        (format!("no successful delivery for {} h", rules.failing_seconds / 3600), "failing_too_long")
    } else {
        return None;
    };
    Some(Disabled { reason, rule })
}

/// A failure: starts the failure clock, counts a given-up delivery, throttles
/// on 429/503 ([`throttle`]), and disables the endpoint when
/// [`disable_rule`] says so. Runs in [`crate::outcome::record`]'s transaction.
pub async fn after_failure(
    conn: &mut AsyncPgConnection,
    c: &Claimed,
    a: &AttemptRecord,
    health: &EndpointHealth,
    d: Decision,
    now: DateTime<Utc>,
    rules: HealthRules,
) -> QueryResult<Option<Disabled>> {
    let failing_since = health.failing_since.unwrap_or(a.started_at);
    let consecutive = health.consecutive_failures + i32::from(d.exhausted);
    diesel::update(ep::table.filter(ep::id.eq(&c.endpoint_id)))
        .set((ep::failing_since.eq(failing_since), ep::consecutive_failures.eq(consecutive)))
        .execute(conn)
        .await?;
    if a.throttles() {
        throttle(conn, &c.endpoint_id, d.next_at, rules.per_endpoint).await?;
    }
    let disabled = disable_rule(health, a, d, consecutive, failing_since, now, rules);
    if let Some(x) = &disabled {
        disable(conn, &c.tenant_id, &c.endpoint_id, &x.reason).await?;
    }
    Ok(disabled)
}

/// A 429/503: halves the concurrency once per throttle (the answers to the
/// rest of the same burst find the throttle already running), and holds
/// every attempt until `until` (this retry's due time), if any.
async fn throttle(conn: &mut AsyncPgConnection, id: &EndpointId, until: Option<DateTime<Utc>>, per_endpoint: i32) -> QueryResult<usize> {
    diesel::sql_query(
        "UPDATE webhook_endpoints SET \
         concurrency_limit = CASE WHEN throttled_until IS NULL OR throttled_until <= now() \
                                  THEN GREATEST(1, LEAST(COALESCE(concurrency_limit, $3), $3) / 2) \
                                  ELSE concurrency_limit END, \
         throttled_until = CASE WHEN $2::timestamptz IS NULL THEN throttled_until \
                                ELSE GREATEST(COALESCE(throttled_until, $2), $2) END \
         WHERE id = $1",
    )
    .bind::<Text, _>(id)
    .bind::<Nullable<Timestamptz>, _>(until)
    .bind::<Integer, _>(per_endpoint)
    .execute(conn)
    .await
}

/// Disables an endpoint inside the caller's transaction: status, reason and
/// time; its `pending` deliveries become `paused` (kept, not dropped); a
/// `webhook_endpoint.disabled` event is recorded in `events` and delivered to
/// the tenant's other enabled endpoints.
///
/// This is the one place the dispatcher writes `events` (otherwise the api's
/// table): the event is born here, so its deliveries are created directly in
/// the same transaction instead of going through the api's outbox and queue.
pub async fn disable(conn: &mut AsyncPgConnection, tenant_id: &TenantId, endpoint_id: &EndpointId, reason: &str) -> QueryResult<Event> {
    let now = Utc::now();
    diesel::update(ep::table.filter(ep::id.eq(endpoint_id)))
        .set((ep::status.eq(EndpointStatus::Disabled), ep::disabled_reason.eq(reason), ep::disabled_at.eq(now), ep::updated_at.eq(now)))
        .execute(conn)
        .await?;
    diesel::update(dl::table.filter(dl::endpoint_id.eq(endpoint_id)).filter(dl::status.eq(DeliveryStatus::Pending)))
        .set((dl::status.eq(DeliveryStatus::Paused), dl::updated_at.eq(now)))
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
    // The rule of a disabled event (MATCH): the tenant's other enabled endpoints.
    crate::fanin::fan_in(conn, std::slice::from_ref(&event.id)).await?;
    Ok(event)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::decide;

    const RULES: HealthRules = HealthRules { failed_deliveries: 5, failing_seconds: 86_400, per_endpoint: 4 };

    fn failed(status: Option<u16>, retry: bool) -> AttemptRecord {
        AttemptRecord {
            started_at: Utc::now(),
            duration_ms: 1,
            response_status: status,
            error_class: Some("http"),
            error_detail: None,
            response_body: None,
            success: false,
            retry_in: retry.then(|| std::time::Duration::from_secs(5)),
        }
    }

    #[test]
    fn disabling_rules() {
        let now = Utc::now();
        let h = |status| EndpointHealth { status, consecutive_failures: 0, failing_since: None };
        let enabled = h(EndpointStatus::Enabled);
        let rule =
            |a: &AttemptRecord, n, since| disable_rule(&enabled, a, decide(a, false, true, now), n, since, now, RULES).map(|d| d.rule);
        assert_eq!(rule(&failed(Some(410), true), 0, now), Some("gone"));
        assert_eq!(rule(&failed(Some(500), false), 5, now), Some("failed_deliveries"));
        assert_eq!(rule(&failed(Some(500), false), 4, now), None);
        assert_eq!(rule(&failed(Some(500), true), 9, now), None, "only a delivery that gave up counts");
        assert_eq!(rule(&failed(None, true), 0, now - chrono::Duration::hours(24)), Some("failing_too_long"));
        let a = failed(Some(410), true);
        let off = disable_rule(&h(EndpointStatus::Disabled), &a, decide(&a, false, false, now), 0, now, now, RULES);
        assert_eq!(off, None, "a disabled endpoint is not disabled again");
    }
}
