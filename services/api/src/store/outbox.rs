//! `outbox`: messages waiting to be published to RabbitMQ, and the
//! [`Outbox`] handle, the only way to write them.
//!
//! Writers: the api through [`Staged`] (insert, inside the transaction of
//! the change it announces) and the relay [`crate::outbox`] (delete after
//! the broker confirmed). A [`Staged`] exists only inside
//! [`Outbox::transaction`], which wakes this process's relay after a commit
//! that wrote anything: no writer can forget to.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use diesel::prelude::*;
use diesel_async::scoped_futures::ScopedBoxFuture;
use diesel_async::AsyncConnection;
use tokio::sync::Notify;
use vid_core::event::{Event, EventData, EventType};
use vid_core::messages::{CancelTranscode, EventPublished, TranscodeJob};
use vid_core::{EventId, OperationId, TenantId};
use vid_db::schema::outbox;
use vid_db::RunQueryDsl;
use vid_infra::amqp::{Topology, RK_EVENT, RK_JOB};

use super::Conn;

/// The outbox of this process: cheap to clone.
#[derive(Clone)]
pub struct Outbox {
    notify: Arc<Notify>,
    topology: Topology,
}

impl Outbox {
    /// A handle publishing to `topology`'s exchanges.
    pub fn new(topology: Topology) -> Self {
        Self { notify: Arc::new(Notify::new()), topology }
    }

    /// The exchanges and queues messages go to.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Runs `f` in one database transaction, handing it a [`Staged`] to
    /// write outbox rows (and events) with; after a commit in which `f`
    /// wrote any, wakes the relay. `f`'s error rolls everything back.
    pub async fn transaction<'a, R, E, F>(&self, conn: &mut Conn, f: F) -> Result<R, E>
    where
        F: for<'r> FnOnce(&'r mut Conn, Staged) -> ScopedBoxFuture<'a, 'r, Result<R, E>> + Send + 'a,
        E: From<diesel::result::Error> + Send + 'a,
        R: Send + 'a,
    {
        let wrote = Arc::new(AtomicBool::new(false));
        let staged = Staged { wrote: wrote.clone(), topology: self.topology.clone() };
        let result = conn.transaction(move |conn| f(conn, staged)).await;
        if result.is_ok() && AtomicBool::load(&wrote, Ordering::Acquire) {
            self.notify.notify_one();
        }
        result
    }

    /// Resolves when a local commit wrote to the outbox (or at once, if one
    /// did since the last wait): what the relay waits on.
    pub async fn written(&self) {
        self.notify.notified().await;
    }
}

/// Writes to the outbox inside an [`Outbox::transaction`]; only that creates one.
pub struct Staged {
    wrote: Arc<AtomicBool>,
    topology: Topology,
}

impl Staged {
    /// Adds a message to publish to `exchange` with `routing_key`.
    pub async fn enqueue(
        &self,
        conn: &mut Conn,
        exchange: &str,
        routing_key: &str,
        payload: &str,
        correlation_id: Option<&str>,
    ) -> QueryResult<()> {
        insert(conn, exchange, routing_key, payload, correlation_id).await?;
        self.wrote.store(true, Ordering::Release);
        Ok(())
    }

    /// Queues a transcode job (correlation id: its operation id).
    pub async fn transcode_job(&self, conn: &mut Conn, job: &TranscodeJob) -> QueryResult<()> {
        let payload = serde_json::to_string(job).expect("jobs serialise");
        self.enqueue(conn, &self.topology.transcode_exchange(), RK_JOB, &payload, Some(job.operation_id.as_str())).await
    }

    /// Queues an ingest job for the ingest workers (correlation id: its operation id).
    pub async fn ingest_job(&self, conn: &mut Conn, job: &vid_core::ingest::IngestJob) -> QueryResult<()> {
        let payload = serde_json::to_string(job).expect("jobs serialise");
        self.enqueue(conn, &self.topology.ingest_exchange(), RK_JOB, &payload, Some(job.operation_id.as_str())).await
    }

    /// Queues a cancel broadcast to every transcoder (control exchange,
    /// fan-out): `run: None` stops every run of the operation, `Some(r)`
    /// only run `r` (see [`CancelTranscode`]).
    pub async fn cancel_transcode(&self, conn: &mut Conn, id: &OperationId, run: Option<&str>) -> QueryResult<()> {
        let message = CancelTranscode { operation_id: id.clone(), run_id: run.map(str::to_owned) };
        let payload = serde_json::to_string(&message).expect("serialises");
        self.enqueue(conn, &self.topology.control_exchange(), "", &payload, Some(id.as_str())).await
    }

    /// Records an event and queues its publication (the transaction is the
    /// one that makes the change the event announces). Returns the event as
    /// it will be sent.
    pub async fn record_event(
        &self,
        conn: &mut Conn,
        tenant_id: &TenantId,
        type_: EventType,
        resource_id: &str,
        data: EventData,
    ) -> QueryResult<Event> {
        let event = Event { id: EventId::generate(), type_, created: chrono::Utc::now().timestamp(), data };
        let payload = serde_json::to_string(&event).expect("events serialise");
        super::events::insert(conn, &event.id, tenant_id, type_, resource_id, &payload).await?;
        // The correlation id of a video event is its operation id, the id that
        // follows one upload through every service's logs; other events use their own id.
        let correlation_id = match &event.data {
            EventData::Video(v) => v.operation_id.as_str().to_owned(),
            _ => event.id.as_str().to_owned(),
        };
        let message = EventPublished { tenant_id: tenant_id.clone(), event: event.clone(), payload };
        let message = serde_json::to_string(&message).expect("messages serialise");
        self.enqueue(conn, &self.topology.events_exchange(), RK_EVENT, &message, Some(&correlation_id)).await?;
        Ok(event)
    }
}

/// One message: where to publish it and what.
#[derive(Debug, Clone, Queryable)]
pub struct OutboxRow {
    /// Order of writing.
    pub id: i64,
    /// RabbitMQ exchange.
    pub exchange: String,
    /// Routing key.
    pub routing_key: String,
    /// The message body (JSON).
    pub payload: String,
    /// The message's `correlation_id` property.
    pub correlation_id: Option<String>,
}

/// Adds a message (only through [`Staged::enqueue`]).
async fn insert(conn: &mut Conn, exchange: &str, routing_key: &str, payload: &str, correlation_id: Option<&str>) -> QueryResult<()> {
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

/// Claims up to `limit` of the oldest rows (`FOR UPDATE SKIP LOCKED`, so
/// replicas relay side by side); call inside a transaction.
pub async fn claim(conn: &mut Conn, limit: i64) -> QueryResult<Vec<OutboxRow>> {
    outbox::table
        .order(outbox::id.asc())
        .limit(limit)
        .for_update()
        .skip_locked()
        .select((outbox::id, outbox::exchange, outbox::routing_key, outbox::payload, outbox::correlation_id))
        .load(conn)
        .await
}

/// Deletes published rows.
pub async fn delete(conn: &mut Conn, ids: &[i64]) -> QueryResult<()> {
    diesel::delete(outbox::table.filter(outbox::id.eq_any(ids))).execute(conn).await.map(|_| ())
}
