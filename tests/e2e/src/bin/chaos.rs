//! `chaos`: the chaos run of issue 11. Driven by `scripts/chaos.sh`, which
//! builds the binaries and starts a private PostgreSQL and RabbitMQ for it.
//!
//! It runs the three real services ([`vid_e2e::Stack`]) on the private
//! instances, two reference receivers (`examples/webhook-receiver`), each
//! behind a recording proxy registered as one of the tenant's two webhook
//! endpoints, and uploads N small real videos through the SDK while a seeded
//! schedule of faults runs:
//!
//! * SIGKILL of the api; of the transcoder while it holds a job; of the
//!   dispatcher while one of its requests is held open at a proxy (so it dies
//!   mid-attempt) — each restarted;
//! * a restart of RabbitMQ and of PostgreSQL (the private ones);
//! * receiver A down (process killed, port closed) for a while;
//! * receiver B answering `500` (at its proxy) for a while.
//!
//! Then, with a bounded wait, it checks that every operation succeeded, that
//! every event the api recorded reached both endpoints, that each receiver
//! applied each effect exactly once, that no delivery is left pending, and
//! that the database, the receivers' records, the proxies' records and the
//! API's answers agree; prints a report; exits 1 if any check failed.
//!
//! The same `--seed` gives the same schedule (fault order, times, upload
//! times, restart delays); what the system does in between is of course not
//! deterministic.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::sync::oneshot;
use vid_client::upload::Uploader;
use vid_client::Client;
use vid_core::endpoint::{CreateEndpoint, EndpointStatus};
use vid_core::operation::OperationStatus;
use vid_core::{EndpointId, OperationId};
use vid_e2e::{bin_dir, make_video, Stack};

/// Retry schedule the dispatcher uses in the chaos run: the test profile's
/// `[1, 1, 2]` gives up after ~4 s, far shorter than a receiver outage, so the
/// run widens it. 240 s nominal, at least 192 s with −20 % jitter: longer than
/// the longest outage (120 s), so no delivery may end `failed`.
const RETRY_SCHEDULE: &[u64] = &[1, 2, 4, 8, 15, 30, 30, 30, 30, 30, 30, 30];
/// The dispatcher's claim lease in the run (default: connect + request timeout + 15 s).
const LEASE_MS: u64 = 35_000;

#[derive(Parser, Debug)]
#[command(name = "chaos", about = "The chaos run (issue 11); use scripts/chaos.sh, which prepares its private PostgreSQL and RabbitMQ")]
struct Args {
    /// Seed of the fault schedule (random when absent; always printed).
    #[arg(long)]
    seed: Option<u64>,
    /// The short version `make test` runs (5 uploads, shorter outages).
    #[arg(long)]
    small: bool,
    /// Number of uploads (default 50, or 5 with --small).
    #[arg(long)]
    uploads: Option<usize>,
    /// The platform's (migrated) database.
    #[arg(long)]
    database_url: String,
    /// The platform's RabbitMQ.
    #[arg(long)]
    amqp_url: String,
    /// PostgreSQL server URL (no database) for the receivers' own databases.
    #[arg(long)]
    receiver_db_server: String,
    /// Directory of this run (logs go to `<run-dir>/logs`).
    #[arg(long)]
    run_dir: PathBuf,
    /// Shell command restarting the platform's PostgreSQL.
    #[arg(long)]
    postgres_restart_cmd: Option<String>,
    /// Why the PostgreSQL restart is skipped.
    #[arg(long)]
    skip_postgres_restart: Option<String>,
    /// Shell command restarting the platform's RabbitMQ.
    #[arg(long)]
    rabbitmq_restart_cmd: Option<String>,
    /// Why the RabbitMQ restart is skipped.
    #[arg(long)]
    skip_rabbitmq_restart: Option<String>,
}

/// Sizes of a run.
#[derive(Debug, Clone)]
struct Profile {
    name: &'static str,
    uploads: usize,
    /// Uploads start within the first 80 % of it; point faults happen within it.
    load: Duration,
    receiver_down: Duration,
    receiver_500: Duration,
    /// Bounded wait for the uploads' operations after the load window.
    ops_timeout: Duration,
    /// Bounded wait for the deliveries once load and faults are over.
    drain_timeout: Duration,
}

impl Profile {
    fn new(args: &Args) -> Profile {
        let mut p = if args.small {
            Profile {
                name: "small",
                uploads: 5,
                load: Duration::from_secs(70),
                receiver_down: Duration::from_secs(25),
                receiver_500: Duration::from_secs(15),
                ops_timeout: Duration::from_secs(120),
                drain_timeout: Duration::from_secs(120),
            }
        } else {
            Profile {
                name: "full",
                uploads: 50,
                load: Duration::from_secs(240),
                receiver_down: Duration::from_secs(120),
                receiver_500: Duration::from_secs(60),
                ops_timeout: Duration::from_secs(300),
                drain_timeout: Duration::from_secs(240),
            }
        };
        if let Some(n) = args.uploads {
            p.uploads = n;
        }
        p
    }
}

// ---------------------------------------------------------------------------
// The schedule.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum FaultKind {
    KillApi,
    KillTranscoder,
    KillDispatcher,
    RestartRabbitmq,
    RestartPostgres,
    ReceiverDown,
    Receiver500,
}

impl FaultKind {
    fn label(self) -> &'static str {
        match self {
            FaultKind::KillApi => "SIGKILL api, restart",
            FaultKind::KillTranscoder => "SIGKILL transcoder mid-job, restart",
            FaultKind::KillDispatcher => "SIGKILL dispatcher mid-attempt, restart",
            FaultKind::RestartRabbitmq => "restart RabbitMQ",
            FaultKind::RestartPostgres => "restart PostgreSQL",
            FaultKind::ReceiverDown => "receiver A down",
            FaultKind::Receiver500 => "receiver B answers 500",
        }
    }
}

#[derive(Debug, Clone)]
struct Planned {
    kind: FaultKind,
    /// Since the start of the load.
    at: Duration,
    /// Kills: how long the service stays down. Windows: how long they last.
    length: Duration,
}

#[derive(Debug, Clone)]
struct Schedule {
    uploads: Vec<PlannedUpload>,
    faults: Vec<Planned>,
}

#[derive(Debug, Clone)]
struct PlannedUpload {
    /// Since the start of the load.
    at: Duration,
    /// Pinned to a fault: starts this long after that fault actually began
    /// (and not before `at`), so the fault meets its work even if it slipped.
    after: Option<(FaultKind, Duration)>,
}

