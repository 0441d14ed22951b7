//! The first step of an ingest (`POST /ingests`): the one transaction that
//! creates the upload standing for the URL, its video and its operation, and
//! queues the ingest job. The download's reports then move the operation
//! through [`super::operation`] ([`Transition::Download`](super::operation::Transition::Download),
//! [`Transition::SourceReady`](super::operation::Transition::SourceReady), `Finish`).

use diesel::QueryResult;
use diesel_async::scoped_futures::ScopedFutureExt;
use vid_core::ingest::IngestJob;
use vid_core::operation::Operation;
use vid_core::{OperationId, VideoId};

use crate::store::ingests::{self, NewIngestUpload};
use crate::store::operations::{self as ops, NewTranscode};
use crate::store::outbox::Outbox;
use crate::store::uploads;
use crate::store::Conn;

pub use crate::store::ingests::IngestLimits;

/// In one transaction: inserts the ingest's upload (`completed`, no parts,
/// `source_url` set), its video (`processing`) and operation (`pending`,
/// phase `downloading`, awaiting its source), links them, and queues the
/// [`IngestJob`] (attempt 1) in the outbox (whose commit wakes the relay).
/// Every input of the job is stored with the rows (`limits` with the
/// upload), so the janitor can publish it again if the broker loses it
/// ([`super::operation::Transition::RedriveIngest`]). Returns the operation
/// as committed.
pub async fn create(conn: &mut Conn, outbox: &Outbox, new: &NewIngestUpload<'_>, limits: &IngestLimits<'_>) -> QueryResult<Operation> {
    outbox
        .transaction(conn, move |conn, staged| {
            async move {
                ingests::insert_upload(conn, new, limits).await?;
                let video_id = VideoId::generate();
                let op_id = OperationId::generate();
                let transcode = NewTranscode {
                    video_id: &video_id,
                    operation_id: &op_id,
                    tenant_id: new.tenant,
                    upload_id: new.id,
                    filename: new.filename,
                    content_type: new.content_type,
                    source_key: new.key,
                    playback_policy: new.playback_policy,
                    mp4_support: new.mp4_support,
                };
                ops::insert_processing(conn, &transcode).await?;
                ingests::mark_awaiting_source(conn, &op_id).await?;
                uploads::link(conn, new.id, &video_id, &op_id).await?;
                let job = IngestJob {
                    operation_id: op_id.clone(),
                    video_id,
                    upload_id: new.id.clone(),
                    tenant_id: new.tenant.clone(),
                    source_url: new.source_url.to_owned(),
                    source_key: new.key.to_owned(),
                    max_size_bytes: limits.max_size_bytes,
                    content_type: limits.declared_content_type.map(str::to_owned),
                    allowed_content_types: limits.allowed_content_types.to_vec(),
                    mp4_support: new.mp4_support,
                    attempt: 1,
                };
                staged.ingest_job(conn, &job).await?;
                let row = ops::get_with_revision(conn, &op_id, None).await?.map(|(row, _)| row).ok_or(diesel::result::Error::NotFound)?;
                Ok(row.into_operation())
            }
            .scope_boxed()
        })
        .await
}
