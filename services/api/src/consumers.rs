//! The api's RabbitMQ consumers: transcoder reports, dead-lettered jobs and
//! ingest reports (`P.ingest.reports`, from `services/ingest`).
//!
//! Each message is applied in one database transaction and acked only after
//! that commit; a failure nacks it back to the queue. Reports are idempotent
//! (see [`crate::domain::operation`]), so redelivery is harmless.

use std::time::Duration;

use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio::sync::watch;
use tracing::Instrument;
use vid_core::ingest::{IngestReport, IngestReportKind};
use vid_core::messages::{ReportKind, TranscodeJob, TranscodeReport};

use crate::domain::operation::{self, Applied, Outcome, Transition};
use crate::state::AppState;

/// Runs both consumers until `shutdown` turns true, reconnecting as needed.
/// On shutdown the message in hand is finished (applied and acked) first;
/// messages prefetched but not started go back to the queue when the channel
/// closes, unacked, for another replica.
pub async fn run(state: AppState, mut shutdown: watch::Receiver<bool>) {
    const FIRST: Duration = Duration::from_millis(200);
    let mut backoff = FIRST;
    loop {
        let started = std::time::Instant::now();
        match session(&state, &mut shutdown).await {
            Ok(()) => return,
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "report consumer interrupted; reconnecting"),
        }
        // A session that ran for a while was healthy: the next outage starts the backoff afresh.
        if started.elapsed() > Duration::from_secs(30) {
            backoff = FIRST;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn session(state: &AppState, shutdown: &mut watch::Receiver<bool>) -> anyhow::Result<()> {
    let conn = tokio::select! {
        c = vid_infra::amqp::connect(&state.settings.amqp, Duration::from_secs(30)) => c?,
        _ = shutdown.wait_for(|s| *s) => return Ok(()),
    };
    let ch = conn.create_channel().await?;
    state.topology.declare(&ch).await?;
    ch.basic_qos(32, BasicQosOptions::default()).await?;
    let reports_queue = state.topology.transcode_reports();
    let dead_queue = state.topology.transcode_dead();
    let mut reports = ch.basic_consume(&reports_queue, "api-reports", BasicConsumeOptions::default(), FieldTable::default()).await?;
    let mut dead = ch.basic_consume(&dead_queue, "api-dead-jobs", BasicConsumeOptions::default(), FieldTable::default()).await?;
    let ingest_queue = state.topology.ingest_reports();
    let mut ingests = ch.basic_consume(&ingest_queue, "api-ingest-reports", BasicConsumeOptions::default(), FieldTable::default()).await?;
    tracing::info!("consuming transcoder reports");
    loop {
        // A branch runs to completion before the next `select!`: a shutdown
        // never interrupts a message between its commit and its ack.
        tokio::select! {
            msg = reports.next() => {
                let Some(delivery) = msg else { anyhow::bail!("report consumer closed") };
                let delivery = delivery?;
                let span = message_span(&reports_queue, &delivery);
                async {
                    let outcome = match serde_json::from_slice::<TranscodeReport>(&delivery.data) {
                        Ok(report) => apply_report(state, &report).await,
                        Err(e) => {
                            tracing::error!(error = %e, "dropping malformed report");
                            Ok(())
                        }
                    };
                    settle(&reports_queue, &delivery, outcome).await
                }
                .instrument(span)
                .await?;
            }
            msg = dead.next() => {
                let Some(delivery) = msg else { anyhow::bail!("dead-letter consumer closed") };
                let delivery = delivery?;
                let span = message_span(&dead_queue, &delivery);
                async {
                    let outcome = match serde_json::from_slice::<TranscodeJob>(&delivery.data) {
                        Ok(job) => fail_dead_job(state, &job).await,
                        Err(e) => {
                            tracing::error!(error = %e, "dropping malformed dead-lettered job");
                            Ok(())
                        }
                    };
                    settle(&dead_queue, &delivery, outcome).await
                }
                .instrument(span)
                .await?;
            }
            msg = ingests.next() => {
                let Some(delivery) = msg else { anyhow::bail!("ingest report consumer closed") };
                let delivery = delivery?;
                let span = message_span(&ingest_queue, &delivery);
                async {
                    let outcome = match serde_json::from_slice::<IngestReport>(&delivery.data) {
                        Ok(report) => apply_ingest_report(state, &report).await,
                        Err(e) => {
                            tracing::error!(error = %e, "dropping malformed ingest report");
                            Ok(())
                        }
                    };
                    settle(&ingest_queue, &delivery, outcome).await
                }
                .instrument(span)
                .await?;
            }
            () = stopped(shutdown) => break,
        }
    }
    tracing::info!("report consumer stopped");
    let _ = ch.close(200, "api shutting down").await;
    let _ = conn.close(200, "api shutting down").await;
    Ok(())
}

/// Resolves once `shutdown` is true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// The span around one message: its queue and the `correlation_id` its
/// publisher set (the operation id for transcoder reports and jobs).
fn message_span(queue: &str, delivery: &lapin::message::Delivery) -> tracing::Span {
    let correlation_id = vid_infra::amqp::correlation_id(&delivery.properties).unwrap_or_default();
    tracing::info_span!("amqp_message", queue, correlation_id = %correlation_id, redelivered = delivery.redelivered)
}

/// Acks after success, else requeues after a pause; counts the outcome in
/// `amqp_messages_consumed_total{queue,outcome}` (`ack` or `requeue`).
async fn settle(queue: &str, delivery: &lapin::message::Delivery, outcome: anyhow::Result<()>) -> anyhow::Result<()> {
    match outcome {
        Ok(()) => {
            delivery.acker.ack(BasicAckOptions::default()).await?;
            vid_infra::metrics::counter!("amqp_messages_consumed_total", "queue" => queue.to_owned(), "outcome" => "ack").increment(1);
        }
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "could not apply message; requeueing");
            tokio::time::sleep(Duration::from_millis(500)).await;
            delivery.acker.nack(BasicNackOptions { requeue: true, ..Default::default() }).await?;
            vid_infra::metrics::counter!("amqp_messages_consumed_total", "queue" => queue.to_owned(), "outcome" => "requeue").increment(1);
        }
    }
    Ok(())
}

