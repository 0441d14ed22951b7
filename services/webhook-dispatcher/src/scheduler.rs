//! The scheduler: claims due deliveries from PostgreSQL and runs their attempts.
//!
//! - Woken at once by the fan-in (an in-process [`Notify`]) and by every
//!   finished attempt; otherwise it polls every `idle_poll_ms` (retries that
//!   fall due, other replicas' inserts, the api's `:enable`/`:retry`).
//! - Claims are leases ([`store::claim`]): a crashed replica's deliveries are
//!   retried once its leases expire, and several replicas never run the same
//!   attempt twice.
//! - Per-endpoint concurrency is bounded in the claim itself, so a slow
//!   endpoint holds at most `per_endpoint_concurrency` slots and never blocks
//!   anyone else (no head-of-line blocking); `max_in_flight` bounds the process.
//! - On shutdown it stops claiming, gives in-flight attempts
//!   `shutdown_grace_seconds` to finish, then aborts the rest and releases
//!   their leases so another replica picks them up at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::JoinSet;
use vid_core::endpoint::SignatureFormat;
use vid_core::DeliveryId;
use vid_db::seal::SealingKey;
use vid_webhooks::{Scheme, Secret};

use crate::attempt::{Outcome, Request, Sender};
use crate::retry;
use crate::settings::DispatcherSettings;
use crate::store::{self, AttemptRecord, Claimed, DisableRules};

/// Everything an attempt needs.
pub struct Context {
    /// Database.
    pub db: vid_db::Pool,
    /// HTTP sender (SSRF policy, resolver, TLS, timeouts).
    pub sender: Sender,
    /// Opens endpoint secrets.
    pub sealing_key: SealingKey,
    /// `[dispatcher]` settings.
    pub settings: DispatcherSettings,
    /// Wakes the scheduler.
    pub wake: Arc<Notify>,
}

type Leases = Arc<Mutex<HashMap<DeliveryId, DateTime<Utc>>>>;

/// Runs until `shutdown` turns true, then drains as described in the module docs.
pub async fn run(ctx: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    let s = &ctx.settings;
    let slots = Arc::new(Semaphore::new(s.max_in_flight.max(1) as usize));
    let leases: Leases = Arc::default();
    let mut tasks = JoinSet::new();
    let lease_ms = i64::try_from(s.lease().as_millis()).unwrap_or(i64::MAX);
    loop {
        if *shutdown.borrow() {
            break;
        }
        while tasks.try_join_next().is_some() {}
        let free = slots.available_permits().min(s.batch_size.max(1) as usize);
        let mut claimed_all = false;
        if free > 0 {
            match claim(&ctx, free, lease_ms).await {
                Ok(batch) => {
                    claimed_all = batch.len() == free;
                    for c in batch {
                        let permit = slots.clone().try_acquire_owned().expect("claimed no more than the free slots");
                        leases.lock().unwrap().insert(c.id.clone(), c.locked_until);
                        let ctx = ctx.clone();
                        let leases = leases.clone();
                        tasks.spawn(async move {
                            let id = c.id.clone();
                            run_attempt(&ctx, c).await;
                            leases.lock().unwrap().remove(&id);
                            drop(permit);
                            ctx.wake.notify_one();
                        });
                    }
                }
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "claiming deliveries failed"),
            }
        }
        if claimed_all {
            continue; // more may be due
        }
        tokio::select! {
            _ = ctx.wake.notified() => {}
            _ = tokio::time::sleep(s.idle_poll()) => {}
            _ = shutdown.changed() => {}
        }
    }

    let grace = Duration::from_secs(s.shutdown_grace_seconds);
    tracing::info!(in_flight = tasks.len(), grace_s = grace.as_secs(), "scheduler stopping; draining in-flight attempts");
    let drained = tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    let left: Vec<(DeliveryId, DateTime<Utc>)> = leases.lock().unwrap().drain().collect();
    if !left.is_empty() {
        match ctx.db.get().await {
            Ok(mut conn) => match store::release(&mut conn, &left).await {
                Ok(n) => tracing::info!(released = n, "released leases of unfinished attempts"),
                Err(e) => tracing::warn!(error = %e, "releasing leases failed; they expire on their own"),
            },
            Err(e) => tracing::warn!(error = %e, "releasing leases failed; they expire on their own"),
        }
    }
}

async fn claim(ctx: &Context, limit: usize, lease_ms: i64) -> anyhow::Result<Vec<Claimed>> {
    let mut conn = ctx.db.get().await?;
    let per_endpoint = i32::try_from(ctx.settings.per_endpoint_concurrency.max(1)).unwrap_or(i32::MAX);
    Ok(store::claim(&mut conn, per_endpoint, i32::try_from(limit).unwrap_or(i32::MAX), lease_ms).await?)
}

