//! `operations` and `videos`: their row types and every query on them.
//!
//! Writers: the api only (the transcoder reports through RabbitMQ). Status,
//! progress, phase, scan, result and error of an operation, and status and
//! version of a video, change only through [`crate::domain::operation`];
//! [`insert_processing`] creates both at `complete`.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use vid_core::messages::{Mp4Support, StreamOutputs};
use vid_core::operation::{Operation, OperationMetadata, OperationResult, OperationStatus, Phase, ScanOutcome};
use vid_core::playback::PlaybackPolicy;
use vid_core::video::{Poster, Rendition, SourceMetadata, Video, VideoStatus};
use vid_core::{OperationId, Problem, TenantId, UploadId, VideoId};
use vid_db::schema::{operations, videos};
use vid_db::RunQueryDsl;

use super::Conn;

/// A row of `operations`. An unknown stored `status`, `phase` or `scan` is a
/// deserialize error when the row is read (logged, answered `500`).
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = operations)]
pub struct OperationRow {
    /// `op_…`
    pub id: OperationId,
    /// Owner.
    pub tenant_id: TenantId,
    /// The video this operation produces.
    pub video_id: VideoId,
    /// Where the operation is in its life.
    pub status: OperationStatus,
    /// 0–100.
    pub progress: i16,
    /// The step a running transcode is in.
    pub phase: Option<Phase>,
    /// [`OperationResult`] as JSON, once succeeded.
    pub result: Option<serde_json::Value>,
    /// [`Problem`] as JSON, once failed or cancelled.
    pub error: Option<serde_json::Value>,
    /// When accepted.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// The transcoder's last report.
    pub heartbeat_at: Option<DateTime<Utc>>,
    /// The malware scan's outcome.
    pub scan: Option<ScanOutcome>,
    /// An ingest's bytes downloaded so far (`metadata.download`); `None` for an upload.
    pub download_bytes: Option<i64>,
    /// The size the ingest's source announced, if any.
    pub download_total_bytes: Option<i64>,
}

impl OperationRow {
    /// The public resource.
    pub fn into_operation(self) -> Operation {
        Operation {
            id: self.id,
            status: self.status,
            progress: self.progress.clamp(0, 100) as u8,
            created_at: self.created_at,
            updated_at: self.updated_at,
            result: self.result.and_then(|v| serde_json::from_value::<OperationResult>(v).ok()),
            error: self.error.and_then(|v| serde_json::from_value::<Problem>(v).ok()),
            metadata: OperationMetadata {
                phase: self.phase,
                video_id: Some(self.video_id),
                scan: self.scan,
                download: self.download_bytes.map(|bytes| {
                    vid_core::ingest::DownloadProgress::new(bytes.max(0) as u64, self.download_total_bytes.map(|t| t.max(0) as u64))
                }),
            },
        }
    }
}

/// A tenant's operation; `None` for anyone else's.
pub async fn get(conn: &mut Conn, tenant: &TenantId, id: &OperationId) -> QueryResult<Option<OperationRow>> {
    operations::table
        .filter(operations::id.eq(id))
        .filter(operations::tenant_id.eq(tenant))
        .select(OperationRow::as_select())
        .first(conn)
        .await
        .optional()
}

/// An operation and its `revision`; with `tenant`, only if it is that tenant's.
pub async fn get_with_revision(conn: &mut Conn, id: &OperationId, tenant: Option<&TenantId>) -> QueryResult<Option<(OperationRow, i64)>> {
    let mut q = operations::table.filter(operations::id.eq(id)).into_boxed();
    if let Some(tenant) = tenant {
        q = q.filter(operations::tenant_id.eq(tenant));
    }
    q.select((OperationRow::as_select(), operations::revision)).first(conn).await.optional()
}

/// Up to `limit` of a tenant's operations older than `cursor`, newest first.
pub async fn list(
    conn: &mut Conn,
    tenant: &TenantId,
    status: Option<OperationStatus>,
    cursor: Option<&OperationId>,
    limit: i64,
) -> QueryResult<Vec<OperationRow>> {
    let mut q = operations::table.filter(operations::tenant_id.eq(tenant)).into_boxed();
    if let Some(status) = status {
        q = q.filter(operations::status.eq(status));
    }
    if let Some(cursor) = cursor {
        q = q.filter(operations::id.lt(cursor));
    }
    q.order(operations::id.desc()).limit(limit).select(OperationRow::as_select()).load(conn).await
}

