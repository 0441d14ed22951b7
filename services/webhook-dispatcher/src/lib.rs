//! The webhook dispatcher: delivers every committed event to the tenant's
//! endpoints, signed, at least once, through two days of outage, without
//! ever reaching our own network and without one broken endpoint delaying
//! anyone else.
//!
//! # Flow
//!
//! ```text
//! api outbox ──▶ P.events ──▶ P.webhook.events ──▶ fanin ──▶ webhook_deliveries (pending)
//!                                                               │ scheduler: claim (lease)
//!                                                               ▼
//!                                 attempt: SSRF check → connect → signed POST
//!                                                               │ one transaction
//!                                                               ▼
//!                                 webhook_attempts + delivery status + endpoint health
//! ```
//!
//! - [`fanin`]: RabbitMQ → one delivery row per matching endpoint, acked after commit.
//! - [`scheduler`]: claims due deliveries (leases, per-endpoint concurrency bound) and runs attempts.
//! - [`attempt`]: the HTTP request (hyper 1, rustls), SSRF re-check, error classes.
//! - [`retry`]: schedule, jitter, `Retry-After` (pure).
//! - [`store`]: every SQL statement and the delivery state machine.
//! - [`listen`]: LISTEN for deliveries that became due elsewhere (wakes the scheduler).
//! - [`health`]: `/healthz`, `/readyz`, `/metrics`.
//!
//! # Metrics (`GET /metrics` on the health server)
//!
//! - `webhook_delivery_attempts_total{outcome}`: every attempt; `outcome` is
//!   `succeeded`, `http_4xx`/`http_5xx`/…, `redirect`, or the error class
//!   (`timeout`, `connect`, `dns`, `tls`, `blocked_address`, `http`).
//! - `webhook_delivery_attempt_duration_seconds`: histogram of attempt durations.
//! - `webhook_retry_backlog`: deliveries `pending` with a future next attempt
//!   (refreshed every `retry_backlog_interval_ms`).
//! - `webhook_endpoints_disabled_total{reason}`: `gone`, `failed_deliveries`, `failing_too_long`.
//! - `amqp_messages_consumed_total{queue,outcome}`: fan-in messages, `ack|requeue|reject`.
//!
//! # Ownership
//!
//! The dispatcher writes `webhook_deliveries`, `webhook_attempts` and the
//! health columns of `webhook_endpoints` (`status`, `disabled_reason`,
//! `disabled_at`, `consecutive_failures`, `failing_since`,
//! `last_success_at`, `throttled_until`). It reads the api's configuration
//! columns (URL, filter, format, sealed secrets). It writes `events` in one
//! place only: the `webhook_endpoint.disabled` event ([`store::disable`]).
//!
//! # Signing
//!
//! Every attempt is signed afresh (`t` = attempt time) with
//! [`vid_webhooks::signature_headers`]: the endpoint's current secret and,
//! while `previous_secret_expires_at` is in the future, its previous one
//! (two `v1` entries, new first). The id (`Webhook-Id`/`webhook-id`) is the
//! event id on every retry. Formats: `webhook-signature` (default;
//! `Webhook-Signature: t=…,v1=…`) and `standard-webhooks`
//! (<https://www.standardwebhooks.com/>).
//!
//! # Retry schedule
//!
//! After failed attempt `n` the delivery waits `retry_schedule_seconds[n-1]`
//! ±20 % jitter, or what `Retry-After` asks within `[step, max(step, 1 h)]`
//! (RFC 9110 §10.2.3; see [`retry`]). Production (`config/default.toml`):
//!
//! | after attempt | wait | first attempt + waits (nominal) |
//! |---:|---:|---:|
//! | 1 | 5 s | 5 s |
//! | 2 | 30 s | 35 s |
//! | 3 | 2 min | 2 min 35 s |
//! | 4 | 10 min | 12 min 35 s |
//! | 5 | 30 min | 42 min 35 s |
//! | 6 | 1 h | 1 h 43 min |
//! | 7 | 2 h | 3 h 43 min |
//! | 8 | 4 h | 7 h 43 min |
//! | 9 | 8 h | 15 h 43 min |
//! | 10 | 8 h | 23 h 43 min |
//! | 11 | 8 h | 31 h 43 min |
//!
//! 12 attempts; after the 12th fails the delivery is `failed`. With jitter
//! the last attempt lands between 0.8× and 1.2× the nominal total (25.4 h –
//! 38.1 h; at most 42.2 h with maximal `Retry-After`s, [`retry::horizon`]),
//! inside the required 24–48 h window (checked by the test
//! `retry_window_of_the_production_schedule`).
//!
//! `429` and `503` also slow the whole endpoint down (AIMD, like TCP's
//! congestion control):
//! - no attempt to it starts until that retry is due (`throttled_until`):
//!   the claim skips it meanwhile;
//! - the first 429/503 of a throttle halves its concurrency
//!   (`concurrency_limit`, at least 1; NULL means `per_endpoint_concurrency`),
//!   and every recorded success raises it by one until it is back at
//!   `per_endpoint_concurrency`. So when the throttle ends, a rate-limited
//!   endpoint gets at most half its former burst, not the full one.
//!
//! # Disabling
//!
//! An enabled endpoint is disabled when (defaults, `[dispatcher]` settings):
//! - it answers `410 Gone` (at once);
//! - `disable_after_failed_deliveries` (5) deliveries in a row ended `failed`
//!   with every retry used; or
//! - every attempt has failed for `disable_after_failing_seconds` (24 h)
//!   since the first failure after its last success.
//!
//! Disabling sets `status = disabled`, `disabled_reason`, `disabled_at`;
//! pending deliveries become `paused` (kept); new events are stored `paused`;
//! a `webhook_endpoint.disabled` event goes to the tenant's other enabled
//! endpoints. `POST /webhook-endpoints/{id}:enable` (api) resumes them all.
//!
//! # Shutdown
//!
//! On SIGTERM (or SIGINT): the fan-in stops consuming (messages received but
//! not yet fanned in go back to the queue when its channel closes; a batch
//! being inserted is committed and acked first), the scheduler stops
//! claiming, in-flight attempts get `shutdown_grace_seconds` (20 s) to
//! finish and are recorded, then the rest are aborted and their leases
//! released in one statement so any replica claims them at once; exit 0.
//! Within the grace period nothing is sent twice because of the shutdown;
//! an attempt aborted after its request went out is sent again later (at
//! least once). A crash loses nothing either: unacked messages are
//! redelivered and leases expire after `lease_ms`.
//!
//! # Throughput
//!
//! Per delivery the hot path costs a share of: one fan-in transaction per
//! batch of messages, one claim transaction per batch of deliveries (plus
//! one endpoint query), a pooled keep-alive HTTP request, and one recording
//! statement per batch of successes. See `scripts/bench-dispatch.sh` and
//! the README for measured figures.

