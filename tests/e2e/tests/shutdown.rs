//! Graceful shutdown with a real SIGTERM (issue 8, item 3), on the real binaries.
//!
//! - api: a streaming request in flight when SIGTERM arrives is finished with
//!   a complete, proper response (its operation changes AFTER the signal, so
//!   the answer can only come from the stopping process); new connections
//!   are refused meanwhile; the process exits 0.
//! - transcoder, grace over: SIGTERM mid-transcode kills the child and
//!   requeues the job; after a restart the operation ends `succeeded`, with
//!   exactly one terminal event.
//! - transcoder, within the grace period, SIGTERM sent to the whole process
//!   tree (as a container runtime or systemd stopping a cgroup does): the
//!   `work` child ignores it, the job finishes and is reported once, then
//!   the process exits 0.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use vid_client::upload::Uploader;
use vid_core::operation::OperationStatus;
use vid_core::OperationId;
use vid_e2e::{make_video, metric_value, temp_dir, Stack};

/// Uploads a generated clip and returns its operation id.
async fn upload(stack: &Stack, width: u32, height: u32, seconds: f32) -> OperationId {
    let dir = temp_dir();
    let source = dir.join("source.mp4");
    make_video(&source, width, height, seconds, "2M");
    let accepted = Uploader::new(&stack.client()).parallel(2).state_dir(None).upload_file(&source, None).await.expect("upload completes");
    assert_eq!(accepted.operation.status, OperationStatus::Pending);
    accepted.operation.id
}

/// The pids whose parent is `pid` (from `/proc/*/stat`).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // `pid (comm) state ppid …`; comm may contain spaces and parentheses.
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
        if after.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()) == Some(pid) {
            out.push(child);
        }
    }
    out
}

