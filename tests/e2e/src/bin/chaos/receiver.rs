//! The reference receivers (`examples/webhook-receiver`), one process each,
//! restartable.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::{bail, Context};
use vid_e2e::bin_dir;

/// One `webhook-receiver` process (restartable).
pub(crate) struct ReceiverProc {
    pub(crate) name: &'static str,
    pub(crate) port: u16,
    pub(crate) database_url: String,
    pub(crate) amqp_url: String,
    pub(crate) queue: String,
    pub(crate) secret: String,
    pub(crate) log: PathBuf,
    pub(crate) child: Option<Child>,
    pub(crate) pids: PathBuf,
}

impl ReceiverProc {
    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/webhooks", self.port)
    }

    pub(crate) async fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let child = Command::new(bin_dir().join("webhook-receiver"))
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--database-url", &self.database_url])
            .args(["--amqp-url", &self.amqp_url])
            .args(["--queue", &self.queue])
            .env("RECEIVER_SECRETS", &self.secret)
            .env("RUST_LOG", "info,lapin=warn")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting webhook-receiver (cargo build --bins)")?;
        record_pid(&self.pids, child.id());
        self.child = Some(child);
        let http = reqwest::Client::new();
        for _ in 0..300 {
            if http.get(format!("http://127.0.0.1:{}/healthz", self.port)).send().await.is_ok() {
                return Ok(());
            }
            if let Some(status) = self.exited() {
                bail!("receiver {} exited at start-up ({status}); see {}", self.name, self.log.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("receiver {} did not answer /healthz; see {}", self.name, self.log.display())
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }
}

impl Drop for ReceiverProc {
    fn drop(&mut self) {
        self.kill();
    }
}

pub(crate) fn record_pid(file: &Path, pid: u32) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(file) {
        let _ = writeln!(f, "{pid}");
    }
}
