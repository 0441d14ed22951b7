//! Reads that go with the transitions: what an attempt needs to know about
//! its endpoint, the retry backlog, and a delivery row as the log shows it.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::AsyncPgConnection;
use vid_core::{DeliveryId, EndpointId, EventId};
use vid_db::schema::{webhook_deliveries as dl, webhook_endpoints as ep};
use vid_db::RunQueryDsl;

use crate::{DeliveryStatus, EndpointStatus};

/// What the attempt needs to know about the endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable)]
#[diesel(table_name = ep)]
pub struct EndpointForSend {
    /// `ep_…`
    pub id: EndpointId,
    /// URL as registered.
    pub url: String,
    /// `webhook-signature` or `standard-webhooks`.
    pub signature_format: String,
    /// Whether deliveries are attempted.
    pub status: EndpointStatus,
    /// Set when deleted.
    pub deleted_at: Option<DateTime<Utc>>,
    /// Current secret, sealed with the endpoint id as context.
    pub secret_sealed: Vec<u8>,
    /// Previous secret during a rotation overlap.
    pub previous_secret_sealed: Option<Vec<u8>>,
    /// End of the rotation overlap.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
}

/// Loads several endpoints for sending, in one query: the dispatcher reads
/// again, before settling on them, the endpoints a leasing statement's
/// snapshot showed missing, disabled or deleted. Ids that do not exist are
/// simply missing from the result.
pub async fn load_endpoints(conn: &mut AsyncPgConnection, ids: &[EndpointId]) -> QueryResult<Vec<EndpointForSend>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    ep::table.filter(ep::id.eq_any(ids)).select(EndpointForSend::as_select()).load(conn).await
}

/// How many deliveries wait for a retry: `pending` with a next attempt in the
/// future (the `webhook_retry_backlog` gauge). Such a delivery is never
/// leased (a claim takes only due ones and keeps their due time), so this
/// counts on the claim's partial index `webhook_deliveries_claimable`
/// (pending, unleased): one index-only scan, no index of its own.
pub async fn retry_backlog(conn: &mut AsyncPgConnection) -> QueryResult<i64> {
    dl::table
        .filter(dl::status.eq(DeliveryStatus::Pending))
        .filter(dl::locked_until.is_null())
        .filter(dl::next_attempt_at.gt(diesel::dsl::now))
        .count()
        .get_result(conn)
        .await
}

/// A delivery row as the delivery log shows it (without payload or lease).
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = dl)]
pub struct DeliveryRecord {
    /// `dlv_…`
    pub id: DeliveryId,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The event.
    pub event_id: EventId,
    /// The event type (`video.ready`, …).
    pub event_type: String,
    /// Where it stands.
    pub status: DeliveryStatus,
    /// Attempts made.
    pub attempt_count: i32,
    /// When the next attempt is due.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When the last attempt ran.
    pub last_attempt_at: Option<DateTime<Utc>>,
    /// When the delivery was created.
    pub created_at: DateTime<Utc>,
}
