//! A job's reports on `P.transcode.reports`: [`Reports`] publishes one
//! (confirmed), [`ProgressReporter`] turns (phase, percent) updates into at
//! most one `Progress` report a second, plus a heartbeat every [`HEARTBEAT`].
//!
//! Invariants: progress never goes backwards and never passes 99; after
//! [`ProgressReporter::stop`] returns no progress report is in flight.

use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use vid_core::messages::{ReportKind, TranscodeJob, TranscodeReport};
use vid_core::operation::Phase;
use vid_infra::amqp::{Publisher, RK_REPORT};

/// A `Progress` report is sent at least this often while a job runs (heartbeat).
pub const HEARTBEAT: Duration = Duration::from_secs(30);

/// Publishes reports for one job.
#[derive(Clone)]
pub(super) struct Reports {
    pub(super) publisher: Publisher,
    pub(super) worker: String,
    pub(super) exchange: String,
    pub(super) job: TranscodeJob,
    /// This delivery's run id (a ULID, see [`TranscodeReport::run_id`]).
    pub(super) run_id: String,
}

impl Reports {
    /// Publishes one report for this job (confirmed). Errors: the broker did not take it.
    pub(super) async fn send(&self, kind: ReportKind) -> anyhow::Result<()> {
        let report = TranscodeReport {
            operation_id: self.job.operation_id.clone(),
            video_id: self.job.video_id.clone(),
            worker: self.worker.clone(),
            emitted_at: chrono::Utc::now(),
            run_id: self.run_id.clone(),
            attempt: self.job.attempt,
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
pub(super) struct ProgressReporter {
    state: watch::Sender<(Phase, f64)>,
    task: tokio::task::JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl ProgressReporter {
    /// Starts the reporter task at (downloading, 0 %).
    pub(super) fn start(reports: Reports) -> Self {
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
    pub(super) fn set(&self, phase: Phase, percent: f64) {
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
    pub(super) async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
