//! The dispatcher as a service: [`Dispatcher::build`] checks the settings
//! and binds the health port; [`Dispatcher::run`] starts the fan-in, the
//! scheduler, the LISTEN task, the retry-backlog gauge, the event
//! reconciliation ([`reconcile`]) and the health server,
//! and on shutdown stops them in that order (see the crate docs, "Shutdown").

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::sync::{watch, Notify};
use vid_db::seal::SealingKey;
use vid_infra::ExposeSecret;
use vid_netguard::{Resolve, UrlPolicy};

use crate::attempt::{self, ConnectObserver};
use crate::settings::Settings;
use crate::{fanin, health, listen, reconcile, scheduler};

/// A built, not yet running dispatcher: settings checked, health port bound.
pub struct Dispatcher {
    settings: Settings,
    resolver: Arc<dyn Resolve>,
    observer: Option<ConnectObserver>,
    health: std::net::TcpListener,
    health_addr: SocketAddr,
}

/// The largest `dispatcher.batch_size` [`Dispatcher::build`] accepts: a
/// claim and a fan-in each take up to that many per-endpoint advisory locks
/// (`vid_deliveries::lease::ENDPOINT_LOCK_CLASS`), which live in
/// PostgreSQL's shared lock table.
pub const MAX_BATCH_SIZE: u32 = 512;

/// The longest `dispatcher.lease_ms` accepted: one day, in ms. A lease only
/// bounds how long a crashed replica's deliveries wait before another claims
/// them; anything longer is a misconfiguration.
pub const MAX_LEASE_MS: u128 = 86_400_000;

/// The largest `dispatcher.lease_ahead` [`Dispatcher::build`] accepts: every
/// lease held ahead of the bound holds its delivery's payload in memory, and
/// a crash leaves them all to wait out their leases.
pub const MAX_LEASE_AHEAD: u32 = 65_536;

pub use crate::settings::LEASE_MARGIN_MS;

impl Dispatcher {
    /// Checks the settings and binds `dispatcher.health_listen` (port 0 picks
    /// a free one). Nothing else is contacted yet.
    ///
    /// `resolver` resolves endpoint host names at every attempt
    /// ([`vid_netguard::SystemResolver`] in production; tests inject one).
    ///
    /// Errors: a malformed `webhooks.secret_key`, `amqp.url` or `database.url`,
    /// an empty retry schedule, a `batch_size` of 0 or above
    /// [`MAX_BATCH_SIZE`], a `lease_ms` of 0 or above [`MAX_LEASE_MS`], a
    /// `lease_ahead` above [`MAX_LEASE_AHEAD`], an
    /// unbindable address. A lease shorter than the request timeout (a whole
    /// attempt's bound) plus [`LEASE_MARGIN_MS`] is logged as a warning
    /// (allowed: tests shorten it on purpose).
    pub fn build(settings: Settings, resolver: Arc<dyn Resolve>) -> anyhow::Result<Self> {
        SealingKey::from_hex(settings.webhooks.secret_key.expose_secret())
            .context("webhooks.secret_key must be 64 hex characters (set VID__WEBHOOKS__SECRET_KEY)")?;
        anyhow::ensure!(!settings.dispatcher.retry_schedule_seconds.is_empty(), "dispatcher.retry_schedule_seconds is empty");
        // A claim and a fan-in each hold up to batch_size endpoint locks;
        // PostgreSQL's shared lock table (max_locks_per_transaction ×
        // (max_connections + max_prepared_transactions): 6,400 by default) is
        // shared by every replica and every other session of the server.
        anyhow::ensure!(
            (1..=MAX_BATCH_SIZE).contains(&settings.dispatcher.batch_size),
            "dispatcher.batch_size must be 1 to {MAX_BATCH_SIZE} (each claim holds up to that many locks in PostgreSQL), not {}",
            settings.dispatcher.batch_size
        );
        // Checked here, not at the first claim: PostgreSQL refuses a lease
        // below 1 ms (22023) and overflows far past a day (22008), and every
        // claim would fail the same way for as long as the process runs.
        let lease_ms = settings.dispatcher.lease().as_millis();
        let lease_from = match settings.dispatcher.lease_ms {
            Some(_) => "dispatcher.lease_ms",
            None => "the lease (dispatcher.lease_ms unset: connect_timeout_ms + request_timeout_ms + 15000)",
        };
        anyhow::ensure!((1..=MAX_LEASE_MS).contains(&lease_ms), "{lease_from} must be 1 to {MAX_LEASE_MS} ms, not {lease_ms}");
        // request_timeout bounds a whole attempt, connect included.
        let attempt_ms = u128::from(settings.dispatcher.request_timeout_ms);
        if lease_ms < attempt_ms + LEASE_MARGIN_MS {
            tracing::warn!(
                lease_ms,
                request_timeout_ms = attempt_ms,
                margin_ms = LEASE_MARGIN_MS,
                "dispatcher.lease_ms is shorter than request_timeout_ms plus a margin for recording the outcome: a lease can expire while its attempt runs, and another claim then sends the delivery \
                 again (a duplicate, still at least once)"
            );
        }
        anyhow::ensure!(
            settings.dispatcher.lease_ahead <= MAX_LEASE_AHEAD,
            "dispatcher.lease_ahead must be 0 to {MAX_LEASE_AHEAD}, not {}",
            settings.dispatcher.lease_ahead
        );
        settings.amqp.check()?;
        settings.database.url.expose_secret().parse::<url::Url>().map_err(|e| anyhow::anyhow!("database.url is not a URL: {e}"))?;
        let health = std::net::TcpListener::bind(&settings.dispatcher.health_listen)
            .with_context(|| format!("binding {}", settings.dispatcher.health_listen))?;
        health.set_nonblocking(true)?;
        let health_addr = health.local_addr()?;
        Ok(Self { settings, resolver, observer: None, health, health_addr })
    }

