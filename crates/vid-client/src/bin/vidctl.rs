//! `vidctl`: the command-line client of the video platform.
//!
//! Exit status: 0 success; 1 an error (the API's problem is printed); 2 the
//! awaited operation ended `failed` or `cancelled`; 64 a usage error (unknown
//! flag, bad value; `EX_USAGE`); 130 interrupted (Ctrl-C).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, TimeZone, Utc};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use vid_client::upload::{Progress, Uploader};
use vid_client::{Client, ClientError, DeliveryFilter, EndpointChanges, EventFilter, Page};
use vid_core::endpoint::{CreateEndpoint, Endpoint, EndpointHealth, EndpointStatus, SignatureFormat};
use vid_core::event::{Event, EventData, EventType};
use vid_core::operation::{Operation, OperationStatus, Phase};
use vid_core::upload::UploadState;
use vid_core::video::Video;
use vid_core::{DeliveryId, EndpointId, EventId, OperationId, Problem, UploadId, VideoId};

const DEFAULT_API_URL: &str = "http://127.0.0.1:8080";

#[derive(Parser)]
#[command(name = "vidctl", version, about = "Upload videos and manage the video platform from the shell")]
struct Cli {
    /// API base URL [default: http://127.0.0.1:8080].
    #[arg(long, env = "VIDCTL_API_URL", global = true)]
    api_url: Option<String>,
    /// API key [default: the `.local/api-key` found in this directory or a parent].
    #[arg(long, env = "VIDCTL_API_KEY", global = true, hide_env_values = true)]
    api_key: Option<String>,
    /// Machine-readable JSON output (and no progress bars).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Upload a video in parallel parts straight to storage (resumable), then complete it.
    Upload(UploadArgs),
    /// Long-running operations (transcodes).
    #[command(subcommand)]
    Operations(OperationCmd),
    /// Videos and their renditions.
    #[command(subcommand)]
    Videos(VideoCmd),
    /// Uploads in progress.
    #[command(subcommand)]
    Uploads(UploadCmd),
    /// Webhook endpoints and their deliveries.
    #[command(subcommand)]
    Endpoints(EndpointCmd),
    /// Events (what webhooks announce).
    #[command(subcommand)]
    Events(EventCmd),
    /// Check a captured webhook's signature (needs no API access).
    Verify {
        /// The endpoint secret (`whsec_…`); repeat during a rotation.
        #[arg(long, required = true)]
        secret: Vec<String>,
        /// A header as received, `Name: value` (repeatable); a bare value is taken as `Webhook-Signature`.
        #[arg(long, required = true)]
        header: Vec<String>,
        /// The raw body, exactly as received.
        #[arg(long)]
        body_file: PathBuf,
        /// Accepted clock difference in seconds; 0 skips the timestamp check.
        #[arg(long, default_value_t = 300)]
        tolerance: u64,
    },
}

