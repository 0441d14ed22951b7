//! The transactional outbox's relay. Rows are written only through
//! [`crate::store::outbox::Outbox::transaction`], which wakes the relay.
//!
//! A message that announces a database change (a transcode job, an event) is
//! written to `outbox` in the SAME transaction as the change. The relay then
//! publishes outbox rows to RabbitMQ with publisher confirms and deletes them
//! only after the broker confirmed. So a committed change is always announced
//! (at least once), and nothing is announced that did not commit. Several api
//! replicas can relay at once: rows are claimed with `FOR UPDATE SKIP LOCKED`.

use std::time::Duration;

use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::AsyncConnection;
use tokio::sync::watch;
use vid_infra::amqp::{Outgoing, PublishError, Publisher, Topology};
use vid_infra::settings::AmqpSettings;

use crate::store::outbox::{self as rows, Outbox, OutboxRow};

/// How many rows one relay transaction publishes at most.
const BATCH: i64 = 100;
/// How often the relay looks for rows written by other replicas when not woken.
const IDLE_POLL: Duration = Duration::from_millis(500);
/// A relay step (connect and declare, or one batch) that takes longer is
/// abandoned (a batch rolls back, so its rows are published again) and the
/// relay reconnects, with a warning.
const STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the relay until `shutdown` turns true: reconnects to RabbitMQ and
/// PostgreSQL as needed, never gives up. On shutdown it finishes the batch in
/// hand (a batch is never cut between the broker's confirm and the commit
/// that deletes its rows, so a shutdown re-sends nothing), relays once more
/// what is already committed, closes its connection and returns.
pub async fn run_relay(db: vid_db::Pool, amqp: AmqpSettings, outbox: Outbox, mut shutdown: watch::Receiver<bool>) {
    const FIRST: Duration = Duration::from_millis(200);
    let mut backoff = FIRST;
    loop {
        let started = std::time::Instant::now();
        match relay_session(&db, &amqp, &outbox, &mut shutdown).await {
            Ok(()) => return,
            Err(e) => {
                // A session that ran for a while was healthy: start the backoff afresh.
                if started.elapsed() > Duration::from_secs(30) {
                    backoff = FIRST;
                }
                tracing::warn!(error = %format!("{e:#}"), "outbox relay interrupted; restarting");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.wait_for(|s| *s) => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

async fn relay_session(
    db: &vid_db::Pool,
    amqp: &AmqpSettings,
    outbox: &Outbox,
    shutdown: &mut watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let setup = async {
        let conn = vid_infra::amqp::connect(amqp, Duration::from_secs(30)).await?;
        let publisher = Publisher::new(&conn).await?;
        Topology::new(&amqp.prefix).declare(publisher.channel()).await?;
        anyhow::Ok((conn, publisher))
    };
    // A broker that accepts the TCP connection but never answers (or blocks
    // publishers on a resource alarm) must show up in the log, not hang silently.
    let (conn, publisher) = tokio::select! {
        r = tokio::time::timeout(STALL_TIMEOUT, setup) => r.map_err(|_| anyhow::anyhow!("connecting and declaring took over {STALL_TIMEOUT:?}"))??,
        _ = shutdown.wait_for(|s| *s) => return Ok(()),
    };
    tracing::info!("outbox relay connected");
    loop {
        let stopping = *shutdown.borrow();
        let published = tokio::time::timeout(STALL_TIMEOUT, publish_batch(db, &publisher))
            .await
            .map_err(|_| anyhow::anyhow!("a batch took over {STALL_TIMEOUT:?} (broker not confirming?); rolled back, retrying"))??;
        if stopping && published < BATCH as usize {
            tracing::info!("outbox relay stopped");
            let _ = conn.close(200, "api shutting down").await;
            return Ok(());
        }
        if published < BATCH as usize {
            // Wait for a local write, or poll for other replicas' writes, or the shutdown.
            tokio::select! {
                _ = tokio::time::timeout(IDLE_POLL, outbox.written()) => {}
                _ = shutdown.wait_for(|s| *s) => {}
            }
        }
    }
}

/// Publishes up to [`BATCH`] rows in one transaction; returns how many.
///
/// After the commit, each row counts once in
/// `outbox_messages_published_total{exchange}` and is logged (`info`, with its
/// `correlation_id`). Errors: the database or the broker failed; the
/// transaction then rolls back and the rows stay for the next pass.
pub async fn publish_batch(db: &vid_db::Pool, publisher: &Publisher) -> anyhow::Result<usize> {
    let mut conn = db.get().await?;
    let rows = conn
        .transaction::<Vec<OutboxRow>, anyhow::Error, _>(|conn| {
            async move {
                let rows = rows::claim(conn, BATCH).await?;
                if rows.is_empty() {
                    return Ok(rows);
                }
                // Pipelined: every row is published, then every confirm awaited
                // (one round trip for the batch); the rows are deleted only
                // once all of them are confirmed.
                let outgoing: Vec<Outgoing<'_>> = rows
                    .iter()
                    .map(|row| Outgoing {
                        exchange: &row.exchange,
                        routing_key: &row.routing_key,
                        payload: row.payload.as_bytes(),
                        correlation_id: row.correlation_id.as_deref(),
                    })
                    .collect();
                for result in publisher.publish_many(&outgoing).await {
                    match result {
                        Ok(()) => {}
                        // A cancel broadcast while no transcoder is connected: nobody holds the job,
                        // so there is nobody to tell (a worker that picks the job up later is told
                        // again on its first report). Retrying would wedge every row behind it.
                        Err(PublishError::Unroutable { exchange, .. }) if exchange.ends_with(".control") => {
                            tracing::info!(%exchange, "cancel broadcast reached no transcoder; dropped");
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                rows::delete(conn, &ids).await?;
                Ok(rows)
            }
            .scope_boxed()
        })
        .await?;
    for OutboxRow { exchange, routing_key, correlation_id, .. } in &rows {
        vid_infra::metrics::counter!("outbox_messages_published_total", "exchange" => exchange.clone()).increment(1);
        tracing::info!(%exchange, %routing_key, correlation_id = correlation_id.as_deref().unwrap_or(""), "outbox message published");
    }
    Ok(rows.len())
}
