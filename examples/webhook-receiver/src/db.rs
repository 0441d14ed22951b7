//! The receiver's database: creation, embedded migrations, the pool, and the
//! queries of the handler, the consumer and the state view.

use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::query_dsl::methods::FilterDsl;
use diesel::upsert::excluded;
use diesel::{ConnectionError, ConnectionResult};
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::pooled_connection::deadpool;
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use futures::FutureExt;
use serde::Serialize;

use crate::event::{Effect, Outcome};
use crate::schema::{applied_effects, seen_events, videos};

/// Where the receiver keeps its state unless told otherwise.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/receiver";

/// Every migration under `examples/webhook-receiver/migrations`, compiled in.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// A pool of async PostgreSQL connections.
pub type Pool = deadpool::Pool<AsyncPgConnection>;

/// How long opening a connection (TCP, startup, authentication, session
/// settings) may take: a server that accepts TCP but never answers must fail
/// the caller, not hang it.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// `statement_timeout` of every connection the receiver opens: no query may
/// hang a handler or the consumer on a stuck server or a held lock.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a pool checkout waits for a free connection.
pub const POOL_WAIT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the health check of a reused idle connection may take.
pub const POOL_RECYCLE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long applying migrations may take at start-up before it counts as a
/// failed attempt (and is retried by [`crate::prepare_database`]).
pub const MIGRATE_TIMEOUT: Duration = Duration::from_secs(60);

/// Opens one connection to `url` within [`CONNECT_TIMEOUT`] and sets its
/// `statement_timeout` to [`STATEMENT_TIMEOUT`].
pub async fn connect(url: &str) -> ConnectionResult<AsyncPgConnection> {
    let timed_out = || ConnectionError::BadConnection(format!("no answer from PostgreSQL within {CONNECT_TIMEOUT:?}"));
    tokio::time::timeout(CONNECT_TIMEOUT, async {
        let mut conn = AsyncPgConnection::establish(url).await?;
        conn.batch_execute(&format!("SET statement_timeout = {}", STATEMENT_TIMEOUT.as_millis()))
            .await
            .map_err(|e| ConnectionError::BadConnection(format!("setting statement_timeout: {e}")))?;
        Ok(conn)
    })
    .await
    .unwrap_or_else(|_| Err(timed_out()))
}

/// Builds a pool of at most `size` connections; nothing is contacted yet.
///
/// Every wait is bounded: a checkout waits at most [`POOL_WAIT_TIMEOUT`] for
/// a free connection, opening one takes at most [`CONNECT_TIMEOUT`] (see
/// [`connect`], which also sets [`STATEMENT_TIMEOUT`]), and checking an idle
/// one at most [`POOL_RECYCLE_TIMEOUT`].
pub fn pool(url: &str, size: usize) -> anyhow::Result<Pool> {
    let mut config = ManagerConfig::default();
    config.custom_setup = Box::new(|url| connect(url).boxed());
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(url, config);
    deadpool::Pool::builder(manager)
        .max_size(size)
        .runtime(::deadpool::Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT_TIMEOUT))
        // The custom setup bounds connecting already; this is a backstop.
        .create_timeout(Some(CONNECT_TIMEOUT + Duration::from_secs(1)))
        .recycle_timeout(Some(POOL_RECYCLE_TIMEOUT))
        .build()
        .context("building the database pool")
}

/// Creates the database named in `url` if it does not exist, connecting to
/// the server's `postgres` database to do so. Safe to race with another process.
pub async fn ensure_database(url: &str) -> anyhow::Result<()> {
    let (server, name) = split_database_url(url)?;
    let mut admin = connect(&format!("{server}/postgres")).await.context("connecting to the PostgreSQL server's `postgres` database")?;
    let exists: bool = diesel::select(
        diesel::dsl::sql::<diesel::sql_types::Bool>("EXISTS (SELECT 1 FROM pg_database WHERE datname = ")
            .bind::<diesel::sql_types::Text, _>(name)
            .sql(")"),
    )
    .get_result(&mut admin)
    .await
    .context("looking up the database")?;
    if exists {
        return Ok(());
    }
    // The name was checked to be a plain identifier, so quoting it is enough.
    match diesel::sql_query(format!("CREATE DATABASE \"{name}\"")).execute(&mut admin).await {
        Ok(_) => {
            tracing::info!(database = name, "created the receiver's database");
            Ok(())
        }
        // 42P04 duplicate_database: another process created it meanwhile.
        Err(diesel::result::Error::DatabaseError(_, info)) if info.message().contains("already exists") => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating database {name}")),
    }
}

