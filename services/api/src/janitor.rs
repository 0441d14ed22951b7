//! Periodic clean-up: expire abandoned uploads, fail operations whose worker
//! went silent, re-drive transcode and ingest jobs the broker may have lost
//! (issue 24: PostgreSQL is the truth for both; see [`redrive`] and
//! [`redrive_ingests`]).
//! Safe to run in every replica at once: each change is a guarded UPDATE
//! (for operations: a transition under the row lock, guarded by the status
//! and `job_attempt` the pass read).

use std::time::Duration;

use chrono::Utc;
use vid_core::upload::UploadStatus;

use crate::domain::operation::{self, Applied, Outcome, Transition};
use crate::error::codes;
use crate::state::AppState;
use crate::store::{ingests, operations, uploads};

/// How long an upload may stay `completing` (measured from when `complete`
/// marked it) before the janitor may expire it, once past its `expires_at`.
/// A running `complete` puts a failed upload back to `created` itself; only a
/// `complete` that died midway (process killed, database lost) leaves one
/// `completing`. 15 minutes is far above any CompleteMultipartUpload.
pub const COMPLETING_GRACE: Duration = Duration::from_secs(15 * 60);

/// Runs [`sweep`] every `every` until the process exits.
pub async fn run(state: AppState, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = sweep(&state).await {
            tracing::warn!(error = %format!("{e:#}"), "janitor sweep failed");
        }
    }
}

/// One pass: returns (uploads expired, operations failed `worker_lost`); the
/// re-drive's own counts go to its metrics. Also purges
/// `Idempotency-Key` rows past their 24 h window ([`crate::idempotency::purge_expired`]).
pub async fn sweep(state: &AppState) -> anyhow::Result<(usize, usize)> {
    let now = Utc::now();
    let mut conn = state.db.get().await?;
    let mut expired = 0;
    for (id, key, s3_id) in uploads::expired_created(&mut conn, now, 100).await? {
        if let Err(e) = crate::storage::abort_multipart(state, &key, &s3_id).await {
            tracing::warn!(upload = %id, error = %e, "could not abort an expired upload; will retry");
            continue;
        }
        expired += usize::from(uploads::move_status(&mut conn, &id, &[UploadStatus::Created], UploadStatus::Expired, None).await?);
    }
    expired += expire_stuck_completing(state, &mut conn, now).await?;

    let failed = silent(state, &mut conn, now).await?.lost;
    redrive(state, &mut conn, now).await?;
    redrive_ingests(state, &mut conn, now).await?;
    drop(conn);
    crate::idempotency::purge_expired(&state.db).await?;
    Ok((expired, failed))
}

/// What one [`silent`] pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Silent {
    /// Jobs of silent `running` operations published again (`jobs_redriven_total`).
    pub redriven: usize,
    /// Operations failed `worker_lost` (re-drives used up).
    pub lost: usize,
}

/// Heals `running` operations whose last report is older than
/// `operations.heartbeat_timeout_seconds` at `now` (the run died, and after a
/// broker reset nothing re-delivers its job): while fewer than
/// `operations.max_redrives` re-drives were made, the job is published again
/// ([`Transition::RedriveSilent`]: owner dropped, heartbeat reset to `now`,
/// status stays `running`, progress kept); after that the operation fails
/// `worker_lost`. At most 100 per pass.
pub async fn silent(state: &AppState, conn: &mut crate::store::Conn, now: chrono::DateTime<Utc>) -> anyhow::Result<Silent> {
    let o = &state.settings.operations;
    let timeout = o.heartbeat_timeout_seconds;
    let silent_before = now - chrono::Duration::seconds(timeout as i64);
    let max_attempt = i32::try_from(o.max_redrives).unwrap_or(i32::MAX - 1) + 1;
    let mut done = Silent::default();
    for (id, seen) in operations::silent_since(conn, silent_before, 100).await? {
        if seen < max_attempt {
            let transition = Transition::RedriveSilent { seen, silent_before, now };
            if operation::apply(conn, &state.outbox, &id, transition).await? == Applied::Changed {
                tracing::warn!(operation_id = %id, attempt = seen + 1, "running but silent: transcode job re-driven");
                vid_infra::metrics::counter!("jobs_redriven_total").increment(1);
                done.redriven += 1;
            }
            continue;
        }
        let error =
            codes::WORKER_LOST.problem().with_detail(format!("no report from the transcoder for {timeout} s after {} re-drives", seen - 1));
        let lost = Transition::Finish(Outcome::Failed { error, source: None });
        if operation::apply(conn, &state.outbox, &id, lost).await? == Applied::Changed {
            done.lost += 1;
        }
    }
    Ok(done)
}

