//! `vidctl`: the command-line client of the video platform.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use vid_client::upload::{Progress, Uploader};
use vid_client::{Client, ClientError};
use vid_core::endpoint::CreateEndpoint;
use vid_core::{OperationId, VideoId};

#[derive(Parser)]
#[command(name = "vidctl", version, about = "Upload videos and manage the video platform from the shell")]
struct Cli {
    /// API base URL.
    #[arg(long, env = "VIDCTL_API_URL", default_value = "http://127.0.0.1:8080", global = true)]
    api_url: String,
    /// API key (default: the local stack's `.local/api-key`).
    #[arg(long, env = "VIDCTL_API_KEY", global = true, hide_env_values = true)]
    api_key: Option<String>,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Upload a video in parallel parts straight to storage (resumable), then complete it.
    Upload {
        /// The file.
        file: PathBuf,
        /// Follow the transcode until it ends.
        #[arg(long)]
        wait: bool,
        /// Parts sent at once.
        #[arg(long, default_value_t = 4)]
        parallel: usize,
        /// Media type (default: guessed from the file's first bytes).
        #[arg(long)]
        content_type: Option<String>,
    },
    /// Operations.
    #[command(subcommand)]
    Operations(OperationCmd),
    /// Videos.
    #[command(subcommand)]
    Videos(VideoCmd),
    /// Webhook endpoints.
    #[command(subcommand)]
    Endpoints(EndpointCmd),
    /// Events.
    #[command(subcommand)]
    Events(EventCmd),
    /// Check a captured webhook's signature.
    Verify {
        /// The endpoint secret (`whsec_…`).
        #[arg(long)]
        secret: String,
        /// The `Webhook-Signature` header value.
        #[arg(long)]
        header: String,
        /// The raw body, as received.
        #[arg(long)]
        body_file: PathBuf,
        /// Tolerance in seconds; 0 skips the timestamp check.
        #[arg(long, default_value_t = 300)]
        tolerance: u64,
    },
}

#[derive(Subcommand)]
enum OperationCmd {
    /// Show one operation.
    Get { id: OperationId },
    /// List operations, newest first.
    List {
        #[arg(long)]
        status: Option<String>,
    },
    /// Wait until an operation ends.
    Wait {
        id: OperationId,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
    },
    /// Cancel a pending or running operation.
    Cancel { id: OperationId },
}

#[derive(Subcommand)]
enum EventCmd {
    /// Show one event exactly as it was sent.
    Get { id: vid_core::EventId },
    /// List events, newest first.
    List {
        /// Only this type, e.g. `video.ready`.
        #[arg(long = "type")]
        type_: Option<String>,
    },
}

#[derive(Subcommand)]
enum VideoCmd {
    /// Show one video with its download URLs.
    Get { id: VideoId },
    /// List videos.
    List,
}

#[derive(Subcommand)]
enum EndpointCmd {
    /// Register an endpoint; prints its secret once.
    Create {
        url: String,
        #[arg(long)]
        description: Option<String>,
    },
    /// List endpoints.
    List,
    /// Delete an endpoint.
    Delete { id: vid_core::EndpointId },
}

struct Bars(ProgressBar);

impl Progress for Bars {
    fn start(&self, total: u64, already: u64) {
        self.0.set_length(total);
        self.0.set_position(already);
    }
    fn advance(&self, n: u64) {
        self.0.inc(n);
    }
    fn retry(&self, part: u32, why: &str) {
        self.0.println(format!("part {part}: {why}"));
    }
}

fn api_key(cli: &Cli) -> anyhow::Result<String> {
    if let Some(k) = &cli.api_key {
        return Ok(k.clone());
    }
    let path = PathBuf::from(".local/api-key");
    std::fs::read_to_string(&path).map(|s| s.trim().to_owned()).map_err(|_| {
        anyhow::anyhow!("no API key: pass --api-key, set VIDCTL_API_KEY, or run `make up` (writes .local/api-key)")
    })
}

