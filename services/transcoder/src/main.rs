//! `transcoder`: the transcode worker service.
//!
//! - `transcoder` / `transcoder run`: consume jobs (see `vid_transcoder::worker`).
//! - `transcoder work --spec <file>` (hidden): the child process that does the
//!   libav work for one job (see `vid_transcoder::child`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use tokio::signal::unix::{signal, SignalKind};
use vid_transcoder::settings::Settings;
use vid_transcoder::{child, health, worker};

#[derive(Parser)]
#[command(name = "transcoder", about = "Transcodes uploaded videos into an H.264/AAC MP4 ladder")]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Consume transcode jobs (the default).
    Run,
    /// Internal: run one media job in this process (started by `run`).
    #[command(hide = true)]
    Work {
        /// JSON `MediaJob` file.
        #[arg(long)]
        spec: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Cmd::Run) {
        Cmd::Work { spec } => {
            // Logs to stderr only (stdout carries the protocol), in the
            // service's log format (JSON in production); without readable
            // settings, plain lines filtered by RUST_LOG. No metrics
            // recorder: the supervisor measures the child and serves /metrics.
            match vid_infra::settings::load::<TelemetryOnly>() {
                Ok(s) => vid_infra::telemetry::init_stderr(&s.telemetry),
                Err(_) => {
                    let _ = tracing_subscriber::fmt()
                        .with_writer(std::io::stderr)
                        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                        .try_init();
                }
            }
            // The supervisor passes the job's correlation id (its operation id).
            let correlation_id = std::env::var(child::CORRELATION_ID_ENV).unwrap_or_default();
            let code = tracing::info_span!("work", correlation_id = %correlation_id).in_scope(|| child::child_main(&spec));
            std::process::ExitCode::from(code as u8)
        }
        Cmd::Run => {
            let result = run();
            if let Err(e) = &result {
                tracing::error!(error = format!("{e:#}"), "transcoder failed");
            }
            // One line on stderr, never a backtrace: see `vid_infra::exit`.
            vid_infra::exit::exit_code("transcoder", result)
        }
    }
}

/// The one section of the settings the `work` child reads.
#[derive(serde::Deserialize)]
struct TelemetryOnly {
    telemetry: vid_infra::settings::TelemetrySettings,
}

#[tokio::main]
async fn run() -> anyhow::Result<()> {
    let settings = Settings::load()?;
    vid_infra::telemetry::init(&settings.telemetry);
    vid_infra::metrics::install();
    tracing::info!(?settings, "transcoder starting");
    std::fs::create_dir_all(&settings.transcoder.work_dir)?;
    let exe = std::env::current_exe()?;
    let health_addr = settings.transcoder.health_listen;
    let w = worker::Worker::new(settings, exe);
    let _health = health::serve(health_addr, w.ready.clone()).await?;

    let (tx, rx) = tokio::sync::watch::channel(false);
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        let _ = tx.send(true);
    });
    w.run(rx).await?;
    tracing::info!("transcoder stopped");
    Ok(())
}
