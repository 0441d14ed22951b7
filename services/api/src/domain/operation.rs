//! The state machine of an operation and its video: every change of either
//! goes through [`apply`] — the transcoder-report consumer (progress, scan,
//! finish), `POST /operations/{id}:cancel`, the janitor (worker lost) and
//! the dead-letter consumer (retries exhausted).
//!
//! Rules, enforced here and nowhere else:
//! - progress never decreases and stays ≤ 99 until the status is terminal;
//!   the phase never moves backwards;
//! - a terminal status (`succeeded`, `failed`, `cancelled`) is never
//!   overwritten, so a cancel racing a completion ends in exactly one
//!   terminal state (each transition holds the operation's row lock);
//! - every change of the video bumps its `version`, and its event (carrying
//!   that version) is recorded in the same transaction and published through
//!   the outbox (whose commit wakes the relay);
//! - every change of an operation (status, progress, phase, scan) bumps its
//!   `revision` and notifies `operation_changed` in the same transaction
//!   ([`crate::watch`]);
//! - **run ownership** (issue 24): a transcoder report carries the run that
//!   sent it and its job attempt ([`apply_report`], [`Sender`]). `Started`
//!   from run R on an open operation makes R its owner (`operations.run_id`,
//!   `owner_attempt`) and, if run R0 owned it, queues
//!   `CancelTranscode{run_id: R0}` — unless R0 is of another attempt and its
//!   heartbeat is fresh (a re-driven copy must not restart a healthy run):
//!   then R alone is cancelled. A run of the same attempt (crash redelivery,
//!   shutdown hand-back) or any run against a silent owner takes over.
//!   `Started` on a terminal operation queues `CancelTranscode{run_id: R}`.
//!   While an open operation has no owner, the first run to report anything
//!   takes it. Every other report of a run that is not the owner is ignored
//!   ([`Applied::NotOwner`]); outputs are never deleted for it;
//! - a job is re-published ([`Transition::Redrive`]; an ingest's job while
//!   the operation awaits its source, [`Transition::RedriveIngest`]) or the
//!   operation failed `job_lost` ([`Transition::JobLost`]) only while it is
//!   `pending` with the `job_attempt` the janitor read;
//! - a cancelled (or `job_lost`) ingest queues the cancel broadcast, which
//!   ingest workers hear too (they stop the download and abort its multipart
//!   upload); a download report on a cancelled ingest queues it again; a silent `running` one is re-published
//!   ([`Transition::RedriveSilent`]) only while still `running`, silent, at
//!   that `job_attempt`: of replicas racing, one wins;
//! - a dead-lettered copy fails the operation ([`Transition::DeadLetter`])
//!   only if it is the current attempt and no run of another attempt is alive.

use chrono::{DateTime, Utc};
use diesel::QueryResult;
use diesel_async::scoped_futures::ScopedFutureExt;
use vid_core::event::{EventData, EventType, VideoEventData};
use vid_core::messages::StreamOutputs;
use vid_core::operation::{OperationResult, OperationStatus, Phase, RenditionRef, ScanOutcome};
use vid_core::video::{Poster, Rendition, SourceMetadata, VideoStatus};
use vid_core::{OperationId, Problem, TenantId, VideoId};

use crate::error::codes;
use crate::store::operations as ops;
use crate::store::outbox::{Outbox, Staged};
use crate::store::playback_ids;
use crate::store::Conn;