/// An operation's row as a transition sees it, under its row lock.
#[derive(Debug, Clone, Queryable)]
pub struct LockedRow {
    /// Where the operation is in its life.
    pub status: OperationStatus,
    /// The video it produces.
    pub video: VideoId,
    /// Owner.
    pub tenant: TenantId,
    /// The transcoder run that owns it (the latest accepted `Started`); `None` before one.
    pub run_id: Option<String>,
    /// How many times its job was published (1 at `complete`, +1 per re-drive).
    pub job_attempt: i32,
    /// The job attempt of the owning run (`None`: no owner, or one from before it was recorded).
    pub owner_attempt: Option<i32>,
    /// The last accepted report (`None` before one).
    pub heartbeat_at: Option<DateTime<Utc>>,
    /// An ingest whose source is not downloaded yet (no transcode job exists).
    pub awaiting_source: bool,
}

/// Locks an operation's row (`FOR UPDATE`) for a transition; `None` if there is none.
pub async fn lock(conn: &mut Conn, id: &OperationId) -> QueryResult<Option<LockedRow>> {
    operations::table
        .filter(operations::id.eq(id))
        .for_update()
        .select((
            operations::status,
            operations::video_id,
            operations::tenant_id,
            operations::run_id,
            operations::job_attempt,
            operations::owner_attempt,
            operations::heartbeat_at,
            operations::awaiting_source,
        ))
        .first(conn)
        .await
        .optional()
}

/// Makes `run` (of job attempt `attempt`; `None`: unknown) the owner of the
/// operation (the run whose reports count).
pub async fn set_owner(conn: &mut Conn, id: &OperationId, run: &str, attempt: Option<i32>) -> QueryResult<()> {
    diesel::update(operations::table.filter(operations::id.eq(id)))
        .set((operations::run_id.eq(run), operations::owner_attempt.eq(attempt)))
        .execute(conn)
        .await
        .map(|_| ())
}

/// Records one more publication of the job: `job_attempt + 1`,
/// `job_published_at = now()`; returns the new attempt. With
/// `heartbeat = Some(t)` (a silent `running` operation) it also drops the
/// owner (`run_id`, `owner_attempt` NULL) and resets `heartbeat_at` to `t`.
pub async fn set_republished(conn: &mut Conn, id: &OperationId, heartbeat: Option<DateTime<Utc>>) -> QueryResult<i32> {
    let row = operations::table.filter(operations::id.eq(id));
    let bump = (operations::job_attempt.eq(operations::job_attempt + 1), operations::job_published_at.eq(diesel::dsl::now));
    match heartbeat {
        None => diesel::update(row).set(bump).returning(operations::job_attempt).get_result(conn).await,
        Some(t) => {
            let none: Option<String> = None;
            let no_attempt: Option<i32> = None;
            diesel::update(row)
                .set((
                    bump.0,
                    bump.1,
                    operations::run_id.eq(none),
                    operations::owner_attempt.eq(no_attempt),
                    operations::heartbeat_at.eq(t),
                ))
                .returning(operations::job_attempt)
                .get_result(conn)
                .await
        }
    }
}

/// What a transcode job of an operation is built from (see [`job_source`]).
#[derive(Debug, Clone, Queryable)]
pub struct JobSource {
    /// The video being produced.
    pub video: VideoId,
    /// Owner.
    pub tenant: TenantId,
    /// The source's storage key.
    pub source_key: String,
    /// The source's declared size, bytes (from its upload).
    pub size_bytes: i64,
    /// The video's `mp4_support` (from its upload).
    pub mp4_support: Mp4Support,
    /// The video's `poster_time` in seconds (from its upload; issue 20).
    pub poster_time: Option<f64>,
}

/// What a transcode job of an operation is built from: video, tenant, the
/// source's storage key and declared size, and the video's `mp4_support`.
pub async fn job_source(conn: &mut Conn, id: &OperationId) -> QueryResult<JobSource> {
    use vid_db::schema::uploads;
    operations::table
        .inner_join(videos::table.on(videos::id.eq(operations::video_id)))
        .inner_join(uploads::table.on(uploads::id.eq(videos::upload_id)))
        .filter(operations::id.eq(id))
        .select((
            operations::video_id,
            operations::tenant_id,
            videos::source_key,
            uploads::size_bytes,
            videos::mp4_support,
            videos::poster_time,
        ))
        .first(conn)
        .await
}

/// A `pending` operation whose job may need publishing again.
#[derive(Debug, Clone, Queryable)]
pub struct StalePending {
    /// The operation.
    pub id: OperationId,
    /// Its `job_attempt` when read (the guard of the re-drive or `job_lost`).
    pub job_attempt: i32,
    /// When it was accepted.
    pub created_at: DateTime<Utc>,
}

