//! The database layer shared by the api and the webhook-dispatcher.
//!
//! - [`schema`]: diesel table definitions, in step with `migrations/`.
//! - [`migrate`]: embedded migrations, run by `api migrate` (and the k8s migration Job).
//! - [`Pool`]: a deadpool of diesel-async connections (no libpq needed).
//! - [`seal`]: AES-256-GCM sealing of webhook secrets at rest.
//!
//! Ownership: every table is written by exactly one service (ARCHITECTURE.md,
//! "Who owns what"); the other may read it.

pub mod schema;
pub mod seal;

use anyhow::Context;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::pooled_connection::deadpool;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::AsyncPgConnection;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use vid_infra::settings::DatabaseSettings;
use vid_infra::ExposeSecret;

pub use diesel_async::{AsyncConnection, RunQueryDsl};

/// A pool of async PostgreSQL connections.
pub type Pool = deadpool::Pool<AsyncPgConnection>;
/// A connection checked out of the [`Pool`].
pub type PooledConn = deadpool::Object<AsyncPgConnection>;

/// Every migration under `crates/vid-db/migrations`, compiled into the binary.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// Builds a pool of at most `settings.pool_size` connections. Connections are
/// opened lazily; nothing is contacted here.
pub fn pool(settings: &DatabaseSettings) -> anyhow::Result<Pool> {
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(settings.url.expose_secret());
    deadpool::Pool::builder(manager).max_size(settings.pool_size).build().context("building the database pool")
}

/// Runs every pending migration against `url`; returns the versions applied.
/// Safe to run concurrently from several processes: PostgreSQL serialises the DDL.
pub async fn migrate(url: &str) -> anyhow::Result<Vec<String>> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<String>> {
        let mut conn =
            <AsyncConnectionWrapper<AsyncPgConnection> as diesel::Connection>::establish(&url).context("connecting to PostgreSQL")?;
        let applied = conn.run_pending_migrations(MIGRATIONS).map_err(|e| anyhow::anyhow!("running migrations: {e}"))?;
        Ok(applied.into_iter().map(|v| v.to_string()).collect())
    })
    .await?
}

/// Why a connection could not be checked out of the [`Pool`].
pub type PoolError = deadpool::PoolError;
