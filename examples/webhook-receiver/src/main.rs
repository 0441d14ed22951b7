//! `webhook-receiver`: the reference receiver for the platform's webhooks.

use std::sync::Arc;

use clap::{Parser, Subcommand};
use vid_webhook_receiver::{prepare_database, run_consumer, App, Config, ConsumerOptions, ConsumerStats};

/// Receives signed webhook deliveries, queues them, and applies each event once.
#[derive(Parser)]
#[command(name = "webhook-receiver", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    config: Config,
}

#[derive(Subcommand)]
enum Command {
    /// HTTP handler plus a background consumer (the default).
    Serve {
        /// Do not start the background consumer (run `consume` elsewhere).
        #[arg(long)]
        no_consumer: bool,
    },
    /// Only the consumer: apply queued events.
    Consume,
    /// Only create the database and apply migrations.
    Migrate,
}

/// A configuration or start-up error ends the process with one line, its
/// chain of causes (`{:#}`), whatever `RUST_BACKTRACE` says; panics keep
/// their backtrace. (The platform's services share this rule through
/// `vid_infra::exit`; the receiver depends on nothing of ours but
/// `vid-webhooks`, like a customer's receiver, so it states it here.)
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("webhook-receiver: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,lapin=warn".into()))
        .init();
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Serve { no_consumer: false }) {
        Command::Serve { no_consumer } => {
            let app = App::build(cli.config).await?;
            if !no_consumer {
                app.spawn_consumer();
            }
            app.run().await?;
        }
        Command::Consume => {
            let config = cli.config;
            prepare_database(&config.database_url).await?;
            let pool = vid_webhook_receiver::db::pool(&config.database_url, config.db_pool_size)?;
            let consumer = tokio::spawn(run_consumer(pool, ConsumerOptions::from_config(&config), Arc::new(ConsumerStats::default())));
            tokio::select! {
                _ = consumer => {}
                _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; unacknowledged messages go back to the queue"),
            }
        }
        Command::Migrate => prepare_database(&cli.config.database_url).await?,
    }
    Ok(())
}
