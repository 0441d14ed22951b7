//! The job loop: consume `P.ingest.jobs`, download each source into storage,
//! report, ack.
//!
//! Invariants:
//! - a job is acked only after its final report (`downloaded` or `failed`)
//!   was confirmed by the broker; if that publish fails the job is requeued;
//! - a source is never written twice: before downloading, and again before
//!   completing its multipart upload, the worker asks storage (S3
//!   HeadObject) whether `source_key` already exists (an earlier delivery
//!   of the same job stored it: its report was confirmed but the ack lost,
//!   or the report was not confirmed). If it does, nothing is downloaded
//!   (or the new upload is aborted) and the `downloaded` report is sent
//!   again from the stored object's size and media type; the api ignores
//!   it unless the operation still awaits its source;
//! - a failed download leaves nothing in storage (AbortMultipartUpload), a
//!   total timeout included: the deadline is checked inside the download,
//!   where the multipart upload is in hand;
//! - at most `concurrency` downloads run per process (the prefetch), each
//!   holding about two parts in memory;
//! - on shutdown the downloads in hand are dropped unacked, so RabbitMQ
//!   hands their jobs to another worker (their multipart uploads are left to
//!   the bucket's lifecycle rule);
//! - a cancel stops the download: each session also consumes the control
//!   fan-out (`P.control`, one exclusive, auto-delete, server-named queue per
//!   process, auto-ack, as each transcoder does), where the api's outbox
//!   broadcasts `CancelTranscode {operation_id, run_id: None}` when an
//!   operation is cancelled (`:cancel`) or an ingest fails `job_lost`. A
//!   download of that operation in hand stops between chunks (or while it
//!   waits for the source), aborts its multipart upload and acks its job
//!   without a report (the operation is terminal), freeing its slot at
//!   once; a job taken after its cancel was heard (the last
//!   [`RECENT_CANCELS`] cancelled operations are remembered) is acked
//!   without downloading. Cancels naming a run (`run_id: Some`) are the
//!   transcoders' and are ignored. A cancel the process missed (the broker
//!   dropped it, or it came between two sessions) is sent again by the api
//!   at the next progress report of that download.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use tokio::sync::watch;
use tokio::task::JoinSet;
use vid_core::ingest::{IngestJob, IngestReport, IngestReportKind};
use vid_core::messages::CancelTranscode;
use vid_infra::amqp::{Publisher, Topology, RK_REPORT};
use vid_netguard::Resolve;

use crate::fetch::{sniff, ConnectObserver, Fetcher};
use crate::multipart::MultipartWriter;
use crate::problems::IngestError;
use crate::Settings;

/// What every download shares.
struct Shared {
    settings: Settings,
    fetcher: Fetcher,
    s3: aws_sdk_s3::Client,
    topology: Topology,
    worker: String,
    cancels: Cancels,
}

/// How many cancelled operations a process remembers, for jobs taken after
/// their cancel was heard (a cancel of a job still queued).
pub const RECENT_CANCELS: usize = 4096;

/// The cancels this process heard on the control fan-out: a flag per
/// operation whose download is in hand, and the operations cancelled lately.
#[derive(Default)]
struct Cancels {
    inner: std::sync::Mutex<CancelsInner>,
}

#[derive(Default)]
struct CancelsInner {
    /// Operation id → (deliveries of it in hand, the flag they watch).
    in_hand: HashMap<String, (usize, watch::Sender<bool>)>,
    /// The last [`RECENT_CANCELS`] cancelled operations, oldest first.
    recent: VecDeque<String>,
}

