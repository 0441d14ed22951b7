//! The worker against the real stack: RabbitMQ on 127.0.0.1:5672 and Garage S3,
//! with the credentials `scripts/stack.sh infra-up` writes to `.local/stack.env`
//! (or the same `VID__…` variables in the environment). Every test starts its
//! own worker with a unique AMQP prefix and S3 key prefix, which keeps it away
//! from everything else, the other tests of this file included.
//!
//! One test per scenario: success with the report sequence and the outputs in
//! S3; a PNG (permanent failure); a malformed job (acked); a missing source
//! (transient: requeued until the delivery limit dead-letters it); a cancel
//! while transcoding; a graceful shutdown that hands the running job back to
//! the queue (a republished copy; see `tests/shutdown.rs` for the delivery
//! count); two copies of one job as two runs, with a cancel naming one run
//! and a cancel naming none (issue 24); a late duplicate stopped by a cancel
//! naming its run, which deletes nothing. Each checks what the worker's `/metrics` page counted for it: the
//! `amqp_messages_consumed_total` samples carry the test's own queue name, so
//! they are exact; `transcode_jobs_total` is process-wide, hence "at least".

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use vid_core::messages::{CancelTranscode, ReportKind, TranscodeJob, TranscodeReport};
use vid_core::operation::Phase;
use vid_core::{OperationId, TenantId, VideoId};
use vid_infra::amqp::{Publisher, Topology, RK_JOB, RK_REPORT};
use vid_infra::settings::{AmqpSettings, LogFormat, S3Settings, TelemetrySettings};
use vid_infra::SecretString;
use vid_transcoder::settings::{ScannerSettings, Settings, TranscoderSettings};
use vid_transcoder::worker::Worker;

fn settings(env: &HashMap<String, String>, prefix: &str, work_dir: &Path) -> Settings {
    Settings {
        telemetry: TelemetrySettings { format: LogFormat::Pretty, level: "warn".into() },
        amqp: AmqpSettings { url: SecretString::from(env["VID__AMQP__URL"].clone()), prefix: prefix.into() },
        s3: S3Settings {
            endpoint: env["VID__S3__ENDPOINT"].clone(),
            public_endpoint: None,
            region: env.get("VID__S3__REGION").cloned().unwrap_or_else(|| "garage".into()),
            bucket: env["VID__S3__BUCKET"].clone(),
            access_key_id: env["VID__S3__ACCESS_KEY_ID"].clone(),
            secret_access_key: SecretString::from(env["VID__S3__SECRET_ACCESS_KEY"].clone()),
        },
        transcoder: TranscoderSettings {
            health_listen: "127.0.0.1:0".parse().unwrap(),
            concurrency: 2,
            work_dir: work_dir.into(),
            max_duration_seconds: 600.0,
            max_width: 4096,
            max_height: 4096,
            stall_timeout_seconds: 60,
            ladder: vec![1080, 720, 480, 360],
            shutdown_grace_seconds: 1,
            retry_backoff_seconds: 0.2,
            segment_seconds: 4.0,
        },
        scanner: ScannerSettings {
            address: env.get("VID__SCANNER__ADDRESS").cloned().unwrap_or_else(|| "127.0.0.1:3310".into()),
            ..ScannerSettings::default()
        },
    }
}

