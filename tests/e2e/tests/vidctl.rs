//! Issue 7 end to end: `vidctl` (the built binary, as a subprocess) and the
//! SDK's uploader against the real `api`, `transcoder` and
//! `webhook-dispatcher` binaries and the local store.
//!
//! Bytes are checked by reading the assembled source object back from storage
//! with S3 GetObject and comparing SHA-256 digests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vid_client::upload::{Progress, Uploader};
use vid_client::{Client, ClientError};
use vid_core::operation::OperationStatus;
use vid_core::upload::{UploadState, UploadStatus};
use vid_core::UploadId;
use vid_e2e::{make_video, media_bucket, temp_dir, Receiver, Stack};

const MIB: usize = 1024 * 1024;
/// The smallest part size storage accepts: small files still have several parts.
const PART_SIZE: (&str, &str) = ("VID__UPLOADS__TARGET_PART_SIZE_BYTES", "5242880");

// ---------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------

fn vidctl_path() -> PathBuf {
    let p = vid_e2e::bin_dir().join("vidctl");
    assert!(p.exists(), "{} is missing: run `cargo build --bins -p vid-client`", p.display());
    p
}

/// `vidctl` pointed at the stack, with its own cache directory (upload state files).
fn vidctl(stack: &Stack, cache: &Path) -> Command {
    let mut cmd = Command::new(vidctl_path());
    cmd.env("VIDCTL_API_URL", &stack.api_url).env("VIDCTL_API_KEY", &stack.api_key).env("XDG_CACHE_HOME", cache).stdin(Stdio::null());
    cmd
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("vidctl runs");
    eprintln!(
        "vidctl exited {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout_json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

/// Random bytes (not a video: for tests that never transcode).
fn random_file(dir: &Path, name: &str, len: usize) -> PathBuf {
    let mut bytes = vec![0u8; len];
    let rng = ring::rand::SystemRandom::new();
    for chunk in bytes.chunks_mut(1 << 16) {
        ring::rand::SecureRandom::fill(&rng, chunk).unwrap();
    }
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A real MP4 grown to at least `min_len` bytes with a trailing ISO BMFF
/// `free` box of random bytes (which players and ffprobe skip).
fn padded_video(dir: &Path, name: &str, min_len: usize) -> PathBuf {
    let path = dir.join(name);
    make_video(&path, 320, 240, 2.0, "300k");
    let mut bytes = std::fs::read(&path).unwrap();
    let pad = min_len.saturating_sub(bytes.len()).max(16);
    let mut payload = vec![0u8; pad - 8];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut payload).unwrap();
    bytes.extend_from_slice(&(pad as u32).to_be_bytes());
    bytes.extend_from_slice(b"free");
    bytes.extend_from_slice(&payload);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// SHA-256 of the assembled source object of an upload, read back with S3 GetObject.
async fn source_sha256(stack: &Stack, upload: &str, video: &str) -> String {
    let tenant = stack.tenant_of_video(video);
    let key = format!("tenants/{tenant}/uploads/{upload}/source");
    let (s3, bucket) = media_bucket();
    let obj = s3
        .get_object()
        .bucket(&bucket)
        .key(&key)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET s3://{bucket}/{key}: {}", aws_sdk_s3::error::DisplayErrorContext(e)));
    let body = obj.body.collect().await.unwrap().into_bytes();
    sha256(&body)
}

/// Records what the uploader reports.
#[derive(Default)]
struct Recorder {
    in_flight: Mutex<(i64, i64)>,
    retries: Mutex<Vec<(u32, String)>>,
}

impl Progress for Recorder {
    fn part_start(&self, _part: u32) {
        let mut g = self.in_flight.lock().unwrap();
        g.0 += 1;
        g.1 = g.1.max(g.0);
    }
    fn part_sent(&self, _part: u32) {
        self.in_flight.lock().unwrap().0 -= 1;
    }
    fn retry(&self, part: u32, why: &str) {
        eprintln!("part {part}: {why}");
        self.retries.lock().unwrap().push((part, why.to_owned()));
    }
}

/// The upload id in the one state file under `cache`, once there is one.
async fn state_file_upload(cache: &Path, timeout: Duration) -> UploadId {
    let dir = cache.join("vidctl/uploads");
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if e.path().extension().is_some_and(|x| x == "json") {
                    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&std::fs::read(e.path()).unwrap_or_default()) {
                        return v["upload_id"].as_str().unwrap().parse().unwrap();
                    }
                }
            }
        }
        assert!(Instant::now() < deadline, "vidctl wrote no state file under {}", dir.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_stored_parts(client: &Client, id: &UploadId, at_least: usize, timeout: Duration) -> UploadState {
    let deadline = Instant::now() + timeout;
    loop {
        let u = client.get_upload(id).await.expect("GET /uploads/{id}");
        if u.parts.len() >= at_least {
            return u;
        }
        assert!(Instant::now() < deadline, "storage never held {at_least} parts of {id}: {u:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn stored(u: &UploadState) -> Vec<u32> {
    let mut v: Vec<u32> = u.parts.iter().map(|p| p.part_number).collect();
    v.sort_unstable();
    v
}

fn numbers(v: &serde_json::Value) -> Vec<u32> {
    let mut n: Vec<u32> = v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    n.sort_unstable();
    n
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

// ---------------------------------------------------------------------------
// tests
// ---------------------------------------------------------------------------

/// `vidctl upload --wait --json` of a 3-part video: it is transcoded, the
/// output names the video, operation and renditions, and storage holds
/// exactly the file's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multipart_upload_from_the_shell_stores_the_exact_bytes() {
    let stack = Stack::start(&[PART_SIZE]).await;
    let dir = temp_dir();
    let file = padded_video(&dir, "clip.mp4", 12 * MIB);
    let want = sha256(&std::fs::read(&file).unwrap());

    let out = run(vidctl(&stack, &dir).args(["--json", "upload", "--wait", "--timeout", "600", "--parallel", "2"]).arg(&file));
    assert!(out.status.success(), "upload failed; logs in {}", stack.log_dir().display());
    let v = stdout_json(&out);
    assert_eq!(v["operation"]["status"], "succeeded", "{v}");
    assert_eq!(numbers(&v["parts_sent"]), vec![1, 2, 3], "a 12 MiB file in 5 MiB parts is 3 parts");
    assert_eq!(v["resumed"], false);
    let renditions = v["video"]["renditions"].as_array().expect("the video with its renditions");
    assert!(!renditions.is_empty(), "no renditions in {v}");
    let (upload, video) = (v["upload_id"].as_str().unwrap(), v["video_id"].as_str().unwrap());
    assert_eq!(source_sha256(&stack, upload, video).await, want, "storage holds other bytes than the file");

    // The human output of the same facts; no state file is left behind.
    let out = run(vidctl(&stack, &dir).args(["videos", "get", video]));
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(video) && text.contains("ready") && text.contains("RENDITION"), "{text}");
    let left = std::fs::read_dir(dir.join("vidctl/uploads")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "the state file of a completed upload is removed");
}

/// The SDK sends up to `parallel` parts at once and storage gets every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parts_are_sent_in_parallel() {
    let stack = Stack::start(&[PART_SIZE]).await;
    let dir = temp_dir();
    let file = random_file(&dir, "random.mp4", 6 * 5 * MIB + 1234);
    let client = stack.client();
    let rec = Arc::new(Recorder::default());
    let outcome = Uploader::new(&client)
        .parallel(4)
        .state_dir(None)
        .progress(rec.clone())
        // Each part waits before its PUT, so the four in flight overlap for sure.
        .delay_before_send(Some(Duration::from_millis(400)))
        .upload(&file, Some("video/mp4"))
        .await
        .expect("upload");
    let mut sent = outcome.parts_sent.clone();
    sent.sort_unstable();
    assert_eq!(sent, (1..=7).collect::<Vec<_>>());
    assert_eq!(rec.in_flight.lock().unwrap().1, 4, "at most and at least 4 parts were in flight");
    assert!(rec.retries.lock().unwrap().is_empty());
    let video = outcome.accepted.operation.metadata.video_id.clone().expect("video id");
    let want = sha256(&std::fs::read(&file).unwrap());
    assert_eq!(source_sha256(&stack, outcome.upload_id.as_str(), video.as_str()).await, want);
}

/// Killed partway (SIGKILL), then interrupted (Ctrl-C), `vidctl upload` resumes
/// the same upload and sends only the parts storage does not hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_upload_resumes_and_sends_only_the_missing_parts() {
    let stack = Stack::start(&[PART_SIZE]).await;
    let client = stack.client();
    let dir = temp_dir();
    let file = random_file(&dir, "big.mp4", 7 * 5 * MIB - 99);
    let want = sha256(&std::fs::read(&file).unwrap());
    let slow = |stack: &Stack| {
        let mut c = vidctl(stack, &dir);
        c.args(["--json", "upload", "--parallel", "1", "--part-delay-ms", "600", "--content-type", "video/mp4"]).arg(&file);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    };

    // Run 1: SIGKILL once the first part is in storage.
    let mut child = slow(&stack).spawn().unwrap();
    let id = state_file_upload(&dir, Duration::from_secs(30)).await;
    wait_stored_parts(&client, &id, 1, Duration::from_secs(60)).await;
    kill(&mut child);
    // A part whose bytes were all sent before the kill may still land in
    // storage a moment later: read until two reads a second apart agree.
    let mut after_kill = stored(&client.get_upload(&id).await.unwrap());
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let again = stored(&client.get_upload(&id).await.unwrap());
        if again == after_kill {
            break;
        }
        after_kill = again;
    }
    assert!(!after_kill.is_empty() && after_kill.len() < 7, "killed partway: {after_kill:?}");

    // Run 2: Ctrl-C after one more part; it exits cleanly saying how to resume.
    let child = slow(&stack).spawn().unwrap();
    wait_stored_parts(&client, &id, after_kill.len() + 1, Duration::from_secs(60)).await;
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("run 2 stderr:\n{stderr}");
    assert_eq!(out.status.code(), Some(130), "Ctrl-C exits 130");
    assert!(stderr.contains("resuming upload") && stderr.contains(id.as_str()), "run 2 resumed the same upload: {stderr}");
    // The state is kept per API URL: the hint names it.
    let hint = format!("vidctl --api-url {} upload {}", stack.api_url, file.display());
    assert!(stderr.contains("interrupted") && stderr.contains(&hint), "says how to resume ({hint}): {stderr}");
    let before_last = client.get_upload(&id).await.unwrap();
    assert_eq!(before_last.status, UploadStatus::Created);
    let held = stored(&before_last);
    assert!(held.len() > after_kill.len() && held.len() < 7, "run 2 added parts: {held:?}");

    // Run 3: completes, sending exactly the missing parts.
    let out = run(vidctl(&stack, &dir).args(["--json", "upload", "--content-type", "video/mp4"]).arg(&file));
    assert!(out.status.success());
    let v = stdout_json(&out);
    assert_eq!(v["upload_id"], id.as_str(), "the same upload was continued");
    assert_eq!(v["resumed"], true);
    // A PUT in flight when run 2 was interrupted may still land in storage
    // after `held` was read (its bytes were already sent): with --parallel 1
    // that is at most one part more than `held`.
    let already = numbers(&v["parts_already_stored"]);
    assert!(held.iter().all(|n| already.contains(n)), "every part stored before run 3 was kept: held {held:?}, run 3 found {already:?}");
    assert!(already.len() <= held.len() + 1, "at most the one in-flight part landed late: held {held:?}, run 3 found {already:?}");
    let expected: Vec<u32> = (1..=7).filter(|n| !already.contains(n)).collect();
    assert_eq!(numbers(&v["parts_sent"]), expected, "only the missing parts were sent");
    let video = v["video_id"].as_str().unwrap();
    assert_eq!(source_sha256(&stack, id.as_str(), video).await, want);
    let done = client.get_upload(&id).await.unwrap();
    assert_eq!(done.status, UploadStatus::Completed);
}