impl Cancels {
    /// Registers a download of `op`; its flag is already set if `op` was cancelled lately.
    fn register(&self, op: &str) -> Registration<'_> {
        let mut inner = self.inner.lock().expect("not poisoned");
        let cancelled = inner.recent.iter().any(|r| r == op);
        let entry = inner.in_hand.entry(op.to_owned()).or_insert_with(|| (0, watch::channel(false).0));
        entry.0 += 1;
        if cancelled {
            entry.1.send_replace(true);
        }
        Registration { cancels: self, op: op.to_owned(), flag: entry.1.subscribe() }
    }

    /// Records that `op` was cancelled and flags its downloads in hand;
    /// whether one was in hand.
    fn cancel(&self, op: &str) -> bool {
        let mut inner = self.inner.lock().expect("not poisoned");
        if !inner.recent.iter().any(|r| r == op) {
            if inner.recent.len() == RECENT_CANCELS {
                inner.recent.pop_front();
            }
            inner.recent.push_back(op.to_owned());
        }
        match inner.in_hand.get(op) {
            Some((_, flag)) => {
                flag.send_replace(true);
                true
            }
            None => false,
        }
    }
}

/// One download's registration in [`Cancels`]; dropping it unregisters.
struct Registration<'a> {
    cancels: &'a Cancels,
    op: String,
    flag: watch::Receiver<bool>,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let mut inner = self.cancels.inner.lock().expect("not poisoned");
        if let Some(entry) = inner.in_hand.get_mut(&self.op) {
            entry.0 -= 1;
            if entry.0 == 0 {
                inner.in_hand.remove(&self.op);
            }
        }
    }
}