fn print<T: serde::Serialize + std::fmt::Debug>(json: bool, value: &T) {
    if json {
        println!("{}", serde_json::to_string_pretty(value).expect("serialises"));
    } else {
        println!("{}", serde_json::to_string_pretty(value).expect("serialises"));
    }
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli).await {
        match e.downcast_ref::<ClientError>().and_then(ClientError::problem) {
            Some(p) => eprintln!("error: {}\n  {}\n  code: {}", p.title, p.detail.as_deref().unwrap_or(""), p.code),
            None => eprintln!("error: {e:#}"),
        }
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Command::Verify { secret, header, body_file, tolerance } = &cli.command {
        let secret = vid_webhooks::Secret::parse(secret)?;
        let body = std::fs::read(body_file)?;
        let headers = [("webhook-signature", header.as_str())];
        let verifier = vid_webhooks::Verifier::new().with_tolerance(Duration::from_secs(if *tolerance == 0 { u64::MAX / 4 } else { *tolerance }));
        let v = verifier.verify_now([&secret], &headers[..], &body)?;
        println!("valid signature (timestamp {})", v.timestamp);
        return Ok(());
    }
    let client = Client::new(&cli.api_url, &api_key(&cli)?);
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout()) && !cli.json;
    match cli.command {
        Command::Upload { file, wait, parallel, content_type } => {
            let bar = if tty { ProgressBar::new(0) } else { ProgressBar::hidden() };
            bar.set_style(
                ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
                    .expect("valid template"),
            );
            let accepted = Uploader::new(&client)
                .parallel(parallel)
                .progress(Arc::new(Bars(bar.clone())))
                .upload_file(&file, content_type.as_deref())
                .await?;
            bar.finish_and_clear();
            let op = accepted.operation;
            if !cli.json {
                println!("video {}  operation {}", op.metadata.video_id.as_ref().map(|v| v.to_string()).unwrap_or_default(), op.id);
            }
            if !wait {
                print(cli.json, &op);
                return Ok(());
            }
            let bar = if tty { ProgressBar::new(100) } else { ProgressBar::hidden() };
            bar.set_style(ProgressStyle::with_template("{bar:40} {pos}% {msg}").expect("valid template"));
            let op = client
                .wait_operation(&op.id, Duration::from_secs(3600), |o| {
                    bar.set_position(o.progress as u64);
                    bar.set_message(format!("{} {:?}", o.status.as_str(), o.metadata.phase));
                })
                .await?;
            bar.finish_and_clear();
            print(cli.json, &op);
            if let Some(err) = &op.error {
                anyhow::bail!(ClientError::Api(err.clone()));
            }
        }
        Command::Operations(cmd) => match cmd {
            OperationCmd::Get { id } => print(cli.json, &client.get_operation(&id).await?),
            OperationCmd::List { status } => print(cli.json, &client.list_operations(status.as_deref(), None).await?.data),
            OperationCmd::Wait { id, timeout } => {
                let op = client.wait_operation(&id, Duration::from_secs(timeout), |_| {}).await?;
                print(cli.json, &op);
                if op.status != vid_core::operation::OperationStatus::Succeeded {
                    std::process::exit(2);
                }
            }
            OperationCmd::Cancel { id } => print(cli.json, &client.cancel_operation(&id).await?),
        },
        Command::Videos(cmd) => match cmd {
            VideoCmd::Get { id } => print(cli.json, &client.get_video(&id).await?),
            VideoCmd::List => print(cli.json, &client.list_videos(None).await?.data),
        },
        Command::Endpoints(cmd) => match cmd {
            EndpointCmd::Create { url, description } => {
                let created = client
                    .create_endpoint(&CreateEndpoint { url, description, event_types: None, signature_format: None })
                    .await?;
                print(cli.json, &created);
            }
            EndpointCmd::List => print(cli.json, &client.list_endpoints().await?.data),
            EndpointCmd::Delete { id } => {
                client.delete_endpoint(&id).await?;
                if !cli.json {
                    println!("deleted {id}");
                }
            }
        },
        Command::Events(cmd) => match cmd {
            EventCmd::Get { id } => print(cli.json, &client.get_event(&id).await?),
            EventCmd::List { type_ } => print(cli.json, &client.list_events(type_.as_deref(), None).await?.data),
        },
        Command::Verify { .. } => unreachable!("handled above"),
    }
    Ok(())
}
