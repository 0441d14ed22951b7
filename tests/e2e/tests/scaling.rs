//! Scaling proof on one machine (issue 8, item 8).
//!
//! The same batch of six uploads runs twice, on fresh databases and
//! prefixes: once against one replica of each service, once against TWO
//! replicas of each (api ×2 on two ports, transcoder ×2, webhook-dispatcher
//! ×2, one broker, one database), the uploads alternating between the two
//! apis, webhooks to a loopback receiver. Both runs must show:
//! every operation `succeeded`; every event delivered once (one delivery row
//! per event, one attempt row per delivery, one receipt per `Webhook-Id`);
//! and the same per-upload results (renditions, event types). The two-replica
//! run must also show the work spread: each api served completes, each
//! transcoder finished jobs (read from each process's own `/metrics`), and
//! the JSON logs of both apis and both transcoders carry each upload's
//! operation id as `correlation_id`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use vid_client::upload::Uploader;
use vid_client::Client;
use vid_core::endpoint::CreateEndpoint;
use vid_core::operation::OperationStatus;
use vid_core::OperationId;
use vid_e2e::{make_video, metric_value, temp_dir, Receiver, Stack};

const UPLOADS: usize = 6;

/// What one upload led to, comparable across runs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct UploadResult {
    status: OperationStatus,
    /// `(name, width, height)`, sorted.
    renditions: Vec<(String, u32, u32)>,
    /// Event types recorded for the video, sorted.
    events: Vec<String>,
}

/// Six small clips of three shapes (made once, used by both runs).
fn clips() -> Vec<PathBuf> {
    let dir = temp_dir();
    (0..UPLOADS)
        .map(|i| {
            let (w, h) = [(320, 240), (640, 360), (480, 270)][i % 3];
            let path = dir.join(format!("clip{i}.mp4"));
            make_video(&path, w, h, 2.0 + (i % 2) as f32, "1M");
            path
        })
        .collect()
}

