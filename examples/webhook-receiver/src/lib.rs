//! The reference webhook receiver: verify, answer fast, make duplicates harmless.
//!
//! * **Handler** (`POST /webhooks`): verifies the signature over the raw
//!   body with [`vid_webhooks`]; answers `400` when it fails, `200` when the
//!   event id was already processed, otherwise publishes the raw body to a
//!   durable RabbitMQ queue with publisher confirms and answers `200`, or
//!   `503` if the queue is unavailable so the sender retries. It never
//!   records the id.
//! * **Consumer** ([`consume`]): in one PostgreSQL transaction records the
//!   id in `seen_events` if absent (stopping if present) and applies the
//!   effect — upserting the local `videos` row only when the event's version is
//!   newer — then commits, then acks.
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! use clap::Parser;
//! # #[derive(Parser)] struct Cli { #[command(flatten)] config: vid_webhook_receiver::Config }
//! let config = Cli::parse().config;
//! let app = vid_webhook_receiver::App::build(config).await?;
//! println!("listening on port {}", app.port());
//! app.spawn_consumer();
//! app.run().await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod config;
pub mod consumer;
pub mod db;
pub mod event;
mod http;
pub mod queue;
pub mod schema;

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::dev::{Server, ServerHandle};
use actix_web::{web, HttpServer};
use anyhow::Context;

pub use config::Config;
pub use consumer::{consume, run_consumer, ConsumerExit, ConsumerOptions, ConsumerStats, StatsSnapshot};
pub use db::Pool;
pub use event::Outcome;
pub use http::{AppState, SEEN_CHECK_BUDGET};

/// The running HTTP server, bound and ready; [`App::run`] serves it.
pub struct App {
    port: u16,
    server: Server,
    state: web::Data<AppState>,
    config: Config,
}

impl App {
    /// Creates the database if missing, runs the receiver's migrations, and
    /// binds [`Config::listen`] (port 0 picks a free port). Does not need
    /// RabbitMQ: the handler connects on first use and answers `503` until it can.
    ///
    /// # Errors
    ///
    /// No secret configured, the database is unreachable, or the address is taken.
    pub async fn build(config: Config) -> anyhow::Result<App> {
        anyhow::ensure!(!config.secrets.is_empty(), "at least one --secret (or RECEIVER_SECRETS) is required");
        // Bind first: a taken address fails at once, not after the database is ready.
        let listener = TcpListener::bind(config.listen).with_context(|| format!("binding {}", config.listen))?;
        prepare_database(&config.database_url).await?;
        let pool = db::pool(&config.database_url, config.db_pool_size)?;
        let state = web::Data::new(AppState {
            pool,
            publisher: queue::EventPublisher::new(&config.amqp_url, &config.queue, config.publish_timeout()),
            secrets: config.secrets.clone(),
            verifier: config.verifier(),
            stats: Arc::new(ConsumerStats::default()),
        });

        let port = listener.local_addr()?.port();
        let app_state = state.clone();
        let server =
            HttpServer::new(move || actix_web::App::new().app_data(app_state.clone()).configure(http::routes)).listen(listener)?.run();
        tracing::info!(port, queue = %config.queue, "webhook receiver listening");
        Ok(App { port, server, state, config })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The database pool (tests read tables through it).
    pub fn pool(&self) -> &Pool {
        &self.state.pool
    }

    /// Counters of the consumer started by [`App::spawn_consumer`].
    pub fn stats(&self) -> Arc<ConsumerStats> {
        self.state.stats.clone()
    }

    /// A handle to stop the server gracefully.
    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Starts the consumer as a background task ([`run_consumer`]: reconnects
    /// forever), sharing this app's pool and counters.
    pub fn spawn_consumer(&self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(run_consumer(self.state.pool.clone(), ConsumerOptions::from_config(&self.config), self.state.stats.clone()))
    }

    /// Serves requests until the server is stopped.
    pub async fn run(self) -> std::io::Result<()> {
        self.server.await
    }
}

/// Creates the database named in `url` if missing and applies the migrations.
/// Any failure (typically an unreachable database) is retried with backoff for
/// [`PREPARE_PATIENCE`], the cause logged each time; then the last error is
/// returned. Each attempt is itself bounded ([`db::CONNECT_TIMEOUT`],
/// [`db::MIGRATE_TIMEOUT`]), so a server that accepts connections but never
/// answers is reported and retried, not waited on forever.
pub async fn prepare_database(url: &str) -> anyhow::Result<()> {
    // The database may be starting or restarting alongside us (compose, a pod
    // rollout, a failover): retry for up to PREPARE_PATIENCE before giving up.
    let started = std::time::Instant::now();
    let mut backoff = std::time::Duration::from_millis(250);
    loop {
        let attempt = async {
            db::ensure_database(url).await?;
            db::migrate(url).await
        };
        match attempt.await {
            Ok(applied) => {
                if !applied.is_empty() {
                    tracing::info!(?applied, "applied migrations");
                }
                return Ok(());
            }
            Err(e) if started.elapsed() < PREPARE_PATIENCE => {
                tracing::warn!(error = %format!("{e:#}"), retry_in_ms = backoff.as_millis() as u64, "database not ready; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// How long [`prepare_database`] keeps retrying an unreachable database.
pub const PREPARE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);
