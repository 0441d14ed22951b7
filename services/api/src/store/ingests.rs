//! The ingest's queries on `uploads`, `videos` and `operations` (issue 21,
//! item 4: `POST /ingests`): the upload row standing for a URL source, and
//! the operation columns only an ingest uses (`awaiting_source`,
//! `download_bytes`, `download_total_bytes`).
//!
//! Writer: the api only — `POST /ingests` ([`insert_upload`],
//! [`mark_awaiting_source`]) and the ingest-report consumer through
//! [`crate::domain::operation`] ([`set_download`], [`set_source_ready`]).
//! The janitor reads [`stale_awaiting`] and re-drives through
//! [`crate::domain::operation`], which rebuilds the job with [`job_of`].

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use vid_core::ingest::IngestJob;
use vid_core::messages::Mp4Support;
use vid_core::operation::{OperationStatus, Phase};
use vid_core::playback::PlaybackPolicy;
use vid_core::upload::UploadStatus;
use vid_core::{OperationId, TenantId, UploadId, VideoId};
use vid_db::schema::{operations, uploads, videos};
use vid_db::RunQueryDsl;

use super::Conn;

/// The values of an ingest's `uploads` row.
pub struct NewIngestUpload<'a> {
    /// `upl_…`
    pub id: &'a UploadId,
    /// Owner.
    pub tenant: &'a TenantId,
    /// The checked source URL (normalised).
    pub source_url: &'a str,
    /// The declared media type, or the first allowed one until the download tells.
    pub content_type: &'a str,
    /// Display filename.
    pub filename: Option<&'a str>,
    /// Storage key the ingest worker writes the source to.
    pub key: &'a str,
    /// Kept like an upload's, for the row's life cycle (an ingest is `completed` at once).
    pub expires_at: DateTime<Utc>,
    /// Playback policies for the video-to-be.
    pub playback_policy: &'a [PlaybackPolicy],
    /// Static MP4s or not.
    pub mp4_support: Mp4Support,
}

/// What the ingest job needs besides the rows' other columns: the limit and
/// the media types. Stored with the upload ([`insert_upload`]) so a lost job
/// can be published again as it was ([`job_of`]).
pub struct IngestLimits<'a> {
    /// The most bytes to download (`IngestJob.max_size_bytes`).
    pub max_size_bytes: u64,
    /// The declared media type, if the request named one (`IngestJob.content_type`).
    pub declared_content_type: Option<&'a str>,
    /// `uploads.allowed_content_types` at `POST /ingests` (`IngestJob.allowed_content_types`).
    pub allowed_content_types: &'a [String],
}

/// Inserts an ingest's upload: status `completed` (there are no parts to
/// send and nothing to abort: the ingest worker runs its own multipart
/// upload), size 0 until the download ends, `source_url` set, and every
/// other input of its job (`limits`: `source_max_size_bytes`,
/// `source_declared_content_type`, `source_allowed_content_types`).
pub async fn insert_upload(conn: &mut Conn, new: &NewIngestUpload<'_>, limits: &IngestLimits<'_>) -> QueryResult<()> {
    diesel::insert_into(uploads::table)
        .values((
            uploads::id.eq(new.id),
            uploads::tenant_id.eq(new.tenant),
            uploads::status.eq(UploadStatus::Completed),
            uploads::size_bytes.eq(0i64),
            uploads::content_type.eq(new.content_type),
            uploads::filename.eq(new.filename),
            uploads::part_size.eq(0i64),
            uploads::part_count.eq(0i32),
            uploads::storage_key.eq(new.key),
            uploads::s3_upload_id.eq(""),
            uploads::expires_at.eq(new.expires_at),
            uploads::playback_policy.eq(new.playback_policy),
            uploads::mp4_support.eq(new.mp4_support),
            uploads::source_url.eq(new.source_url),
            uploads::source_max_size_bytes.eq(i64::try_from(limits.max_size_bytes).unwrap_or(i64::MAX)),
            uploads::source_declared_content_type.eq(limits.declared_content_type),
            uploads::source_allowed_content_types.eq(limits.allowed_content_types),
        ))
        .execute(conn)
        .await
        .map(|_| ())
}

