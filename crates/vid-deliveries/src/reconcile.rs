//! Reconciliation: events recorded in PostgreSQL become deliveries even when
//! their message was lost (a purged or reset broker; issue 24).
//!
//! PostgreSQL is the truth for events and deliveries; RabbitMQ only rings
//! the bell. A pass walks the events older than the grace period in
//! `(created_at, id)` order from the high-water mark
//! (`webhook_reconcile_mark`), and runs the one fan-in ([`fan_in`], rule
//! [`crate::fanin::MATCH`]) over each batch: whatever a lost message would
//! have created is created now, and an event already fanned in adds nothing.
//!
//! Invariants:
//! - every event at or before the mark has a delivery for every endpoint
//!   that matched when the pass ran: the mark is advanced in the transaction
//!   that created the batch's missing deliveries, and only past events older
//!   than `grace` (so an event whose transaction began before the mark but
//!   committed after it is not skipped, as long as it committed within the
//!   grace period);
//! - the mark row is locked (`FOR UPDATE`) for the batch, so replicas take
//!   turns; the inserts are idempotent anyway (`(event_id, endpoint_id)` unique).
//!
//! Cost: the window is a range of the index `events_created_id
//! (created_at, id)`, so a pass reads the events since the last pass, not
//! the table.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Double, Text, Timestamptz};
use diesel_async::AsyncPgConnection;
use vid_core::EventId;
use vid_db::RunQueryDsl;

use crate::fanin::{fan_in, FannedIn};

/// The knobs of a pass.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Events younger than this are left to the message path.
    pub grace: Duration,
    /// Where the first pass ever starts: `now() - lookback`.
    pub lookback: Duration,
    /// Events per batch (one transaction each).
    pub batch: i64,
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// Events read (at most `batch` per transaction).
    pub scanned: usize,
    /// Events that lacked a delivery and got one or more.
    pub events: Vec<EventId>,
    /// Delivery rows created.
    pub deliveries: usize,
    /// The mark after the pass: `created_at` of the last event passed.
    pub mark: Option<DateTime<Utc>>,
}

#[derive(QueryableByName)]
struct Mark {
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
    #[diesel(sql_type = Text)]
    event_id: String,
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
    #[diesel(sql_type = Text)]
    id: EventId,
}

/// Creates the mark row (at `now() - lookback`) unless it exists, then locks and reads it.
const LOCK_MARK: &str = "SELECT created_at, event_id FROM webhook_reconcile_mark FOR UPDATE";
const INIT_MARK: &str = "INSERT INTO webhook_reconcile_mark (created_at, event_id) \
     VALUES (now() - make_interval(secs => $1), '') ON CONFLICT (singleton) DO NOTHING";
/// The window: events after the mark and older than the grace, oldest first.
pub const WINDOW: &str = "SELECT created_at, id FROM events \
     WHERE (created_at, id) > ($1, $2) AND created_at < now() - make_interval(secs => $3) \
     ORDER BY created_at, id LIMIT $4";
const ADVANCE: &str = "UPDATE webhook_reconcile_mark SET created_at = $1, event_id = $2, updated_at = now()";
/// `now()` is the transaction's start, the same instant the window was cut at.
/// (A mark already later, after the grace setting grew, stays.)
const ADVANCE_TO_GRACE: &str = "UPDATE webhook_reconcile_mark \
     SET created_at = now() - make_interval(secs => $1), event_id = '', updated_at = now() \
     WHERE created_at < now() - make_interval(secs => $1)";
const READ_MARK: &str = "SELECT created_at, event_id FROM webhook_reconcile_mark";

/// One batch, in the caller's transaction: locks the mark, fans in up to
/// `w.batch` events after it, advances it (past the last of a full batch;
/// else to `now() - grace`, since no event before that is left). Returns the events read, what
/// was created, and the new mark.
///
/// Errors: the database's (the caller's transaction then rolls back: the
/// mark stays, nothing half-done).
pub async fn batch(conn: &mut AsyncPgConnection, w: Window) -> QueryResult<(usize, FannedIn, DateTime<Utc>)> {
    diesel::sql_query(INIT_MARK).bind::<Double, _>(w.lookback.as_secs_f64()).execute(conn).await?;
    let mark: Mark = diesel::sql_query(LOCK_MARK).get_result(conn).await?;
    let rows: Vec<Row> = diesel::sql_query(WINDOW)
        .bind::<Timestamptz, _>(mark.created_at)
        .bind::<Text, _>(&mark.event_id)
        .bind::<Double, _>(w.grace.as_secs_f64())
        .bind::<BigInt, _>(w.batch)
        .load(conn)
        .await?;
    let scanned = rows.len();
    let last = rows.last().map(|r| (r.created_at, r.id.to_string()));
    let ids: Vec<EventId> = rows.into_iter().map(|r| r.id).collect();
    let created = fan_in(conn, &ids).await?;
    let mark = match last {
        // A full batch: more may follow; the mark is the last event passed.
        Some((at, id)) if scanned as i64 >= w.batch => {
            diesel::sql_query(ADVANCE).bind::<Timestamptz, _>(at).bind::<Text, _>(&id).execute(conn).await?;
            at
        }
        // The window is exhausted: every event before `now() - grace` is
        // passed, so the mark moves there (an idle system's mark keeps up).
        _ => {
            diesel::sql_query(ADVANCE_TO_GRACE).bind::<Double, _>(w.grace.as_secs_f64()).execute(conn).await?;
            diesel::sql_query(READ_MARK).get_result::<Mark>(conn).await?.created_at
        }
    };
    Ok((scanned, created, mark))
}

/// A whole pass: [`batch`] after batch, each in its own transaction, until
/// the window is empty. Returns the sum.
///
/// Errors: the database's; batches committed before the error stay done.
pub async fn pass(conn: &mut AsyncPgConnection, w: Window) -> QueryResult<Pass> {
    use diesel_async::scoped_futures::ScopedFutureExt;
    use diesel_async::AsyncConnection;
    let mut total = Pass::default();
    loop {
        let (scanned, created, mark) = conn.transaction(|c| async move { batch(c, w).await }.scope_boxed()).await?;
        total.scanned += scanned;
        total.deliveries += created.deliveries;
        total.events.extend(created.events);
        total.mark = Some(mark);
        if (scanned as i64) < w.batch.max(1) {
            return Ok(total);
        }
    }
}
