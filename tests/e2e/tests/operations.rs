//! Issue 4 end to end: the operation state machine, the real ladder, cancel,
//! and crash recovery — through the real `api`, `transcoder` and
//! `webhook-dispatcher` binaries, the SDK, and clips generated here.
//!
//! No timing assertions except the "stopped within 2 s" for cancel,
//! checked with generous slack (this machine is slow and shared).

use std::path::Path;
use std::time::{Duration, Instant};

use vid_client::upload::Uploader;
use vid_client::{Client, ClientError};
use vid_core::endpoint::CreateEndpoint;
use vid_core::event::{EventData, EventType};
use vid_core::operation::{Operation, OperationStatus, Phase};
use vid_core::video::{Video, VideoStatus};
use vid_core::OperationId;
use vid_e2e::{ffmpeg, ffprobe, list_keys, make_video, temp_dir, Receiver, Stack};

/// How long any one operation may take before a test gives up (not an assertion on speed).
const TERMINAL_TIMEOUT: Duration = Duration::from_secs(900);

// ---------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------

async fn upload(client: &Client, path: &Path, content_type: Option<&str>) -> Result<Operation, ClientError> {
    Uploader::new(client).parallel(2).state_dir(None).upload_file(path, content_type).await.map(|a| a.operation)
}

async fn wait_terminal(stack: &Stack, client: &Client, id: &OperationId) -> Operation {
    client
        .wait_operation(id, TERMINAL_TIMEOUT, |_| {})
        .await
        .unwrap_or_else(|e| panic!("operation {id} did not end: {e}; logs in {}", stack.log_dir().display()))
}

