//! The scheduler: claims due deliveries from PostgreSQL and runs their attempts.
//!
//! - Woken at once by the fan-in (an in-process [`Notify`](tokio::sync::Notify)), whenever
//!   recorded attempts free slots, and by PostgreSQL notifications of
//!   deliveries that became due elsewhere ([`crate::listen`]: other
//!   replicas' inserts and released leases, the api's `:enable`/`:retry`);
//!   otherwise it polls every `idle_poll_ms` (retries that fall due, and the
//!   fallback for a lost notification).
//! - Works in batches: one claim statement leases up to `batch_size`
//!   deliveries; each leased batch (claimed, or handed over by the fan-in)
//!   then runs in a task of its own ([`run_batch`]), so the loop only claims:
//!   the leasing statement read each lease's endpoint in the same round
//!   trip ([`store::claim_for_send`], the fan-in's insert), the batch opens
//!   its endpoints' secrets once per endpoint, every attempt runs as its own task over the
//!   keep-alive pool of [`Sender`](crate::attempt::Sender), and one recorder task writes finished
//!   successes many per statement ([`store::record_successes`]); failures
//!   are recorded one transaction each, concurrently, since they may disable
//!   an endpoint.
//! - Claims are leases ([`store::claim`]): a crashed replica's deliveries are
//!   retried once its leases expire (put back every second by
//!   [`store::release_expired`]), and several replicas never run the same
//!   attempt twice.
//! - Per-endpoint concurrency is bounded in the claim itself, so a slow
//!   endpoint holds at most `per_endpoint_concurrency` slots and never blocks
//!   anyone else (no head-of-line blocking); `max_in_flight` bounds the
//!   process's attempts. The fan-in may lease ahead of that bound
//!   (`lease_ahead`, [`Handoff::reserve`]) for an endpoint whose every
//!   lease is this process's; so its leases pass their endpoint's gate
//!   ([`Gates`], this process's own `per_endpoint_concurrency`) before they
//!   take a slot, and after a 429/503, a 410 or a delivery out of retries
//!   the leases taken before its record are given back there
//!   ([`send_through`]). Claimed leases are within the bound already and
//!   never wait at a gate.
//!   The bound is on requests open at the receiver: an attempt that
//!   succeeded is marked answered in the lease book, and until its outcome
//!   is recorded the loop's claims leave it out of its endpoint's count
//!   ([`store::claim_answered`]), so its slot can be leased again at the
//!   loop's next wake-up (a fan-in, a notification, another batch's record,
//!   the idle poll) rather than only after its own record commits (before,
//!   one busy endpoint's slots went round in lock step: leased, sent,
//!   answered, and free only after the record committed). The answer itself
//!   does not wake the loop: waking it on every success made many small
//!   claims and was not faster (BENCHMARKS.md). A failed attempt keeps its
//!   slot until recorded: a 429/503 throttles the endpoint only then.
//! - On shutdown it stops claiming, gives in-flight attempts
//!   `shutdown_grace_seconds` to finish and records them, then aborts the
//!   rest and releases their leases so another replica picks them up at
//!   once (an attempt aborted after its request went out is sent again:
//!   at least once, never lost).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use vid_core::endpoint::SignatureFormat;
use vid_core::{DeliveryId, EndpointId};
use vid_db::seal::SealingKey;
use vid_infra::metrics::{counter, histogram};
use vid_webhooks::{Scheme, Secret};

use crate::attempt::Request;
use crate::settings::DispatcherSettings;
use vid_deliveries::{self as store, AttemptRecord, Claimed, ClaimedForSend, DeliveryStatus, EndpointForSend, EndpointStatus};

mod context;
mod record;

use context::{per_endpoint, Leases};
pub use context::{Context, Gate, GateHold, GateUse, Gates, Place};
use record::{recorder, to_record, Done};

/// Leased deliveries with their endpoints (claimed, or leased by the
/// fan-in in its own insert), with one place each.
type Handed = Vec<(ClaimedForSend, Place)>;

/// The fan-in's way into the scheduler (issue 22, "claim at fan-in"): it
/// reserves in-process slots ([`Handoff::reserve`]), leases that many of
/// the deliveries it inserts ([`store::fanin::fan_in_leasing`], with the
/// claim's bound and lease: [`Handoff::lease`]), and after its commit hands
/// them over ([`Handoff::hand_over`]), so they are sent without a claim.
pub struct Handoff {
    slots: Arc<Semaphore>,
    ahead: Arc<Semaphore>,
    lease_ahead: bool,
    lease_ends: Arc<tokio::sync::RwLock<()>>,
    gates: Arc<Gates>,
    leases: Leases,
    tx: mpsc::UnboundedSender<Handed>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<Handed>>>,
    per_endpoint: i32,
    batch: usize,
    lease_ms: i64,
    lease: Duration,
    at_fanin: bool,
}

