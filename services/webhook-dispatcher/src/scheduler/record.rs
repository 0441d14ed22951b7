//! What a finished attempt leaves behind: the row to record ([`to_record`],
//! with the next attempt's delay) and the recorder task that writes them.
//!
//! Successes are written in batches, one statement each
//! ([`store::record_successes`]); failures one transaction each
//! ([`store::record`], which also runs the disabling rules), concurrently,
//! so a failing endpoint's bookkeeping never queues anyone's successes.
//! Every write is retried with backoff until the lease would run out; one
//! that never lands leaves its lease to expire, and the delivery is sent
//! again (at least once, never lost). A recorded attempt frees its
//! in-process slot and its entry in the lease book, and wakes the loop.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::task::JoinSet;
use vid_infra::metrics::counter;

use super::context::{per_endpoint, Context, GateHold, Leases, Place};
use crate::attempt::Outcome;
use crate::retry;
use crate::settings::DispatcherSettings;
use vid_deliveries::{self as store, AttemptRecord, Claimed, HealthRules};

/// At most this many finished attempts are recorded per statement.
const RECORD_BATCH: usize = 512;

/// A finished attempt on its way to the recorder, with the in-process slot
/// it holds until its outcome is recorded.
pub(super) struct Done {
    pub(super) claimed: Claimed,
    pub(super) record: AttemptRecord,
    /// The lease's place, and the slot its attempt took (a lease the fan-in took).
    pub(super) _permit: (Place, Option<OwnedSemaphorePermit>),
    /// A failed attempt's hold on its endpoint's gate, released once recorded.
    pub(super) gate: Option<GateHold>,
}

/// Writes finished attempts as the module docs say. Ends when every sender
/// is gone and everything queued is written. One batch of successes is
/// written at a time: a second concurrent writer was measured slower
/// (issue 22, BENCHMARKS.md).
pub(super) async fn recorder(ctx: Arc<Context>, mut rx: mpsc::UnboundedReceiver<Done>, leases: Leases) {
    let mut failures = JoinSet::new();
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < RECORD_BATCH {
            match rx.try_recv() {
                Ok(d) => batch.push(d),
                Err(_) => break,
            }
        }
        while failures.try_join_next().is_some() {}
        let (ok, failed): (Vec<Done>, Vec<Done>) = batch.into_iter().partition(|d| d.record.success);
        for d in failed {
            let (ctx, leases) = (ctx.clone(), leases.clone());
            failures.spawn(async move {
                let mut d = d;
                let ends = ctx.lease_ends.read().await;
                record_failure(&ctx, &d.claimed, &d.record).await;
                leases.lock().unwrap().forget(&d.claimed);
                drop(ends);
                drop(d.gate.take()); // lifts a block it holds
                drop(d);
                ctx.wake.notify_one();
            });
        }
        if !ok.is_empty() {
            let _ends = ctx.lease_ends.read().await;
            record_successes(&ctx, &ok).await;
            let mut l = leases.lock().unwrap();
            for d in &ok {
                l.forget(&d.claimed);
            }
        }
        drop(ok); // frees the slots
        ctx.wake.notify_one();
    }
    while failures.join_next().await.is_some() {}
}

/// Runs `write` up to 8 times, backing off from 100 ms to at most 5 s
/// between tries (about 20 s in all, inside any lease); `Some` with its
/// value once it succeeds, `None` when every try failed (each logged with
/// `what`).
async fn retrying<T, F, Fut>(what: &str, mut write: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let mut backoff = Duration::from_millis(100);
    for _ in 0..8 {
        match write().await {
            Ok(v) => return Some(v),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "recording {what} failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
    None
}

/// The requests went out: keep trying to record them until the lease would run out.
async fn record_successes(ctx: &Context, ok: &[Done]) {
    let rows: Vec<(Claimed, AttemptRecord)> = ok.iter().map(|d| (d.claimed.clone(), d.record.clone())).collect();
    let written = retrying("successful attempts", || async {
        let mut conn = ctx.db.get().await?;
        anyhow::Ok(store::record_successes(&mut conn, &rows, per_endpoint(ctx)).await?)
    })
    .await;
    match written {
        Some(updated) => {
            if updated < rows.len() {
                tracing::warn!(lost = rows.len() - updated, "leases lost before the outcomes were recorded");
            }
            tracing::debug!(recorded = rows.len(), "successful attempts recorded");
        }
        None => tracing::error!(n = rows.len(), "could not record the attempts; their leases will expire and they will be sent again"),
    }
}

/// Records one failed attempt (and its consequences); retried like [`record_successes`].
async fn record_failure(ctx: &Context, c: &Claimed, record: &AttemptRecord) {
    let rules = HealthRules {
        failed_deliveries: ctx.settings.disable_after_failed_deliveries,
        failing_seconds: i64::try_from(ctx.settings.disable_after_failing_seconds).unwrap_or(i64::MAX),
        per_endpoint: per_endpoint(ctx),
    };
    let written = retrying(&format!("the attempt of {}", c.id), || async {
        let mut conn = ctx.db.get().await?;
        store::record(&mut conn, c, record, rules).await
    })
    .await;
    let Some(r) = written else {
        tracing::error!(delivery_id = %c.id, "could not record the attempt; the lease will expire and it will be sent again");
        return;
    };
    tracing::debug!(delivery_id = %c.id, attempt = c.attempt_number(), status = %r.status, "attempt recorded");
    if r.lease_lost {
        tracing::warn!(delivery_id = %c.id, "lease lost before the outcome was recorded");
    }
    if let Some(reason) = r.disabled {
        tracing::warn!(endpoint_id = %c.endpoint_id, %reason, "endpoint disabled");
        counter!("webhook_endpoints_disabled_total", "reason" => r.disabled_rule.unwrap_or("other")).increment(1);
        // Whatever the attempt's answer (the failing-too-long rule disables on
        // any failure): the leases waiting at its gate are not sent.
        ctx.gates.enter(&c.endpoint_id).clear();
    }
}

/// Turns an outcome into the row to record, including the next attempt's delay.
pub(super) fn to_record(
    s: &DispatcherSettings,
    c: &Claimed,
    outcome: &Outcome,
    started_at: DateTime<Utc>,
    duration_ms: i32,
) -> AttemptRecord {
    let (response_status, error_detail, response_body, retry_after) = match outcome {
        Outcome::Answered(a) => {
            let detail = match (&a.location, a.status) {
                (Some(loc), 300..=399) => Some(format!("redirect to {loc} not followed")),
                _ => None,
            };
            let retry_after = a.retry_after.as_deref().and_then(|v| retry::parse_retry_after(v, std::time::SystemTime::now()));
            (Some(a.status), detail, Some(a.body.clone()), retry_after)
        }
        Outcome::Failed { detail, .. } => (None, Some(detail.clone()), None, None),
    };
    let success = outcome.is_success();
    let retry_in = if success {
        None
    } else {
        retry::next_delay(
            &s.retry_schedule_seconds,
            u32::try_from(c.attempt_number()).unwrap_or(u32::MAX),
            retry_after,
            rand::random::<f64>(),
        )
    };
    AttemptRecord {
        started_at,
        duration_ms,
        response_status,
        error_class: outcome.error_class().map(|c| c.as_str()),
        error_detail,
        response_body,
        success,
        retry_in,
    }
}
