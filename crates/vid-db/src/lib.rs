//! The database layer shared by the api and the webhook-dispatcher.
//!
//! - [`schema`]: diesel table definitions, in step with `migrations/`.
//! - [`migrate`]: embedded migrations, run by `api migrate` (and the k8s migration Job).
//! - [`Pool`]: a deadpool of diesel-async connections (no libpq needed).
//! - [`seal`]: AES-256-GCM sealing of webhook secrets at rest.
//! - [`cached_sql_query`]: raw SQL prepared once per connection (hot statements).
//!
//! Ownership: every table, and for the shared delivery tables every column
//! group, has one writing module (ARCHITECTURE.md, "Who writes what"); the
//! delivery transitions both the api and the dispatcher perform all go through
//! the `vid-deliveries` crate.

mod cached;
pub mod schema;
pub mod seal;

pub use cached::{cached_sql_query, CachedQuery};

use anyhow::Context;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::pooled_connection::deadpool;
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
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

/// How long a checkout waits for a free pooled connection before failing
/// with [`PoolError::Timeout`] (the api answers `503`).
pub const POOL_WAIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long opening a new connection (TCP, startup, authentication) may take:
/// a server that accepts TCP but never answers must not hang a caller (or a
/// shutdown) forever.
pub const POOL_CREATE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long the health check of an idle connection being reused may take.
pub const POOL_RECYCLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Sent on every new pooled connection ([`pool`]): the code is written for
/// PostgreSQL's default isolation, READ COMMITTED (a statement's snapshot is
/// taken when it starts; no serialization failures to retry), and the
/// delivery leasing functions refuse any other (migration
/// `2026-12-05-000200_webhook_leasing_functions`). A database or role whose
/// `default_transaction_isolation` was changed by an operator would
/// otherwise stop every webhook claim. A session setting: it holds on a
/// direct or session-pooled connection only (a transaction-mode pooler such
/// as PgBouncer `pool_mode=transaction` would hand the next transaction a
/// server connection without it; LISTEN and the migration lock need a
/// session anyway).
pub const SESSION_SETUP: &str = "SET default_transaction_isolation = 'read committed'";

/// Builds a pool of at most `settings.pool_size` connections, with the
/// [`POOL_WAIT_TIMEOUT`], [`POOL_CREATE_TIMEOUT`] and [`POOL_RECYCLE_TIMEOUT`]
/// bounds. Each new connection runs [`SESSION_SETUP`] before first use (a
/// failure there is a failed connect). Connections are opened lazily;
/// nothing is contacted here.
pub fn pool(settings: &DatabaseSettings) -> anyhow::Result<Pool> {
    let mut config = ManagerConfig::<AsyncPgConnection>::default();
    config.custom_setup = Box::new(|url| {
        let url = url.to_owned();
        Box::pin(async move {
            let mut conn = AsyncPgConnection::establish(&url).await?;
            conn.batch_execute(SESSION_SETUP)
                .await
                .map_err(|e| diesel::ConnectionError::BadConnection(format!("running the session setup `{SESSION_SETUP}`: {e}")))?;
            Ok(conn)
        })
    });
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(settings.url.expose_secret(), config);
    deadpool::Pool::builder(manager)
        .max_size(settings.pool_size)
        .runtime(::deadpool::Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT_TIMEOUT))
        .create_timeout(Some(POOL_CREATE_TIMEOUT))
        .recycle_timeout(Some(POOL_RECYCLE_TIMEOUT))
        .build()
        .context("building the database pool")
}

/// Session advisory-lock key held while migrations run ("vid_migr").
pub const MIGRATION_LOCK_KEY: i64 = 0x7669_645f_6d69_6772;

/// How often a runner that found the migration lock taken tries again.
pub const MIGRATION_LOCK_POLL: std::time::Duration = std::time::Duration::from_millis(200);

#[derive(diesel::QueryableByName)]
struct TryLock {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    taken: bool,
}

/// Runs every pending migration against `url`; returns the versions applied.
///
/// Safe to run concurrently from several processes (the migration Job and
/// every api replica at start-up): each takes the session advisory lock
/// [`MIGRATION_LOCK_KEY`] first, so they run one after another and the later
/// ones find nothing pending. Without it, concurrent `CREATE TYPE`/`CREATE
/// TABLE` of the same migration fail on PostgreSQL's catalog unique indexes.
///
/// The lock is taken with `pg_try_advisory_lock`, retried every
/// [`MIGRATION_LOCK_POLL`], never with a blocking `pg_advisory_lock`: a
/// `CREATE INDEX CONCURRENTLY` in the running migration waits for every
/// transaction with an older snapshot to end, and a runner blocked inside
/// `pg_advisory_lock` is such a transaction, waiting in turn for the lock the
/// migration holds (PostgreSQL reports `deadlock detected`).
pub async fn migrate(url: &str) -> anyhow::Result<Vec<String>> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<String>> {
        let mut conn =
            <AsyncConnectionWrapper<AsyncPgConnection> as diesel::Connection>::establish(&url).context("connecting to PostgreSQL")?;
        loop {
            let taken = diesel::RunQueryDsl::get_result::<TryLock>(
                diesel::sql_query(format!("SELECT pg_try_advisory_lock({MIGRATION_LOCK_KEY}) AS taken")),
                &mut conn,
            )
            .context("taking the migration lock")?;
            if taken.taken {
                break;
            }
            std::thread::sleep(MIGRATION_LOCK_POLL);
        }
        let applied: anyhow::Result<Vec<String>> = conn
            .run_pending_migrations(MIGRATIONS)
            .map(|versions| versions.into_iter().map(|v| v.to_string()).collect())
            .map_err(|e| anyhow::anyhow!("running migrations: {e}"));
        // Released at disconnect anyway; explicit so a pooled use could not keep it.
        let _ = diesel::RunQueryDsl::execute(diesel::sql_query(format!("SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})")), &mut conn);
        applied
    })
    .await?
}

/// Why a connection could not be checked out of the [`Pool`].
pub type PoolError = deadpool::PoolError;

/// Whether PostgreSQL answers `SELECT 1` through `pool` (a readiness probe's
/// database check; the caller bounds it in time, see
/// `vid_infra::readiness`). `false` when no connection can be had.
pub async fn ping(pool: &Pool) -> bool {
    match pool.get().await {
        Ok(mut conn) => diesel::select(diesel::dsl::sql::<diesel::sql_types::Integer>("1")).get_result::<i32>(&mut conn).await.is_ok(),
        Err(_) => false,
    }
}
