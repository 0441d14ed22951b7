//! The last step of an upload: the one transaction that turns an assembled
//! upload into a video, its `pending` operation and a queued transcode job.
//! The upload's other status moves are single guarded updates
//! ([`crate::store::uploads::move_status`]) made by the upload routes and
//! the janitor.

use diesel::QueryResult;
use diesel_async::scoped_futures::ScopedFutureExt;
use vid_core::operation::Operation;
use vid_core::upload::UploadStatus;
use vid_core::{OperationId, VideoId};

use crate::store::operations::{self as ops, NewTranscode};
use crate::store::outbox::Outbox;
use crate::store::uploads::{self, UploadRow};
use crate::store::Conn;

/// How [`finalize`] ended.
#[derive(Debug)]
pub enum Finalized {
    /// The operation this call created, as committed (`pending`): the 202
    /// describes what was accepted, not what a fast transcoder made of it since.
    Created(Box<Operation>),
    /// The upload's operation, created by a concurrent complete.
    Operation(OperationId),
    /// The upload was aborted or expired first; nothing was created.
    Lost(UploadStatus),
}

/// In one transaction: marks the upload `completed`, creates its video
/// (`processing`, with the upload's `playback_policy` and `mp4_support`) and
/// `pending` operation, links them to the upload, and queues the transcode
/// job (with that `mp4_support`) in the outbox (whose commit wakes the relay).
/// Concurrent callers serialise on the upload row; the loser gets the
/// winner's operation id. An upload that was aborted or expired first is
/// left alone ([`Finalized::Lost`]).
pub async fn finalize(conn: &mut Conn, outbox: &Outbox, row: &UploadRow) -> QueryResult<Finalized> {
    outbox
        .transaction(conn, move |conn, staged| {
            async move {
                if !uploads::claim_completed(conn, &row.id).await? {
                    let (status, existing) = uploads::status_and_operation(conn, &row.id).await?;
                    return Ok(match existing {
                        Some(op_id) => Finalized::Operation(op_id),
                        None => Finalized::Lost(status),
                    });
                }
                let video_id = VideoId::generate();
                let op_id = OperationId::generate();
                let new = NewTranscode {
                    video_id: &video_id,
                    operation_id: &op_id,
                    tenant_id: &row.tenant_id,
                    upload_id: &row.id,
                    filename: row.filename.as_deref(),
                    content_type: &row.content_type,
                    source_key: &row.storage_key,
                    playback_policy: &row.playback_policy,
                    mp4_support: row.mp4_support,
                };
                let created = ops::insert_processing(conn, &new).await?;
                if row.poster_time.is_some() {
                    ops::set_poster_time(conn, &video_id, row.poster_time).await?;
                }
                uploads::link(conn, &row.id, &video_id, &op_id).await?;
                let job =
                    super::transcode_job(&op_id, &video_id, &row.tenant_id, row.storage_key.clone(), row.size_bytes, 1, row.mp4_support);
                let job = vid_core::messages::TranscodeJob { poster_time: row.poster_time, ..job };
                staged.transcode_job(conn, &job).await?;
                Ok(Finalized::Created(Box::new(created.into_operation())))
            }
            .scope_boxed()
        })
        .await
}
