//! [`Worker`]: the state every part of a running worker shares (settings,
//! storage client, queue names, the child binary, its name for reports).
//! A leaf below `worker/`: the parts import it; it imports none of them.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vid_infra::amqp::Topology;

use crate::settings::Settings;

/// Shared state of a running worker.
#[derive(Clone)]
pub struct Worker {
    pub(super) settings: Arc<Settings>,
    pub(super) s3: aws_sdk_s3::Client,
    pub(super) topology: Topology,
    pub(super) child_exe: PathBuf,
    pub(super) name: String,
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
}
