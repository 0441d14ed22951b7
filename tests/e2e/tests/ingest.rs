//! `POST /ingests` through the whole system (issue 21, item 4): the real api,
//! ingest worker, transcoder and storage, a source served by a loopback
//! server (the test profile's `[ingest] allow_cidrs` allows 127.0.0.0/8 and
//! nothing else private).
//!
//! - a real clip behind 5 redirects becomes a ready video;
//! - bad `source_url`s are refused by `POST /ingests` itself (422, nothing
//!   created): private and special addresses in every notation, `localhost`,
//!   other schemes, credentials;
//! - failures in the worker end the operation with a stable code: a redirect
//!   to 10.0.0.1 (`blocked_address`: the guard refuses it before any
//!   connection; the loopback server sees only the first request), a 6th
//!   redirect, a body over `max_size_bytes` (announced, unannounced with
//!   close-delimited framing, chunked), a stall (idle timeout 3 s in the test
//!   profile), a source trickling past the total timeout (6 s here; its
//!   multipart upload is aborted: none is left under its key), a 404, a
//!   `206 Partial Content` (only 200 is a whole source), and a file that is
//!   not a video (the probe's `unsupported_container`);
//! - after success, the same `IngestJob` published again is not downloaded
//!   again (the worker finds the stored source) and the same `downloaded`
//!   report published again deletes nothing: the source object stays and the
//!   video stays ready.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vid_client::HttpMethod;
use vid_core::operation::{Operation, OperationStatus};
use vid_e2e::{make_video, Stack};

/// What the loopback source server answers, by path.
#[derive(Clone)]
enum Answer {
    /// 200 with these bytes and their Content-Length.
    Body(Arc<Vec<u8>>),
    /// 302 to this Location.
    Redirect(String),
    /// The status with a short body.
    Status(u16),
    /// 200 with a Content-Length of this many bytes; sends that many.
    Announced(u64),
    /// 200 without Content-Length, body until close: this many bytes.
    Unannounced(u64),
    /// 200 chunked: this many bytes in 16 KiB chunks.
    Chunked(u64),
    /// 200 head, 1 byte, then nothing for a minute.
    Stall,
    /// 200 with a Content-Length of 100, one byte a second (never idle).
    Trickle,
    /// 200 with a Content-Length of 150 MiB (under the 200 MiB limit), 4 KiB
    /// every 20 ms (never idle; about 13 minutes to the end); notifies when
    /// the client hangs up.
    Endless(Arc<tokio::sync::Notify>),
}

/// A raw HTTP/1.1 server on 127.0.0.1 recording every path asked for.
struct SourceServer {
    addr: std::net::SocketAddr,
    asked: Arc<Mutex<Vec<String>>>,
}

impl SourceServer {
    async fn start(routes: HashMap<String, Answer>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let routes = Arc::new(routes);
        let log = asked.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else { return };
                let (routes, log) = (routes.clone(), log.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&head).lines().next().unwrap_or("").to_owned();
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                    log.lock().unwrap().push(path.clone());
                    let answer = routes.get(&path).cloned().unwrap_or(Answer::Status(404));
                    let _ = serve(&mut sock, answer).await;
                });
            }
        });
        Self { addr, asked }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