impl Handoff {
    /// The scheduler's slots (`max_in_flight`) and lease book, for `settings`.
    pub fn new(settings: &DispatcherSettings) -> Arc<Handoff> {
        let (tx, rx) = mpsc::unbounded_channel();
        Arc::new(Handoff {
            slots: Arc::new(Semaphore::new(settings.max_in_flight.max(1) as usize)),
            ahead: Arc::new(Semaphore::new(settings.lease_ahead as usize)),
            lease_ahead: settings.lease_at_fanin && settings.lease_ahead > 0,
            lease_ends: Arc::default(),
            gates: Arc::new(Gates::new(settings.per_endpoint_concurrency)),
            leases: Arc::default(),
            tx,
            rx: Mutex::new(Some(rx)),
            per_endpoint: i32::try_from(settings.per_endpoint_concurrency.max(1)).unwrap_or(i32::MAX),
            batch: settings.batch_size.max(1) as usize,
            lease_ms: i64::try_from(settings.lease().as_millis()).unwrap_or(i64::MAX),
            lease: settings.lease(),
            at_fanin: settings.lease_at_fanin,
        })
    }

    /// `dispatcher.lease_at_fanin`: whether the fan-in leases what it inserts.
    pub fn leases_at_fanin(&self) -> bool {
        self.at_fanin
    }

    /// Whether the fan-in leases ahead of the bound (`lease_at_fanin` and a
    /// `lease_ahead` above 0): it must then hold [`Handoff::lease_ends`]
    /// exclusively from [`Handoff::lease`] to its commit.
    pub fn leases_ahead(&self) -> bool {
        self.lease_ahead
    }

    /// The lock of [`Context::lease_ends`].
    pub fn lease_ends(&self) -> Arc<tokio::sync::RwLock<()>> {
        self.lease_ends.clone()
    }

    /// The per-endpoint gates of [`Context::gates`].
    pub fn gates(&self) -> Arc<Gates> {
        self.gates.clone()
    }

    /// `max_in_flight`'s slots ([`Context::slots`]).
    pub fn slots(&self) -> Arc<Semaphore> {
        self.slots.clone()
    }

    /// Takes places for up to `wanted` leases, none once the scheduler
    /// drains: when leasing ahead, places of `lease_ahead` only (each takes
    /// a slot of `max_in_flight` when its attempt sends, so a lease waiting
    /// at its endpoint's gate never holds a slot another endpoint's claim
    /// could use); otherwise free in-process slots, at most `batch_size`.
    /// Dropping a place frees it.
    pub fn reserve(&self, wanted: usize) -> Vec<Place> {
        if self.leases.lock().unwrap().closed {
            return Vec::new();
        }
        if self.lease_ahead {
            return std::iter::from_fn(|| self.ahead.clone().try_acquire_owned().ok()).take(wanted).map(Place::Ahead).collect();
        }
        std::iter::from_fn(|| self.slots.clone().try_acquire_owned().ok()).take(wanted.min(self.batch)).map(Place::Slot).collect()
    }

    /// What the fan-in leases for the `places` it reserved: the claim's
    /// bound and lease, and this process's answered leases, which the bound
    /// leaves out as the claim's does; at most `batch_size` within the bound
    /// (each takes an endpoint lock); when leasing ahead, at most one a
    /// place in all, with this process's own leases per endpoint, counting
    /// only those with more than [`OWN_LEASE_MARGIN`] left (the caller holds
    /// [`Handoff::lease_ends`] exclusively, so none of them ends before its
    /// statement commits).
    pub fn lease(&self, places: &[Place]) -> store::fanin::LeaseFresh {
        let n = places.len();
        let book = self.leases.lock().unwrap();
        store::fanin::LeaseFresh {
            per_endpoint: self.per_endpoint,
            limit: i32::try_from(n.min(self.batch)).unwrap_or(i32::MAX),
            lease_ms: self.lease_ms,
            answered: book.answered_leases(),
            ahead: (self.lease_ahead && n > 0).then(|| store::Ahead {
                max: i32::try_from(n).unwrap_or(i32::MAX),
                own: book.own_counts(std::time::Instant::now() + OWN_LEASE_MARGIN),
            }),
        }
    }

    /// Hands committed leases to the scheduler, one reserved place each
    /// (surplus places are freed); `sent_at`: an `Instant` taken before
    /// their leasing statement was sent (their local deadline is it plus the
    /// lease). Returns them if the scheduler is draining (the caller
    /// releases them: [`store::release`]).
    pub fn hand_over(&self, claimed: Vec<ClaimedForSend>, permits: Vec<Place>, sent_at: std::time::Instant) -> Result<(), Vec<Claimed>> {
        if claimed.is_empty() {
            return Ok(());
        }
        let mut book = self.leases.lock().unwrap();
        if book.closed {
            return Err(claimed.into_iter().map(|(c, _)| c).collect());
        }
        let deadline = sent_at + self.lease;
        for ((c, _), place) in claimed.iter().zip(&permits) {
            book.took(c, deadline, matches!(place, Place::Ahead(_)));
        }
        debug_assert!(permits.len() >= claimed.len(), "leased no more than the reserved places");
        let handed: Handed = claimed.into_iter().zip(permits).collect();
        // The receiver lives as long as the scheduler, which closes the book before it goes.
        let _ = self.tx.send(handed);
        Ok(())
    }
}

