//! The public HTTP API of the video platform, plus its background work.
//!
//! [`Application::build`] binds the listener (port 0 picks a free one, for
//! tests) and [`Application::run`] serves until stopped, alongside:
//! the outbox relay ([`outbox`]), the consumer of transcoder reports and dead
//! letters ([`consumers`]), the [`janitor`], and the LISTEN connection that
//! wakes operation waiters ([`watch`]).
//!
//! Invariant: the api never touches media bytes. Uploads go straight from
//! clients to storage; transcoding happens in the transcoder.

pub mod auth;
pub mod console;
pub mod consumers;
pub mod cors;
pub mod domain;
pub mod error;
pub mod idempotency;
pub mod janitor;
pub mod metrics;
pub mod openapi;
pub mod outbox;
pub mod routes;
pub mod settings;
pub mod state;
pub mod storage;
pub mod store;
pub mod watch;

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::middleware::ErrorHandlers;
use actix_web::{error::InternalError, web, App, HttpServer};
use anyhow::Context;
use vid_db::seal::SealingKey;
use vid_infra::amqp::Topology;
use vid_infra::ExposeSecret;
use vid_netguard::{SystemResolver, UrlPolicy};

use actix_web::ResponseError;

use crate::error::{codes, ApiError};
pub use crate::settings::Settings;
use crate::state::{AppState, Draining};

/// A built, bound, not yet running api.
pub struct Application {
    port: u16,
    listener: TcpListener,
    state: AppState,
    draining: tokio::sync::watch::Sender<bool>,
}

impl Application {
    /// Builds the state and binds `settings.api.listen`. Contacts nothing yet
    /// except the socket: the database pool and brokers connect lazily.
    ///
    /// Errors: a malformed sealing key, `amqp.url` or `s3.endpoint`, an unbindable address.
    pub fn build(settings: Settings) -> anyhow::Result<Self> {
        Self::build_with_resolver(settings, Arc::new(SystemResolver::new()))
    }