pub mod attempt;
pub mod fanin;
pub mod health;
pub mod listen;
pub mod retry;
pub mod scheduler;
pub mod settings;
pub mod store;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::sync::{watch, Notify};
use vid_db::seal::SealingKey;
use vid_infra::ExposeSecret;
use vid_netguard::{Resolve, UrlPolicy};

pub use crate::attempt::ConnectObserver;
pub use crate::settings::Settings;

/// A built, not yet running dispatcher: settings checked, health port bound.
pub struct Dispatcher {
    settings: Settings,
    resolver: Arc<dyn Resolve>,
    observer: Option<ConnectObserver>,
    health: std::net::TcpListener,
    health_addr: SocketAddr,
}

impl Dispatcher {
    /// Checks the settings and binds `dispatcher.health_listen` (port 0 picks
    /// a free one). Nothing else is contacted yet.
    ///
    /// `resolver` resolves endpoint host names at every attempt
    /// ([`vid_netguard::SystemResolver`] in production; tests inject one).
    ///
    /// Errors: a malformed `webhooks.secret_key`, `amqp.url` or `database.url`,
    /// an empty retry schedule, an unbindable address.
    pub fn build(settings: Settings, resolver: Arc<dyn Resolve>) -> anyhow::Result<Self> {
        SealingKey::from_hex(settings.webhooks.secret_key.expose_secret())
            .context("webhooks.secret_key must be 64 hex characters (set VID__WEBHOOKS__SECRET_KEY)")?;
        anyhow::ensure!(!settings.dispatcher.retry_schedule_seconds.is_empty(), "dispatcher.retry_schedule_seconds is empty");
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

        let ctx =
            Arc::new(scheduler::Context { db: db.clone(), sender, sealing_key, settings: settings.dispatcher.clone(), wake: wake.clone() });
        let fanin = tokio::spawn(fanin::run(
            db.clone(),
            settings.amqp.clone(),
            settings.dispatcher.prefetch,
            wake.clone(),
            broker_up.clone(),
            stop_rx.clone(),
        ));
        let scheduler = tokio::spawn(scheduler::run(ctx, stop_rx.clone()));
        let listener = tokio::spawn(listen::run(settings.database.url.expose_secret().to_owned(), wake.clone(), stop_rx.clone()));
        let backlog = tokio::spawn(retry_backlog_gauge(
            db.clone(),
            std::time::Duration::from_millis(settings.dispatcher.retry_backlog_interval_ms.max(100)),
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
        let _ = listener.await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Sets the `webhook_retry_backlog` gauge (deliveries `pending` with a next
/// attempt in the future; [`store::retry_backlog`]) now and every `every`,
/// until `shutdown` turns true. A failed count leaves the last value.
async fn retry_backlog_gauge(db: vid_db::Pool, every: std::time::Duration, mut shutdown: watch::Receiver<bool>) {
    loop {
        if let Ok(mut conn) = db.get().await {
            match store::retry_backlog(&mut conn).await {
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
