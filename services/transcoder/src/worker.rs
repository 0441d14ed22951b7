//! The queue loop: consume transcode jobs, run each in a supervised child,
//! upload the outputs, report, and ack only after the terminal report is
//! confirmed by the broker.
//!
//! Per job (one delivery of `P.transcode.jobs`):
//!
//! 1. Malformed JSON: logged and acked (a retry cannot help).
//! 2. `Started`, then `Progress{phase, percent}` at most once a second
//!    (plus a heartbeat every 30 s when nothing moves): downloading 0–10 %,
//!    scanning 10–11 %, probing 11–12 %, transcoding 12–90 %, uploading
//!    90–99 %; whole-job, never decreasing, never above 99.
//! 3. Scanning, before the file reaches the libav child: the downloaded source
//!    is streamed to clamd (`INSTREAM`, see [`crate::scan`]). Clean (or
//!    scanning turned off): a `Scanned{outcome}` report, then on. Infected:
//!    the object is moved to `<quarantine_prefix><tenant>/…` (copy, then
//!    delete) and the job fails with `malware_detected`, no retries. Larger
//!    than clamd's `StreamMaxLength`: fails with `file_too_large_to_scan`
//!    (before downloading when the size is known). clamd unavailable: retried
//!    with backoff inside the job, then `scan_unavailable`.
//! 4. Exactly one terminal report, `Succeeded` or `Failed`, then the ack.
//! 5. Transient failures (S3, broker, our own I/O): no report, a short sleep,
//!    then `basic_nack(requeue)`; the quorum queue's delivery limit
//!    dead-letters a job that keeps failing.
//! 6. A `CancelTranscode` on the control fan-out for an operation held here:
//!    the child is killed, uploaded outputs deleted, the job acked, nothing
//!    more published.
//! 7. Shutdown: the consumer is cancelled, running jobs get
//!    `shutdown_grace_seconds` to finish; the rest are killed and handed
//!    back to the queue without spending a delivery (below).
//!
//! Every job runs in a `job` span carrying `correlation_id` (the AMQP
//! `x-correlation-id` header: the operation id), `operation_id` and
//! `video_id`. Metrics: `amqp_messages_consumed_total{queue,outcome}`,
//! `transcode_jobs_total{outcome}`, `transcode_duration_seconds{rendition}`
//! (see `vid_infra::metrics`) next to the scan counters of [`crate::scan`].
//! A job handed back by a shutdown counts as `outcome="requeue"` in the
//! former (republished or nacked alike) and `outcome="shutdown"` in the latter.
//!
//! The local work directory `<work_dir>/<operation id>/` is removed when the
//! job ends, whatever the outcome (a drop guard, so also on panic or abort).
//! It is locked (`flock`) while the job runs, and what a killed process left
//! is swept when the next worker starts ([`crate::workdir`]).
//!
//! # The delivery limit, crashes and shutdowns
//!
//! `P.transcode.jobs` is a quorum queue with `x-delivery-limit`
//! (`vid_infra::amqp::TRANSCODE_DELIVERY_LIMIT`): it counts every return of
//! a message, by nack/reject with requeue or because the consumer's channel
//! or connection went away unacked, and dead-letters the message past the
//! limit (RabbitMQ 3.10 dead-letters on the 6th return with a limit of 5).
//! That is what stops a job that crashes its workers (SIGKILL, OOM kill, a
//! lost node: the broker returns the unacked delivery) from looping forever;
//! the api then fails the operation `transcode_retries_exhausted`.
//!
//! A graceful shutdown is not such a failure, and must cost the job only
//! time. So a job stopped by a shutdown is not nacked: `republish` sends a
//! copy of the message (same body, properties and headers, the correlation
//! id included; only the broker's `x-delivery-count` dropped) through
//! `P.transcode` with routing key `job` and waits for the broker's confirm,
//! and only then is the delivery acked. The copy is a fresh message with no
//! deliveries spent, however often workers are stopped. Its one cost: it
//! queues behind the jobs already waiting, where a returned message would
//! have been handed out first. If the copy cannot be published (broker
//! trouble, no confirm within [`REPUBLISH_TIMEOUT`]), the delivery is
//! nacked back as before, spending one delivery, rather than lost.
//! Transient failures still nack (they are what the limit is for), and a
//! crash still spends a delivery: nothing of this runs then.
//!
//! # Duplicates
//!
//! If the process dies, or its channel fails, after the confirm of the copy
//! and before the broker has the ack, the broker returns the original too:
//! the job is then queued twice. (So it is when the broker takes a copy
//! whose confirm came too late, after the fallback nack. The api's outbox
//! is at-least-once for the
//! same reason, so a duplicate job was always possible; queue consumers are
//! idempotent.) A second copy of a job is harmless:
//!
//! - Every copy carries the same operation id, source key and output keys:
//!   a second run reads the same source and writes the same objects again,
//!   with the same encode (byte for byte when x264 runs with the same thread
//!   count; otherwise a rendition's size may differ a little from the
//!   `size_bytes` the api recorded). Each PUT or CompleteMultipartUpload
//!   replaces an object whole, so a reader sees one complete version or the
//!   other.
//! - The api applies reports under the operation's row lock
//!   (`services/api/src/lifecycle.rs`): `Started`, `Progress` and `Scanned`
//!   on a terminal operation are ignored, progress never goes back, and a
//!   terminal status is never overwritten. A second `Succeeded` (or a
//!   `Failed` after `Succeeded`) changes nothing and records no event, so the
//!   customer sees one `video.ready`. A `Succeeded` for an operation that
//!   ended otherwise (cancelled, failed) has its outputs deleted by the api;
//!   a progress report for a cancelled operation makes the api broadcast the
//!   cancel again, which stops the copy.
//! - A copy of an infected source's job finds the source quarantined and
//!   reports the same `malware_detected` (ignored as a duplicate).
//! - Two copies may run at once, in two workers or in two slots of one: each
//!   delivery has its own state here, its own job directory (the second
//!   holder of an operation's directory gets `<operation id>-2/`, see
//!   [`crate::workdir`]), and a cancel reaches every holder.
//!
//! The price is the duplicate's compute, and the copy being subject to the
//! delivery limit like any job.
//!
//! # Connecting
//!
//! A session starts by connecting, which retries for up to 30 s while the
//! broker is unreachable; that wait (and the topology and consumer set-up)
//! races the shutdown signal, so SIGTERM during a broker outage ends the
//! process at once. Between sessions the backoff sleep races it too.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use aws_sdk_s3::error::DisplayErrorContext;
use aws_sdk_s3::primitives::{ByteStream, Length};
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::publisher_confirm::Confirmation;
use lapin::types::FieldTable;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;
use tokio::task::JoinSet;
use vid_core::messages::{CancelTranscode, ReportKind, TranscodeJob, TranscodeReport};
use vid_core::operation::{Phase, ScanOutcome};
use vid_core::video::{Poster, Rendition};
use vid_core::OperationId;
use vid_infra::amqp::{Publisher, Topology, RK_JOB, RK_REPORT};