#[derive(Args)]
struct UploadArgs {
    /// The file.
    file: PathBuf,
    /// Follow the transcode until it ends.
    #[arg(long)]
    wait: bool,
    /// Parts sent at once (memory use is about this × the part size).
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Media type [default: guessed from the file's first bytes].
    #[arg(long)]
    content_type: Option<String>,
    /// With --wait: give up waiting after this many seconds.
    #[arg(long, default_value_t = 3600)]
    timeout: u64,
    /// Testing aid: pause this long before sending each part.
    #[arg(long, hide = true)]
    part_delay_ms: Option<u64>,
}

#[derive(Args)]
struct PageArgs {
    /// Continue after this cursor (printed at the end of the previous page).
    #[arg(long)]
    cursor: Option<String>,
    /// Follow every page.
    #[arg(long, conflicts_with = "cursor")]
    all: bool,
}

#[derive(Subcommand)]
enum OperationCmd {
    /// Show one operation.
    Get { id: OperationId },
    /// List operations, newest first.
    List {
        /// Only this status: pending, running, succeeded, failed, cancelled.
        #[arg(long)]
        status: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Wait until an operation ends; exits 2 unless it succeeded.
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
enum VideoCmd {
    /// Show one video with its renditions and download URLs.
    Get { id: VideoId },
    /// List videos, newest first.
    List {
        #[command(flatten)]
        page: PageArgs,
    },
}

#[derive(Subcommand)]
enum UploadCmd {
    /// Show an upload: status, parts in storage, parts missing.
    Get { id: UploadId },
    /// Abort an upload (storage drops its parts).
    Abort { id: UploadId },
}

#[derive(Subcommand)]
enum EndpointCmd {
    /// Register an endpoint; prints its signing secret once.
    Create {
        url: String,
        #[arg(long)]
        description: Option<String>,
        /// Only send this event type (repeatable) [default: every type].
        #[arg(long = "event-type", value_parser = parse_event_type)]
        event_types: Vec<EventType>,
        /// webhook-signature (default) or standard-webhooks.
        #[arg(long, value_parser = parse_format)]
        signature_format: Option<SignatureFormat>,
    },
    /// List endpoints.
    List,
    /// Show one endpoint.
    Get { id: EndpointId },
    /// Change an endpoint's URL, description, filter or signature format.
    Update {
        id: EndpointId,
        #[arg(long)]
        url: Option<String>,
        #[arg(long)]
        description: Option<String>,
        /// Remove the description.
        #[arg(long, conflicts_with = "description")]
        clear_description: bool,
        /// Only send this event type (repeatable; replaces the filter).
        #[arg(long = "event-type", value_parser = parse_event_type)]
        event_types: Vec<EventType>,
        /// Remove the filter: send every event type.
        #[arg(long, conflicts_with = "event_types")]
        all_event_types: bool,
        /// webhook-signature or standard-webhooks.
        #[arg(long, value_parser = parse_format)]
        signature_format: Option<SignatureFormat>,
    },
    /// Delete an endpoint.
    Delete { id: EndpointId },
    /// Give an endpoint a new secret (printed once); the old one signs too for a while.
    RotateSecret { id: EndpointId },
    /// Re-enable a disabled endpoint; its paused backlog is delivered.
    Enable { id: EndpointId },
    /// Recent deliveries to an endpoint, with their last attempt.
    Deliveries {
        id: EndpointId,
        /// pending, succeeded, failed or paused.
        #[arg(long)]
        status: Option<String>,
        /// e.g. video.ready.
        #[arg(long)]
        event_type: Option<String>,
        /// Page size, 1–100.
        #[arg(long)]
        limit: Option<u32>,
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Send a delivery once more.
    Retry { id: EndpointId, delivery_id: DeliveryId },
}

#[derive(Subcommand)]
enum EventCmd {
    /// Show one event exactly as it was sent.
    Get { id: EventId },
    /// List events, newest first.
    List {
        /// Only this type, e.g. `video.ready`.
        #[arg(long = "type")]
        type_: Option<String>,
        /// Only events recorded strictly after this instant: RFC 3339 with an
        /// offset, e.g. `2026-01-02T03:04:05Z` or `2026-01-02T04:04:05+01:00`.
        #[arg(long, value_parser = parse_rfc3339)]
        created_after: Option<DateTime<Utc>>,
        /// Only events recorded strictly before this instant (RFC 3339, like
        /// `--created-after`).
        #[arg(long, value_parser = parse_rfc3339)]
        created_before: Option<DateTime<Utc>>,
        #[command(flatten)]
        page: PageArgs,
    },
}

/// An RFC 3339 date-time with an offset (`2026-01-02T03:04:05Z`,
/// `2026-01-02T04:04:05.5+01:00`), as a UTC instant.
fn parse_rfc3339(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("not an RFC 3339 date-time with an offset, such as 2026-01-02T03:04:05Z ({e})"))
}

fn parse_event_type(s: &str) -> Result<EventType, String> {
    EventType::parse(s).ok_or_else(|| format!("unknown event type; one of {}", EventType::ALL.map(|t| t.as_str()).join(", ")))
}

fn parse_format(s: &str) -> Result<SignatureFormat, String> {
    SignatureFormat::parse(s).ok_or_else(|| "one of webhook-signature, standard-webhooks".to_owned())
}

// ---------------------------------------------------------------------------
// errors and exit codes
// ---------------------------------------------------------------------------

/// Ends the process with `code` after printing nothing more.
#[derive(Debug)]
struct Exit(i32);
impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}", self.0)
    }
}
impl std::error::Error for Exit {}

fn print_problem(p: &Problem) {
    eprintln!("error: {}", p.title);
    if let Some(d) = &p.detail {
        eprintln!("  {d}");
    }
    eprintln!("  code: {} (HTTP {})", p.code, p.status);
    for (k, v) in &p.extensions {
        eprintln!("  {k}: {v}");
    }
}

/// Exit status of usage errors (`EX_USAGE` of sysexits.h); 2 means the awaited operation failed.
const EXIT_USAGE: i32 = 64;

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
    let json = cli.json;
    let api_url = resolve_api_url(&cli).unwrap_or_default();
    if let Err(e) = run(cli).await {
        if let Some(Exit(code)) = e.downcast_ref::<Exit>() {
            std::process::exit(*code);
        }
        match e.downcast_ref::<ClientError>() {
            Some(ClientError::Api(p)) => {
                print_problem(p);
                if p.status == 401 {
                    eprintln!("  hint: check --api-key / VIDCTL_API_KEY");
                }
                if json {
                    println!("{}", json!({ "error": p }));
                }
            }
            Some(ClientError::Http(h)) if h.is_connect() && h.url().is_some_and(|u| u.as_str().starts_with(&api_url)) => {
                // The innermost cause says why, e.g. "Connection refused (os error 111)".
                let mut cause: &dyn std::error::Error = h;
                while let Some(s) = cause.source() {
                    cause = s;
                }
                let message = format!("cannot reach the API at {api_url}: {cause}");
                eprintln!("error: {message}");
                eprintln!("  set --api-url or VIDCTL_API_URL, or start the local stack (`make up`)");
                if json {
                    println!("{}", json!({ "error": { "title": "cannot reach the API", "detail": message } }));
                }
            }
            _ => {
                eprintln!("error: {e:#}");
                if json {
                    println!("{}", json!({ "error": { "title": "vidctl error", "detail": format!("{e:#}") } }));
                }
            }
        }
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------------------
// configuration
// ---------------------------------------------------------------------------

fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// The API base URL, normalised (lower-case scheme and host, no trailing `/`).
fn resolve_api_url(cli: &Cli) -> anyhow::Result<String> {
    let raw = non_empty(&cli.api_url).unwrap_or(DEFAULT_API_URL);
    match reqwest::Url::parse(raw) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => Ok(u.as_str().trim_end_matches('/').to_owned()),
        _ => anyhow::bail!("--api-url (or VIDCTL_API_URL) {raw} is not an http:// or https:// URL; e.g. http://{raw}"),
    }
}

