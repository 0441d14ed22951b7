//! One job delivery, from receipt to settlement: parse it (a malformed job is
//! acked and dropped), run the job ([`Worker::process`]: work dir, `Started`,
//! the steps, the terminal report), then settle the delivery by how the job
//! ended ([`JobEnd`]): ack, nack with requeue after a backoff, or hand it back
//! for a shutdown without spending a delivery ([`Worker::hand_back`]).
//!
//! Invariants: the ack follows the broker's confirm of the terminal report;
//! nothing is published for a cancelled job after its stop; the job's work
//! dir is removed whatever the end (a drop guard).

use std::time::Duration;

use anyhow::{anyhow, Context};
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicPublishOptions};
use lapin::publisher_confirm::Confirmation;
use lapin::types::FieldTable;
use tokio::sync::watch;
use vid_core::messages::{ReportKind, TranscodeJob};
use vid_infra::amqp::{Publisher, RK_JOB};

use super::metrics::{consumed, job_outcome};
use super::reports::{ProgressReporter, Reports};
use super::session::{Active, Running};
use super::steps::StepError;
use super::Worker;
use crate::child::Stop;
use crate::workdir::JobDir;

/// How a job ended, i.e. what to do with its delivery.
#[derive(Debug)]
enum JobEnd {
    /// The terminal report is confirmed: ack.
    Reported {
        /// `Succeeded` (else `Failed`).
        succeeded: bool,
    },
    /// Cancelled: outputs deleted; ack, publish nothing.
    Cancelled,
    /// Shutting down: hand the job back at once ([`Worker::hand_back`]).
    Shutdown,
    /// Retry later: sleep, then requeue.
    Transient(anyhow::Error),
}

impl Worker {
    /// Runs one delivery of `P.transcode.jobs` and settles it (see the module docs).
    pub(super) async fn handle(
        &self,
        delivery: Delivery,
        publisher: Publisher,
        active: Active,
        stop_tx: watch::Sender<Option<Stop>>,
        stop: watch::Receiver<Option<Stop>>,
    ) {
        let tag = delivery.delivery_tag;
        let queue = self.topology.transcode_jobs();
        let correlation_id = vid_infra::amqp::correlation_id(&delivery.properties).unwrap_or_default();
        let job: TranscodeJob = match serde_json::from_slice(&delivery.data) {
            Ok(j) => j,
            Err(e) => {
                let span = tracing::info_span!("job", correlation_id = %correlation_id);
                let _g = span.enter();
                tracing::error!(error = %e, body = %String::from_utf8_lossy(&delivery.data).chars().take(500).collect::<String>(), "malformed transcode job: acked and dropped");
                if let Err(e) = delivery.ack(BasicAckOptions::default()).await {
                    tracing::warn!(error = %e, "ack failed");
                }
                consumed(&queue, "ack");
                job_outcome("malformed");
                return;
            }
        };
        // One run per delivery: two copies of a job, or a redelivery, are two runs (issue 24).
        let run_id = ulid::Ulid::new().to_string();
        let span = tracing::info_span!(
            "job",
            correlation_id = %correlation_id,
            operation_id = %job.operation_id,
            video_id = %job.video_id,
            run_id = %run_id,
            attempt = job.attempt,
            redelivered = delivery.redelivered
        );
        span.in_scope(|| tracing::info!("job received"));
        let running = Running { operation_id: job.operation_id.clone(), run_id: run_id.clone(), stop: stop_tx };
        active.lock().unwrap().insert(tag, running);
        let end = tracing::Instrument::instrument(self.process(&job, run_id, &publisher, stop), span.clone()).await;
        active.lock().unwrap().remove(&tag);
        let _g = span.enter();
        let (r, action, outcome) = match end {
            JobEnd::Reported { succeeded } => {
                let outcome = if succeeded { "succeeded" } else { "failed" };
                tracing::info!(outcome, "job finished: terminal report confirmed, acked");
                (delivery.ack(BasicAckOptions::default()).await, "ack", outcome)
            }
            JobEnd::Cancelled => {
                tracing::info!("job cancelled: acked, nothing more reported");
                (delivery.ack(BasicAckOptions::default()).await, "ack", "cancelled")
            }
            JobEnd::Shutdown => (self.hand_back(&delivery, &publisher).await, "requeue", "shutdown"),
            JobEnd::Transient(e) => {
                tracing::warn!(error = format!("{e:#}"), "transient failure: requeueing after a backoff");
                tokio::time::sleep(Duration::from_secs_f64(self.settings.transcoder.retry_backoff_seconds.max(0.0))).await;
                (delivery.nack(BasicNackOptions { requeue: true, ..Default::default() }).await, "requeue", "retry")
            }
        };
        match r {
            Ok(()) => consumed(&queue, action),
            Err(e) => tracing::warn!(error = %e, "ack/nack failed; the broker will redeliver the job"),
        }
        job_outcome(outcome);
    }

