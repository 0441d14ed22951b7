//! The playback service: the stable `/play/{pb}…` URLs of ready videos.
//!
//! Stateless: it reads `playback_ids` joined to `videos` from PostgreSQL
//! and the stream's objects from the media bucket; its one write is the
//! resized-thumbnail cache, `<stream prefix>thumbnails/<ms>_<width>.jpg`
//! in the media bucket ([`images`], issue 20). It never talks to RabbitMQ or to another service, so it
//! scales on request load alone (k8s/base/playback.yaml).
//!
//! - [`paths`]: the strict path grammar (anything else is a 404);
//! - [`store`]: the one SQL query;
//! - [`lookup`]: a playback ID's entry (cache, store) once its policy allows the request;
//! - [`cache`]: the bounded lookup, manifest and image caches;
//! - [`rewrite`]: the one URI mapping applied to every manifest;
//! - [`known`]: the tracks and segments a stream has, from its cached manifests;
//! - [`conditional`]: RFC 9110 preconditions on media objects;
//! - [`storage`]: manifests read whole, media bytes proxied as a stream;
//! - [`routes`]: handlers, CORS, `Cache-Control`, health and metrics;
//! - [`images`]: storyboard, thumbnails (resized with `image`, cached in storage), poster;
//! - [`token`]: signed playback IDs' `?token=<JWT>` (RS256, the tenant's signing keys);
//! - [`error`]: the problem answers and their stable codes.

pub mod cache;
pub mod conditional;
pub mod error;
pub mod images;
pub mod known;
pub mod lookup;
pub mod metrics;
pub mod paths;
pub mod rewrite;
pub mod routes;
pub mod settings;
pub mod state;
pub mod storage;
pub mod store;
pub mod token;

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header;
use actix_web::{web, App, HttpServer};
use anyhow::Context;

pub use crate::settings::Settings;
use crate::state::AppState;

/// A built, bound, not yet running playback service.
pub struct Application {
    port: u16,
    listener: TcpListener,
    state: AppState,
}

impl Application {
    /// Builds the state and binds `[playback] listen`. Contacts nothing but
    /// the socket (the pool and the S3 client connect lazily).
    ///
    /// Errors: a malformed `s3.endpoint`, an unbindable address, a pool that cannot be built.
    pub fn build(settings: Settings) -> anyhow::Result<Self> {
        settings.s3.check()?;
        vid_infra::metrics::install();
        let p = &settings.playback;
        let state = AppState {
            db: vid_db::pool(&settings.database)?,
            s3: vid_infra::storage::client(&settings.s3),
            lookups: Arc::new(cache::LookupCache::new(Duration::from_millis(p.lookup_cache_ms), p.lookup_cache_entries)),
            manifests: Arc::new(cache::ManifestCache::new(p.manifest_cache_bytes)),
            images: Arc::new(cache::ManifestCache::new(p.image_cache_bytes)),
            signing_keys: Arc::new(cache::KeyCache::default()),
            manifest_cache_control: format!("public, max-age={}", p.manifest_max_age_seconds).into(),
            media_cache_control: format!("public, max-age={}, immutable", p.media_max_age_seconds).into(),
            settings: Arc::new(settings),
        };
        let listen = &state.settings.playback.listen;
        let listener = TcpListener::bind(listen).with_context(|| format!("binding playback.listen {listen}"))?;
        let port = listener.local_addr()?.port();
        Ok(Self { port, listener, state })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The shared state (tests reach the database through it).
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until SIGTERM (graceful: the listener closes, in-flight
    /// requests get `[playback] shutdown_grace_seconds`) or SIGINT.
    pub async fn run(self) -> anyhow::Result<()> {
        let grace = self.state.settings.playback.shutdown_grace_seconds;
        let workers = self.state.settings.playback.workers;
        let data = web::Data::new(self.state);
        // Built in a block: the (not `Send`) builder must not live across the await.
        let running = {
            let mut server = HttpServer::new(move || {
                App::new()
                    .wrap(actix_web::middleware::from_fn(metrics::observe))
                    // On every answer, errors included, so a player's script can read them.
                    .wrap(
                        actix_web::middleware::DefaultHeaders::new()
                            .add((header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"))
                            .add((header::ACCESS_CONTROL_EXPOSE_HEADERS, routes::EXPOSED_HEADERS))
                            .add((header::HeaderName::from_static("timing-allow-origin"), "*"))
                            .add((header::X_CONTENT_TYPE_OPTIONS, "nosniff")),
                    )
                    .app_data(data.clone())
                    .configure(routes::configure)
                    .default_service(web::to(routes::not_found))
            })
            .shutdown_timeout(grace)
            .listen(self.listener)?;
            if workers > 0 {
                server = server.workers(workers);
            }
            server.run()
        };
        running.await?;
        tracing::info!("playback stopped");
        Ok(())
    }
}

/// Waits (up to `database.startup_wait_seconds`) until PostgreSQL answers
/// and holds the `playback_ids` table (the api's migrations ran): the
/// service starts serving only once a lookup can work.
pub async fn wait_for_database(settings: &Settings) -> anyhow::Result<()> {
    use vid_db::RunQueryDsl;
    let pool = vid_db::pool(&settings.database)?;
    let limit = Duration::from_secs(settings.database.startup_wait_seconds);
    vid_infra::startup::wait_for("PostgreSQL", limit, || {
        let pool = pool.clone();
        async move {
            let mut conn = pool.get().await.map_err(|e| anyhow::anyhow!("connecting to PostgreSQL: {e}"))?;
            diesel::sql_query("SELECT 1 FROM playback_ids LIMIT 1")
                .execute(&mut conn)
                .await
                .map(|_| ())
                .map_err(|e| anyhow::anyhow!("reading playback_ids (have the api's migrations run?): {e}"))
        }
    })
    .await
}