/// What may happen to an operation.
// `Finish` carries the outcome by value: a transition lives for one call.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Transition {
    /// A transcoder's heartbeat (`started` is `percent: 0` without a phase).
    Progress {
        /// The step it is in, if it said.
        phase: Option<Phase>,
        /// Integer percent; capped at 99.
        percent: u8,
    },
    /// The malware scan's outcome (`metadata.scan`).
    Scan(ScanOutcome),
    /// The operation ended.
    Finish(Outcome),
    /// The caller cancelled it.
    Cancel,
    /// A transcoder run took the job (only through [`apply_report`], which names the run).
    Started,
    /// Publish the job again (attempt + 1), if still `pending` at `job_attempt == seen`.
    Redrive {
        /// The `job_attempt` the janitor read.
        seen: i32,
    },
    /// Publish the job of a silent `running` operation again (attempt + 1),
    /// if still `running` at `job_attempt == seen` with its last report
    /// before `silent_before`: the owner is dropped (`run_id` NULL, the next
    /// run to report takes it) and `heartbeat_at` reset to `now`; the status
    /// stays `running` and the progress is kept.
    RedriveSilent {
        /// The `job_attempt` the janitor read.
        seen: i32,
        /// Now minus `operations.heartbeat_timeout_seconds`.
        silent_before: DateTime<Utc>,
        /// The janitor pass's clock (the new `heartbeat_at`).
        now: DateTime<Utc>,
    },
    /// The broker dead-lettered a copy of the job (attempt `attempt`): fail
    /// the operation with `error`, unless that copy is superseded (`attempt`
    /// below `job_attempt`) or a run of another attempt owns the operation
    /// with a report at or after `fresh_since`.
    DeadLetter {
        /// `TranscodeJob.attempt` of the dead copy.
        attempt: i32,
        /// Now minus `operations.heartbeat_timeout_seconds`.
        fresh_since: DateTime<Utc>,
        /// The problem to show (`transcode_retries_exhausted`).
        error: Problem,
    },
    /// An ingest's download moved (the ingest worker's progress report):
    /// `metadata.download` shows `bytes` (never lowered) of `total`. Only
    /// while the operation is open and awaiting its source.
    Download {
        /// Bytes received so far.
        bytes: u64,
        /// The size the source announced, if any.
        total: Option<u64>,
    },
    /// An ingest's source is in storage (`size_bytes`, `content_type`): in
    /// one transaction the upload and video get both, the operation stops
    /// awaiting its source, and the transcode job (attempt 1) is queued — what
    /// `complete` does for an upload. Only while open and awaiting the
    /// source; on a terminal one [`Applied::AlreadyTerminal`] (the caller
    /// deletes the downloaded object).
    SourceReady {
        /// Bytes stored.
        size_bytes: u64,
        /// The source's media type.
        content_type: String,
    },
    /// Publish an ingest's job again (attempt + 1), rebuilt from the rows
    /// (`store::ingests::job_of`), if still `pending`, awaiting its source, at
    /// `job_attempt == seen`: the job was lost before a worker downloaded the
    /// source (broker loss, a worker that died after taking it). Harmless if
    /// the original turns up: a worker finds a stored source (HeadObject)
    /// and reports `downloaded` again, which changes nothing once applied.
    RedriveIngest {
        /// The `job_attempt` the janitor read.
        seen: i32,
        /// For an ingest from before its job's inputs were stored.
        defaults: crate::store::ingests::IngestDefaults,
    },
    /// Fail the operation with `error` (`job_lost`), if still `pending` at
    /// `job_attempt == seen`. For an ingest still awaiting its source, the
    /// cancel broadcast is sent too, so a worker still downloading it stops
    /// and aborts its multipart upload.
    JobLost {
        /// The `job_attempt` the janitor read.
        seen: i32,
        /// The problem to show.
        error: Problem,
    },
}

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
        /// The adaptive stream, stored as `videos.stream`. With one, the
        /// video gets one playback ID per distinct policy of its
        /// `playback_policy` in the same transaction; without one (an older
        /// transcoder) there is nothing to play, so it gets none.
        stream: Option<StreamOutputs>,
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
    /// Nothing to do (unknown operation, duplicate, late, or already terminal with this status).
    Ignored,
    /// The operation was already terminal with another status (e.g.
    /// `cancelled`); the caller should clean up what the report produced.
    /// For a progress report on a cancelled operation, the cancel was sent again.
    AlreadyTerminal(OperationStatus),
    /// The report came from a run that does not own the operation: ignored.
    NotOwner,
}

/// Applies `transition` to operation `id` in one transaction (see the module
/// docs for the rules), as the api itself (janitor, `:cancel`, dead letters):
/// no run ownership is checked. Errors: the database failed, or the row holds
/// a state the code does not know (a deserialize error); nothing changed then.
pub async fn apply(conn: &mut Conn, outbox: &Outbox, id: &OperationId, transition: Transition) -> QueryResult<Applied> {
    apply_as(conn, outbox, id, None, transition).await
}

