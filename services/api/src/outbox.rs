//! The transactional outbox and its relay.
//!
//! A message that announces a database change (a transcode job, an event) is
//! written to `outbox` in the SAME transaction as the change. The relay then
//! publishes outbox rows to RabbitMQ with publisher confirms and deletes them
//! only after the broker confirmed. So a committed change is always announced
//! (at least once), and nothing is announced that did not commit. Several api
//! replicas can relay at once: rows are claimed with `FOR UPDATE SKIP LOCKED`.

use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use tokio::sync::{watch, Notify};
use vid_core::event::{Event, EventData, EventType};
use vid_core::messages::EventPublished;
use vid_core::{EventId, TenantId};
use vid_db::schema::{events, outbox};
use vid_db::RunQueryDsl;
use vid_infra::amqp::{PublishError, Publisher, Topology, RK_EVENT};
use vid_infra::settings::AmqpSettings;

/// Adds a message to the outbox inside the caller's transaction.
pub async fn enqueue(
    conn: &mut AsyncPgConnection,
    exchange: &str,
    routing_key: &str,
    payload: String,
    correlation_id: Option<&str>,
) -> diesel::QueryResult<()> {
    diesel::insert_into(outbox::table)
        .values((
            outbox::exchange.eq(exchange),
            outbox::routing_key.eq(routing_key),
            outbox::payload.eq(payload),
            outbox::correlation_id.eq(correlation_id),
        ))
        .execute(conn)
        .await
        .map(|_| ())
}

/// Records an event and queues its publication, inside the caller's
/// transaction (the one that makes the change the event announces).
/// Returns the event as it will be sent.
pub async fn record_event(
    conn: &mut AsyncPgConnection,
    topology: &Topology,
    tenant_id: &TenantId,
    type_: EventType,
    resource_id: &str,
    data: EventData,
) -> diesel::QueryResult<Event> {
    let event = Event { id: EventId::generate(), type_, created: chrono::Utc::now().timestamp(), data };
    let payload = serde_json::to_string(&event).expect("events serialise");
    diesel::insert_into(events::table)
        .values((
            events::id.eq(&event.id),
            events::tenant_id.eq(tenant_id),
            events::event_type.eq(type_.as_str()),
            events::resource_id.eq(resource_id),
            events::payload.eq(&payload),
        ))
        .execute(conn)
        .await?;
    // The correlation id of a video event is its operation id, the id that
    // follows one upload through every service's logs; other events use their own id.
    let correlation_id = match &event.data {
        EventData::Video(v) => v.operation_id.as_str().to_owned(),
        _ => event.id.as_str().to_owned(),
    };
    let message = EventPublished { tenant_id: tenant_id.clone(), event: event.clone(), payload };
    enqueue(
        conn,
        &topology.events_exchange(),
        RK_EVENT,
        serde_json::to_string(&message).expect("messages serialise"),
        Some(&correlation_id),
    )
    .await?;
    Ok(event)
}

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
pub async fn run_relay(db: vid_db::Pool, amqp: AmqpSettings, notify: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
    const FIRST: Duration = Duration::from_millis(200);
    let mut backoff = FIRST;
    loop {
        let started = std::time::Instant::now();
        match relay_session(&db, &amqp, &notify, &mut shutdown).await {
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
    notify: &Notify,
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
                _ = tokio::time::timeout(IDLE_POLL, notify.notified()) => {}
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
    type Row = (i64, String, String, String, Option<String>);
    let rows = conn
        .transaction::<Vec<Row>, anyhow::Error, _>(|conn| {
            async move {
                let rows: Vec<(i64, String, String, String, Option<String>)> = outbox::table
                    .order(outbox::id.asc())
                    .limit(BATCH)
                    .for_update()
                    .skip_locked()
                    .select((outbox::id, outbox::exchange, outbox::routing_key, outbox::payload, outbox::correlation_id))
                    .load(conn)
                    .await?;
                if rows.is_empty() {
                    return Ok(rows);
                }
                for (_, exchange, routing_key, payload, correlation_id) in &rows {
                    match publisher.publish(exchange, routing_key, payload.as_bytes(), correlation_id.as_deref()).await {
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
                let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
                diesel::delete(outbox::table.filter(outbox::id.eq_any(&ids))).execute(conn).await?;
                Ok(rows)
            }
            .scope_boxed()
        })
        .await?;
    for (_, exchange, routing_key, _, correlation_id) in &rows {
        vid_infra::metrics::counter!("outbox_messages_published_total", "exchange" => exchange.clone()).increment(1);
        tracing::info!(%exchange, %routing_key, correlation_id = correlation_id.as_deref().unwrap_or(""), "outbox message published");
    }
    Ok(rows.len())
}