/// A new ingest's operation: phase `downloading`, `awaiting_source`, 0 bytes so far.
pub async fn mark_awaiting_source(conn: &mut Conn, id: &OperationId) -> QueryResult<()> {
    diesel::update(operations::table.filter(operations::id.eq(id)))
        .set((operations::phase.eq(Phase::Downloading), operations::awaiting_source.eq(true), operations::download_bytes.eq(0i64)))
        .execute(conn)
        .await
        .map(|_| ())
}

/// Raises `download_bytes` to `bytes` (never lowers it: a redelivered job
/// downloads again from 0) and records `total`; whether the row changed.
pub async fn set_download(conn: &mut Conn, id: &OperationId, bytes: u64, total: Option<u64>) -> QueryResult<bool> {
    let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
    let total = total.map(|t| i64::try_from(t).unwrap_or(i64::MAX));
    let n = diesel::update(
        operations::table
            .filter(operations::id.eq(id))
            .filter(operations::download_bytes.lt(bytes).or(operations::download_total_bytes.is_distinct_from(total))),
    )
    .set((
        operations::download_bytes.eq(diesel::dsl::sql::<diesel::sql_types::Nullable<diesel::sql_types::BigInt>>(
            "GREATEST(download_bytes, ",
        )
        .bind::<diesel::sql_types::BigInt, _>(bytes)
        .sql(")")),
        operations::download_total_bytes.eq(total),
        operations::updated_at.eq(Utc::now()),
    ))
    .execute(conn)
    .await?;
    Ok(n > 0)
}

/// The source is in storage: the upload and video get its size and media
/// type; the operation stops awaiting it (so the janitor's transcode re-drive
/// applies from now: `job_published_at = now()`, `job_attempt = 1`, the
/// attempt of the transcode job queued with it, whatever number of ingest
/// re-drives came before) and shows the final byte count as both the bytes
/// downloaded and the total.
pub async fn set_source_ready(conn: &mut Conn, id: &OperationId, video: &VideoId, size_bytes: u64, content_type: &str) -> QueryResult<()> {
    let size = i64::try_from(size_bytes).unwrap_or(i64::MAX);
    let upload: UploadId = videos::table.filter(videos::id.eq(video)).select(videos::upload_id).first(conn).await?;
    let now = Utc::now();
    diesel::update(uploads::table.filter(uploads::id.eq(&upload)))
        .set((uploads::size_bytes.eq(size), uploads::content_type.eq(content_type), uploads::updated_at.eq(now)))
        .execute(conn)
        .await?;
    diesel::update(videos::table.filter(videos::id.eq(video)))
        .set((videos::content_type.eq(content_type), videos::updated_at.eq(now)))
        .execute(conn)
        .await?;
    diesel::update(operations::table.filter(operations::id.eq(id)))
        .set((
            operations::awaiting_source.eq(false),
            operations::job_published_at.eq(diesel::dsl::now),
            operations::job_attempt.eq(1),
            operations::download_bytes.eq(size),
            operations::download_total_bytes.eq(size),
            operations::updated_at.eq(now),
        ))
        .execute(conn)
        .await
        .map(|_| ())
}

/// The storage key of an operation's source while the operation still
/// awaits it (`awaiting_source`: no `downloaded` report was applied, so no
/// video uses the object); `None` for an unknown operation or one whose
/// source arrived (the object is then the video's, whatever came later).
pub async fn unclaimed_source_key_of(conn: &mut Conn, id: &OperationId) -> QueryResult<Option<String>> {
    operations::table
        .inner_join(videos::table.on(videos::id.eq(operations::video_id)))
        .filter(operations::id.eq(id))
        .filter(operations::awaiting_source.eq(true))
        .select(videos::source_key)
        .first(conn)
        .await
        .optional()
}