fn psql(database_url: &str, sql: &str) -> Vec<Vec<String>> {
    let out = Command::new("psql").args([database_url, "-AtF", "\t", "-c", sql]).output().expect("psql runs");
    assert!(out.status.success(), "psql failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().filter(|l| !l.is_empty()).map(|l| l.split('\t').map(str::to_owned).collect()).collect()
}

async fn get_text(url: &str) -> String {
    let http = Client::new("http://127.0.0.1", "");
    let resp = http.http().get(url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(resp.status().as_u16(), 200, "GET {url}");
    resp.text().await.unwrap()
}

async fn wait_up(url: &str) {
    let http = Client::new("http://127.0.0.1", "");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = http.http().get(url).send().await {
            if r.status().is_success() {
                return;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "{url} never answered 200");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the batch on `stack` through `apis` (uploads alternate between
/// them); checks delivery and returns each upload's result and operation id.
async fn run_batch(stack: &Stack, apis: &[String], clips: &[PathBuf]) -> Vec<(OperationId, UploadResult)> {
    let receiver = Receiver::start(200).await;
    stack
        .client()
        .create_endpoint(&CreateEndpoint { url: receiver.url(), description: None, event_types: None, signature_format: None })
        .await
        .expect("endpoint registers");

    let mut tasks = Vec::new();
    for (i, clip) in clips.iter().enumerate() {
        let client = Client::new(&apis[i % apis.len()], &stack.api_key);
        let clip = clip.clone();
        tasks.push(tokio::spawn(async move {
            Uploader::new(&client).parallel(2).state_dir(None).upload_file(&clip, None).await.expect("upload completes")
        }));
    }
    let mut ops = Vec::new();
    for t in tasks {
        ops.push(t.await.unwrap().operation.id);
    }

    let client = stack.client();
    let mut results = Vec::new();
    for op in &ops {
        let done = client.wait_operation(op, Duration::from_secs(600), |_| {}).await.expect("operation ends");
        assert_eq!(done.status, OperationStatus::Succeeded, "{op}: {:?}; logs in {}", done.error, stack.log_dir().display());
        let video = client.get_video(&done.result.as_ref().unwrap().video_id).await.unwrap();
        let mut renditions: Vec<_> = video.renditions.iter().map(|r| (r.name.clone(), r.width, r.height)).collect();
        renditions.sort();
        let rows = psql(&stack.database_url, &format!("SELECT event_type FROM events WHERE resource_id = '{}' ORDER BY 1", video.id));
        let events = rows.into_iter().map(|r| r[0].clone()).collect();
        results.push((op.clone(), UploadResult { status: done.status, renditions, events }));
    }

    // Every event reaches the receiver (webhooks lag the operation a little).
    let events = psql(&stack.database_url, "SELECT id FROM events ORDER BY id");
    assert!(events.len() >= UPLOADS, "at least one event per upload: {events:?}");
    for e in &events {
        let id = e[0].clone();
        receiver
            .wait_for(Duration::from_secs(120), |r| r.headers.get("webhook-id") == Some(&id))
            .await
            .unwrap_or_else(|| panic!("event {id} never delivered; logs in {}", stack.log_dir().display()));
    }
    // ... once each, by one delivery with one attempt.
    let mut receipts: HashMap<String, usize> = HashMap::new();
    for r in receiver.received.lock().unwrap().iter() {
        *receipts.entry(r.headers.get("webhook-id").cloned().unwrap_or_default()).or_default() += 1;
    }
    let repeated: Vec<_> = receipts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeated.is_empty(), "events received more than once: {repeated:?}");
    assert_eq!(receipts.len(), events.len(), "one receipt per event, nothing else: {receipts:?}");
    // Deliveries are settled by the attempt's transaction, just after the receiver answered.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let deliveries = loop {
        let rows = psql(&stack.database_url, "SELECT event_id, status, attempt_count FROM webhook_deliveries ORDER BY event_id");
        if rows.iter().all(|r| r[1] == "succeeded") || tokio::time::Instant::now() > deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(deliveries.len(), events.len(), "one delivery per event (one endpoint): {deliveries:?}");
    for d in &deliveries {
        assert_eq!((d[1].as_str(), d[2].as_str()), ("succeeded", "1"), "delivery {d:?}");
    }
    let attempts = psql(&stack.database_url, "SELECT delivery_id, count(*) FROM webhook_attempts GROUP BY 1 HAVING count(*) <> 1");
    assert!(attempts.is_empty(), "deliveries with other than one attempt row: {attempts:?}");
    let total = psql(&stack.database_url, "SELECT count(*) FROM webhook_attempts");
    assert_eq!(total[0][0], events.len().to_string(), "one attempt row per event");
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_of_each_service_give_the_same_results_as_one() {
    let clips = clips();
    let json_info = [("VID__TELEMETRY__FORMAT", "json"), ("VID__TELEMETRY__LEVEL", "info")];

    // One replica of each.
    let single = Stack::start(&json_info).await;
    single.wait_transcoder_ready(Duration::from_secs(60)).await;
    let one = run_batch(&single, std::slice::from_ref(&single.api_url), &clips).await;
    drop(single);

    // Two replicas of each, on a fresh database and prefix.
    let mut stack = Stack::start(&json_info).await;
    let api2 = stack.spawn_replica("api", "api-2");
    let transcoder2 = stack.spawn_replica("transcoder", "transcoder-2");
    let dispatcher2 = stack.spawn_replica("webhook-dispatcher", "webhook-dispatcher-2");
    wait_up(&format!("{api2}/healthz")).await;
    stack.wait_transcoder_ready(Duration::from_secs(60)).await;
    wait_up(&format!("{transcoder2}/readyz")).await;
    wait_up(&format!("{dispatcher2}/healthz")).await;
    let two = run_batch(&stack, &[stack.api_url.clone(), api2.clone()], &clips).await;

    // The same results, upload by upload.
    let strip = |v: &[(OperationId, UploadResult)]| v.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>();
    assert_eq!(strip(&one), strip(&two), "two replicas must give what one gives");

    // The work was spread: each api completed its half, each transcoder finished jobs.
    let prefix = stack.env_value("VID__AMQP__PREFIX").unwrap().to_owned();
    let apis = [stack.api_url.clone(), api2.clone()];
    let mut completes = Vec::new();
    let mut reports_acked = 0.0;
    let mut relayed = 0.0;
    for api in &apis {
        let page = get_text(&format!("{api}/metrics")).await;
        completes.push(metric_value(
            &page,
            "http_requests_total",
            &[("method", "POST"), ("route", "/uploads/{id}/complete"), ("status", "202")],
        ));
        reports_acked +=
            metric_value(&page, "amqp_messages_consumed_total", &[("queue", &format!("{prefix}.transcode.reports")), ("outcome", "ack")]);
        relayed += metric_value(&page, "outbox_messages_published_total", &[]);
        assert!(metric_value(&page, "http_request_duration_seconds_count", &[("method", "POST"), ("route", "/uploads")]) >= 1.0, "{page}");
        assert!(!page.contains("route=\"/uploads/upl_"), "raw paths must not become labels:\n{page}");
    }
    assert_eq!(completes, vec![(UPLOADS / 2) as f64; 2], "each api completed half of the uploads");
    assert!(reports_acked >= (UPLOADS * 3) as f64, "started + scanned + terminal per job at least, got {reports_acked}");
    assert!(relayed >= (UPLOADS * 2) as f64, "a job and an event per upload at least, got {relayed}");

    let mut per_transcoder = Vec::new();
    for t in [stack.transcoder_health_url(), transcoder2.clone()] {
        let page = get_text(&format!("{t}/metrics")).await;
        let jobs = metric_value(&page, "transcode_jobs_total", &[("outcome", "succeeded")]);
        let acked =
            metric_value(&page, "amqp_messages_consumed_total", &[("queue", &format!("{prefix}.transcode.jobs")), ("outcome", "ack")]);
        assert_eq!(jobs, acked, "each finished job acked once:\n{page}");
        assert!(page.contains("vid_transcoder_scans_total{outcome=\"clean\"}"), "the scan counters stay on the page:\n{page}");
        if jobs > 0.0 {
            assert!(metric_value(&page, "transcode_duration_seconds_count", &[]) >= jobs, "a duration per rendition of each job:\n{page}");
        }
        per_transcoder.push(jobs);
    }
    assert_eq!(per_transcoder.iter().sum::<f64>(), UPLOADS as f64, "{per_transcoder:?}");
    assert!(per_transcoder.iter().all(|n| *n >= 1.0), "both transcoders took jobs: {per_transcoder:?}");

    // One upload's id can be followed through both apis' and both transcoders' JSON logs.
    let logs: BTreeMap<&str, String> = ["api", "api-2", "transcoder", "transcoder-2"].into_iter().map(|n| (n, stack.log_of(n))).collect();
    for (name, log) in &logs {
        for line in log.lines().filter(|l| !l.trim().is_empty()) {
            serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|e| panic!("{name}: not a JSON log line ({e}): {line}"));
        }
    }
    for (op, _) in &two {
        let needle = format!(r#""correlation_id":"{op}""#);
        let api_hit = logs["api"].contains(&needle) || logs["api-2"].contains(&needle);
        let transcoder_hit = logs["transcoder"].contains(&needle) || logs["transcoder-2"].contains(&needle);
        assert!(api_hit && transcoder_hit, "{op}: correlation_id in api logs {api_hit}, transcoder logs {transcoder_hit}");
        // The request that created it: a request id and the Location naming it.
        let location = format!(r#""location":"/operations/{op}""#);
        let request_line = logs["api"].lines().chain(logs["api-2"].lines()).find(|l| l.contains(&location));
        let request_line = request_line.unwrap_or_else(|| panic!("{op}: no request log line with its Location"));
        assert!(request_line.contains(r#""request_id":"req_"#), "{request_line}");
    }
    eprintln!(
        "scaling: one replica {:?}; two replicas: completes per api {completes:?}, jobs per transcoder {per_transcoder:?}",
        strip(&one).iter().map(|r| r.renditions.len()).collect::<Vec<_>>()
    );
}
