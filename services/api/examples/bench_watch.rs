//! Issue 12 performance: holds N concurrent `GET /operations/{id}/events`
//! streams on a real `api` process (release build, started here as a child
//! against a fresh database), and reports
//! - the api's resident memory per open stream (VmRSS before/after), and
//! - the time from a committed change (`domain::operation::apply` returned,
//!   i.e. its COMMIT was acknowledged) to the event arriving on the stream,
//!   p50/p99 over M changes made one at a time.
//!
//! Figures only, no assertions. Run through `scripts/bench-watch.sh`:
//! `bench_watch <path to api binary> [streams=1000] [changes=200]`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::task::JoinHandle;
use vid_core::operation::Phase;
use vid_core::{OperationId, TenantId, UploadId, VideoId};
use vid_db::RunQueryDsl;

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).expect("VmRSS")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn create_operations(db: &vid_db::Pool, tenant: &TenantId, n: usize) -> Vec<OperationId> {
    use diesel::sql_types::Text;
    let mut conn = db.get().await.unwrap();
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        let (upload, video, op) = (UploadId::generate(), VideoId::generate(), OperationId::generate());
        diesel::sql_query(
            "WITH u AS (INSERT INTO uploads (id, tenant_id, status, size_bytes, content_type, part_size, part_count, storage_key, s3_upload_id, expires_at)
                        VALUES ($1, $2, 'completed', 1, 'video/mp4', 1, 1, 'k', 's', now() + interval '1 day')),
                  v AS (INSERT INTO videos (id, tenant_id, upload_id, operation_id, status, content_type, source_key)
                        VALUES ($3, $2, $1, $4, 'processing', 'video/mp4', 'k'))
             INSERT INTO operations (id, tenant_id, video_id, status, phase) VALUES ($4, $2, $3, 'pending', 'queued')",
        )
        .bind::<Text, _>(upload.as_str())
        .bind::<Text, _>(tenant.as_str())
        .bind::<Text, _>(video.as_str())
        .bind::<Text, _>(op.as_str())
        .execute(&mut conn)
        .await
        .unwrap();
        ops.push(op);
    }
    ops
}

/// `(path to the api binary, streams, changes)` from the command line.
fn parse_args() -> (String, usize, usize) {
    let mut args = std::env::args().skip(1);
    let api_bin = args.next().expect("usage: bench_watch <api binary> [streams] [changes]");
    let streams: usize = args.next().map(|s| s.parse().unwrap()).unwrap_or(1000);
    let changes: usize = args.next().map(|s| s.parse().unwrap()).unwrap_or(200);
    (api_bin, streams, changes)
}

/// Starts the api binary on `port` against `database_url` and amqp `prefix`,
/// allowing `streams` (+100) watchers per tenant. stdout is discarded.
fn spawn_api(api_bin: &str, database_url: &str, prefix: &str, port: u16, streams: usize) -> Child {
    let root = vid_testkit::repo_root();
    let mut cmd = Command::new(api_bin);
    cmd.current_dir(&root).stdout(Stdio::null()).stderr(Stdio::inherit());
    for (k, v) in vid_testkit::stack_env() {
        cmd.env(k, v);
    }
    cmd.env("VID_PROFILE", "test")
        .env("VID_CONFIG_DIR", root.join("config"))
        .env("VID__DATABASE__URL", database_url)
        .env("VID__AMQP__PREFIX", prefix)
        .env("VID__API__LISTEN", format!("127.0.0.1:{port}"))
        .env("VID__OPERATIONS__MAX_WATCHERS_PER_TENANT", (streams + 100).to_string());
    cmd.spawn().expect("start the api")
}

