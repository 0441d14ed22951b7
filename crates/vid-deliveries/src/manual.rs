//! The transitions a customer asks for through the api: `:retry` a delivery,
//! `:enable` an endpoint. The dispatcher is notified at commit (trigger
//! `webhook_deliveries_due`) and claims what became due.
//!
//! Both filter on the tenant, so one tenant can never touch another's rows.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use vid_core::{DeliveryId, EndpointId, TenantId};
use vid_db::schema::{webhook_deliveries as dl, webhook_endpoints as ep};
use vid_db::RunQueryDsl;

use crate::read::DeliveryRecord;
use crate::{DeliveryStatus, EndpointStatus};

/// `:retry`: the delivery becomes `pending` and due now. A `failed` or
/// `succeeded` delivery gets exactly one more attempt (`manual_retry`: no
/// retry schedule after it); a `pending` one is only brought forward (and
/// keeps a concurrent `:retry`'s one-shot mark); a `paused` one is resumed.
/// The caller checks that the endpoint is enabled. One statement, answered
/// with the row it wrote (a second read could already show the attempt the
/// dispatcher made meanwhile). `None`: no such delivery of this endpoint
/// and tenant.
pub async fn retry(
    conn: &mut AsyncPgConnection,
    tenant: &TenantId,
    endpoint: &EndpointId,
    delivery: &DeliveryId,
) -> QueryResult<Option<DeliveryRecord>> {
    let target = dl::table.filter(dl::id.eq(delivery)).filter(dl::endpoint_id.eq(endpoint)).filter(dl::tenant_id.eq(tenant));
    let now = Utc::now();
    diesel::update(target)
        .set((
            dl::status.eq(DeliveryStatus::Pending),
            dl::next_attempt_at.eq(now),
            // SQL `SET` expressions read the row from before the update. OR
            // keeps a concurrent `:retry`'s mark: the second of two calls sees
            // `pending` and must not put the delivery back on the schedule.
            dl::manual_retry.eq(dl::manual_retry.or(dl::status.eq_any([DeliveryStatus::Failed, DeliveryStatus::Succeeded]))),
            dl::updated_at.eq(now),
        ))
        .returning(DeliveryRecord::as_returning())
        .get_result(conn)
        .await
        .optional()
}

/// `:enable`, in one transaction. A disabled endpoint becomes enabled with
/// its disabled state, failure counters and throttling cleared
/// (`disabled_reason`, `disabled_at`, `consecutive_failures`,
/// `failing_since`, `throttled_until`, `concurrency_limit`); an enabled one
/// is left as it is (so `:enable` cannot skip a receiver's `Retry-After`).
/// Either way every `paused` delivery of the endpoint becomes `pending`, due
/// now: the backlog kept while it was disabled (or one fanned in while an
/// enable was committing) is delivered. A paused delivery whose lease is
/// still live keeps it: its attempt may still be running (disabling pauses
/// in-flight deliveries too), so it stays in flight, counted against the
/// endpoint's bound, until its holder records the outcome with its token or
/// the lease expires; clearing it would let a claim send it a second time
/// at once and go past the bound. Unleased ones, and those whose lease has
/// expired, become claimable. Returns how many deliveries were resumed. The caller checks that the endpoint exists and
/// is not deleted.
pub async fn enable(conn: &mut AsyncPgConnection, tenant: &TenantId, endpoint: &EndpointId) -> QueryResult<usize> {
    conn.transaction(|conn| {
        async move {
            let now = Utc::now();
            diesel::update(
                ep::table.filter(ep::id.eq(endpoint)).filter(ep::tenant_id.eq(tenant)).filter(ep::status.eq(EndpointStatus::Disabled)),
            )
            .set((
                ep::status.eq(EndpointStatus::Enabled),
                ep::disabled_reason.eq(None::<String>),
                ep::disabled_at.eq(None::<DateTime<Utc>>),
                ep::consecutive_failures.eq(0),
                ep::failing_since.eq(None::<DateTime<Utc>>),
                ep::throttled_until.eq(None::<DateTime<Utc>>),
                ep::concurrency_limit.eq(None::<i32>),
                ep::updated_at.eq(now),
            ))
            .execute(conn)
            .await?;
            let paused = || {
                dl::table
                    .filter(dl::endpoint_id.eq(endpoint))
                    .filter(dl::tenant_id.eq(tenant))
                    .filter(dl::status.eq(DeliveryStatus::Paused))
            };
            // In flight: the lease (the holder's token) stays.
            let in_flight = diesel::update(paused().filter(dl::locked_until.ge(now)))
                .set((dl::status.eq(DeliveryStatus::Pending), dl::next_attempt_at.eq(now), dl::updated_at.eq(now)))
                .execute(conn)
                .await?;
            let at_rest = diesel::update(paused())
                .set((
                    dl::status.eq(DeliveryStatus::Pending),
                    dl::next_attempt_at.eq(now),
                    dl::locked_until.eq(None::<DateTime<Utc>>),
                    dl::updated_at.eq(now),
                ))
                .execute(conn)
                .await?;
            Ok(in_flight + at_rest)
        }
        .scope_boxed()
    })
    .await
}