/// Everything random about a run, from the seed alone.
fn schedule(seed: u64, p: &Profile) -> Schedule {
    let mut rng = StdRng::seed_from_u64(seed);
    let load = p.load.as_secs_f64();
    let mut uploads: Vec<PlannedUpload> =
        (0..p.uploads).map(|_| PlannedUpload { at: Duration::from_secs_f64(rng.random_range(0.0..load * 0.8)), after: None }).collect();
    // Point faults: a random order, one in each of five equal slots of [10 %, 95 %]
    // of the load window, at a random moment of its slot; so they never overlap.
    let mut kinds =
        [FaultKind::KillApi, FaultKind::KillTranscoder, FaultKind::KillDispatcher, FaultKind::RestartRabbitmq, FaultKind::RestartPostgres];
    kinds.shuffle(&mut rng);
    let (start, end) = (load * 0.10, load * 0.95);
    let slot = (end - start) / kinds.len() as f64;
    let mut faults: Vec<Planned> = kinds
        .iter()
        .enumerate()
        .map(|(i, &kind)| {
            let at = start + slot * i as f64 + rng.random_range(0.0..slot * 0.5);
            // Kills: the service stays down this long. Restarts: the broker or
            // database stays stopped this long before it starts again.
            let length = match kind {
                FaultKind::RestartPostgres | FaultKind::RestartRabbitmq => Duration::from_secs_f64(rng.random_range(1.0..5.0)),
                _ => Duration::from_secs_f64(rng.random_range(0.5..3.0)),
            };
            Planned { kind, at: Duration::from_secs_f64(at), length }
        })
        .collect();
    // Windows: anywhere in the load window, so they overlap the point faults at random.
    let down = p.receiver_down.as_secs_f64();
    let five = p.receiver_500.as_secs_f64();
    faults.push(Planned {
        kind: FaultKind::ReceiverDown,
        at: Duration::from_secs_f64(rng.random_range(load * 0.05..(load - down).max(load * 0.05 + 1.0))),
        length: p.receiver_down,
    });
    faults.push(Planned {
        kind: FaultKind::Receiver500,
        at: Duration::from_secs_f64(rng.random_range(load * 0.05..(load - five).max(load * 0.05 + 1.0))),
        length: p.receiver_500,
    });
    // Work in flight for the faults that need it, even in a small run: one upload
    // 0.5–2 s after the start of each kill that waits for a job or an attempt
    // (the fault is then already watching for it; a job lasts about a second),
    // and one 1–2 s after the start of each receiver window.
    let pins: Vec<PlannedUpload> = faults
        .iter()
        .filter(|f| !matches!(f.kind, FaultKind::KillApi | FaultKind::RestartRabbitmq | FaultKind::RestartPostgres))
        .map(|f| {
            let delay = Duration::from_secs_f64(rng.random_range(0.5..2.0));
            PlannedUpload { at: f.at + delay, after: Some((f.kind, delay)) }
        })
        .collect();
    for (k, pin) in pins.into_iter().enumerate() {
        if let Some(u) = uploads.get_mut(k) {
            *u = pin;
        }
    }
    uploads.sort_by_key(|u| u.at);
    faults.sort_by_key(|f| f.at);
    Schedule { uploads, faults }
}

// ---------------------------------------------------------------------------
// Recording proxy in front of each receiver.
// ---------------------------------------------------------------------------

/// What a proxy did with one request.
#[derive(Debug, Clone)]
enum HitOutcome {
    /// Forwarded to the receiver, which answered `status`.
    Forwarded { status: u16, already_processed: bool },
    /// Answered 500 by the proxy (the 500 window); the receiver never saw it.
    Injected500,
    /// The receiver could not be reached; answered 502.
    ForwardFailed(String),
}

#[derive(Debug, Clone)]
struct Hit {
    event_id: String,
    /// This request was held open while the dispatcher was SIGKILLed.
    held: bool,
    outcome: HitOutcome,
}

#[derive(Default)]
struct ProxyState {
    fail_500: bool,
    hits: Vec<Hit>,
    /// Armed by the dispatcher fault: the next request is held and reported here.
    hold: Option<oneshot::Sender<String>>,
}

/// An HTTP proxy on loopback, registered as the webhook endpoint, forwarding
/// to a reference receiver. It records every request, can answer 500 instead
/// of forwarding, can hold one request open (to kill the dispatcher
/// mid-attempt), and can be taken down (listener and connections closed).
#[derive(Clone)]
struct Proxy {
    name: &'static str,
    addr: SocketAddr,
    upstream: String,
    state: Arc<Mutex<ProxyState>>,
    http: reqwest::Client,
    server: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(name: &'static str, upstream: String) -> anyhow::Result<Proxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
        let proxy = Proxy { name, addr, upstream, state: Arc::default(), http, server: Arc::default() };
        proxy.serve(listener);
        Ok(proxy)
    }

    fn url(&self) -> String {
        format!("http://{}/webhooks", self.addr)
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let this = self.clone();
        let task = tokio::spawn(async move {
            // Connection tasks live in this set: aborting the server task drops
            // the set, which aborts them, so `down` closes every connection.
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let this = this.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let this = this.clone();
                        // In its own task: a request held while the dispatcher is killed
                        // is still forwarded and recorded after its connection is gone.
                        async move {
                            let answer = tokio::spawn(async move { this.handle(req).await }).await;
                            Ok::<_, hyper::Error>(
                                answer.unwrap_or_else(|_| Response::builder().status(500).body(Full::new(Bytes::new())).unwrap()),
                            )
                        }
                    });
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
                while conns.try_join_next().is_some() {}
            }
        });
        *self.server.lock().unwrap() = Some(task);
    }

    /// Closes the port and every open connection.
    fn down(&self) {
        if let Some(t) = self.server.lock().unwrap().take() {
            t.abort();
        }
    }

    /// Listens again on the same port.
    async fn up(&self) -> anyhow::Result<()> {
        let mut tries = 0;
        let listener = loop {
            match tokio::net::TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    tracing_note(&format!("rebinding {}: {e}; retrying", self.addr));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e).with_context(|| format!("rebinding {}", self.addr)),
            }
        };
        self.serve(listener);
        Ok(())
    }

    async fn handle(&self, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let headers = req.headers().clone();
        let event_id = headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let (fail, hold) = {
            let mut s = self.state.lock().unwrap();
            (s.fail_500, s.hold.take())
        };
        let held = hold.is_some();
        if let Some(tx) = hold {
            // The dispatcher is killed while this request is open.
            let _ = tx.send(event_id.clone());
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        let (outcome, status, text) = if fail && !held {
            (HitOutcome::Injected500, 500, Bytes::from_static(b"{\"error\":\"chaos: answering 500\"}"))
        } else {
            let mut fwd = self.http.post(&self.upstream).body(body);
            for (k, v) in headers.iter() {
                if !matches!(k.as_str(), "host" | "content-length" | "connection" | "transfer-encoding") {
                    fwd = fwd.header(k.clone(), v.clone());
                }
            }
            match fwd.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let text = resp.bytes().await.unwrap_or_default();
                    let already = String::from_utf8_lossy(&text).contains("already_processed");
                    (HitOutcome::Forwarded { status, already_processed: already }, status, text)
                }
                Err(e) => {
                    (HitOutcome::ForwardFailed(e.to_string()), 502, Bytes::from(format!("{{\"error\":\"receiver unreachable: {e}\"}}")))
                }
            }
        };
        self.state.lock().unwrap().hits.push(Hit { event_id, held, outcome });
        Response::builder().status(status).header("content-type", "application/json").body(Full::new(text)).unwrap()
    }

    fn hits(&self) -> Vec<Hit> {
        self.state.lock().unwrap().hits.clone()
    }
}

// ---------------------------------------------------------------------------
// Reference receivers.
// ---------------------------------------------------------------------------

/// One `webhook-receiver` process (restartable).
struct ReceiverProc {
    name: &'static str,
    port: u16,
    database_url: String,
    amqp_url: String,
    queue: String,
    secret: String,
    log: PathBuf,
    child: Option<Child>,
    pids: PathBuf,
}

impl ReceiverProc {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/webhooks", self.port)
    }

    async fn start(&mut self) -> anyhow::Result<()> {
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

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }
}