/// The transcoder run that sent a report.
#[derive(Debug, Clone)]
pub struct Sender {
    /// `TranscodeReport.run_id` (`""` from older transcoders: the run `""`).
    pub run: String,
    /// `TranscodeReport.attempt` (the job's `attempt`; 1 from older transcoders).
    pub attempt: i32,
    /// Now minus `operations.heartbeat_timeout_seconds`: an owner whose last
    /// report is at or after it is alive.
    pub fresh_since: DateTime<Utc>,
}

/// Applies a transcoder report's `transition`, sent by `sender`: `Started`
/// takes ownership (see [`started`]); while the operation is open and has no
/// owner, the first run to report anything takes it; any other report of a
/// run that is not the owner is [`Applied::NotOwner`]. Errors as [`apply`].
pub async fn apply_report(
    conn: &mut Conn,
    outbox: &Outbox,
    id: &OperationId,
    sender: Sender,
    transition: Transition,
) -> QueryResult<Applied> {
    apply_as(conn, outbox, id, Some(sender), transition).await
}

async fn apply_as(
    conn: &mut Conn,
    outbox: &Outbox,
    id: &OperationId,
    sender: Option<Sender>,
    transition: Transition,
) -> QueryResult<Applied> {
    let id = id.clone();
    outbox
        .transaction(conn, move |conn, staged| {
            async move {
                let Some(row) = ops::lock(conn, &id).await? else { return Ok(Applied::Ignored) };
                let run = sender.as_ref().map(|s| s.run.clone());
                let op = Locked { id: &id, status: row.status, video: row.video.clone(), tenant: row.tenant.clone(), staged, run };
                if let Some(sender) = &sender {
                    if let Transition::Started = transition {
                        return started(conn, &op, sender, &row).await;
                    }
                    if !owns(conn, &op, sender, &row).await? {
                        // A cancelled operation's busy worker is told again, whoever owns it.
                        if !(op.status == OperationStatus::Cancelled && matches!(transition, Transition::Progress { .. })) {
                            return Ok(Applied::NotOwner);
                        }
                    }
                }
                match transition {
                    Transition::Progress { phase, percent } => progress(conn, &op, phase, percent).await,
                    Transition::Started => progress(conn, &op, None, 0).await,
                    Transition::Scan(outcome) => scan(conn, &op, outcome).await,
                    Transition::Finish(outcome) => finish(conn, &op, outcome).await,
                    Transition::Cancel => cancel(conn, &op).await,
                    Transition::Download { .. } if op.status == OperationStatus::Cancelled => {
                        // A worker still downloads a cancelled ingest: the broadcast missed it; tell it again.
                        op.staged.cancel_transcode(conn, op.id, None).await?;
                        Ok(Applied::AlreadyTerminal(op.status))
                    }
                    Transition::Download { .. } | Transition::SourceReady { .. } if op.status.is_terminal() => {
                        Ok(Applied::AlreadyTerminal(op.status))
                    }
                    Transition::Download { .. } | Transition::SourceReady { .. } if !row.awaiting_source => Ok(Applied::Ignored),
                    Transition::Download { bytes, total } => download(conn, &op, bytes, total).await,
                    Transition::SourceReady { size_bytes, content_type } => source_ready(conn, &op, size_bytes, &content_type).await,
                    Transition::Redrive { seen }
                        if op.status == OperationStatus::Pending && !row.awaiting_source && row.job_attempt == seen =>
                    {
                        redrive(conn, &op, None).await
                    }
                    Transition::RedriveIngest { seen, defaults }
                        if op.status == OperationStatus::Pending && row.awaiting_source && row.job_attempt == seen =>
                    {
                        redrive_ingest(conn, &op, &defaults).await
                    }
                    Transition::JobLost { seen, error } if op.status == OperationStatus::Pending && row.job_attempt == seen => {
                        if row.awaiting_source {
                            op.staged.cancel_transcode(conn, op.id, None).await?;
                        }
                        finish(conn, &op, Outcome::Failed { error, source: None }).await
                    }
                    Transition::RedriveSilent { seen, silent_before, now }
                        if op.status == OperationStatus::Running
                            && row.job_attempt == seen
                            && row.heartbeat_at.is_some_and(|t| t < silent_before) =>
                    {
                        redrive(conn, &op, Some(now)).await
                    }
                    Transition::DeadLetter { attempt, fresh_since, error } => {
                        let superseded = attempt < row.job_attempt;
                        let fresh = row.heartbeat_at.is_some_and(|t| t >= fresh_since);
                        let other_alive = row.run_id.is_some() && fresh && row.owner_attempt != Some(attempt);
                        if superseded || other_alive {
                            return Ok(Applied::Ignored);
                        }
                        finish(conn, &op, Outcome::Failed { error, source: None }).await
                    }
                    Transition::Redrive { .. }
                    | Transition::RedriveIngest { .. }
                    | Transition::JobLost { .. }
                    | Transition::RedriveSilent { .. } => Ok(Applied::Ignored),
                }
            }
            .scope_boxed()
        })
        .await
}

