//! The ingest's queries on `uploads`, `videos` and `operations` (issue 21,
//! item 4: `POST /ingests`): the upload row standing for a URL source, and
//! the operation columns only an ingest uses (`awaiting_source`,
//! `download_bytes`, `download_total_bytes`).
//!
//! Writer: the api only — `POST /ingests` ([`insert_upload`],
//! [`mark_awaiting_source`]) and the ingest-report consumer through
//! [`crate::domain::operation`] ([`set_download`], [`set_source_ready`]).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use vid_core::messages::Mp4Support;
use vid_core::operation::Phase;
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

/// Inserts an ingest's upload: status `completed` (there are no parts to
/// send and nothing to abort: the ingest worker runs its own multipart
/// upload), size 0 until the download ends, `source_url` set.
pub async fn insert_upload(conn: &mut Conn, new: &NewIngestUpload<'_>) -> QueryResult<()> {
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
/// type; the operation stops awaiting it (so the janitor's re-drive applies
/// from now, `job_published_at = now()`) and shows the final byte count as
/// both the bytes downloaded and the total.
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