/// Waits until the transcoder runs a `transcoder work` child; returns its pid.
async fn wait_for_work_child(transcoder: u32, log_dir: &Path) -> u32 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        for c in children_of(transcoder) {
            let cmdline = std::fs::read(format!("/proc/{c}/cmdline")).unwrap_or_default();
            if cmdline.split(|b| *b == 0).any(|a| a == b"work") {
                return c;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "no work child appeared; logs in {}", log_dir.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `GET <base>/healthz` answers 200.
async fn wait_until_up(base: &str) {
    let http = vid_client::Client::new(base, "");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = http.http().get(format!("{base}/healthz")).send().await {
            if r.status().is_success() {
                return;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "{base} did not come up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn psql(database_url: &str, sql: &str) -> String {
    let out = Command::new("psql").args([database_url, "-Atc", sql]).output().expect("psql runs");
    assert!(out.status.success(), "psql failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// `(video.ready, video.failed, video.cancelled)` events recorded for the operation's video.
fn terminal_events(stack: &Stack, op: &OperationId) -> (i64, i64, i64) {
    assert!(op.as_str().chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    let sql = format!(
        "SELECT count(*) FILTER (WHERE e.event_type = 'video.ready'), count(*) FILTER (WHERE e.event_type = 'video.failed'), \
         count(*) FILTER (WHERE e.event_type = 'video.cancelled') \
         FROM events e JOIN operations o ON o.video_id = e.resource_id WHERE o.id = '{op}'"
    );
    let row = psql(&stack.database_url, &sql);
    let v: Vec<i64> = row.split('|').map(|n| n.parse().unwrap()).collect();
    (v[0], v[1], v[2])
}

/// Long-lived requests are never cut by a shutdown: after SIGTERM a `:wait`
/// on an operation that does not move answers `timeout` with its current
/// state, and an event stream ends cleanly, both once
/// `[api] stream_drain_seconds` (2 s here) have passed; then the api exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_sigterm_ends_waits_and_event_streams_cleanly() {
    let mut stack = Stack::start(&[("VID__API__STREAM_DRAIN_SECONDS", "2")]).await;
    stack.kill("transcoder"); // the operation stays pending
    let op = upload(&stack, 320, 240, 1.0).await;
    let client = stack.client();
    let mut events = client.operation_events(&op, None).await.expect("stream opens").expect("not terminal yet");
    let first = events.next().await.expect("first event").expect("an event");
    assert_eq!(first.operation.status, OperationStatus::Pending);
    let waiting = {
        let client = client.clone();
        let op = op.clone();
        let key = stack.api_key.clone();
        tokio::spawn(async move {
            client
                .http()
                .post(format!("{}/operations/{op}:wait", client.base_url()))
                .bearer_auth(key)
                .json(&serde_json::json!({ "timeout_seconds": 60 }))
                .send()
                .await
        })
    };
    // The wait must be open (accepted by the api) before SIGTERM; the api
    // gives no signal of that, so allow a generous margin for a loaded machine.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stack.terminate("api");

    let answer = waiting.await.unwrap().expect("the :wait gets an answer, not a cut connection");
    assert_eq!(answer.status(), 200);
    let body: serde_json::Value = answer.json().await.expect("a complete JSON body");
    assert_eq!(body["reason"], "timeout", "{body}");
    assert_eq!(body["operation"]["status"], "pending", "{body}");
    assert!(events.next().await.expect("the stream ends cleanly, not cut").is_none(), "no event after the first");
    let status = stack.wait_exit("api", Duration::from_secs(30)).await.expect("the api exits once they ended");
    assert!(status.success(), "api exit status {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_sigterm_finishes_the_request_in_flight_and_refuses_new_connections() {
    // The open stream may take up to 28 s (below actix's 30 s shutdown
    // timeout) to see the operation end: a cold transcoder on a loaded machine
    // needs that long, and the default 20 s drain would end the stream first.
    let mut stack =
        Stack::start(&[("VID__TELEMETRY__FORMAT", "json"), ("VID__TELEMETRY__LEVEL", "info"), ("VID__API__STREAM_DRAIN_SECONDS", "28")])
            .await;
    // No transcoder yet: the operation stays pending until we decide.
    stack.kill("transcoder");
    let op = upload(&stack, 320, 240, 1.0).await;
    let client = stack.client();

    // A request id given by the caller comes back and is in the api's log.
    let resp = client.http().get(format!("{}/healthz", stack.api_url)).header("X-Request-Id", "e2e-shutdown-probe-1").send().await.unwrap();
    assert_eq!(resp.headers()["x-request-id"], "e2e-shutdown-probe-1");
    let resp = client.http().get(format!("{}/healthz", stack.api_url)).send().await.unwrap();
    assert!(resp.headers()["x-request-id"].to_str().unwrap().starts_with("req_"), "a request id is made when none is given");

    // The slow request: the operation's event stream, open until the operation ends.
    // Its first event arrived, so the api is serving it.
    let mut events = client.operation_events(&op, None).await.expect("stream opens").expect("not terminal yet");
    let first = events.next().await.expect("first event").expect("an event");
    assert_eq!(first.operation.status, OperationStatus::Pending);

    stack.terminate("api");

    // New connections are refused while the stream is still open (nothing
    // can end it before the transcoder starts, below).
    let port: u16 = stack.api_url.rsplit(':').next().unwrap().parse().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
            _ => {}
        }
        assert!(tokio::time::Instant::now() < deadline, "the api still accepts connections after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(stack.exited("api").is_none(), "the api must still be finishing the open stream");

    // Now let the operation finish: the stopping api still consumes the
    // transcoder's reports and streams every change to the open request.
    stack.spawn("transcoder");
    let mut last = first.operation;
    while let Some(ev) = events.next().await.expect("the stream ends cleanly, not cut") {
        last = ev.operation;
    }
    assert_eq!(last.status, OperationStatus::Succeeded, "the in-flight stream saw the end; logs in {}", stack.log_dir().display());

    let status = stack.wait_exit("api", Duration::from_secs(60)).await.expect("the api exits after its last request");
    assert!(status.success(), "api exit status {status}");

    let log = stack.log_of("api");
    assert!(log.contains(r#""request_id":"e2e-shutdown-probe-1""#), "the request id is logged:\n{log}");
    assert!(log.contains("api stopped"), "{log}");
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
    }

    // A fresh api sees the same final state.
    stack.spawn("api");
    wait_until_up(&stack.api_url).await;
    let op_now = client.wait_operation(&op, Duration::from_secs(30), |_| {}).await.expect("api back");
    assert_eq!(op_now.status, OperationStatus::Succeeded);
    assert_eq!(terminal_events(&stack, &op), (1, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transcoder_sigterm_mid_transcode_requeues_the_job_and_it_succeeds_once_after_a_restart() {
    // Grace 0: the running job is killed and requeued at once.
    let mut stack = Stack::start(&[("VID__TRANSCODER__SHUTDOWN_GRACE_SECONDS", "0"), ("VID__TELEMETRY__LEVEL", "info")]).await;
    stack.wait_transcoder_ready(Duration::from_secs(60)).await;
    let op = upload(&stack, 1280, 720, 30.0).await;
    let transcoder = stack.pid("transcoder").unwrap();
    let child = wait_for_work_child(transcoder, stack.log_dir()).await;

    stack.terminate("transcoder");
    let status = stack.wait_exit("transcoder", Duration::from_secs(60)).await.expect("the transcoder exits");
    assert!(status.success(), "transcoder exit status {status}");
    assert!(!Path::new(&format!("/proc/{child}")).exists(), "the work child is gone");
    let log = stack.log_of("transcoder");
    assert!(log.contains("job requeued for shutdown"), "the job was requeued, not finished:\n{log}");
    let now = stack.client().get_operation(&op).await.unwrap();
    assert!(!now.status.is_terminal(), "a shutdown must not end the operation: {:?} {:?}", now.status, now.error);
    assert_eq!(terminal_events(&stack, &op), (0, 0, 0));

    // A new transcoder picks the requeued job up and finishes it.
    stack.spawn("transcoder");
    let done = stack.client().wait_operation(&op, Duration::from_secs(600), |_| {}).await.expect("operation ends");
    assert_eq!(done.status, OperationStatus::Succeeded, "{:?}; logs in {}", done.error, stack.log_dir().display());
    assert_eq!(terminal_events(&stack, &op), (1, 0, 0), "exactly one terminal event");

    // The new process counted the job it finished.
    let page = stack.client().http().get(format!("{}/metrics", stack.transcoder_health_url())).send().await.unwrap().text().await.unwrap();
    assert_eq!(metric_value(&page, "transcode_jobs_total", &[("outcome", "succeeded")]), 1.0, "{page}");
    assert!(metric_value(&page, "transcode_duration_seconds_count", &[("rendition", "720p")]) >= 1.0, "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transcoder_sigterm_to_the_whole_process_tree_finishes_the_job_within_the_grace_period() {
    let mut stack = Stack::start(&[("VID__TRANSCODER__SHUTDOWN_GRACE_SECONDS", "300"), ("VID__TELEMETRY__LEVEL", "info")]).await;
    stack.wait_transcoder_ready(Duration::from_secs(60)).await;
    let op = upload(&stack, 640, 360, 10.0).await;
    let transcoder = stack.pid("transcoder").unwrap();
    let child = wait_for_work_child(transcoder, stack.log_dir()).await;

    // Like `docker stop` of a shell entrypoint or systemd's KillMode=control-group:
    // every process of the service gets the SIGTERM, the work child included.
    let status = Command::new("kill").args(["-TERM", &child.to_string()]).status().unwrap();
    assert!(status.success());
    stack.terminate("transcoder");

    let status = stack.wait_exit("transcoder", Duration::from_secs(600)).await.expect("the transcoder exits after the job");
    assert!(status.success(), "transcoder exit status {status}");
    let done = stack.client().wait_operation(&op, Duration::from_secs(60), |_| {}).await.expect("operation ends");
    assert_eq!(
        done.status,
        OperationStatus::Succeeded,
        "the job finished during the grace period: {:?}; logs in {}",
        done.error,
        stack.log_dir().display()
    );
    assert_eq!(terminal_events(&stack, &op), (1, 0, 0), "exactly one terminal event");
    let log = stack.log_of("transcoder");
    assert!(!log.contains("job requeued for shutdown"), "{log}");
}
