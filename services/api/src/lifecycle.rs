//! Operation state transitions, each in one transaction with the event it causes.
//!
//! Rules, enforced here and nowhere else:
//! - progress never decreases and stays ≤ 99 until the status is terminal;
//! - a terminal status (`succeeded`, `failed`, `cancelled`) is never overwritten,
//!   so a cancel racing a completion ends in exactly one terminal state;
//! - every change of the video bumps its `version`, and its event (carrying
//!   that version) is recorded in the same transaction, published via the outbox;
//! - every change of an operation bumps its `revision` and notifies
//!   `operation_changed` in the same transaction ([`crate::watch`]).

use chrono::Utc;
use diesel::prelude::*;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use vid_core::event::{EventData, EventType, VideoEventData};
use vid_core::messages::CancelTranscode;
use vid_core::operation::{OperationResult, OperationStatus, Phase, RenditionRef};
use vid_core::video::{Poster, Rendition, SourceMetadata, VideoStatus};
use vid_core::{OperationId, Problem, TenantId, VideoId};
use vid_db::schema::{operations, videos};
use vid_db::RunQueryDsl;
use vid_infra::amqp::Topology;

use crate::routes::operations::bump_video;

/// What ended an operation.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Every output is stored.
    Succeeded {
        /// Probe results.
        source: SourceMetadata,
        /// Outputs, tallest first.
        renditions: Vec<Rendition>,
        /// Poster.
        poster: Option<Poster>,
    },
    /// A permanent failure.
    Failed {
        /// The problem to show in `error`.
        error: Problem,
        /// Probe results, if any.
        source: Option<SourceMetadata>,
    },
}

/// What a transition did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The state changed.
    Changed,
    /// Nothing to do (duplicate, late, or the operation is already terminal with this status).
    Ignored,
    /// The operation was already terminal with another status (e.g. `cancelled`);
    /// the caller should clean up what the report produced.
    AlreadyTerminal(OperationStatus),
}

