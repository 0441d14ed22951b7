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
//! 6. A `CancelTranscode` on the control fan-out for an operation held here
//!    (for every run, or for this run when it names one, see Duplicates):
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
//! whose confirm came too late, after the fallback nack.) The api's outbox is
//! at-least-once, and the api re-drives an operation still `pending` by
//! publishing its job again with `attempt + 1` (issue 24), so a duplicate job
//! is a normal event. It is stopped by issue 24's run protocol (the wire
//! fields are documented on `vid_core::messages`):
//!
//! - Each delivery of a job message is a **run**: the worker mints a ULID
//!   `run_id` when it takes the delivery, and every report of that run
//!   carries it, with the job's `attempt` echoed. Two copies of one job (in
//!   two workers, or two slots of one) or a redelivery are two runs.
//! - The api lets the latest `Started` own the operation (under its row
//!   lock) and answers a `Started` from a run that does not own it with a
//!   targeted `CancelTranscode{operation_id, run_id: Some(r)}`: the former
//!   owner when a newer run took over, the late run itself when the operation
//!   is already terminal. Reports of a run that does not own the operation
//!   are ignored, so one transcode makes one `video.ready`.
//! - A cancel naming a run stops only that run here; a run of the same
//!   operation under another id goes on. A cancel without a run id (the
//!   customer's `:cancel`) stops every run of the operation, as before. A
//!   stopped run deletes the outputs it uploaded itself (none, while it was
//!   still transcoding), acks, and reports nothing more.
//!
//! What makes a duplicate harmless while it runs:
//!
//! - Every copy carries the same operation id, source key and output keys:
//!   a second run reads the same source and writes the same objects again,
//!   with the same encode (byte for byte when x264 runs with the same thread
//!   count; otherwise a rendition's size may differ a little from the
//!   `size_bytes` the api recorded). Each PUT or CompleteMultipartUpload
//!   replaces an object whole, so a reader sees one complete version or the
//!   other.
//! - The api applies reports under the operation's row lock
//!   (`services/api/src/lifecycle.rs`): progress never goes back, and a
//!   terminal status is never overwritten. A `Succeeded` for an operation
//!   that ended otherwise (cancelled, failed) has its outputs deleted by the
//!   api.
//! - A copy of an infected source's job finds the source quarantined and
//!   reports the same `malware_detected` (ignored as a duplicate).
//! - Each delivery has its own state here, its own run id and its own job
//!   directory (the second holder of an operation's directory gets
//!   `<operation id>-2/`, see [`crate::workdir`]).
//!
//! The price is the duplicate's compute until the api's targeted cancel
//! reaches it (one report round trip after its `Started`), and the copy
//! being subject to the delivery limit like any job. Reports of an older
//! transcoder carry run `""` and attempt 1 (serde defaults).
//!
//! # Connecting
//!
//! A session starts by connecting, which retries for up to 30 s while the
//! broker is unreachable; that wait (and the topology and consumer set-up)
//! races the shutdown signal, so SIGTERM during a broker outage ends the
//! process at once. Between sessions the backoff sleep races it too.
//!
//! # The parts
//!
//! - [`session`]: one broker session: connect, consume jobs and cancels, and
//!   the graceful shutdown (drain within the grace period, then stop the rest);
//! - [`delivery`]: one job delivery from receipt to its settlement (ack, nack
//!   or hand back) and the job's end (`JobEnd`);
//! - [`steps`]: the job's steps in order: download → scan → child → upload,
//!   each stoppable by a cancel or a shutdown;
//! - [`scanning`]: the scanning phase and the quarantine of an infected source;
//! - [`storage`]: S3 transfers: the source download, the output uploads
//!   (multipart above [`MULTIPART_THRESHOLD`]), deletes after a cancel;
//! - [`reports`]: publishing a job's reports, and the rate-limited progress reporter;
//! - [`metrics`]: the worker's counters and histograms.

mod delivery;
mod metrics;
mod reports;
mod scanning;
mod session;
mod steps;
mod storage;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use vid_infra::amqp::Topology;

use crate::settings::Settings;
use crate::workdir;

pub use delivery::REPUBLISH_TIMEOUT;
pub use reports::HEARTBEAT;
pub use scanning::quarantine_key;
pub use storage::{upload_file, MULTIPART_THRESHOLD, PART_SIZE};

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
}
