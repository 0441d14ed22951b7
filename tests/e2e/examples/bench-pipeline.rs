//! Benchmark (not a test): the overhead of the pipeline around the transcode,
//! over N small uploads through the real api, transcoder and
//! webhook-dispatcher. `scripts/bench-pipeline.sh` builds and runs it (against
//! release binaries by default); it is an example, not a test, so `cargo test`
//! never runs it. It asserts nothing about time; it fails (panics) only when a
//! measurement is missing.
//!
//! - webhook `video.ready` received − the transcoder's Succeeded report emitted;
//! - the transcoder's Started report − the 202 of `POST /uploads/{id}/complete`.
//!
//! Usage: `VID_BENCH_PIPELINE=<uploads> bench-pipeline` (default 10). The
//! service binaries are taken from `$CARGO_TARGET_DIR/debug` (see `vid_e2e::bin_dir`).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use vid_client::upload::Uploader;
use vid_client::Client;
use vid_core::endpoint::CreateEndpoint;
use vid_core::event::EventType;
use vid_e2e::{make_video, temp_dir, Receiver, Stack};

/// How long any one operation may take before the run gives up (not a speed goal).
const TERMINAL_TIMEOUT: Duration = Duration::from_secs(900);

/// One upload: its operation id, the 202 of `complete`, the webhook's arrival.
struct Run {
    id: String,
    accepted_at: DateTime<Utc>,
    hook_at: DateTime<Utc>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let n: usize = std::env::var("VID_BENCH_PIPELINE").ok().and_then(|n| n.parse().ok()).unwrap_or(10).max(1);
    let dir = temp_dir();
    let source = dir.join("small.mp4");
    make_video(&source, 320, 240, 1.0, "300k");
    // JSON logs with the transcoder's debug line written just before each report is published.
    let stack = Stack::start(&[("VID__TELEMETRY__FORMAT", "json"), ("RUST_LOG", "warn,vid_transcoder::worker=debug")]).await;
    stack.wait_transcoder_ready(Duration::from_secs(120)).await;
    let client = stack.client();
    let receiver = Receiver::start(200).await;
    client
        .create_endpoint(&CreateEndpoint {
            url: receiver.url(),
            description: None,
            event_types: Some(vec![EventType::VideoReady]),
            signature_format: None,
        })
        .await
        .expect("endpoint registers");

    // One at a time, so nothing waits in a queue behind another upload.
    let mut runs = Vec::new();
    for i in 0..n {
        runs.push(upload_and_wait(&stack, &client, &receiver, &source).await);
        eprintln!("upload {}/{n}: {}", i + 1, runs[i].id);
    }
    // The transcoder writes its log lines asynchronously; give the last ones time to land.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = stack.log_dir().join("transcoder.log");
    let reports = report_times(&std::fs::read_to_string(&log).expect("the transcoder's log"));
    print_overhead(&runs, &reports, &log);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Uploads `source` and waits for its `video.ready` webhook at `receiver`.
async fn upload_and_wait(stack: &Stack, client: &Client, receiver: &Receiver, source: &Path) -> Run {
    let op = Uploader::new(client).parallel(2).state_dir(None).upload_file(source, None).await.expect("upload").operation;
    let accepted_at = Utc::now(); // the 202 of `complete` just arrived
    let id = op.id.to_string();
    let deadline = Instant::now() + TERMINAL_TIMEOUT;
    loop {
        let hit = receiver.received.lock().unwrap().iter().any(|r| {
            serde_json::from_slice::<serde_json::Value>(&r.body).map(|b| b["data"]["operation_id"] == id.as_str()).unwrap_or(false)
        });
        if hit {
            return Run { id, accepted_at, hook_at: Utc::now() };
        }
        assert!(Instant::now() < deadline, "no video.ready webhook for {id}; logs in {}", stack.log_dir().display());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The transcoder's `report` log lines: (operation, `started` | `succeeded`) → timestamp.
fn report_times(log: &str) -> HashMap<(String, &'static str), DateTime<Utc>> {
    let mut reports = HashMap::new();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if v["message"] != "report" {
            continue;
        }
        let kind = v["kind"].as_str().unwrap_or("");
        let kind: &'static str = if kind.starts_with("Started") {
            "started"
        } else if kind.starts_with("Succeeded") {
            "succeeded"
        } else {
            continue;
        };
        let op = v["span"]["operation_id"].as_str().or_else(|| v["spans"][0]["operation_id"].as_str()).unwrap_or("").to_owned();
        let Some(ts) = v["timestamp"].as_str().and_then(|t| DateTime::parse_from_rfc3339(t).ok()) else { continue };
        reports.entry((op, kind)).or_insert(ts.with_timezone(&Utc));
    }
    reports
}

/// Prints each upload's three intervals and the two medians.
fn print_overhead(runs: &[Run], reports: &HashMap<(String, &'static str), DateTime<Utc>>, log: &Path) {
    let ms = |d: TimeDelta| d.num_microseconds().unwrap_or(0) as f64 / 1000.0;
    let (mut after_succeeded, mut to_started) = (Vec::new(), Vec::new());
    for Run { id, accepted_at, hook_at } in runs {
        let (Some(started), Some(succeeded)) = (reports.get(&(id.clone(), "started")), reports.get(&(id.clone(), "succeeded"))) else {
            panic!("no Started/Succeeded report lines for {id} in {}", log.display());
        };
        after_succeeded.push(ms(*hook_at - *succeeded));
        to_started.push(ms(*started - *accepted_at));
        eprintln!(
            "{id}: 202→Started {:>8.1} ms   Started→Succeeded {:>8.1} ms   Succeeded→webhook {:>8.1} ms",
            ms(*started - *accepted_at),
            ms(*succeeded - *started),
            ms(*hook_at - *succeeded)
        );
    }
    println!("pipeline overhead over {} uploads (binaries in {}):", runs.len(), vid_e2e::bin_dir().display());
    println!("  median webhook received − Succeeded emitted: {:.1} ms   (goal < 300 ms)", median(&mut after_succeeded));
    println!("  median transcoder Started − 202 of complete: {:.1} ms", median(&mut to_started));
}

/// The median of `v` (sorted in place); the mean of the middle two for an even count.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}