    /// [`Application::build`] with an injected DNS resolver (tests).
    pub fn build_with_resolver(settings: Settings, resolver: Arc<dyn vid_netguard::Resolve>) -> anyhow::Result<Self> {
        let sealing_key = SealingKey::from_hex(settings.webhooks.secret_key.expose_secret())
            .context("webhooks.secret_key must be 64 hex characters (set VID__WEBHOOKS__SECRET_KEY)")?;
        settings.amqp.check()?;
        settings.s3.check()?;
        settings.api.check_playback_base_url()?;
        let url_policy = UrlPolicy::strict()
            .with_require_https(settings.webhooks.require_https)
            .with_allow_cidrs(settings.webhooks.allow_cidrs.clone())
            .with_allowed_ports(settings.webhooks.allowed_ports.clone());
        vid_infra::metrics::install();
        let db = vid_db::pool(&settings.database)?;
        let (draining, draining_view) = Draining::new(Duration::from_secs(settings.api.stream_drain_seconds));
        let state = AppState {
            s3: vid_infra::storage::client(&settings.s3),
            presigner: vid_infra::storage::presigning_client(&settings.s3),
            topology: Topology::new(&settings.amqp.prefix),
            outbox: store::outbox::Outbox::new(Topology::new(&settings.amqp.prefix)),
            sealing_key: Arc::new(sealing_key),
            url_policy: Arc::new(url_policy),
            resolver,
            watchers: watch::Registry::new(
                db.clone(),
                settings.operations.max_watchers_per_tenant,
                settings.operations.max_watchers_per_client_token,
            ),
            draining: draining_view,
            db,
            settings: Arc::new(settings),
        };
        let listener = TcpListener::bind(&state.settings.api.listen).with_context(|| format!("binding {}", state.settings.api.listen))?;
        let port = listener.local_addr()?.port();
        Ok(Self { port, listener, state, draining })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The shared state (tests use it to reach the database).
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves HTTP and runs the background tasks until SIGTERM/SIGINT.
    ///
    /// SIGTERM (graceful): the listener closes at once (new connections are
    /// refused), in-flight requests get up to 30 s to finish, long-lived ones
    /// (`:wait`, event streams) end cleanly after `[api] stream_drain_seconds`
    /// (20 s; see [`Draining`]) so none is cut; then the report
    /// consumers finish the message in hand and the outbox relay its batch
    /// plus one last pass (up to [`DRAIN_TIMEOUT`]), and the rest stops.
    /// SIGINT stops at once.
    pub async fn run(self) -> anyhow::Result<()> {
        let state = self.state.clone();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let drained = [
            tokio::spawn(outbox::run_relay(state.db.clone(), state.settings.amqp.clone(), state.outbox.clone(), stop_rx.clone())),
            tokio::spawn(consumers::run(state.clone(), stop_rx)),
        ];
        let background = [
            tokio::spawn(janitor::run(state.clone(), Duration::from_secs(state.settings.operations.janitor_interval_seconds.max(1)))),
            tokio::spawn(watch::run_listener(state.watchers.clone(), state.settings.database.url.expose_secret().to_owned())),
        ];
        let draining = self.draining;
        let data = web::Data::new(state);
        let server = HttpServer::new(move || {
            App::new()
                // Inside the metrics middleware, so the 405 it rewrites still
                // gets its request id and is counted under its route pattern.
                // Innermost: routes HEAD as GET (the metrics and the 405
                // rewrite still see the client's method).
                .wrap(actix_web::middleware::from_fn(error::methods::head_as_get))
                // Preflights of the client-token routes, before the router's 405 (issue 21).
                .wrap(actix_web::middleware::from_fn(cors::cors))
                .wrap(ErrorHandlers::new().handler(StatusCode::METHOD_NOT_ALLOWED, error::methods::method_not_allowed))
                .wrap(actix_web::middleware::from_fn(metrics::observe))
                .wrap(actix_web::middleware::from_fn(openapi::docs_headers))
                // On every answer that does not set its own (the console and
                // Swagger UI set a full CSP): never framed (clickjacking, e.g. of Swagger UI's
                // "Try it out"), never content-sniffed, no Referer sent on.
                .wrap(
                    actix_web::middleware::DefaultHeaders::new()
                        .add((actix_web::http::header::X_FRAME_OPTIONS, "DENY"))
                        .add((actix_web::http::header::CONTENT_SECURITY_POLICY, "frame-ancestors 'none'"))
                        .add((actix_web::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
                        .add((actix_web::http::header::REFERRER_POLICY, "no-referrer")),
                )
                .app_data(data.clone())
                .app_data(json_config())
                .app_data(web::PathConfig::default().error_handler(|err, _| {
                    let answer = ApiError::new(codes::NOT_FOUND, err.to_string()).error_response();
                    InternalError::from_response(err, answer).into()
                }))
                .app_data(web::QueryConfig::default().error_handler(|err, _| {
                    let answer = ApiError::new(codes::INVALID_QUERY, err.to_string()).error_response();
                    InternalError::from_response(err, answer).into()
                }))
                .configure(routes::configure)
                .configure(openapi::configure)
                .configure(console::configure)
                // A path no resource matches. A known path with a method it
                // does not support is answered by its resource instead: `405`
                // with `Allow`, made a problem by `error::methods::method_not_allowed`.
                .default_service(web::to(|| async { ApiError::new(codes::NOT_FOUND, "no such route").error_response() }))
        })
        .shutdown_timeout(30)
        // A client that closes its connection ends its request at once: the
        // handler or response stream is dropped (freeing e.g. a watcher slot)
        // instead of living on until the next write fails.
        .h1_allow_half_closed(false)
        .listen(self.listener)?
        // Signals are ours (below), so SIGTERM can start the drain window too.
        .disable_signals()
        .run();
        let signals = spawn_signal_handler(server.handle(), draining);
        let result = server.await;
        signals.abort();
        tracing::info!("http server stopped; draining the consumers and the outbox relay");
        let _ = stop_tx.send(true);
        drain(drained, background).await;
        tracing::info!("api stopped");
        Ok(result?)
    }
}

/// Handles SIGTERM (drain: `draining` turns true, the server stops
/// gracefully) and SIGINT (stop now) for the server behind `handle`.
fn spawn_signal_handler(handle: actix_web::dev::ServerHandle, draining: tokio::sync::watch::Sender<bool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
            tracing::error!("cannot listen for SIGTERM");
            return;
        };
        tokio::select! {
            _ = term.recv() => {
                tracing::info!("SIGTERM received; refusing new connections, draining requests");
                let _ = draining.send(true);
                handle.stop(true).await;
            }
            _ = tokio::signal::ctrl_c() => {
                tracing::info!("SIGINT received; stopping now");
                handle.stop(false).await;
            }
        }
    })
}

/// Gives the `drained` tasks (told to stop already) up to [`DRAIN_TIMEOUT`]
/// to finish their work in hand, then aborts whatever still runs, and the
/// `background` tasks.
async fn drain(drained: [tokio::task::JoinHandle<()>; 2], background: [tokio::task::JoinHandle<()>; 2]) {
    let aborts: Vec<_> = drained.iter().map(|t| t.abort_handle()).collect();
    if tokio::time::timeout(DRAIN_TIMEOUT, futures::future::join_all(drained)).await.is_err() {
        tracing::warn!("drain timed out; stopping the background tasks");
        aborts.iter().for_each(|a| a.abort());
    }
    for task in background {
        task.abort();
    }
}

/// How long, after the HTTP server stopped, the consumers and the outbox
/// relay get to finish their work in hand.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);

/// JSON bodies: at most 64 KiB; malformed JSON, unknown fields and wrong types
/// are `400 invalid_json` problems naming the error; a wrong media type is
/// `415 unsupported_media_type` ([`error::json_error`]).
fn json_config() -> web::JsonConfig {
    web::JsonConfig::default().limit(routes::MAX_JSON_BODY_BYTES).error_handler(|err, _| {
        let answer = error::json_error(&err).error_response();
        InternalError::from_response(err, answer).into()
    })
}