/// Applies one transcoder report through [`operation::apply_report`] (as its
/// run: reports of a run that does not own the operation are ignored).
pub async fn apply_report(state: &AppState, report: &TranscodeReport) -> anyhow::Result<()> {
    let transition = match &report.kind {
        ReportKind::Started => Transition::Started,
        ReportKind::Progress { phase, percent } => Transition::Progress { phase: Some(*phase), percent: *percent },
        ReportKind::Scanned { outcome } => Transition::Scan(*outcome),
        ReportKind::Succeeded { source, renditions, poster, stream } => Transition::Finish(Outcome::Succeeded {
            source: source.clone(),
            renditions: renditions.clone(),
            poster: poster.clone(),
            stream: stream.clone(),
        }),
        ReportKind::Failed { error, source } => Transition::Finish(Outcome::Failed { error: error.clone(), source: source.clone() }),
    };
    let mut conn = state.db.get().await?;
    let sender = operation::Sender {
        run: report.run_id.clone(),
        attempt: i32::try_from(report.attempt).unwrap_or(i32::MAX),
        fresh_since: fresh_since(state),
    };
    let applied = operation::apply_report(&mut conn, &state.outbox, &report.operation_id, sender, transition).await?;
    drop(conn);
    if let (ReportKind::Succeeded { renditions, poster, stream, .. }, Applied::AlreadyTerminal(status)) = (&report.kind, &applied) {
        // Cancel won the race: the outputs must not outlive it.
        tracing::info!(operation = %report.operation_id, status = status.as_str(), "deleting outputs of a finished-after-cancel job");
        let mut keys: Vec<String> = renditions.iter().map(|r| r.storage_key.clone()).collect();
        keys.extend(poster.iter().map(|p| p.storage_key.clone()));
        for key in keys {
            let _ = state.s3.delete_object().bucket(&state.settings.s3.bucket).key(key).send().await;
        }
        if let Some(stream) = stream {
            delete_late_stream(state, &report.video_id, &stream.prefix).await;
        }
    }
    match &report.kind {
        ReportKind::Progress { .. } => tracing::debug!(operation_id = %report.operation_id, ?applied, "report applied"),
        kind => tracing::info!(
            operation_id = %report.operation_id,
            run_id = %report.run_id,
            attempt = report.attempt,
            report = report_name(kind),
            ?applied,
            "report applied"
        ),
    }
    Ok(())
}

/// Applies one ingest report: progress → [`Transition::Download`], the
/// source stored → [`Transition::SourceReady`] (which queues the transcode
/// job), a failure → `Finish(Failed)` with the worker's problem. A source
/// stored for an operation that ended while still awaiting it (cancelled
/// during the download) is deleted; a duplicate or late `downloaded` report
/// for an operation that already had its source (processing, or ended
/// after it: the video may be ready) deletes nothing, since that object is
/// the video's source.
pub async fn apply_ingest_report(state: &AppState, report: &IngestReport) -> anyhow::Result<()> {
    let transition = match &report.kind {
        IngestReportKind::Progress { bytes_downloaded, total_bytes } => {
            Transition::Download { bytes: *bytes_downloaded, total: *total_bytes }
        }
        IngestReportKind::Downloaded { size_bytes, content_type } => {
            Transition::SourceReady { size_bytes: *size_bytes, content_type: content_type.clone() }
        }
        IngestReportKind::Failed { error } => Transition::Finish(Outcome::Failed { error: error.clone(), source: None }),
    };
    let mut conn = state.db.get().await?;
    let applied = operation::apply(&mut conn, &state.outbox, &report.operation_id, transition).await?;
    if let (IngestReportKind::Downloaded { .. }, Applied::AlreadyTerminal(status)) = (&report.kind, &applied) {
        let video = crate::store::ingests::unclaimed_source_key_of(&mut conn, &report.operation_id).await?;
        if let Some(key) = video {
            tracing::info!(operation_id = %report.operation_id, status = status.as_str(), "deleting the source of an ingest that ended first");
            let _ = crate::storage::delete_object(state, &key).await;
        }
    }
    match &report.kind {
        IngestReportKind::Progress { .. } => tracing::debug!(operation_id = %report.operation_id, ?applied, "ingest report applied"),
        _ => tracing::info!(operation_id = %report.operation_id, worker = %report.worker, ?applied, "ingest report applied"),
    }
    Ok(())
}