/// Resolves once `flag` is set (never if its sender is gone unset).
async fn cancelled(flag: &mut watch::Receiver<bool>) {
    if flag.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A built worker: health server bound, nothing consumed yet.
pub struct Worker {
    ctx: Arc<Shared>,
    ready: Arc<AtomicBool>,
    health_addr: SocketAddr,
    _health: tokio::task::JoinHandle<()>,
}

impl Worker {
    /// Binds the health server and prepares the fetcher and the S3 client.
    /// `observer` (tests) sees every connection the fetcher makes. Errors:
    /// malformed settings, an unbindable `health_listen`.
    pub async fn build(settings: Settings, resolver: Arc<dyn Resolve>, observer: Option<ConnectObserver>) -> anyhow::Result<Self> {
        settings.amqp.check()?;
        settings.s3.check()?;
        vid_infra::metrics::install();
        let listener = tokio::net::TcpListener::bind(&settings.ingest_worker.health_listen)
            .await
            .with_context(|| format!("binding {}", settings.ingest_worker.health_listen))?;
        let health_addr = listener.local_addr()?;
        let ready = Arc::new(AtomicBool::new(false));
        let health = crate::health::spawn(listener, ready.clone());
        let mut fetcher = Fetcher::new(settings.ingest.clone(), resolver, settings.ingest_worker.limits());
        if let Some(observer) = observer {
            fetcher = fetcher.with_observer(observer);
        }
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "ingest".to_owned());
        let ctx = Shared {
            s3: vid_infra::storage::client(&settings.s3),
            topology: Topology::new(&settings.amqp.prefix),
            worker: format!("{host}/{}", std::process::id()),
            cancels: Cancels::default(),
            fetcher,
            settings,
        };
        Ok(Self { ctx: Arc::new(ctx), ready, health_addr, _health: health })
    }

    /// Where `/healthz` listens.
    pub fn health_addr(&self) -> SocketAddr {
        self.health_addr
    }

    /// Consumes jobs until `shutdown` turns true, reconnecting to RabbitMQ
    /// with capped backoff; never gives up.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
        let mut backoff = Duration::from_millis(200);
        loop {
            let started = Instant::now();
            let result = session(&self.ctx, &self.ready, &mut shutdown).await;
            self.ready.store(false, Ordering::SeqCst);
            match result {
                Ok(()) => return Ok(()),
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "ingest consumer interrupted; reconnecting"),
            }
            if started.elapsed() > Duration::from_secs(30) {
                backoff = Duration::from_millis(200);
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = shutdown.wait_for(|s| *s) => return Ok(()),
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

async fn session(ctx: &Arc<Shared>, ready: &AtomicBool, shutdown: &mut watch::Receiver<bool>) -> anyhow::Result<()> {
    let conn = tokio::select! {
        c = vid_infra::amqp::connect(&ctx.settings.amqp, Duration::from_secs(30)) => c?,
        _ = shutdown.wait_for(|s| *s) => return Ok(()),
    };
    let publisher = Publisher::new(&conn).await?;
    ctx.topology.declare(publisher.channel()).await?;
    // The control fan-out first, so no cancel of a job taken in this session is missed.
    let ctl = conn.create_channel().await?;
    let control_queue = ctl
        .queue_declare("", QueueDeclareOptions { exclusive: true, auto_delete: true, ..Default::default() }, FieldTable::default())
        .await?;
    ctl.queue_bind(control_queue.name().as_str(), &ctx.topology.control_exchange(), "", QueueBindOptions::default(), FieldTable::default())
        .await?;
    let mut control = ctl
        .basic_consume(
            control_queue.name().as_str(),
            "ingest-control",
            BasicConsumeOptions { no_ack: true, ..Default::default() },
            FieldTable::default(),
        )
        .await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(ctx.settings.ingest_worker.concurrency.max(1), BasicQosOptions::default()).await?;
    let queue = ctx.topology.ingest_jobs();
    let mut jobs = ch.basic_consume(&queue, "ingest-worker", BasicConsumeOptions::default(), FieldTable::default()).await?;
    ready.store(true, Ordering::SeqCst);
    tracing::info!(%queue, "consuming ingest jobs");
    let mut running = JoinSet::new();
    loop {
        tokio::select! {
            msg = jobs.next() => {
                let Some(delivery) = msg else { anyhow::bail!("ingest job consumer closed") };
                let delivery = delivery?;
                let ctx = ctx.clone();
                let publisher = publisher.clone();
                let queue = queue.clone();
                running.spawn(async move { handle(&ctx, &publisher, &queue, delivery).await });
            }
            msg = control.next() => {
                let Some(delivery) = msg else { anyhow::bail!("the control consumer closed") };
                let delivery = delivery?;
                match serde_json::from_slice::<CancelTranscode>(&delivery.data) {
                    Ok(CancelTranscode { operation_id, run_id: None }) => {
                        if ctx.cancels.cancel(operation_id.as_str()) {
                            tracing::info!(%operation_id, "cancel heard: stopping the download");
                        }
                    }
                    Ok(_) => {} // a cancel of one transcoder run
                    Err(e) => tracing::warn!(error = %e, "dropping a malformed control message"),
                }
            }
            Some(done) = running.join_next(), if !running.is_empty() => {
                match done {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(error = %format!("{e:#}"), "settling an ingest job failed"),
                    Err(e) => tracing::error!(error = %e, "an ingest task panicked"),
                }
            }
            _ = shutdown.wait_for(|s| *s) => break,
        }
    }
    tracing::info!(in_hand = running.len(), "ingest worker stopping; jobs in hand go back to the queue");
    running.abort_all();
    let _ = ch.close(200, "ingest worker shutting down").await;
    let _ = conn.close(200, "ingest worker shutting down").await;
    Ok(())
}

/// Runs one job and settles its message.
async fn handle(ctx: &Shared, publisher: &Publisher, queue: &str, delivery: lapin::message::Delivery) -> anyhow::Result<()> {
    let job = match serde_json::from_slice::<IngestJob>(&delivery.data) {
        Ok(job) => job,
        Err(e) => {
            tracing::error!(error = %e, "dropping a malformed ingest job");
            delivery.acker.ack(BasicAckOptions::default()).await?;
            return Ok(());
        }
    };
    tracing::info!(operation_id = %job.operation_id, attempt = job.attempt, redelivered = delivery.redelivered, "ingest job taken");
    let started = Instant::now();
    let reporter = Reporter { ctx, publisher, job: &job };
    let total = Duration::from_secs(ctx.settings.ingest_worker.total_timeout_seconds);
    let mut registration = ctx.cancels.register(job.operation_id.as_str());
    let outcome = match stored(ctx, &job.source_key).await {
        _ if *registration.flag.borrow() => Err(IngestError::Cancelled),
        Ok(Some(found)) => {
            tracing::warn!(operation_id = %job.operation_id, "the source is already stored (an earlier delivery of this job): not downloading it again");
            Ok(found)
        }
        Ok(None) => ingest(ctx, &job, &reporter, tokio::time::Instant::now() + total, &mut registration.flag).await,
        Err(e) => Err(e),
    };
    drop(registration);
    if let Err(IngestError::Cancelled) = outcome {
        // The api ended the operation: nothing to report; the slot is free now.
        tracing::info!(operation_id = %job.operation_id, seconds = started.elapsed().as_secs_f64(), "ingest cancelled: download stopped, multipart upload aborted");
        vid_infra::metrics::counter!("ingest_downloads_total", "outcome" => "cancelled").increment(1);
        delivery.acker.ack(BasicAckOptions::default()).await?;
        vid_infra::metrics::counter!("amqp_messages_consumed_total", "queue" => queue.to_owned(), "outcome" => "ack").increment(1);
        return Ok(());
    }
    let (kind, label) = match outcome {
        Ok((size_bytes, content_type)) => {
            tracing::info!(operation_id = %job.operation_id, size_bytes, %content_type, seconds = started.elapsed().as_secs_f64(), "source downloaded");
            vid_infra::metrics::counter!("ingest_bytes_total").increment(size_bytes);
            (IngestReportKind::Downloaded { size_bytes, content_type }, "downloaded")
        }
        Err(e) => {
            tracing::warn!(operation_id = %job.operation_id, code = e.code(), error = %e, "ingest failed");
            (IngestReportKind::Failed { error: e.problem() }, e.code())
        }
    };
    vid_infra::metrics::counter!("ingest_downloads_total", "outcome" => label).increment(1);
    vid_infra::metrics::histogram!("ingest_download_seconds").record(started.elapsed().as_secs_f64());
    match reporter.send(kind).await {
        Ok(()) => {
            delivery.acker.ack(BasicAckOptions::default()).await?;
            vid_infra::metrics::counter!("amqp_messages_consumed_total", "queue" => queue.to_owned(), "outcome" => "ack").increment(1);
        }
        Err(e) => {
            tracing::warn!(operation_id = %job.operation_id, error = %e, "could not publish the ingest's report; requeueing the job");
            delivery.acker.nack(BasicNackOptions { requeue: true, ..Default::default() }).await?;
            vid_infra::metrics::counter!("amqp_messages_consumed_total", "queue" => queue.to_owned(), "outcome" => "requeue").increment(1);
        }
    }
    Ok(())
}

/// Publishes one job's reports (publisher confirms).
struct Reporter<'a> {
    ctx: &'a Shared,
    publisher: &'a Publisher,
    job: &'a IngestJob,
}

impl Reporter<'_> {
    async fn send(&self, kind: IngestReportKind) -> Result<(), vid_infra::amqp::PublishError> {
        let report = IngestReport {
            operation_id: self.job.operation_id.clone(),
            worker: self.ctx.worker.clone(),
            emitted_at: chrono::Utc::now(),
            kind,
        };
        self.publisher.publish_json(&self.ctx.topology.ingest_exchange(), RK_REPORT, &report, Some(self.job.operation_id.as_str())).await
    }
}

