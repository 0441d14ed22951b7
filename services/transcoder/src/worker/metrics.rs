//! The worker's metrics (see `vid_infra::metrics`): messages settled per
//! queue, job ends per outcome, transcode durations per rendition.

use std::time::Duration;

use crate::media::MediaOutcome;

/// Counts one message settled by this worker in
/// `amqp_messages_consumed_total{queue, outcome}` (`ack` or `requeue`).
pub(super) fn consumed(queue: &str, outcome: &'static str) {
    vid_infra::metrics::counter!("amqp_messages_consumed_total", "queue" => queue.to_owned(), "outcome" => outcome).increment(1);
}

/// Counts one job delivery's end in `transcode_jobs_total{outcome}`:
/// `succeeded`, `failed` (terminal reports), `cancelled`, `shutdown`
/// (requeued by a shutdown), `retry` (transient failure, requeued), `malformed`.
pub(super) fn job_outcome(outcome: &'static str) {
    vid_infra::metrics::counter!("transcode_jobs_total", "outcome" => outcome).increment(1);
}

/// Records `transcode_duration_seconds{rendition}` for every static MP4
/// rendition produced (none when the job asks `mp4_support: none`).
///
/// The child decodes once and feeds every rung's encoder from that single
/// decode, so all rungs of a job complete together: each gets the wall-clock
/// time of the transcode pass, from the child's `probed` line to its
/// `succeeded` line, measured here in the supervising process (the child
/// records no metrics: it lives for one job and serves nothing).
pub(super) fn record_transcode_durations(outcome: &MediaOutcome, elapsed: Duration) {
    for r in &outcome.transcoded.renditions {
        vid_infra::metrics::histogram!("transcode_duration_seconds", "rendition" => r.name.clone()).record(elapsed.as_secs_f64());
    }
}