/// Up to `limit` `pending` operations whose job was last published before
/// `published_before`, oldest publication first, leaving out those at
/// `job_attempt >= max_attempt` (re-drives used up) not created before
/// `lost_before` (their `job_lost` is not due yet). Served by the partial index
/// `operations_pending_published`.
pub async fn stale_pending(
    conn: &mut Conn,
    published_before: DateTime<Utc>,
    max_attempt: i32,
    lost_before: DateTime<Utc>,
    limit: i64,
) -> QueryResult<Vec<StalePending>> {
    operations::table
        .filter(operations::status.eq(OperationStatus::Pending))
        .filter(operations::job_published_at.lt(published_before))
        // An ingest still downloading has no job to re-drive yet.
        .filter(operations::awaiting_source.eq(false))
        .filter(operations::job_attempt.lt(max_attempt).or(operations::created_at.lt(lost_before)))
        .order(operations::job_published_at.asc())
        .limit(limit)
        .select((operations::id, operations::job_attempt, operations::created_at))
        .load(conn)
        .await
}

/// When the oldest `pending` operation was accepted; `None` if none is pending.
pub async fn oldest_pending(conn: &mut Conn) -> QueryResult<Option<DateTime<Utc>>> {
    operations::table
        .filter(operations::status.eq(OperationStatus::Pending))
        .select(diesel::dsl::min(operations::created_at))
        .first(conn)
        .await
}

/// What a change of an operation is measured on: status, progress, phase.
pub type Fingerprint = (OperationStatus, i16, Option<Phase>);

/// The [`Fingerprint`] of an operation.
pub async fn fingerprint(conn: &mut Conn, id: &OperationId) -> QueryResult<Fingerprint> {
    operations::table.filter(operations::id.eq(id)).select((operations::status, operations::progress, operations::phase)).first(conn).await
}

/// Bumps the operation's `revision` and queues `pg_notify('operation_changed', id)`
/// (delivered on commit; see [`crate::watch`]).
pub async fn record_change(conn: &mut Conn, id: &OperationId) -> QueryResult<()> {
    diesel::sql_query(
        "WITH bumped AS (UPDATE operations SET revision = revision + 1 WHERE id = $1 RETURNING id) \
         SELECT pg_notify('operation_changed', id) FROM bumped",
    )
    .bind::<diesel::sql_types::Text, _>(id.as_str())
    .execute(conn)
    .await
    .map(|_| ())
}

/// A heartbeat: `running`, progress raised to at least `percent` (never lowered), heartbeat now.
pub async fn set_running(conn: &mut Conn, id: &OperationId, percent: i16) -> QueryResult<()> {
    let now = Utc::now();
    diesel::update(operations::table.filter(operations::id.eq(id)))
        .set((
            operations::status.eq(OperationStatus::Running),
            operations::progress.eq(diesel::dsl::sql::<diesel::sql_types::SmallInt>("GREATEST(progress, ")
                .bind::<diesel::sql_types::SmallInt, _>(percent)
                .sql(")")),
            operations::heartbeat_at.eq(now),
            operations::updated_at.eq(now),
        ))
        .execute(conn)
        .await
        .map(|_| ())
}

/// Sets the phase (the caller checked it moves forward).
pub async fn set_phase(conn: &mut Conn, id: &OperationId, phase: Phase) -> QueryResult<()> {
    diesel::update(operations::table.filter(operations::id.eq(id))).set(operations::phase.eq(phase)).execute(conn).await.map(|_| ())
}

/// Sets the scan outcome unless it is already that; whether it changed.
pub async fn set_scan(conn: &mut Conn, id: &OperationId, outcome: ScanOutcome) -> QueryResult<bool> {
    let n = diesel::update(operations::table.filter(operations::id.eq(id)).filter(operations::scan.is_distinct_from(outcome)))
        .set((operations::scan.eq(outcome), operations::updated_at.eq(Utc::now())))
        .execute(conn)
        .await?;
    Ok(n > 0)
}

/// `succeeded`, progress 100, phase `done`, with its result.
pub async fn set_succeeded(conn: &mut Conn, id: &OperationId, result: &OperationResult) -> QueryResult<()> {
    let now = Utc::now();
    diesel::update(operations::table.filter(operations::id.eq(id)))
        .set((
            operations::status.eq(OperationStatus::Succeeded),
            operations::progress.eq(100i16),
            operations::phase.eq(Phase::Done),
            operations::result.eq(json(result)),
            operations::updated_at.eq(now),
            operations::heartbeat_at.eq(now),
        ))
        .execute(conn)
        .await
        .map(|_| ())
}

