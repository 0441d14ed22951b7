//! `idempotency_keys`: one row per (tenant, route, `Idempotency-Key`).
//! Writer: the api's [`crate::idempotency`] (claim, renew, store, release)
//! and the janitor ([`purge`]). `lock_token` fences the runs: only the
//! current holder's statements match.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use vid_core::TenantId;
use vid_db::schema::idempotency_keys as ik;
use vid_db::RunQueryDsl;

use super::Conn;

/// Which row: tenant, route (e.g. `POST /uploads`) and key.
#[derive(Debug, Clone, Copy)]
pub struct Key<'a> {
    /// Owner.
    pub tenant: &'a TenantId,
    /// Method and route.
    pub route: &'a str,
    /// The header's value.
    pub key: &'a str,
}

macro_rules! this_key {
    ($k:expr) => {
        ik::table.filter(ik::tenant_id.eq($k.tenant)).filter(ik::route.eq($k.route)).filter(ik::idempotency_key.eq($k.key))
    };
}

/// `(request_hash, response_status, response_body, response_location)` of a key row.
pub type StoredRow = (String, Option<i32>, Option<String>, Option<String>);

/// Deletes the row if it was first used before `cutoff` (past its replay window).
pub async fn forget_if_older(conn: &mut Conn, k: Key<'_>, cutoff: DateTime<Utc>) -> QueryResult<()> {
    diesel::delete(this_key!(k).filter(ik::created_at.lt(cutoff))).execute(conn).await.map(|_| ())
}

/// Inserts the row for a run holding it under `token` until `lease_end`;
/// `false` if a row exists.
pub async fn insert(
    conn: &mut Conn,
    k: Key<'_>,
    hash: &str,
    now: DateTime<Utc>,
    lease_end: DateTime<Utc>,
    token: &str,
) -> QueryResult<bool> {
    let n = diesel::insert_into(ik::table)
        .values((
            ik::tenant_id.eq(k.tenant),
            ik::route.eq(k.route),
            ik::idempotency_key.eq(k.key),
            ik::request_hash.eq(hash),
            ik::created_at.eq(now),
            ik::locked_until.eq(lease_end),
            ik::lock_token.eq(token),
        ))
        .on_conflict_do_nothing()
        .execute(conn)
        .await?;
    Ok(n == 1)
}

/// The row's hash and stored answer, if the row exists.
pub async fn stored(conn: &mut Conn, k: Key<'_>) -> QueryResult<Option<StoredRow>> {
    this_key!(k).select((ik::request_hash, ik::response_status, ik::response_body, ik::response_location)).first(conn).await.optional()
}

/// Takes over a row with this `hash`, no answer and a lease ended before
/// `now` (its run died); whether it was taken.
pub async fn take_over(
    conn: &mut Conn,
    k: Key<'_>,
    hash: &str,
    now: DateTime<Utc>,
    lease_end: DateTime<Utc>,
    token: &str,
) -> QueryResult<bool> {
    let n = diesel::update(
        this_key!(k)
            .filter(ik::response_status.is_null())
            .filter(ik::request_hash.eq(hash))
            .filter(ik::locked_until.is_null().or(ik::locked_until.lt(now))),
    )
    .set((ik::created_at.eq(now), ik::locked_until.eq(lease_end), ik::lock_token.eq(token)))
    .execute(conn)
    .await?;
    Ok(n == 1)
}

/// Extends the lease to `until`; `false` if `token` no longer holds the row.
pub async fn renew(conn: &mut Conn, k: Key<'_>, token: &str, until: DateTime<Utc>) -> QueryResult<bool> {
    let n = diesel::update(this_key!(k).filter(ik::lock_token.eq(token)).filter(ik::response_status.is_null()))
        .set(ik::locked_until.eq(until))
        .execute(conn)
        .await?;
    Ok(n == 1)
}

/// Stores the answer and ends the lease; `false` if `token` no longer holds the row.
pub async fn store_answer(
    conn: &mut Conn,
    k: Key<'_>,
    token: &str,
    status: i32,
    body: String,
    location: Option<String>,
) -> QueryResult<bool> {
    let n = diesel::update(this_key!(k).filter(ik::lock_token.eq(token)).filter(ik::response_status.is_null()))
        .set((
            ik::response_status.eq(status),
            ik::response_body.eq(body),
            ik::response_location.eq(location),
            ik::locked_until.eq(None::<DateTime<Utc>>),
            ik::lock_token.eq(None::<String>),
        ))
        .execute(conn)
        .await?;
    Ok(n == 1)
}

/// Deletes the row if `token` still holds it without an answer.
pub async fn release(conn: &mut Conn, k: Key<'_>, token: &str) -> QueryResult<()> {
    diesel::delete(this_key!(k).filter(ik::lock_token.eq(token)).filter(ik::response_status.is_null())).execute(conn).await.map(|_| ())
}

/// Deletes up to `batch` rows first used before `cutoff`, oldest first (via
/// the `idempotency_keys_created_at` index); returns how many.
pub async fn purge_batch(conn: &mut Conn, cutoff: DateTime<Utc>, batch: i64) -> QueryResult<usize> {
    use diesel::sql_types::{BigInt, Timestamptz};
    diesel::sql_query(
        "DELETE FROM idempotency_keys WHERE ctid IN \
         (SELECT ctid FROM idempotency_keys WHERE created_at < $1 ORDER BY created_at LIMIT $2)",
    )
    .bind::<Timestamptz, _>(cutoff)
    .bind::<BigInt, _>(batch)
    .execute(conn)
    .await
}