    /// Puts a job stopped by a graceful shutdown back in its queue without
    /// spending one of its deliveries: a copy is republished ([`republish`])
    /// and, once the broker confirmed it, the delivery is acked. If the copy
    /// cannot be published (within [`REPUBLISH_TIMEOUT`]), the delivery is
    /// nacked back instead, which spends one. Returns the ack's (or nack's)
    /// result.
    async fn hand_back(&self, delivery: &Delivery, publisher: &Publisher) -> Result<(), lapin::Error> {
        let exchange = self.topology.transcode_exchange();
        match tokio::time::timeout(REPUBLISH_TIMEOUT, republish(publisher, &exchange, delivery)).await {
            Ok(Ok(())) => {
                tracing::info!("job requeued for shutdown: a copy republished and confirmed, the delivery acked (no delivery spent)");
                delivery.ack(BasicAckOptions::default()).await
            }
            outcome => {
                let error = match outcome {
                    Ok(Err(e)) => format!("{e:#}"),
                    _ => format!("no confirm within {REPUBLISH_TIMEOUT:?}"),
                };
                tracing::warn!(error, "job requeued for shutdown by a nack (the copy could not be republished; this spends a delivery)");
                delivery.nack(BasicNackOptions { requeue: true, ..Default::default() }).await
            }
        }
    }

    /// Creates the job's work dir, reports `Started` (every report carries
    /// `run_id`, this delivery's run, and the job's `attempt`), runs the steps, and
    /// sends the terminal report (or deletes the outputs after a cancel).
    async fn process(&self, job: &TranscodeJob, run_id: String, publisher: &Publisher, mut stop: watch::Receiver<Option<Stop>>) -> JobEnd {
        let root = &self.settings.transcoder.work_dir;
        let work = match JobDir::create(root, &job.operation_id) {
            Ok(w) => w,
            Err(e) => return JobEnd::Transient(anyhow!(e).context(format!("creating the job's directory under {}", root.display()))),
        };
        let reports = Reports {
            publisher: publisher.clone(),
            worker: self.name.clone(),
            exchange: self.topology.reports_exchange(),
            job: job.clone(),
            run_id,
        };
        if let Err(e) = reports.send(ReportKind::Started).await {
            return JobEnd::Transient(e);
        }
        let progress = ProgressReporter::start(reports.clone());
        let mut uploaded: Vec<String> = Vec::new();
        let res = self.steps(job, &work, &reports, &progress, &mut stop, &mut uploaded).await;
        progress.stop().await; // no progress report after this point
        let res = match res {
            Err(StepError::Report(kind)) => Ok(*kind),
            other => other,
        };
        match res {
            Ok(kind) => {
                let succeeded = matches!(kind, ReportKind::Succeeded { .. });
                match reports.send(kind).await {
                    Ok(()) => JobEnd::Reported { succeeded },
                    Err(e) => JobEnd::Transient(e),
                }
            }
            Err(StepError::Stopped(Stop::Cancel)) => {
                self.delete_outputs(&uploaded).await;
                JobEnd::Cancelled
            }
            Err(StepError::Stopped(Stop::Shutdown)) => JobEnd::Shutdown,
            Err(StepError::Transient(e)) => JobEnd::Transient(e),
            Err(StepError::Report(_)) => unreachable!("mapped above"),
        }
        // `work` drops here: the directory is removed and its lock released.
    }
}

/// How long a shutdown waits for the broker to confirm a job's copy before
/// it nacks the delivery back instead.
pub const REPUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// The header a quorum queue adds to a returned message: how often it was handed out.
const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// Publishes a copy of `delivery` to `exchange` with routing key
/// [`RK_JOB`] (the route of every job, see `vid_infra::amqp`): the same body
/// and properties, headers included (`x-correlation-id`, …), except the
/// broker's own `x-delivery-count`, which described the old message.
/// Mandatory and confirmed: returns once the broker has taken the copy.
/// Errors: the channel failed, the broker nacked, or no queue took it.
async fn republish(publisher: &Publisher, exchange: &str, delivery: &Delivery) -> anyhow::Result<()> {
    let mut props = delivery.properties.clone();
    if let Some(headers) = delivery.properties.headers() {
        let mut kept = FieldTable::default();
        for (k, v) in headers.inner() {
            if k.as_str() != DELIVERY_COUNT_HEADER {
                kept.insert(k.clone(), v.clone());
            }
        }
        props = props.with_headers(kept);
    }
    let confirm = publisher
        .channel()
        .basic_publish(exchange, RK_JOB, BasicPublishOptions { mandatory: true, ..Default::default() }, &delivery.data, props)
        .await
        .context("publishing the copy")?
        .await
        .context("waiting for the broker's confirm")?;
    match confirm {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(_)) => Err(anyhow!("the copy was unroutable ({exchange}/{RK_JOB})")),
        Confirmation::Nack(_) => Err(anyhow!("the broker refused the copy (nack)")),
        Confirmation::NotRequested => Err(anyhow!("the publisher channel is not in confirm mode")),
    }
}