/// A part whose URL expired before it was sent is refused by storage,
/// re-signed through `parts:sign`, sent again, and the upload completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_part_url_is_re_signed_and_the_upload_completes() {
    let stack = Stack::start(&[PART_SIZE, ("VID__UPLOADS__PART_URL_TTL_SECONDS", "2")]).await;
    let dir = temp_dir();
    let file = random_file(&dir, "expiring.mp4", 2 * 5 * MIB + 77);
    let client = stack.client();
    let rec = Arc::new(Recorder::default());
    let outcome = Uploader::new(&client)
        .parallel(2)
        .state_dir(None)
        .progress(rec.clone())
        // Longer than the URLs live: the first PUT of each part uses an expired URL.
        .delay_before_send(Some(Duration::from_secs(4)))
        .upload(&file, Some("video/mp4"))
        .await
        .expect("the upload completes after re-signing");
    let retries = rec.retries.lock().unwrap().clone();
    // Garage answers an expired URL early and closes the connection (AWS says 403):
    // either way the uploader reports a refusal and re-signs.
    let refused: Vec<_> = retries.iter().filter(|(_, why)| why.starts_with("storage refused")).collect();
    assert!(!refused.is_empty(), "storage refused no URL: {retries:?}");
    assert!(refused.iter().all(|(_, why)| why.ends_with("re-signing")));
    let mut sent = outcome.parts_sent.clone();
    sent.sort_unstable();
    assert_eq!(sent, vec![1, 2, 3], "every part sent once successfully");
    let video = outcome.accepted.operation.metadata.video_id.clone().unwrap();
    assert_eq!(source_sha256(&stack, outcome.upload_id.as_str(), video.as_str()).await, sha256(&std::fs::read(&file).unwrap()));
}