/// A lease counts as this process's own for leasing ahead only while its
/// local deadline is more than this away ([`Handoff::lease`]): it cannot
/// expire between that count and the fan-in's statement, which holds the
/// endpoint's lock from its first statement on.
pub const OWN_LEASE_MARGIN: Duration = Duration::from_secs(5);

/// A lease that waited at its endpoint's gate is sent only if at least this
/// much of it is left (otherwise it is given back): a whole attempt
/// (`request_timeout_ms`) and [`crate::settings::LEASE_MARGIN_MS`] for recording
/// its outcome, the margin the lease is checked against at start-up; at
/// most the lease less a second (or half a lease shorter than two
/// seconds), so that a lease just taken is sent even where the lease is
/// shorter than an attempt on purpose (tests).
fn least_left_to_send(settings: &crate::settings::DispatcherSettings) -> Duration {
    let lease = settings.lease();
    let attempt = settings.request_timeout() + Duration::from_millis(crate::settings::LEASE_MARGIN_MS as u64);
    attempt.min(lease.saturating_sub(Duration::from_secs(1)).max(lease / 2))
}

/// How often expired leases are put back ([`store::release_expired`]): a
/// crashed replica's deliveries are claimable at most this long after their
/// lease ran out.
const EXPIRED_LEASE_SWEEP: Duration = Duration::from_secs(1);

/// An endpoint, loaded once per claimed batch, ready to sign with.
struct Ready {
    url: String,
    scheme: Scheme,
    secrets: Vec<Secret>,
    /// The endpoint as read with the lease, to tell whether it changed since.
    from: EndpointForSend,
}

/// What to do with a claimed delivery of this endpoint.
enum Target {
    /// Send to it.
    Send(Arc<Ready>),
    /// Settle without an attempt (`paused`: disabled meanwhile; `failed`: deleted or gone).
    Settle(DeliveryStatus),
    /// Its secrets could not be opened: postpone.
    Broken(String),
}

/// The scheduler loop's state: in-process slots, leases held, attempts in flight.
struct Loop {
    ctx: Arc<Context>,
    slots: Arc<Semaphore>,
    leases: Leases,
    done_tx: mpsc::UnboundedSender<Done>,
    tasks: JoinSet<()>,
}

/// Runs until `shutdown` turns true, then drains as described in the module docs.
/// `handoff` carries the deliveries the fan-in leased itself (its slots
/// and lease book are the scheduler's).
pub async fn run(ctx: Arc<Context>, handoff: Arc<Handoff>, mut shutdown: watch::Receiver<bool>) {
    let s = ctx.settings.clone();
    let leases = handoff.leases.clone();
    let mut handed = handoff.rx.lock().unwrap().take().expect("one scheduler per handoff");
    let (done_tx, done_rx) = mpsc::unbounded_channel::<Done>();
    let recorder = tokio::spawn(recorder(ctx.clone(), done_rx, leases.clone()));
    let slots = handoff.slots.clone();
    let mut l = Loop { ctx: ctx.clone(), slots, leases, done_tx, tasks: JoinSet::new() };
    let lease_ms = i64::try_from(s.lease().as_millis()).unwrap_or(i64::MAX);
    let mut last_sweep: Option<tokio::time::Instant> = None;
    while !*shutdown.borrow() {
        while l.tasks.try_join_next().is_some() {}
        while let Ok(batch) = handed.try_recv() {
            l.start_handed(batch);
        }
        if last_sweep.is_none_or(|t| t.elapsed() >= EXPIRED_LEASE_SWEEP) {
            last_sweep = Some(tokio::time::Instant::now());
            release_expired(&ctx).await;
        }
        let free = l.slots.available_permits().min(s.batch_size.max(1) as usize);
        if free > 0 && l.claim_and_start(free, lease_ms).await {
            continue; // claimed all it could: more may be due
        }
        tokio::select! {
            _ = ctx.wake.notified() => {}
            Some(batch) = handed.recv() => l.start_handed(batch),
            _ = tokio::time::sleep(s.idle_poll()) => {}
            _ = shutdown.changed() => {}
        }
    }
    // No new leases from the fan-in; what it handed over and nobody started is released with the rest.
    l.leases.lock().unwrap().closed = true;
    drop(handed);
    l.drain(recorder).await;
}