use crate::child::{self, ChildMessage, ChildOutcome, Stop};
use crate::media::{MediaJob, MediaOutcome};
use crate::problems;
use crate::scan::{self, ScanError, Verdict, METRICS};
use crate::settings::Settings;
use crate::workdir::{self, JobDir};

/// Objects larger than this are uploaded with S3 multipart upload.
pub const MULTIPART_THRESHOLD: u64 = 64 * 1024 * 1024;
/// Part size of multipart uploads.
pub const PART_SIZE: u64 = 16 * 1024 * 1024;
/// A `Progress` report is sent at least this often while a job runs (heartbeat).
pub const HEARTBEAT: Duration = Duration::from_secs(30);

/// Shared state of a running worker.
#[derive(Clone)]
pub struct Worker {
    settings: Arc<Settings>,
    s3: aws_sdk_s3::Client,
    topology: Topology,
    child_exe: PathBuf,
    name: String,
    /// Set while the AMQP connection is up and consuming (for `/readyz`).
    pub ready: Arc<AtomicBool>,
}

/// Running jobs by delivery tag: operation and the stop switch of its child.
type Active = Arc<Mutex<HashMap<u64, (OperationId, watch::Sender<Option<Stop>>)>>>;

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

/// A session's broker side, as [`Worker::open`] leaves it.
struct Opened {
    conn: lapin::Connection,
    /// Confirm-mode channel: reports and shutdown republishes.
    publisher: Publisher,
    /// The jobs channel (prefetch = concurrency).
    ch: lapin::Channel,
    /// Consumer tag of the jobs consumer.
    tag: String,
    jobs: lapin::Consumer,
    /// Kept open for `cancels`.
    ctl: lapin::Channel,
    cancels: lapin::Consumer,
}

impl Worker {
    /// A worker for `settings`. `child_exe` is the binary to run as
    /// `<exe> work --spec …` (normally `std::env::current_exe()`). Installs
    /// the process's Prometheus recorder (`vid_infra::metrics::install`) if
    /// nobody did.
    pub fn new(settings: Settings, child_exe: PathBuf) -> Self {
        // Its counters must reach a recorder even when `main` did not install one (tests).
        vid_infra::metrics::install();
        let s3 = vid_infra::storage::client(&settings.s3);
        let topology = Topology::new(settings.amqp.prefix.clone());
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_else(|_| "unknown".into());
        Self {
            settings: Arc::new(settings),
            s3,
            topology,
            child_exe,
            name: format!("{host}/{}", std::process::id()),
            ready: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Sweeps the work dir ([`workdir::sweep`]), then consumes jobs until
    /// `shutdown` turns true, reconnecting after broker failures (jobs in
    /// flight then are killed; the broker redelivers them). Returns after a
    /// graceful shutdown, also one that comes while connecting. Errors: none
    /// in practice; broker failures are retried until the shutdown.
    pub async fn run(&self, mut shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
        const FIRST: Duration = Duration::from_millis(500);
        self.sweep_work_dir().await;
        let mut delay = FIRST;
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            let started = std::time::Instant::now();
            match self.session(&mut shutdown).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    // A session that ran for a while was healthy: start the backoff afresh.
                    if started.elapsed() > Duration::from_secs(30) {
                        delay = FIRST;
                    }
                    self.ready.store(false, Ordering::SeqCst);
                    tracing::error!(error = format!("{e:#}"), retry_in_ms = delay.as_millis() as u64, "AMQP session ended; reconnecting");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.wait_for(|s| *s) => return Ok(()),
                    }
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
        }
    }