/// An upload the limits refuse: a clear message with the problem's title,
/// detail and code, a non-zero exit, and the problem as JSON with `--json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upload_refused_by_limits_says_why_and_fails() {
    let stack = Stack::start(&[]).await;
    let dir = temp_dir();
    let file = random_file(&dir, "picture.png", 4096);

    let out = run(vidctl(&stack, &dir).args(["upload", "--content-type", "image/png"]).arg(&file));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("error: "), "{stderr}");
    assert!(stderr.contains("code: unsupported_content_type"), "{stderr}");
    assert!(stderr.contains("image/png") && stderr.contains("video/mp4"), "the detail names the type and the allowed ones: {stderr}");

    let out = run(vidctl(&stack, &dir).args(["--json", "upload"]).arg(&file));
    assert_eq!(out.status.code(), Some(1), "a PNG is guessed as application/octet-stream and refused");
    let v = stdout_json(&out);
    assert_eq!(v["error"]["code"], "unsupported_content_type");
    assert_eq!(v["error"]["status"], 422);
    assert!(v["error"]["title"].as_str().is_some_and(|t| !t.is_empty()));

    // Configuration errors name what is missing.
    let out = run(Command::new(vidctl_path()).current_dir(&dir).env_remove("VIDCTL_API_KEY").args(["videos", "list"]));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--api-key") && stderr.contains("VIDCTL_API_KEY") && stderr.contains(".local/api-key"), "{stderr}");
}

