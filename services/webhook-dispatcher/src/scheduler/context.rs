//! What the scheduler's parts share: the attempt [`Context`], the lease
//! book (which leases this process holds, and whether it still takes new
//! ones) and the claim's per-endpoint bound. A leaf: it imports nothing of
//! the scheduler, so `mod.rs` and `record.rs` both use it without a circle.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, OwnedSemaphorePermit, RwLock, Semaphore};
use vid_core::{DeliveryId, EndpointId};
use vid_db::seal::SealingKey;

use crate::attempt::Sender;
use crate::settings::DispatcherSettings;

/// Everything an attempt needs.
pub struct Context {
    /// Database.
    pub db: vid_db::Pool,
    /// HTTP sender (SSRF policy, resolver, TLS, timeouts).
    pub sender: Sender,
    /// Opens endpoint secrets.
    pub sealing_key: SealingKey,
    /// `[dispatcher]` settings.
    pub settings: DispatcherSettings,
    /// Wakes the scheduler.
    pub wake: Arc<Notify>,
    /// Held (shared) by every statement that ends one of this process's
    /// leases (record, settle, postpone, release) from just before its
    /// lease leaves the lease book's count to after it is forgotten; held
    /// (exclusively) by a fan-in that leases ahead of the bound, from its
    /// count of this process's leases to its commit, so that no lease it
    /// counted ends in between ([`vid_deliveries::Ahead::own`]). From
    /// [`super::Handoff::lease_ends`].
    pub lease_ends: Arc<RwLock<()>>,
    /// This process's own bound per endpoint ([`Gates`]). From [`super::Handoff::gates`].
    pub gates: Arc<Gates>,
    /// `max_in_flight`'s slots, for the attempts of leases taken ahead of
    /// the bound (which hold none until they send). From [`super::Handoff::slots`].
    pub slots: Arc<Semaphore>,
}

/// What a lease holds in this process until its outcome is recorded (or it
/// is given back): a slot of `max_in_flight` taken with the lease (claims,
/// and the fan-in's leases within the bound), or a place of `lease_ahead`,
/// whose attempt takes a slot only when it sends.
pub enum Place {
    /// A slot of `max_in_flight`.
    Slot(OwnedSemaphorePermit),
    /// A place of `lease_ahead`.
    Ahead(OwnedSemaphorePermit),
}

/// This process's bound on the requests it opens to each endpoint
/// (`per_endpoint_concurrency`) for the leases the fan-in took with places
/// of `lease_ahead`: each passes its endpoint's gate before sending, and
/// frees its place there when answered 2xx, or, having failed, once its
/// outcome is recorded (as the database counts it). The database bounds the
/// leases of all replicas; once the fan-in has leased ahead of the bound
/// this process holds more leases than the bound, and the gate is what
/// keeps its open requests within it (claimed leases are within the bound
/// and pass no gate). An attempt (claimed or not) that throttles or may
/// disable the endpoint blocks its gate until its outcome is recorded, and
/// afterwards the gate gives back every lease taken before that record
/// (released, due at once) instead of sending it, so a 429/503's throttle,
/// a lowered concurrency or a disabled endpoint applies to them through the
/// claim's rules ([`Gate::passes`]).
pub struct Gates {
    per_endpoint: usize,
    gates: Mutex<HashMap<EndpointId, (Arc<Gate>, usize)>>,
}

/// A use of an endpoint's gate ([`Gates::enter`]): derefs to the gate, and
/// ends the use when dropped (the gate lives while in use).
pub struct GateUse {
    gate: Arc<Gate>,
    gates: Arc<Gates>,
    endpoint: EndpointId,
}

impl std::ops::Deref for GateUse {
    type Target = Gate;
    fn deref(&self) -> &Gate {
        &self.gate
    }
}

impl Drop for GateUse {
    fn drop(&mut self) {
        self.gates.leave(&self.endpoint);
    }
}