async fn serve(sock: &mut tokio::net::TcpStream, answer: Answer) -> std::io::Result<()> {
    let zeros = vec![0u8; 16 * 1024];
    match answer {
        Answer::Body(bytes) => {
            let head =
                format!("HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", bytes.len());
            sock.write_all(head.as_bytes()).await?;
            sock.write_all(&bytes).await?;
        }
        Answer::Redirect(to) => {
            sock.write_all(format!("HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes())
                .await?;
        }
        Answer::Status(status) => {
            sock.write_all(format!("HTTP/1.1 {status} Nope\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope").as_bytes()).await?;
        }
        Answer::Announced(n) | Answer::Unannounced(n) => {
            let length = if matches!(answer, Answer::Announced(_)) { format!("Content-Length: {n}\r\n") } else { String::new() };
            sock.write_all(format!("HTTP/1.1 200 OK\r\n{length}Connection: close\r\n\r\n").as_bytes()).await?;
            let mut left = n;
            while left > 0 {
                let take = left.min(zeros.len() as u64) as usize;
                sock.write_all(&zeros[..take]).await?;
                left -= take as u64;
            }
        }
        Answer::Chunked(n) => {
            sock.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").await?;
            let mut left = n;
            while left > 0 {
                let take = left.min(zeros.len() as u64) as usize;
                sock.write_all(format!("{take:x}\r\n").as_bytes()).await?;
                sock.write_all(&zeros[..take]).await?;
                sock.write_all(b"\r\n").await?;
                left -= take as u64;
            }
            sock.write_all(b"0\r\n\r\n").await?;
        }
        Answer::Stall => {
            sock.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n\0").await?;
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        Answer::Trickle => {
            sock.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n").await?;
            for _ in 0..100 {
                sock.write_all(b"\0").await?;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        Answer::Endless(hung_up) => {
            let sent = async {
                sock.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nContent-Length: 157286400\r\n\r\n").await?;
                loop {
                    sock.write_all(&zeros[..4096]).await?;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            let result: std::io::Result<()> = sent.await;
            hung_up.notify_one();
            return result;
        }
    }
    sock.shutdown().await
}

/// One row of `sql` against the stack's database (`psql -At`, fields split on `|`).
fn psql_row(stack: &Stack, sql: &str) -> Vec<String> {
    let out = std::process::Command::new("psql").args([stack.database_url.as_str(), "-Atc", sql]).output().expect("psql runs");
    assert!(out.status.success(), "psql failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().split('|').map(str::to_owned).collect()
}

/// The ingest job of operation `op` as the api staged it, rebuilt from the
/// database (`operations`, `videos`, `uploads`).
fn ingest_job_of(stack: &Stack, op: &str) -> vid_core::ingest::IngestJob {
    assert!(op.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "not an id: {op}");
    let row = psql_row(
        stack,
        &format!(
            "SELECT o.video_id, v.upload_id, v.tenant_id, u.source_url, v.source_key FROM operations o \
             JOIN videos v ON v.id = o.video_id JOIN uploads u ON u.id = v.upload_id WHERE o.id = '{op}'"
        ),
    );
    let [video_id, upload_id, tenant_id, source_url, source_key] = row.as_slice() else { panic!("no ingest {op}: {row:?}") };
    serde_json::from_value(serde_json::json!({
        "operation_id": op, "video_id": video_id, "upload_id": upload_id, "tenant_id": tenant_id,
        "source_url": source_url, "source_key": source_key, "max_size_bytes": 64 * 1024 * 1024,
        "content_type": null, "allowed_content_types": ["video/mp4"],
    }))
    .expect("an IngestJob")
}

/// Polls `what` (a service's log) until `pred` holds for it, for up to 60 s.
async fn wait_log(stack: &Stack, service: &str, what: &str, pred: impl Fn(&str) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !pred(&stack.log_of(service)) {
        assert!(std::time::Instant::now() < deadline, "{service} never logged {what}; logs in {}", stack.log_dir().display());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Ingest reports the api acked (applied or ignored): its `amqp_messages_consumed_total{queue, outcome="ack"}`.
async fn reports_acked(stack: &Stack) -> f64 {
    let page = reqwest::get(format!("{}/metrics", stack.api_url)).await.unwrap().text().await.unwrap();
    let queue = vid_infra::amqp::Topology::new(stack.env_value("VID__AMQP__PREFIX").expect("set by Stack::start")).ingest_reports();
    vid_e2e::metric_value(&page, "amqp_messages_consumed_total", &[("queue", queue.as_str()), ("outcome", "ack")])
}

/// Polls [`reports_acked`] until it reaches `at_least`, for up to 60 s.
async fn wait_acked(stack: &Stack, at_least: f64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while reports_acked(stack).await < at_least {
        assert!(std::time::Instant::now() < deadline, "the api never took the report; logs in {}", stack.log_dir().display());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn ingest(stack: &Stack, body: serde_json::Value) -> Result<Operation, vid_core::Problem> {
    match stack.client().raw(HttpMethod::POST, "/ingests", Some(&body)).await {
        Ok(v) => Ok(serde_json::from_value(v).expect("an operation")),
        Err(vid_client::ClientError::Api(problem)) => Err(problem),
        Err(e) => panic!("POST /ingests failed: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ingests_from_a_url_and_refuses_what_the_guard_refuses() {
    let dir = std::env::temp_dir().join(format!("vid-e2e-ingest-{}", vid_testkit::unique_prefix()));
    std::fs::create_dir_all(&dir).unwrap();
    let clip = dir.join("clip.mp4");
    make_video(&clip, 320, 240, 2.0, "400k");
    let clip_bytes = Arc::new(std::fs::read(&clip).unwrap());

    let limit: u64 = 64 * 1024;
    let mut routes: HashMap<String, Answer> = HashMap::new();
    routes.insert("/clip.mp4".into(), Answer::Body(clip_bytes.clone()));
    for n in 1..=6 {
        let next = if n == 1 { "/clip.mp4".to_owned() } else { format!("/hop/{}", n - 1) };
        routes.insert(format!("/hop/{n}"), Answer::Redirect(next));
    }
    routes.insert("/to-private".into(), Answer::Redirect("http://10.0.0.1/clip.mp4".into()));
    routes.insert("/to-metadata".into(), Answer::Redirect("http://169.254.169.254/latest/meta-data/".into()));
    routes.insert("/announced".into(), Answer::Announced(10 * 1024 * 1024));
    routes.insert("/unannounced".into(), Answer::Unannounced(1024 * 1024));
    routes.insert("/chunked".into(), Answer::Chunked(1024 * 1024));
    routes.insert("/stall".into(), Answer::Stall);
    routes.insert("/trickle".into(), Answer::Trickle);
    routes.insert("/partial".into(), Answer::Status(206));
    routes.insert("/text.mp4".into(), Answer::Body(Arc::new(b"this is not a video, just some text\n".repeat(100))));
    let server = SourceServer::start(routes).await;

    let stack = Stack::start(&[("VID__INGEST_WORKER__TOTAL_TIMEOUT_SECONDS", "6")]).await;
    let client = stack.client();

    // Refused up front: 422 with the guard's code, nothing created.
    for (url, code) in [
        ("http://10.0.0.1/clip.mp4", "blocked_address"),
        ("http://0x0a000001/clip.mp4", "blocked_address"),
        ("http://012.0.0.1/clip.mp4", "blocked_address"),
        ("http://167772161/clip.mp4", "blocked_address"),
        ("http://[::ffff:10.0.0.1]/clip.mp4", "blocked_address"),
        ("http://[fd00::1]/clip.mp4", "blocked_address"),
        ("http://169.254.169.254/latest/meta-data/", "blocked_address"),
        ("http://0.0.0.0/clip.mp4", "blocked_address"),
        ("http://192.168.1.1/clip.mp4", "blocked_address"),
        ("http://localhost/clip.mp4", "host_not_allowed"),
        ("http://metadata.google.internal/", "host_not_allowed"),
        ("ftp://media.example.com/clip.mp4", "scheme_not_allowed"),
        ("file:///etc/passwd", "scheme_not_allowed"),
        ("http://user:pw@media.example.com/clip.mp4", "userinfo_not_allowed"),
    ] {
        let problem = ingest(&stack, serde_json::json!({ "source_url": url })).await.expect_err(url);
        assert_eq!((problem.status, problem.code.as_str()), (422, code), "{url}: {:?}", problem.detail);
    }
    for (body, status, code) in [
        (serde_json::json!({ "source_url": server.url("/clip.mp4"), "size_bytes": 1 }), 400, "invalid_json"),
        (serde_json::json!({ "source_url": server.url("/clip.mp4"), "max_size_bytes": 0 }), 422, "invalid_size"),
        (serde_json::json!({ "source_url": server.url("/clip.mp4"), "max_size_bytes": u64::MAX }), 422, "file_too_large"),
        (serde_json::json!({ "source_url": server.url("/clip.mp4"), "content_type": "text/html" }), 422, "unsupported_content_type"),
    ] {
        let problem = ingest(&stack, body.clone()).await.expect_err("refused");
        assert_eq!((problem.status, problem.code.as_str()), (status, code), "{body}");
    }
    let listed = client.raw(HttpMethod::GET, "/operations", None).await.unwrap();
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(0), "a refused ingest creates nothing");
    assert!(server.asked().is_empty(), "nothing was fetched for a refused request: {:?}", server.asked());

    // Accepted: each ends with its outcome.
    let started = ingest(&stack, serde_json::json!({ "source_url": server.url("/hop/5"), "filename": "clip.mp4" })).await.unwrap();
    assert_eq!(started.status, OperationStatus::Pending);
    assert_eq!(started.metadata.phase.map(|p| p.as_str()), Some("downloading"));
    let failing = [
        ("/to-private", "blocked_address"),
        ("/to-metadata", "blocked_address"),
        ("/hop/6", "too_many_redirects"),
        ("/announced", "source_too_large"),
        ("/unannounced", "source_too_large"),
        ("/chunked", "source_too_large"),
        ("/stall", "source_timeout"),
        ("/trickle", "source_timeout"),
        ("/missing", "source_http_error"),
        ("/partial", "source_http_error"),
        ("/text.mp4", "unsupported_container"),
    ];
    let mut ops = Vec::new();
    for (path, code) in failing {
        let op = ingest(&stack, serde_json::json!({ "source_url": server.url(path), "max_size_bytes": limit })).await.unwrap();
        ops.push((path, code, op.id));
    }

    let done = client.wait_operation(&started.id, Duration::from_secs(180), |_| {}).await.unwrap();
    assert_eq!(done.status, OperationStatus::Succeeded, "{:?}; logs in {}", done.error, stack.log_dir().display());
    let download = done.metadata.download.expect("metadata.download");
    assert_eq!(download.bytes_downloaded, clip_bytes.len() as u64);
    assert_eq!(download.fraction, Some(1.0));
    let video = client.get_video(&done.result.expect("result").video_id).await.unwrap();
    assert_eq!(video.status.as_str(), "ready");
    assert!(video.renditions.iter().any(|r| r.height == 240), "{:?}", video.renditions);
    let redirects = server.asked().iter().filter(|p| p.starts_with("/hop/")).count();
    assert!(redirects >= 5, "the clip was reached through 5 redirects: {:?}", server.asked());

    for (path, code, id) in ops {
        let op = client.wait_operation(&id, Duration::from_secs(120), |_| {}).await.unwrap();
        assert_eq!(op.status, OperationStatus::Failed, "{path}");
        let error = op.error.expect("error");
        assert_eq!(error.code, code, "{path}: {:?}", error.detail);
        if path == "/missing" || path == "/partial" {
            let status = if path == "/missing" { 404 } else { 206 };
            assert_eq!(error.extensions.get("source_status"), Some(&serde_json::json!(status)), "{path}");
        }
        let detail = error.detail.unwrap_or_default();
        assert!(
            code == "unsupported_container" || !detail.contains(path) && !detail.contains("127.0.0.1:"),
            "{path}: the detail names the host only: {detail}"
        );
        if path == "/trickle" {
            // The total timeout aborted the multipart upload (S3 ListMultipartUploads).
            let key = ingest_job_of(&stack, id.as_str()).source_key;
            let (s3, bucket) = vid_e2e::media_bucket();
            let open = s3.list_multipart_uploads().bucket(&bucket).prefix(&key).send().await.expect("ListMultipartUploads");
            assert!(open.uploads().is_empty(), "{key}: {:?}", open.uploads());
        }
    }

    // A redelivered job and a duplicate `downloaded` report after success.
    let job = ingest_job_of(&stack, started.id.as_str());
    let (s3, bucket) = vid_e2e::media_bucket();
    let stored = s3.head_object().bucket(&bucket).key(&job.source_key).send().await.expect("the source is stored");
    let clip_asks = || server.asked().iter().filter(|p| *p == "/clip.mp4").count();
    let asks_before = clip_asks();
    let amqp = vid_infra::settings::AmqpSettings {
        url: stack.env_value("VID__AMQP__URL").unwrap_or("amqp://guest:guest@127.0.0.1:5672/%2f").to_owned().into(),
        prefix: stack.env_value("VID__AMQP__PREFIX").expect("set by Stack::start").to_owned(),
    };
    let conn = vid_infra::amqp::connect(&amqp, Duration::from_secs(30)).await.unwrap();
    let publisher = vid_infra::amqp::Publisher::new(&conn).await.unwrap();
    let topology = vid_infra::amqp::Topology::new(amqp.prefix.clone());
    let op_id = started.id.as_str().to_owned();
    let acked = reports_acked(&stack).await;
    publisher.publish_json(&topology.ingest_exchange(), vid_infra::amqp::RK_JOB, &job, Some(&op_id)).await.unwrap();
    wait_log(&stack, "ingest", "the stored source", |log| log.lines().any(|l| l.contains(&op_id) && l.contains("already stored"))).await;
    wait_acked(&stack, acked + 1.0).await;
    let report = vid_core::ingest::IngestReport {
        operation_id: started.id.clone(),
        worker: "e2e".into(),
        emitted_at: chrono::Utc::now(),
        kind: vid_core::ingest::IngestReportKind::Downloaded { size_bytes: clip_bytes.len() as u64, content_type: "video/mp4".into() },
    };
    publisher.publish_json(&topology.ingest_exchange(), vid_infra::amqp::RK_REPORT, &report, Some(&op_id)).await.unwrap();
    wait_acked(&stack, acked + 2.0).await;
    let still = s3.head_object().bucket(&bucket).key(&job.source_key).send().await.expect("the source is still stored");
    assert_eq!((still.content_length(), still.e_tag()), (stored.content_length(), stored.e_tag()), "the source was not rewritten");
    assert_eq!(clip_asks(), asks_before, "the redelivered job downloaded again: {:?}", server.asked());
    assert_eq!(client.get_video(&video.id).await.unwrap().status.as_str(), "ready");
    // The guard refused the redirect targets before connecting: the private
    // addresses were never asked for anything, and the loopback server saw
    // exactly one request for each redirecting path.
    let asked = server.asked();
    for path in ["/to-private", "/to-metadata"] {
        assert_eq!(asked.iter().filter(|p| *p == path).count(), 1, "{asked:?}");
    }
    assert!(!asked.iter().any(|p| p.starts_with("/latest")), "{asked:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 21 item 4: `POST /operations/{id}:cancel` stops a download in hand.
/// With one download slot (`concurrency = 1`) and the default total timeout
/// (1 h), a source that would take far longer is cancelled mid-download:
/// the worker hears the cancel on the control fan-out, hangs up on the
/// source, aborts the multipart upload (ListMultipartUploads shows none for
/// the key) and frees its slot: a second ingest, queued behind it, is
/// downloaded. Every step waits for an event, none for a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_stops_a_download_in_hand_aborts_its_upload_and_frees_the_slot() {
    let hung_up = Arc::new(tokio::sync::Notify::new());
    let mut routes: HashMap<String, Answer> = HashMap::new();
    routes.insert("/endless.mp4".into(), Answer::Endless(hung_up.clone()));
    routes.insert("/text.mp4".into(), Answer::Body(Arc::new(b"this is not a video, just some text\n".repeat(100))));
    let server = SourceServer::start(routes).await;
    let stack = Stack::start(&[("VID__INGEST_WORKER__CONCURRENCY", "1")]).await;
    let client = stack.client();

    let slow = ingest(&stack, serde_json::json!({ "source_url": server.url("/endless.mp4") })).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let seen = client.get_operation(&slow.id).await.unwrap();
        if seen.metadata.download.is_some_and(|d| d.bytes_downloaded > 0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the download never started: {seen:?}; logs in {}", stack.log_dir().display());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let key = ingest_job_of(&stack, slow.id.as_str()).source_key;
    let (s3, bucket) = vid_e2e::media_bucket();
    // The worker's multipart upload is open: 8 MiB parts, the first may still be filling.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let open = s3.list_multipart_uploads().bucket(&bucket).prefix(&key).send().await.expect("ListMultipartUploads");
        if !open.uploads().is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no multipart upload for {key}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let cancelled = client.cancel_operation(&slow.id).await.unwrap();
    assert_eq!(cancelled.status, OperationStatus::Cancelled);
    // Queued behind the slow one: only a freed slot downloads it.
    let next = ingest(&stack, serde_json::json!({ "source_url": server.url("/text.mp4") })).await.unwrap();

    tokio::time::timeout(Duration::from_secs(60), hung_up.notified()).await.expect("the worker hung up on the cancelled source");
    // The worker counted the download as cancelled (its /metrics), after aborting the upload.
    let metrics = format!("http://{}/metrics", stack.env_value("VID__INGEST_WORKER__HEALTH_LISTEN").expect("set by Stack::start"));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let page = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
        if vid_e2e::metric_value(&page, "ingest_downloads_total", &[("outcome", "cancelled")]) >= 1.0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the worker never counted the cancelled download: {page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let open = s3.list_multipart_uploads().bucket(&bucket).prefix(&key).send().await.expect("ListMultipartUploads");
    assert!(open.uploads().is_empty(), "the cancelled download's upload was aborted: {:?}", open.uploads());
    assert!(s3.head_object().bucket(&bucket).key(&key).send().await.is_err(), "no source object for the cancelled ingest");

    // The freed slot took the next job: it was downloaded (and failed the probe, as a text file does).
    let done = client.wait_operation(&next.id, Duration::from_secs(120), |_| {}).await.unwrap();
    let code = done.error.as_ref().map(|e| e.code.as_str());
    assert_eq!((done.status, code), (OperationStatus::Failed, Some("unsupported_container")), "logs in {}", stack.log_dir().display());
    assert_eq!(done.metadata.download.map(|d| d.bytes_downloaded), Some(3600));
    let slow = client.get_operation(&slow.id).await.unwrap();
    assert_eq!(slow.status, OperationStatus::Cancelled);
}
