//! RabbitMQ: the one place that declares the topology, and a confirmed publisher.
//!
//! Topology (every name carries the configured prefix `P`, default `vid`):
//!
//! | exchange (type)        | routing key      | queue (type)                | producer → consumer      |
//! |------------------------|------------------|-----------------------------|--------------------------|
//! | `P.transcode` (direct) | `job`            | `P.transcode.jobs` (quorum) | api outbox (and a transcoder handing a job back at shutdown) → transcoder |
//! | `P.dlx` (direct)       | `transcode.dead` | `P.transcode.dead` (quorum) | broker → api             |
//! | `P.reports` (direct)   | `report`         | `P.transcode.reports` (quorum) | transcoder → api      |
//! | `P.events` (direct)    | `event`          | `P.webhook.events` (quorum) | api outbox → dispatcher  |
//! | `P.control` (fanout)   | —                | one exclusive queue per transcoder | api → transcoders |
//! | `P.ingest` (direct)    | `job`            | `P.ingest.jobs` (quorum)    | api outbox → ingest worker |
//! | `P.ingest` (direct)    | `report`         | `P.ingest.reports` (quorum) | ingest worker → api      |
//!
//! `P.transcode.jobs` has a delivery limit ([`TRANSCODE_DELIVERY_LIMIT`]): a
//! job that crashes workers again and again is dead-lettered to
//! `P.transcode.dead`, where the api fails its operation, instead of looping
//! forever. Every message is persistent and published with confirms; every
//! consumer acks manually after its effect is durable.

use std::time::Duration;

use anyhow::Context;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use secrecy::ExposeSecret;

use crate::settings::AmqpSettings;

/// How many times RabbitMQ hands out one transcode job before dead-lettering it.
pub const TRANSCODE_DELIVERY_LIMIT: i64 = 5;

/// Routing key of transcode jobs.
pub const RK_JOB: &str = "job";
/// Routing key of transcoder reports.
pub const RK_REPORT: &str = "report";
/// Routing key of committed events.
pub const RK_EVENT: &str = "event";
/// Routing key of dead-lettered transcode jobs.
pub const RK_TRANSCODE_DEAD: &str = "transcode.dead";

/// Names of every exchange and queue, derived from one prefix.
#[derive(Debug, Clone)]
pub struct Topology {
    prefix: String,
}

impl Topology {
    /// Topology for `prefix` (e.g. `vid`).
    pub fn new(prefix: impl Into<String>) -> Self {
        Self { prefix: prefix.into() }
    }

    fn name(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.prefix)
    }

    /// Exchange of transcode jobs.
    pub fn transcode_exchange(&self) -> String {
        self.name("transcode")
    }
    /// Queue of transcode jobs, consumed by transcoders.
    pub fn transcode_jobs(&self) -> String {
        self.name("transcode.jobs")
    }
    /// Dead-letter exchange.
    pub fn dead_letter_exchange(&self) -> String {
        self.name("dlx")
    }
    /// Queue of jobs that exceeded the delivery limit, consumed by the api.
    pub fn transcode_dead(&self) -> String {
        self.name("transcode.dead")
    }
    /// Exchange of transcoder reports.
    pub fn reports_exchange(&self) -> String {
        self.name("reports")
    }
    /// Queue of transcoder reports, consumed by the api.
    pub fn transcode_reports(&self) -> String {
        self.name("transcode.reports")
    }
    /// Exchange of committed events.
    pub fn events_exchange(&self) -> String {
        self.name("events")
    }
    /// Queue of committed events, consumed by webhook dispatchers.
    pub fn webhook_events(&self) -> String {
        self.name("webhook.events")
    }
    /// Fan-out exchange of control messages (cancel) to every transcoder.
    pub fn control_exchange(&self) -> String {
        self.name("control")
    }
    /// Exchange of ingest jobs (routing key [`RK_JOB`]) and ingest reports ([`RK_REPORT`]).
    pub fn ingest_exchange(&self) -> String {
        self.name("ingest")
    }
    /// Queue of ingest jobs (`vid_core::ingest::IngestJob`), consumed by ingest workers.
    pub fn ingest_jobs(&self) -> String {
        self.name("ingest.jobs")
    }
    /// Queue of ingest reports (`vid_core::ingest::IngestReport`), consumed by the api.
    pub fn ingest_reports(&self) -> String {
        self.name("ingest.reports")
    }

    /// Declares every durable exchange and queue. Idempotent; every service
    /// calls it at start-up so that start order does not matter.
    pub async fn declare(&self, ch: &Channel) -> anyhow::Result<()> {
        let durable = ExchangeDeclareOptions { durable: true, ..Default::default() };
        for (ex, kind) in [
            (self.transcode_exchange(), ExchangeKind::Direct),
            (self.dead_letter_exchange(), ExchangeKind::Direct),
            (self.reports_exchange(), ExchangeKind::Direct),
            (self.events_exchange(), ExchangeKind::Direct),
            (self.control_exchange(), ExchangeKind::Fanout),
            (self.ingest_exchange(), ExchangeKind::Direct),
        ] {
            ch.exchange_declare(&ex, kind, durable, FieldTable::default()).await.with_context(|| format!("declaring exchange {ex}"))?;
        }

        let mut jobs_args = quorum_args();
        jobs_args.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(TRANSCODE_DELIVERY_LIMIT));
        jobs_args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString(self.dead_letter_exchange().into()));
        jobs_args.insert("x-dead-letter-routing-key".into(), AMQPValue::LongString(RK_TRANSCODE_DEAD.into()));

        for (queue, args, exchange, rk) in [
            (self.transcode_jobs(), jobs_args, self.transcode_exchange(), RK_JOB),
            (self.transcode_dead(), quorum_args(), self.dead_letter_exchange(), RK_TRANSCODE_DEAD),
            (self.transcode_reports(), quorum_args(), self.reports_exchange(), RK_REPORT),
            (self.webhook_events(), quorum_args(), self.events_exchange(), RK_EVENT),
            (self.ingest_jobs(), quorum_args(), self.ingest_exchange(), RK_JOB),
            (self.ingest_reports(), quorum_args(), self.ingest_exchange(), RK_REPORT),
        ] {
            ch.queue_declare(&queue, QueueDeclareOptions { durable: true, ..Default::default() }, args)
                .await
                .with_context(|| format!("declaring queue {queue}"))?;
            ch.queue_bind(&queue, &exchange, rk, QueueBindOptions::default(), FieldTable::default())
                .await
                .with_context(|| format!("binding {queue} to {exchange}"))?;
        }
        Ok(())
    }
}

