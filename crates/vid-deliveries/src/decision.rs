//! The pure part of recording an attempt: what an attempt was
//! ([`AttemptRecord`]), the rules of an endpoint's health ([`HealthRules`]),
//! and the delivery's next state ([`decide`]). A leaf: no SQL, no other module
//! of this crate, so `outcome` and `health` both build on it.

use chrono::{DateTime, Utc};
use vid_core::delivery::DeliveryStatus;

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
    /// The delay before the next attempt (the dispatcher's retry schedule);
    /// `None` when no retry is left.
    pub retry_in: Option<std::time::Duration>,
}

impl AttemptRecord {
    /// `410 Gone`: the endpoint asks to be disabled.
    pub fn gone(&self) -> bool {
        self.response_status == Some(410)
    }

    /// `429`/`503`: the endpoint asks to be slowed down.
    pub fn throttles(&self) -> bool {
        matches!(self.response_status, Some(429 | 503))
    }
}

/// Rules for an endpoint's health: when to disable it, and the concurrency
/// it returns to after a 429/503 slow-down.
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

/// The delivery's next state after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// New status.
    pub status: DeliveryStatus,
    /// When the next attempt is due (a scheduled retry), else `None`.
    pub next_at: Option<DateTime<Utc>>,
    /// The retries are used up: the delivery gave up (counts towards disabling).
    pub exhausted: bool,
}

/// The transition of one attempt's outcome (pure):
/// - 2xx → `succeeded`;
/// - a manual retry's attempt failed → `failed` (one attempt only);
/// - 410 → `paused` (the endpoint is being disabled);
/// - a retry is left → `pending` due at `now + retry_in` (`paused`, with
///   that due time kept, if the endpoint is no longer enabled);
/// - none left → `failed`, `exhausted`.
pub fn decide(a: &AttemptRecord, manual_retry: bool, endpoint_enabled: bool, now: DateTime<Utc>) -> Decision {
    let settle = |status| Decision { status, next_at: None, exhausted: false };
    if a.success {
        settle(DeliveryStatus::Succeeded)
    } else if manual_retry {
        settle(DeliveryStatus::Failed)
    } else if a.gone() {
        settle(DeliveryStatus::Paused)
    } else {
        match a.retry_in {
            Some(d) => Decision {
                status: if endpoint_enabled { DeliveryStatus::Pending } else { DeliveryStatus::Paused },
                next_at: Some(now + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::hours(1))),
                exhausted: false,
            },
            None => Decision { status: DeliveryStatus::Failed, next_at: None, exhausted: true },
        }
    }
}
