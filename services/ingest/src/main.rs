//! `ingest`: loads the settings, installs logging, and consumes ingest jobs
//! until SIGTERM or SIGINT.

use std::sync::Arc;

use anyhow::Context;
use vid_ingest::worker::Worker;
use vid_ingest::Settings;
use vid_netguard::SystemResolver;

/// A configuration or start-up error ends the process with one line.
fn main() -> std::process::ExitCode {
    vid_infra::exit::exit_code("ingest", run())
}

#[tokio::main]
async fn run() -> anyhow::Result<()> {
    let settings: Settings = vid_infra::settings::load().context("loading settings")?;
    vid_infra::telemetry::init(&settings.telemetry);
    tracing::info!(profile = %vid_infra::settings::profile(), settings = ?settings, "ingest worker starting");
    let worker = Worker::build(settings, Arc::new(SystemResolver::new()), None).await?;
    tracing::info!(health = %worker.health_addr(), "health server bound");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        }
        let _ = stop.send(true);
    });
    worker.run(stopped).await
}