/// Polls every 100 ms until `pred` holds or the operation is terminal; returns the last one seen.
async fn poll_until(client: &Client, id: &OperationId, timeout: Duration, pred: impl Fn(&Operation) -> bool) -> Operation {
    let deadline = Instant::now() + timeout;
    loop {
        let op = client.get_operation(id).await.expect("GET /operations/{id}");
        if pred(&op) || op.status.is_terminal() {
            return op;
        }
        assert!(Instant::now() < deadline, "operation {id} never reached the awaited state; last seen {op:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn phase_rank(p: Option<Phase>) -> u8 {
    match p {
        None => 0,
        Some(Phase::Queued) => 1,
        Some(Phase::Downloading) => 2,
        Some(Phase::Scanning) => 3,
        Some(Phase::Probing) => 4,
        Some(Phase::Transcoding) => 5,
        Some(Phase::Uploading) => 6,
        Some(Phase::Done) => 7,
    }
}

/// `(type, version, operation)` of every `video.*` event of `video`, by version.
async fn video_events(client: &Client, video: &str) -> Vec<(EventType, i64, String)> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let filter = vid_client::EventFilter { cursor: cursor.as_deref(), ..Default::default() };
        let page = client.list_events(&filter).await.expect("GET /events");
        for e in page.data {
            if let EventData::Video(d) = &e.data {
                if d.video_id.as_str() == video {
                    out.push((e.type_, d.version, d.operation_id.as_str().to_owned()));
                }
            }
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    out.sort_by_key(|e| e.1);
    out
}

/// Events arrive through the outbox relay shortly after the commit; wait for `want` types.
async fn wait_video_events(client: &Client, video: &str, want: &[EventType]) -> Vec<(EventType, i64, String)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = video_events(client, video).await;
        if want.iter().all(|t| got.iter().any(|e| e.0 == *t)) || Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn download(client: &Client, url: &str, to: &Path) {
    let bytes = client.http().get(url).send().await.unwrap().error_for_status().expect("download URL works").bytes().await.unwrap();
    std::fs::write(to, &bytes).unwrap();
}

/// Processes whose command line names `needle` (e.g. the worker child of one operation).
fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(needle) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// What a successful clip must turn into.
struct Expect {
    renditions: Vec<(&'static str, u32, u32)>,
    audio: bool,
    coded: (u32, u32),
    rotation_nonzero: bool,
}

/// `GET /videos/{id}` of a succeeded operation: source, renditions with working
/// URLs (checked with ffprobe), poster, version, status; and its events.
async fn check_success(stack: &Stack, client: &Client, op: &Operation, dir: &Path, label: &str, expect: &Expect) -> Video {
    assert_eq!(op.status, OperationStatus::Succeeded, "{label}: {:?}; logs in {}", op.error, stack.log_dir().display());
    assert_eq!(op.progress, 100, "{label}");
    assert!(op.error.is_none(), "{label}: error set on success");
    let result = op.result.as_ref().expect("result set on success");
    let video = client.get_video(&result.video_id).await.unwrap();
    assert_eq!(video.status, VideoStatus::Ready, "{label}");
    assert!(video.version >= 3, "{label}: version {} (created 1, processing 2, ready 3)", video.version);
    let src = video.source.as_ref().expect("source metadata from the probe");
    assert_eq!((src.width, src.height), expect.coded, "{label}: coded size");
    assert_eq!(src.video_codec, "h264", "{label}");
    assert_eq!(src.audio_codec.is_some(), expect.audio, "{label}: source audio codec {:?}", src.audio_codec);
    assert!(src.duration_seconds.is_some_and(|d| d > 0.1), "{label}: duration {:?}", src.duration_seconds);
    assert_eq!(src.rotation != 0, expect.rotation_nonzero, "{label}: rotation {}", src.rotation);
    let got: Vec<(String, u32, u32)> = video.renditions.iter().map(|r| (r.name.clone(), r.width, r.height)).collect();
    let want: Vec<(String, u32, u32)> = expect.renditions.iter().map(|(n, w, h)| (n.to_string(), *w, *h)).collect();
    assert_eq!(got, want, "{label}: renditions");
    for r in &video.renditions {
        assert!(r.size_bytes > 0 && r.bitrate > 0, "{label}: {r:?}");
        assert!(r.storage_key.contains(&format!("/videos/{}/", video.id)), "{label}: {}", r.storage_key);
        let url = r.url.as_ref().unwrap_or_else(|| panic!("{label}: {} has no download URL", r.name));
        assert!(r.url_expires_at.is_some(), "{label}: URL without expiry");
        let file = dir.join(format!("{label}-{}.mp4", r.name));
        download(client, url, &file).await;
        assert_eq!(std::fs::metadata(&file).unwrap().len(), r.size_bytes, "{label}: size_bytes matches the object");
        let probe = ffprobe(&file);
        let streams = probe["streams"].as_array().unwrap();
        let v: Vec<_> = streams.iter().filter(|s| s["codec_type"] == "video").collect();
        let a: Vec<_> = streams.iter().filter(|s| s["codec_type"] == "audio").collect();
        assert_eq!(v.len(), 1, "{label} {}", r.name);
        assert_eq!(v[0]["codec_name"], "h264", "{label} {}", r.name);
        assert_eq!(v[0]["pix_fmt"], "yuv420p", "{label} {}", r.name);
        assert_eq!((v[0]["width"].as_u64(), v[0]["height"].as_u64()), (Some(r.width as u64), Some(r.height as u64)), "{label} {}", r.name);
        assert!(v[0].get("side_data_list").is_none(), "{label} {}: rotation metadata left in the output", r.name);
        if expect.audio {
            assert_eq!(a.len(), 1, "{label} {}", r.name);
            assert_eq!(a[0]["codec_name"], "aac", "{label} {}", r.name);
        } else {
            assert!(a.is_empty(), "{label} {}: audio in an output of a silent source", r.name);
        }
    }
    let poster = video.poster.as_ref().expect("a poster");
    let purl = poster.url.as_ref().expect("poster download URL");
    let pfile = dir.join(format!("{label}-poster.jpg"));
    download(client, purl, &pfile).await;
    let pp = ffprobe(&pfile);
    assert_eq!(pp["streams"][0]["codec_name"], "mjpeg", "{label}: poster is a JPEG");
    assert_eq!((poster.width, poster.height), (expect.renditions[0].1, expect.renditions[0].2), "{label}: poster size");

    // Events: processing then ready, each carrying the version of its change.
    let events = wait_video_events(client, video.id.as_str(), &[EventType::VideoProcessing, EventType::VideoReady]).await;
    let types: Vec<EventType> = events.iter().map(|e| e.0).collect();
    assert_eq!(types, vec![EventType::VideoProcessing, EventType::VideoReady], "{label}: events {events:?}");
    assert_eq!(events[1].1, video.version, "{label}: video.ready carries the current version");
    assert_eq!(events[0].1, video.version - 1, "{label}: video.processing carries the version of that change");
    assert!(events.iter().all(|e| e.2 == op.id.as_str()), "{label}: events name the operation");
    video
}

async fn check_failure(client: &Client, op: &Operation, label: &str, code: &str) {
    assert_eq!(op.status, OperationStatus::Failed, "{label}: expected failed/{code}, got {:?} {:?}", op.status, op.error);
    let err = op.error.as_ref().unwrap_or_else(|| panic!("{label}: failed without error"));
    assert_eq!(err.code, code, "{label}: {err:?}");
    assert!(op.result.is_none(), "{label}: result set on failure");
    assert!(op.progress <= 99, "{label}: progress {} on failure", op.progress);
    let vid = op.metadata.video_id.as_ref().expect("metadata.video_id");
    let video = client.get_video(vid).await.unwrap();
    assert_eq!(video.status, VideoStatus::Failed, "{label}");
    assert!(video.renditions.is_empty(), "{label}");
    let events = wait_video_events(client, vid.as_str(), &[EventType::VideoFailed]).await;
    let failed = events.iter().find(|e| e.0 == EventType::VideoFailed).unwrap_or_else(|| panic!("{label}: no video.failed in {events:?}"));
    assert_eq!(failed.1, video.version, "{label}: video.failed carries the current version");
    assert!(!events.iter().any(|e| e.0 == EventType::VideoReady), "{label}: {events:?}");
}

/// An H.264/AAC (or video-only) clip from the test pattern.
fn clip(path: &Path, size: &str, seconds: &str, pix_fmt: &str, audio: bool) {
    let v = format!("testsrc=size={size}:rate=25:duration={seconds}");
    let a = format!("sine=frequency=440:duration={seconds}");
    let p = path.to_str().unwrap();
    let mut args = vec!["-f", "lavfi", "-i", &v];
    if audio {
        args.extend(["-f", "lavfi", "-i", &a, "-c:a", "aac", "-shortest"]);
    }
    args.extend(["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", pix_fmt, p]);
    ffmpeg(&args);
}

// ---------------------------------------------------------------------------
// 1 + 3: the clip matrix, events, and cancel after the end (409)
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn generated_clips_end_as_they_should() {
    let dir = temp_dir();
    let p = |n: &str| dir.join(n);
    clip(&p("odd.mp4"), "641x481", "1.5", "yuv444p", true);
    clip(&p("base.mp4"), "640x360", "1.5", "yuv420p", true);
    ffmpeg(&["-i", p("base.mp4").to_str().unwrap(), "-c", "copy", "-metadata:s:v", "rotate=90", p("rotated.mp4").to_str().unwrap()]);
    ffmpeg(&["-f", "lavfi", "-i", "sine=duration=1.5", "-c:a", "aac", p("audio.mp4").to_str().unwrap()]);
    clip(&p("silent.mp4"), "320x240", "1.5", "yuv420p", false);
    ffmpeg(&["-f", "lavfi", "-i", "testsrc=size=64x64", "-frames:v", "1", "-f", "image2", "-c:v", "png", p("image.mp4").to_str().unwrap()]);
    assert_eq!(&std::fs::read(p("image.mp4")).unwrap()[..4], b"\x89PNG");
    clip(&p("full.mp4"), "320x240", "2", "yuv420p", true);
    let full = std::fs::read(p("full.mp4")).unwrap();
    std::fs::write(p("cut.mp4"), &full[..full.len() * 6 / 10]).unwrap();
    std::fs::write(p("empty.mp4"), b"").unwrap();
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc=size=320x240:rate=25",
        "-frames:v",
        "1",
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv420p",
        p("one.mp4").to_str().unwrap(),
    ]);

    let stack = Stack::start(&[("VID__TRANSCODER__CONCURRENCY", "2")]).await;
    let client = stack.client();

    // Zero bytes never become an upload.
    let err = upload(&client, &p("empty.mp4"), Some("video/mp4")).await.expect_err("a 0-byte upload is refused");
    let problem = err.problem().unwrap_or_else(|| panic!("expected a problem, got {err}"));
    assert_eq!(problem.code, "invalid_size", "{problem:?}");
    assert_eq!(problem.status, 422);

    // Everything else concurrently; content type forced to video/mp4 so the transcoder does the checking.
    let names = ["odd", "rotated", "audio", "silent", "image", "cut", "one"];
    let mut handles = Vec::new();
    for name in names {
        let client = client.clone();
        let path = p(&format!("{name}.mp4"));
        handles.push(tokio::spawn(async move {
            let op = upload(&client, &path, Some("video/mp4")).await.unwrap_or_else(|e| panic!("{name}: upload failed: {e}"));
            assert_eq!(op.status, OperationStatus::Pending, "{name}: 202 with a pending operation");
            op
        }));
    }
    let mut ops = Vec::new();
    for (name, h) in names.iter().zip(handles) {
        let op = h.await.unwrap();
        ops.push((*name, op));
    }
    let mut done = Vec::new();
    for (name, op) in &ops {
        done.push((*name, wait_terminal(&stack, &client, &op.id).await));
    }
    let get = |n: &str| done.iter().find(|(name, _)| *name == n).map(|(_, op)| op.clone()).unwrap();
    let summary: Vec<String> = done
        .iter()
        .map(|(n, op)| format!("{n}: {} {}", op.status.as_str(), op.error.as_ref().map(|e| e.code.as_str()).unwrap_or("-")))
        .collect();
    eprintln!("outcomes: {summary:#?}");

    // Successes.
    let odd = get("odd");
    check_success(
        &stack,
        &client,
        &odd,
        &dir,
        "odd",
        &Expect { renditions: vec![("480p", 640, 480), ("360p", 480, 360)], audio: true, coded: (641, 481), rotation_nonzero: false },
    )
    .await;
    check_success(
        &stack,
        &client,
        &get("rotated"),
        &dir,
        "rotated",
        &Expect { renditions: vec![("360p", 360, 640)], audio: true, coded: (640, 360), rotation_nonzero: true },
    )
    .await;
    check_success(
        &stack,
        &client,
        &get("silent"),
        &dir,
        "silent",
        &Expect { renditions: vec![("240p", 320, 240)], audio: false, coded: (320, 240), rotation_nonzero: false },
    )
    .await;

    // Failures, each with its own code.
    check_failure(&client, &get("audio"), "audio-only", "no_video_stream").await;
    check_failure(&client, &get("image"), "PNG renamed .mp4", "unsupported_container").await;
    check_failure(&client, &get("cut"), "mp4 cut to 60%", "corrupt_media").await;
    check_failure(&client, &get("one"), "1-frame video", "duration_too_short").await;

    // GET /operations?status=failed lists exactly the four failures, newest first.
    let failed = client.list_operations(Some("failed"), None).await.unwrap();
    let mut want: Vec<String> = ["audio", "image", "cut", "one"].iter().map(|n| get(n).id.to_string()).collect();
    let mut got: Vec<String> = failed.data.iter().map(|o| o.id.to_string()).collect();
    // Newest first means by id (ULIDs, which the cursor pages on); `created_at` is the
    // transaction's start, so concurrent creations may disagree with it by milliseconds.
    eprintln!("failed list: {:?}", failed.data.iter().map(|o| (o.id.to_string(), o.created_at)).collect::<Vec<_>>());
    assert!(failed.data.windows(2).all(|w| w[0].id.to_string() > w[1].id.to_string()), "newest (highest id) first");
    want.sort();
    got.sort();
    assert_eq!(got, want);

    // Cancel after the end: 409 naming the status; nothing changes.
    for (name, status) in [("odd", "succeeded"), ("cut", "failed")] {
        let op = get(name);
        let err = client.cancel_operation(&op.id).await.expect_err("cancel of a terminal operation is refused");
        let problem = err.problem().unwrap_or_else(|| panic!("expected a problem, got {err}"));
        assert_eq!((problem.status, problem.code.as_str()), (409, "operation_terminal"), "{problem:?}");
        assert_eq!(problem.extensions.get("operation_status").and_then(|s| s.as_str()), Some(status), "{problem:?}");
        assert!(problem.detail.as_deref().unwrap_or("").contains(status), "{problem:?}");
        let again = client.get_operation(&op.id).await.unwrap();
        assert_eq!(again.status.as_str(), status);
    }
    let video = client.get_video(&odd.result.as_ref().unwrap().video_id).await.unwrap();
    assert_eq!(video.status, VideoStatus::Ready, "a refused cancel leaves the video alone");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------
// 2 + 3: progress during a longer transcode
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn progress_never_decreases_and_stays_below_100_until_terminal() {
    let dir = temp_dir();
    let source = dir.join("hd.mp4");
    make_video(&source, 1920, 1080, 8.0, "6M");
    let stack = Stack::start(&[]).await;
    let client = stack.client();
    let op = upload(&client, &source, None).await.expect("upload");

    let mut seen: Vec<(OperationStatus, u8, Option<Phase>)> = Vec::new();
    let deadline = Instant::now() + TERMINAL_TIMEOUT;
    let last = loop {
        let op = client.get_operation(&op.id).await.unwrap();
        let entry = (op.status, op.progress, op.metadata.phase);
        if seen.last() != Some(&entry) {
            seen.push(entry);
        }
        if op.status.is_terminal() {
            break op;
        }
        assert!(Instant::now() < deadline, "no end; seen {seen:?}; logs in {}", stack.log_dir().display());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("observed (status, progress, phase): {seen:?}");
    assert_eq!(last.status, OperationStatus::Succeeded, "{:?}; logs in {}", last.error, stack.log_dir().display());
    assert_eq!(last.progress, 100);
    for w in seen.windows(2) {
        assert!(w[1].1 >= w[0].1, "progress went backwards: {:?} → {:?} in {seen:?}", w[0], w[1]);
        assert!(phase_rank(w[1].2) >= phase_rank(w[0].2), "phase went backwards: {:?} → {:?}", w[0], w[1]);
    }
    for s in &seen {
        if !s.0.is_terminal() {
            assert!(s.1 <= 99, "{s:?}: progress 100 before the end");
        }
        if s.0 == OperationStatus::Pending {
            assert_eq!(s.1, 0, "{s:?}");
        }
    }
    assert!(seen.iter().any(|s| s.0 == OperationStatus::Running && s.1 > 0 && s.1 < 100), "progress never moved while running: {seen:?}");
    assert!(seen.iter().any(|s| s.2 == Some(Phase::Transcoding)), "phase transcoding never shown: {seen:?}");

    let video = check_success(
        &stack,
        &client,
        &last,
        &dir,
        "hd",
        &Expect {
            renditions: vec![("1080p", 1920, 1080), ("720p", 1280, 720), ("480p", 854, 480), ("360p", 640, 360)],
            audio: true,
            coded: (1920, 1080),
            rotation_nonzero: false,
        },
    )
    .await;
    assert_eq!(video.version, 3);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------
// 4: cancel
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_while_pending_is_final_and_produces_nothing() {
    let dir = temp_dir();
    let source = dir.join("clip.mp4");
    make_video(&source, 640, 360, 6.0, "1M");
    let mut stack = Stack::start(&[("RUST_LOG", "warn,vid_transcoder=info")]).await;
    stack.wait_transcoder_ready(Duration::from_secs(120)).await; // the job queue exists
    stack.kill("transcoder");
    let client = stack.client();
    let receiver = Receiver::start(200).await;
    client
        .create_endpoint(&CreateEndpoint { url: receiver.url(), description: None, event_types: None, signature_format: None })
        .await
        .expect("endpoint registers");
    let op = upload(&client, &source, None).await.expect("upload");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(client.get_operation(&op.id).await.unwrap().status, OperationStatus::Pending, "no transcoder is running");

    let cancelled = client.cancel_operation(&op.id).await.expect("cancel a pending operation");
    assert_eq!(cancelled.status, OperationStatus::Cancelled);
    assert_eq!(cancelled.error.as_ref().map(|e| e.code.as_str()), Some("cancelled"), "{:?}", cancelled.error);
    assert!(cancelled.result.is_none());
    let vid = cancelled.metadata.video_id.clone().expect("video id");
    let prefix = stack.outputs_prefix(vid.as_str());
    // With no transcoder connected the cancel broadcast has nowhere to go; that must not
    // hold up the outbox: the video.cancelled webhook arrives while the transcoder is still down.
    let hook = receiver
        .wait_for(Duration::from_secs(60), |r| {
            serde_json::from_slice::<serde_json::Value>(&r.body).map(|b| b["type"] == "video.cancelled").unwrap_or(false)
        })
        .await;
    assert!(
        hook.is_some(),
        "no video.cancelled webhook while the transcoder is down (outbox stuck?); logs in {}",
        stack.log_dir().display()
    );

    // The transcoder comes back and finds the job still queued.
    stack.spawn("transcoder");
    stack.wait_transcoder_ready(Duration::from_secs(120)).await;
    let work = stack.transcoder_work_dir().join(op.id.as_str());
    // Watches the worker's job directory closely: it exists exactly while the worker holds the job.
    let seen_dir = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (work, seen_dir) = (work.clone(), seen_dir.clone());
        tokio::spawn(async move {
            loop {
                if work.exists() {
                    seen_dir.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let start = Instant::now();
    let (mut appeared, mut gone_at) = (false, None::<Instant>);
    let mut outputs_seen: Vec<String> = Vec::new();
    loop {
        let now = client.get_operation(&op.id).await.unwrap();
        assert_eq!(now.status, OperationStatus::Cancelled, "a cancelled operation changed: {now:?}");
        assert_eq!(now.error.as_ref().map(|e| e.code.as_str()), Some("cancelled"));
        for k in list_keys(&prefix).await {
            if !outputs_seen.contains(&k) {
                outputs_seen.push(k);
            }
        }
        let exists = work.exists();
        appeared |= exists || seen_dir.load(std::sync::atomic::Ordering::SeqCst);
        if appeared && !exists && gone_at.is_none() {
            gone_at = Some(Instant::now());
        }
        // Done: the worker took the job and let it go (plus a margin for late uploads/deletes),
        // or it never touched it within 40 s.
        if gone_at.is_some_and(|g| g.elapsed() > Duration::from_secs(3)) || (!appeared && start.elapsed() > Duration::from_secs(40)) {
            break;
        }
        assert!(start.elapsed() < TERMINAL_TIMEOUT, "the worker held the cancelled job forever");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    watcher.abort();
    eprintln!("worker took the cancelled job: {appeared}; outputs seen meanwhile: {outputs_seen:?}");
    assert!(outputs_seen.is_empty(), "a cancelled operation produced outputs: {outputs_seen:?}");
    assert!(list_keys(&prefix).await.is_empty());
    let video = client.get_video(&vid).await.unwrap();
    assert_eq!(video.status, VideoStatus::Cancelled);
    assert!(video.renditions.is_empty() && video.poster.is_none());
    let events = wait_video_events(&client, vid.as_str(), &[EventType::VideoCancelled]).await;
    let types: Vec<EventType> = events.iter().map(|e| e.0).collect();
    assert_eq!(types, vec![EventType::VideoCancelled], "{events:?}");
    assert_eq!(events[0].1, video.version);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_while_running_stops_the_work_and_deletes_outputs() {
    let dir = temp_dir();
    let source = dir.join("long.mp4");
    make_video(&source, 1920, 1080, 12.0, "6M");
    let stack = Stack::start(&[]).await;
    let client = stack.client();
    let op = upload(&client, &source, None).await.expect("upload");
    let running = poll_until(&client, &op.id, TERMINAL_TIMEOUT, |o| {
        o.status == OperationStatus::Running && o.metadata.phase == Some(Phase::Transcoding) && o.progress > 12
    })
    .await;
    assert_eq!(running.status, OperationStatus::Running, "ended before it could be cancelled: {running:?}");
    let spec_marker = format!("{}/spec.json", op.id);
    assert!(!processes_mentioning(&spec_marker).is_empty(), "the worker child of {} should be running", op.id);

    let t0 = Instant::now();
    let cancelled = client.cancel_operation(&op.id).await.expect("cancel a running operation");
    assert_eq!(cancelled.status, OperationStatus::Cancelled);
    assert_eq!(cancelled.error.as_ref().map(|e| e.code.as_str()), Some("cancelled"));

    // The child process is gone and the job let go (work dir removed) — the issue says within 2 s;
    // allowed here with generous slack for a loaded machine.
    let work = stack.transcoder_work_dir().join(op.id.as_str());
    let (mut child_gone, mut job_gone) = (None, None);
    while t0.elapsed() < Duration::from_secs(20) && (child_gone.is_none() || job_gone.is_none()) {
        if child_gone.is_none() && processes_mentioning(&spec_marker).is_empty() {
            child_gone = Some(t0.elapsed());
        }
        if job_gone.is_none() && !work.exists() {
            job_gone = Some(t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("cancel → child killed after {child_gone:?}, job released after {job_gone:?}");
    let child_gone = child_gone.expect("the worker child still runs 20 s after cancel");
    assert!(job_gone.is_some(), "the transcoder still holds the job 20 s after cancel");
    // The issue asks for 2 s on an idle machine; other e2e tests run 1080p
    // encodes beside this one, so the bound only catches a cancel that is lost.
    assert!(child_gone < Duration::from_secs(15), "child killed only after {child_gone:?} (issue: 2 s)");

    tokio::time::sleep(Duration::from_secs(3)).await;
    let vid = cancelled.metadata.video_id.clone().unwrap();
    let prefix = stack.outputs_prefix(vid.as_str());
    let left = list_keys(&prefix).await;
    assert!(left.is_empty(), "outputs left after cancel: {left:?}");
    let now = client.get_operation(&op.id).await.unwrap();
    assert_eq!(now.status, OperationStatus::Cancelled, "cancelled was overwritten: {now:?}");
    assert!(now.result.is_none());
    let video = client.get_video(&vid).await.unwrap();
    assert_eq!(video.status, VideoStatus::Cancelled);
    let events = wait_video_events(&client, vid.as_str(), &[EventType::VideoCancelled]).await;
    let types: Vec<EventType> = events.iter().map(|e| e.0).collect();
    assert_eq!(types, vec![EventType::VideoProcessing, EventType::VideoCancelled], "{events:?}");
    assert_eq!(events[1].1, video.version);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------
// 5: SIGKILL mid-job
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transcoder_killed_mid_job_does_not_lose_it() {
    let dir = temp_dir();
    let source = dir.join("hd.mp4");
    make_video(&source, 1920, 1080, 8.0, "6M");
    let mut stack = Stack::start(&[]).await;
    let client = stack.client();
    let op = upload(&client, &source, None).await.expect("upload");
    let running = poll_until(&client, &op.id, TERMINAL_TIMEOUT, |o| o.metadata.phase == Some(Phase::Transcoding)).await;
    assert_eq!(running.status, OperationStatus::Running, "ended before the kill: {running:?}");
    let progress_before = running.progress;

    stack.kill("transcoder");
    // The worker child dies with its parent (PDEATHSIG), so nothing keeps transcoding.
    let spec_marker = format!("{}/spec.json", op.id);
    let t = Instant::now();
    while !processes_mentioning(&spec_marker).is_empty() {
        assert!(t.elapsed() < Duration::from_secs(20), "the worker child outlived its killed parent");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let during = client.get_operation(&op.id).await.unwrap();
    assert_eq!(during.status, OperationStatus::Running, "{during:?}");
    stack.spawn("transcoder");

    let mut progress: Vec<u8> = vec![progress_before];
    let last = client.wait_operation(&op.id, TERMINAL_TIMEOUT, |o| progress.push(o.progress)).await.expect("operation ends");
    assert_eq!(last.status, OperationStatus::Succeeded, "{:?}; logs in {}", last.error, stack.log_dir().display());
    assert!(progress.windows(2).all(|w| w[1] >= w[0]), "progress went backwards across the redelivery: {progress:?}");
    let video = client.get_video(&last.result.as_ref().unwrap().video_id).await.unwrap();
    assert_eq!(video.status, VideoStatus::Ready);
    let names: Vec<&str> = video.renditions.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["1080p", "720p", "480p", "360p"]);
    let events = wait_video_events(&client, video.id.as_str(), &[EventType::VideoReady]).await;
    let types: Vec<EventType> = events.iter().map(|e| e.0).collect();
    assert_eq!(types, vec![EventType::VideoProcessing, EventType::VideoReady], "exactly one processing/ready pair: {events:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
