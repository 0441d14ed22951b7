//! How a step ends early: [`StepError`], and [`stoppable`], which races a step
//! against a cancel or shutdown. A leaf below `worker/`.

use tokio::sync::watch;
use vid_core::messages::ReportKind;

use crate::child::Stop;

/// Why the steps ended before a terminal report of their own.
#[derive(Debug)]
pub(super) enum StepError {
    /// A cancel or a shutdown.
    Stopped(Stop),
    /// Retry later (S3, broker, our own I/O).
    Transient(anyhow::Error),
    /// A permanent outcome found before the end (e.g. by the scan): the terminal report to send.
    Report(Box<ReportKind>),
}

/// Runs `fut` unless a stop arrives first.
pub(super) async fn stoppable<T>(
    stop: &mut watch::Receiver<Option<Stop>>,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, StepError> {
    if let Some(s) = *stop.borrow() {
        return Err(StepError::Stopped(s));
    }
    tokio::select! {
        v = fut => Ok(v),
        s = stop.wait_for(|s| s.is_some()) => Err(StepError::Stopped(s.map(|s| s.unwrap()).unwrap_or(Stop::Shutdown))),
    }
}