/// `vidctl operations wait` on a cancelled operation prints the status and exits non-zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operations_wait_on_a_cancel_prints_it_and_fails() {
    let mut stack = Stack::start(&[]).await;
    // No worker: the operation stays pending until it is cancelled.
    stack.kill("transcoder");
    let dir = temp_dir();
    let file = dir.join("clip.mp4");
    make_video(&file, 320, 240, 1.0, "200k");
    let out = run(vidctl(&stack, &dir).args(["--json", "upload"]).arg(&file));
    assert!(out.status.success());
    let op = stdout_json(&out)["operation_id"].as_str().unwrap().to_owned();

    let out = run(vidctl(&stack, &dir).args(["operations", "cancel", &op]));
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("cancelled"));

    let out = run(vidctl(&stack, &dir).args(["operations", "wait", &op, "--timeout", "60"]));
    assert_eq!(out.status.code(), Some(2), "waiting on a cancelled operation fails");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains(&op) && stdout.contains("cancelled"), "{stdout}");
    assert!(stderr.contains("code: cancelled"), "{stderr}");

    let out = run(vidctl(&stack, &dir).args(["--json", "operations", "wait", &op]));
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stdout_json(&out)["status"], OperationStatus::Cancelled.as_str());

    let out = run(vidctl(&stack, &dir).args(["operations", "list", "--status", "cancelled"]));
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains(&op));
}