/// The size and media type of the object at `key` if it exists (S3
/// HeadObject), else `None`. Errors: storage unreachable
/// (`ingest_storage_failed`).
async fn stored(ctx: &Shared, key: &str) -> Result<Option<(u64, String)>, IngestError> {
    match ctx.s3.head_object().bucket(&ctx.settings.s3.bucket).key(key).send().await {
        Ok(out) => {
            let size = out.content_length().unwrap_or(0).max(0) as u64;
            Ok(Some((size, out.content_type().unwrap_or("application/octet-stream").to_owned())))
        }
        Err(e) if e.as_service_error().map(|s| s.is_not_found()).unwrap_or(false) => Ok(None),
        Err(e) => Err(IngestError::Storage(format!("HeadObject: {}", aws_sdk_s3::error::DisplayErrorContext(e)))),
    }
}

/// `fut`, or `source_timeout` once `deadline` (the job's total timeout) has
/// passed, or [`IngestError::Cancelled`] once `cancel` is set (`fut` is
/// dropped at its next await: between chunks, or while it waits for the source).
async fn within<T>(
    deadline: tokio::time::Instant,
    cancel: &mut watch::Receiver<bool>,
    fut: impl std::future::Future<Output = Result<T, IngestError>>,
) -> Result<T, IngestError> {
    tokio::select! {
        biased;
        () = cancelled(cancel) => Err(IngestError::Cancelled),
        result = tokio::time::timeout_at(deadline, fut) => match result {
            Ok(result) => result,
            Err(_) => Err(IngestError::Timeout("the download took longer than the total timeout".to_owned())),
        },
    }
}