/// What one [`redrive`] pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Redriven {
    /// Seconds since the oldest `pending` operation was accepted, at the
    /// pass's `now` (`oldest_pending_operation_age_seconds`; 0 when none).
    pub oldest_pending_age_seconds: f64,
    /// Jobs published again (`jobs_redriven_total`).
    pub redriven: usize,
    /// Operations failed as `job_lost` (`operations_job_lost_total`).
    pub lost: usize,
}

/// Re-drives stale `pending` operations: a job last published more than
/// `operations.redrive_after_seconds` ago is published again through the
/// outbox (attempt + 1) while fewer than `operations.max_redrives` re-drives
/// were made; after that, once the operation is older than
/// `operations.job_lost_after_seconds`, it fails with `job_lost`. Sets the
/// gauge `oldest_pending_operation_age_seconds` (0 when none is pending).
/// At most 100 operations per pass (oldest publication first).
pub async fn redrive(state: &AppState, conn: &mut crate::store::Conn, now: chrono::DateTime<Utc>) -> anyhow::Result<Redriven> {
    let o = &state.settings.operations;
    let oldest = operations::oldest_pending(conn).await?;
    let age = oldest.map_or(0.0, |t| (now - t).num_milliseconds().max(0) as f64 / 1000.0);
    vid_infra::metrics::gauge!("oldest_pending_operation_age_seconds").set(age);
    let published_before = now - chrono::Duration::seconds(o.redrive_after_seconds as i64);
    let lost_before = now - chrono::Duration::seconds(o.job_lost_after_seconds as i64);
    let max_attempt = i32::try_from(o.max_redrives).unwrap_or(i32::MAX - 1) + 1;
    let mut done = Redriven { oldest_pending_age_seconds: age, ..Default::default() };
    for stale in operations::stale_pending(conn, published_before, max_attempt, lost_before, 100).await? {
        let transition = if stale.job_attempt < max_attempt {
            Transition::Redrive { seen: stale.job_attempt }
        } else {
            let error = codes::JOB_LOST.problem().with_detail(format!(
                "no transcoder took the job after {} re-drives in {} s",
                stale.job_attempt - 1,
                (now - stale.created_at).num_seconds()
            ));
            Transition::JobLost { seen: stale.job_attempt, error }
        };
        let redrive = matches!(transition, Transition::Redrive { .. });
        if operation::apply(conn, &state.outbox, &stale.id, transition).await? != Applied::Changed {
            continue; // another replica got there first, or a transcoder started it
        }
        if redrive {
            tracing::warn!(operation_id = %stale.id, attempt = stale.job_attempt + 1, "pending too long: transcode job re-driven");
            vid_infra::metrics::counter!("jobs_redriven_total").increment(1);
            done.redriven += 1;
        } else {
            tracing::error!(operation_id = %stale.id, attempts = stale.job_attempt, "transcode job lost: operation failed (job_lost)");
            vid_infra::metrics::counter!("operations_job_lost_total").increment(1);
            done.lost += 1;
        }
    }
    Ok(done)
}

/// What one [`redrive_ingests`] pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IngestsRedriven {
    /// Ingest jobs published again (`ingest_jobs_redriven_total`).
    pub redriven: usize,
    /// Ingests failed as `job_lost` (`operations_job_lost_total`).
    pub lost: usize,
}