/// Webhook endpoints from the shell: create, list, get, update, deliveries,
/// retry, rotate-secret, enable, delete; and `verify` of a captured delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn endpoints_events_and_verify_from_the_shell() {
    let stack = Stack::start(&[]).await;
    let dir = temp_dir();
    let receiver = Receiver::start(200).await;
    let out = run(vidctl(&stack, &dir).args([
        "--json",
        "endpoints",
        "create",
        &receiver.url(),
        "--event-type",
        "video.ready",
        "--description",
        "e2e",
    ]));
    assert!(out.status.success());
    let created = stdout_json(&out);
    let (ep, secret) = (created["id"].as_str().unwrap().to_owned(), created["secret"].as_str().unwrap().to_owned());

    let file = dir.join("clip.mp4");
    make_video(&file, 320, 240, 1.0, "200k");
    let out = run(vidctl(&stack, &dir).args(["upload", "--wait", "--timeout", "600"]).arg(&file));
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("video ") && text.contains("operation ") && text.contains("RENDITION"), "{text}");

    let got = receiver
        .wait_for(Duration::from_secs(60), |r| r.body.windows(11).any(|w| w == b"video.ready"))
        .await
        .expect("video.ready delivered");
    let body_file = dir.join("body.json");
    std::fs::write(&body_file, &got.body).unwrap();
    let sig = format!("Webhook-Signature: {}", got.headers["webhook-signature"]);
    let out = run(vidctl(&stack, &dir).args(["verify", "--secret", &secret, "--header", &sig, "--body-file"]).arg(&body_file));
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("valid signature"));
    let mut tampered = got.body.to_vec();
    tampered.push(b'\n');
    std::fs::write(&body_file, tampered).unwrap();
    let out = run(vidctl(&stack, &dir).args(["verify", "--secret", &secret, "--header", &sig, "--body-file"]).arg(&body_file));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no_matching_signature"));

    let out = run(vidctl(&stack, &dir).args(["events", "list", "--type", "video.ready"]));
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("video.ready"));

    let out = run(vidctl(&stack, &dir).args(["endpoints", "list"]));
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains(&ep));
    let out = run(vidctl(&stack, &dir).args(["--json", "endpoints", "update", &ep, "--description", "changed"]));
    assert!(out.status.success());
    assert_eq!(stdout_json(&out)["description"], "changed");
    let out = run(vidctl(&stack, &dir).args(["endpoints", "get", &ep]));
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("changed"));

    let out = run(vidctl(&stack, &dir).args(["--json", "endpoints", "deliveries", &ep]));
    assert!(out.status.success());
    let deliveries = stdout_json(&out);
    let dlv = deliveries["data"][0]["id"].as_str().expect("a delivery").to_owned();
    let out = run(vidctl(&stack, &dir).args(["endpoints", "deliveries", &ep]));
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains(&dlv));
    let out = run(vidctl(&stack, &dir).args(["endpoints", "retry", &ep, &dlv]));
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("pending"));

    let out = run(vidctl(&stack, &dir).args(["--json", "endpoints", "rotate-secret", &ep]));
    assert!(out.status.success());
    let new_secret = stdout_json(&out)["secret"].as_str().unwrap().to_owned();
    assert!(new_secret.starts_with("whsec_") && new_secret != secret);
    let out = run(vidctl(&stack, &dir).args(["endpoints", "enable", &ep]));
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("enabled"));
    let out = run(vidctl(&stack, &dir).args(["endpoints", "delete", &ep]));
    assert!(out.status.success());
    let out = run(vidctl(&stack, &dir).args(["endpoints", "get", &ep]));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("code: not_found"));
}

