//! Fan-in: committed events from RabbitMQ become delivery rows in PostgreSQL.
//!
//! Consumes `P.webhook.events` with manual acks. For each
//! [`EventPublished`], one transaction inserts one delivery per matching
//! endpoint of the tenant ([`store::insert_deliveries`]); the message is acked
//! only after the commit, so a crash between the two redelivers the message,
//! and `(event_id, endpoint_id)` uniqueness makes the redelivery harmless.
//! From then on the schedule lives in PostgreSQL, not in the broker: a
//! RabbitMQ restart loses no pending delivery or scheduled retry.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::AsyncConnection;
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio::sync::{watch, Notify};
use vid_core::messages::EventPublished;
use vid_infra::amqp::Topology;
use vid_infra::settings::AmqpSettings;

use crate::store;

/// Shared with the health server: true while the consumer is attached.
pub type BrokerUp = Arc<AtomicBool>;

/// Runs the fan-in until `shutdown` turns true: reconnects with capped
/// backoff whenever RabbitMQ or PostgreSQL fails.
pub async fn run(
    db: vid_db::Pool,
    amqp: AmqpSettings,
    prefetch: u16,
    wake: Arc<Notify>,
    broker_up: BrokerUp,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        if *shutdown.borrow() {
            return;
        }
        let result = session(&db, &amqp, prefetch, &wake, &broker_up, &mut shutdown).await;
        broker_up.store(false, Ordering::SeqCst);
        match result {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "fan-in interrupted; reconnecting");
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
    tracing::info!(queue = %topology.webhook_events(), "fan-in consuming");
    loop {
        let delivery = tokio::select! {
            d = consumer.next() => d,
            _ = shutdown.changed() => {
                // Unacked messages go back to the queue when the channel closes.
                let _ = channel.close(200, "shutting down").await;
                let _ = conn.close(200, "shutting down").await;
                return Ok(());
            }
        };
        let Some(delivery) = delivery else { anyhow::bail!("consumer stream ended") };
        let delivery = delivery?;
        let message: EventPublished = match serde_json::from_slice(&delivery.data) {
            Ok(m) => m,
            Err(e) => {
                // Unparseable forever: drop it rather than loop on it.
                tracing::error!(error = %e, "dropping malformed EventPublished message");
                delivery.ack(BasicAckOptions::default()).await?;
                continue;
            }
        };
        match fan_in(db, &message).await {
            Ok(n) => {
                delivery.ack(BasicAckOptions::default()).await?;
                tracing::debug!(event_id = %message.event.id, deliveries = n, "fanned in");
                if n > 0 {
                    wake.notify_one();
                }
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), event_id = %message.event.id, "fan-in failed; requeueing");
                delivery.nack(BasicNackOptions { requeue: true, ..Default::default() }).await?;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Inserts the deliveries of one event, in one transaction. Returns how many were new.
pub async fn fan_in(db: &vid_db::Pool, message: &EventPublished) -> anyhow::Result<usize> {
    let mut conn = db.get().await?;
    let n = conn
        .transaction::<usize, diesel::result::Error, _>(|conn| {
            async move {
                store::insert_deliveries(
                    conn,
                    &message.tenant_id,
                    &message.event.id,
                    message.event.type_,
                    &message.payload,
                    None,
                    false,
                )
                .await
            }
            .scope_boxed()
        })
        .await?;
    Ok(n)
}
