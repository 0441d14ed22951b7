//! `playback`: serves the stable playback URLs (`/play/{pb}…`).

use anyhow::Context;
use vid_playback::{Application, Settings};

/// A configuration or start-up error ends the process with one line (its
/// chain of causes), never a backtrace: see `vid_infra::exit`.
fn main() -> std::process::ExitCode {
    vid_infra::exit::exit_code("playback", run())
}

#[actix_web::main]
async fn run() -> anyhow::Result<()> {
    let settings: Settings = vid_infra::settings::load().context("loading settings")?;
    vid_infra::telemetry::init(&settings.telemetry);
    vid_infra::metrics::install();
    tracing::info!(profile = %vid_infra::settings::profile(), settings = ?settings, "starting playback");
    vid_playback::wait_for_database(&settings).await?;
    let app = Application::build(settings)?;
    tracing::info!(port = app.port(), "listening");
    app.run().await
}