/// Opens the source, streams it into storage within the size limit and
/// before `deadline`, reporting progress; returns the size and the media
/// type. Every failure after CreateMultipartUpload aborts the upload (the
/// deadline and `cancel`, the operation's cancel flag, are checked here, not
/// by dropping this future).
async fn ingest(
    ctx: &Shared,
    job: &IngestJob,
    reporter: &Reporter<'_>,
    deadline: tokio::time::Instant,
    cancel: &mut watch::Receiver<bool>,
) -> Result<(u64, String), IngestError> {
    let mut source = within(deadline, cancel, ctx.fetcher.open(&job.source_url)).await?;
    let limit = job.max_size_bytes;
    if let Some(announced) = source.content_length.filter(|n| *n > limit) {
        tracing::info!(announced, limit, "Content-Length above the limit: refused before reading");
        return Err(IngestError::TooLarge { limit });
    }
    // The first bytes decide the media type (declared > sniffed > header > first allowed).
    let first = within(deadline, cancel, source.chunk()).await?.unwrap_or_default();
    if first.is_empty() {
        return Err(IngestError::Empty);
    }
    let allowed = |t: &str| job.allowed_content_types.iter().any(|a| a.eq_ignore_ascii_case(t));
    let content_type = job
        .content_type
        .clone()
        .or_else(|| sniff(&first).filter(|t| allowed(t)).map(str::to_owned))
        .or_else(|| source.content_type.clone().filter(|t| allowed(t)))
        .or_else(|| job.allowed_content_types.first().cloned())
        .unwrap_or_else(|| "application/octet-stream".to_owned());
    let bucket = &ctx.settings.s3.bucket;
    let mut writer =
        MultipartWriter::start(ctx.s3.clone(), bucket, &job.source_key, &content_type, ctx.settings.ingest_worker.part_size_bytes).await?;
    let interval = Duration::from_millis(ctx.settings.ingest_worker.progress_interval_ms);
    let streamed = within(deadline, cancel, async {
        let mut chunk = Some(first);
        let mut last_report = Instant::now();
        while let Some(bytes) = chunk {
            if writer.written() + bytes.len() as u64 > limit {
                return Err(IngestError::TooLarge { limit });
            }
            writer.write(bytes).await?;
            if last_report.elapsed() >= interval {
                last_report = Instant::now();
                let progress = IngestReportKind::Progress { bytes_downloaded: writer.written(), total_bytes: source.content_length };
                if let Err(e) = reporter.send(progress).await {
                    tracing::warn!(error = %e, "could not publish a progress report");
                }
            }
            chunk = source.chunk().await?;
        }
        Ok(())
    })
    .await;
    let streamed = match streamed {
        // Another delivery of the same job may have finished first: keep its object.
        Ok(()) => stored(ctx, &job.source_key).await,
        Err(e) => Err(e),
    };
    match streamed {
        Ok(None) => Ok((writer.finish().await?, content_type)),
        Ok(Some(found)) => {
            tracing::warn!(operation_id = %job.operation_id, "the source was stored meanwhile by another delivery of this job: aborting this upload");
            writer.abort().await;
            Ok(found)
        }
        Err(e) => {
            writer.abort().await;
            Err(e)
        }
    }
}