impl Loop {
    /// Claims up to `free` deliveries and starts them ([`Loop::start_handed`]).
    /// Returns whether it claimed all `free`.
    async fn claim_and_start(&mut self, free: usize, lease_ms: i64) -> bool {
        // The slots first: the fan-in takes slots too ([`Handoff::reserve`]).
        let mut permits: Vec<OwnedSemaphorePermit> =
            std::iter::from_fn(|| self.slots.clone().try_acquire_owned().ok()).take(free).collect();
        let free = permits.len();
        if free == 0 {
            return false;
        }
        // This process's attempts that are over but not yet recorded hold no
        // request open: the bound leaves them out.
        let answered = self.leases.lock().unwrap().answered_leases();
        let sent_at = std::time::Instant::now();
        let claimed = async {
            let mut conn = self.ctx.db.get().await?;
            let limit = i32::try_from(free).unwrap_or(i32::MAX);
            anyhow::Ok(store::claim_for_send(&mut conn, per_endpoint(&self.ctx), limit, lease_ms, &answered).await?)
        };
        let claimed = match claimed.await {
            Ok(claimed) => claimed,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "claiming deliveries failed");
                return false;
            }
        };
        let claimed_all = claimed.len() == free;
        counter!("webhook_claims_total", "result" => if claimed.is_empty() { "empty" } else { "leased" }).increment(1);
        counter!("webhook_deliveries_leased_total", "by" => "claim").increment(claimed.len() as u64);
        {
            let mut l = self.leases.lock().unwrap();
            let deadline = sent_at + self.ctx.settings.lease();
            for (c, _) in &claimed {
                l.took(c, deadline, false);
            }
        }
        permits.truncate(claimed.len()); // the slots not needed are free again at once
        self.start_handed(claimed.into_iter().zip(permits.into_iter().map(Place::Slot)).collect());
        claimed_all
    }

    /// Starts leased deliveries (claimed, or leased by the fan-in:
    /// [`Handoff::hand_over`]), already in the lease book, in a task of
    /// their own ([`run_batch`]), so the loop goes on claiming while their
    /// attempts run: a fanned-in batch never waits behind a claim.
    fn start_handed(&mut self, handed: Handed) {
        if handed.is_empty() {
            return;
        }
        let (ctx, leases, done_tx) = (self.ctx.clone(), self.leases.clone(), self.done_tx.clone());
        self.tasks.spawn(run_batch(ctx, leases, done_tx, handed));
    }

    /// Shutdown: gives in-flight attempts `shutdown_grace_seconds`, aborts
    /// the rest, lets the recorder write what finished, then releases the
    /// leases left in one statement.
    async fn drain(self, recorder: tokio::task::JoinHandle<()>) {
        let Loop { ctx, leases, done_tx, mut tasks, slots } = self;
        // Slots in use: attempts running or being recorded, and batches still loading their endpoints.
        let in_use = |slots: &Semaphore| (ctx.settings.max_in_flight.max(1) as usize).saturating_sub(slots.available_permits());
        let grace = Duration::from_secs(ctx.settings.shutdown_grace_seconds);
        tracing::info!(in_flight = in_use(&slots), grace_s = grace.as_secs(), "scheduler stopping; draining in-flight attempts");
        let drained = tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!(aborted = in_use(&slots), "grace period over; aborting the attempts still in flight");
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
        // Every attempt task is gone: once this last sender is dropped the
        // recorder writes what is queued and ends.
        drop(done_tx);
        let _ = recorder.await;
        let left: Vec<(DeliveryId, DateTime<Utc>)> = {
            let mut book = leases.lock().unwrap();
            book.answered.clear();
            book.meta.clear();
            book.held.drain().collect()
        };
        if left.is_empty() {
            return;
        }
        let released = async {
            let _ends = ctx.lease_ends.read().await;
            let mut conn = ctx.db.get().await?;
            anyhow::Ok(store::release(&mut conn, &left).await?)
        }
        .await;
        match released {
            Ok(n) => tracing::info!(released = n, "released leases of unfinished attempts"),
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "releasing leases failed; they expire on their own"),
        }
    }
}

/// [`store::release_expired`]; a failure is logged and retried at the next sweep.
async fn release_expired(ctx: &Context) {
    let result = async {
        let mut conn = ctx.db.get().await?;
        anyhow::Ok(store::release_expired(&mut conn).await?)
    }
    .await;
    match result {
        Ok(0) => {}
        Ok(n) => tracing::info!(released = n, "put expired leases back"),
        Err(e) => tracing::warn!(error = %format!("{e:#}"), "putting expired leases back failed"),
    }
}

/// Gives leases back without an attempt ([`store::release`]) on a
/// connection of its own: due again at once, for any replica. Returns how
/// many were still held by these tokens. Errors: the pool's or the database's.
pub(crate) async fn give_back(db: &vid_db::Pool, claimed: &[Claimed]) -> anyhow::Result<usize> {
    let leases: Vec<_> = claimed.iter().map(|c| (c.id.clone(), c.locked_until)).collect();
    let mut conn = db.get().await?;
    Ok(store::release(&mut conn, &leases).await?)
}