/// `failed` or `cancelled` with its problem, only from `pending` or
/// `running`; the video id, or `None` if the operation was not open.
pub async fn set_ended(conn: &mut Conn, id: &OperationId, status: OperationStatus, error: &Problem) -> QueryResult<Option<VideoId>> {
    diesel::update(
        operations::table
            .filter(operations::id.eq(id))
            .filter(operations::status.eq_any([OperationStatus::Pending, OperationStatus::Running])),
    )
    .set((operations::status.eq(status), operations::error.eq(json(error)), operations::updated_at.eq(Utc::now())))
    .returning(operations::video_id)
    .get_result(conn)
    .await
    .optional()
}

/// Operations `running` whose last report is older than `cutoff` (at most
/// `limit`), with their `job_attempt` when read.
pub async fn silent_since(conn: &mut Conn, cutoff: DateTime<Utc>, limit: i64) -> QueryResult<Vec<(OperationId, i32)>> {
    operations::table
        .filter(operations::status.eq(OperationStatus::Running))
        .filter(operations::heartbeat_at.lt(cutoff))
        .filter(operations::awaiting_source.eq(false))
        .select((operations::id, operations::job_attempt))
        .limit(limit)
        .load(conn)
        .await
}

/// The values of a new video and its `pending` operation (phase `queued`).
pub struct NewTranscode<'a> {
    /// The new video's id.
    pub video_id: &'a VideoId,
    /// The new operation's id.
    pub operation_id: &'a OperationId,
    /// Owner.
    pub tenant_id: &'a TenantId,
    /// The completed upload.
    pub upload_id: &'a UploadId,
    /// The upload's display filename.
    pub filename: Option<&'a str>,
    /// The source's media type.
    pub content_type: &'a str,
    /// Storage key of the source object.
    pub source_key: &'a str,
    /// The playback policies of the IDs the video gets when it becomes ready (from its upload).
    pub playback_policy: &'a [PlaybackPolicy],
    /// Static MP4s or not (from its upload).
    pub mp4_support: Mp4Support,
}

/// Sets a new video's `poster_time` (seconds; from its upload, issue 20).
pub async fn set_poster_time(conn: &mut Conn, video: &VideoId, poster_time: Option<f64>) -> QueryResult<()> {
    diesel::update(videos::table).filter(videos::id.eq(video)).set(videos::poster_time.eq(poster_time)).execute(conn).await.map(|_| ())
}

/// Inserts a `processing` video and its `pending` operation; returns the operation as committed.
pub async fn insert_processing(conn: &mut Conn, new: &NewTranscode<'_>) -> QueryResult<OperationRow> {
    diesel::insert_into(videos::table)
        .values((
            videos::id.eq(new.video_id),
            videos::tenant_id.eq(new.tenant_id),
            videos::upload_id.eq(new.upload_id),
            videos::operation_id.eq(new.operation_id),
            videos::status.eq(VideoStatus::Processing),
            videos::filename.eq(new.filename),
            videos::content_type.eq(new.content_type),
            videos::source_key.eq(new.source_key),
            videos::playback_policy.eq(new.playback_policy),
            videos::mp4_support.eq(new.mp4_support),
        ))
        .execute(conn)
        .await?;
    diesel::insert_into(operations::table)
        .values((
            operations::id.eq(new.operation_id),
            operations::tenant_id.eq(new.tenant_id),
            operations::video_id.eq(new.video_id),
            operations::status.eq(OperationStatus::Pending),
            operations::phase.eq(Phase::Queued),
        ))
        .execute(conn)
        .await?;
    operations::table.filter(operations::id.eq(new.operation_id)).select(OperationRow::as_select()).first(conn).await
}

/// A row of `videos` as the API shows it.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = videos)]
pub struct VideoRow {
    /// `vid_…`
    pub id: VideoId,
    /// The operation that produces it.
    pub operation_id: OperationId,
    /// Its life; unknown stored values are a deserialize error.
    pub status: VideoStatus,
    /// Grows with every change; carried by its events.
    pub version: i64,
    /// Display filename.
    pub filename: Option<String>,
    /// Source media type.
    pub content_type: String,
    /// [`SourceMetadata`] as JSON.
    pub source: Option<serde_json::Value>,
    /// `[Rendition]` as JSON.
    pub renditions: serde_json::Value,
    /// [`Poster`] as JSON.
    pub poster: Option<serde_json::Value>,
    /// Whether static MP4s are made.
    pub mp4_support: Mp4Support,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
}