/// `vidctl events list --created-after/--created-before` (RFC 3339) against
/// the real api binary: the bounds are exclusive, combine with `--type`, and
/// a value that is not RFC 3339 is refused before any request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_list_filters_by_time_from_the_shell() {
    use chrono::{Duration as Minutes, TimeZone, Utc};

    let stack = Stack::start(&[]).await;
    let dir = temp_dir();
    // Four events of the stack's one tenant, one minute apart, inserted as
    // the outbox writes them (the payload is the webhook body).
    let base = Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0).unwrap();
    let mut ids: Vec<vid_core::EventId> = (0..4).map(|_| vid_core::EventId::generate()).collect();
    ids.sort();
    let mut sql = String::new();
    for (i, id) in ids.iter().enumerate() {
        let at = base + Minutes::minutes(i as i64);
        let type_ = if i % 2 == 0 { "video.ready" } else { "video.failed" };
        let payload = serde_json::json!({
            "id": id, "type": type_, "created": at.timestamp(),
            "data": {"video_id": vid_core::VideoId::generate(), "operation_id": vid_core::OperationId::generate(), "version": 1},
        });
        sql.push_str(&format!(
            "INSERT INTO events (id, tenant_id, event_type, resource_id, payload, created_at) \
             SELECT '{id}', tenant_id, '{type_}', 'vid_x', '{payload}', '{}' FROM api_keys;\n",
            at.to_rfc3339()
        ));
    }
    let out = Command::new("psql").args([stack.database_url.as_str(), "-v", "ON_ERROR_STOP=1", "-qc", &sql]).output().expect("psql runs");
    assert!(out.status.success(), "psql: {}", String::from_utf8_lossy(&out.stderr));
    let listed = |args: &[&str]| {
        let out = run(vidctl(&stack, &dir).args(["--json", "events", "list"]).args(args));
        assert!(out.status.success(), "{args:?}");
        let v = stdout_json(&out);
        v["data"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect::<Vec<_>>()
    };
    let newest_first = |which: &[usize]| which.iter().rev().map(|&i| ids[i].to_string()).collect::<Vec<_>>();
    let at = |i: i64| (base + Minutes::minutes(i)).to_rfc3339();

    assert_eq!(listed(&[]), newest_first(&[0, 1, 2, 3]));
    assert_eq!(listed(&["--created-after", &at(1)]), newest_first(&[2, 3]));
    assert_eq!(listed(&["--created-before", &at(2)]), newest_first(&[0, 1]));
    assert_eq!(listed(&["--created-after", &at(0), "--created-before", &at(3)]), newest_first(&[1, 2]));
    // Another offset names the same instant; combined with the type filter.
    assert_eq!(listed(&["--created-after", "2026-03-01T13:00:30+01:00", "--type", "video.ready"]), newest_first(&[2]));
    // The table output too.
    let out = run(vidctl(&stack, &dir).args(["events", "list", "--created-after", &at(2)]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains(&ids[3].to_string()) && !text.contains(&ids[2].to_string()), "{text}");

    // Not RFC 3339: a usage error naming the flag, no request made.
    let out = run(vidctl(&stack, &dir).args(["events", "list", "--created-after", "yesterday"]));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--created-after") && err.contains("RFC 3339"), "{err}");
}

/// `vidctl` without a stack: a closed port for the API.
fn vidctl_offline(cache: &Path) -> Command {
    let mut cmd = Command::new(vidctl_path());
    cmd.env_remove("VIDCTL_API_URL").env("VIDCTL_API_KEY", "vidk_offline").env("XDG_CACHE_HOME", cache).stdin(Stdio::null());
    cmd
}

fn closed_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn resuming_uploader<'a>(client: &'a Client, state_dir: &Path) -> Uploader<'a> {
    Uploader::new(client).state_dir(Some(state_dir.to_owned())).parallel(1)
}