/// A failed attempt's hold on its endpoint's gate until its outcome is
/// recorded: the gate's place (a lease the fan-in took: the place counts as
/// the database counts the lease, until recorded), and whether the attempt
/// blocks the gate ([`Gate::block`]). The recorder drops it once the
/// outcome is written (or given up on); dropped, it lifts the block.
pub struct GateHold {
    /// The gate, in use while held.
    pub gate: GateUse,
    /// The gate's place, if the attempt had one.
    pub place: Option<OwnedSemaphorePermit>,
    /// Whether the attempt blocked the gate.
    pub blocks: bool,
}

impl Drop for GateHold {
    /// The attempt's outcome is recorded (or will never be: the lease then
    /// expires): the place is freed and the block lifted.
    fn drop(&mut self) {
        if self.blocks {
            self.gate.recorded();
        }
    }
}

/// One endpoint's gate ([`Gates`]).
pub struct Gate {
    /// `per_endpoint_concurrency` permits.
    pub sem: Arc<Semaphore>,
    /// Attempts that throttled the endpoint or may have disabled it, not yet recorded.
    blocking: std::sync::atomic::AtomicUsize,
    /// When the last of them was recorded.
    cleared: Mutex<Option<std::time::Instant>>,
    /// When the endpoint was last read again and found as leased.
    verified: Mutex<Option<std::time::Instant>>,
}

impl Gate {
    /// Whether the endpoint was read again and found as leased within `within`.
    pub fn verified_within(&self, within: std::time::Duration) -> bool {
        self.verified.lock().unwrap().is_some_and(|t| t.elapsed() < within)
    }

    /// Notes that the endpoint was just read again and found as leased.
    pub fn verified(&self) {
        *self.verified.lock().unwrap() = Some(std::time::Instant::now());
    }

    /// Whether a lease whose leasing statement was sent at `taken` may be
    /// sent: no attempt that throttled the endpoint or may have disabled it
    /// awaits its record, and none was recorded after `taken` (a lease taken
    /// later was taken knowing it: the leasing statements skip a throttled
    /// endpoint and lease within a lowered concurrency only).
    pub fn passes(&self, taken: std::time::Instant) -> bool {
        self.blocking.load(std::sync::atomic::Ordering::SeqCst) == 0 && self.cleared.lock().unwrap().is_none_or(|t| t < taken)
    }