    /// Calls `observer` with every address the dispatcher is about to connect
    /// to (tests prove with it that refused addresses are never contacted).
    pub fn with_connect_observer(mut self, observer: ConnectObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The bound health address.
    pub fn health_addr(&self) -> SocketAddr {
        self.health_addr
    }

    /// Runs fan-in, scheduler and health server until `shutdown` completes,
    /// then drains (see the crate docs) and returns `Ok(())`.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let Dispatcher { settings, resolver, observer, health, .. } = self;
        let sealing_key = SealingKey::from_hex(settings.webhooks.secret_key.expose_secret())?;
        let policy = UrlPolicy::strict()
            .with_require_https(settings.webhooks.require_https)
            .with_allow_cidrs(settings.webhooks.allow_cidrs.clone())
            .with_allowed_ports(settings.webhooks.allowed_ports.clone());
        let d = &settings.dispatcher;
        vid_infra::metrics::install();
        let sender = attempt::Sender::new(
            policy,
            resolver,
            d.connect_timeout(),
            d.request_timeout(),
            d.max_response_body_bytes,
            d.pool_max_idle_per_host,
            observer,
        )?;
        let db = vid_db::pool(&settings.database)?;
        let wake = Arc::new(Notify::new());
        let broker_up = Arc::new(AtomicBool::new(false));
        let (stop_tx, stop_rx) = watch::channel(false);

        let handoff = scheduler::Handoff::new(&settings.dispatcher);
        let ctx = Arc::new(scheduler::Context {
            db: db.clone(),
            sender,
            sealing_key,
            settings: settings.dispatcher.clone(),
            wake: wake.clone(),
            lease_ends: handoff.lease_ends(),
            gates: handoff.gates(),
            slots: handoff.slots(),
        });
        let fanin = tokio::spawn(fanin::run(
            db.clone(),
            settings.amqp.clone(),
            settings.dispatcher.prefetch,
            wake.clone(),
            handoff.clone(),
            broker_up.clone(),
            stop_rx.clone(),
        ));
        let scheduler = tokio::spawn(scheduler::run(ctx, handoff, stop_rx.clone()));
        let listener = tokio::spawn(listen::run(settings.database.url.expose_secret().to_owned(), wake.clone(), stop_rx.clone()));
        let backlog = tokio::spawn(retry_backlog_gauge(
            db.clone(),
            std::time::Duration::from_millis(settings.dispatcher.retry_backlog_interval_ms.max(100)),
            stop_rx.clone(),
        ));
        let reconciler = tokio::spawn(reconcile::run(
            db.clone(),
            settings.dispatcher.reconcile_window(),
            settings.dispatcher.reconcile_interval(),
            wake.clone(),
            stop_rx.clone(),
        ));
        let health = tokio::spawn(health::serve(tokio::net::TcpListener::from_std(health)?, db, broker_up, stop_rx));

        shutdown.await;
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
        let _ = fanin.await;
        let _ = scheduler.await;
        let _ = health.await;
        let _ = backlog.await;
        let _ = reconciler.await;
        let _ = listener.await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Sets the `webhook_retry_backlog` gauge (deliveries `pending` with a next
/// attempt in the future; [`vid_deliveries::retry_backlog`]) now and every `every`,
/// until `shutdown` turns true. A failed count leaves the last value.
async fn retry_backlog_gauge(db: vid_db::Pool, every: std::time::Duration, mut shutdown: watch::Receiver<bool>) {
    loop {
        if let Ok(mut conn) = db.get().await {
            match vid_deliveries::retry_backlog(&mut conn).await {
                Ok(n) => vid_infra::metrics::gauge!("webhook_retry_backlog").set(n as f64),
                Err(e) => tracing::debug!(error = %e, "counting the retry backlog failed"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// [`Dispatcher::build`] then [`Dispatcher::run`].
pub async fn run(settings: Settings, resolver: Arc<dyn Resolve>, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    Dispatcher::build(settings, resolver)?.run(shutdown).await
}