impl Drop for ReceiverProc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn record_pid(file: &Path, pid: u32) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(file) {
        let _ = writeln!(f, "{pid}");
    }
}

/// Polls `url` until it answers 200; false after `timeout`.
async fn wait_200(url: &str, timeout: Duration) -> bool {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().expect("a reqwest client builds");
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < deadline {
        match http.get(url).send().await {
            Ok(r) if r.status().as_u16() == 200 => return true,
            Ok(r) => last = format!("HTTP {}", r.status()),
            Err(e) => last = format!("{e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing_note(&format!("{url} did not answer 200 within {timeout:?}; last: {last}"));
    false
}

fn tracing_note(msg: &str) {
    eprintln!("chaos: {msg}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn fmt_t(d: Duration) -> String {
    let s = d.as_secs_f64();
    format!("+{:02}:{:04.1}", (s / 60.0).floor() as u64, s % 60.0)
}

// ---------------------------------------------------------------------------
// SQL through psql (the test kit's way; no driver needed for a few queries).
// ---------------------------------------------------------------------------

async fn sql(url: &str, query: &str) -> anyhow::Result<Vec<Vec<String>>> {
    let out = tokio::process::Command::new("psql")
        .args(["-X", "-q", "-A", "-t", "-F", "\u{1f}", "-v", "ON_ERROR_STOP=1", url, "-c", query])
        .output()
        .await
        .context("running psql")?;
    if !out.status.success() {
        bail!("psql {query:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.split('\u{1f}').map(str::to_owned).collect())
        .collect())
}

async fn sql_count(url: &str, query: &str) -> anyhow::Result<i64> {
    let rows = sql(url, query).await?;
    rows.first().and_then(|r| r.first()).and_then(|v| v.parse().ok()).ok_or_else(|| anyhow!("no count from {query:?}"))
}

// ---------------------------------------------------------------------------
// The run.
// ---------------------------------------------------------------------------

/// A fault as it happened.
#[derive(Debug, Clone)]
struct FaultRecord {
    kind: FaultKind,
    at: Duration,
    ended: Duration,
    detail: String,
    /// Not injected, and why.
    skipped: Option<String>,
    /// Injection itself failed (a check fails).
    error: Option<String>,
}

struct Shared {
    /// Set when a fault begins (pinned uploads wait for it).
    started: HashMap<FaultKind, tokio::sync::watch::Sender<bool>>,
    stack: tokio::sync::Mutex<Stack>,
    receivers: tokio::sync::Mutex<Vec<ReceiverProc>>,
    proxies: Vec<Proxy>,
    t0: Instant,
    /// Services or receivers that exited without being killed by the run.
    findings: Mutex<Vec<String>>,
    pids: PathBuf,
}

#[derive(Debug, Default, Clone)]
struct UploadResult {
    operation: Option<OperationId>,
    status: Option<OperationStatus>,
    sdk_retries: u32,
    last_error: Option<String>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let started = Instant::now();
    let result = tokio::select! {
        r = run(args, started) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
        _ = sigterm() => Err(anyhow!("terminated")),
    };
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("chaos: run aborted: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn sigterm() {
    if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        s.recv().await;
    } else {
        std::future::pending::<()>().await
    }
}

async fn run(args: Args, started: Instant) -> anyhow::Result<bool> {
    let profile = Profile::new(&args);
    let seed = args.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        (t.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)) % 1_000_000_000
    });
    println!("chaos: {} run, {} uploads, seed {seed} (repeat with --seed {seed})", profile.name, profile.uploads);
    let sched = schedule(seed, &profile);
    let logs = args.run_dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    let pids = args.run_dir.join("children.pids");

    // Small real videos: a few distinct clips, uploaded in turn.
    let media = args.run_dir.join("media");
    std::fs::create_dir_all(&media)?;
    let variants = [(320, 180, 1.0), (426, 240, 1.5), (480, 270, 1.0), (640, 360, 1.2), (384, 216, 2.0)];
    let mut clips = Vec::new();
    for (i, (w, h, s)) in variants.iter().enumerate().take(profile.uploads.clamp(1, variants.len())) {
        let path = media.join(format!("clip{i}.mp4"));
        make_video(&path, *w, *h, *s, "400k");
        clips.push(path);
    }

    // The platform on the private instances.
    let schedule_env = RETRY_SCHEDULE.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let lease = LEASE_MS.to_string();
    let stack = Stack::start_on(
        args.database_url.clone(),
        logs.clone(),
        &[
            ("VID__AMQP__URL", &args.amqp_url),
            ("VID__DISPATCHER__RETRY_SCHEDULE_SECONDS", &schedule_env),
            ("VID__DISPATCHER__LEASE_MS", &lease),
            ("VID__TELEMETRY__LEVEL", "info,lapin=warn,aws=warn"),
            ("VID__TELEMETRY__FORMAT", "json"),
        ],
    )
    .await;
    for name in ["api", "transcoder", "webhook-dispatcher"] {
        if let Some(pid) = stack.pid(name) {
            record_pid(&pids, pid);
        }
    }
    let health = format!("{}/healthz", stack.api_url);
    if !wait_200(&health, Duration::from_secs(60)).await {
        bail!("the api did not answer {health}; see {}", stack.log_dir().display());
    }
    let ready = stack.env_value("VID__TRANSCODER__HEALTH_LISTEN").map(|a| format!("http://{a}/readyz")).unwrap_or_default();
    if !wait_200(&ready, Duration::from_secs(60)).await {
        bail!("the transcoder is not ready ({ready}); see {}", stack.log_dir().display());
    }
    let client = stack.client();
    let t0 = Instant::now();
    println!("chaos: load starts now, {} UTC (fault times below are from here)", chrono::Utc::now().format("%H:%M:%S"));

    // Two receivers, each behind its proxy, each the target of one endpoint.
    let db_name = args.database_url.rsplit('/').next().unwrap_or("vid").to_owned();
    let run_id = format!("chaos{}", ulid::Ulid::new().to_string().to_ascii_lowercase());
    let mut receivers = Vec::new();
    let mut proxies = Vec::new();
    let mut endpoints: Vec<EndpointId> = Vec::new();
    for name in ["a", "b"] {
        let port = free_port();
        let proxy = Proxy::start(if name == "a" { "A" } else { "B" }, format!("http://127.0.0.1:{port}/webhooks")).await?;
        let ep = client
            .create_endpoint(&CreateEndpoint {
                url: proxy.url(),
                description: Some(format!("chaos receiver {name}")),
                event_types: None,
                signature_format: None,
            })
            .await
            .map_err(|e| anyhow!("creating endpoint {name}: {e}"))?;
        endpoints.push(ep.endpoint.id.clone());
        let mut r = ReceiverProc {
            name: if name == "a" { "A" } else { "B" },
            port,
            database_url: format!("{}/{db_name}_receiver_{name}", args.receiver_db_server),
            amqp_url: args.amqp_url.clone(),
            queue: format!("receivertest.{run_id}.{name}.events"),
            secret: ep.secret.clone(),
            log: logs.join(format!("receiver-{name}.log")),
            child: None,
            pids: pids.clone(),
        };
        r.start().await?;
        assert_eq!(proxy.upstream, r.url());
        receivers.push(r);
        proxies.push(proxy);
    }

    print_schedule(&sched, &args);
    let fault_started = [
        FaultKind::KillApi,
        FaultKind::KillTranscoder,
        FaultKind::KillDispatcher,
        FaultKind::RestartRabbitmq,
        FaultKind::RestartPostgres,
        FaultKind::ReceiverDown,
        FaultKind::Receiver500,
    ]
    .into_iter()
    .map(|k| (k, tokio::sync::watch::channel(false).0))
    .collect();
    let shared = Arc::new(Shared {
        started: fault_started,
        stack: tokio::sync::Mutex::new(stack),
        receivers: tokio::sync::Mutex::new(receivers),
        proxies,
        t0,
        findings: Mutex::default(),
        pids: pids.clone(),
    });

    // Load, faults and a watchdog, concurrently.
    let load_deadline = t0 + profile.load + profile.ops_timeout;
    let mut uploads = Vec::new();
    for (i, planned) in sched.uploads.iter().enumerate() {
        let client = client.clone();
        let clip = clips[i % clips.len()].clone();
        let state_dir = args.run_dir.join("upload-state").join(i.to_string());
        let at = t0 + planned.at;
        let pinned = planned.after.map(|(kind, delay)| (shared.started[&kind].subscribe(), delay));
        uploads.push(tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            if let Some((mut started, delay)) = pinned {
                // Wait for the fault to begin (a dropped sender: go on), then the delay.
                if !*started.borrow() {
                    let _ = started.wait_for(|s| *s).await;
                    tokio::time::sleep(delay).await;
                }
            }
            upload_one(&client, &clip, &state_dir, load_deadline).await
        }));
    }
    let injector = {
        let shared = shared.clone();
        let faults = sched.faults.clone();
        let restart_pg = match (&args.postgres_restart_cmd, &args.skip_postgres_restart) {
            (Some(c), None) => Ok(c.clone()),
            (_, Some(why)) => Err(why.clone()),
            (None, None) => Err("no --postgres-restart-cmd given".to_owned()),
        };
        let restart_mq = match (&args.rabbitmq_restart_cmd, &args.skip_rabbitmq_restart) {
            (Some(c), None) => Ok(c.clone()),
            (_, Some(why)) => Err(why.clone()),
            (None, None) => Err("no --rabbitmq-restart-cmd given".to_owned()),
        };
        tokio::spawn(async move { inject_all(shared, faults, restart_pg, restart_mq).await })
    };
    let watchdog = {
        let shared = shared.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                watch_processes(&shared).await;
            }
        })
    };

    let mut results = Vec::new();
    for u in uploads {
        results.push(u.await.unwrap_or_else(|e| UploadResult { last_error: Some(format!("task failed: {e}")), ..Default::default() }));
    }
    let faults = injector.await.context("fault injector")?;
    let load_done = t0.elapsed();
    println!(
        "chaos: load done at {} ({} uploads), faults done; waiting for the deliveries (at most {:?})",
        fmt_t(load_done),
        results.len(),
        profile.drain_timeout
    );

    // Bounded wait until every event reached both receivers and nothing is pending.
    let db = args.database_url.clone();
    let receiver_dbs: Vec<String> = shared.receivers.lock().await.iter().map(|r| r.database_url.clone()).collect();
    let drain_deadline = Instant::now() + profile.drain_timeout;
    let mut last_state;
    loop {
        match drain_state(&db, &receiver_dbs, endpoints.len()).await {
            Ok((true, s)) => {
                last_state = s;
                break;
            }
            Ok((false, s)) => last_state = s,
            Err(e) => last_state = format!("{e:#}"),
        }
        if Instant::now() > drain_deadline {
            println!("chaos: bounded wait over; state: {last_state}");
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let drained_at = t0.elapsed();
    println!("chaos: settled at {} ({last_state})", fmt_t(drained_at));
    watch_processes(&shared).await;
    watchdog.abort();

    let report = verify(&shared, &client, &db, &receiver_dbs, &endpoints, &results, &faults).await;
    let ok = report.print(&profile, seed, &faults, started.elapsed(), &args.run_dir, drained_at);

    // Stop everything (the stack's Drop kills the services).
    for r in shared.receivers.lock().await.iter_mut() {
        r.kill();
    }
    for p in &shared.proxies {
        p.down();
    }
    Ok(ok)
}

fn print_schedule(s: &Schedule, args: &Args) {
    println!("chaos: schedule (times from the start of the load):");
    for f in &s.faults {
        let mut line = format!("  {}  {}", fmt_t(f.at), f.kind.label());
        match f.kind {
            FaultKind::ReceiverDown | FaultKind::Receiver500 => line.push_str(&format!(" for {:.0} s", f.length.as_secs_f64())),
            FaultKind::RestartPostgres if args.skip_postgres_restart.is_some() => line.push_str(" (will be skipped)"),
            FaultKind::RestartRabbitmq if args.skip_rabbitmq_restart.is_some() => line.push_str(" (will be skipped)"),
            FaultKind::RestartPostgres | FaultKind::RestartRabbitmq => {
                line.push_str(&format!(" (stopped {:.1} s)", f.length.as_secs_f64()))
            }
            _ => line.push_str(&format!(" (down {:.1} s)", f.length.as_secs_f64())),
        }
        println!("{line}");
    }
    if let (Some(first), Some(last)) = (s.uploads.first(), s.uploads.last()) {
        let pinned = s.uploads.iter().filter(|u| u.after.is_some()).count();
        println!(
            "  uploads start between {} and {} ({pinned} of them just after a fault that needs work in flight begins)",
            fmt_t(first.at),
            fmt_t(last.at)
        );
    }
}

/// One upload through the SDK, retried (resuming the same upload) until it is
/// accepted, then followed until its operation is terminal.
async fn upload_one(client: &Client, clip: &Path, state_dir: &Path, deadline: Instant) -> UploadResult {
    let mut r = UploadResult::default();
    let _ = std::fs::create_dir_all(state_dir);
    let op = loop {
        match Uploader::new(client).state_dir(Some(state_dir.to_path_buf())).upload_file(clip, Some("video/mp4")).await {
            Ok(accepted) => break accepted.operation.id,
            Err(e) => {
                r.sdk_retries += 1;
                r.last_error = Some(e.to_string());
                if Instant::now() > deadline {
                    return r;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    r.operation = Some(op.clone());
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
        match client.wait_operation(&op, left.min(Duration::from_secs(60)), |_| {}).await {
            Ok(o) => {
                r.status = Some(o.status);
                return r;
            }
            Err(e) => {
                if Instant::now() > deadline {
                    r.last_error = Some(e.to_string());
                    return r;
                }
                if !matches!(e, vid_client::ClientError::Timeout(_)) {
                    r.sdk_retries += 1;
                    r.last_error = Some(e.to_string());
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

/// Records services or receivers that exited although the run did not kill them.
async fn watch_processes(shared: &Shared) {
    let mut found = Vec::new();
    {
        let mut stack = shared.stack.lock().await;
        for name in ["api", "transcoder", "webhook-dispatcher"] {
            if let Some(status) = stack.exited(name) {
                found.push(format!(
                    "{} {name} exited by itself ({status}); see {}/{name}.log",
                    fmt_t(shared.t0.elapsed()),
                    stack.log_dir().display()
                ));
                // Restarted so the run can go on; the finding fails the run.
                stack.kill(name);
                stack.spawn(leak(name));
                if let Some(pid) = stack.pid(name) {
                    record_pid(&shared.pids, pid);
                }
            }
        }
    }
    {
        let mut receivers = shared.receivers.lock().await;
        for r in receivers.iter_mut() {
            if let Some(status) = r.exited() {
                found.push(format!(
                    "{} receiver {} exited by itself ({status}); see {}",
                    fmt_t(shared.t0.elapsed()),
                    r.name,
                    r.log.display()
                ));
                r.kill();
                let _ = r.start().await;
            }
        }
    }
    if !found.is_empty() {
        for f in &found {
            println!("chaos: FINDING: {f}");
        }
        shared.findings.lock().unwrap().extend(found);
    }
}

fn leak(name: &str) -> &'static str {
    match name {
        "api" => "api",
        "transcoder" => "transcoder",
        _ => "webhook-dispatcher",
    }
}

/// Runs the faults in order, each at its time (or when the previous one is
/// over, if later). Windows run in the background; point faults in sequence.
async fn inject_all(
    shared: Arc<Shared>,
    faults: Vec<Planned>,
    restart_pg: Result<String, String>,
    restart_mq: Result<String, String>,
) -> Vec<FaultRecord> {
    let mut records = Vec::new();
    let mut windows = Vec::new();
    for f in faults {
        tokio::time::sleep_until((shared.t0 + f.at).into()).await;
        match f.kind {
            FaultKind::ReceiverDown | FaultKind::Receiver500 => {
                let shared = shared.clone();
                windows.push(tokio::spawn(async move { window(&shared, &f).await }));
            }
            FaultKind::RestartPostgres => records.push(restart(&shared, &f, &restart_pg).await),
            FaultKind::RestartRabbitmq => records.push(restart(&shared, &f, &restart_mq).await),
            FaultKind::KillApi | FaultKind::KillTranscoder | FaultKind::KillDispatcher => records.push(kill(&shared, &f).await),
        }
    }
    for w in windows {
        if let Ok(r) = w.await {
            records.push(r);
        }
    }
    records.sort_by_key(|r| r.at);
    records
}

async fn restart(shared: &Shared, f: &Planned, cmd: &Result<String, String>) -> FaultRecord {
    let kind = f.kind;
    let at = shared.t0.elapsed();
    let mut rec = FaultRecord { kind, at, ended: at, detail: String::new(), skipped: None, error: None };
    let cmd = match cmd {
        Ok(c) => c,
        Err(why) => {
            rec.skipped = Some(why.clone());
            println!("chaos: {} {}: SKIPPED ({why})", fmt_t(at), kind.label());
            return rec;
        }
    };
    println!("chaos: {} {} ...", fmt_t(at), kind.label());
    shared.started[&kind].send_replace(true);
    // The command gets the seconds to stay stopped as its last argument.
    let cmd = format!("{cmd} {:.1}", f.length.as_secs_f64());
    let out = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new("bash").args(["-c", &cmd]).stdin(Stdio::null()).output(),
    )
    .await;
    rec.ended = shared.t0.elapsed();
    match out {
        Ok(Ok(o)) if o.status.success() => {
            rec.detail =
                format!("stopped, kept down {:.1} s, started again; {:.1} s in all", f.length.as_secs_f64(), (rec.ended - at).as_secs_f64())
        }
        Ok(Ok(o)) => rec.error = Some(format!("restart command failed ({}): {}", o.status, String::from_utf8_lossy(&o.stderr).trim())),
        Ok(Err(e)) => rec.error = Some(format!("restart command did not run: {e}")),
        Err(_) => rec.error = Some("restart command took more than 180 s".into()),
    }
    println!("chaos: {} {}: {}", fmt_t(rec.ended), kind.label(), rec.error.as_deref().unwrap_or(&rec.detail));
    rec
}

async fn kill(shared: &Shared, f: &Planned) -> FaultRecord {
    let name: &'static str = match f.kind {
        FaultKind::KillApi => "api",
        FaultKind::KillTranscoder => "transcoder",
        _ => "webhook-dispatcher",
    };
    let mut detail = String::new();
    match f.kind {
        // Wait (at most 60 s) until the transcoder holds a job: its work dir has `<operation id>/`.
        FaultKind::KillTranscoder => {
            let work = shared.stack.lock().await.transcoder_work_dir();
            shared.started[&f.kind].send_replace(true);
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let job = std::fs::read_dir(&work).ok().and_then(|d| {
                    d.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).find(|n| n.starts_with("op_"))
                });
                if let Some(op) = job {
                    detail = format!("mid-job ({op} in its work dir)");
                    break;
                }
                if Instant::now() > deadline {
                    detail = "no job in flight within 60 s: killed idle".into();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // Hold the next webhook request at either proxy, and kill while it is open.
        FaultKind::KillDispatcher => {
            let mut rxs = Vec::new();
            for p in &shared.proxies {
                let (tx, rx) = oneshot::channel();
                p.state.lock().unwrap().hold = Some(tx);
                rxs.push(Box::pin(rx));
            }
            shared.started[&f.kind].send_replace(true);
            let first = tokio::time::timeout(Duration::from_secs(60), futures::future::select_all(rxs)).await;
            for p in &shared.proxies {
                p.state.lock().unwrap().hold = None;
            }
            detail = match first {
                Ok((Ok(event), i, _)) => format!("mid-attempt (delivery of {event} held open at proxy {})", shared.proxies[i].name),
                _ => "no attempt in flight within 60 s: killed idle".into(),
            };
        }
        _ => {}
    }
    shared.started[&f.kind].send_replace(true);
    let at = shared.t0.elapsed();
    {
        let mut stack = shared.stack.lock().await;
        stack.kill(name);
    }
    println!("chaos: {} SIGKILL {name} {detail}", fmt_t(at));
    tokio::time::sleep(f.length).await;
    let mut error = None;
    {
        let mut stack = shared.stack.lock().await;
        stack.spawn(name);
        if let Some(pid) = stack.pid(name) {
            record_pid(&shared.pids, pid);
        }
        let health = match name {
            "api" => Some(format!("{}/healthz", stack.api_url)),
            "transcoder" => stack.env_value("VID__TRANSCODER__HEALTH_LISTEN").map(|a| format!("http://{a}/readyz")),
            _ => None,
        };
        if let Some(url) = health {
            if !wait_200(&url, Duration::from_secs(120)).await {
                error = Some(format!("the restarted {name} did not answer 200 on {url} within 120 s"));
            }
        }
    }
    let ended = shared.t0.elapsed();
    println!("chaos: {} restarted {name} (down {:.1} s)", fmt_t(ended), (ended - at).as_secs_f64());
    FaultRecord {
        kind: f.kind,
        at,
        ended,
        detail: format!("{detail}; restarted after {:.1} s", (ended - at).as_secs_f64()),
        skipped: None,
        error,
    }
}

async fn window(shared: &Shared, f: &Planned) -> FaultRecord {
    let at = shared.t0.elapsed();
    let mut error = None;
    match f.kind {
        FaultKind::ReceiverDown => {
            let proxy = &shared.proxies[0];
            proxy.down();
            shared.receivers.lock().await[0].kill();
            println!("chaos: {} receiver A down (process SIGKILLed, port closed) for {:.0} s", fmt_t(at), f.length.as_secs_f64());
            shared.started[&f.kind].send_replace(true);
            tokio::time::sleep(f.length).await;
            if let Err(e) = shared.receivers.lock().await[0].start().await {
                error = Some(format!("receiver A did not come back: {e:#}"));
            }
            if let Err(e) = proxy.up().await {
                error = Some(format!("proxy A did not come back: {e:#}"));
            }
        }
        _ => {
            let proxy = &shared.proxies[1];
            proxy.state.lock().unwrap().fail_500 = true;
            println!("chaos: {} receiver B answers 500 for {:.0} s", fmt_t(at), f.length.as_secs_f64());
            shared.started[&f.kind].send_replace(true);
            tokio::time::sleep(f.length).await;
            proxy.state.lock().unwrap().fail_500 = false;
        }
    }
    let ended = shared.t0.elapsed();
    println!("chaos: {} {} over", fmt_t(ended), f.kind.label());
    FaultRecord { kind: f.kind, at, ended, detail: format!("for {:.1} s", (ended - at).as_secs_f64()), skipped: None, error }
}

/// `(settled, summary)`: settled when the outbox is empty, every event has a
/// delivery per endpoint, none is pending, and each receiver processed every event.
async fn drain_state(db: &str, receiver_dbs: &[String], endpoints: usize) -> anyhow::Result<(bool, String)> {
    let outbox = sql_count(db, "SELECT count(*) FROM outbox").await?;
    let events = sql_count(db, "SELECT count(*) FROM events").await?;
    let deliveries = sql_count(db, "SELECT count(*) FROM webhook_deliveries").await?;
    let pending = sql_count(db, "SELECT count(*) FROM webhook_deliveries WHERE status <> 'succeeded'").await?;
    let ops_open = sql_count(db, "SELECT count(*) FROM operations WHERE status IN ('pending','running')").await?;
    let mut seen = Vec::new();
    for r in receiver_dbs {
        seen.push(sql_count(r, "SELECT count(*) FROM seen_events").await.unwrap_or(-1));
    }
    let settled =
        outbox == 0 && ops_open == 0 && deliveries == events * endpoints as i64 && pending == 0 && seen.iter().all(|s| *s >= events);
    Ok((settled, format!("events {events}, outbox {outbox}, open operations {ops_open}, deliveries {deliveries} ({pending} not succeeded), receivers processed {seen:?}")))
}

// ---------------------------------------------------------------------------
// Checks and report.
// ---------------------------------------------------------------------------

struct Check {
    name: String,
    ok: bool,
    detail: String,
}

#[derive(Default)]
struct Report {
    checks: Vec<Check>,
    uploads: usize,
    accepted: usize,
    succeeded: usize,
    sdk_retries: u32,
    events: usize,
    deliveries: i64,
    attempts: i64,
    attempt_classes: BTreeMap<String, i64>,
    dup_received: BTreeMap<&'static str, (usize, usize)>,
    dup_effects: i64,
    lost: i64,
    max_delivery_secs: f64,
    requests: BTreeMap<&'static str, usize>,
}

impl Report {
    fn check(&mut self, name: &str, ok: bool, detail: impl Into<String>) {
        self.checks.push(Check { name: name.to_owned(), ok, detail: detail.into() });
    }

    fn print(&self, p: &Profile, seed: u64, faults: &[FaultRecord], wall: Duration, run_dir: &Path, settled: Duration) -> bool {
        let ok = self.checks.iter().all(|c| c.ok);
        println!();
        println!("=================== chaos report ({} run) ===================", p.name);
        println!("seed            {seed}   (repeat: scripts/chaos.sh{} --seed {seed})", if p.name == "small" { " --small" } else { "" });
        println!(
            "uploads         {} started, {} accepted, {} succeeded ({} SDK calls retried)",
            self.uploads, self.accepted, self.succeeded, self.sdk_retries
        );
        println!("faults injected (time from the start of the load):");
        for f in faults {
            let what = if let Some(s) = &f.skipped {
                format!("SKIPPED: {s}")
            } else if let Some(e) = &f.error {
                format!("ERROR: {e}")
            } else {
                f.detail.clone()
            };
            println!("  {} – {}  {:<40} {what}", fmt_t(f.at), fmt_t(f.ended), f.kind.label());
        }
        println!("events          {} recorded by the api, delivered to 2 endpoints", self.events);
        println!(
            "deliveries      {} ({} attempts, {} retries; attempts by outcome: {})",
            self.deliveries,
            self.attempts,
            self.attempts - self.deliveries,
            self.attempt_classes.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
        );
        println!("requests seen   {}", self.requests.iter().map(|(k, v)| format!("endpoint {k}: {v}")).collect::<Vec<_>>().join(", "));
        println!(
            "duplicates rcvd {}   (requests for an event the receiver had already accepted; harmless)",
            self.dup_received
                .iter()
                .map(|(k, (d, a))| format!("receiver {k}: {d} ({a} answered already_processed)"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!("dup. effects    {}   (must be 0)", self.dup_effects);
        println!("lost events     {}   (must be 0)", self.lost);
        println!("slowest delivery {:.1} s from event to receipt; settled at {}", self.max_delivery_secs, fmt_t(settled));
        println!("wall time       {:.1} s ({:.1} min)", wall.as_secs_f64(), wall.as_secs_f64() / 60.0);
        println!("checks:");
        for c in &self.checks {
            println!(
                "  [{}] {}{}",
                if c.ok { "PASS" } else { "FAIL" },
                c.name,
                if c.detail.is_empty() { String::new() } else { format!(" — {}", c.detail) }
            );
        }
        println!("logs            {}", run_dir.join("logs").display());
        println!("result          {}", if ok { "PASSED" } else { "FAILED" });
        println!("===============================================================");
        ok
    }
}

async fn all_pages<T, F, Fut>(mut fetch: F) -> anyhow::Result<Vec<T>>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<vid_client::Page<T>, vid_client::ClientError>>,
{
    let mut out = Vec::new();
    let mut cursor = None;
    for _ in 0..1000 {
        let page = fetch(cursor.clone()).await.map_err(|e| anyhow!("{e}"))?;
        out.extend(page.data);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok(out),
        }
    }
    bail!("more than 1000 pages")
}

#[allow(clippy::too_many_arguments)]
async fn verify(
    shared: &Shared,
    client: &Client,
    db: &str,
    receiver_dbs: &[String],
    endpoints: &[EndpointId],
    results: &[UploadResult],
    faults: &[FaultRecord],
) -> Report {
    let mut rep = Report { uploads: results.len(), ..Default::default() };
    match verify_inner(&mut rep, shared, client, db, receiver_dbs, endpoints, results, faults).await {
        Ok(()) => {}
        Err(e) => rep.check("the checks could run", false, format!("{e:#}")),
    }
    rep
}

#[allow(clippy::too_many_arguments)]
async fn verify_inner(
    rep: &mut Report,
    shared: &Shared,
    client: &Client,
    db: &str,
    receiver_dbs: &[String],
    endpoints: &[EndpointId],
    results: &[UploadResult],
    faults: &[FaultRecord],
) -> anyhow::Result<()> {
    // --- uploads and operations -----------------------------------------
    rep.accepted = results.iter().filter(|r| r.operation.is_some()).count();
    rep.sdk_retries = results.iter().map(|r| r.sdk_retries).sum();
    let errors: Vec<String> = results.iter().filter(|r| r.operation.is_none()).filter_map(|r| r.last_error.clone()).collect();
    rep.check(
        "every upload accepted through the SDK",
        rep.accepted == results.len(),
        if errors.is_empty() { String::new() } else { format!("last errors: {errors:?}") },
    );
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    let mut api_ops = HashMap::new();
    for r in results {
        if let Some(id) = &r.operation {
            let op = client.get_operation(id).await.map_err(|e| anyhow!("GET /operations/{id}: {e}"))?;
            *by_status.entry(op.status.as_str().to_owned()).or_default() += 1;
            api_ops.insert(id.as_str().to_owned(), op);
        }
    }
    rep.succeeded = by_status.get("succeeded").copied().unwrap_or(0);
    rep.check(
        "every operation terminal and succeeded (API)",
        rep.succeeded == results.len(),
        format!("{by_status:?}{}", {
            let failed: Vec<String> = api_ops
                .values()
                .filter(|o| o.status != OperationStatus::Succeeded)
                .map(|o| format!("{} {:?}", o.id, o.error.as_ref().map(|p| p.code.clone())))
                .collect();
            if failed.is_empty() {
                String::new()
            } else {
                format!("; not succeeded: {failed:?}")
            }
        }),
    );
    let db_ops = sql(db, "SELECT id, status FROM operations").await?;
    let db_succeeded = db_ops.iter().filter(|r| r[1] == "succeeded").count();
    let listed = all_pages(|c| async move { client.list_operations(None, c.as_deref()).await }).await?;
    let db_ids: HashSet<&str> = db_ops.iter().map(|r| r[0].as_str()).collect();
    let listed_ids: HashSet<&str> = listed.iter().map(|o| o.id.as_str()).collect();
    let ours: HashSet<&str> = api_ops.keys().map(String::as_str).collect();
    rep.check(
        "operations: database, GET /operations and the uploads agree",
        db_ops.len() == results.len() && db_succeeded == results.len() && db_ids == listed_ids && listed_ids == ours,
        format!("database {} ({} succeeded), listed {}, uploads {}", db_ops.len(), db_succeeded, listed.len(), ours.len()),
    );

    // --- events -----------------------------------------------------------
    let db_events = sql(db, "SELECT id, event_type FROM events ORDER BY id").await?;
    let api_events = all_pages(|c| async move {
        let filter = vid_client::EventFilter { cursor: c.as_deref(), ..Default::default() };
        client.list_events(&filter).await
    })
    .await?;
    let db_event_ids: HashSet<String> = db_events.iter().map(|r| r[0].clone()).collect();
    let api_event_ids: HashSet<String> = api_events.iter().map(|e| e.id.as_str().to_owned()).collect();
    rep.events = db_event_ids.len();
    let mut types: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &db_events {
        *types.entry(r[1].as_str()).or_default() += 1;
    }
    rep.check(
        "events: database and GET /events agree",
        db_event_ids == api_event_ids && !db_event_ids.is_empty(),
        format!("database {}, API {}; {types:?}", db_event_ids.len(), api_event_ids.len()),
    );
    let ready_events: HashSet<String> = db_events.iter().filter(|r| r[1] == "video.ready").map(|r| r[0].clone()).collect();
    rep.check(
        "one video.ready event per upload",
        ready_events.len() == results.len(),
        format!("{} video.ready events", ready_events.len()),
    );

    // --- deliveries (database) --------------------------------------------
    let deliveries = sql(
        db,
        "SELECT endpoint_id, event_id, status, attempt_count, extract(epoch FROM (updated_at - created_at)) FROM webhook_deliveries",
    )
    .await?;
    rep.deliveries = deliveries.len() as i64;
    let mut status_count: BTreeMap<String, usize> = BTreeMap::new();
    let mut delivered: HashMap<&str, HashSet<&str>> = HashMap::new();
    for d in &deliveries {
        *status_count.entry(d[2].clone()).or_default() += 1;
        if d[2] == "succeeded" {
            delivered.entry(d[0].as_str()).or_default().insert(d[1].as_str());
        }
        rep.max_delivery_secs = rep.max_delivery_secs.max(d[4].parse().unwrap_or(0.0));
    }
    // (endpoint index, event id) pairs missing from any record: the lost events.
    let mut lost: HashSet<(usize, String)> = HashSet::new();
    let mut lost_db = 0;
    for (i, ep) in endpoints.iter().enumerate() {
        let got = delivered.get(ep.as_str());
        for e in db_event_ids.iter().filter(|e| !got.is_some_and(|g| g.contains(e.as_str()))) {
            lost_db += 1;
            lost.insert((i, e.clone()));
        }
    }
    rep.check(
        "every event delivered (succeeded) to each endpoint (dispatcher's records)",
        lost_db == 0 && deliveries.len() == db_event_ids.len() * endpoints.len(),
        format!("{} deliveries for {} events × {} endpoints; {lost_db} missing", deliveries.len(), db_event_ids.len(), endpoints.len()),
    );
    rep.check(
        "no delivery left pending, failed or paused after the retry schedule",
        status_count.keys().all(|s| s == "succeeded"),
        format!("{status_count:?} (schedule {RETRY_SCHEDULE:?} s, ≤ {:.0} s with jitter)", RETRY_SCHEDULE.iter().sum::<u64>() as f64 * 1.2),
    );
    let attempts =
        sql(db, "SELECT coalesce(response_status::text, error_class, 'other'), count(*) FROM webhook_attempts GROUP BY 1 ORDER BY 1")
            .await?;
    for a in &attempts {
        let n: i64 = a[1].parse().unwrap_or(0);
        rep.attempts += n;
        let class = match a[0].parse::<u16>() {
            Ok(s) => format!("HTTP {s}"),
            Err(_) => a[0].clone(),
        };
        *rep.attempt_classes.entry(class).or_default() += n;
    }
    let attempt_sum: i64 = deliveries.iter().map(|d| d[3].parse::<i64>().unwrap_or(0)).sum();
    rep.check(
        "attempt counts agree with the attempt log",
        attempt_sum == rep.attempts,
        format!("Σ attempt_count {attempt_sum}, webhook_attempts rows {}", rep.attempts),
    );

    // --- deliveries (API) ---------------------------------------------------
    let mut api_delivery_total = 0;
    let mut api_attempts_total = 0;
    let mut api_not_succeeded = 0;
    for ep in endpoints {
        let list = all_pages(|c| async move {
            client
                .list_deliveries(
                    ep,
                    &vid_client::resources::DeliveryFilter { limit: Some(100), cursor: c.as_deref(), ..Default::default() },
                )
                .await
        })
        .await?;
        api_delivery_total += list.len();
        api_not_succeeded += list.iter().filter(|d| d["status"] != "succeeded").count();
        api_attempts_total += list.iter().map(|d| d["attempts"].as_array().map_or(0, Vec::len)).sum::<usize>();
        let e = client.get_endpoint(ep).await.map_err(|e| anyhow!("GET endpoint {ep}: {e}"))?.endpoint;
        rep.check(&format!("endpoint {ep} still enabled"), e.status == EndpointStatus::Enabled, e.disabled_reason.unwrap_or_default());
    }
    rep.check(
        "GET …/deliveries agrees with the database",
        api_delivery_total == deliveries.len() && api_not_succeeded == 0 && api_attempts_total as i64 == rep.attempts,
        format!("API {api_delivery_total} deliveries ({api_not_succeeded} not succeeded), {api_attempts_total} attempts"),
    );

    // --- what the endpoints received (proxies) --------------------------------
    for (i, p) in shared.proxies.iter().enumerate() {
        let hits = p.hits();
        rep.requests.insert(p.name, hits.len());
        let mut accepted: HashSet<&str> = HashSet::new();
        let mut dups = 0;
        let mut already = 0;
        for h in &hits {
            if let HitOutcome::Forwarded { status, already_processed } = &h.outcome {
                if accepted.contains(h.event_id.as_str()) {
                    dups += 1;
                }
                if *already_processed {
                    already += 1;
                }
                if (200..300).contains(status) {
                    accepted.insert(h.event_id.as_str());
                }
            }
        }
        rep.dup_received.insert(p.name, (dups, already));
        let missing: Vec<&String> = db_event_ids.iter().filter(|e| !accepted.contains(e.as_str())).collect();
        lost.extend(missing.iter().map(|e| (i, (*e).clone())));
        let held = hits.iter().filter(|h| h.held).count();
        let injected = hits.iter().filter(|h| matches!(h.outcome, HitOutcome::Injected500)).count();
        let unreachable: Vec<&str> = hits
            .iter()
            .filter_map(|h| match &h.outcome {
                HitOutcome::ForwardFailed(e) => Some(e.as_str()),
                _ => None,
            })
            .collect();
        rep.check(
            &format!("endpoint {} accepted every event at least once (proxy's record)", p.name),
            missing.is_empty(),
            format!(
                "{} requests, {injected} answered 500 by the fault, {held} held for the dispatcher kill, {} found the receiver unreachable{}; missing {:?}",
                hits.len(),
                unreachable.len(),
                unreachable.first().map(|e| format!(" (e.g. {e})")).unwrap_or_default(),
                missing.iter().take(5).collect::<Vec<_>>()
            ),
        );
    }

    // --- receivers ---------------------------------------------------------
    let api_videos = all_pages(|c| async move { client.list_videos(c.as_deref()).await }).await?;
    let db_videos = sql(db, "SELECT id, status, version FROM videos").await?;
    let db_video: HashMap<&str, (&str, i64)> =
        db_videos.iter().map(|r| (r[0].as_str(), (r[1].as_str(), r[2].parse().unwrap_or(-1)))).collect();
    let api_agree = api_videos.len() == db_videos.len()
        && api_videos.iter().all(|v| db_video.get(v.id.as_str()).is_some_and(|(s, ver)| *s == v.status.as_str() && *ver == v.version));
    rep.check(
        "videos: database and GET /videos agree, all ready",
        api_agree && api_videos.len() == results.len() && api_videos.iter().all(|v| v.status.as_str() == "ready"),
        format!("API {}, database {}", api_videos.len(), db_videos.len()),
    );
    for (i, rdb) in receiver_dbs.iter().enumerate() {
        let name = ["A", "B"].get(i).copied().unwrap_or("?");
        let seen = sql(rdb, "SELECT event_id, outcome FROM seen_events").await?;
        let seen_ids: HashSet<&str> = seen.iter().map(|r| r[0].as_str()).collect();
        let missing_ids: Vec<&String> = db_event_ids.iter().filter(|e| !seen_ids.contains(e.as_str())).collect();
        let missing = missing_ids.len();
        lost.extend(missing_ids.into_iter().map(|e| (i, e.clone())));
        let unknown = seen_ids.iter().filter(|e| !db_event_ids.contains(**e)).count();
        let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &seen {
            *outcomes.entry(r[1].as_str()).or_default() += 1;
        }
        rep.check(
            &format!("receiver {name} processed every event once (seen_events = the api's events)"),
            missing == 0 && unknown == 0,
            format!("{} processed {outcomes:?}; {missing} missing, {unknown} unknown", seen.len()),
        );
        let dup = sql_count(
            rdb,
            "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM applied_effects GROUP BY event_id HAVING count(*) > 1) d",
        )
        .await?;
        rep.dup_effects += dup;
        let effects = sql(rdb, "SELECT event_id, event_type FROM applied_effects").await?;
        let ready_applied: HashMap<&str, usize> = effects.iter().filter(|e| e[1] == "video.ready").fold(HashMap::new(), |mut m, e| {
            *m.entry(e[0].as_str()).or_default() += 1;
            m
        });
        let ready_once = ready_events.iter().all(|e| ready_applied.get(e.as_str()) == Some(&1));
        let stale_with_effect =
            sql_count(rdb, "SELECT count(*) FROM applied_effects a JOIN seen_events s USING (event_id) WHERE s.outcome <> 'applied'")
                .await?;
        rep.check(
            &format!("receiver {name} applied each effect exactly once"),
            dup == 0 && ready_once && stale_with_effect == 0,
            format!("{} effects, {dup} duplicate, every video.ready applied once: {ready_once}, effects of non-applied events: {stale_with_effect}", effects.len()),
        );
        let rv = sql(rdb, "SELECT video_id, status, version FROM videos").await?;
        let agree = rv.len() == api_videos.len()
            && rv
                .iter()
                .all(|r| api_videos.iter().any(|v| v.id.as_str() == r[0] && v.status.as_str() == r[1] && v.version.to_string() == r[2]));
        rep.check(
            &format!("receiver {name}'s videos agree with GET /videos (status and version)"),
            agree,
            format!("receiver {} videos, API {}", rv.len(), api_videos.len()),
        );
    }
    rep.lost = lost.len() as i64;

    // --- the system itself ------------------------------------------------------
    let outbox = sql_count(db, "SELECT count(*) FROM outbox").await?;
    rep.check("outbox drained", outbox == 0, format!("{outbox} rows"));
    let findings = shared.findings.lock().unwrap().clone();
    rep.check("no service or receiver exited unless killed by the run", findings.is_empty(), findings.join("; "));
    let down_refused = sql_count(
        db,
        &format!(
            "SELECT count(*) FROM webhook_attempts WHERE endpoint_id = '{}' AND response_status IS NULL",
            endpoints.first().map(EndpointId::as_str).unwrap_or("")
        ),
    )
    .await?;
    let injected_500: usize =
        shared.proxies.iter().map(|p| p.hits().iter().filter(|h| matches!(h.outcome, HitOutcome::Injected500)).count()).sum();
    let windows_ran = faults.iter().any(|f| f.kind == FaultKind::ReceiverDown) && faults.iter().any(|f| f.kind == FaultKind::Receiver500);
    rep.check(
        "the receiver faults met deliveries (A refused attempts, B answered 500)",
        windows_ran && down_refused > 0 && injected_500 > 0,
        format!("{down_refused} attempts to A failed without an HTTP answer, {injected_500} answered 500 at B"),
    );
    let bad: Vec<String> = faults.iter().filter_map(|f| f.error.as_ref().map(|e| format!("{}: {e}", f.kind.label()))).collect();
    rep.check("every fault injected or skipped with a reason", bad.is_empty(), bad.join("; "));
    let idle: Vec<&str> = faults.iter().filter(|f| f.detail.contains("killed idle")).map(|f| f.kind.label()).collect();
    rep.check(
        "kills hit work in flight (mid-job, mid-attempt)",
        idle.is_empty(),
        if idle.is_empty() { String::new() } else { format!("idle: {idle:?}") },
    );
    let log_dir = shared.stack.lock().await.log_dir().to_path_buf();
    let mut panics = Vec::new();
    for entry in std::fs::read_dir(&log_dir)?.filter_map(Result::ok) {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let n = text.lines().filter(|l| l.contains("panicked")).count();
        if n > 0 {
            panics.push(format!("{}: {n}", entry.file_name().to_string_lossy()));
        }
    }
    rep.check("no panic in any log", panics.is_empty(), panics.join(", "));
    Ok(())
}
