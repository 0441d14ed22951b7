//! Fan-in: committed events from RabbitMQ become delivery rows in PostgreSQL.
//!
//! Consumes `P.webhook.events` with manual acks, in batches: every message
//! already received (up to `prefetch`) is taken together, and ONE
//! insert statement (after one read) inserts one delivery per matching endpoint of each event's
//! tenant ([`store::fan_in`]: the events are read from `events`, the
//! endpoints chosen by the one rule `vid_deliveries::fanin::MATCH`); the
//! messages are acked only after the commit, so a crash between the two
//! redelivers them, and `(event_id, endpoint_id)` uniqueness makes the
//! redelivery harmless. The same insert leases as many of the new
//! deliveries as the scheduler has free slots and the per-endpoint bound
//! allows ([`store::fanin::fan_in_leasing`]; issue 22, "claim at fan-in"),
//! and after the commit they go straight to the scheduler
//! ([`Handoff::hand_over`]) without a claim; where this replica holds every
//! lease of an endpoint it leases ahead of the bound too (`lease_ahead`:
//! the leases wait in the scheduler for the endpoint's gate). Each message's `x-correlation-id` is logged as the
//! `correlation_id` field of its `fan_in` span.
//! From then on the schedule lives in PostgreSQL, not in the broker: a
//! RabbitMQ restart loses no pending delivery or scheduled retry.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::AsyncConnection;
use futures::{FutureExt, StreamExt};
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions};
use lapin::types::FieldTable;
use tokio::sync::{watch, Notify};
use vid_core::messages::EventPublished;
use vid_infra::amqp::Topology;
use vid_infra::metrics::counter;
use vid_infra::settings::AmqpSettings;

use vid_deliveries as store;

use crate::scheduler::Handoff;

/// Shared with the health server: true while the consumer is attached.
pub type BrokerUp = Arc<AtomicBool>;

