//! `uploads` (and the tenant's cap in `tenants`): the row type and every query.
//!
//! Writer: the api only — the upload routes and the janitor. Every status
//! change is a guarded `UPDATE … WHERE status IN (…)` ([`move_status`]), so
//! PostgreSQL decides every race (complete vs DELETE vs janitor).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::AsyncConnection;
use vid_core::messages::Mp4Support;
use vid_core::operation::OperationStatus;
use vid_core::playback::PlaybackPolicy;
use vid_core::upload::UploadStatus;
use vid_core::{OperationId, TenantId, UploadId, VideoId};
use vid_db::schema::{operations, tenants, upload_client_tokens, uploads};
use vid_db::RunQueryDsl;

use super::Conn;

/// A row of `uploads`. An unknown stored `status` is a deserialize error.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = uploads)]
pub struct UploadRow {
    /// `upl_…`
    pub id: UploadId,
    /// Owner.
    pub tenant_id: TenantId,
    /// As stored (see [`UploadRow::status_at`] for what clients see).
    pub status: UploadStatus,
    /// Declared size, bytes.
    pub size_bytes: i64,
    /// Normalised media type.
    pub content_type: String,
    /// Display filename.
    pub filename: Option<String>,
    /// Bytes per part (the last may be shorter).
    pub part_size: i64,
    /// Number of parts.
    pub part_count: i32,
    /// Storage key of the source object.
    pub storage_key: String,
    /// S3 multipart upload id.
    pub s3_upload_id: String,
    /// Set once completed.
    pub video_id: Option<VideoId>,
    /// Set once completed.
    pub operation_id: Option<OperationId>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last status change.
    pub updated_at: DateTime<Utc>,
    /// When an upload not completed by then expires.
    pub expires_at: DateTime<Utc>,
    /// The playback policies asked for at `POST /uploads` (distinct, in the
    /// order given; empty: no playback ID), copied to the video at `complete`.
    pub playback_policy: Vec<PlaybackPolicy>,
    /// Whether static MP4s are made, copied to the video and its transcode job.
    pub mp4_support: Mp4Support,
    /// The page origin allowed to call the client-token routes (issue 21).
    pub cors_origin: Option<String>,
    /// The poster's time in seconds (issue 20), copied to the video and its transcode job.
    pub poster_time: Option<f64>,
}

impl UploadRow {
    /// The status at `now`, as clients see it: a `created` upload whose
    /// `expires_at` has passed is `expired` although the janitor has not
    /// recorded it yet.
    pub fn status_at(&self, now: DateTime<Utc>) -> UploadStatus {
        match self.status {
            UploadStatus::Created if self.expires_at <= now => UploadStatus::Expired,
            status => status,
        }
    }
}

/// The open statuses: an upload in one of them may still be completed or aborted.
pub const OPEN: [UploadStatus; 2] = [UploadStatus::Created, UploadStatus::Completing];

/// A tenant's upload; `None` for anyone else's.
pub async fn get(conn: &mut Conn, tenant: &TenantId, id: &UploadId) -> QueryResult<Option<UploadRow>> {
    uploads::table
        .filter(uploads::id.eq(id))
        .filter(uploads::tenant_id.eq(tenant))
        .select(UploadRow::as_select())
        .first(conn)
        .await
        .optional()
}

/// The tenant's uploads in flight at `now`: `created` or `completing`, not past `expires_at`.
pub async fn count_in_flight(conn: &mut Conn, tenant: &TenantId, now: DateTime<Utc>) -> QueryResult<i64> {
    uploads::table
        .filter(uploads::tenant_id.eq(tenant))
        .filter(uploads::status.eq_any(OPEN))
        .filter(uploads::expires_at.gt(now))
        .count()
        .get_result(conn)
        .await
}

/// The values of a new `uploads` row (status `created`).
pub struct NewUpload<'a> {
    /// `upl_…`
    pub id: &'a UploadId,
    /// Owner.
    pub tenant: &'a TenantId,
    /// Declared size, bytes.
    pub size_bytes: u64,
    /// Normalised media type.
    pub content_type: &'a str,
    /// Display filename.
    pub filename: Option<&'a str>,
    /// Bytes per part.
    pub part_size: u64,
    /// Number of parts.
    pub part_count: u32,
    /// Storage key of the source object.
    pub key: &'a str,
    /// S3 multipart upload id.
    pub s3_upload_id: &'a str,
    /// When it expires if not completed.
    pub expires_at: DateTime<Utc>,
    /// Playback policies for the video-to-be (distinct; may be empty).
    pub playback_policy: &'a [PlaybackPolicy],
    /// Static MP4s or not.
    pub mp4_support: Mp4Support,
    /// The page origin of browser uploads ([`crate::cors::parse_cors_origin`]'s form).
    pub cors_origin: Option<&'a str>,
    /// The poster's time in seconds (finite, ≥ 0), if asked.
    pub poster_time: Option<f64>,
}