/// One batch of leased deliveries, in its own task: opens their endpoints'
/// secrets ([`targets`]: once per endpoint; the leasing statement read the
/// endpoints), then starts each attempt as a task of its own holding its
/// in-process slot until its outcome is recorded, or settles or postpones
/// the delivery; ends when all its attempts have. Aborting it (the drain's
/// grace is over) aborts its attempts.
async fn run_batch(ctx: Arc<Context>, leases: Leases, done_tx: mpsc::UnboundedSender<Done>, handed: Handed) {
    let (claimed, places): (Vec<ClaimedForSend>, Vec<Place>) = handed.into_iter().unzip();
    let batch = targets(&ctx, claimed).await;
    let mut attempts = JoinSet::new();
    for ((c, target), place) in batch.into_iter().zip(places) {
        match target {
            Target::Send(ready) => {
                let (ctx, done_tx, leases) = (ctx.clone(), done_tx.clone(), leases.clone());
                attempts.spawn(async move {
                    let sent = match place {
                        // Claimed within the bound: sent at once, as the bound allows.
                        Place::Slot(_) => {
                            let record = attempt(&ctx, &c, &ready).await;
                            if record.success {
                                // No request of it is open: the loop's next claim may use its slot.
                                leases.lock().unwrap().answered(&c);
                            }
                            // Leases the fan-in took for this endpoint may be waiting at its gate.
                            let hold = blocks_gate(&record).then(|| {
                                let gate = ctx.gates.enter(&c.endpoint_id);
                                gate.block();
                                GateHold { gate, place: None, blocks: true }
                            });
                            Some((c, record, place, None, hold))
                        }
                        Place::Ahead(_) => send_through(&ctx, &leases, c, &ready, place).await,
                    };
                    // Not sent: given back, or left to the drain's release.
                    let Some((c, record, place, slot, gate)) = sent else { return };
                    // The recorder outlives every attempt task (see `drain`).
                    let _ = done_tx.send(Done { claimed: c, record, _permit: (place, slot), gate });
                });
            }
            Target::Settle(status) => {
                let _ends = ctx.lease_ends.read().await;
                settle(&ctx, &c, status).await;
                leases.lock().unwrap().forget(&c);
            }
            Target::Broken(e) => {
                tracing::warn!(error = %e, delivery_id = %c.id, "attempt could not run; postponing");
                let _ends = ctx.lease_ends.read().await;
                if let Ok(mut conn) = ctx.db.get().await {
                    let _ = store::postpone(&mut conn, &c, chrono::Duration::seconds(10)).await;
                }
                leases.lock().unwrap().forget(&c);
            }
        }
    }
    while attempts.join_next().await.is_some() {}
}

/// A lease sent ([`send_through`] or at once): the attempt's record, with
/// the lease's place, the slot its attempt took, and a failed attempt's hold
/// on its endpoint's gate.
type Sent = (Claimed, AttemptRecord, Place, Option<OwnedSemaphorePermit>, Option<GateHold>);

/// Whether a failed attempt blocks its endpoint's gate until recorded
/// ([`Gate::block`]): a 429/503 throttles the endpoint, a 410 or a
/// delivery out of retries may disable it.
fn blocks_gate(record: &AttemptRecord) -> bool {
    !record.success && (record.throttles() || record.gone() || record.retry_in.is_none())
}

/// A lease the fan-in took with a place of `lease_ahead` (ahead of the
/// bound, or within it) through its endpoint's gate ([`Gates`]): waits for
/// one of the endpoint's `per_endpoint_concurrency` places in this process,
/// then for a slot of `max_in_flight` (holding no slot while it waits at the
/// gate; waiting for a slot it goes before the claims, whose loop takes
/// only free slots), and only then
/// checks that it may still be sent: the scheduler is not draining (else it
/// is left to the drain's release), the gate lets it pass ([`Gate::passes`]:
/// no attempt that throttled the endpoint or may have disabled it awaits
/// its record or was recorded after this lease was taken), enough of its
/// lease is left for a whole attempt by its local deadline
/// ([`least_left_to_send`]), and its endpoint is still as its lease read it
/// ([`still_as_leased`]); otherwise it is given back. Leases claimed within
/// the bound never wait here: the database's count of live leases, this
/// process's waiting ones included, already bounds them, so no lease
/// holding a slot waits for a gate, and no gate holder waits for a slot
/// held by a waiter. The gate's place is freed when the answer is a 2xx;
/// a failed attempt keeps it, and blocks the gate if it throttles or may
/// disable the endpoint, until its outcome is recorded ([`GateHold`]).
/// `None`: not sent.
async fn send_through(ctx: &Context, leases: &Leases, c: Claimed, ready: &Ready, place: Place) -> Option<Sent> {
    let gate = ctx.gates.enter(&c.endpoint_id);
    let open = gate.sem.clone().acquire_owned().await.expect("a gate's semaphore is never closed");
    let slot = ctx.slots.clone().acquire_owned().await.expect("the slots' semaphore is never closed");
    let deadline = {
        let book = leases.lock().unwrap();
        if book.closed {
            return None;
        }
        book.deadline(&c)
    };
    let lease = ctx.settings.lease();
    let taken = deadline.and_then(|d| d.checked_sub(lease)).unwrap_or_else(std::time::Instant::now);
    let mut reason = if gate.passes(taken) { still_as_leased(ctx, &gate, &c, ready, taken).await.err() } else { Some("endpoint_failed") };
    // Last, right before sending: the re-read may have waited for a connection.
    let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now())).unwrap_or_default();
    if reason.is_none() && left < least_left_to_send(&ctx.settings) {
        reason = Some("lease_short");
    }
    if let Some(reason) = reason {
        drop((open, slot, gate));
        give_back_one(ctx, leases, &c, reason).await;
        return None;
    }
    let record = attempt(ctx, &c, ready).await;
    let hold = if record.success {
        // No request of it is open: the loop's next claim may use its slot.
        leases.lock().unwrap().answered(&c);
        None
    } else {
        // Before the gate's place could be freed, so no waiter passes first.
        let blocks = blocks_gate(&record);
        if blocks {
            gate.block();
        }
        Some(GateHold { gate, place: Some(open), blocks })
    };
    Some((c, record, place, Some(slot), hold))
}

