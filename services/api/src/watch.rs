//! Watching operations: what `POST /operations/{id}:wait` and
//! `GET /operations/{id}/events` wait on (issue 12).
//!
//! - Every change of an operation (status, progress, phase) bumps
//!   `operations.revision` and calls `pg_notify('operation_changed', '<op id>')`
//!   in the transaction that makes the change
//!   ([`crate::store::operations::record_change`], called by
//!   [`crate::domain::operation`]), so the
//!   notification is delivered on commit, to every api replica, and never for
//!   a change that rolled back.
//! - Each api process holds ONE dedicated PostgreSQL connection that LISTENs
//!   ([`run_listener`]). It uses `tokio-postgres` directly: diesel-async 0.5
//!   drives its connections in a task that discards asynchronous messages, so
//!   notifications cannot be read through the pool's connections.
//! - The [`Registry`] keeps one `tokio::sync::watch` channel per operation that
//!   someone in this process watches. On a notification for such an
//!   operation, it re-reads the row ONCE (at most one read in flight per
//!   operation, coalescing bursts) and publishes the snapshot; every waiter of
//!   that operation wakes from the channel. Operations nobody watches here are
//!   ignored, and nothing polls the database.
//! - After the listener (re)connects it re-reads every watched operation, so a
//!   notification lost while it was down cannot leave a waiter hanging.
//! - Waiters are counted per tenant, and those of a client token (issue 21)
//!   also per token, checked first, so one browser cannot take the tenant's
//!   whole bound; a [`Watch`] frees its slots when dropped
//!   (with the `:wait` future or with the event stream of a client that left).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use vid_core::operation::Operation;
use vid_core::{OperationId, TenantId, UploadId};

/// The PostgreSQL notification channel; the payload is the operation id.
pub const CHANNEL: &str = "operation_changed";

/// An operation at one revision.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// `operations.revision`.
    pub revision: i64,
    /// The public resource.
    pub operation: Arc<Operation>,
}

/// Reads an operation and its revision; with `tenant`, only if it is that tenant's.
pub async fn load(db: &vid_db::Pool, id: &OperationId, tenant: Option<&TenantId>) -> anyhow::Result<Option<Snapshot>> {
    let mut conn = db.get().await?;
    let row = crate::store::operations::get_with_revision(&mut conn, id, tenant).await?;
    Ok(row.map(|(row, revision)| Snapshot { revision, operation: Arc::new(row.into_operation()) }))
}

/// The tenant (or the client token) already holds `max` watchers on this process.
#[derive(Debug, Clone, Copy)]
pub struct TooManyWatchers {
    /// The bound.
    pub max: usize,
    /// Whether the bound reached is the client token's (`operations.max_watchers_per_client_token`)
    /// rather than the tenant's.
    pub per_token: bool,
}

struct Entry {
    tx: watch::Sender<Option<Snapshot>>,
    watchers: usize,
    refreshing: bool,
    dirty: bool,
}

#[derive(Default)]
struct Inner {
    ops: HashMap<OperationId, Entry>,
    tenants: HashMap<TenantId, usize>,
    tokens: HashMap<UploadId, usize>,
}

/// In-process fan-out of operation changes, and the per-tenant bound.
pub struct Registry {
    db: vid_db::Pool,
    max_per_tenant: usize,
    max_per_token: usize,
    inner: Mutex<Inner>,
}

