//! Domain rules: what may happen to a resource, in one place per resource.
//!
//! Invariants: domain code never imports `routes` or actix-web (it is
//! called by handlers, consumers and the janitor alike); it reaches the
//! database only through [`crate::store`].

pub mod operation;
pub mod upload;

use vid_core::messages::TranscodeJob;
use vid_core::{OperationId, TenantId, VideoId};

/// The transcode job of an operation: its source (`source_key`, declared
/// `size_bytes`), outputs under `tenants/{tenant}/videos/{video}/`, and the
/// publish count `attempt` (1 at `complete`, n+1 at the n-th re-drive).
pub(crate) fn transcode_job(
    op: &OperationId,
    video: &VideoId,
    tenant: &TenantId,
    source_key: String,
    size_bytes: i64,
    attempt: i32,
) -> TranscodeJob {
    TranscodeJob {
        operation_id: op.clone(),
        video_id: video.clone(),
        tenant_id: tenant.clone(),
        source_key,
        source_size_bytes: size_bytes.max(0) as u64,
        output_prefix: format!("tenants/{tenant}/videos/{video}/"),
        attempt: attempt.max(1) as u32,
    }
}
