//! What the run's tasks share: the stack, the receivers, the proxies, when
//! each fault began, and the findings of the process watchdog.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use vid_core::operation::OperationStatus;
use vid_core::OperationId;
use vid_e2e::Stack;

use crate::proxy::Proxy;
use crate::receiver::{record_pid, ReceiverProc};
use crate::schedule::FaultKind;
use crate::util::fmt_t;

/// The state every task of the run sees.
pub(crate) struct Shared {
    /// Set when a fault begins (pinned uploads wait for it).
    pub(crate) started: HashMap<FaultKind, tokio::sync::watch::Sender<bool>>,
    pub(crate) stack: tokio::sync::Mutex<Stack>,
    pub(crate) receivers: tokio::sync::Mutex<Vec<ReceiverProc>>,
    pub(crate) proxies: Vec<Proxy>,
    /// The start of the load; fault times are measured from it.
    pub(crate) t0: Instant,
    /// Services or receivers that exited without being killed by the run.
    pub(crate) findings: Mutex<Vec<String>>,
    /// The file every child's pid is appended to (chaos.sh kills leftovers).
    pub(crate) pids: PathBuf,
}

/// What one upload came to.
#[derive(Debug, Default, Clone)]
pub(crate) struct UploadResult {
    pub(crate) operation: Option<OperationId>,
    pub(crate) status: Option<OperationStatus>,
    pub(crate) sdk_retries: u32,
    pub(crate) last_error: Option<String>,
}

impl Shared {
    /// Records services or receivers that exited although the run did not kill them.
    pub(crate) async fn watch_processes(&self) {
        let mut found = Vec::new();
        {
            let mut stack = self.stack.lock().await;
            for name in ["api", "transcoder", "webhook-dispatcher"] {
                if let Some(status) = stack.exited(name) {
                    found.push(format!(
                        "{} {name} exited by itself ({status}); see {}/{name}.log",
                        fmt_t(self.t0.elapsed()),
                        stack.log_dir().display()
                    ));
                    // Restarted so the run can go on; the finding fails the run.
                    stack.kill(name);
                    stack.spawn(name);
                    if let Some(pid) = stack.pid(name) {
                        record_pid(&self.pids, pid);
                    }
                }
            }
        }
        {
            let mut receivers = self.receivers.lock().await;
            for r in receivers.iter_mut() {
                if let Some(status) = r.exited() {
                    found.push(format!(
                        "{} receiver {} exited by itself ({status}); see {}",
                        fmt_t(self.t0.elapsed()),
                        r.name,
                        r.log.display()
                    ));
                    r.kill();
                    let _ = r.start().await;
                }
            }
        }
        if !found.is_empty() {
            for f in &found {
                println!("chaos: FINDING: {f}");
            }
            self.findings.lock().unwrap().extend(found);
        }
    }
}
