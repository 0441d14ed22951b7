//! The consumer: applies each queued event once, in one transaction with its seen id.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, BasicRejectOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use serde::Serialize;

use crate::db::{self, Pool};
use crate::event::{Effect, Envelope, Outcome};
use crate::queue::{dead_letter_queue, declare_queue};

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
    /// Messages that are not events at all: rejected to the dead-letter queue.
    pub rejected: AtomicU64,
    /// Retries after a transient database failure (the message stays
    /// unacknowledged and is retried in-process, never requeued).
    pub retried: AtomicU64,
    /// Events that can never be stored: rejected to the dead-letter queue.
    pub dead_lettered: AtomicU64,
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
    pub retried: u64,
    pub dead_lettered: u64,
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
            retried: get(&self.retried),
            dead_lettered: get(&self.dead_lettered),
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
/// just ack) and apply its effect; commit; then ack. A transient database
/// error pauses the consumer and retries the event in-process with capped
/// backoff ([`RETRY_BACKOFF_START`]..[`RETRY_BACKOFF_MAX`]), the message kept
/// unacknowledged so no delivery attempt is spent. A message that is not an
/// event, or an event that can never be stored (a data or integrity error),
/// is logged at ERROR and rejected without requeue, so RabbitMQ moves it to
/// the dead-letter queue `<queue>.dead`.
///
/// # Errors
///
/// Connecting, subscribing, or acknowledging failed (a broker problem); the
/// caller reconnects, as [`run_consumer`] does.
pub async fn consume(pool: &Pool, options: &ConsumerOptions, stats: &ConsumerStats) -> anyhow::Result<ConsumerExit> {
    let conn = Connection::connect(&options.amqp_url, ConnectionProperties::default()).await.context("connecting to RabbitMQ")?;
    let channel = conn.create_channel().await?;
    declare_queue(&channel, &options.queue).await.with_context(|| {
        format!("declaring {} (PRECONDITION_FAILED: it exists with other arguments; see the README, Upgrading)", options.queue)
    })?;
    channel.basic_qos(options.prefetch, BasicQosOptions::default()).await?;
    let mut deliveries = channel
        .basic_consume(&options.queue, "webhook-receiver", BasicConsumeOptions::default(), FieldTable::default())
        .await
        .with_context(|| format!("subscribing to {}", options.queue))?;
    tracing::info!(queue = %options.queue, "consumer subscribed");

    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery.context("receiving from RabbitMQ")?;
        stats.received.fetch_add(1, Ordering::Relaxed);
        if delivery.redelivered {
            stats.redelivered.fetch_add(1, Ordering::Relaxed);
        }
        // A transient database failure is retried here, the message kept
        // unacknowledged: nack-requeue would spend one of the queue's
        // deliveries each time (quorum queues drop or dead-letter a message
        // past their delivery limit). The consumer takes nothing new meanwhile.
        let mut db_backoff = RETRY_BACKOFF_START;
        let processed = loop {
            match process(pool, &delivery).await {
                Processed::TransientDbError { event_id, error } => {
                    stats.retried.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        event_id,
                        error = format!("{error:#}"),
                        retry_in_ms = db_backoff.as_millis() as u64,
                        "database error; retrying the event (consumer paused, message kept unacknowledged)"
                    );
                    tokio::time::sleep(db_backoff).await;
                    db_backoff = (db_backoff * 2).min(RETRY_BACKOFF_MAX);
                }
                other => break other,
            }
        };
        match processed {
            Processed::Done { event_id, outcome } => {
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
                tracing::error!(message_id = ?delivery.properties.message_id(), dead_letter_queue = %dead_letter_queue(&options.queue), "queued message is not an event; dead-lettering it");
                delivery.reject(BasicRejectOptions { requeue: false }).await.context("rejecting")?;
            }
            Processed::PermanentError { event_id, error } => {
                stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    event_id,
                    error = format!("{error:#}"),
                    dead_letter_queue = %dead_letter_queue(&options.queue),
                    "the event can never be stored; dead-lettering it"
                );
                delivery.reject(BasicRejectOptions { requeue: false }).await.context("rejecting")?;
            }
            Processed::TransientDbError { .. } => unreachable!("retried above"),
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

/// First pause before retrying an event after a transient database error.
pub const RETRY_BACKOFF_START: Duration = Duration::from_millis(200);
/// Longest pause between retries of an event after transient database errors.
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(10);

enum Processed {
    Done {
        event_id: String,
        outcome: Outcome,
    },
    NotAnEvent,
    /// Worth retrying: the database is unreachable, slow, or restarting.
    TransientDbError {
        event_id: String,
        error: anyhow::Error,
    },
    /// Retrying cannot help: the event's data is not storable.
    PermanentError {
        event_id: String,
        error: anyhow::Error,
    },
}

/// Whether a database error is about this event's data (retrying cannot
/// help) rather than the database's availability.
///
/// Class 23 integrity violations (unique, foreign key, not null, check: the
/// dedupe conflict itself is `ON CONFLICT DO NOTHING` and never surfaces) and
/// errors encoding or decoding values are permanent. diesel-async does not
/// expose other SQLSTATEs (its kind is `Unknown`), so other errors count as
/// transient; data the database would reject as a class 22 exception is
/// caught before the query instead ([`unstorable`]).
fn is_permanent(error: &diesel::result::Error) -> bool {
    use diesel::result::{DatabaseErrorKind as Kind, Error};
    matches!(
        error,
        Error::DatabaseError(Kind::UniqueViolation | Kind::ForeignKeyViolation | Kind::NotNullViolation | Kind::CheckViolation, _)
            | Error::SerializationError(_)
            | Error::DeserializationError(_)
            | Error::QueryBuilderError(_)
    )
}

/// Why PostgreSQL would refuse this event's text (SQLSTATE 22021: a `text`
/// value cannot hold the NUL character), if it would.
fn unstorable(event: &Envelope, effect: &Effect) -> Option<String> {
    let mut fields = vec![("id", event.id.as_str()), ("type", event.type_.as_str())];
    if let Effect::SetVideo { video_id, operation_id, .. } = effect {
        fields.extend([("data.video_id", video_id.as_str()), ("data.operation_id", operation_id.as_str())]);
    }
    fields.into_iter().find(|(_, value)| value.contains('\0')).map(|(name, _)| format!("`{name}` contains a NUL character (\\u0000)"))
}

async fn process(pool: &Pool, delivery: &Delivery) -> Processed {
    let Some(event) = Envelope::parse(&delivery.data) else {
        return Processed::NotAnEvent;
    };
    let effect = event.effect();
    if let Some(reason) = unstorable(&event, &effect) {
        return Processed::PermanentError { event_id: event.id, error: anyhow::anyhow!(reason) };
    }
    let mut conn = match pool.get().await {
        Ok(conn) => conn,
        Err(e) => return Processed::TransientDbError { event_id: event.id, error: e.into() },
    };
    match db::record_and_apply(&mut conn, &event.id, &event.type_, &effect).await {
        Ok(outcome) => Processed::Done { event_id: event.id, outcome },
        Err(e) if is_permanent(&e) => Processed::PermanentError { event_id: event.id, error: e.into() },
        Err(e) => Processed::TransientDbError { event_id: event.id, error: e.into() },
    }
}