/// Deletes every object of a late run's stream (its CMAF segments, headers
/// and manifests under `prefix`), best effort like the MP4s: a failure is
/// logged and the bucket keeps what it could not delete. Only a prefix of this
/// video's own stream (`tenants/…/videos/{video}/stream/`) is deleted, whatever
/// the report says, so a malformed report cannot empty another prefix.
async fn delete_late_stream(state: &AppState, video: &vid_core::VideoId, prefix: &str) {
    if !is_stream_prefix_of(prefix, video) {
        tracing::warn!(video_id = %video, prefix, "not deleting a late stream outside the video's stream prefix");
        return;
    }
    match crate::storage::delete_prefix(state, prefix).await {
        Ok(n) => tracing::info!(video_id = %video, objects = n, "deleted the late run's stream"),
        Err(e) => tracing::warn!(video_id = %video, error = %e, "could not delete the late run's stream"),
    }
}

/// Whether `prefix` is `tenants/<tenant>/videos/<video>/stream/`, the stream
/// prefix the transcoder writes for `video` (`TranscodeJob.output_prefix` + `stream/`).
fn is_stream_prefix_of(prefix: &str, video: &vid_core::VideoId) -> bool {
    let parts: Vec<&str> = prefix.split('/').collect();
    matches!(parts.as_slice(), ["tenants", tenant, "videos", v, "stream", ""] if !tenant.is_empty() && *v == video.as_str())
}

fn report_name(kind: &ReportKind) -> &'static str {
    match kind {
        ReportKind::Started => "started",
        ReportKind::Progress { .. } => "progress",
        ReportKind::Scanned { .. } => "scanned",
        ReportKind::Succeeded { .. } => "succeeded",
        ReportKind::Failed { .. } => "failed",
    }
}

async fn fail_dead_job(state: &AppState, job: &TranscodeJob) -> anyhow::Result<()> {
    let error = crate::error::codes::TRANSCODE_RETRIES_EXHAUSTED.problem().with_detail(format!(
        "the job was handed to a worker {} times without an outcome (crashes or unavailable storage)",
        vid_infra::amqp::TRANSCODE_DELIVERY_LIMIT
    ));
    let mut conn = state.db.get().await?;
    let attempt = i32::try_from(job.attempt).unwrap_or(i32::MAX);
    let dead = Transition::DeadLetter { attempt, fresh_since: fresh_since(state), error };
    let applied = operation::apply(&mut conn, &state.outbox, &job.operation_id, dead).await?;
    if applied == Applied::Ignored {
        tracing::info!(operation_id = %job.operation_id, attempt, "dead-lettered copy ignored: superseded, or another run is alive");
    } else {
        tracing::warn!(operation_id = %job.operation_id, attempt, ?applied, "dead-lettered transcode job: operation failed");
    }
    Ok(())
}

/// Now minus `operations.heartbeat_timeout_seconds`: an owner with a report
/// at or after it is alive.
fn fresh_since(state: &AppState) -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now() - chrono::Duration::seconds(state.settings.operations.heartbeat_timeout_seconds as i64)
}

#[cfg(test)]
mod tests {
    use super::is_stream_prefix_of;

    #[test]
    fn only_the_videos_own_stream_prefix_is_deleted() {
        let v: vid_core::VideoId = "vid_01jd8x4m3v0k2q6s7t9w1y5zab".parse().unwrap();
        assert!(is_stream_prefix_of("tenants/ten_1/videos/vid_01jd8x4m3v0k2q6s7t9w1y5zab/stream/", &v));
        for bad in [
            "",
            "tenants/",
            "tenants/ten_1/videos/vid_01jd8x4m3v0k2q6s7t9w1y5zab/",
            "tenants/ten_1/videos/vid_01jd8x4m3v0k2q6s7t9w1y5zab/stream",
            "tenants/ten_1/videos/vid_other/stream/",
            "tenants//videos/vid_01jd8x4m3v0k2q6s7t9w1y5zab/stream/",
            "tenants/ten_1/videos/vid_01jd8x4m3v0k2q6s7t9w1y5zab/stream/720p/",
            "x/tenants/ten_1/videos/vid_01jd8x4m3v0k2q6s7t9w1y5zab/stream/",
        ] {
            assert!(!is_stream_prefix_of(bad, &v), "{bad}");
        }
    }
}
