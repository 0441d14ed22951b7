//! Periodic clean-up: expire abandoned uploads, fail operations whose worker went silent.
//! Safe to run in every replica at once: each change is a guarded UPDATE.

use std::time::Duration;

use chrono::Utc;
use diesel::prelude::*;
use vid_core::{OperationId, Problem};
use vid_db::schema::{operations, uploads};
use vid_db::RunQueryDsl;

use crate::lifecycle::{self, Outcome};
use crate::state::AppState;

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
    let stale: Vec<(vid_core::UploadId, String, String)> = uploads::table
        .filter(uploads::status.eq("created"))
        .filter(uploads::expires_at.lt(now))
        .select((uploads::id, uploads::storage_key, uploads::s3_upload_id))
        .limit(100)
        .load(&mut conn)
        .await?;
    let mut expired = 0;
    for (id, key, s3_id) in stale {
        if let Err(e) = crate::storage::abort_multipart(state, &key, &s3_id).await {
            tracing::warn!(upload = %id, error = %e, "could not abort an expired upload; will retry");
            continue;
        }
        expired += diesel::update(uploads::table.filter(uploads::id.eq(&id)).filter(uploads::status.eq("created")))
            .set((uploads::status.eq("expired"), uploads::updated_at.eq(now)))
            .execute(&mut conn)
            .await?;
    }
    expired += expire_stuck_completing(state, &mut conn, now).await?;

    let cutoff = now - chrono::Duration::seconds(state.settings.operations.heartbeat_timeout_seconds as i64);
    let silent: Vec<OperationId> = operations::table
        .filter(operations::status.eq("running"))
        .filter(operations::heartbeat_at.lt(cutoff))
        .select(operations::id)
        .limit(100)
        .load(&mut conn)
        .await?;
    drop(conn);
    let mut failed = 0;
    for id in silent {
        let error = Problem::new(500, "worker_lost", "Worker lost")
            .with_detail(format!("no report from the transcoder for {} s", state.settings.operations.heartbeat_timeout_seconds));
        if lifecycle::finish(&state.db, &state.topology, &id, Outcome::Failed { error, source: None }).await? == lifecycle::Applied::Changed
        {
            failed += 1;
        }
    }
    if failed > 0 {
        state.outbox_notify.notify_one();
    }
    crate::idempotency::purge_expired(&state.db).await?;
    Ok((expired, failed))
}

/// Expires uploads stuck in `completing` past their `expires_at` and
/// [`COMPLETING_GRACE`]; returns how many. The row is marked `expired` first
/// (so a late `complete` loses and cleans up after itself), then storage
/// drops the multipart upload (S3 AbortMultipartUpload) and any object it was
/// assembled into (S3 DeleteObject). A storage failure is logged; the
/// bucket's lifecycle rule aborts incomplete multipart uploads anyway.
async fn expire_stuck_completing(
    state: &AppState,
    conn: &mut diesel_async::AsyncPgConnection,
    now: chrono::DateTime<Utc>,
) -> anyhow::Result<usize> {
    let grace = chrono::Duration::from_std(COMPLETING_GRACE)?;
    let stuck: Vec<(vid_core::UploadId, String, String)> = diesel::update(
        uploads::table
            .filter(uploads::status.eq("completing"))
            .filter(uploads::expires_at.lt(now))
            .filter(uploads::updated_at.lt(now - grace)),
    )
    .set((uploads::status.eq("expired"), uploads::updated_at.eq(now)))
    .returning((uploads::id, uploads::storage_key, uploads::s3_upload_id))
    .get_results(conn)
    .await?;
    for (id, key, s3_id) in &stuck {
        tracing::info!(upload = %id, "expiring an upload stuck in `completing`");
        if crate::storage::abort_multipart(state, key, s3_id).await.is_err() || crate::storage::delete_object(state, key).await.is_err() {
            tracing::warn!(upload = %id, "could not drop a stuck upload from storage; the bucket lifecycle rule will abort it");
        }
    }
    Ok(stuck.len())
}