fn quorum_args() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    args
}

/// One connection attempt (TCP, AMQP handshake, `connection.open`) that has
/// not finished after this long is abandoned and retried: a broker that
/// accepts TCP but never answers the handshake (seen on a wedged RabbitMQ
/// node) must not hang its clients forever.
pub const CONNECT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to RabbitMQ, retrying with capped exponential backoff for up to
/// `give_up_after`; each attempt is bounded by [`CONNECT_ATTEMPT_TIMEOUT`].
/// Errors: at once for a malformed `amqp.url`; otherwise the last attempt's
/// error once `give_up_after` has passed.
pub async fn connect(settings: &AmqpSettings, give_up_after: Duration) -> anyhow::Result<Connection> {
    connect_with(settings, give_up_after, CONNECT_ATTEMPT_TIMEOUT).await
}

/// [`connect`] with another bound on each attempt (tests use a short one).
pub async fn connect_with(settings: &AmqpSettings, give_up_after: Duration, attempt_timeout: Duration) -> anyhow::Result<Connection> {
    // A malformed URL never gets better: fail now instead of retrying it.
    settings.check()?;
    let deadline = tokio::time::Instant::now() + give_up_after;
    let mut delay = Duration::from_millis(200);
    loop {
        let attempt = Connection::connect(settings.url.expose_secret(), ConnectionProperties::default());
        let result = match tokio::time::timeout(attempt_timeout, attempt).await {
            Ok(r) => r.map_err(anyhow::Error::from),
            Err(_) => Err(anyhow::anyhow!("no AMQP handshake within {attempt_timeout:?}")),
        };
        match result {
            Ok(conn) => return Ok(conn),
            Err(e) if tokio::time::Instant::now() + delay < deadline => {
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "RabbitMQ not reachable; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e.context("connecting to RabbitMQ")),
        }
    }
}

/// Header carrying the request/operation id across services, for log correlation.
pub const HEADER_CORRELATION_ID: &str = "x-correlation-id";

/// A channel in confirm mode: [`Publisher::publish`] returns only once the
/// broker has taken responsibility for the message (RabbitMQ publisher confirms).
#[derive(Clone)]
pub struct Publisher {
    channel: Channel,
}

/// Why a publish failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The channel or connection failed.
    #[error("RabbitMQ error: {0}")]
    Amqp(#[from] lapin::Error),
    /// The broker refused the message (basic.nack).
    #[error("the broker refused the message (nack)")]
    Nacked,
    /// No queue is bound for the routing key (the `mandatory` message came back).
    #[error("message to {exchange}/{routing_key} was unroutable")]
    Unroutable {
        /// Target exchange.
        exchange: String,
        /// Routing key used.
        routing_key: String,
    },
}

impl Publisher {
    /// Opens a channel on `conn` and puts it in confirm mode.
    pub async fn new(conn: &Connection) -> Result<Self, PublishError> {
        let channel = conn.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        Ok(Self { channel })
    }

    /// The underlying channel, e.g. to declare the topology.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Publishes `payload` (JSON) persistently and waits for the broker's confirm.
    /// `correlation_id`, when given, travels in the [`HEADER_CORRELATION_ID`] header.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        correlation_id: Option<&str>,
    ) -> Result<(), PublishError> {
        let m = Outgoing { exchange, routing_key, payload, correlation_id };
        let confirm = self.send(&m).await?.await?;
        confirmed(&m, confirm)
    }

    /// Publishes every message of `messages` (each as [`Publisher::publish`]
    /// does) without waiting in between, then waits for all their confirms
    /// (RabbitMQ acks many at once with `multiple`): one round trip for the
    /// batch instead of one per message. Returns one result per message, in
    /// order; a message is the broker's responsibility only if its own
    /// result is `Ok` (a caller must not treat a message as sent before
    /// that). A channel failure fails the messages not yet confirmed.
    pub async fn publish_many(&self, messages: &[Outgoing<'_>]) -> Vec<Result<(), PublishError>> {
        let mut sent = Vec::with_capacity(messages.len());
        for m in messages {
            sent.push(self.send(m).await);
        }
        let mut results = Vec::with_capacity(messages.len());
        for (m, s) in messages.iter().zip(sent) {
            results.push(match s {
                Ok(pending) => pending.await.map_err(PublishError::from).and_then(|c| confirmed(m, c)),
                Err(e) => Err(e.into()),
            });
        }
        results
    }

    /// Sends one message (persistent, `mandatory`); the confirm is still to come.
    async fn send(&self, m: &Outgoing<'_>) -> Result<lapin::publisher_confirm::PublisherConfirm, lapin::Error> {
        let mut headers = FieldTable::default();
        if let Some(id) = m.correlation_id {
            headers.insert(HEADER_CORRELATION_ID.into(), AMQPValue::LongString(id.into()));
        }
        let props =
            BasicProperties::default().with_delivery_mode(2).with_content_type(ShortString::from("application/json")).with_headers(headers);
        self.channel
            .basic_publish(m.exchange, m.routing_key, BasicPublishOptions { mandatory: true, ..Default::default() }, m.payload, props)
            .await
    }

    /// [`Publisher::publish`] for a serialisable value.
    pub async fn publish_json<T: serde::Serialize>(
        &self,
        exchange: &str,
        routing_key: &str,
        value: &T,
        correlation_id: Option<&str>,
    ) -> Result<(), PublishError> {
        let body = serde_json::to_vec(value).expect("message types always serialise");
        self.publish(exchange, routing_key, &body, correlation_id).await
    }
}

/// One message for [`Publisher::publish_many`]: what [`Publisher::publish`] takes.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// Target exchange.
    pub exchange: &'a str,
    /// Routing key.
    pub routing_key: &'a str,
    /// The body (JSON).
    pub payload: &'a [u8],
    /// Travels in the [`HEADER_CORRELATION_ID`] header when given.
    pub correlation_id: Option<&'a str>,
}

