//! The delivery log: `GET /webhook-endpoints/{id}/deliveries` and `:retry`.
//!
//! A delivery is one event to one endpoint; its attempts are the HTTP tries.
//! The transitions between [`DeliveryStatus`] values are owned by the
//! `vid-deliveries` crate (the dispatcher and the api both go through it).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{DeliveryId, EndpointId, EventId};

text_state! {
    /// Where a delivery stands (`webhook_deliveries.status`; the same spelling
    /// on the wire, in the database and in the `status` filter of the delivery log).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    #[serde(rename_all = "snake_case")]
    pub enum DeliveryStatus {
        /// Waiting for its next attempt (due at `next_attempt_at`), or being attempted (leased).
        Pending = "pending",
        /// An attempt got a 2xx.
        Succeeded = "succeeded",
        /// Every retry was used (or a manual retry failed, or the endpoint was deleted).
        Failed = "failed",
        /// Kept while its endpoint is disabled; `:enable` makes it `pending` again.
        Paused = "paused",
    }
}

/// One HTTP try, as the delivery log shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptView {
    /// 1-based.
    pub attempt_number: i32,
    /// When it ran (RFC 3339).
    pub started_at: DateTime<Utc>,
    /// How long it took, in ms.
    pub duration_ms: i32,
    /// The HTTP status, if the endpoint answered.
    pub response_status: Option<i32>,
    /// `dns`, `connect`, `timeout`, `tls`, `blocked_address`, `redirect` or `http`; `null` on success.
    pub error_class: Option<String>,
    /// Details of the error (e.g. the refused address, the redirect target).
    pub error_detail: Option<String>,
    /// The first 1 KiB of the response body.
    pub response_body: Option<String>,
    /// When the next attempt was scheduled; `null` if none.
    pub next_attempt_at: Option<DateTime<Utc>>,
}

/// One event to one endpoint, with its attempts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveryView {
    /// `dlv_…`
    pub id: DeliveryId,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The event (also the `Webhook-Id`).
    pub event_id: EventId,
    /// The event type.
    pub event_type: String,
    /// `pending`, `succeeded`, `failed` or `paused`.
    pub status: DeliveryStatus,
    /// Attempts made.
    pub attempt_count: i32,
    /// When the next attempt is due, if pending.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When the last attempt ran.
    pub last_attempt_at: Option<DateTime<Utc>>,
    /// When the delivery was created.
    pub created_at: DateTime<Utc>,
    /// Oldest first.
    pub attempts: Vec<AttemptView>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_on_the_wire() {
        for &s in DeliveryStatus::ALL {
            assert_eq!(DeliveryStatus::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        assert_eq!(DeliveryStatus::parse("bogus"), None);
        assert_eq!(DeliveryStatus::parse("Pending"), None);
    }
}
