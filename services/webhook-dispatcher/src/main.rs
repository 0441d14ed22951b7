//! `webhook-dispatcher`: loads the settings, installs logging, and runs the
//! dispatcher until SIGTERM or SIGINT (then drains and exits 0).

use std::sync::Arc;

use anyhow::Context;
use vid_netguard::SystemResolver;
use vid_webhook_dispatcher::{Dispatcher, Settings};

/// A configuration or start-up error ends the process with one line (its
/// chain of causes), never a backtrace: see `vid_infra::exit`.
fn main() -> std::process::ExitCode {
    vid_infra::exit::exit_code("webhook-dispatcher", run())
}

#[tokio::main]
async fn run() -> anyhow::Result<()> {
    let settings: Settings = vid_infra::settings::load().context("loading settings")?;
    vid_infra::telemetry::init(&settings.telemetry);
    tracing::info!(profile = %vid_infra::settings::profile(), settings = ?settings, "webhook-dispatcher starting");
    let dispatcher = Dispatcher::build(settings, Arc::new(SystemResolver::new()))?;
    tracing::info!(health = %dispatcher.health_addr(), "health server bound");
    dispatcher.run(shutdown_signal()).await
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