/// A lease older than [`ENDPOINT_RECHECK`] is sent only if its endpoint,
/// read again (at most once per [`ENDPOINT_RECHECK`] per gate: then the
/// gate's other leases rely on that read), is exactly as the leasing
/// statement read it: enabled, not deleted, same URL, format and secrets.
/// Otherwise (or if it cannot be read) it is given back, and the claim's
/// rules decide: a paused endpoint is not sent to, a changed one is read
/// afresh. A lease just taken is sent as read, as before leasing ahead.
async fn still_as_leased(ctx: &Context, gate: &Gate, c: &Claimed, ready: &Ready, taken: std::time::Instant) -> Result<(), &'static str> {
    if taken.elapsed() < ENDPOINT_RECHECK || gate.verified_within(ENDPOINT_RECHECK) {
        return Ok(());
    }
    let fresh = async {
        let mut conn = ctx.db.get().await?;
        anyhow::Ok(store::load_endpoints(&mut conn, std::slice::from_ref(&c.endpoint_id)).await?)
    }
    .await;
    match fresh {
        Ok(fresh) if fresh.first() == Some(&ready.from) => {
            gate.verified();
            Ok(())
        }
        _ => Err("endpoint_changed"),
    }
}

/// How old a lease may be before its endpoint is read again at the gate
/// ([`still_as_leased`]): a lease leased ahead of the bound may wait there,
/// and a pause, a deletion or a new URL or secret must reach it about as
/// soon as it reaches a claim.
const ENDPOINT_RECHECK: Duration = Duration::from_secs(1);

/// Gives one lease back unsent ([`store::release`]: due at once, for any
/// replica), counted in `webhook_deliveries_given_back_total{reason}`; a
/// failure is logged and the lease left to expire. The lease is forgotten
/// either way: a release whose commit was not confirmed may have happened,
/// and counted as this process's own, another replica's lease of the
/// delivery would pass for it (a count too low is safe).
async fn give_back_one(ctx: &Context, leases: &Leases, c: &Claimed, reason: &'static str) {
    let ends = ctx.lease_ends.read().await;
    let released = async {
        let mut conn = ctx.db.get().await?;
        anyhow::Ok(store::release(&mut conn, &[(c.id.clone(), c.locked_until)]).await?)
    }
    .await;
    leases.lock().unwrap().forget(c);
    drop(ends);
    match released {
        Ok(_) => {
            counter!("webhook_deliveries_given_back_total", "reason" => reason).increment(1);
            ctx.wake.notify_one();
        }
        Err(e) => tracing::warn!(error = %format!("{e:#}"), delivery_id = %c.id, "giving a lease back failed; it expires on its own"),
    }
}

/// What to do with each leased delivery, from the endpoint its leasing
/// statement read ([`store::claim_for_send`], the fan-in's insert): send
/// (each endpoint's secrets opened once), settle `failed` (deleted, or no
/// such endpoint) or `paused` (disabled), or postpone (its secrets could
/// not be opened, or the endpoint could not be read again).
///
/// That read is the statement's snapshot, taken before its leases were
/// written: an `:enable`, or a new endpoint and its delivery, committed
/// while the claim ran is not in it. So a settling decision (final, or
/// `paused` until the next `:enable`) is never taken on it alone: the
/// endpoints it shows missing, disabled or deleted are read again now
/// ([`store::load_endpoints`], one query, rare) and decide; an enabled one
/// is sent to as read (as before, a change committed after the read and
/// before the request is not seen by this attempt).
async fn targets(ctx: &Context, claimed: Vec<ClaimedForSend>) -> Vec<(Claimed, Target)> {
    let mut endpoints: HashMap<EndpointId, EndpointForSend> = HashMap::new();
    let mut recheck: Vec<EndpointId> = Vec::new();
    for (c, e) in &claimed {
        match e {
            Some(e) if e.deleted_at.is_none() && e.status == EndpointStatus::Enabled => {
                endpoints.entry(e.id.clone()).or_insert_with(|| e.clone());
            }
            _ => recheck.push(c.endpoint_id.clone()),
        }
    }
    recheck.sort();
    recheck.dedup();
    let mut unreadable: Option<String> = None;
    if !recheck.is_empty() {
        let loaded = async {
            let mut conn = ctx.db.get().await?;
            anyhow::Ok(store::load_endpoints(&mut conn, &recheck).await?)
        }
        .await;
        match loaded {
            Ok(fresh) => {
                for e in fresh {
                    endpoints.insert(e.id.clone(), e);
                }
            }
            Err(e) => unreadable = Some(format!("reading the endpoint again failed: {e:#}")),
        }
    }
    let mut targets: HashMap<EndpointId, Arc<Target>> = HashMap::new();
    for (id, e) in &endpoints {
        let target = if e.deleted_at.is_some() {
            Target::Settle(DeliveryStatus::Failed)
        } else if e.status != EndpointStatus::Enabled {
            Target::Settle(DeliveryStatus::Paused)
        } else {
            match ready(&ctx.sealing_key, e) {
                Ok(r) => Target::Send(Arc::new(r)),
                Err(err) => Target::Broken(format!("{err:#}")),
            }
        };
        targets.insert(id.clone(), Arc::new(target));
    }
    claimed
        .into_iter()
        .map(|(c, _)| {
            let target = match (targets.get(&c.endpoint_id).map(|t| &**t), &unreadable) {
                (Some(Target::Send(r)), _) => Target::Send(r.clone()),
                (Some(Target::Settle(s)), _) => Target::Settle(*s),
                (Some(Target::Broken(e)), _) => Target::Broken(e.clone()),
                (None, Some(e)) => Target::Broken(e.clone()),
                (None, None) => Target::Settle(DeliveryStatus::Failed),
            };
            (c, target)
        })
        .collect()
}