/// `.local/api-key` in the current directory or the nearest parent that has one.
fn find_key_file() -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok()?;
    cwd.ancestors().map(|d| d.join(".local/api-key")).find(|p| p.is_file())
}

fn resolve_api_key(cli: &Cli) -> anyhow::Result<String> {
    if let Some(k) = non_empty(&cli.api_key) {
        return Ok(k.to_owned());
    }
    let cwd = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_else(|_| ".".into());
    let Some(path) = find_key_file() else {
        anyhow::bail!(
            "no API key: pass --api-key or set VIDCTL_API_KEY (no .local/api-key in {cwd} or any parent; `make up` writes one for the local stack)"
        );
    };
    let key = std::fs::read_to_string(&path).with_context(|| format!("reading the API key from {}", path.display()))?;
    let key = key.trim();
    anyhow::ensure!(!key.is_empty(), "no API key: {} is empty; pass --api-key or set VIDCTL_API_KEY", path.display());
    Ok(key.to_owned())
}

// ---------------------------------------------------------------------------
// output helpers
// ---------------------------------------------------------------------------

fn print_json(value: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(value).expect("serialises"));
}

/// Prints rows under headers, columns aligned; the last column is not padded.
fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len() - 1;
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i == last {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        println!("{}", out.trim_end());
    };
    line(headers.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
    if rows.is_empty() {
        println!("(none)");
    }
}

/// Prints `key  value` lines, keys aligned.
fn fields(pairs: &[(&str, String)]) {
    let w = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in pairs {
        println!("{k:<w$}  {v}");
    }
}