    /// An attempt throttled the endpoint or may have disabled it: blocks
    /// the gate until [`Gate::recorded`].
    pub fn block(&self) {
        self.blocking.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Every lease taken before now is given back rather than sent: an
    /// attempt's record disabled or throttled the endpoint.
    pub fn clear(&self) {
        *self.cleared.lock().unwrap() = Some(std::time::Instant::now());
    }

    /// The outcome of an attempt that blocked the gate ([`Gate::block`]) is recorded.
    pub fn recorded(&self) {
        *self.cleared.lock().unwrap() = Some(std::time::Instant::now());
        self.blocking.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Gates {
    /// Gates of `per_endpoint` (at least 1) permits each.
    pub fn new(per_endpoint: u32) -> Gates {
        Gates { per_endpoint: per_endpoint.max(1) as usize, gates: Mutex::default() }
    }

    /// The endpoint's gate, in use until the returned guard is dropped
    /// (also when its task is aborted).
    pub fn enter(self: &Arc<Self>, endpoint: &EndpointId) -> GateUse {
        GateUse { gate: self.open(endpoint), gates: self.clone(), endpoint: endpoint.clone() }
    }

    /// The endpoint's gate, counted as in use until [`Gates::leave`].
    fn open(&self, endpoint: &EndpointId) -> Arc<Gate> {
        let mut gates = self.gates.lock().unwrap();
        let entry = gates.entry(endpoint.clone()).or_insert_with(|| {
            let gate = Gate {
                sem: Arc::new(Semaphore::new(self.per_endpoint)),
                blocking: Default::default(),
                cleared: Mutex::default(),
                verified: Mutex::default(),
            };
            (Arc::new(gate), 0)
        });
        entry.1 += 1;
        entry.0.clone()
    }

    /// Ends a use of the endpoint's gate ([`Gates::open`]); the last one removes it.
    fn leave(&self, endpoint: &EndpointId) {
        let mut gates = self.gates.lock().unwrap();
        if let Some(entry) = gates.get_mut(endpoint) {
            entry.1 -= 1;
            if entry.1 == 0 {
                gates.remove(endpoint);
            }
        }
    }

    /// Endpoints with a gate in use (tests).
    #[cfg(test)]
    pub(super) fn in_use(&self) -> usize {
        self.gates.lock().unwrap().len()
    }
}

/// The leases this process holds, and whether it still takes new ones.
#[derive(Default)]
pub(super) struct LeaseBook {
    /// Each held lease's claim token, by delivery.
    pub(super) held: HashMap<DeliveryId, DateTime<Utc>>,
    /// Each held lease's endpoint, local deadline, and whether it passes its
    /// endpoint's gate (a lease the fan-in took with a place of
    /// `lease_ahead`), by delivery (kept with `held`): the deadline is an
    /// `Instant` taken before its leasing statement was sent, plus the
    /// lease, so it never falls after the database's `locked_until` whatever
    /// the two clocks say.
    pub(super) meta: HashMap<DeliveryId, (EndpointId, std::time::Instant, bool)>,
    /// The held leases whose attempt succeeded (a 2xx answer: no request of
    /// theirs is open) and whose outcome is not written yet, by claim token:
    /// a claim leaves them out of the per-endpoint bound
    /// ([`vid_deliveries::claim_answered`]). Only an entry whose token is
    /// still the one in `held` counts ([`LeaseBook::answered_leases`]): a
    /// newer lease of the same delivery is a request not yet answered.
    /// Failed attempts are not entered: a 429/503 throttles the endpoint only
    /// once recorded, and until then its slot stays taken.
    pub(super) answered: HashMap<DeliveryId, DateTime<Utc>>,
    /// Set when the scheduler starts draining: no lease is added afterwards.
    pub(super) closed: bool,
}

impl LeaseBook {
    /// Forgets the lease `c` holds, only if the book still has that very
    /// lease (its token): a newer lease of the same delivery, claimed after
    /// this one expired, stays to be released at shutdown.
    pub(super) fn forget(&mut self, c: &vid_deliveries::Claimed) {
        if self.answered.get(&c.id) == Some(&c.locked_until) {
            self.answered.remove(&c.id);
        }
        if self.held.get(&c.id) == Some(&c.locked_until) {
            self.held.remove(&c.id);
            self.meta.remove(&c.id);
        }
    }

    /// Enters a lease just taken (its statement committed) with its local
    /// `deadline`, and whether it passes its endpoint's gate ([`LeaseBook::meta`]).
    pub(super) fn took(&mut self, c: &vid_deliveries::Claimed, deadline: std::time::Instant, gated: bool) {
        self.held.insert(c.id.clone(), c.locked_until);
        self.meta.insert(c.id.clone(), (c.endpoint_id.clone(), deadline, gated));
    }

    /// The local deadline of the lease `c` holds, while the book still has
    /// that very lease.
    pub(super) fn deadline(&self, c: &vid_deliveries::Claimed) -> Option<std::time::Instant> {
        if self.held.get(&c.id) != Some(&c.locked_until) {
            return None;
        }
        self.meta.get(&c.id).map(|(_, d, _)| *d)
    }

    /// The held leases per endpoint that pass its gate and whose local
    /// deadline is after `after` (the fan-in's own count:
    /// [`vid_deliveries::Ahead::own`]). Claimed leases are left out: they
    /// pass no gate, so while one is live the database counts a lease this
    /// process's gate does not, and the fan-in leases within the bound only.
    pub(super) fn own_counts(&self, after: std::time::Instant) -> Vec<(EndpointId, i64)> {
        let mut counts: HashMap<&EndpointId, i64> = HashMap::new();
        for (e, deadline, gated) in self.meta.values() {
            if *gated && *deadline > after {
                *counts.entry(e).or_default() += 1;
            }
        }
        counts.into_iter().map(|(e, n)| (e.clone(), n)).collect()
    }

    /// Notes that the attempt of the lease `c` succeeded (only while the
    /// book still holds that very lease).
    pub(super) fn answered(&mut self, c: &vid_deliveries::Claimed) {
        if self.held.get(&c.id) == Some(&c.locked_until) {
            self.answered.insert(c.id.clone(), c.locked_until);
        }
    }

    /// The answered leases still held with the same token, as (delivery,
    /// claim token), for a claim.
    pub(super) fn answered_leases(&self) -> Vec<(DeliveryId, DateTime<Utc>)> {
        self.answered.iter().filter(|(id, token)| self.held.get(*id) == Some(*token)).map(|(id, token)| (id.clone(), *token)).collect()
    }
}

pub(super) type Leases = Arc<Mutex<LeaseBook>>;

/// `per_endpoint_concurrency` as the database wants it (at least 1).
pub(super) fn per_endpoint(ctx: &Context) -> i32 {
    i32::try_from(ctx.settings.per_endpoint_concurrency.max(1)).unwrap_or(i32::MAX)
}

/// A lease of delivery `id` with claim token `token` (other fields made
/// up), for the lease book's tests.
#[cfg(test)]
pub(super) fn lease(id: &DeliveryId, token: DateTime<Utc>) -> vid_deliveries::Claimed {
    vid_deliveries::Claimed {
        id: id.clone(),
        endpoint_id: vid_core::EndpointId::generate(),
        tenant_id: vid_core::TenantId::generate(),
        event_id: vid_core::EventId::generate(),
        payload: "{}".to_owned(),
        attempt_count: 0,
        manual_retry: false,
        locked_until: token,
    }
}

#[cfg(test)]
mod tests {
    use chrono::Duration;

    use super::*;

    /// A gate has `per_endpoint_concurrency` places and lives while in use;
    /// an attempt that blocks it keeps every lease from passing until it is
    /// recorded, and afterwards the leases taken before that record; the
    /// other endpoint's gate is not affected.
    #[test]
    fn a_gate_bounds_its_endpoint_and_a_throttle_blocks_it_until_recorded() {
        let gates = Arc::new(Gates::new(2));
        let (a, b) = (EndpointId::generate(), EndpointId::generate());
        let (ga, ga2, gb) = (gates.enter(&a), gates.enter(&a), gates.enter(&b));
        assert!(Arc::ptr_eq(&ga.gate, &ga2.gate), "one gate per endpoint");
        let (p1, p2) = (ga.sem.clone().try_acquire_owned().unwrap(), ga.sem.clone().try_acquire_owned().unwrap());
        assert!(ga.sem.clone().try_acquire_owned().is_err(), "two places, not three");
        drop((p1, p2));
        let before = std::time::Instant::now();
        assert!(ga.passes(before));
        ga.block();
        let during = std::time::Instant::now();
        assert!(!ga.passes(before) && !ga.passes(during), "blocked until recorded");
        assert!(gb.passes(before), "another endpoint's gate");
        ga.recorded();
        let after = std::time::Instant::now();
        assert!(!ga.passes(during), "a lease taken before the record");
        assert!(ga.passes(after), "a lease taken after it");
        drop(ga);
        assert_eq!(gates.in_use(), 2, "a still in use once");
        drop((ga2, gb));
        assert_eq!(gates.in_use(), 0, "unused gates are dropped");
    }

    /// An answered mark counts only for the very lease it was made for: once
    /// the delivery's lease expired and this process leased it again (a new
    /// token in `held`, its request open), the old mark frees nothing, and
    /// forgetting the old lease leaves the new one alone.
    #[test]
    fn an_answered_mark_counts_for_its_own_lease_only() {
        let id = DeliveryId::generate();
        let old = Utc::now();
        let mut book = LeaseBook::default();
        book.held.insert(id.clone(), old);
        book.answered(&lease(&id, old));
        assert_eq!(book.answered_leases(), vec![(id.clone(), old)]);

        let new = old + Duration::seconds(30);
        book.held.insert(id.clone(), new);
        assert!(book.answered_leases().is_empty(), "the old mark freed the new lease's slot");
        book.answered(&lease(&id, old));
        assert!(book.answered_leases().is_empty(), "a mark for a lease no longer held");

        book.forget(&lease(&id, old));
        assert_eq!(book.held.get(&id), Some(&new), "forgetting the old lease dropped the new one");
        book.answered(&lease(&id, new));
        assert_eq!(book.answered_leases(), vec![(id.clone(), new)]);
        book.forget(&lease(&id, new));
        assert!(book.held.is_empty() && book.answered.is_empty());
    }
}