/// One test's world: its own broker names, key prefix, work dir and running worker.
struct Harness {
    s3: aws_sdk_s3::Client,
    bucket: String,
    publisher: Publisher,
    topology: Topology,
    reports: Reports,
    key_prefix: String,
    work_dir: tempfile::TempDir,
    clips: Clips,
    _clips_dir: tempfile::TempDir,
    ready: Arc<AtomicBool>,
    stop: tokio::sync::watch::Sender<bool>,
    running: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Harness {
    /// Declares a fresh topology, starts the report collector and a worker,
    /// and waits (≤ 20 s) until the worker consumes.
    async fn start() -> Self {
        let env = stack_env();
        let unique = format!("vidtest{}", OperationId::generate().as_str().to_lowercase().replace("op_", ""));
        let clips_dir = tempfile::tempdir().unwrap();
        let work_dir = tempfile::tempdir().unwrap();
        let settings = settings(&env, &unique, work_dir.path());
        // The test's side of the broker: publisher and the report collector.
        let (publisher, topology, reports) = broker_side(&settings.amqp, true).await;
        let worker = Worker::new(settings.clone(), PathBuf::from(env!("CARGO_BIN_EXE_transcoder")));
        let ready = worker.ready.clone();
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let running = tokio::spawn(async move { worker.run(stop_rx).await });
        let t = Instant::now();
        while !ready.load(Ordering::SeqCst) {
            assert!(t.elapsed() < Duration::from_secs(20), "worker never got ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self {
            s3: vid_infra::storage::client(&settings.s3),
            bucket: settings.s3.bucket.clone(),
            publisher,
            topology,
            reports,
            key_prefix: format!("test/{unique}/"),
            work_dir,
            clips: Clips::new(clips_dir.path()),
            _clips_dir: clips_dir,
            ready,
            stop,
            running: Some(running),
        }
    }

    fn work_dir(&self) -> &Path {
        self.work_dir.path()
    }

    fn channel(&self) -> &lapin::Channel {
        self.publisher.channel()
    }

    async fn put(&self, key: &str, path: &Path) {
        let body = aws_sdk_s3::primitives::ByteStream::from_path(path).await.unwrap();
        self.s3.put_object().bucket(&self.bucket).key(key).body(body).send().await.unwrap();
    }

    /// Uploads `source` (if any) and publishes its job, as the api's outbox does.
    async fn submit(&self, source: Option<&Path>) -> TranscodeJob {
        let job = self.upload_job(source).await;
        self.publish(&job).await;
        job
    }

    /// Uploads `source` (if any) and returns its job (attempt 1), unpublished.
    async fn upload_job(&self, source: Option<&Path>) -> TranscodeJob {
        let op = OperationId::generate();
        let source_key = format!("{}{op}/source", self.key_prefix);
        let size = match source {
            Some(p) => {
                self.put(&source_key, p).await;
                std::fs::metadata(p).unwrap().len()
            }
            None => 1234,
        };
        TranscodeJob {
            operation_id: op.clone(),
            video_id: VideoId::generate(),
            tenant_id: TenantId::generate(),
            source_key,
            source_size_bytes: size,
            output_prefix: format!("{}{op}/out/", self.key_prefix),
            attempt: 1,
            mp4_support: Default::default(),
            poster_time: None,
        }
    }

    /// Publishes `job` (once more: a duplicate or a re-drive is the same message).
    async fn publish(&self, job: &TranscodeJob) {
        let op = job.operation_id.as_str();
        self.publisher.publish_json(&self.topology.transcode_exchange(), RK_JOB, job, Some(op)).await.unwrap();
    }

    /// Publishes a `CancelTranscode` for `job`, for the run `run_id` or (None) every run.
    async fn cancel(&self, job: &TranscodeJob, run_id: Option<&str>) {
        let c = CancelTranscode { operation_id: job.operation_id.clone(), run_id: run_id.map(str::to_owned) };
        self.publisher.publish_json(&self.topology.control_exchange(), "", &c, None).await.unwrap();
    }

    /// Waits (≤ 60 s) until two runs of `job` are transcoding; returns their run ids.
    async fn two_runs_transcoding(&self, job: &TranscodeJob) -> (String, String) {
        let transcoding = |r: &[TranscodeReport]| {
            let mut runs: Vec<String> = r
                .iter()
                .filter(|r| matches!(r.kind, ReportKind::Progress { phase: Phase::Transcoding, .. }))
                .map(|r| r.run_id.clone())
                .collect();
            runs.sort();
            runs.dedup();
            runs
        };
        let r = self.wait_for(job, "two runs transcoding", Duration::from_secs(60), |r| transcoding(r).len() >= 2).await;
        let runs = transcoding(&r);
        (runs[0].clone(), runs[1].clone())
    }

    fn reports(&self, job: &TranscodeJob) -> Vec<TranscodeReport> {
        self.reports.lock().unwrap().get(job.operation_id.as_str()).cloned().unwrap_or_default()
    }

    async fn wait_for(
        &self,
        job: &TranscodeJob,
        what: &str,
        timeout: Duration,
        f: impl Fn(&[TranscodeReport]) -> bool,
    ) -> Vec<TranscodeReport> {
        let t = Instant::now();
        loop {
            let r = self.reports(job);
            if f(&r) {
                return r;
            }
            assert!(t.elapsed() < timeout, "timed out waiting for {what}; reports so far: {r:#?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn terminal(&self, job: &TranscodeJob) -> Vec<TranscodeReport> {
        self.wait_for(job, "a terminal report", Duration::from_secs(120), |r| r.iter().any(is_terminal)).await
    }

    async fn transcoding(&self, job: &TranscodeJob) {
        self.wait_for(job, "the transcoding phase", Duration::from_secs(60), |r| {
            r.iter().any(|r| matches!(r.kind, ReportKind::Progress { phase: Phase::Transcoding, .. }))
        })
        .await;
    }

    /// Every report published before this call has reached the collector:
    /// a marker report is published through the same exchange into the same
    /// (FIFO, single-consumer) queue, and this returns once it arrived.
    async fn reports_delivered(&self) {
        let marker = TranscodeJob {
            operation_id: OperationId::generate(),
            video_id: VideoId::generate(),
            tenant_id: TenantId::generate(),
            source_key: String::new(),
            source_size_bytes: 0,
            output_prefix: String::new(),
            attempt: 1,
            mp4_support: Default::default(),
            poster_time: None,
        };
        let report = TranscodeReport {
            operation_id: marker.operation_id.clone(),
            video_id: marker.video_id.clone(),
            worker: "queue-test-marker".into(),
            emitted_at: chrono::Utc::now(),
            run_id: String::new(),
            attempt: 1,
            kind: ReportKind::Started,
        };
        let op = marker.operation_id.as_str();
        self.publisher.publish_json(&self.topology.reports_exchange(), RK_REPORT, &report, Some(op)).await.unwrap();
        self.wait_for(&marker, "the marker report", Duration::from_secs(10), |r| !r.is_empty()).await;
    }

    async fn keys_under(&self, prefix: &str) -> Vec<String> {
        let out = self.s3.list_objects_v2().bucket(&self.bucket).prefix(prefix).send().await.unwrap();
        out.contents().iter().filter_map(|o| o.key().map(str::to_owned)).collect()
    }

    /// Every object under `prefix`: key → (bytes, last modified).
    async fn objects_under(&self, prefix: &str) -> HashMap<String, (Vec<u8>, aws_sdk_s3::primitives::DateTime)> {
        let out = self.s3.list_objects_v2().bucket(&self.bucket).prefix(prefix).send().await.unwrap();
        let mut objects = HashMap::new();
        for o in out.contents() {
            let key = o.key().unwrap().to_owned();
            let got = self.s3.get_object().bucket(&self.bucket).key(&key).send().await.unwrap();
            let bytes = got.body.collect().await.unwrap().into_bytes().to_vec();
            objects.insert(key, (bytes, *o.last_modified().unwrap()));
        }
        objects
    }

    /// Waits (≤ 120 s) until an object under `prefix` was written after `since`.
    async fn rewritten_after(&self, prefix: &str, since: aws_sdk_s3::primitives::DateTime) {
        let t = Instant::now();
        loop {
            let out = self.s3.list_objects_v2().bucket(&self.bucket).prefix(prefix).send().await.unwrap();
            if out.contents().iter().any(|o| o.last_modified().is_some_and(|m| m.as_nanos() > since.as_nanos())) {
                return;
            }
            assert!(t.elapsed() < Duration::from_secs(120), "no object under {prefix} was written again");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Messages ready in this test's jobs queue.
    async fn jobs_ready(&self) -> u32 {
        let q = self
            .channel()
            .queue_declare(
                &self.topology.transcode_jobs(),
                QueueDeclareOptions { passive: true, ..Default::default() },
                FieldTable::default(),
            )
            .await
            .unwrap();
        q.message_count()
    }

    /// `amqp_messages_consumed_total{queue=<this test's jobs queue>, outcome}`.
    fn consumed(&self, outcome: &str) -> f64 {
        sample("amqp_messages_consumed_total", &[("queue", &self.topology.transcode_jobs()), ("outcome", outcome)])
    }

    /// Waits (≤ 30 s) until this test's jobs queue counted `n` settlements of `outcome`.
    async fn wait_consumed(&self, outcome: &str, n: f64) {
        let t = Instant::now();
        while self.consumed(outcome) < n {
            assert!(t.elapsed() < Duration::from_secs(30), "never {n} × {outcome}:\n{}", vid_transcoder::health::render_metrics());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the worker gracefully (≤ 15 s) and returns how long that took.
    async fn shut_down(&mut self) -> Duration {
        let t = Instant::now();
        self.stop.send(true).unwrap();
        let running = self.running.take().expect("running");
        tokio::time::timeout(Duration::from_secs(15), running).await.expect("shutdown finishes").unwrap().unwrap();
        t.elapsed()
    }

    /// Stops the worker (if running) and deletes the test's broker names and objects.
    async fn finish(mut self) {
        if self.running.is_some() {
            self.shut_down().await;
        }
        delete_broker_names(self.channel(), &self.topology).await;
        for k in self.keys_under(&self.key_prefix).await {
            let _ = self.s3.delete_object().bucket(&self.bucket).key(k).send().await;
        }
    }
}

/// The sum of the samples of `name` on the worker's `/metrics` page that carry all of `labels`.
fn sample(name: &str, labels: &[(&str, &str)]) -> f64 {
    let page = vid_transcoder::health::render_metrics();
    page.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Waits (≤ 5 s) until `transcode_jobs_total{outcome}` (process-wide) is at
/// least `at_least`: the worker counts it just after it settles the delivery.
async fn assert_jobs_total(outcome: &str, at_least: f64) {
    let t = Instant::now();
    while sample("transcode_jobs_total", &[("outcome", outcome)]) < at_least {
        let page = vid_transcoder::health::render_metrics();
        assert!(t.elapsed() < Duration::from_secs(5), "transcode_jobs_total{{outcome={outcome}}} < {at_least}:\n{page}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A canonical ULID: 26 Crockford base-32 characters.
fn is_ulid(s: &str) -> bool {
    s.len() == 26 && ulid::Ulid::from_string(s).is_ok()
}

/// The reports of one run.
fn of_run(reports: &[TranscodeReport], run_id: &str) -> Vec<TranscodeReport> {
    reports.iter().filter(|r| r.run_id == run_id).cloned().collect()
}

fn is_terminal(r: &TranscodeReport) -> bool {
    matches!(r.kind, ReportKind::Succeeded { .. } | ReportKind::Failed { .. })
}

/// Started first; progress phases in order, percent non-decreasing ≤ 99, ≤ 1 per second; one terminal, last.
fn check_sequence(reports: &[TranscodeReport]) {
    assert!(matches!(reports.first().map(|r| &r.kind), Some(ReportKind::Started)), "{reports:#?}");
    let order = |p: Phase| {
        [Phase::Downloading, Phase::Scanning, Phase::Probing, Phase::Transcoding, Phase::Uploading].iter().position(|x| *x == p).unwrap()
    };
    let mut last: Option<(usize, u8, chrono::DateTime<chrono::Utc>)> = None;
    for r in reports {
        if let ReportKind::Progress { phase, percent } = r.kind {
            assert!(percent <= 99);
            if let Some((p, pc, at)) = last {
                assert!(order(phase) >= p && percent >= pc, "progress went backwards: {reports:#?}");
                assert!((r.emitted_at - at).num_milliseconds() >= 950, "more than one progress report a second: {reports:#?}");
            }
            last = Some((order(phase), percent, r.emitted_at));
        }
    }
    assert_eq!(reports.iter().filter(|r| is_terminal(r)).count(), 1, "{reports:#?}");
    assert!(is_terminal(reports.last().unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_succeeds_with_its_reports_and_outputs_in_s3() {
    let h = Harness::start().await;
    let src = h.clips.av("ok.mp4", "640x360", "3");
    let job = h.submit(Some(&src)).await;
    let r = h.terminal(&job).await;
    for x in &r {
        eprintln!("{} {:?}", x.emitted_at.format("%H:%M:%S%.3f"), x.kind);
    }
    check_sequence(&r);
    assert!(is_ulid(&r[0].run_id), "a run id is a ULID: {:?}", r[0].run_id);
    assert!(r.iter().all(|x| x.run_id == r[0].run_id && x.attempt == 1), "one run, attempt echoed: {r:#?}");
    let ReportKind::Succeeded { source, renditions, poster, stream } = &r.last().unwrap().kind else { panic!("{r:#?}") };
    assert_eq!((source.width, source.height), (640, 360));
    assert_eq!(renditions.iter().map(|r| (r.name.as_str(), r.width, r.height)).collect::<Vec<_>>(), vec![("360p", 640, 360)]);
    assert_eq!(renditions[0].storage_key, format!("{}renditions/360p.mp4", job.output_prefix));
    let poster = poster.as_ref().expect("poster");
    assert_eq!(poster.storage_key, format!("{}poster.jpg", job.output_prefix));
    let head = h.s3.head_object().bucket(&h.bucket).key(&renditions[0].storage_key).send().await.unwrap();
    assert_eq!(head.content_type(), Some("video/mp4"));
    assert_eq!(head.content_length(), Some(renditions[0].size_bytes as i64));
    let head = h.s3.head_object().bucket(&h.bucket).key(&poster.storage_key).send().await.unwrap();
    assert_eq!(head.content_type(), Some("image/jpeg"));
    let got = h.s3.get_object().bucket(&h.bucket).key(&renditions[0].storage_key).send().await.unwrap();
    let local = h.clips.path("got.mp4");
    std::fs::write(&local, got.body.collect().await.unwrap().into_bytes()).unwrap();
    let p = ffprobe(&local);
    assert_eq!(p["streams"][0]["codec_name"], "h264");
    assert_eq!(p["streams"][1]["codec_name"], "aac");
    assert!(!h.work_dir().join(job.operation_id.as_str()).exists(), "work dir removed");
    // The stream: every object under its prefix, the manifests with their content types.
    let stream = stream.as_ref().expect("the stream is reported");
    assert_eq!(stream.prefix, format!("{}stream/", job.output_prefix));
    assert_eq!(stream.hls_master_key, format!("{}master.m3u8", stream.prefix));
    assert_eq!(stream.dash_manifest_key, format!("{}manifest.mpd", stream.prefix));
    let keys = h.keys_under(&stream.prefix).await;
    assert_eq!(keys.len() as u32, stream.objects, "{keys:?}");
    // 3 s of 360p with audio in 4 s segments: per track init + 1 segment + playlist; master + MPD;
    // issue 20's images: the frames at 0, 1, 2 s and the last one, the sheet, its VTT and JSON, the poster.
    assert_eq!(stream.objects, 2 * 3 + 2 + 4 + 4, "{keys:?}");
    let images = stream.images.as_ref().expect("the images are reported");
    assert_eq!((images.frames_ms.len(), images.interval_ms, images.tile_width), (4, 1000, 160), "{images:?}");
    assert!(keys.iter().any(|k| k.ends_with("stream/storyboard.vtt")) && keys.iter().any(|k| k.ends_with("stream/poster.jpg")), "{keys:?}");
    for (key, content_type) in [
        (&stream.hls_master_key, "application/vnd.apple.mpegurl"),
        (&stream.dash_manifest_key, "application/dash+xml"),
        (&format!("{}360p/seg-00001.m4s", stream.prefix), "video/mp4"),
        (&format!("{}audio/init.mp4", stream.prefix), "audio/mp4"),
    ] {
        let head = h.s3.head_object().bucket(&h.bucket).key(key).send().await.unwrap();
        assert_eq!(head.content_type(), Some(content_type), "{key}");
    }
    let master = h.s3.get_object().bucket(&h.bucket).key(&stream.hls_master_key).send().await.unwrap();
    let master = String::from_utf8(master.body.collect().await.unwrap().into_bytes().to_vec()).unwrap();
    assert!(master.contains("\n360p/index.m3u8\n") && master.contains("URI=\"audio/index.m3u8\""), "relative URIs: {master}");

    // The ack follows the terminal report's confirm: wait for it, then count.
    h.wait_consumed("ack", 1.0).await;
    assert_eq!(h.consumed("ack"), 1.0);
    assert_eq!(h.consumed("requeue"), 0.0);
    assert_jobs_total("succeeded", 1.0).await;
    assert!(sample("transcode_duration_seconds_count", &[("rendition", "360p")]) >= 1.0);
    let page = vid_transcoder::health::render_metrics();
    assert!(page.contains("vid_transcoder_scans_total{outcome="), "the scan counters stay on the page:\n{page}");
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_png_renamed_mp4_fails_permanently() {
    let h = Harness::start().await;
    let png = h.clips.path("image.mp4");
    ffmpeg(&["-f", "lavfi", "-i", "testsrc=size=64x64", "-frames:v", "1", "-f", "image2", "-c:v", "png", png.to_str().unwrap()]);
    let bad = h.submit(Some(&png)).await;
    let r = h.terminal(&bad).await;
    check_sequence(&r);
    let ReportKind::Failed { error, source } = &r.last().unwrap().kind else { panic!("{r:#?}") };
    assert_eq!((error.code.as_str(), error.status, source.is_none()), ("unsupported_container", 422, true));
    h.wait_consumed("ack", 1.0).await;
    assert_eq!((h.consumed("ack"), h.consumed("requeue")), (1.0, 0.0));
    assert_jobs_total("failed", 1.0).await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_job_is_acked_and_dropped() {
    let h = Harness::start().await;
    h.publisher.publish(&h.topology.transcode_exchange(), RK_JOB, b"{not json", None).await.unwrap();
    h.wait_consumed("ack", 1.0).await;
    assert_eq!((h.consumed("ack"), h.consumed("requeue")), (1.0, 0.0));
    assert_eq!(h.jobs_ready().await, 0, "acked, not requeued");
    let dead = h.channel().basic_get(&h.topology.transcode_dead(), BasicGetOptions { no_ack: true }).await.unwrap();
    assert!(dead.is_none(), "dropped, not dead-lettered");
    assert_jobs_total("malformed", 1.0).await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_source_is_requeued_until_dead_lettered() {
    let h = Harness::start().await;
    let missing = h.submit(None).await;
    let t = Instant::now();
    let dead = loop {
        let got = h.channel().basic_get(&h.topology.transcode_dead(), BasicGetOptions { no_ack: true }).await.unwrap();
        if let Some(m) = got {
            break serde_json::from_slice::<TranscodeJob>(&m.delivery.data).unwrap();
        }
        assert!(t.elapsed() < Duration::from_secs(60), "never dead-lettered; reports: {:#?}", h.reports(&missing));
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(dead.operation_id, missing.operation_id);
    let r = h.reports(&missing);
    assert!(r.iter().all(|r| !is_terminal(r)), "a transient failure reports nothing terminal: {r:#?}");
    assert!(r.iter().filter(|r| r.kind == ReportKind::Started).count() >= 5, "one Started per delivery: {r:#?}");
    h.wait_consumed("requeue", 5.0).await;
    assert_eq!(h.consumed("ack"), 0.0);
    assert_jobs_total("retry", 5.0).await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_while_transcoding_stops_the_work_and_deletes_the_outputs() {
    let h = Harness::start().await;
    let long = h.clips.av("long.mp4", "1280x720", "20");
    let job = h.submit(Some(&long)).await;
    h.transcoding(&job).await;
    let wd = h.work_dir().join(job.operation_id.as_str());
    assert!(wd.exists());
    let t = Instant::now();
    h.cancel(&job, None).await;
    // The issue asks for 2 s on an idle machine; the bound here only catches
    // a cancel that is lost or waits for the encode (the clip is 20 s long).
    while wd.exists() {
        assert!(t.elapsed() < Duration::from_secs(10), "work not stopped within 10 s of the cancel");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stopped_after = t.elapsed();
    let stopped_at = chrono::Utc::now();
    // No fixed sleep: the delivery is acked only after the job has published
    // all it ever will (every report is confirmed first), and the marker
    // report then proves the collector has received all of those.
    h.wait_consumed("ack", 1.0).await;
    h.reports_delivered().await;
    let r = h.reports(&job);
    eprintln!("cancel: stopped after {stopped_after:?}; reports {:?}", r.iter().map(|r| &r.kind).collect::<Vec<_>>());
    assert!(r.iter().all(|r| !is_terminal(r)), "nothing terminal after a cancel: {r:#?}");
    let late: Vec<_> = r.iter().filter(|r| r.emitted_at > stopped_at + chrono::Duration::seconds(1)).collect();
    assert!(late.is_empty(), "nothing reported once the work stopped: {late:#?}");
    assert!(h.keys_under(&job.output_prefix).await.is_empty(), "no outputs left after a cancel");
    assert_eq!((h.consumed("ack"), h.consumed("requeue")), (1.0, 0.0));
    assert!(sample("amqp_messages_consumed_total", &[("queue", &h.topology.control_exchange()), ("outcome", "ack")]) >= 1.0);
    assert_jobs_total("cancelled", 1.0).await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_hands_the_running_job_back() {
    let mut h = Harness::start().await;
    let long = h.clips.av("long.mp4", "1280x720", "20");
    let job = h.submit(Some(&long)).await;
    h.transcoding(&job).await;
    let took = h.shut_down().await;
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert!(!h.ready.load(Ordering::SeqCst));
    assert!(h.reports(&job).iter().all(|r| !is_terminal(r)));
    assert!(!h.work_dir().join(job.operation_id.as_str()).exists(), "work dir removed on shutdown");
    assert_eq!(std::fs::read_dir(h.work_dir()).unwrap().count(), 0, "no job directory or lock file left");
    assert_eq!(h.jobs_ready().await, 1, "only the requeued shutdown job is left");
    let m = h.channel().basic_get(&h.topology.transcode_jobs(), BasicGetOptions { no_ack: true }).await.unwrap().expect("handed-back job");
    assert_eq!(serde_json::from_slice::<TranscodeJob>(&m.delivery.data).unwrap().operation_id, job.operation_id);
    assert_eq!((h.consumed("requeue"), h.consumed("ack")), (1.0, 0.0));
    assert_jobs_total("shutdown", 1.0).await;
    h.finish().await;
}

/// Issue 24: the same job message delivered twice to one worker (concurrency
/// 2) is two runs with two run ids; a cancel naming one run stops only that
/// run, the other finishes and succeeds. Every report echoes the job's attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_copies_are_two_runs_and_a_cancel_naming_one_stops_only_that_run() {
    let h = Harness::start().await;
    let src = h.clips.av("long.mp4", "1280x720", "12");
    let job = TranscodeJob { attempt: 2, ..h.upload_job(Some(&src)).await };
    h.publish(&job).await;
    h.publish(&job).await;
    let (a, b) = h.two_runs_transcoding(&job).await;
    assert!(is_ulid(&a) && is_ulid(&b) && a != b, "two different run ids: {a} {b}");
    h.cancel(&job, Some(&a)).await;
    h.terminal(&job).await;
    h.wait_consumed("ack", 2.0).await;
    h.reports_delivered().await;
    let r = h.reports(&job);
    let (ra, rb) = (of_run(&r, &a), of_run(&r, &b));
    assert_eq!(ra.len() + rb.len(), r.len(), "every report carries one of the two runs: {r:#?}");
    assert!(r.iter().all(|x| x.attempt == 2), "the attempt is echoed: {r:#?}");
    assert!(ra.iter().all(|x| !is_terminal(x)), "the cancelled run reports nothing terminal: {ra:#?}");
    check_sequence(&rb);
    let ReportKind::Succeeded { renditions, .. } = &rb.last().unwrap().kind else { panic!("the other run succeeds: {rb:#?}") };
    let keys = h.keys_under(&job.output_prefix).await;
    assert!(renditions.iter().all(|x| keys.contains(&x.storage_key)), "the surviving run's outputs stay: {keys:?}");
    assert_eq!((h.consumed("ack"), h.consumed("requeue")), (2.0, 0.0));
    assert_eq!(std::fs::read_dir(h.work_dir()).unwrap().count(), 0, "both job directories removed");
    assert_jobs_total("cancelled", 1.0).await;
    assert_jobs_total("succeeded", 1.0).await;
    h.finish().await;
}

/// A cancel without a run id (the customer's `:cancel`) stops every run of the operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_without_a_run_id_stops_every_run() {
    let h = Harness::start().await;
    let src = h.clips.av("long.mp4", "1280x720", "12");
    let job = h.upload_job(Some(&src)).await;
    h.publish(&job).await;
    h.publish(&job).await;
    let (a, b) = h.two_runs_transcoding(&job).await;
    h.cancel(&job, None).await;
    h.wait_consumed("ack", 2.0).await;
    h.reports_delivered().await;
    let r = h.reports(&job);
    assert!(r.iter().all(|x| !is_terminal(x) && (x.run_id == a || x.run_id == b)), "both runs stopped, nothing terminal: {r:#?}");
    assert!(h.keys_under(&job.output_prefix).await.is_empty(), "no outputs left after a cancel");
    assert_eq!((h.consumed("ack"), h.consumed("requeue")), (2.0, 0.0));
    assert_eq!(std::fs::read_dir(h.work_dir()).unwrap().count(), 0, "both job directories removed");
    assert_jobs_total("cancelled", 2.0).await;
    h.finish().await;
}

/// A late duplicate stopped by a cancel NAMING its run (the api's "the latest
/// Started wins") deletes nothing, even after it has begun to write the
/// operation's keys again: those keys are the finished run's outputs too.
/// Only the customer's cancel (no run id) deletes outputs (see
/// `a_cancel_without_a_run_id_stops_every_run`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_targeted_cancel_of_a_late_duplicate_deletes_nothing() {
    let h = Harness::start().await;
    let src = h.clips.av("long.mp4", "1280x720", "12");
    let job = h.upload_job(Some(&src)).await;
    h.publish(&job).await;
    let first = h.terminal(&job).await;
    assert!(matches!(first.last().unwrap().kind, ReportKind::Succeeded { .. }), "the first run succeeds: {first:#?}");
    let a = first[0].run_id.clone();
    h.wait_consumed("ack", 1.0).await;
    let before = h.objects_under(&job.output_prefix).await;
    assert!(before.keys().any(|k| k.ends_with("poster.jpg")) && before.keys().any(|k| k.contains("/stream/")), "{:?}", before.keys());
    let written = before.values().map(|(_, m)| *m).max_by_key(|m| m.as_nanos()).unwrap();
    // The late duplicate: wait until it is uploading (it replaced one of the keys), then stop it by its run id.
    h.publish(&job).await;
    h.rewritten_after(&job.output_prefix, written).await;
    let r = h.reports(&job);
    let b = r.iter().map(|x| x.run_id.clone()).find(|x| *x != a).expect("the duplicate's run reported");
    h.cancel(&job, Some(&b)).await;
    h.wait_consumed("ack", 2.0).await;
    h.reports_delivered().await;
    let rb = of_run(&h.reports(&job), &b);
    assert!(rb.iter().all(|x| !is_terminal(x)), "the duplicate was stopped while uploading: {rb:#?}");
    let after = h.objects_under(&job.output_prefix).await;
    let mut keys: Vec<_> = before.keys().collect();
    keys.sort();
    let mut kept: Vec<_> = after.keys().collect();
    kept.sort();
    assert_eq!(kept, keys, "every object of the finished run is still there");
    for (key, (bytes, _)) in &before {
        assert!(after[key].0 == *bytes, "{key}: the same bytes ({} before, {} after)", bytes.len(), after[key].0.len());
    }
    assert_eq!((h.consumed("ack"), h.consumed("requeue")), (2.0, 0.0));
    assert_jobs_total("cancelled", 1.0).await;
    h.finish().await;
}
