//! Domain rules: what may happen to a resource, in one place per resource.
//!
//! Invariants: domain code never imports `routes` or actix-web (it is
//! called by handlers, consumers and the janitor alike); it reaches the
//! database only through [`crate::store`].

pub mod ingest;
pub mod operation;
pub mod upload;

use vid_core::messages::{Mp4Support, TranscodeJob};
use vid_core::playback::PlaybackPolicy;
use vid_core::{OperationId, TenantId, VideoId};

/// The transcode job of an operation: its source (`source_key`, declared
/// `size_bytes`), outputs under `tenants/{tenant}/videos/{video}/`, the
/// publish count `attempt` (1 at `complete`, n+1 at the n-th re-drive), and
/// `mp4_support` as `POST /uploads` asked (stored on the upload and the video).
pub(crate) fn transcode_job(
    op: &OperationId,
    video: &VideoId,
    tenant: &TenantId,
    source_key: String,
    size_bytes: i64,
    attempt: i32,
    mp4_support: Mp4Support,
) -> TranscodeJob {
    TranscodeJob {
        operation_id: op.clone(),
        video_id: video.clone(),
        tenant_id: tenant.clone(),
        source_key,
        source_size_bytes: size_bytes.max(0) as u64,
        output_prefix: format!("tenants/{tenant}/videos/{video}/"),
        attempt: attempt.max(1) as u32,
        mp4_support,
        poster_time: None,
    }
}

/// `policies` with each repeated policy kept once, at its first place:
/// `["public", "public"]` is one playback ID (`POST /uploads` stores the
/// result; `operation` applies it again when the video becomes ready).
pub fn distinct_policies(policies: Vec<PlaybackPolicy>) -> Vec<PlaybackPolicy> {
    let mut out = Vec::with_capacity(policies.len());
    for p in policies {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use vid_core::playback::PlaybackPolicy::{Public, Signed};

    #[test]
    fn distinct_policies_keep_the_first_of_each_in_order() {
        assert_eq!(super::distinct_policies(vec![Signed, Public, Signed, Public]), vec![Signed, Public]);
        assert_eq!(super::distinct_policies(vec![Public, Public]), vec![Public]);
        assert!(super::distinct_policies(vec![]).is_empty());
    }
}