/// Splits `postgres://…/name?params` into the server part and the database name.
fn split_database_url(url: &str) -> anyhow::Result<(&str, &str)> {
    let without_params = url.split_once('?').map_or(url, |(base, _)| base);
    let (server, name) = without_params
        .rsplit_once('/')
        .filter(|(server, _)| server.contains("://") && !server.ends_with('/'))
        .with_context(|| format!("database URL has no database name: {url}"))?;
    anyhow::ensure!(
        !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
        "database name {name:?} must be letters, digits, `_` or `-`"
    );
    Ok((server, name))
}

/// Runs every pending migration against `url`; returns the versions applied.
///
/// Fails after [`MIGRATE_TIMEOUT`] (the blocking migration thread is then
/// abandoned; it ends when the server answers or the connection breaks).
pub async fn migrate(url: &str) -> anyhow::Result<Vec<String>> {
    let url = url.to_owned();
    let blocking = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<String>> {
        let mut conn =
            <AsyncConnectionWrapper<AsyncPgConnection> as diesel::Connection>::establish(&url).context("connecting to PostgreSQL")?;
        let applied = conn.run_pending_migrations(MIGRATIONS).map_err(|e| anyhow::anyhow!("running migrations: {e}"))?;
        Ok(applied.into_iter().map(|v| v.to_string()).collect())
    });
    tokio::time::timeout(MIGRATE_TIMEOUT, blocking)
        .await
        .map_err(|_| anyhow::anyhow!("migrations did not finish within {MIGRATE_TIMEOUT:?}"))??
}

/// Whether the consumer has already processed `event_id` (the handler's cheap check).
pub async fn is_seen(pool: &Pool, event_id: &str) -> anyhow::Result<bool> {
    let mut conn = pool.get().await?;
    let found = seen_events::table.find(event_id).select(seen_events::event_id).first::<String>(&mut conn).await.optional()?;
    Ok(found.is_some())
}

/// Records `event_id` as seen and applies `effect`, in one transaction.
///
/// Returns [`Outcome::Duplicate`] (and changes nothing) when the id was
/// already recorded. A video row is written only when the event's version is
/// newer than the stored one; otherwise the outcome is [`Outcome::Stale`].
pub async fn record_and_apply(
    conn: &mut AsyncPgConnection,
    event_id: &str,
    event_type: &str,
    effect: &Effect,
) -> Result<Outcome, diesel::result::Error> {
    conn.transaction(|conn| {
        async move {
            let inserted = diesel::insert_into(seen_events::table)
                .values((
                    seen_events::event_id.eq(event_id),
                    seen_events::event_type.eq(event_type),
                    seen_events::outcome.eq(Outcome::Applied.as_str()),
                ))
                .on_conflict_do_nothing()
                .execute(conn)
                .await?;
            if inserted == 0 {
                return Ok(Outcome::Duplicate);
            }
            let outcome = match effect {
                Effect::None(outcome) => *outcome,
                Effect::SetVideo { video_id, operation_id, status, version } => {
                    let upsert = diesel::insert_into(videos::table)
                        .values((
                            videos::video_id.eq(video_id),
                            videos::status.eq(status.as_str()),
                            videos::version.eq(version),
                            videos::operation_id.eq(operation_id),
                        ))
                        .on_conflict(videos::video_id)
                        .do_update()
                        .set((
                            videos::status.eq(excluded(videos::status)),
                            videos::version.eq(excluded(videos::version)),
                            videos::operation_id.eq(excluded(videos::operation_id)),
                            videos::updated_at.eq(diesel::dsl::now),
                        ));
                    // `… DO UPDATE … WHERE videos.version < EXCLUDED.version`:
                    // a late, older event never overwrites a newer state.
                    let changed = FilterDsl::filter(upsert, videos::version.lt(excluded(videos::version))).execute(conn).await?;
                    if changed == 1 {
                        diesel::insert_into(applied_effects::table)
                            .values((
                                applied_effects::event_id.eq(event_id),
                                applied_effects::event_type.eq(event_type),
                                applied_effects::video_id.eq(video_id),
                                applied_effects::status.eq(status.as_str()),
                                applied_effects::version.eq(version),
                            ))
                            .execute(conn)
                            .await?;
                        Outcome::Applied
                    } else {
                        Outcome::Stale
                    }
                }
            };
            if outcome != Outcome::Applied {
                diesel::update(seen_events::table.find(event_id)).set(seen_events::outcome.eq(outcome.as_str())).execute(conn).await?;
            }
            Ok(outcome)
        }
        .scope_boxed()
    })
    .await
}