/// An operation whose row this transaction holds.
struct Locked<'a> {
    id: &'a OperationId,
    status: OperationStatus,
    video: VideoId,
    tenant: TenantId,
    staged: Staged,
    /// The run that sent the transition (`None`: the api itself).
    run: Option<String>,
}

impl Locked<'_> {
    /// Sets the video's status, bumps its version and records its event.
    async fn video_event(&self, conn: &mut Conn, status: VideoStatus, type_: EventType) -> QueryResult<()> {
        let version = ops::bump_video(conn, &self.video, status).await?;
        let data = EventData::Video(VideoEventData { video_id: self.video.clone(), operation_id: self.id.clone(), version });
        self.staged.record_event(conn, &self.tenant, type_, self.video.as_str(), data).await?;
        Ok(())
    }
}

/// `pending` becomes `running` (event `video.processing`); progress and
/// phase only move forward, so a late report, a duplicate job or a restarted
/// worker never rewinds what the operation shows (nor counts as a change).
/// On a `cancelled` operation the cancel is sent again: a worker is busy with
/// it (the job was still queued at the cancel, or the broadcast missed it).
async fn progress(conn: &mut Conn, op: &Locked<'_>, phase: Option<Phase>, percent: u8) -> QueryResult<Applied> {
    if op.status == OperationStatus::Cancelled {
        op.staged.cancel_transcode(conn, op.id, op.run.as_deref()).await?;
        return Ok(Applied::AlreadyTerminal(op.status));
    }
    if op.status.is_terminal() {
        return Ok(Applied::Ignored);
    }
    let before = ops::fingerprint(conn, op.id).await?;
    if op.status == OperationStatus::Pending {
        op.video_event(conn, VideoStatus::Processing, EventType::VideoProcessing).await?;
    }
    ops::set_running(conn, op.id, i16::from(percent.min(99))).await?;
    if let Some(phase) = phase.filter(|p| before.2.is_none_or(|shown| *p > shown)) {
        ops::set_phase(conn, op.id, phase).await?;
    }
    if ops::fingerprint(conn, op.id).await? != before {
        ops::record_change(conn, op.id).await?;
    }
    Ok(Applied::Changed)
}

/// Records the scan outcome of an open operation; a change bumps its revision.
async fn scan(conn: &mut Conn, op: &Locked<'_>, outcome: ScanOutcome) -> QueryResult<Applied> {
    if op.status.is_terminal() || !ops::set_scan(conn, op.id, outcome).await? {
        return Ok(Applied::Ignored);
    }
    ops::record_change(conn, op.id).await?;
    Ok(Applied::Changed)
}

