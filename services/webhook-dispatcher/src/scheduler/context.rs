//! What the scheduler's parts share: the attempt [`Context`], the lease
//! book (which leases this process holds, and whether it still takes new
//! ones) and the claim's per-endpoint bound. A leaf: it imports nothing of
//! the scheduler, so `mod.rs` and `record.rs` both use it without a circle.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use vid_core::DeliveryId;
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
}

/// The leases this process holds, and whether it still takes new ones.
#[derive(Default)]
pub(super) struct LeaseBook {
    pub(super) held: HashMap<DeliveryId, DateTime<Utc>>,
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
        }
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
