//! Reconciliation task: at start-up and every `reconcile_interval_seconds`,
//! events recorded in PostgreSQL that lack a delivery for a matching endpoint
//! get it ([`vid_deliveries::reconcile::pass`]), so a message lost by
//! RabbitMQ (purged queue, reset broker) still becomes a delivery.
//!
//! Metrics: `events_reconciled_total` (events that lacked deliveries and got
//! them: 0 on a healthy system), `webhook_deliveries_reconciled_total`
//! (their rows), `events_reconcile_last_success_timestamp_seconds` (Unix
//! time of the last completed pass: alert when it falls behind), and
//! `events_reconcile_mark_lag_seconds` (now minus the high-water mark: grace
//! plus at most one interval when healthy).

use std::time::Duration;

use tokio::sync::{watch, Notify};
use vid_deliveries::reconcile::{pass, Pass, Window};
use vid_infra::metrics::{counter, gauge};

/// Runs a pass now and then every `every`, until `shutdown` turns true. A
/// failed pass is logged and retried at the next tick (committed batches stay).
pub async fn run(db: vid_db::Pool, window: Window, every: Duration, wake: std::sync::Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
    loop {
        match once(&db, window).await {
            Ok(p) => {
                if p.deliveries > 0 {
                    tracing::warn!(
                        events = p.events.len(),
                        deliveries = p.deliveries,
                        first = %p.events.first().map(|e| e.as_str()).unwrap_or(""),
                        "reconciled events whose deliveries were missing (a lost message)"
                    );
                    wake.notify_one();
                }
            }
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "event reconciliation failed; retrying at the next interval"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// One pass with its metrics.
pub async fn once(db: &vid_db::Pool, window: Window) -> anyhow::Result<Pass> {
    let mut conn = db.get().await?;
    let p = pass(&mut conn, window).await?;
    counter!("events_reconciled_total").increment(p.events.len() as u64);
    counter!("webhook_deliveries_reconciled_total").increment(p.deliveries as u64);
    let now = chrono::Utc::now();
    gauge!("events_reconcile_last_success_timestamp_seconds").set(now.timestamp_millis() as f64 / 1000.0);
    if let Some(mark) = p.mark {
        gauge!("events_reconcile_mark_lag_seconds").set((now - mark).num_milliseconds() as f64 / 1000.0);
    }
    Ok(p)
}