/// The settings an ingest from before the job's inputs were stored
/// (migration `ingest_job_inputs`) is re-driven with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngestDefaults {
    /// `uploads.max_size_bytes`.
    pub max_size_bytes: u64,
    /// `uploads.allowed_content_types`.
    pub allowed_content_types: Vec<String>,
}

/// The ingest job of operation `id` rebuilt from its rows (operation,
/// video, upload: URL, key, limit, declared and allowed media types,
/// `mp4_support`) with `attempt`; a NULL limit or allow-list (a row from
/// before they were stored) takes `defaults`. Errors: `NotFound` if the
/// operation has no ingest upload.
pub async fn job_of(conn: &mut Conn, id: &OperationId, attempt: i32, defaults: &IngestDefaults) -> QueryResult<IngestJob> {
    type Row = (VideoId, UploadId, TenantId, Option<String>, String, Option<i64>, Option<String>, Option<Vec<String>>, Mp4Support);
    let row: Row = operations::table
        .inner_join(videos::table.on(videos::id.eq(operations::video_id)))
        .inner_join(uploads::table.on(uploads::id.eq(videos::upload_id)))
        .filter(operations::id.eq(id))
        .select((
            operations::video_id,
            videos::upload_id,
            operations::tenant_id,
            uploads::source_url,
            videos::source_key,
            uploads::source_max_size_bytes,
            uploads::source_declared_content_type,
            uploads::source_allowed_content_types,
            uploads::mp4_support,
        ))
        .first(conn)
        .await?;
    let (video_id, upload_id, tenant_id, source_url, source_key, max, declared, allowed, mp4_support) = row;
    Ok(IngestJob {
        operation_id: id.clone(),
        video_id,
        upload_id,
        tenant_id,
        source_url: source_url.ok_or(diesel::result::Error::NotFound)?,
        source_key,
        max_size_bytes: max.and_then(|n| u64::try_from(n).ok()).unwrap_or(defaults.max_size_bytes),
        content_type: declared,
        allowed_content_types: allowed.unwrap_or_else(|| defaults.allowed_content_types.clone()),
        mp4_support,
        attempt,
    })
}

/// An ingest still awaiting its source that the janitor may re-drive or fail.
#[derive(Debug, Clone, Queryable)]
pub struct StaleIngest {
    /// The operation.
    pub id: OperationId,
    /// Its `job_attempt` when read (the guard of the re-drive or `job_lost`).
    pub job_attempt: i32,
    /// When it was accepted (`POST /ingests`).
    pub created_at: DateTime<Utc>,
}

/// Up to `limit` `pending` operations still awaiting their source whose
/// last sign of life (the job's last publication, `job_published_at`, or the
/// last change a download report made, `updated_at`) is before
/// `silent_before`, or that were accepted before `lost_before` (their total
/// deadline passed); the most silent first. Served by the partial index
/// `operations_pending_published` (pending rows only).
pub async fn stale_awaiting(
    conn: &mut Conn,
    silent_before: DateTime<Utc>,
    lost_before: DateTime<Utc>,
    limit: i64,
) -> QueryResult<Vec<StaleIngest>> {
    use diesel::sql_types::{Bool, Timestamptz};
    let silent =
        diesel::dsl::sql::<Bool>("GREATEST(operations.job_published_at, operations.updated_at) < ").bind::<Timestamptz, _>(silent_before);
    operations::table
        .filter(operations::status.eq(OperationStatus::Pending))
        .filter(operations::awaiting_source.eq(true))
        .filter(silent.or(operations::created_at.lt(lost_before)))
        .order(operations::job_published_at.asc())
        .limit(limit)
        .select((operations::id, operations::job_attempt, operations::created_at))
        .load(conn)
        .await
}