/// Resuming checks the upload first: an answer that does not say the upload
/// is gone (here `401`) fails and keeps the state file, and a content type
/// other than the upload's is refused, naming both; the upload then resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_resume_keeps_the_state_file() {
    let stack = Stack::start(&[PART_SIZE]).await;
    let dir = temp_dir();
    let state_dir = dir.join("state");
    let file = random_file(&dir, "two.mp4", 2 * 5 * MIB + 1);
    let client = &stack.client();
    resuming_uploader(client, &state_dir)
        .stop_after_parts(Some(1))
        .upload(&file, Some("video/mp4"))
        .await
        .expect_err("stopped after one part");
    let state = resuming_uploader(client, &state_dir).state_path(&file).unwrap();
    let read_id = || -> String {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&state).expect("the state file is kept")).unwrap();
        v["upload_id"].as_str().unwrap().to_owned()
    };
    let id = read_id();

    let wrong_key = &Client::new(&stack.api_url, "vidk_wrong");
    let err = resuming_uploader(wrong_key, &state_dir).upload(&file, Some("video/mp4")).await.expect_err("the key is refused");
    assert_eq!(err.problem().map(|p| p.status), Some(401), "{err}");
    assert_eq!(read_id(), id, "a refused resume check keeps the state file");

    let err =
        resuming_uploader(client, &state_dir).upload(&file, Some("video/quicktime")).await.expect_err("another content type is refused");
    let msg = err.to_string();
    assert!(matches!(err, ClientError::ContentTypeMismatch { .. }), "{msg}");
    assert!(msg.contains("video/mp4") && msg.contains("video/quicktime") && msg.contains(&format!("vidctl uploads abort {id}")), "{msg}");
    assert_eq!(read_id(), id);

    let outcome = resuming_uploader(client, &state_dir).upload(&file, None).await.expect("resumes");
    assert!(outcome.resumed);
    assert_eq!(outcome.upload_id.as_str(), id);
    let mut sent = outcome.parts_sent.clone();
    sent.sort_unstable();
    assert_eq!(sent, vec![2, 3], "only the parts storage lacked");
}

/// A cache directory that cannot hold the resume state (here a file) does not
/// stop the upload: vidctl warns that it cannot be resumed and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unusable_state_dir_warns_and_uploads() {
    let stack = Stack::start(&[]).await;
    let dir = temp_dir();
    let cache = dir.join("cache-is-a-file");
    std::fs::write(&cache, b"x").unwrap();
    let file = random_file(&dir, "small.mp4", 64 * 1024);
    let out = run(vidctl(&stack, &cache).args(["--json", "upload", "--content-type", "video/mp4"]).arg(&file));
    assert!(out.status.success(), "the upload goes on without its state");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let want = format!("warning: cannot save resume state in {}", cache.join("vidctl/uploads").display());
    assert!(stderr.contains(&want) && stderr.contains("this upload cannot be resumed"), "{stderr}");
    assert_eq!(stdout_json(&out)["resumed"], false);
}

/// A second upload of a file being uploaded fails at once naming the upload;
/// when the upload is aborted meanwhile, storage's `NoSuchUpload` is told as
/// a code and a hint, without the bucket or key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_upload_of_the_same_file_fails_at_once() {
    let stack = Stack::start(&[]).await;
    let dir = temp_dir();
    let state_dir = dir.join("vidctl/uploads");
    // One small part: storage reads all of it before answering (a large
    // body may see the connection closed under it instead of the answer).
    let file = random_file(&dir, "busy.mp4", 64 * 1024);
    let client = stack.client();
    let first = {
        let (client, file, state_dir) = (client.clone(), file.clone(), state_dir.clone());
        tokio::spawn(async move {
            Uploader::new(&client)
                .state_dir(Some(state_dir))
                .delay_before_send(Some(Duration::from_secs(3)))
                .upload(&file, Some("video/mp4"))
                .await
        })
    };
    let id = state_file_upload(&dir, Duration::from_secs(30)).await;

    let started = Instant::now();
    let err = Uploader::new(&client).state_dir(Some(state_dir)).upload(&file, Some("video/mp4")).await.expect_err("busy");
    let msg = err.to_string();
    assert!(matches!(err, ClientError::Busy { .. }), "{msg}");
    assert!(msg.contains("another vidctl is uploading this file") && msg.contains(id.as_str()), "{msg}");
    assert!(started.elapsed() < Duration::from_secs(2), "fails at once");

    client.abort_upload(&id).await.unwrap();
    let err = first.await.unwrap().expect_err("the aborted upload fails");
    let msg = format!("{:#}", anyhow::Error::from(err));
    assert!(msg.contains("NoSuchUpload") && msg.contains("completed or aborted elsewhere"), "{msg}");
    assert!(!msg.contains("tenants/") && !msg.contains("<Resource>"), "{msg}");
}

