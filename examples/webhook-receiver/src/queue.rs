//! The receiver's own RabbitMQ queue: declaration and the handler's confirmed publisher.

use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio::sync::Mutex;

/// The dead-letter queue of `queue`: `<queue>.dead`.
pub fn dead_letter_queue(queue: &str) -> String {
    format!("{queue}.dead")
}

/// Declares `queue` as a durable quorum queue (idempotent) whose rejected
/// messages are dead-lettered to [`dead_letter_queue`] (`<queue>.dead`, also
/// declared: durable, quorum). Messages survive a broker restart and are
/// replicated when the broker is a cluster.
///
/// # Errors
///
/// Besides broker errors: `PRECONDITION_FAILED` when `queue` already exists
/// with other arguments (a queue declared by a receiver from before
/// dead-lettering); see the README's "Upgrading" note.
pub async fn declare_queue(channel: &Channel, queue: &str) -> Result<(), lapin::Error> {
    let dead = dead_letter_queue(queue);
    let mut dead_args = FieldTable::default();
    dead_args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    channel.queue_declare(&dead, QueueDeclareOptions { durable: true, ..Default::default() }, dead_args).await?;

    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    // Default exchange, routed by queue name: a rejected message goes to `<queue>.dead`.
    args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
    args.insert("x-dead-letter-routing-key".into(), AMQPValue::LongString(dead.as_str().into()));
    channel.queue_declare(queue, QueueDeclareOptions { durable: true, ..Default::default() }, args).await?;
    Ok(())
}

/// Why an event could not be enqueued; the handler answers `503` for each.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    /// Connecting or talking to RabbitMQ failed.
    #[error("RabbitMQ error: {0}")]
    Amqp(#[from] lapin::Error),
    /// RabbitMQ did not answer (connect or confirm) within the timeout.
    #[error("RabbitMQ did not confirm within {0:?}")]
    Timeout(Duration),
    /// The broker refused the message (`basic.nack`).
    #[error("the broker refused the message")]
    Nacked,
    /// The queue does not exist (the mandatory message was returned).
    #[error("the queue does not exist")]
    Unroutable,
}

/// Publishes raw event bodies to the queue and waits for the broker's confirm.
///
/// Connects lazily and reconnects after any failure, so the HTTP server
/// starts (and answers `503`) while RabbitMQ is down.
pub struct EventPublisher {
    amqp_url: String,
    queue: String,
    timeout: Duration,
    channel: Mutex<Option<(Connection, Channel)>>,
}

impl EventPublisher {
    /// A publisher to `queue` on the broker at `amqp_url`; each connect and
    /// each confirm may take at most `timeout`. Nothing is contacted yet.
    pub fn new(amqp_url: impl Into<String>, queue: impl Into<String>, timeout: Duration) -> Self {
        Self { amqp_url: amqp_url.into(), queue: queue.into(), timeout, channel: Mutex::new(None) }
    }

    /// Publishes `body` persistently to the queue and returns once the broker
    /// has confirmed it: from then on RabbitMQ is responsible for it.
    pub async fn enqueue(&self, event_id: &str, body: &[u8]) -> Result<(), EnqueueError> {
        let result = self.try_enqueue(event_id, body).await;
        if result.is_err() {
            // Start from a fresh connection next time; a channel that timed
            // out or was closed by the broker is not reused.
            if let Some((conn, _)) = self.channel.lock().await.take() {
                let _ = conn.close(0, "publish failed").await;
            }
        }
        result
    }

    async fn try_enqueue(&self, event_id: &str, body: &[u8]) -> Result<(), EnqueueError> {
        let channel = self.channel().await?;
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type(ShortString::from("application/json"))
            .with_message_id(ShortString::from(event_id));
        let confirm = tokio::time::timeout(self.timeout, async {
            channel.basic_publish("", &self.queue, BasicPublishOptions { mandatory: true, ..Default::default() }, body, props).await?.await
        })
        .await
        .map_err(|_| EnqueueError::Timeout(self.timeout))??;
        match confirm {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => Err(EnqueueError::Unroutable),
            Confirmation::Nack(_) => Err(EnqueueError::Nacked),
            // The channel is always in confirm mode; treat anything else as unconfirmed.
            Confirmation::NotRequested => Err(EnqueueError::Nacked),
        }
    }

    /// The open confirm-mode channel, connecting (and declaring the queue) if needed.
    async fn channel(&self) -> Result<Channel, EnqueueError> {
        let mut guard = self.channel.lock().await;
        if let Some((conn, channel)) = guard.as_ref() {
            if conn.status().connected() && channel.status().connected() {
                return Ok(channel.clone());
            }
        }
        *guard = None;
        let (conn, channel) = tokio::time::timeout(self.timeout, async {
            let conn = Connection::connect(&self.amqp_url, ConnectionProperties::default()).await?;
            let channel = conn.create_channel().await?;
            channel.confirm_select(ConfirmSelectOptions::default()).await?;
            declare_queue(&channel, &self.queue).await?;
            Ok::<_, lapin::Error>((conn, channel))
        })
        .await
        .map_err(|_| EnqueueError::Timeout(self.timeout))??;
        *guard = Some((conn, channel.clone()));
        Ok(channel)
    }
}