/// Runs the fan-in until `shutdown` turns true: reconnects with capped
/// backoff whenever RabbitMQ or PostgreSQL fails.
pub async fn run(
    db: vid_db::Pool,
    amqp: AmqpSettings,
    prefetch: u16,
    wake: Arc<Notify>,
    handoff: Arc<Handoff>,
    broker_up: BrokerUp,
    mut shutdown: watch::Receiver<bool>,
) {
    const FIRST: Duration = Duration::from_millis(200);
    let mut backoff = FIRST;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let started = std::time::Instant::now();
        let result = session(&db, &amqp, prefetch, &wake, &handoff, &broker_up, &mut shutdown).await;
        broker_up.store(false, Ordering::SeqCst);
        match result {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "fan-in interrupted; reconnecting");
                // A session that ran for a while was healthy: start the backoff afresh.
                if started.elapsed() > Duration::from_secs(30) {
                    backoff = FIRST;
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.changed() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

async fn session(
    db: &vid_db::Pool,
    amqp: &AmqpSettings,
    prefetch: u16,
    wake: &Notify,
    handoff: &Handoff,
    broker_up: &AtomicBool,
    shutdown: &mut watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let conn = vid_infra::amqp::connect(amqp, Duration::from_secs(30)).await?;
    let channel = conn.create_channel().await?;
    let topology = Topology::new(&amqp.prefix);
    topology.declare(&channel).await?;
    channel.basic_qos(prefetch, BasicQosOptions::default()).await?;
    let mut consumer = channel
        .basic_consume(&topology.webhook_events(), "webhook-dispatcher", BasicConsumeOptions::default(), FieldTable::default())
        .await
        .context("consuming webhook events")?;
    broker_up.store(true, Ordering::SeqCst);
    let queue = topology.webhook_events();
    tracing::info!(%queue, "fan-in consuming");
    let max_batch = usize::from(prefetch.max(1));
    loop {
        let first = tokio::select! {
            d = consumer.next() => d,
            _ = shutdown.changed() => {
                // Unacked messages go back to the queue when the channel closes.
                let _ = channel.close(200, "shutting down").await;
                let _ = conn.close(200, "shutting down").await;
                return Ok(());
            }
        };
        let Some(first) = first else { anyhow::bail!("consumer stream ended") };
        // Whatever else has already arrived joins this batch (no waiting).
        let mut batch = vec![first?];
        while batch.len() < max_batch {
            match consumer.next().now_or_never() {
                Some(Some(d)) => batch.push(d?),
                Some(None) => anyhow::bail!("consumer stream ended"),
                None => break,
            }
        }
        handle_batch(db, &channel, &queue, batch, wake, handoff).await?;
    }
}

/// One batch of consumed messages: malformed ones are rejected (without
/// requeue: they would fail forever); the others' deliveries are inserted in
/// ONE insert statement, and only after its commit are the messages acked (one
/// `basic.ack` with `multiple`); if the fan-in fails they are all
/// requeued. The deliveries leased by the insert are handed to the
/// scheduler after the commit. Counts every message in `amqp_messages_consumed_total{queue,outcome}`.
async fn handle_batch(
    db: &vid_db::Pool,
    channel: &lapin::Channel,
    queue: &str,
    batch: Vec<lapin::message::Delivery>,
    wake: &Notify,
    handoff: &Handoff,
) -> anyhow::Result<()> {
    let mut messages = Vec::with_capacity(batch.len());
    let mut spans = Vec::with_capacity(batch.len());
    let mut last_tag = None;
    for delivery in &batch {
        let correlation_id = vid_infra::amqp::correlation_id(&delivery.properties);
        let span =
            tracing::info_span!("fan_in", correlation_id = correlation_id.as_deref().unwrap_or(""), event_id = tracing::field::Empty);
        match serde_json::from_slice::<EventPublished>(&delivery.data) {
            Ok(m) => {
                span.record("event_id", m.event.id.as_str());
                messages.push(m);
                spans.push(span);
                last_tag = Some(delivery.delivery_tag);
            }
            Err(e) => {
                span.in_scope(|| tracing::error!(error = %e, "rejecting malformed EventPublished message"));
                delivery.reject(BasicRejectOptions { requeue: false }).await?;
                counter!("amqp_messages_consumed_total", "queue" => queue.to_owned(), "outcome" => "reject").increment(1);
            }
        }
    }
    let Some(last_tag) = last_tag else { return Ok(()) };
    let n = messages.len() as u64;
    match fan_in_leasing(db, &messages, handoff).await {
        Ok((inserted, leased)) => {
            let leased_n = leased.len();
            counter!("webhook_deliveries_leased_total", "by" => "fanin").increment(leased_n as u64);
            if let Err(back) = handoff.hand_over(leased.0, leased.1, leased.2) {
                release(db, &back).await;
            }
            if inserted > leased_n {
                wake.notify_one();
            }
            channel.basic_ack(last_tag, BasicAckOptions { multiple: true }).await?;
            counter!("amqp_messages_consumed_total", "queue" => queue.to_owned(), "outcome" => "ack").increment(n);
            for (m, span) in messages.iter().zip(&spans) {
                span.in_scope(|| tracing::debug!(event_id = %m.event.id, "fanned in"));
            }
        }
        Err(e) => {
            for span in &spans {
                span.in_scope(|| tracing::warn!(error = %format!("{e:#}"), "fan-in failed; requeueing"));
            }
            channel.basic_nack(last_tag, BasicNackOptions { multiple: true, requeue: true }).await?;
            counter!("amqp_messages_consumed_total", "queue" => queue.to_owned(), "outcome" => "requeue").increment(n);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    Ok(())
}

/// The fan-in's leases: the deliveries with their endpoints, the reserved
/// places (at least one each), and an `Instant` taken before the leasing
/// statement was sent ([`Handoff::hand_over`]).
struct Leased(Vec<store::ClaimedForSend>, Vec<crate::scheduler::Place>, std::time::Instant);

impl Leased {
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// [`fan_in_batch`], leasing what fits into the places reserved from
/// `handoff` once the new deliveries are known
/// ([`store::fanin::fan_in_leasing`]). Returns how many deliveries were new
/// and the leased ones with their places (valid only because the
/// insert committed). When leasing ahead of the bound it holds
/// [`Handoff::lease_ends`] exclusively (before taking a connection, as every
/// holder of it does) until the insert committed, so no lease of this
/// process that the insert's count took as its own ends meanwhile.
async fn fan_in_leasing(db: &vid_db::Pool, messages: &[EventPublished], handoff: &Handoff) -> anyhow::Result<(usize, Leased)> {
    let ids: Vec<vid_core::EventId> = messages.iter().map(|m| m.event.id.clone()).collect();
    let ends = handoff.lease_ends();
    let _ends = if handoff.leases_ahead() { Some(ends.write().await) } else { None };
    let mut conn = db.get().await?;
    let mut permits = Vec::new();
    let sent_at = std::time::Instant::now();
    // Autocommit: the insert and its leases are one statement, committed together.
    let (done, leased) = store::fanin::fan_in_leasing(&mut conn, &ids, |pending| {
        if !handoff.leases_at_fanin() {
            return None;
        }
        permits = handoff.reserve(pending);
        Some(handoff.lease(&permits))
    })
    .await?;
    permits.truncate(leased.len());
    Ok((done.deliveries, Leased(leased, permits, sent_at)))
}

/// Gives back leases the scheduler could not take (it is draining).
async fn release(db: &vid_db::Pool, claimed: &[store::Claimed]) {
    if let Err(e) = crate::scheduler::give_back(db, claimed).await {
        tracing::warn!(error = %format!("{e:#}"), "releasing fanned-in leases failed; they expire on their own");
    }
}

/// Inserts the deliveries of one event, in one transaction. Returns how many were new.
pub async fn fan_in(db: &vid_db::Pool, message: &EventPublished) -> anyhow::Result<usize> {
    fan_in_batch(db, std::slice::from_ref(message)).await
}

/// Inserts the deliveries of many events, in one transaction
/// ([`store::fan_in`]: the event is read from `events`, the one matching
/// rule applies). Returns how many were new.
pub async fn fan_in_batch(db: &vid_db::Pool, messages: &[EventPublished]) -> anyhow::Result<usize> {
    let ids: Vec<vid_core::EventId> = messages.iter().map(|m| m.event.id.clone()).collect();
    let mut conn = db.get().await?;
    let done = conn.transaction::<_, diesel::result::Error, _>(|conn| async move { store::fan_in(conn, &ids).await }.scope_boxed()).await?;
    Ok(done.deliveries)
}