/// With `--json`, an API that cannot be reached is an `{"error": …}` on stdout too.
#[test]
fn json_error_when_the_api_is_unreachable() {
    let dir = temp_dir();
    let closed = closed_port();
    let out = run(vidctl_offline(&dir).args(["--json", "--api-url", &format!("http://{closed}"), "videos", "list"]));
    assert_eq!(out.status.code(), Some(1));
    let detail = stdout_json(&out)["error"]["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("cannot reach the API") && detail.contains("Connection refused"), "{detail}");
}

/// "cannot reach the API" says why.
#[test]
fn an_unreachable_api_is_named_with_the_cause() {
    let dir = temp_dir();
    let closed = closed_port();
    let out = run(vidctl_offline(&dir).args(["--api-url", &format!("http://{closed}"), "videos", "list"]));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("cannot reach the API at http://{closed}: Connection refused")), "{stderr}");
}

/// An upper-case scheme is the same URL: the friendly message too.
#[test]
fn an_upper_case_scheme_is_recognised() {
    let dir = temp_dir();
    let closed = closed_port();
    let out = run(vidctl_offline(&dir).args(["--api-url", &format!("HTTP://{closed}"), "videos", "list"]));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("cannot reach the API at http://{closed}")), "{stderr}");
}

/// `--api-url` without a scheme says what is missing.
#[test]
fn an_api_url_without_a_scheme_is_refused_clearly() {
    let dir = temp_dir();
    let out = run(vidctl_offline(&dir).args(["--api-url", "127.0.0.1:8080", "videos", "list"]));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("http://127.0.0.1:8080") && !stderr.contains("relative URL"), "{stderr}");
}

/// A directory given as the file is not a regular file.
#[test]
fn uploading_a_directory_says_it_is_not_a_file() {
    let dir = temp_dir();
    let api = format!("http://{}", closed_port());
    let out = run(vidctl_offline(&dir).args(["--api-url", &api, "upload"]).arg(&dir));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("{}: not a regular file", dir.display())), "{stderr}");
}

/// A file that cannot be opened is named, and the cause said once.
#[test]
fn a_missing_file_is_named_and_the_cause_said_once() {
    let dir = temp_dir();
    let api = format!("http://{}", closed_port());
    let missing = dir.join("missing.mp4");
    let out = run(vidctl_offline(&dir).args(["--api-url", &api, "upload"]).arg(&missing));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("{}: No such file or directory", missing.display())), "{stderr}");
    assert_eq!(stderr.matches("No such file or directory").count(), 1, "{stderr}");
}

/// Usage errors exit 64 (2 is an awaited operation that failed); help and version exit 0.
#[test]
fn usage_errors_exit_64() {
    let dir = temp_dir();
    for args in [&["--bogus"][..], &["upload"], &["events", "list", "--created-after", "yesterday"], &[]] {
        let out = run(vidctl_offline(&dir).args(args));
        assert_eq!(out.status.code(), Some(64), "{args:?}");
    }
    for args in [["--help"], ["--version"]] {
        let out = run(vidctl_offline(&dir).args(args));
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(!out.stdout.is_empty());
    }
}
