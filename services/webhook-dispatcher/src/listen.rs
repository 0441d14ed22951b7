//! Wake-ups by notification: one dedicated PostgreSQL connection LISTENs on
//! [`CHANNEL`] and wakes the scheduler on every notification, so deliveries
//! that become due in another process are claimed at once instead of at the
//! next idle poll.
//!
//! The notifications come from statement-level triggers on
//! `webhook_deliveries` (migration `2026-11-29-000030_dispatcher_due_notify`):
//! a statement that leaves any row `pending`, unleased and due now notifies
//! once, at commit (never for a rolled-back change). That covers another
//! replica's fan-in, leases released at another replica's shutdown, and the
//! api's `:enable` and `:retry`. Retries falling due later are still found
//! by the `idle_poll_ms` poll, which stays as the fallback for lost
//! notifications too (the connection reconnects with backoff, and wakes the
//! scheduler once after each reconnect).
//!
//! `tokio-postgres` is used directly, as in the api's operation watcher,
//! because diesel-async's connection task drops notifications.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{watch, Notify};

/// The notification channel (`pg_notify('webhook_deliveries_due', '')`).
pub const CHANNEL: &str = "webhook_deliveries_due";

/// How often the listening connection is checked with a query.
const PING_EVERY: Duration = Duration::from_secs(30);

/// Listens until `shutdown` turns true, reconnecting with capped backoff.
/// `database_url` is `postgres://…` as in `[database] url`.
pub async fn run(database_url: String, wake: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut connected = false;
        tokio::select! {
            result = session(&database_url, &wake, &mut connected) => {
                if let Err(e) = result {
                    tracing::warn!(error = %format!("{e:#}"), "due-delivery listener interrupted; reconnecting");
                }
            }
            _ = shutdown.changed() => return,
        }
        if connected {
            backoff = Duration::from_millis(100);
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn session(url: &str, wake: &Notify, connected: &mut bool) -> anyhow::Result<()> {
    let (client, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Result<(), tokio_postgres::Error>>();
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            let item = match message {
                Ok(tokio_postgres::AsyncMessage::Notification(_)) => Ok(()),
                Ok(_) => continue,
                Err(e) => Err(e),
            };
            let stop = item.is_err();
            if tx.send(item).is_err() || stop {
                return;
            }
        }
    });
    let _abort = AbortOnDrop(driver);
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    *connected = true;
    tracing::debug!("due-delivery listener connected");
    // Anything that fell due while not listening.
    wake.notify_one();
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    loop {
        tokio::select! {
            message = rx.recv() => match message {
                Some(Ok(())) => wake.notify_one(),
                Some(Err(e)) => return Err(e.into()),
                None => anyhow::bail!("the listening connection closed"),
            },
            _ = ping.tick() => {
                tokio::time::timeout(Duration::from_secs(10), client.simple_query("SELECT 1")).await??;
            }
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