/// Inserts the upload unless the tenant's cap is reached; `Some((in_flight,
/// cap))` when refused. For a tenant with a cap, one transaction holds the
/// tenant's row (`FOR NO KEY UPDATE`) around the count and the insert, so its
/// concurrent creates are serialised and never exceed the cap; a tenant
/// without one takes no such lock.
pub async fn insert_within_cap(conn: &mut Conn, new: &NewUpload<'_>) -> QueryResult<Option<(i64, i32)>> {
    conn.transaction::<Option<(i64, i32)>, diesel::result::Error, _>(|conn| {
        async move {
            // Only a tenant with a cap serialises its creates on its row
            // (FOR NO KEY UPDATE, so the count below sees every earlier
            // insert); without one, creates run side by side (the insert's
            // foreign-key check takes only FOR KEY SHARE).
            let capped: Option<i32> =
                tenants::table.filter(tenants::id.eq(new.tenant)).select(tenants::max_uploads_in_flight).first(conn).await?;
            let cap = match capped {
                Some(_) => {
                    tenants::table
                        .filter(tenants::id.eq(new.tenant))
                        .select(tenants::max_uploads_in_flight)
                        .for_no_key_update()
                        .first::<Option<i32>>(conn)
                        .await?
                }
                None => None,
            };
            if let Some(cap) = cap {
                let in_flight = count_in_flight(conn, new.tenant, Utc::now()).await?;
                if in_flight >= cap as i64 {
                    return Ok(Some((in_flight, cap)));
                }
            }
            diesel::insert_into(uploads::table)
                .values((
                    uploads::id.eq(new.id),
                    uploads::tenant_id.eq(new.tenant),
                    uploads::status.eq(UploadStatus::Created),
                    uploads::size_bytes.eq(new.size_bytes as i64),
                    uploads::content_type.eq(new.content_type),
                    uploads::filename.eq(new.filename),
                    uploads::part_size.eq(new.part_size as i64),
                    uploads::part_count.eq(new.part_count as i32),
                    uploads::storage_key.eq(new.key),
                    uploads::s3_upload_id.eq(new.s3_upload_id),
                    uploads::expires_at.eq(new.expires_at),
                    uploads::playback_policy.eq(new.playback_policy),
                    uploads::mp4_support.eq(new.mp4_support),
                    uploads::cors_origin.eq(new.cors_origin),
                    uploads::poster_time.eq(new.poster_time),
                ))
                .execute(conn)
                .await?;
            Ok(None)
        }
        .scope_boxed()
    })
    .await
}

/// Moves an upload from one of `from` to `to` (and `updated_at` to now);
/// whether it moved. With `unexpired_at`, only if `expires_at` is after it.
pub async fn move_status(
    conn: &mut Conn,
    id: &UploadId,
    from: &[UploadStatus],
    to: UploadStatus,
    unexpired_at: Option<DateTime<Utc>>,
) -> QueryResult<bool> {
    let mut q = diesel::update(uploads::table).filter(uploads::id.eq(id)).filter(uploads::status.eq_any(from.to_vec())).into_boxed();
    if let Some(at) = unexpired_at {
        q = q.filter(uploads::expires_at.gt(at));
    }
    let n = q.set((uploads::status.eq(to), uploads::updated_at.eq(Utc::now()))).execute(conn).await?;
    Ok(n == 1)
}

/// Inside `complete`'s transaction: marks an open upload `completed`; whether it was open.
pub async fn claim_completed(conn: &mut Conn, id: &UploadId) -> QueryResult<bool> {
    let n = diesel::update(uploads::table.filter(uploads::id.eq(id)).filter(uploads::status.eq_any(OPEN)))
        .set(uploads::status.eq(UploadStatus::Completed))
        .execute(conn)
        .await?;
    Ok(n == 1)
}