/// Ends an open operation: operation, video (outputs or probe results), event.
/// A success with a stream also stores it and creates the video's playback
/// IDs (one per distinct stored policy, in the order stored), in this same
/// transaction; so a duplicate `Succeeded` (the operation is terminal by
/// then) creates no second set.
async fn finish(conn: &mut Conn, op: &Locked<'_>, outcome: Outcome) -> QueryResult<Applied> {
    let target = match outcome {
        Outcome::Succeeded { .. } => OperationStatus::Succeeded,
        Outcome::Failed { .. } => OperationStatus::Failed,
    };
    if op.status.is_terminal() {
        return Ok(if op.status == target { Applied::Ignored } else { Applied::AlreadyTerminal(op.status) });
    }
    match outcome {
        Outcome::Succeeded { source, renditions, poster, stream } => {
            let result = OperationResult {
                video_id: op.video.clone(),
                video: format!("/videos/{}", op.video),
                renditions: renditions
                    .iter()
                    .map(|r| RenditionRef { name: r.name.clone(), width: r.width, height: r.height, storage_key: r.storage_key.clone() })
                    .collect(),
            };
            ops::set_succeeded(conn, op.id, &result).await?;
            ops::set_video_outputs(conn, &op.video, &source, &renditions, poster.as_ref(), stream.as_ref()).await?;
            if stream.is_some() {
                let policies = super::distinct_policies(ops::video_playback_policy(conn, &op.video).await?);
                for policy in policies {
                    playback_ids::insert(conn, &op.tenant, &op.video, policy).await?;
                }
            }
            op.video_event(conn, VideoStatus::Ready, EventType::VideoReady).await?;
        }
        Outcome::Failed { error, source } => {
            ops::set_ended(conn, op.id, OperationStatus::Failed, &error).await?;
            if let Some(source) = source {
                ops::set_video_source(conn, &op.video, &source).await?;
            }
            op.video_event(conn, VideoStatus::Failed, EventType::VideoFailed).await?;
        }
    }
    ops::record_change(conn, op.id).await?;
    Ok(Applied::Changed)
}

/// Cancels an open operation: the operation `cancelled` (error code
/// `cancelled`), the video `cancelled` with event `video.cancelled`, and a
/// cancel broadcast to every transcoder and ingest worker. A terminal one is left alone
/// ([`Applied::AlreadyTerminal`], or [`Applied::Ignored`] if already cancelled).
async fn cancel(conn: &mut Conn, op: &Locked<'_>) -> QueryResult<Applied> {
    if op.status.is_terminal() {
        return Ok(if op.status == OperationStatus::Cancelled { Applied::Ignored } else { Applied::AlreadyTerminal(op.status) });
    }
    let error = codes::CANCELLED.problem().with_detail("cancelled at the caller's request");
    ops::set_ended(conn, op.id, OperationStatus::Cancelled, &error).await?;
    ops::record_change(conn, op.id).await?;
    op.video_event(conn, VideoStatus::Cancelled, EventType::VideoCancelled).await?;
    op.staged.cancel_transcode(conn, op.id, None).await?;
    Ok(Applied::Changed)
}

