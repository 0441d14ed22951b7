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
    /// Set when the scheduler starts draining: no lease is added afterwards.
    pub(super) closed: bool,
}

impl LeaseBook {
    /// Forgets the lease `c` holds, only if the book still has that very
    /// lease (its token): a newer lease of the same delivery, claimed after
    /// this one expired, stays to be released at shutdown.
    pub(super) fn forget(&mut self, c: &vid_deliveries::Claimed) {
        if self.held.get(&c.id) == Some(&c.locked_until) {
            self.held.remove(&c.id);
        }
    }
}

pub(super) type Leases = Arc<Mutex<LeaseBook>>;

/// `per_endpoint_concurrency` as the database wants it (at least 1).
pub(super) fn per_endpoint(ctx: &Context) -> i32 {
    i32::try_from(ctx.settings.per_endpoint_concurrency.max(1)).unwrap_or(i32::MAX)
}