/// An upload's stored status and operation.
pub async fn status_and_operation(conn: &mut Conn, id: &UploadId) -> QueryResult<(UploadStatus, Option<OperationId>)> {
    uploads::table.filter(uploads::id.eq(id)).select((uploads::status, uploads::operation_id)).first(conn).await
}

/// Links a completed upload to the video and operation it became.
pub async fn link(conn: &mut Conn, id: &UploadId, video: &VideoId, operation: &OperationId) -> QueryResult<()> {
    diesel::update(uploads::table.filter(uploads::id.eq(id)))
        .set((uploads::video_id.eq(video), uploads::operation_id.eq(operation), uploads::updated_at.eq(Utc::now())))
        .execute(conn)
        .await
        .map(|_| ())
}

/// What the janitor needs to drop an upload from storage: id, storage key, S3 upload id.
pub type StorageRef = (UploadId, String, String);

/// Up to `limit` `created` uploads past their `expires_at` at `now`.
pub async fn expired_created(conn: &mut Conn, now: DateTime<Utc>, limit: i64) -> QueryResult<Vec<StorageRef>> {
    uploads::table
        .filter(uploads::status.eq(UploadStatus::Created))
        .filter(uploads::expires_at.lt(now))
        .select((uploads::id, uploads::storage_key, uploads::s3_upload_id))
        .limit(limit)
        .load(conn)
        .await
}

/// Marks `expired` every upload `completing` since before `stuck_since` and
/// past its `expires_at` at `now`; returns them.
pub async fn expire_stuck_completing(conn: &mut Conn, now: DateTime<Utc>, stuck_since: DateTime<Utc>) -> QueryResult<Vec<StorageRef>> {
    diesel::update(
        uploads::table
            .filter(uploads::status.eq(UploadStatus::Completing))
            .filter(uploads::expires_at.lt(now))
            .filter(uploads::updated_at.lt(stuck_since)),
    )
    .set((uploads::status.eq(UploadStatus::Expired), uploads::updated_at.eq(now)))
    .returning((uploads::id, uploads::storage_key, uploads::s3_upload_id))
    .get_results(conn)
    .await
}

/// Records a client token of `upload` by its SHA-256 (hex) (issue 21).
pub async fn insert_client_token(conn: &mut Conn, upload: &UploadId, token_hash: &str) -> QueryResult<()> {
    diesel::insert_into(upload_client_tokens::table)
        .values((upload_client_tokens::token_hash.eq(token_hash), upload_client_tokens::upload_id.eq(upload)))
        .execute(conn)
        .await
        .map(|_| ())
}

/// The upload a client token (by its SHA-256) was issued for, and, once the
/// upload is completed, its operation's status and last change
/// (`operations.updated_at`, which a terminal operation no longer moves).
pub async fn by_client_token(
    conn: &mut Conn,
    token_hash: &str,
) -> QueryResult<Option<(UploadRow, Option<(OperationStatus, DateTime<Utc>)>)>> {
    let row: Option<UploadRow> = upload_client_tokens::table
        .inner_join(uploads::table)
        .filter(upload_client_tokens::token_hash.eq(token_hash))
        .select(UploadRow::as_select())
        .first(conn)
        .await
        .optional()?;
    let Some(row) = row else { return Ok(None) };
    let operation = match &row.operation_id {
        Some(op) => operations::table
            .filter(operations::id.eq(op))
            .select((operations::status, operations::updated_at))
            .first(conn)
            .await
            .optional()?,
        None => None,
    };
    Ok(Some((row, operation)))
}

/// The `cors_origin` of an upload (any tenant's: a preflight carries no credentials).
pub async fn cors_origin_of_upload(conn: &mut Conn, id: &UploadId) -> QueryResult<Option<String>> {
    uploads::table
        .filter(uploads::id.eq(id))
        .select(uploads::cors_origin)
        .first::<Option<String>>(conn)
        .await
        .optional()
        .map(Option::flatten)
}

/// The `cors_origin` of the upload that became operation `id`.
pub async fn cors_origin_of_operation(conn: &mut Conn, id: &OperationId) -> QueryResult<Option<String>> {
    uploads::table
        .filter(uploads::operation_id.eq(id))
        .select(uploads::cors_origin)
        .first::<Option<String>>(conn)
        .await
        .optional()
        .map(Option::flatten)
}
