//! Periodic clean-up: expire abandoned uploads, fail operations whose worker went silent.
//! Safe to run in every replica at once: each change is a guarded UPDATE.

use std::time::Duration;

use chrono::Utc;
use vid_core::upload::UploadStatus;

use crate::domain::operation::{self, Applied, Outcome, Transition};
use crate::error::codes;
use crate::state::AppState;
use crate::store::{operations, uploads};

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

/// One pass: returns (uploads expired, operations failed). Also purges
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

    let timeout = state.settings.operations.heartbeat_timeout_seconds;
    let silent = operations::silent_since(&mut conn, now - chrono::Duration::seconds(timeout as i64), 100).await?;
    let mut failed = 0;
    for id in silent {
        let error = codes::WORKER_LOST.problem().with_detail(format!("no report from the transcoder for {timeout} s"));
        let lost = Transition::Finish(Outcome::Failed { error, source: None });
        if operation::apply(&mut conn, &state.outbox, &id, lost).await? == Applied::Changed {
            failed += 1;
        }
    }
    drop(conn);
    crate::idempotency::purge_expired(&state.db).await?;
    Ok((expired, failed))
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