/// A confirm as a result: a returned (`mandatory`, unroutable) message or a nack is an error.
fn confirmed(m: &Outgoing<'_>, confirm: Confirmation) -> Result<(), PublishError> {
    match confirm {
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        Confirmation::Ack(Some(_)) => {
            Err(PublishError::Unroutable { exchange: m.exchange.to_owned(), routing_key: m.routing_key.to_owned() })
        }
        Confirmation::Nack(_) => Err(PublishError::Nacked),
    }
}

/// The correlation id of a delivered message, if its publisher set one.
pub fn correlation_id(props: &BasicProperties) -> Option<String> {
    let headers = props.headers().as_ref()?;
    match headers.inner().get(HEADER_CORRELATION_ID)? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_malformed_url_fails_at_once() {
        let settings = AmqpSettings { url: "notaurl".to_owned().into(), prefix: "bad".into() };
        let err = connect_with(&settings, Duration::from_secs(3600), Duration::from_secs(10)).await.expect_err("refused");
        assert!(format!("{err:#}").contains("not a valid AMQP URI"), "{err:#}");
    }

    /// A "broker" on loopback that accepts TCP and never says a word: each
    /// attempt is abandoned after its timeout, and `connect` gives up.
    #[tokio::test]
    async fn a_silent_broker_does_not_hang_the_connect() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(stream); // keep it open, answer nothing
            }
        });
        let settings = AmqpSettings { url: format!("amqp://guest:guest@{addr}/%2f").into(), prefix: "silent".into() };
        // Without the per-attempt bound the first attempt never returns; the
        // outer timeout only keeps such a regression from hanging the suite.
        // 2 s to give up in: a second attempt starts ~500 ms in (300 ms
        // timeout, 200 ms back-off), with room for a loaded machine (at 900 ms
        // a slow first attempt left no time for the second).
        let result =
            tokio::time::timeout(Duration::from_secs(60), connect_with(&settings, Duration::from_millis(2000), Duration::from_millis(300)))
                .await
                .expect("connect returned instead of hanging");
        let err = result.expect_err("no connection");
        assert!(format!("{err:#}").contains("no AMQP handshake within 300ms"), "{err:#}");
        assert!(accepted.load(std::sync::atomic::Ordering::SeqCst) >= 2, "it retried");
    }
}