impl VideoRow {
    /// The public resource (without download URLs, and without its playback
    /// IDs: `playback_ids` is empty; the caller fills it from
    /// [`crate::store::playback_ids`]).
    pub fn into_video(self) -> Video {
        Video {
            id: self.id,
            status: self.status,
            version: self.version,
            operation_id: self.operation_id,
            filename: self.filename,
            content_type: self.content_type,
            source: self.source.and_then(|v| serde_json::from_value::<SourceMetadata>(v).ok()),
            renditions: serde_json::from_value::<Vec<Rendition>>(self.renditions).unwrap_or_default(),
            poster: self.poster.and_then(|v| serde_json::from_value::<Poster>(v).ok()),
            mp4_support: self.mp4_support,
            playback_ids: Vec::new(),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

/// A tenant's video; `None` for anyone else's.
pub async fn get_video(conn: &mut Conn, tenant: &TenantId, id: &VideoId) -> QueryResult<Option<VideoRow>> {
    videos::table.filter(videos::id.eq(id)).filter(videos::tenant_id.eq(tenant)).select(VideoRow::as_select()).first(conn).await.optional()
}

/// Up to `limit` of a tenant's videos older than `cursor`, newest first.
pub async fn list_videos(conn: &mut Conn, tenant: &TenantId, cursor: Option<&VideoId>, limit: i64) -> QueryResult<Vec<VideoRow>> {
    let mut q = videos::table.filter(videos::tenant_id.eq(tenant)).into_boxed();
    if let Some(cursor) = cursor {
        q = q.filter(videos::id.lt(cursor));
    }
    q.order(videos::id.desc()).limit(limit).select(VideoRow::as_select()).load(conn).await
}

/// Sets a video's status and increments its version; returns the new version.
pub async fn bump_video(conn: &mut Conn, id: &VideoId, status: VideoStatus) -> QueryResult<i64> {
    diesel::update(videos::table.filter(videos::id.eq(id)))
        .set((videos::status.eq(status), videos::version.eq(videos::version + 1), videos::updated_at.eq(Utc::now())))
        .returning(videos::version)
        .get_result(conn)
        .await
}

/// Stores what a succeeded transcode produced: probe results, renditions,
/// poster, and the adaptive stream (`videos.stream`, [`StreamOutputs`] as
/// JSON: what the playback service serves; `None` from a transcoder that
/// made no stream).
pub async fn set_video_outputs(
    conn: &mut Conn,
    id: &VideoId,
    source: &SourceMetadata,
    renditions: &[Rendition],
    poster: Option<&Poster>,
    stream: Option<&StreamOutputs>,
) -> QueryResult<()> {
    diesel::update(videos::table.filter(videos::id.eq(id)))
        .set((
            videos::source.eq(json(source)),
            videos::renditions.eq(json(renditions)),
            videos::poster.eq(poster.map(json)),
            videos::stream.eq(stream.map(json)),
        ))
        .execute(conn)
        .await
        .map(|_| ())
}

/// A video's stored playback policies (from its upload; may be empty).
pub async fn video_playback_policy(conn: &mut Conn, id: &VideoId) -> QueryResult<Vec<PlaybackPolicy>> {
    videos::table.filter(videos::id.eq(id)).select(videos::playback_policy).first(conn).await
}

/// Whether `tenant` has the video `id` (any status).
pub async fn video_exists(conn: &mut Conn, tenant: &TenantId, id: &VideoId) -> QueryResult<bool> {
    diesel::select(diesel::dsl::exists(videos::table.filter(videos::id.eq(id)).filter(videos::tenant_id.eq(tenant)))).get_result(conn).await
}

/// The video's status as stored, or `None` for an unknown video or another
/// tenant's. A status text the code does not know is an error (a newer
/// writer), never taken for one it knows.
pub async fn video_status(conn: &mut Conn, tenant: &TenantId, id: &VideoId) -> QueryResult<Option<VideoStatus>> {
    videos::table.filter(videos::id.eq(id)).filter(videos::tenant_id.eq(tenant)).select(videos::status).first(conn).await.optional()
}

/// Stores what the probe read of a source whose transcode failed.
pub async fn set_video_source(conn: &mut Conn, id: &VideoId, source: &SourceMetadata) -> QueryResult<()> {
    diesel::update(videos::table.filter(videos::id.eq(id))).set(videos::source.eq(json(source))).execute(conn).await.map(|_| ())
}

/// A wire type as stored JSON (these never fail to serialise).
fn json<T: serde::Serialize + ?Sized>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).expect("stored JSON serialises")
}