fn time(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

fn opt_time(t: &Option<DateTime<Utc>>) -> String {
    t.as_ref().map(time).unwrap_or_else(|| "-".into())
}

fn dash(s: Option<impl ToString>) -> String {
    s.map(|s| s.to_string()).unwrap_or_else(|| "-".into())
}

fn phase_str(p: Option<Phase>) -> String {
    p.and_then(|p| serde_json::to_value(p).ok()).and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

fn human_bytes(n: u64) -> String {
    indicatif::BinaryBytes(n).to_string()
}

/// `1-3, 5, 7-9`.
fn ranges(ns: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ns.len() {
        let start = ns[i];
        while i + 1 < ns.len() && ns[i + 1] == ns[i] + 1 {
            i += 1;
        }
        out.push(if ns[i] == start { start.to_string() } else { format!("{start}-{}", ns[i]) });
        i += 1;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(", ")
    }
}

fn print_page_end(next: &Option<String>) {
    if let Some(c) = next {
        println!("more: --cursor {c}");
    }
}

fn operation_status_line(op: &Operation) -> String {
    let mut s = format!("{} {}%", op.status.as_str(), op.progress);
    let phase = phase_str(op.metadata.phase);
    if !phase.is_empty() && !op.status.is_terminal() {
        s.push_str(&format!(" ({phase})"));
    }
    s
}

fn print_operation(op: &Operation) {
    let mut f = vec![
        ("operation", op.id.to_string()),
        ("status", operation_status_line(op)),
        ("video", dash(op.metadata.video_id.as_ref())),
        ("created", time(&op.created_at)),
        ("updated", time(&op.updated_at)),
    ];
    if let Some(r) = &op.result {
        let list: Vec<String> = r.renditions.iter().map(|r| format!("{} {}x{}", r.name, r.width, r.height)).collect();
        f.push(("renditions", list.join(", ")));
    }
    if let Some(e) = &op.error {
        f.push(("error", format!("{}: {} (code {})", e.title, e.detail.as_deref().unwrap_or(""), e.code)));
    }
    fields(&f);
}

fn operation_rows(ops: &[Operation]) -> Vec<Vec<String>> {
    ops.iter()
        .map(|o| {
            vec![
                o.id.to_string(),
                o.status.as_str().into(),
                format!("{}%", o.progress),
                phase_str(o.metadata.phase),
                dash(o.metadata.video_id.as_ref()),
                time(&o.created_at),
            ]
        })
        .collect()
}

fn print_video(v: &Video) {
    let mut f = vec![
        ("video", v.id.to_string()),
        ("status", format!("{} (version {})", v.status.as_str(), v.version)),
        ("operation", v.operation_id.to_string()),
        ("filename", dash(v.filename.as_ref())),
        ("content type", v.content_type.clone()),
        ("created", time(&v.created_at)),
        ("updated", time(&v.updated_at)),
    ];
    if let Some(s) = &v.source {
        f.push((
            "source",
            format!(
                "{}x{} {} / {} , {}, {} s, {}",
                s.width,
                s.height,
                s.video_codec,
                s.audio_codec.as_deref().unwrap_or("no audio"),
                s.container,
                s.duration_seconds.map(|d| format!("{d:.1}")).unwrap_or_else(|| "?".into()),
                human_bytes(s.size_bytes)
            ),
        ));
    }
    if let Some(p) = &v.poster {
        f.push(("poster", format!("{}x{} {}", p.width, p.height, p.url.as_deref().unwrap_or(&p.storage_key))));
    }
    fields(&f);
    if !v.renditions.is_empty() {
        println!();
        print_renditions(v, true);
    }
}

fn print_renditions(v: &Video, urls: bool) {
    let rows: Vec<Vec<String>> = v
        .renditions
        .iter()
        .map(|r| {
            let mut row =
                vec![r.name.clone(), format!("{}x{}", r.width, r.height), format!("{} kb/s", r.bitrate / 1000), human_bytes(r.size_bytes)];
            if urls {
                row.push(r.url.clone().unwrap_or_else(|| r.storage_key.clone()));
            }
            row
        })
        .collect();
    if urls {
        table(&["RENDITION", "SIZE", "BITRATE", "BYTES", "URL"], &rows);
    } else {
        table(&["RENDITION", "SIZE", "BITRATE", "BYTES"], &rows);
    }
}

fn print_upload(u: &UploadState) {
    let stored: u64 = u.parts.iter().map(|p| p.size_bytes).sum();
    fields(&[
        ("upload", u.id.to_string()),
        ("status", u.status.as_str().into()),
        ("size", format!("{} ({} bytes), {} parts of {}", human_bytes(u.size_bytes), u.size_bytes, u.part_count, human_bytes(u.part_size))),
        ("stored", format!("{} parts, {}", u.parts.len(), human_bytes(stored))),
        ("missing", ranges(&u.missing_parts)),
        ("content type", u.content_type.clone()),
        ("video", dash(u.video_id.as_ref())),
        ("operation", dash(u.operation_id.as_ref())),
        ("created", time(&u.created_at)),
        ("expires", time(&u.expires_at)),
    ]);
}

fn endpoint_status(e: &Endpoint) -> String {
    match e.status {
        EndpointStatus::Enabled => "enabled".into(),
        EndpointStatus::Disabled => format!("disabled ({})", e.disabled_reason.as_deref().unwrap_or("no reason")),
    }
}

fn event_types(e: &Endpoint) -> String {
    match &e.event_types {
        Some(ts) => ts.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(","),
        None => "all".into(),
    }
}

fn print_endpoint(e: &Endpoint) {
    fields(&[
        ("endpoint", e.id.to_string()),
        ("url", e.url.clone()),
        ("status", endpoint_status(e)),
        ("events", event_types(e)),
        ("signature", e.signature_format.as_str().into()),
        ("description", dash(e.description.as_ref())),
        ("disabled at", opt_time(&e.disabled_at)),
        ("created", time(&e.created_at)),
    ]);
}

/// `97 % of 100 (last: HTTP 200 at …)`, or `-` before any attempt.
fn health_line(h: &EndpointHealth) -> String {
    let Some(rate) = h.success_rate else { return "-".into() };
    let last = match (h.last_attempt_status, &h.last_attempt_error_class) {
        (Some(status), _) => format!("HTTP {status}"),
        (None, Some(class)) => class.clone(),
        (None, None) => "-".into(),
    };
    format!("{:.0} % of {} succeeded (last: {last} at {})", rate * 100.0, h.recent_deliveries, opt_time(&h.last_attempt_at))
}

fn event_subject(e: &Event) -> String {
    match &e.data {
        EventData::Video(d) => format!("video {} v{} (operation {})", d.video_id, d.version, d.operation_id),
        EventData::Endpoint(d) => format!("endpoint {}: {}", d.endpoint_id, d.reason),
    }
}

fn unix_time(secs: i64) -> String {
    Utc.timestamp_opt(secs, 0).single().map(|t| time(&t)).unwrap_or_else(|| secs.to_string())
}

fn vstr(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "-".into(),
        Some(other) => other.to_string(),
    }
}

fn delivery_row(d: &Value) -> Vec<String> {
    let last = d.get("attempts").and_then(Value::as_array).and_then(|a| a.last());
    let outcome = match last {
        Some(a) => match (a.get("response_status").and_then(Value::as_i64), a.get("error_class").and_then(Value::as_str)) {
            (Some(s), None) => format!("HTTP {s}"),
            (Some(s), Some(c)) => format!("HTTP {s} ({c})"),
            (None, Some(c)) => c.to_owned(),
            (None, None) => "-".into(),
        },
        None => "-".into(),
    };
    vec![
        vstr(d, "id"),
        vstr(d, "event_id"),
        vstr(d, "event_type"),
        vstr(d, "status"),
        vstr(d, "attempt_count"),
        outcome,
        vstr(d, "next_attempt_at"),
    ]
}

async fn all_pages<T, F, Fut>(page: &PageArgs, mut fetch: F) -> Result<Page<T>, ClientError>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<Page<T>, ClientError>>,
{
    let mut first = fetch(page.cursor.clone()).await?;
    if !page.all {
        return Ok(first);
    }
    while let Some(c) = first.next_cursor.take() {
        let next = fetch(Some(c)).await?;
        first.data.extend(next.data);
        first.next_cursor = next.next_cursor;
    }
    Ok(first)
}

// ---------------------------------------------------------------------------
// upload
// ---------------------------------------------------------------------------

/// Progress shown on a bar (or, with no bar, retries as lines on stderr);
/// also remembers what the Ctrl-C message needs.
struct UploadProgress {
    bar: ProgressBar,
    visible: bool,
    upload_id: Mutex<Option<UploadId>>,
    stored_parts: AtomicU64,
    sent_bytes: AtomicU64,
}

impl Progress for UploadProgress {
    fn upload(&self, id: &UploadId, resumed: bool) {
        *self.upload_id.lock().unwrap() = Some(id.clone());
        if resumed {
            self.line(format!("resuming upload {id}"));
        }
    }
    fn start(&self, total: u64, already: u64) {
        self.bar.set_length(total);
        self.bar.set_position(already);
        self.bar.reset_eta();
    }
    fn advance(&self, n: u64) {
        self.sent_bytes.fetch_add(n, Ordering::Relaxed);
        self.bar.inc(n);
    }
    fn part_sent(&self, _part: u32) {
        self.stored_parts.fetch_add(1, Ordering::Relaxed);
    }
    fn retry(&self, part: u32, why: &str) {
        self.line(format!("part {part}: {why}"));
    }
    fn warning(&self, message: &str) {
        self.line(format!("warning: {message}"));
    }
}

impl UploadProgress {
    fn line(&self, s: String) {
        if self.visible {
            self.bar.println(s);
        } else {
            eprintln!("{s}");
        }
    }
}

/// Ctrl-C, or SIGTERM.
async fn interrupted() {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+,:@".contains(c)) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The command that resumes an upload of `file`: with `--api-url` when one
/// was given (the state is kept per API URL), shell-quoted.
fn resume_hint(api_url: Option<&str>, file: &Path) -> String {
    let mut hint = "vidctl".to_owned();
    if let Some(url) = api_url {
        hint.push_str(&format!(" --api-url {}", shell_quote(url)));
    }
    hint.push_str(&format!(" upload {}", shell_quote(&file.display().to_string())));
    hint
}

async fn upload(client: &Client, args: UploadArgs, json_out: bool, bars: bool, resume_hint: &str) -> anyhow::Result<()> {
    let bar = if bars { ProgressBar::new(0) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{spinner} uploading [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}")
            .expect("valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let progress = Arc::new(UploadProgress {
        bar: bar.clone(),
        visible: bars,
        upload_id: Mutex::new(None),
        stored_parts: AtomicU64::new(0),
        sent_bytes: AtomicU64::new(0),
    });
    let uploader = Uploader::new(client)
        .parallel(args.parallel)
        .progress(progress.clone())
        .delay_before_send(args.part_delay_ms.map(Duration::from_millis));
    let started = Instant::now();
    let outcome = tokio::select! {
        r = uploader.upload(&args.file, args.content_type.as_deref()) => {
            bar.finish_and_clear();
            r?
        }
        _ = interrupted() => {
            bar.abandon();
            let id = progress.upload_id.lock().unwrap().clone();
            match id {
                Some(id) => eprintln!(
                    "\ninterrupted: upload {id} keeps the parts already sent ({} in this run).\nRun the same command again to resume; only the missing parts are sent:\n  {resume_hint}",
                    progress.stored_parts.load(Ordering::Relaxed),
                ),
                None => eprintln!("\ninterrupted before the upload was created; nothing to resume"),
            }
            return Err(Exit(130).into());
        }
    };
    let secs = started.elapsed().as_secs_f64();
    let sent = progress.sent_bytes.load(Ordering::Relaxed);
    let op = outcome.accepted.operation.clone();
    let video_id = op.metadata.video_id.clone();
    let mut report = json!({
        "upload_id": outcome.upload_id,
        "video_id": video_id,
        "operation_id": op.id,
        "resumed": outcome.resumed,
        "parts_sent": outcome.parts_sent,
        "parts_already_stored": outcome.parts_already_stored,
        "bytes_sent": sent,
        "seconds": secs,
        "operation": op,
    });
    if !json_out {
        let rate = if secs > 0.0 { sent as f64 / secs } else { 0.0 };
        println!(
            "uploaded {} ({} sent in {secs:.1} s, {}/s; {} parts sent{})",
            args.file.display(),
            human_bytes(sent),
            human_bytes(rate as u64),
            outcome.parts_sent.len(),
            if outcome.resumed { format!(", {} already stored", outcome.parts_already_stored.len()) } else { String::new() }
        );
        fields(&[("upload", outcome.upload_id.to_string()), ("video", dash(video_id.as_ref())), ("operation", op.id.to_string())]);
    }
    if !args.wait {
        if json_out {
            print_json(&report);
        } else {
            println!("status     {}", operation_status_line(&op));
            println!("follow it: vidctl operations wait {}", op.id);
        }
        return Ok(());
    }
    let op = follow(client, &op.id, Duration::from_secs(args.timeout), bars).await?;
    report["operation"] = json!(op);
    let video = match (&op.status, &video_id) {
        (OperationStatus::Succeeded, Some(v)) => Some(client.get_video(v).await?),
        _ => None,
    };
    if json_out {
        report["video"] = json!(video);
        print_json(&report);
    } else {
        println!("status     {}", operation_status_line(&op));
        if let Some(v) = &video {
            print_renditions(v, false);
        } else if let Some(r) = &op.result {
            for r in &r.renditions {
                println!("  {} {}x{}", r.name, r.width, r.height);
            }
        }
    }
    finish_operation(&op)
}

/// Follows an operation on a bar (status, progress, phase) until it ends; Ctrl-C stops waiting.
async fn follow(client: &Client, id: &OperationId, timeout: Duration, bars: bool) -> anyhow::Result<Operation> {
    let bar = if bars { ProgressBar::new(100) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("{spinner} {prefix} [{elapsed_precise}] {bar:40} {pos:>3}% {msg}").expect("valid template"));
    bar.set_prefix("transcode");
    bar.enable_steady_tick(Duration::from_millis(200));
    let r = tokio::select! {
        r = client.wait_operation(id, timeout, |o| {
            bar.set_position(o.progress as u64);
            let phase = phase_str(o.metadata.phase);
            bar.set_message(if phase.is_empty() { o.status.as_str().to_owned() } else { format!("{} · {phase}", o.status.as_str()) });
        }) => r,
        _ = interrupted() => {
            bar.abandon();
            eprintln!("\nstopped waiting; the operation goes on. Follow it again with:\n  vidctl operations wait {id}");
            return Err(Exit(130).into());
        }
    };
    bar.finish_and_clear();
    Ok(r?)
}

/// Exit status of a terminal operation: 0 when it succeeded, else its problem and 2.
fn finish_operation(op: &Operation) -> anyhow::Result<()> {
    if op.status == OperationStatus::Succeeded {
        return Ok(());
    }
    match &op.error {
        Some(p) => {
            eprintln!("operation {} {}", op.id, op.status.as_str());
            print_problem(p);
        }
        None => eprintln!("error: operation {} ended {}", op.id, op.status.as_str()),
    }
    Err(Exit(2).into())
}

// ---------------------------------------------------------------------------
// verify
// ---------------------------------------------------------------------------

fn verify(secrets: &[String], header: &[String], body_file: &Path, tolerance: u64, json_out: bool) -> anyhow::Result<()> {
    let secrets: Vec<vid_webhooks::Secret> = secrets
        .iter()
        .map(|s| vid_webhooks::Secret::parse(s.trim()).map_err(|e| anyhow::anyhow!("--secret is not a webhook secret: {e}")))
        .collect::<anyhow::Result<_>>()?;
    let headers: Vec<(String, String)> = header
        .iter()
        .map(|h| match h.split_once(':') {
            Some((name, value)) if !name.trim().is_empty() && name.trim().chars().all(|c| c.is_ascii_alphanumeric() || c == '-') => {
                (name.trim().to_ascii_lowercase(), value.trim().to_owned())
            }
            _ => ("webhook-signature".to_owned(), h.trim().to_owned()),
        })
        .collect();
    let body = std::fs::read(body_file).with_context(|| format!("reading --body-file {}", body_file.display()))?;
    let verifier = vid_webhooks::Verifier::new().with_tolerance(Duration::from_secs(if tolerance == 0 { u64::MAX / 4 } else { tolerance }));
    match verifier.verify_now(secrets.iter(), &headers, &body) {
        Ok(v) => {
            if json_out {
                print_json(
                    &json!({ "valid": true, "scheme": v.scheme.as_str(), "timestamp": v.timestamp, "message_id": v.message_id, "secret_index": v.secret_index }),
                );
            } else {
                println!(
                    "valid signature: {} format, signed {} ({}), id {}, secret #{}",
                    v.scheme.as_str(),
                    unix_time(v.timestamp),
                    v.timestamp,
                    dash(v.message_id.as_ref()),
                    v.secret_index + 1
                );
            }
            Ok(())
        }
        Err(e) => {
            if json_out {
                print_json(&json!({ "valid": false, "code": e.code(), "detail": e.to_string() }));
            }
            eprintln!("invalid: {e}\n  code: {}", e.code());
            Err(Exit(1).into())
        }
    }
}

// ---------------------------------------------------------------------------
// commands
// ---------------------------------------------------------------------------

async fn run(cli: Cli) -> anyhow::Result<()> {
    let json_out = cli.json;
    if let Command::Verify { secret, header, body_file, tolerance } = &cli.command {
        return verify(secret, header, body_file, *tolerance, json_out);
    }
    let api_url = resolve_api_url(&cli)?;
    let client = Client::new(&api_url, &resolve_api_key(&cli)?);
    let bars = std::io::IsTerminal::is_terminal(&std::io::stdout()) && !json_out;
    match cli.command {
        Command::Upload(args) => {
            let hint = resume_hint(non_empty(&cli.api_url).map(|_| api_url.as_str()), &args.file);
            upload(&client, args, json_out, bars, &hint).await?
        }
        Command::Operations(cmd) => match cmd {
            OperationCmd::Get { id } => {
                let op = client.get_operation(&id).await?;
                if json_out {
                    print_json(&op)
                } else {
                    print_operation(&op)
                }
            }
            OperationCmd::List { status, page } => {
                let p = all_pages(&page, |c| {
                    let client = &client;
                    let status = status.clone();
                    async move { client.list_operations(status.as_deref(), c.as_deref()).await }
                })
                .await?;
                if json_out {
                    print_json(&json!({ "data": p.data, "next_cursor": p.next_cursor }));
                } else {
                    table(&["OPERATION", "STATUS", "PROGRESS", "PHASE", "VIDEO", "CREATED"], &operation_rows(&p.data));
                    print_page_end(&p.next_cursor);
                }
            }
            OperationCmd::Wait { id, timeout } => {
                let op = follow(&client, &id, Duration::from_secs(timeout), bars).await?;
                if json_out {
                    print_json(&op)
                } else {
                    print_operation(&op)
                }
                finish_operation(&op)?;
            }
            OperationCmd::Cancel { id } => {
                let op = client.cancel_operation(&id).await?;
                if json_out {
                    print_json(&op);
                } else {
                    println!("cancel requested: {} is {}", op.id, operation_status_line(&op));
                }
            }
        },
        Command::Videos(cmd) => match cmd {
            VideoCmd::Get { id } => {
                let v = client.get_video(&id).await?;
                if json_out {
                    print_json(&v)
                } else {
                    print_video(&v)
                }
            }
            VideoCmd::List { page } => {
                let p = all_pages(&page, |c| {
                    let client = &client;
                    async move { client.list_videos(c.as_deref()).await }
                })
                .await?;
                if json_out {
                    print_json(&json!({ "data": p.data, "next_cursor": p.next_cursor }));
                } else {
                    let rows: Vec<Vec<String>> = p
                        .data
                        .iter()
                        .map(|v| {
                            let names: Vec<&str> = v.renditions.iter().map(|r| r.name.as_str()).collect();
                            vec![
                                v.id.to_string(),
                                v.status.as_str().into(),
                                dash(v.filename.as_ref()),
                                if names.is_empty() { "-".into() } else { names.join(",") },
                                time(&v.created_at),
                            ]
                        })
                        .collect();
                    table(&["VIDEO", "STATUS", "FILENAME", "RENDITIONS", "CREATED"], &rows);
                    print_page_end(&p.next_cursor);
                }
            }
        },
        Command::Uploads(cmd) => match cmd {
            UploadCmd::Get { id } => {
                let u = client.get_upload(&id).await?;
                if json_out {
                    print_json(&u)
                } else {
                    print_upload(&u)
                }
            }
            UploadCmd::Abort { id } => {
                client.abort_upload(&id).await?;
                if json_out {
                    print_json(&json!({ "aborted": id }));
                } else {
                    println!("aborted {id}");
                }
            }
        },
        Command::Endpoints(cmd) => endpoints(&client, cmd, json_out).await?,
        Command::Events(cmd) => match cmd {
            EventCmd::Get { id } => {
                let e = client.get_event(&id).await?;
                if json_out {
                    print_json(&e);
                } else {
                    fields(&[
                        ("event", e.id.to_string()),
                        ("type", e.type_.as_str().into()),
                        ("created", unix_time(e.created)),
                        ("subject", event_subject(&e)),
                    ]);
                    println!("\n{}", serde_json::to_string_pretty(&e).expect("serialises"));
                }
            }
            EventCmd::List { type_, created_after, created_before, page } => {
                let p = all_pages(&page, |c| {
                    let client = &client;
                    let t = type_.clone();
                    async move {
                        let filter = EventFilter { type_: t.as_deref(), created_after, created_before, limit: None, cursor: c.as_deref() };
                        client.list_events(&filter).await
                    }
                })
                .await?;
                if json_out {
                    print_json(&json!({ "data": p.data, "next_cursor": p.next_cursor }));
                } else {
                    let rows: Vec<Vec<String>> = p
                        .data
                        .iter()
                        .map(|e| vec![e.id.to_string(), e.type_.as_str().into(), unix_time(e.created), event_subject(e)])
                        .collect();
                    table(&["EVENT", "TYPE", "CREATED", "SUBJECT"], &rows);
                    print_page_end(&p.next_cursor);
                }
            }
        },
        Command::Verify { .. } => unreachable!("handled above"),
    }
    Ok(())
}

async fn endpoints(client: &Client, cmd: EndpointCmd, json_out: bool) -> anyhow::Result<()> {
    match cmd {
        EndpointCmd::Create { url, description, event_types, signature_format } => {
            let created = client
                .create_endpoint(&CreateEndpoint {
                    url,
                    description,
                    event_types: if event_types.is_empty() { None } else { Some(event_types) },
                    signature_format,
                })
                .await?;
            if json_out {
                print_json(&created);
            } else {
                print_endpoint(&created.endpoint);
                println!("secret       {}", created.secret);
                println!("(the secret is shown only now: store it to verify deliveries)");
            }
        }
        EndpointCmd::List => {
            let p = client.list_endpoints().await?;
            if json_out {
                print_json(&json!({ "data": p.data, "next_cursor": p.next_cursor }));
            } else {
                let rows: Vec<Vec<String>> = p
                    .data
                    .iter()
                    .map(|s| {
                        let e = &s.endpoint;
                        let success = s.health.success_rate.map_or_else(|| "-".into(), |r| format!("{:.0} %", r * 100.0));
                        vec![
                            e.id.to_string(),
                            endpoint_status(e),
                            success,
                            e.signature_format.as_str().into(),
                            event_types(e),
                            e.url.clone(),
                        ]
                    })
                    .collect();
                table(&["ENDPOINT", "STATUS", "SUCCESS", "SIGNATURE", "EVENTS", "URL"], &rows);
            }
        }
        EndpointCmd::Get { id } => {
            let e = client.get_endpoint(&id).await?;
            if json_out {
                print_json(&e)
            } else {
                print_endpoint(&e.endpoint);
                fields(&[("health", health_line(&e.health))]);
            }
        }
        EndpointCmd::Update { id, url, description, clear_description, event_types, all_event_types, signature_format } => {
            anyhow::ensure!(
                url.is_some()
                    || description.is_some()
                    || clear_description
                    || !event_types.is_empty()
                    || all_event_types
                    || signature_format.is_some(),
                "nothing to change: give --url, --description, --clear-description, --event-type, --all-event-types or --signature-format"
            );
            let changes = EndpointChanges {
                url: url.as_deref(),
                description: description.as_deref(),
                event_types: if event_types.is_empty() { None } else { Some(&event_types) },
                signature_format,
                clear_description,
                all_event_types,
            };
            let e = client.update_endpoint(&id, &changes).await?;
            if json_out {
                print_json(&e)
            } else {
                print_endpoint(&e)
            }
        }
        EndpointCmd::Delete { id } => {
            client.delete_endpoint(&id).await?;
            if json_out {
                print_json(&json!({ "deleted": id }));
            } else {
                println!("deleted {id}");
            }
        }
        EndpointCmd::RotateSecret { id } => {
            let r = client.rotate_endpoint_secret(&id).await?;
            if json_out {
                print_json(&r);
            } else {
                fields(&[
                    ("endpoint", vstr(&r, "id")),
                    ("secret", vstr(&r, "secret")),
                    ("old secret valid until", vstr(&r, "previous_secret_expires_at")),
                ]);
                println!("(the new secret is shown only now; deliveries carry both signatures until the old one expires)");
            }
        }
        EndpointCmd::Enable { id } => {
            let e = client.enable_endpoint(&id).await?;
            if json_out {
                print_json(&e)
            } else {
                print_endpoint(&e)
            }
        }
        EndpointCmd::Deliveries { id, status, event_type, limit, cursor } => {
            let filter = DeliveryFilter { status: status.as_deref(), event_type: event_type.as_deref(), limit, cursor: cursor.as_deref() };
            let p = client.list_deliveries(&id, &filter).await?;
            if json_out {
                print_json(&json!({ "data": p.data, "next_cursor": p.next_cursor }));
            } else {
                let rows: Vec<Vec<String>> = p.data.iter().map(delivery_row).collect();
                table(&["DELIVERY", "EVENT", "TYPE", "STATUS", "ATTEMPTS", "LAST", "NEXT ATTEMPT"], &rows);
                print_page_end(&p.next_cursor);
            }
        }
        EndpointCmd::Retry { id, delivery_id } => {
            let d = client.retry_delivery(&id, &delivery_id).await?;
            if json_out {
                print_json(&d);
            } else {
                println!("retry queued: {} is {} (attempts so far: {})", vstr(&d, "id"), vstr(&d, "status"), vstr(&d, "attempt_count"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_update_can_clear_the_description_and_the_filter() {
        let id = EndpointId::generate().to_string();
        let parse = |extra: &[&str]| {
            Cli::try_parse_from(["vidctl", "endpoints", "update", id.as_str()].iter().chain(extra)).map(|cli| match cli.command {
                Command::Endpoints(EndpointCmd::Update { clear_description, all_event_types, .. }) => (clear_description, all_event_types),
                _ => panic!("not endpoints update"),
            })
        };
        assert_eq!(parse(&["--clear-description", "--all-event-types"]).unwrap(), (true, true));
        assert_eq!(parse(&["--url", "https://a.example/"]).unwrap(), (false, false));
        assert!(parse(&["--clear-description", "--description", "x"]).is_err());
        assert!(parse(&["--all-event-types", "--event-type", "video.ready"]).is_err());
    }

    #[test]
    fn events_list_takes_rfc3339_time_bounds() {
        let parse = |extra: &[&str]| {
            Cli::try_parse_from(["vidctl", "events", "list"].iter().chain(extra)).map(|cli| match cli.command {
                Command::Events(EventCmd::List { created_after, created_before, .. }) => (created_after, created_before),
                _ => panic!("not events list"),
            })
        };
        let at = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
        assert_eq!(parse(&[]).unwrap(), (None, None));
        assert_eq!(parse(&["--created-after", "2026-01-02T03:04:05Z"]).unwrap(), (Some(at), None));
        assert_eq!(parse(&["--created-before", "2026-01-02T04:04:05+01:00"]).unwrap(), (None, Some(at)));
        for bad in ["yesterday", "2026-01-02", "2026-01-02T03:04:05", "1767323045"] {
            assert!(parse(&["--created-after", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_resume_hint_keeps_the_api_url_and_quotes() {
        assert_eq!(resume_hint(None, Path::new("movie.mp4")), "vidctl upload movie.mp4");
        assert_eq!(
            resume_hint(Some("http://10.0.0.5:8080"), Path::new("my movie's.mp4")),
            r"vidctl --api-url http://10.0.0.5:8080 upload 'my movie'\''s.mp4'"
        );
        assert_eq!(resume_hint(Some("http://h/a?b=1&c"), Path::new("m")), "vidctl --api-url 'http://h/a?b=1&c' upload m");
    }

    #[test]
    fn health_line_says_rate_count_and_last_outcome() {
        assert_eq!(health_line(&EndpointHealth::default()), "-", "nothing attempted yet");
        let at = Utc.with_ymd_and_hms(2026, 11, 30, 1, 2, 3).unwrap();
        let h = EndpointHealth {
            recent_deliveries: 8,
            recent_succeeded: 6,
            success_rate: Some(0.75),
            last_attempt_at: Some(at),
            last_attempt_status: None,
            last_attempt_error_class: Some("timeout".into()),
        };
        let line = health_line(&h);
        assert!(line.starts_with("75 % of 8 succeeded (last: timeout at "), "{line}");
        let line = health_line(&EndpointHealth { last_attempt_status: Some(503), last_attempt_error_class: Some("http".into()), ..h });
        assert!(line.contains("last: HTTP 503"), "{line}");
    }
}
