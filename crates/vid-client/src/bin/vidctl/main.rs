//! `vidctl`: the command-line client of the video platform.
//!
//! Exit status: 0 success; 1 an error (the API's problem is printed); 2 the
//! awaited operation ended `failed` or `cancelled`; 64 a usage error (unknown
//! flag, bad value; `EX_USAGE`); 130 interrupted (Ctrl-C).
//!
//! Modules: [`cli`] the flags; [`config`] where the API is and the key;
//! [`commands`], [`endpoints`], [`signing`], [`upload`] and [`verify`] the commands;
//! [`view`] how results look to people; [`output`] the one renderer that
//! prints either that view or `--json`; [`exit`] errors and exit statuses.

mod cli;
mod commands;
mod config;
mod endpoints;
mod exit;
mod output;
mod signing;
mod upload;
mod verify;
mod view;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::config::{non_empty, resolve_api_key, resolve_api_url};
use crate::exit::EXIT_USAGE;
use crate::output::Output;

#[tokio::main]
async fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // `--help` and `--version` print to stdout and exit 0.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let _ = e.print();
            std::process::exit(EXIT_USAGE);
        }
    };
    let out = Output::new(cli.json);
    let api_url = resolve_api_url(&cli).unwrap_or_default();
    if let Err(e) = run(cli, out).await {
        std::process::exit(exit::report(&e, out, &api_url));
    }
}

/// Runs the command `cli` names.
async fn run(cli: Cli, out: Output) -> anyhow::Result<()> {
    if let Command::Verify { secret, header, body_file, tolerance } = &cli.command {
        return verify::verify(secret, header, body_file, *tolerance, out);
    }
    if let Command::Playback(cmd) = cli.command {
        return signing::playback(cmd, out);
    }
    let api_url = resolve_api_url(&cli)?;
    let client = vid_client::Client::new(&api_url, &resolve_api_key(&cli)?);
    let bars = std::io::IsTerminal::is_terminal(&std::io::stdout()) && !out.is_json();
    match cli.command {
        Command::Upload(args) => {
            let hint = upload::resume_hint(non_empty(&cli.api_url).map(|_| api_url.as_str()), &args.file);
            upload::upload(&client, args, out, bars, &hint).await
        }
        Command::Operations(cmd) => commands::operations(&client, cmd, out, bars).await,
        Command::Videos(cmd) => commands::videos(&client, cmd, out).await,
        Command::PlaybackIds(cmd) => commands::playback_ids(&client, cmd, out).await,
        Command::Uploads(cmd) => commands::uploads(&client, cmd, out).await,
        Command::Endpoints(cmd) => endpoints::endpoints(&client, cmd, out).await,
        Command::Events(cmd) => commands::events(&client, cmd, out).await,
        Command::SigningKeys(cmd) => signing::signing_keys(&client, cmd, out).await,
        Command::Playback(_) => unreachable!("handled above"),
        Command::Verify { .. } => unreachable!("handled above"),
    }
}