    /// Creates the work dir if needed and removes what killed processes left
    /// in it ([`workdir::sweep`]); problems are logged, never fatal (a job
    /// that cannot create its directory is retried like any transient failure).
    async fn sweep_work_dir(&self) {
        let root = self.settings.transcoder.work_dir.clone();
        let swept = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&root)?;
            workdir::sweep(&root)
        })
        .await;
        match swept {
            Ok(Ok(s)) if s.removed.is_empty() && s.in_use.is_empty() && s.failed.is_empty() => {}
            Ok(Ok(s)) => tracing::info!(
                removed = ?s.removed,
                in_use = ?s.in_use,
                failed = ?s.failed,
                "work dir swept: job directories of dead processes removed, live ones kept"
            ),
            Ok(Err(e)) => {
                tracing::warn!(work_dir = %self.settings.transcoder.work_dir.display(), error = %e, "could not sweep the work dir")
            }
            Err(e) => tracing::warn!(error = %e, "the work dir sweep panicked"),
        }
    }

    async fn session(&self, shutdown: &mut watch::Receiver<bool>) -> anyhow::Result<()> {
        // During a broker outage `open` retries for up to 30 s: a shutdown does not wait for it.
        let opened = tokio::select! {
            o = self.open() => o?,
            _ = shutdown.wait_for(|s| *s) => {
                tracing::info!("shutting down while connecting to RabbitMQ");
                return Ok(());
            }
        };
        let Opened { conn, publisher, ch, tag, mut jobs, ctl: _ctl, mut cancels } = opened;
        let conn = Arc::new(conn);
        // The metric label of the exclusive, server-named control queue: its exchange (stable).
        let control = self.topology.control_exchange();
        self.ready.store(true, Ordering::SeqCst);
        tracing::info!(queue = %self.topology.transcode_jobs(), concurrency = self.settings.transcoder.concurrency.max(1), "consuming transcode jobs");

        let active: Active = Arc::default();
        let mut tasks = JoinSet::new();
        let result: anyhow::Result<()> = loop {
            tokio::select! {
                d = jobs.next() => match d {
                    Some(Ok(delivery)) => {
                        let (tx, rx) = watch::channel(None);
                        let this = self.clone();
                        let publisher = publisher.clone();
                        let active = active.clone();
                        tasks.spawn(async move { this.handle(delivery, publisher, active, tx, rx).await });
                    }
                    Some(Err(e)) => break Err(anyhow!(e).context("the job consumer failed")),
                    None => break Err(anyhow!("the job consumer was closed by the broker")),
                },
                c = cancels.next() => match c {
                    Some(Ok(d)) => {
                        // Auto-acked (a cancel is a broadcast hint; see the module docs).
                        consumed(&control, "ack");
                        let correlation_id = vid_infra::amqp::correlation_id(&d.properties).unwrap_or_default();
                        let span = tracing::info_span!("cancel", correlation_id = %correlation_id);
                        let _g = span.enter();
                        match serde_json::from_slice::<CancelTranscode>(&d.data) {
                            Ok(c) => {
                                let mut held = 0;
                                for (op, tx) in active.lock().unwrap().values() {
                                    if *op == c.operation_id {
                                        let _ = tx.send(Some(Stop::Cancel));
                                        held += 1;
                                    }
                                }
                                tracing::info!(operation_id = %c.operation_id, held, "cancel received");
                            }
                            Err(e) => tracing::warn!(error = %e, "malformed cancel message ignored"),
                        }
                    }
                    Some(Err(e)) => break Err(anyhow!(e).context("the control consumer failed")),
                    None => break Err(anyhow!("the control consumer was closed")),
                },
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                _ = shutdown.wait_for(|s| *s) => break Ok(()),
            }
        };
        if let Err(e) = result {
            tasks.abort_all(); // kills the children (kill_on_drop) and cleans the work dirs (guards)
            return Err(e);
        }

        // Graceful shutdown: no new jobs, let the running ones finish within the grace period.
        tracing::info!(running = tasks.len(), "shutting down: consumer cancelled");
        if let Err(e) = ch.basic_cancel(&tag, BasicCancelOptions::default()).await {
            tracing::warn!(error = %e, "basic.cancel failed");
        }
        let grace = Duration::from_secs(self.settings.transcoder.shutdown_grace_seconds);
        let drained = tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!(running = tasks.len(), "grace period over: killing and requeueing the running jobs");
            for (_, tx) in active.lock().unwrap().values() {
                let _ = tx.send(Some(Stop::Shutdown));
            }
            if tokio::time::timeout(Duration::from_secs(10), async { while tasks.join_next().await.is_some() {} }).await.is_err() {
                tasks.abort_all();
            }
        }
        self.ready.store(false, Ordering::SeqCst);
        let _ = conn.close(200, "transcoder shutting down").await;
        Ok(())
    }

    /// Connects (retrying for up to 30 s, see `vid_infra::amqp::connect`),
    /// declares the topology and starts both consumers: the jobs (prefetch =
    /// concurrency, manual ack) and this worker's exclusive control queue.
    /// Dropping the future midway closes whatever it had opened.
    async fn open(&self) -> anyhow::Result<Opened> {
        let conn = vid_infra::amqp::connect(&self.settings.amqp, Duration::from_secs(30)).await?;
        let publisher = Publisher::new(&conn).await.context("opening the publisher channel")?;
        self.topology.declare(publisher.channel()).await?;
        let ch = conn.create_channel().await?;
        let concurrency = self.settings.transcoder.concurrency.max(1);
        ch.basic_qos(concurrency, BasicQosOptions::default()).await?;
        let tag = format!("transcoder-{}", self.name);
        let jobs = ch
            .basic_consume(&self.topology.transcode_jobs(), &tag, BasicConsumeOptions::default(), FieldTable::default())
            .await
            .context("consuming transcode jobs")?;
        let ctl = conn.create_channel().await?;
        let q = ctl
            .queue_declare("", QueueDeclareOptions { exclusive: true, auto_delete: true, ..Default::default() }, FieldTable::default())
            .await?;
        ctl.queue_bind(q.name().as_str(), &self.topology.control_exchange(), "", QueueBindOptions::default(), FieldTable::default())
            .await?;
        let cancels = ctl
            .basic_consume(q.name().as_str(), "", BasicConsumeOptions { no_ack: true, ..Default::default() }, FieldTable::default())
            .await?;
        Ok(Opened { conn, publisher, ch, tag, jobs, ctl, cancels })
    }

    async fn handle(
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
        let span = tracing::info_span!(
            "job",
            correlation_id = %correlation_id,
            operation_id = %job.operation_id,
            video_id = %job.video_id,
            redelivered = delivery.redelivered
        );
        span.in_scope(|| tracing::info!("job received"));
        active.lock().unwrap().insert(tag, (job.operation_id.clone(), stop_tx));
        let end = tracing::Instrument::instrument(self.process(&job, &publisher, stop), span.clone()).await;
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

    async fn process(&self, job: &TranscodeJob, publisher: &Publisher, mut stop: watch::Receiver<Option<Stop>>) -> JobEnd {
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

    /// Download → scan → child (probe, transcode) → upload. `Ok` (or
    /// `Err(StepError::Report)`) is the terminal report to send.
    async fn steps(
        &self,
        job: &TranscodeJob,
        work: &JobDir,
        reports: &Reports,
        progress: &ProgressReporter,
        stop: &mut watch::Receiver<Option<Stop>>,
        uploaded: &mut Vec<String>,
    ) -> Result<ReportKind, StepError> {
        let t = &self.settings.transcoder;
        // 1. Download (unless it is too large to be scanned).
        progress.set(Phase::Downloading, 0.0);
        let sc = &self.settings.scanner;
        if sc.enabled && job.source_size_bytes > sc.stream_max_length_bytes {
            return Err(too_large_to_scan(job.source_size_bytes, sc.stream_max_length_bytes, Instant::now()));
        }
        let source_path = work.path().join("source");
        stoppable(stop, self.download(job, &source_path, progress)).await??;

        // 2. Scan: nothing below sees the file before a clean verdict.
        let scanned = self.scan_source(job, &source_path, progress, stop).await?;
        reports.send(ReportKind::Scanned { outcome: scanned }).await.map_err(StepError::Transient)?;

        // 3–4. Probe and transcode in the child.
        progress.set(Phase::Probing, 11.0);
        let media_job = MediaJob { input: source_path, out_dir: work.path().join("out"), limits: t.limits(), ladder: t.ladder.clone() };
        let spec =
            child::write_spec(work.path(), &media_job).map_err(|e| StepError::Transient(anyhow!(e).context("writing the child spec")))?;
        let limits = child::Limits {
            stall_timeout: t.stall_timeout(),
            base_budget: Duration::from_secs(600).max(t.stall_timeout() * 2),
            budget_per_media_second: 20.0,
            assumed_duration_seconds: t.max_duration_seconds,
        };
        let spawned = Instant::now();
        let mut probed_at: Option<Instant> = None;
        let mut cmd = child::worker_command(&self.child_exe, &spec);
        cmd.env(child::CORRELATION_ID_ENV, job.operation_id.as_str());
        let outcome = child::supervise(cmd, limits, stop.clone(), |m| match m {
            ChildMessage::Probed { .. } => {
                probed_at = Some(Instant::now());
                progress.set(Phase::Transcoding, 12.0)
            }
            ChildMessage::Progress { fraction } => progress.set(Phase::Transcoding, 12.0 + 78.0 * fraction),
            _ => {}
        })
        .await;
        let outcome: MediaOutcome = match outcome {
            ChildOutcome::Succeeded(o) => {
                record_transcode_durations(&o, probed_at.unwrap_or(spawned).elapsed());
                o
            }
            ChildOutcome::Failed { error, source } => {
                tracing::info!(code = %error.code, detail = ?error.detail, "permanent failure");
                return Ok(ReportKind::Failed { error, source });
            }
            ChildOutcome::Internal(m) => return Err(StepError::Transient(anyhow!("worker child: {m}"))),
            ChildOutcome::Stopped(s) => return Err(StepError::Stopped(s)),
        };

        // 5. Upload, tallest first, then the poster.
        progress.set(Phase::Uploading, 90.0);
        let total: u64 = outcome.transcoded.renditions.iter().map(|r| r.size_bytes).sum::<u64>().max(1);
        let mut done = 0u64;
        let mut renditions = Vec::new();
        for r in &outcome.transcoded.renditions {
            let key = format!("{}renditions/{}.mp4", job.output_prefix, r.name);
            uploaded.push(key.clone());
            stoppable(stop, self.upload(&r.path, &key, "video/mp4")).await??;
            done += r.size_bytes;
            progress.set(Phase::Uploading, 90.0 + 9.0 * done as f64 / total as f64);
            renditions.push(Rendition {
                name: r.name.clone(),
                width: r.width,
                height: r.height,
                bitrate: r.bitrate,
                size_bytes: r.size_bytes,
                content_type: "video/mp4".into(),
                storage_key: key,
                url: None,
                url_expires_at: None,
            });
        }
        let poster = match &outcome.transcoded.poster {
            Some(p) => {
                let key = format!("{}poster.jpg", job.output_prefix);
                uploaded.push(key.clone());
                stoppable(stop, self.upload(&p.path, &key, "image/jpeg")).await??;
                Some(Poster { width: p.width, height: p.height, storage_key: key, url: None })
            }
            None => None,
        };
        if let Some(s) = *stop.borrow() {
            return Err(StepError::Stopped(s));
        }
        Ok(ReportKind::Succeeded { source: outcome.source, renditions, poster })
    }

    async fn download(&self, job: &TranscodeJob, to: &Path, progress: &ProgressReporter) -> Result<(), StepError> {
        let bucket = &self.settings.s3.bucket;
        let resp = match self.s3.get_object().bucket(bucket).key(&job.source_key).send().await {
            Ok(r) => r,
            Err(e) => {
                if e.as_service_error().is_some_and(|se| se.is_no_such_key()) {
                    // A redelivery after the source was quarantined (e.g. the Failed report
                    // could not be published): report the same outcome again.
                    if let Some(signature) = self.quarantined(job).await {
                        return Err(malware_detected(&signature));
                    }
                }
                return Err(StepError::Transient(anyhow!("GET s3://{bucket}/{}: {}", job.source_key, DisplayErrorContext(e))));
            }
        };
        let sc = &self.settings.scanner;
        if let Some(len) = resp.content_length().filter(|n| *n > 0).map(|n| n as u64) {
            if sc.enabled && len > sc.stream_max_length_bytes {
                return Err(too_large_to_scan(len, sc.stream_max_length_bytes, Instant::now()));
            }
        }
        let total = resp.content_length().filter(|n| *n > 0).map(|n| n as u64).unwrap_or(job.source_size_bytes).max(1);
        let mut body = resp.body;
        let mut file =
            tokio::fs::File::create(to).await.map_err(|e| StepError::Transient(anyhow!(e).context("creating the source file")))?;
        let mut got = 0u64;
        while let Some(chunk) = body.try_next().await.map_err(|e| StepError::Transient(anyhow!(e).context("reading the source from S3")))? {
            file.write_all(&chunk).await.map_err(|e| StepError::Transient(anyhow!(e).context("writing the source file")))?;
            got += chunk.len() as u64;
            progress.set(Phase::Downloading, 10.0 * (got as f64 / total as f64).min(1.0));
        }
        file.flush().await.map_err(|e| StepError::Transient(anyhow!(e)))?;
        tracing::info!(bytes = got, "source downloaded");
        Ok(())
    }

    /// The scanning phase: streams the downloaded source to clamd, retrying an
    /// unavailable scanner with backoff. `Ok` = the file may be decoded; a
    /// permanent outcome is `Err(StepError::Report(Failed{…}))`.
    ///
    /// It scans the local copy rather than a second S3 stream: one download,
    /// the verdict is about exactly the bytes the decoder will read (no
    /// window in which the object could change between scan and download),
    /// and a retry after a scanner outage does not fetch the object again.
    /// The file lives only in this job's private work dir, is never opened by
    /// libav before a clean verdict, and is removed when the job ends.
    async fn scan_source(
        &self,
        job: &TranscodeJob,
        path: &Path,
        progress: &ProgressReporter,
        stop: &mut watch::Receiver<Option<Stop>>,
    ) -> Result<ScanOutcome, StepError> {
        let sc = &self.settings.scanner;
        if !sc.enabled {
            METRICS.record(scan::Outcome::Skipped, Duration::ZERO);
            tracing::warn!(scan_outcome = "skipped", "scanner.enabled = false: the source is NOT scanned for malware");
            return Ok(ScanOutcome::Skipped);
        }
        progress.set(Phase::Scanning, 10.0);
        let started = Instant::now();
        let size = tokio::fs::metadata(path).await.map_err(|e| StepError::Transient(anyhow!(e).context("reading the source size")))?.len();
        if size > sc.stream_max_length_bytes {
            return Err(too_large_to_scan(size, sc.stream_max_length_bytes, started));
        }
        let client = sc.client();
        let mut retries = 0u32;
        loop {
            let file = tokio::fs::File::open(path).await.map_err(|e| StepError::Transient(anyhow!(e).context("opening the source")))?;
            let total = size.max(1) as f64;
            let res = stoppable(stop, client.scan(file, |sent| progress.set(Phase::Scanning, 10.0 + sent as f64 / total))).await?;
            let scan_ms = started.elapsed().as_millis() as u64;
            match res {
                Ok(Verdict::Clean) => {
                    METRICS.record(scan::Outcome::Clean, started.elapsed());
                    tracing::info!(scan_outcome = "clean", scan_ms, bytes = size, retries, "source scanned: clean");
                    return Ok(ScanOutcome::Clean);
                }
                Ok(Verdict::Infected { signature }) => {
                    METRICS.record(scan::Outcome::Infected, started.elapsed());
                    tracing::warn!(scan_outcome = "infected", scan_ms, bytes = size, signature = %signature, "source infected: quarantining");
                    self.quarantine(job, &signature, size).await.map_err(StepError::Transient)?;
                    return Err(malware_detected(&signature));
                }
                Err(ScanError::TooLarge { by, .. }) => {
                    if by == "clamd" {
                        tracing::warn!(
                            limit = sc.stream_max_length_bytes,
                            "clamd refused a stream below scanner.stream_max_length_bytes: its StreamMaxLength is lower; align them"
                        );
                    }
                    return Err(too_large_to_scan(size, sc.stream_max_length_bytes, started));
                }
                Err(ScanError::Source(e)) => return Err(StepError::Transient(anyhow!(e).context("reading the source for the scan"))),
                Err(e @ ScanError::Unavailable { .. }) => {
                    METRICS.attempt_failed();
                    if retries >= sc.retry_attempts {
                        METRICS.record(scan::Outcome::Unavailable, started.elapsed());
                        tracing::error!(scan_outcome = "unavailable", scan_ms, retries, error = %e, "scanner unavailable: retry budget spent");
                        let problem = problems::problem(
                            problems::SCAN_UNAVAILABLE,
                            format!("the source could not be scanned ({} attempts); it was not processed. Try again later.", retries + 1),
                        );
                        return Err(StepError::Report(Box::new(ReportKind::Failed { error: problem, source: None })));
                    }
                    let wait = sc.backoff(retries);
                    retries += 1;
                    tracing::warn!(retry = retries, of = sc.retry_attempts, retry_in_ms = wait.as_millis() as u64, error = %e, "scanner unavailable; retrying");
                    stoppable(stop, tokio::time::sleep(wait)).await?;
                }
            }
        }
    }

    /// Moves an infected source out of reach: copy to the quarantine key
    /// (with the signature as metadata), then delete the source. With an
    /// empty `quarantine_prefix`, or above the CopyObject limit, only deletes.
    async fn quarantine(&self, job: &TranscodeJob, signature: &str, size: u64) -> anyhow::Result<()> {
        let bucket = &self.settings.s3.bucket;
        let prefix = &self.settings.scanner.quarantine_prefix;
        if !prefix.is_empty() && size <= COPY_OBJECT_MAX {
            let dest = quarantine_key(prefix, job);
            self.s3
                .copy_object()
                .bucket(bucket)
                .copy_source(format!("{bucket}/{}", encode_key(&job.source_key)))
                .key(&dest)
                .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
                .content_type("application/octet-stream")
                .metadata("signature", signature)
                .metadata("operation-id", job.operation_id.as_str())
                .metadata("source-key", &job.source_key)
                .send()
                .await
                .map_err(|e| anyhow!("CopyObject s3://{bucket}/{} → {dest}: {}", job.source_key, DisplayErrorContext(e)))?;
            tracing::info!(to = %dest, "infected source copied to quarantine");
        }
        self.s3
            .delete_object()
            .bucket(bucket)
            .key(&job.source_key)
            .send()
            .await
            .map_err(|e| anyhow!("DELETE s3://{bucket}/{}: {}", job.source_key, DisplayErrorContext(e)))?;
        tracing::info!(key = %job.source_key, "infected source removed from its upload key");
        Ok(())
    }

    /// The signature recorded on this job's quarantined copy, if there is one.
    async fn quarantined(&self, job: &TranscodeJob) -> Option<String> {
        let prefix = &self.settings.scanner.quarantine_prefix;
        if prefix.is_empty() {
            return None;
        }
        let head = self.s3.head_object().bucket(&self.settings.s3.bucket).key(quarantine_key(prefix, job)).send().await.ok()?;
        let meta = head.metadata()?;
        (meta.get("operation-id").map(String::as_str) == Some(job.operation_id.as_str()))
            .then(|| meta.get("signature").cloned().unwrap_or_else(|| "unknown".into()))
    }

    /// Uploads a local file: PutObject, or multipart above [`MULTIPART_THRESHOLD`].
    async fn upload(&self, path: &Path, key: &str, content_type: &str) -> Result<(), StepError> {
        upload_file(&self.s3, &self.settings.s3.bucket, path, key, content_type).await.map_err(StepError::Transient)
    }

    async fn delete_outputs(&self, keys: &[String]) {
        for key in keys {
            match self.s3.delete_object().bucket(&self.settings.s3.bucket).key(key).send().await {
                Ok(_) => tracing::info!(key, "cancelled: output deleted"),
                Err(e) => tracing::warn!(key, error = %DisplayErrorContext(e), "cancelled: could not delete an output"),
            }
        }
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

/// Counts one message settled by this worker in
/// `amqp_messages_consumed_total{queue, outcome}` (`ack` or `requeue`).
fn consumed(queue: &str, outcome: &'static str) {
    vid_infra::metrics::counter!("amqp_messages_consumed_total", "queue" => queue.to_owned(), "outcome" => outcome).increment(1);
}

/// Counts one job delivery's end in `transcode_jobs_total{outcome}`:
/// `succeeded`, `failed` (terminal reports), `cancelled`, `shutdown`
/// (requeued by a shutdown), `retry` (transient failure, requeued), `malformed`.
fn job_outcome(outcome: &'static str) {
    vid_infra::metrics::counter!("transcode_jobs_total", "outcome" => outcome).increment(1);
}

/// Records `transcode_duration_seconds{rendition}` for every rung produced.
///
/// The child decodes once and feeds every rung's encoder from that single
/// decode, so all rungs of a job complete together: each gets the wall-clock
/// time of the transcode pass, from the child's `probed` line to its
/// `succeeded` line, measured here in the supervising process (the child
/// records no metrics: it lives for one job and serves nothing).
fn record_transcode_durations(outcome: &MediaOutcome, elapsed: Duration) {
    for r in &outcome.transcoded.renditions {
        vid_infra::metrics::histogram!("transcode_duration_seconds", "rendition" => r.name.clone()).record(elapsed.as_secs_f64());
    }
}

/// Uploads `path` to `s3://bucket/key`, streaming from disk: PutObject up to
/// [`MULTIPART_THRESHOLD`], multipart upload in [`PART_SIZE`] parts above
/// (aborted on failure).
pub async fn upload_file(s3: &aws_sdk_s3::Client, bucket: &str, path: &Path, key: &str, content_type: &str) -> anyhow::Result<()> {
    let size = tokio::fs::metadata(path).await?.len();
    if size <= MULTIPART_THRESHOLD {
        let body = ByteStream::from_path(path).await?;
        s3.put_object()
            .bucket(bucket)
            .key(key)
            .content_type(content_type)
            .content_length(size as i64)
            .body(body)
            .send()
            .await
            .map_err(|e| anyhow!("PUT s3://{bucket}/{key}: {}", DisplayErrorContext(e)))?;
        return Ok(());
    }
    let mp = s3
        .create_multipart_upload()
        .bucket(bucket)
        .key(key)
        .content_type(content_type)
        .send()
        .await
        .map_err(|e| anyhow!("CreateMultipartUpload s3://{bucket}/{key}: {}", DisplayErrorContext(e)))?;
    let upload_id = mp.upload_id().ok_or_else(|| anyhow!("no upload id"))?.to_owned();
    let result: anyhow::Result<()> = async {
        let mut parts = Vec::new();
        let mut offset = 0u64;
        let mut n = 1i32;
        while offset < size {
            let len = PART_SIZE.min(size - offset);
            let body = ByteStream::read_from().path(path).offset(offset).length(Length::Exact(len)).build().await?;
            let part = s3
                .upload_part()
                .bucket(bucket)
                .key(key)
                .upload_id(&upload_id)
                .part_number(n)
                .content_length(len as i64)
                .body(body)
                .send()
                .await
                .map_err(|e| anyhow!("UploadPart {n} of s3://{bucket}/{key}: {}", DisplayErrorContext(e)))?;
            parts.push(CompletedPart::builder().part_number(n).set_e_tag(part.e_tag().map(str::to_owned)).build());
            offset += len;
            n += 1;
        }
        s3.complete_multipart_upload()
            .bucket(bucket)
            .key(key)
            .upload_id(&upload_id)
            .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build())
            .send()
            .await
            .map_err(|e| anyhow!("CompleteMultipartUpload s3://{bucket}/{key}: {}", DisplayErrorContext(e)))?;
        Ok(())
    }
    .await;
    if result.is_err() {
        let _ = s3.abort_multipart_upload().bucket(bucket).key(key).upload_id(&upload_id).send().await;
    }
    result
}

#[derive(Debug)]
enum StepError {
    Stopped(Stop),
    Transient(anyhow::Error),
    /// A permanent outcome found before the end (e.g. by the scan): the terminal report to send.
    Report(Box<ReportKind>),
}

/// CopyObject copies at most 5 GiB (larger needs multipart copy); clamd's
/// `StreamMaxLength` is below 4 GiB, so an infected source always fits.
const COPY_OBJECT_MAX: u64 = 5 * 1024 * 1024 * 1024;

/// `<prefix><tenant>/<source key without "tenants/<tenant>/">`, e.g.
/// `quarantine/ten_…/uploads/upl_…/source`. Nothing in the api stores or
/// presigns keys under the prefix, so no download URL can reach them.
pub fn quarantine_key(prefix: &str, job: &TranscodeJob) -> String {
    let own = format!("tenants/{}/", job.tenant_id);
    let rest = job.source_key.strip_prefix(own.as_str()).unwrap_or(&job.source_key);
    format!("{prefix}{}/{rest}", job.tenant_id)
}

/// Percent-encodes a key for `x-amz-copy-source` (keeps `/` and unreserved characters).
fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn malware_detected(signature: &str) -> StepError {
    let error = problems::problem(problems::MALWARE_DETECTED, format!("signature: {signature}"));
    StepError::Report(Box::new(ReportKind::Failed { error, source: None }))
}

/// Fail closed: a source clamd would refuse (over its `StreamMaxLength`) is
/// never processed unscanned.
fn too_large_to_scan(size: u64, limit: u64, started: Instant) -> StepError {
    METRICS.record(scan::Outcome::TooLarge, started.elapsed());
    tracing::warn!(scan_outcome = "too_large", bytes = size, limit, "source larger than the scanner accepts: not processed");
    let error = problems::problem(
        problems::FILE_TOO_LARGE_TO_SCAN,
        format!("the source is {size} bytes; at most {limit} bytes can be scanned for malware, and unscanned files are not processed"),
    );
    StepError::Report(Box::new(ReportKind::Failed { error, source: None }))
}

/// Runs `fut` unless a stop arrives first.
async fn stoppable<T>(stop: &mut watch::Receiver<Option<Stop>>, fut: impl std::future::Future<Output = T>) -> Result<T, StepError> {
    if let Some(s) = *stop.borrow() {
        return Err(StepError::Stopped(s));
    }
    tokio::select! {
        v = fut => Ok(v),
        s = stop.wait_for(|s| s.is_some()) => Err(StepError::Stopped(s.map(|s| s.unwrap()).unwrap_or(Stop::Shutdown))),
    }
}

/// Publishes reports for one job.
#[derive(Clone)]
struct Reports {
    publisher: Publisher,
    worker: String,
    exchange: String,
    job: TranscodeJob,
}

impl Reports {
    async fn send(&self, kind: ReportKind) -> anyhow::Result<()> {
        let report = TranscodeReport {
            operation_id: self.job.operation_id.clone(),
            video_id: self.job.video_id.clone(),
            worker: self.worker.clone(),
            emitted_at: chrono::Utc::now(),
            kind,
        };
        tracing::debug!(kind = ?report.kind, "report");
        self.publisher
            .publish_json(&self.exchange, RK_REPORT, &report, Some(self.job.operation_id.as_str()))
            .await
            .with_context(|| format!("publishing a report to {}", self.exchange))
    }
}

/// Sends `Progress` reports from the latest (phase, percent), at most once a second.
struct ProgressReporter {
    state: watch::Sender<(Phase, f64)>,
    task: tokio::task::JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl ProgressReporter {
    fn start(reports: Reports) -> Self {
        let (state, mut rx) = watch::channel((Phase::Downloading, 0.0f64));
        let (stop, mut stop_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut last_sent: Option<(Phase, u8)> = None;
            let mut last_at = tokio::time::Instant::now() - Duration::from_secs(1);
            loop {
                // Wait for a change (or the heartbeat), then respect the 1/s limit.
                tokio::select! {
                    r = rx.changed() => if r.is_err() { return },
                    _ = tokio::time::sleep_until(last_at + HEARTBEAT) => {}
                    _ = stop_rx.wait_for(|s| *s) => return,
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(last_at + Duration::from_secs(1)) => {}
                    _ = stop_rx.wait_for(|s| *s) => return,
                }
                let (phase, pct) = *rx.borrow_and_update();
                let percent = (pct.clamp(0.0, 99.0)) as u8;
                let heartbeat_due = last_at.elapsed() >= HEARTBEAT;
                if last_sent == Some((phase, percent)) && !heartbeat_due {
                    continue;
                }
                last_at = tokio::time::Instant::now();
                last_sent = Some((phase, percent));
                if let Err(e) = reports.send(ReportKind::Progress { phase, percent }).await {
                    tracing::warn!(error = format!("{e:#}"), "progress report not sent");
                }
            }
        });
        Self { state, task, stop }
    }

    /// Moves to `phase` at whole-job `percent`; ignored if it would go backwards or is NaN.
    fn set(&self, phase: Phase, percent: f64) {
        if !percent.is_finite() {
            return;
        }
        self.state.send_if_modified(|cur| {
            let p = percent.clamp(0.0, 99.0);
            if p < cur.1 || (p == cur.1 && phase == cur.0) {
                return false;
            }
            *cur = (phase, p);
            true
        });
    }

    /// Stops the reporter and waits until no report is in flight.
    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