fn phase_str(phase: Phase) -> String {
    serde_json::to_value(phase).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

async fn lock(conn: &mut AsyncPgConnection, id: &OperationId) -> diesel::QueryResult<Option<(String, VideoId, TenantId)>> {
    operations::table
        .filter(operations::id.eq(id))
        .for_update()
        .select((operations::status, operations::video_id, operations::tenant_id))
        .first(conn)
        .await
        .optional()
}

async fn video_event(
    conn: &mut AsyncPgConnection,
    topology: &Topology,
    tenant: &TenantId,
    op: &OperationId,
    video: &VideoId,
    status: VideoStatus,
    type_: EventType,
) -> diesel::QueryResult<()> {
    let version = bump_video(conn, video, status).await?;
    crate::outbox::record_event(
        conn,
        topology,
        tenant,
        type_,
        video.as_str(),
        EventData::Video(VideoEventData { video_id: video.clone(), operation_id: op.clone(), version }),
    )
    .await?;
    Ok(())
}

/// A heartbeat with progress: `pending` becomes `running` (event
/// `video.processing`), progress only moves forward, capped at 99, and so
/// does the phase: a late report, a duplicate copy of the job or a worker
/// restarting the job after a crash never rewinds what the operation shows
/// (nor counts as a change for `:wait` and event streams).
/// On a `cancelled` operation it queues another cancel for the workers and
/// returns [`Applied::AlreadyTerminal`].
pub async fn record_progress(
    db: &vid_db::Pool,
    topology: &Topology,
    id: &OperationId,
    phase: Option<Phase>,
    percent: u8,
) -> anyhow::Result<Applied> {
    let mut conn = db.get().await?;
    let topology = topology.clone();
    let id = id.clone();
    conn.transaction::<Applied, anyhow::Error, _>(|conn| {
        async move {
            let Some((status, video, tenant)) = lock(conn, &id).await? else { return Ok(Applied::Ignored) };
            let status = OperationStatus::parse(&status).unwrap_or(OperationStatus::Failed);
            if status == OperationStatus::Cancelled {
                // A worker is busy with a cancelled operation: the job was still queued when it
                // was cancelled, or the cancel broadcast missed this worker. Tell it again, so it
                // stops instead of transcoding and uploading outputs nobody will keep.
                crate::outbox::enqueue(
                    conn,
                    &topology.control_exchange(),
                    "",
                    serde_json::to_string(&CancelTranscode { operation_id: id.clone() }).expect("serialises"),
                    Some(id.as_str()),
                )
                .await?;
                return Ok(Applied::AlreadyTerminal(status));
            }
            if status.is_terminal() {
                return Ok(Applied::Ignored);
            }
            let before = crate::watch::fingerprint(conn, &id).await?;
            let now = Utc::now();
            if status == OperationStatus::Pending {
                video_event(conn, &topology, &tenant, &id, &video, VideoStatus::Processing, EventType::VideoProcessing).await?;
            }
            let pct = i16::from(percent.min(99));
            diesel::update(operations::table.filter(operations::id.eq(&id)))
                .set((
                    operations::status.eq(OperationStatus::Running.as_str()),
                    operations::progress.eq(diesel::dsl::sql::<diesel::sql_types::SmallInt>("GREATEST(progress, ")
                        .bind::<diesel::sql_types::SmallInt, _>(pct)
                        .sql(")")),
                    operations::heartbeat_at.eq(now),
                    operations::updated_at.eq(now),
                ))
                .execute(conn)
                .await?;
            let shown: Option<String> = operations::table.filter(operations::id.eq(&id)).select(operations::phase).first(conn).await?;
            let shown = shown.and_then(|p| serde_json::from_value::<Phase>(serde_json::Value::String(p)).ok());
            if let Some(phase) = phase.filter(|p| shown.is_none_or(|s| *p > s)) {
                diesel::update(operations::table.filter(operations::id.eq(&id)))
                    .set(operations::phase.eq(phase_str(phase)))
                    .execute(conn)
                    .await?;
            }
            crate::watch::record_change_since(conn, &id, before).await?;
            Ok(Applied::Changed)
        }
        .scope_boxed()
    })
    .await
}

/// Ends an operation (unless it already ended): operation, video, event, in one transaction.
pub async fn finish(db: &vid_db::Pool, topology: &Topology, id: &OperationId, outcome: Outcome) -> anyhow::Result<Applied> {
    let mut conn = db.get().await?;
    let topology = topology.clone();
    let id = id.clone();
    conn.transaction::<Applied, anyhow::Error, _>(|conn| {
        async move {
            let Some((status, video, tenant)) = lock(conn, &id).await? else { return Ok(Applied::Ignored) };
            let status = OperationStatus::parse(&status).unwrap_or(OperationStatus::Failed);
            let target = match outcome {
                Outcome::Succeeded { .. } => OperationStatus::Succeeded,
                Outcome::Failed { .. } => OperationStatus::Failed,
            };
            if status.is_terminal() {
                return Ok(if status == target { Applied::Ignored } else { Applied::AlreadyTerminal(status) });
            }
            let now = Utc::now();
            match outcome {
                Outcome::Succeeded { source, renditions, poster } => {
                    let result = OperationResult {
                        video_id: video.clone(),
                        video: format!("/videos/{video}"),
                        renditions: renditions
                            .iter()
                            .map(|r| RenditionRef {
                                name: r.name.clone(),
                                width: r.width,
                                height: r.height,
                                storage_key: r.storage_key.clone(),
                            })
                            .collect(),
                    };
                    diesel::update(operations::table.filter(operations::id.eq(&id)))
                        .set((
                            operations::status.eq(OperationStatus::Succeeded.as_str()),
                            operations::progress.eq(100i16),
                            operations::phase.eq(phase_str(Phase::Done)),
                            operations::result.eq(serde_json::to_value(&result)?),
                            operations::updated_at.eq(now),
                            operations::heartbeat_at.eq(now),
                        ))
                        .execute(conn)
                        .await?;
                    diesel::update(videos::table.filter(videos::id.eq(&video)))
                        .set((
                            videos::source.eq(serde_json::to_value(&source)?),
                            videos::renditions.eq(serde_json::to_value(&renditions)?),
                            videos::poster.eq(poster.map(serde_json::to_value).transpose()?),
                        ))
                        .execute(conn)
                        .await?;
                    video_event(conn, &topology, &tenant, &id, &video, VideoStatus::Ready, EventType::VideoReady).await?;
                }
                Outcome::Failed { error, source } => {
                    diesel::update(operations::table.filter(operations::id.eq(&id)))
                        .set((
                            operations::status.eq(OperationStatus::Failed.as_str()),
                            operations::error.eq(serde_json::to_value(&error)?),
                            operations::updated_at.eq(now),
                        ))
                        .execute(conn)
                        .await?;
                    if let Some(source) = source {
                        diesel::update(videos::table.filter(videos::id.eq(&video)))
                            .set(videos::source.eq(serde_json::to_value(&source)?))
                            .execute(conn)
                            .await?;
                    }
                    video_event(conn, &topology, &tenant, &id, &video, VideoStatus::Failed, EventType::VideoFailed).await?;
                }
            }
            crate::watch::record_change(conn, &id).await?;
            Ok(Applied::Changed)
        }
        .scope_boxed()
    })
    .await
}

/// The scan outcome of a running operation's source (`metadata.scan`); a
/// change bumps its revision. Ignored once the operation is terminal.
pub async fn record_scan(db: &vid_db::Pool, id: &OperationId, outcome: vid_core::operation::ScanOutcome) -> anyhow::Result<Applied> {
    let mut conn = db.get().await?;
    let id = id.clone();
    conn.transaction::<Applied, anyhow::Error, _>(|conn| {
        async move {
            let Some((status, _, _)) = lock(conn, &id).await? else { return Ok(Applied::Ignored) };
            if OperationStatus::parse(&status).is_none_or(|s| s.is_terminal()) {
                return Ok(Applied::Ignored);
            }
            let n = diesel::update(
                operations::table.filter(operations::id.eq(&id)).filter(operations::scan.is_distinct_from(outcome.as_str())),
            )
            .set((operations::scan.eq(outcome.as_str()), operations::updated_at.eq(Utc::now())))
            .execute(conn)
            .await?;
            if n == 0 {
                return Ok(Applied::Ignored);
            }
            crate::watch::record_change(conn, &id).await?;
            Ok(Applied::Changed)
        }
        .scope_boxed()
    })
    .await
}