/// Heals lost ingest jobs: an operation still awaiting its source (no
/// `downloaded` report applied) with no sign of life since
/// `operations.ingest_redrive_after_seconds` before `now` (its job last
/// published, or its last download report) has its job published again
/// through the outbox ([`Transition::RedriveIngest`]: attempt + 1, every
/// input read back from its rows) while fewer than `operations.max_redrives`
/// re-drives were made; one still awaiting its source
/// `operations.ingest_lost_after_seconds` after `POST /ingests` fails
/// `job_lost` (a worker still downloading it is told to stop). At most 100
/// per pass. A re-drive is harmless when the original turns up: the worker
/// finds the stored source (HeadObject) and reports `downloaded` again.
pub async fn redrive_ingests(
    state: &AppState,
    conn: &mut crate::store::Conn,
    now: chrono::DateTime<Utc>,
) -> anyhow::Result<IngestsRedriven> {
    let o = &state.settings.operations;
    let silent_before = now - chrono::Duration::seconds(o.ingest_redrive_after_seconds as i64);
    let lost_before = now - chrono::Duration::seconds(o.ingest_lost_after_seconds as i64);
    let max_attempt = i32::try_from(o.max_redrives).unwrap_or(i32::MAX - 1) + 1;
    let defaults = ingests::IngestDefaults {
        max_size_bytes: state.settings.uploads.max_size_bytes,
        allowed_content_types: state.settings.uploads.allowed_content_types.clone(),
    };
    let mut done = IngestsRedriven::default();
    for stale in ingests::stale_awaiting(conn, silent_before, lost_before, 100).await? {
        let transition = if stale.created_at < lost_before {
            let error = codes::JOB_LOST.problem().with_detail(format!(
                "the source was not downloaded within {} s ({} job publications)",
                o.ingest_lost_after_seconds, stale.job_attempt
            ));
            Transition::JobLost { seen: stale.job_attempt, error }
        } else if stale.job_attempt < max_attempt {
            Transition::RedriveIngest { seen: stale.job_attempt, defaults: defaults.clone() }
        } else {
            continue; // re-drives used up: wait for the deadline
        };
        let redrive = matches!(transition, Transition::RedriveIngest { .. });
        if operation::apply(conn, &state.outbox, &stale.id, transition).await? != Applied::Changed {
            continue; // another replica got there first, or the source arrived
        }
        if redrive {
            tracing::warn!(operation_id = %stale.id, attempt = stale.job_attempt + 1, "ingest awaiting its source with no sign of life: ingest job re-driven");
            vid_infra::metrics::counter!("ingest_jobs_redriven_total").increment(1);
            done.redriven += 1;
        } else {
            tracing::error!(operation_id = %stale.id, attempts = stale.job_attempt, "ingest past its deadline: operation failed (job_lost)");
            vid_infra::metrics::counter!("operations_job_lost_total").increment(1);
            done.lost += 1;
        }
    }
    Ok(done)
}

/// Expires uploads stuck in `completing` past their `expires_at` and
/// [`COMPLETING_GRACE`]; returns how many. The row is marked `expired` first
/// (so a late `complete` loses and cleans up after itself), then storage
/// drops the multipart upload (S3 AbortMultipartUpload) and any object it was
/// assembled into (S3 DeleteObject). A storage failure is logged; the
/// bucket's lifecycle rule aborts incomplete multipart uploads anyway.
async fn expire_stuck_completing(state: &AppState, conn: &mut crate::store::Conn, now: chrono::DateTime<Utc>) -> anyhow::Result<usize> {
    let stuck = uploads::expire_stuck_completing(conn, now, now - chrono::Duration::from_std(COMPLETING_GRACE)?).await?;
    for (id, key, s3_id) in &stuck {
        tracing::info!(upload = %id, "expiring an upload stuck in `completing`");
        if crate::storage::abort_multipart(state, key, s3_id).await.is_err() || crate::storage::delete_object(state, key).await.is_err() {
            tracing::warn!(upload = %id, "could not drop a stuck upload from storage; the bucket lifecycle rule will abort it");
        }
    }
    Ok(stuck.len())
}
