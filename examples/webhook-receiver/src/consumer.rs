//! The consumer: applies each queued event once, in one transaction with its seen id.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use serde::Serialize;

use crate::db::{self, Pool};
use crate::event::{Envelope, Outcome};
use crate::queue::declare_queue;

/// Where and how to consume.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    /// RabbitMQ server.
    pub amqp_url: String,
    /// The queue the handler publishes to.
    pub queue: String,
    /// Unacknowledged messages RabbitMQ may hand out at once.
    pub prefetch: u16,
    /// **Test hook.** After the first event's transaction commits, close the
    /// connection without acknowledging and return
    /// [`ConsumerExit::SimulatedCrash`]: the same as the process dying between
    /// the commit and the ack. RabbitMQ then redelivers the message.
    pub crash_after_commit: bool,
}

impl ConsumerOptions {
    /// Options from the receiver's [`Config`](crate::Config), without the test hook.
    pub fn from_config(config: &crate::Config) -> Self {
        Self { amqp_url: config.amqp_url.clone(), queue: config.queue.clone(), prefetch: config.prefetch, crash_after_commit: false }
    }
}

/// Why [`consume`] returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumerExit {
    /// The broker ended the subscription (queue deleted, connection closed).
    StreamEnded,
    /// [`ConsumerOptions::crash_after_commit`] fired after committing this event.
    SimulatedCrash {
        /// The event whose message was left unacknowledged.
        event_id: String,
    },
}

/// Counters of what the consumer did, shared with `GET /events` and tests.
#[derive(Debug, Default)]
pub struct ConsumerStats {
    /// Messages received (including redeliveries).
    pub received: AtomicU64,
    /// Messages RabbitMQ marked as redelivered.
    pub redelivered: AtomicU64,
    /// Events whose effect was applied.
    pub applied: AtomicU64,
    /// Events already recorded: acknowledged, nothing done.
    pub duplicates: AtomicU64,
    /// `video.*` events not newer than the stored state.
    pub stale: AtomicU64,
    /// Events recorded with no effect (other types, or unusable `data`).
    pub ignored: AtomicU64,
    /// Messages that are not events at all: rejected without requeue.
    pub rejected: AtomicU64,
    /// Database failures: the message was requeued.
    pub requeued: AtomicU64,
}

/// A point-in-time copy of [`ConsumerStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[allow(missing_docs)]
pub struct StatsSnapshot {
    pub received: u64,
    pub redelivered: u64,
    pub applied: u64,
    pub duplicates: u64,
    pub stale: u64,
    pub ignored: u64,
    pub rejected: u64,
    pub requeued: u64,
}

impl ConsumerStats {
    /// Reads every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            received: get(&self.received),
            redelivered: get(&self.redelivered),
            applied: get(&self.applied),
            duplicates: get(&self.duplicates),
            stale: get(&self.stale),
            ignored: get(&self.ignored),
            rejected: get(&self.rejected),
            requeued: get(&self.requeued),
        }
    }

    fn count(&self, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Applied => &self.applied,
            Outcome::Duplicate => &self.duplicates,
            Outcome::Stale => &self.stale,
            Outcome::Ignored | Outcome::Invalid => &self.ignored,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Consumes the queue until the subscription ends or the connection fails.
///
/// For each message, in order: parse the event; in **one** transaction
/// insert its id into `seen_events` if absent (if present: commit nothing,
/// just ack) and apply its effect; commit; then ack. A database error nacks
/// the message with requeue after a short pause, so it is retried; a message
/// that is not an event is rejected without requeue.
///
/// # Errors
///
/// Connecting, subscribing, or acknowledging failed (a broker problem); the
/// caller reconnects, as [`run_consumer`] does.
pub async fn consume(pool: &Pool, options: &ConsumerOptions, stats: &ConsumerStats) -> anyhow::Result<ConsumerExit> {
    let conn = Connection::connect(&options.amqp_url, ConnectionProperties::default()).await.context("connecting to RabbitMQ")?;
    let channel = conn.create_channel().await?;
    declare_queue(&channel, &options.queue).await?;
    channel.basic_qos(options.prefetch, BasicQosOptions::default()).await?;
    let mut deliveries = channel
        .basic_consume(&options.queue, "webhook-receiver", BasicConsumeOptions::default(), FieldTable::default())
        .await
        .with_context(|| format!("subscribing to {}", options.queue))?;
    tracing::info!(queue = %options.queue, "consumer subscribed");

    let mut db_backoff = Duration::from_millis(200);
    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery.context("receiving from RabbitMQ")?;
        stats.received.fetch_add(1, Ordering::Relaxed);
        if delivery.redelivered {
            stats.redelivered.fetch_add(1, Ordering::Relaxed);
        }
        match process(pool, &delivery).await {
            Processed::Done { event_id, outcome } => {
                db_backoff = Duration::from_millis(200);
                stats.count(outcome);
                tracing::info!(event_id, outcome = outcome.as_str(), redelivered = delivery.redelivered, "event processed");
                if options.crash_after_commit {
                    // Simulated crash: the effect is committed, the ack never sent.
                    conn.close(0, "simulated crash after commit").await.ok();
                    return Ok(ConsumerExit::SimulatedCrash { event_id });
                }
                delivery.ack(BasicAckOptions::default()).await.context("acknowledging")?;
            }
            Processed::NotAnEvent => {
                stats.rejected.fetch_add(1, Ordering::Relaxed);
                tracing::error!(message_id = ?delivery.properties.message_id(), "queued message is not an event; rejecting it");
                delivery.reject(BasicRejectOptions { requeue: false }).await.context("rejecting")?;
            }
            Processed::DbError(error) => {
                stats.requeued.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %error, retry_in_ms = db_backoff.as_millis() as u64, "database error; requeueing the event");
                // Pause so a database outage does not spin the message through the broker.
                tokio::time::sleep(db_backoff).await;
                db_backoff = (db_backoff * 2).min(Duration::from_secs(10));
                delivery.nack(BasicNackOptions { requeue: true, ..Default::default() }).await.context("requeueing")?;
            }
        }
    }
    Ok(ConsumerExit::StreamEnded)
}

/// Runs [`consume`] forever, reconnecting with capped exponential backoff
/// whenever RabbitMQ is unreachable or the subscription ends.
pub async fn run_consumer(pool: Pool, options: ConsumerOptions, stats: std::sync::Arc<ConsumerStats>) {
    let mut delay = Duration::from_millis(500);
    loop {
        let started = tokio::time::Instant::now();
        match consume(&pool, &options, &stats).await {
            Ok(exit) => tracing::warn!(?exit, "consumer stopped; restarting"),
            Err(error) => {
                tracing::warn!(error = format!("{error:#}"), "consumer failed; restarting")
            }
        }
        if started.elapsed() > Duration::from_secs(60) {
            delay = Duration::from_millis(500);
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

enum Processed {
    Done { event_id: String, outcome: Outcome },
    NotAnEvent,
    DbError(anyhow::Error),
}

async fn process(pool: &Pool, delivery: &Delivery) -> Processed {
    let Some(event) = Envelope::parse(&delivery.data) else {
        return Processed::NotAnEvent;
    };
    let effect = event.effect();
    let mut conn = match pool.get().await {
        Ok(conn) => conn,
        Err(e) => return Processed::DbError(e.into()),
    };
    match db::record_and_apply(&mut conn, &event.id, &event.type_, &effect).await {
        Ok(outcome) => Processed::Done { event_id: event.id, outcome },
        Err(e) => Processed::DbError(e.into()),
    }
}