/// Whether `sender` owns the open or terminal operation `op` for a report
/// other than `Started`: it is the owner, or the operation is open without
/// an owner (an operation from before issue 24, or re-driven while silent, or
/// a report overtaking its `Started`): then it takes ownership here.
async fn owns(conn: &mut Conn, op: &Locked<'_>, sender: &Sender, row: &ops::LockedRow) -> QueryResult<bool> {
    match row.run_id.as_deref() {
        Some(owner) => Ok(owner == sender.run),
        None if !op.status.is_terminal() => {
            tracing::info!(operation_id = %op.id, run = %sender.run, "a run reported on an operation without owner: it takes ownership");
            ops::set_owner(conn, op.id, &sender.run, Some(sender.attempt)).await?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// `Started` from `sender`: on a terminal operation, a targeted cancel of its
/// run ([`Applied::AlreadyTerminal`]). On an open one its run becomes the
/// owner (a previous owner gets a targeted cancel) and the report counts as
/// a heartbeat at 0 % — unless the owner is alive (last report at or after
/// `fresh_since`) and of another job attempt (a re-driven copy must not
/// restart a healthy run): then the newcomer gets the targeted cancel
/// ([`Applied::NotOwner`]). A run of the same attempt (a crash redelivery, a
/// shutdown hand-back; an owner of unknown attempt counts as the same) takes
/// over at once.
async fn started(conn: &mut Conn, op: &Locked<'_>, sender: &Sender, row: &ops::LockedRow) -> QueryResult<Applied> {
    let run = sender.run.as_str();
    if op.status.is_terminal() {
        op.staged.cancel_transcode(conn, op.id, Some(run)).await?;
        return Ok(Applied::AlreadyTerminal(op.status));
    }
    match row.run_id.as_deref() {
        Some(owner) if owner == run => {}
        Some(owner) => {
            let other_attempt = row.owner_attempt.is_some_and(|a| a != sender.attempt);
            let alive = row.heartbeat_at.is_some_and(|t| t >= sender.fresh_since);
            if other_attempt && alive {
                tracing::info!(operation_id = %op.id, owner, run, attempt = sender.attempt, "a copy of another attempt started while the owner runs: cancelling the copy");
                op.staged.cancel_transcode(conn, op.id, Some(run)).await?;
                return Ok(Applied::NotOwner);
            }
            tracing::info!(operation_id = %op.id, previous = owner, run, "a newer run started: cancelling the previous owner");
            op.staged.cancel_transcode(conn, op.id, Some(owner)).await?;
            ops::set_owner(conn, op.id, run, Some(sender.attempt)).await?;
        }
        None => ops::set_owner(conn, op.id, run, Some(sender.attempt)).await?,
    }
    progress(conn, op, None, 0).await
}

/// An ingest's progress: a change of `metadata.download` bumps the revision.
async fn download(conn: &mut Conn, op: &Locked<'_>, bytes: u64, total: Option<u64>) -> QueryResult<Applied> {
    if !crate::store::ingests::set_download(conn, op.id, bytes, total).await? {
        return Ok(Applied::Ignored);
    }
    ops::record_change(conn, op.id).await?;
    Ok(Applied::Changed)
}

/// An ingest's source is stored: record it and queue the transcode job
/// (attempt 1, with the size now known), as `complete` does.
async fn source_ready(conn: &mut Conn, op: &Locked<'_>, size_bytes: u64, content_type: &str) -> QueryResult<Applied> {
    crate::store::ingests::set_source_ready(conn, op.id, &op.video, size_bytes, content_type).await?;
    let src = ops::job_source(conn, op.id).await?;
    let job = super::transcode_job(op.id, &src.video, &src.tenant, src.source_key, src.size_bytes, 1, src.mp4_support);
    let job = vid_core::messages::TranscodeJob { poster_time: src.poster_time, ..job };
    op.staged.transcode_job(conn, &job).await?;
    ops::record_change(conn, op.id).await?;
    Ok(Applied::Changed)
}

/// Publishes the job again through the outbox with the next attempt number
/// (`job_attempt + 1`, `job_published_at = now()`; with `heartbeat`, a silent
/// running operation: owner dropped, `heartbeat_at` reset to it); not a
/// visible change of the operation (no revision bump).
async fn redrive(conn: &mut Conn, op: &Locked<'_>, heartbeat: Option<DateTime<Utc>>) -> QueryResult<Applied> {
    let attempt = ops::set_republished(conn, op.id, heartbeat).await?;
    let src = ops::job_source(conn, op.id).await?;
    let job = super::transcode_job(op.id, &src.video, &src.tenant, src.source_key, src.size_bytes, attempt, src.mp4_support);
    let job = vid_core::messages::TranscodeJob { poster_time: src.poster_time, ..job };
    op.staged.transcode_job(conn, &job).await?;
    Ok(Applied::Changed)
}

/// Publishes an ingest's job again through the outbox, rebuilt from the
/// rows, with the next attempt number (`job_attempt + 1`,
/// `job_published_at = now()`); not a visible change (no revision bump).
async fn redrive_ingest(conn: &mut Conn, op: &Locked<'_>, defaults: &crate::store::ingests::IngestDefaults) -> QueryResult<Applied> {
    let attempt = ops::set_republished(conn, op.id, None).await?;
    let job = crate::store::ingests::job_of(conn, op.id, attempt, defaults).await?;
    op.staged.ingest_job(conn, &job).await?;
    Ok(Applied::Changed)
}