/// Opens the endpoint's secrets (the current one, and the previous one
/// during a rotation overlap) and its signature scheme.
fn ready(key: &SealingKey, e: &EndpointForSend) -> anyhow::Result<Ready> {
    let mut secrets = vec![open_secret(key, &e.id, &e.secret_sealed)?];
    if let (Some(sealed), Some(expires)) = (&e.previous_secret_sealed, e.previous_secret_expires_at) {
        if expires > Utc::now() {
            secrets.push(open_secret(key, &e.id, sealed)?);
        }
    }
    let scheme = match SignatureFormat::parse(&e.signature_format).unwrap_or_default() {
        SignatureFormat::WebhookSignature => Scheme::WebhookSignature,
        SignatureFormat::StandardWebhooks => Scheme::StandardWebhooks,
    };
    Ok(Ready { url: e.url.clone(), scheme, secrets, from: e.clone() })
}

/// Ends a claim without an attempt ([`store::settle_without_attempt`]); a
/// failure is logged and the lease left to expire.
async fn settle(ctx: &Context, c: &Claimed, status: DeliveryStatus) {
    match ctx.db.get().await {
        Ok(mut conn) => {
            if let Err(e) = store::settle_without_attempt(&mut conn, c, status).await {
                tracing::warn!(error = %e, delivery_id = %c.id, "settling failed; the lease will expire");
            }
        }
        Err(e) => tracing::warn!(error = %e, delivery_id = %c.id, "settling failed; the lease will expire"),
    }
}

/// Signs and sends one attempt; returns what to record. Counts it in
/// `webhook_delivery_attempts_total{outcome}` and
/// `webhook_delivery_attempt_duration_seconds`.
async fn attempt(ctx: &Context, c: &Claimed, ready: &Ready) -> AttemptRecord {
    let started_at = Utc::now();
    let headers =
        vid_webhooks::signature_headers(ready.scheme, &ready.secrets, c.event_id.as_str(), started_at.timestamp(), c.payload.as_bytes());
    let clock = tokio::time::Instant::now();
    let outcome = ctx.sender.send(Request { url: ready.url.clone(), headers, body: Bytes::from(c.payload.clone()) }).await;
    let elapsed = clock.elapsed();
    counter!("webhook_delivery_attempts_total", "outcome" => outcome.metric_label()).increment(1);
    histogram!("webhook_delivery_attempt_duration_seconds").record(elapsed.as_secs_f64());
    let duration_ms = i32::try_from(elapsed.as_millis()).unwrap_or(i32::MAX);
    to_record(&ctx.settings, c, &outcome, started_at, duration_ms)
}

fn open_secret(key: &SealingKey, endpoint: &vid_core::EndpointId, sealed: &[u8]) -> anyhow::Result<Secret> {
    let plain = key.open(endpoint.as_str(), sealed)?;
    let text = String::from_utf8(plain)?;
    Ok(Secret::parse(&text)?)
}

#[cfg(test)]
mod handoff_tests {
    use super::*;