/// Waits (up to 30 s) until the api answers `GET /healthz`.
async fn wait_healthy(client: &vid_client::Client) {
    let started = Instant::now();
    while client.raw(vid_client::HttpMethod::GET, "/healthz", None).await.is_err() {
        assert!(started.elapsed() < Duration::from_secs(30), "api did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `(stream index, event revision, arrival)` of every event received.
type Arrivals = tokio::sync::mpsc::UnboundedSender<(usize, i64, Instant)>;

/// Opens a stream on every operation (64 connecting at a time) and checks its
/// first event is revision 0; each stream's task then forwards its events to
/// `tx`. Returns the tasks' handles and the time it took to open them all.
// Opening a stream yields the JoinHandle of its forwarding task on purpose: the
// handles are collected and joined once every stream is open.
#[allow(clippy::async_yields_async)]
async fn open_streams(client: &vid_client::Client, ops: &[OperationId], tx: &Arrivals) -> (Vec<JoinHandle<()>>, Duration) {
    let opening = Instant::now();
    let opened: Vec<_> = futures::stream::iter(ops.iter().cloned().enumerate())
        .map(|(i, op)| {
            let (client, tx) = (client.clone(), tx.clone());
            async move {
                let mut events = client.operation_events(&op, None).await.unwrap().unwrap();
                let first = events.next().await.unwrap().unwrap();
                assert_eq!(first.id, Some(0));
                tokio::spawn(async move {
                    while let Ok(Some(event)) = events.next().await {
                        if tx.send((i, event.id.unwrap_or(-1), Instant::now())).is_err() {
                            return;
                        }
                    }
                })
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    (opened, opening.elapsed())
}

/// One committed change at a time on a spread of the open streams; returns
/// the sorted times from each COMMIT to its event arriving on the stream.
async fn measure_changes(
    db: &vid_db::Pool,
    outbox: &vid_api::store::outbox::Outbox,
    ops: &[OperationId],
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(usize, i64, Instant)>,
    changes: usize,
) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(changes);
    for n in 0..changes {
        let i = (n * 7919) % ops.len();
        let percent = (1 + n / ops.len()).min(99) as u8;
        let mut conn = db.get().await.unwrap();
        let progress = vid_api::domain::operation::Transition::Progress { phase: Some(Phase::Transcoding), percent };
        vid_api::domain::operation::apply(&mut conn, outbox, &ops[i], progress).await.unwrap();
        drop(conn);
        let committed = Instant::now();
        loop {
            let (j, _rev, at) = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("event in time").unwrap();
            if j == i {
                latencies.push(at.saturating_duration_since(committed));
                break;
            }
        }
    }
    latencies.sort();
    latencies
}

/// Prints the figures (`latencies` sorted, not empty; RSS in KiB).
fn report(opened: &[JoinHandle<()>], open_time: Duration, rss_before: u64, rss_after: u64, latencies: &[Duration]) {
    let still_open = opened.iter().filter(|h| !h.is_finished()).count();
    let delta = rss_after.saturating_sub(rss_before);
    println!("open streams:               {} (all open at the end: {})", opened.len(), still_open);
    println!("time to open them:          {:.2} s (64 connecting at a time)", open_time.as_secs_f64());
    println!("api VmRSS before / after:   {rss_before} KiB / {rss_after} KiB");
    println!("memory per open stream:     {:.1} KiB  (goal < 50 KiB)", delta as f64 / opened.len() as f64);
    println!(
        "commit -> event received:   p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {} changes  (goal p99 < 100 ms)",
        percentile(latencies, 0.50).as_secs_f64() * 1e3,
        percentile(latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().unwrap().as_secs_f64() * 1e3,
        latencies.len()
    );
}

#[tokio::main]
async fn main() {
    let (api_bin, streams, changes) = parse_args();

    let database_url = vid_testkit::fresh_database().await;
    let prefix = vid_testkit::unique_prefix();
    let port = free_port();
    let mut child = spawn_api(&api_bin, &database_url, &prefix, port, streams);
    let pid = child.id();

    #[derive(serde::Deserialize)]
    struct Db {
        database: vid_infra::settings::DatabaseSettings,
    }
    let settings: Db = vid_testkit::settings(&[("database.url", database_url.as_str())]);
    let db = vid_db::pool(&settings.database).unwrap();
    let (tenant, key) = vid_api::auth::create_tenant(&db, "bench").await.unwrap();
    let outbox = vid_api::store::outbox::Outbox::new(vid_infra::amqp::Topology::new(&prefix));
    let client = vid_client::Client::new(&format!("http://127.0.0.1:{port}"), &key);
    wait_healthy(&client).await;
    let ops = create_operations(&db, &tenant, streams).await;

    // Warm up (code paths, pools, allocator), then measure the idle baseline.
    for op in ops.iter().take(20) {
        let mut events = client.operation_events(op, None).await.unwrap().unwrap();
        events.next().await.unwrap().unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before = rss_kib(pid);

    // Open every stream; each forwards (index, revision, arrival) of its events.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, i64, Instant)>();
    let (opened, open_time) = open_streams(&client, &ops, &tx).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after = rss_kib(pid);

    let latencies = measure_changes(&db, &outbox, &ops, &mut rx, changes).await;
    report(&opened, open_time, rss_before, rss_after, &latencies);
    let _ = child.kill();
    let _ = child.wait();
}