/// A processed event, as listed by `GET /events`.
#[derive(Debug, Clone, Serialize, Queryable, Selectable)]
#[diesel(table_name = seen_events)]
pub struct SeenEvent {
    /// The event id.
    pub event_id: String,
    /// The event type.
    pub event_type: String,
    /// What the consumer did with it.
    pub outcome: String,
    /// When.
    pub processed_at: DateTime<Utc>,
}

/// A row of the local `videos` table.
#[derive(Debug, Clone, Serialize, Queryable, Selectable)]
#[diesel(table_name = videos)]
pub struct Video {
    /// `vid_…`.
    pub video_id: String,
    /// Local status.
    pub status: String,
    /// Version of the event that set it.
    pub version: i64,
    /// Operation of that event.
    pub operation_id: String,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// A row of `applied_effects`.
#[derive(Debug, Clone, Serialize, Queryable, Selectable)]
#[diesel(table_name = applied_effects)]
pub struct AppliedEffect {
    /// Sequence number.
    pub id: i64,
    /// The event.
    pub event_id: String,
    /// Its type.
    pub event_type: String,
    /// The video changed.
    pub video_id: String,
    /// The status set.
    pub status: String,
    /// The version set.
    pub version: i64,
    /// When.
    pub applied_at: DateTime<Utc>,
}

/// What `GET /events` shows: recent processed events and effects, and the videos.
#[derive(Debug, Clone, Serialize)]
pub struct StateView {
    /// The newest processed events (at most `limit`), newest first.
    pub events: Vec<SeenEvent>,
    /// The newest applied effects (at most `limit`), newest first.
    pub effects: Vec<AppliedEffect>,
    /// The local videos (at most `limit`), most recently changed first.
    pub videos: Vec<Video>,
}

/// Loads the [`StateView`].
pub async fn state_view(pool: &Pool, limit: i64) -> anyhow::Result<StateView> {
    let mut conn = pool.get().await?;
    let events =
        seen_events::table.order(seen_events::processed_at.desc()).limit(limit).select(SeenEvent::as_select()).load(&mut conn).await?;
    let effects =
        applied_effects::table.order(applied_effects::id.desc()).limit(limit).select(AppliedEffect::as_select()).load(&mut conn).await?;
    let videos = videos::table.order(videos::updated_at.desc()).limit(limit).select(Video::as_select()).load(&mut conn).await?;
    Ok(StateView { events, effects, videos })
}

#[cfg(test)]
mod tests {
    use super::split_database_url;

    #[test]
    fn database_url_is_split() {
        assert_eq!(
            split_database_url("postgres://postgres@127.0.0.1:5432/receiver").unwrap(),
            ("postgres://postgres@127.0.0.1:5432", "receiver")
        );
        assert_eq!(split_database_url("postgres://h/db_1?sslmode=disable").unwrap(), ("postgres://h", "db_1"));
        assert!(split_database_url("postgres://h/").is_err());
        assert!(split_database_url("postgres://h/x\";DROP").is_err());
    }
}