    /// The fan-in's lease request carries this process's answered leases
    /// (the lease book's, still held with the same token), so its bound
    /// counts open requests as the claim's does (migration 000260).
    #[test]
    fn the_fan_ins_lease_carries_the_answered_leases() {
        let settings: crate::Settings = vid_testkit::settings(&[]);
        let handoff = Handoff::new(&settings.dispatcher);
        let places = handoff.reserve(4);
        assert!(handoff.lease(&places).answered.is_empty());
        let token = chrono::Utc::now();
        let c = context::lease(&vid_core::DeliveryId::generate(), token);
        {
            let mut book = handoff.leases.lock().unwrap();
            book.took(&c, std::time::Instant::now() + Duration::from_secs(30), true);
            book.answered(&c);
        }
        let lease = handoff.lease(&places);
        assert_eq!(lease.answered, vec![(c.id.clone(), token)]);
        assert_eq!((lease.limit, lease.per_endpoint), (4, i32::try_from(settings.dispatcher.per_endpoint_concurrency).unwrap()));
        assert_eq!(lease.ahead.map(|a| a.max), Some(4), "four places of lease_ahead (on by default)");
        handoff.leases.lock().unwrap().forget(&c);
        assert!(handoff.lease(&places).answered.is_empty(), "a recorded lease is no longer answered");
    }

    /// A lease waiting at its gate needs a whole attempt and the recording
    /// margin left to be sent (the default lease of 35 s leaves 15 s to
    /// wait), or, of a lease shortened below that, all but a second.
    #[test]
    fn a_lease_needs_an_attempt_and_a_margin_left_to_be_sent() {
        let settings: crate::Settings = vid_testkit::settings(&[("dispatcher.request_timeout_ms", "15000")]);
        assert_eq!(least_left_to_send(&settings.dispatcher), Duration::from_secs(20));
        let short: crate::Settings = vid_testkit::settings(&[("dispatcher.request_timeout_ms", "15000"), ("dispatcher.lease_ms", "2000")]);
        assert_eq!(least_left_to_send(&short.dispatcher), Duration::from_secs(1));
        let shorter: crate::Settings =
            vid_testkit::settings(&[("dispatcher.request_timeout_ms", "15000"), ("dispatcher.lease_ms", "1000")]);
        assert_eq!(least_left_to_send(&shorter.dispatcher), Duration::from_millis(500));
    }

    /// Leasing ahead, the fan-in reserves places of `lease_ahead` only (no
    /// slot), asks for at most one lease a place, `batch_size` of them
    /// within the bound, with this process's own leases per endpoint,
    /// counting only those with more than [`OWN_LEASE_MARGIN`] left; without
    /// `lease_ahead` it reserves slots only, `batch_size` at most.
    #[test]
    fn the_fan_in_leases_ahead_with_its_own_live_leases() {
        let settings: crate::Settings =
            vid_testkit::settings(&[("dispatcher.batch_size", "8"), ("dispatcher.max_in_flight", "64"), ("dispatcher.lease_ahead", "100")]);
        let handoff = Handoff::new(&settings.dispatcher);
        let places = handoff.reserve(500);
        assert_eq!(places.len(), 100, "the lease_ahead places");
        assert!(places.iter().all(|p| matches!(p, Place::Ahead(_))), "no slot: a lease waiting at a gate holds none");
        let endpoint = vid_core::EndpointId::generate();
        let now = chrono::Utc::now();
        let mut long = context::lease(&vid_core::DeliveryId::generate(), now + chrono::Duration::seconds(30));
        long.endpoint_id = endpoint.clone();
        // Its token says a minute (the database's clock may run ahead), its
        // local deadline two seconds: the local deadline decides.
        let mut short = context::lease(&vid_core::DeliveryId::generate(), now + chrono::Duration::seconds(60));
        short.endpoint_id = endpoint.clone();
        {
            let mut book = handoff.leases.lock().unwrap();
            let local = std::time::Instant::now();
            book.took(&long, local + Duration::from_secs(30), true);
            book.took(&short, local + Duration::from_secs(2), true);
            // A claimed lease passes no gate: never counted as the fan-in's own.
            let mut claimed = context::lease(&vid_core::DeliveryId::generate(), now + chrono::Duration::seconds(30));
            claimed.endpoint_id = endpoint.clone();
            book.took(&claimed, local + Duration::from_secs(30), false);
            assert_eq!(book.deadline(&short), Some(local + Duration::from_secs(2)));
            let mut other_token = short.clone();
            other_token.locked_until += chrono::Duration::milliseconds(1);
            assert_eq!(book.deadline(&other_token), None, "another lease of the same delivery");
        }
        let lease = handoff.lease(&places);
        assert_eq!(lease.limit, 8, "batch_size within the bound");
        let ahead = lease.ahead.expect("leasing ahead");
        assert_eq!(ahead.max, 100, "one a place in all");
        assert_eq!(ahead.own, vec![(endpoint.clone(), 1)], "the lease with 2 s left locally is not counted as its own");
        handoff.leases.lock().unwrap().forget(&long);
        assert!(handoff.lease(&places).ahead.unwrap().own.is_empty(), "a forgotten lease is no longer its own");
        drop(places);

        let off: crate::Settings = vid_testkit::settings(&[("dispatcher.batch_size", "8"), ("dispatcher.lease_ahead", "0")]);
        let handoff = Handoff::new(&off.dispatcher);
        let places = handoff.reserve(500);
        assert_eq!(places.len(), 8, "slots only");
        assert!(places.iter().all(|p| matches!(p, Place::Slot(_))));
        assert_eq!(handoff.lease(&places).ahead, None);
    }
}