impl Registry {
    /// An empty registry; `max_per_tenant` bounds each tenant's open
    /// watchers, `max_per_token` those of each client token (named by its upload).
    pub fn new(db: vid_db::Pool, max_per_tenant: usize, max_per_token: usize) -> Arc<Self> {
        Arc::new(Self { db, max_per_tenant, max_per_token, inner: Mutex::new(Inner::default()) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes one of the client token's slots (with `token`: the upload whose
    /// token calls), then one of the tenant's, and subscribes to the operation's
    /// changes. The caller then loads the operation (after subscribing, so no
    /// change can fall between the read and the subscription) and [`publish`](Self::publish)es it.
    pub fn subscribe(self: &Arc<Self>, tenant: &TenantId, token: Option<&UploadId>, id: &OperationId) -> Result<Watch, TooManyWatchers> {
        let mut inner = self.lock();
        if let Some(token) = token {
            if inner.tokens.get(token).copied().unwrap_or(0) >= self.max_per_token {
                return Err(TooManyWatchers { max: self.max_per_token, per_token: true });
            }
        }
        if inner.tenants.get(tenant).copied().unwrap_or(0) >= self.max_per_tenant {
            return Err(TooManyWatchers { max: self.max_per_tenant, per_token: false });
        }
        *inner.tenants.entry(tenant.clone()).or_default() += 1;
        if let Some(token) = token {
            *inner.tokens.entry(token.clone()).or_default() += 1;
        }
        let entry = inner.ops.entry(id.clone()).or_insert_with(|| Entry {
            tx: watch::channel(None).0,
            watchers: 0,
            refreshing: false,
            dirty: false,
        });
        entry.watchers += 1;
        let rx = entry.tx.subscribe();
        Ok(Watch { registry: self.clone(), tenant: tenant.clone(), token: token.cloned(), id: id.clone(), rx })
    }

    fn release(&self, tenant: &TenantId, token: Option<&UploadId>, id: &OperationId) {
        let mut inner = self.lock();
        if let Some(token) = token {
            if let Some(count) = inner.tokens.get_mut(token) {
                *count -= 1;
                if *count == 0 {
                    inner.tokens.remove(token);
                }
            }
        }
        if let Some(count) = inner.tenants.get_mut(tenant) {
            *count -= 1;
            if *count == 0 {
                inner.tenants.remove(tenant);
            }
        }
        if let Some(entry) = inner.ops.get_mut(id) {
            entry.watchers -= 1;
            if entry.watchers == 0 {
                inner.ops.remove(id);
            }
        }
    }

    /// Offers a snapshot to the operation's watchers; kept only if newer than what they have.
    pub fn publish(&self, id: &OperationId, snapshot: Snapshot) {
        let inner = self.lock();
        if let Some(entry) = inner.ops.get(id) {
            entry.tx.send_if_modified(|current| {
                if current.as_ref().is_some_and(|c| c.revision >= snapshot.revision) {
                    return false;
                }
                *current = Some(snapshot);
                true
            });
        }
    }

    /// The tenant's open watchers on this process.
    pub fn watchers(&self, tenant: &TenantId) -> usize {
        self.lock().tenants.get(tenant).copied().unwrap_or(0)
    }

    /// How many operations this process watches.
    pub fn watched_operations(&self) -> usize {
        self.lock().ops.len()
    }

    /// A notification arrived for `id`: re-read it (once, however many
    /// notifications arrive meanwhile) if anyone here watches it.
    pub fn notified(self: &Arc<Self>, id: &str) {
        let Ok(id) = id.parse::<OperationId>() else { return };
        {
            let mut inner = self.lock();
            let Some(entry) = inner.ops.get_mut(&id) else { return };
            if entry.refreshing {
                entry.dirty = true;
                return;
            }
            entry.refreshing = true;
        }
        let registry = self.clone();
        tokio::spawn(async move { registry.refresh(id).await });
    }

    /// Re-reads every watched operation (after the listener reconnected).
    pub fn wake_all(self: &Arc<Self>) {
        let ids: Vec<OperationId> = self.lock().ops.keys().cloned().collect();
        for id in ids {
            self.notified(id.as_str());
        }
    }

    async fn refresh(self: Arc<Self>, id: OperationId) {
        let mut failures = 0u32;
        loop {
            match load(&self.db, &id, None).await {
                Ok(Some(snapshot)) => self.publish(&id, snapshot),
                Ok(None) => {}
                Err(e) => {
                    failures += 1;
                    tracing::warn!(operation = %id, error = %format!("{e:#}"), "could not re-read a watched operation");
                    if failures < 5 {
                        tokio::time::sleep(Duration::from_millis(200 * u64::from(failures))).await;
                        continue;
                    }
                }
            }
            let mut inner = self.lock();
            let Some(entry) = inner.ops.get_mut(&id) else { return };
            if entry.dirty {
                entry.dirty = false;
                failures = 0;
                continue;
            }
            entry.refreshing = false;
            return;
        }
    }
}

/// One waiter: holds a tenant slot and a subscription until dropped.
pub struct Watch {
    registry: Arc<Registry>,
    tenant: TenantId,
    token: Option<UploadId>,
    id: OperationId,
    rx: watch::Receiver<Option<Snapshot>>,
}

impl Watch {
    /// Waits until a snapshot newer than `revision` is published, and returns it.
    pub async fn newer_than(&mut self, revision: i64) -> Snapshot {
        loop {
            if let Some(s) = self.rx.borrow_and_update().as_ref().filter(|s| s.revision > revision) {
                return s.clone();
            }
            if self.rx.changed().await.is_err() {
                // The sender lives as long as any Watch of this operation.
                futures::future::pending::<()>().await;
            }
        }
    }

    /// The newest snapshot published, if any.
    pub fn latest(&self) -> Option<Snapshot> {
        self.rx.borrow().clone()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.registry.release(&self.tenant, self.token.as_ref(), &self.id);
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How often the listening connection is checked with a query.
const PING_EVERY: Duration = Duration::from_secs(30);

/// Holds the LISTEN connection until the process exits: reconnects with
/// backoff after any failure and then wakes every waiter once.
pub async fn run_listener(registry: Arc<Registry>, database_url: String) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut connected = false;
        if let Err(e) = listen_session(&registry, &database_url, &mut connected).await {
            tracing::warn!(error = %format!("{e:#}"), "operation listener interrupted; reconnecting");
        }
        if connected {
            backoff = Duration::from_millis(100);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn listen_session(registry: &Arc<Registry>, url: &str, connected: &mut bool) -> anyhow::Result<()> {
    let (client, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Result<String, tokio_postgres::Error>>();
    let _driver = AbortOnDrop(tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                    if tx.send(Ok(n.payload().to_owned())).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        }
    }));
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    *connected = true;
    tracing::info!("operation listener connected");
    // Anything that changed while not listening: re-read it all once.
    registry.wake_all();
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    loop {
        tokio::select! {
            message = rx.recv() => match message {
                Some(Ok(id)) => registry.notified(&id),
                Some(Err(e)) => return Err(e.into()),
                None => anyhow::bail!("the listening connection closed"),
            },
            _ = ping.tick() => {
                tokio::time::timeout(Duration::from_secs(10), client.simple_query("SELECT 1")).await??;
            }
        }
    }
}