/// One attempt from claim to record; errors before the HTTP request postpone
/// the delivery, errors after it are retried so the outcome is not lost.
async fn run_attempt(ctx: &Context, c: Claimed) {
    if let Err(e) = attempt(ctx, &c).await {
        tracing::warn!(error = %format!("{e:#}"), delivery_id = %c.id, "attempt could not run; postponing");
        if let Ok(mut conn) = ctx.db.get().await {
            let _ = store::postpone(&mut conn, &c, chrono::Duration::seconds(10)).await;
        }
    }
}

async fn attempt(ctx: &Context, c: &Claimed) -> anyhow::Result<()> {
    let endpoint = {
        let mut conn = ctx.db.get().await?;
        match store::load_endpoint(&mut conn, &c.endpoint_id).await? {
            Some(e) if e.deleted_at.is_none() && e.status == "enabled" => e,
            Some(e) if e.deleted_at.is_none() => {
                store::settle_without_attempt(&mut conn, c, "paused").await?;
                return Ok(());
            }
            _ => {
                store::settle_without_attempt(&mut conn, c, "failed").await?;
                return Ok(());
            }
        }
    };
    let mut secrets = vec![open_secret(&ctx.sealing_key, &endpoint.id, &endpoint.secret_sealed)?];
    if let (Some(sealed), Some(expires)) = (&endpoint.previous_secret_sealed, endpoint.previous_secret_expires_at) {
        if expires > Utc::now() {
            secrets.push(open_secret(&ctx.sealing_key, &endpoint.id, sealed)?);
        }
    }
    let scheme = match SignatureFormat::parse(&endpoint.signature_format).unwrap_or_default() {
        SignatureFormat::WebhookSignature => Scheme::WebhookSignature,
        SignatureFormat::StandardWebhooks => Scheme::StandardWebhooks,
    };
    let started_at = Utc::now();
    let headers = vid_webhooks::signature_headers(scheme, &secrets, c.event_id.as_str(), started_at.timestamp(), c.payload.as_bytes());
    let clock = tokio::time::Instant::now();
    let outcome = ctx
        .sender
        .send(Request { url: endpoint.url.clone(), headers, body: Bytes::from(c.payload.clone()) })
        .await;
    let duration_ms = i32::try_from(clock.elapsed().as_millis()).unwrap_or(i32::MAX);

    let record = to_record(&ctx.settings, c, &outcome, started_at, duration_ms);
    let rules = DisableRules {
        failed_deliveries: ctx.settings.disable_after_failed_deliveries,
        failing_seconds: i64::try_from(ctx.settings.disable_after_failing_seconds).unwrap_or(i64::MAX),
    };
    // The request went out: keep trying to record it until the lease would run out.
    let mut backoff = Duration::from_millis(100);
    for _ in 0..8 {
        let result = async {
            let mut conn = ctx.db.get().await?;
            store::record(&mut conn, c, &record, rules).await
        }
        .await;
        match result {
            Ok(r) => {
                tracing::debug!(delivery_id = %c.id, attempt = c.attempt_number(), status = %r.status, "attempt recorded");
                if r.lease_lost {
                    tracing::warn!(delivery_id = %c.id, "lease lost before the outcome was recorded");
                }
                if let Some(reason) = r.disabled {
                    tracing::warn!(endpoint_id = %c.endpoint_id, %reason, "endpoint disabled");
                    ctx.wake.notify_one();
                }
                return Ok(());
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), delivery_id = %c.id, "recording the attempt failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
    tracing::error!(delivery_id = %c.id, "could not record the attempt; the lease will expire and it will be sent again");
    Ok(())
}

fn open_secret(key: &SealingKey, endpoint: &vid_core::EndpointId, sealed: &[u8]) -> anyhow::Result<Secret> {
    let plain = key.open(endpoint.as_str(), sealed)?;
    let text = String::from_utf8(plain)?;
    Ok(Secret::parse(&text)?)
}

/// Turns an outcome into the row to record, including the next attempt's delay.
fn to_record(s: &DispatcherSettings, c: &Claimed, outcome: &Outcome, started_at: DateTime<Utc>, duration_ms: i32) -> AttemptRecord {
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
        retry::next_delay(&s.retry_schedule_seconds, u32::try_from(c.attempt_number()).unwrap_or(u32::MAX), retry_after, rand::random::<f64>())
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
