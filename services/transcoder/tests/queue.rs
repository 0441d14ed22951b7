//! The worker against the real stack: RabbitMQ on 127.0.0.1:5672 and Garage S3,
//! with the credentials `scripts/stack.sh infra-up` writes to `.local/stack.env`
//! (or the same `VID__…` variables in the environment). A unique AMQP prefix
//! and S3 key prefix keep the test away from everything else.
//!
//! One test, in sequence: success with the report sequence and the outputs in
//! S3; a PNG (permanent failure); a malformed job (acked); a missing source
//! (transient: requeued until the delivery limit dead-letters it); a cancel
//! while transcoding; a graceful shutdown that hands the running job back to
//! the queue (a republished copy; see `tests/shutdown.rs` for the delivery count).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use vid_core::messages::{CancelTranscode, ReportKind, TranscodeJob, TranscodeReport};
use vid_core::operation::Phase;
use vid_core::{OperationId, TenantId, VideoId};
use vid_infra::amqp::{Publisher, Topology, RK_JOB};
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
        },
        scanner: ScannerSettings {
            address: env.get("VID__SCANNER__ADDRESS").cloned().unwrap_or_else(|| "127.0.0.1:3310".into()),
            ..ScannerSettings::default()
        },
    }
}

struct Harness {
    s3: aws_sdk_s3::Client,
    bucket: String,
    publisher: Publisher,
    topology: Topology,
    reports: Reports,
    key_prefix: String,
    work_dir: PathBuf,
}

impl Harness {
    async fn put(&self, key: &str, path: &Path) {
        let body = aws_sdk_s3::primitives::ByteStream::from_path(path).await.unwrap();
        self.s3.put_object().bucket(&self.bucket).key(key).body(body).send().await.unwrap();
    }

    async fn submit(&self, source: Option<&Path>) -> TranscodeJob {
        let op = OperationId::generate();
        let source_key = format!("{}{op}/source", self.key_prefix);
        let size = match source {
            Some(p) => {
                self.put(&source_key, p).await;
                std::fs::metadata(p).unwrap().len()
            }
            None => 1234,
        };
        let job = TranscodeJob {
            operation_id: op.clone(),
            video_id: VideoId::generate(),
            tenant_id: TenantId::generate(),
            source_key,
            source_size_bytes: size,
            output_prefix: format!("{}{op}/out/", self.key_prefix),
        };
        self.publisher.publish_json(&self.topology.transcode_exchange(), RK_JOB, &job, Some(op.as_str())).await.unwrap();
        job
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

    async fn keys_under(&self, prefix: &str) -> Vec<String> {
        let out = self.s3.list_objects_v2().bucket(&self.bucket).prefix(prefix).send().await.unwrap();
        out.contents().iter().filter_map(|o| o.key().map(str::to_owned)).collect()
    }
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
async fn worker_against_rabbitmq_and_garage() {
    let env = stack_env();
    let unique = format!("vidtest{}", OperationId::generate().as_str().to_lowercase().replace("op_", ""));
    let clips_dir = tempfile::tempdir().unwrap();
    let work_dir = tempfile::tempdir().unwrap();
    let settings = settings(&env, &unique, work_dir.path());

    // The test's side of the broker: publisher and the report collector.
    let (publisher, topology, reports) = broker_side(&settings.amqp, true).await;
    let ch = publisher.channel().clone();
    let h = Harness {
        s3: vid_infra::storage::client(&settings.s3),
        bucket: settings.s3.bucket.clone(),
        publisher: publisher.clone(),
        topology: topology.clone(),
        reports,
        key_prefix: format!("test/{unique}/"),
        work_dir: work_dir.path().into(),
    };

    let worker = Worker::new(settings.clone(), PathBuf::from(env!("CARGO_BIN_EXE_transcoder")));
    let ready = worker.ready.clone();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(async move { worker.run(stop_rx).await });
    let t = Instant::now();
    while !ready.load(Ordering::SeqCst) {
        assert!(t.elapsed() < Duration::from_secs(20), "worker never got ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // 1. Success: reports, outputs in S3, work dir gone.
    let clips = Clips::new(clips_dir.path());
    let src = clips.av("ok.mp4", "640x360", "3");
    let job = h.submit(Some(&src)).await;
    let r = h.terminal(&job).await;
    for x in &r {
        eprintln!("{} {:?}", x.emitted_at.format("%H:%M:%S%.3f"), x.kind);
    }
    check_sequence(&r);
    let ReportKind::Succeeded { source, renditions, poster } = &r.last().unwrap().kind else { panic!("{r:#?}") };
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
    let local = clips_dir.path().join("got.mp4");
    std::fs::write(&local, got.body.collect().await.unwrap().into_bytes()).unwrap();
    let p = ffprobe(&local);
    assert_eq!(p["streams"][0]["codec_name"], "h264");
    assert_eq!(p["streams"][1]["codec_name"], "aac");
    assert!(!h.work_dir.join(job.operation_id.as_str()).exists(), "work dir removed");

    // 2. Permanent failure: a PNG renamed .mp4.
    let png = clips_dir.path().join("image.mp4");
    ffmpeg(&["-f", "lavfi", "-i", "testsrc=size=64x64", "-frames:v", "1", "-f", "image2", "-c:v", "png", png.to_str().unwrap()]);
    let bad = h.submit(Some(&png)).await;
    let r = h.terminal(&bad).await;
    check_sequence(&r);
    let ReportKind::Failed { error, source } = &r.last().unwrap().kind else { panic!("{r:#?}") };
    assert_eq!((error.code.as_str(), error.status, source.is_none()), ("unsupported_container", 422, true));

    // 3. A malformed job is acked and dropped (checked at the end: the queue holds only the shutdown job).
    h.publisher.publish(&h.topology.transcode_exchange(), RK_JOB, b"{not json", None).await.unwrap();

    // 4. Transient: the source is missing → nack/requeue until the delivery limit dead-letters it.
    let missing = h.submit(None).await;
    let t = Instant::now();
    let dead = loop {
        let got = ch.basic_get(&h.topology.transcode_dead(), BasicGetOptions { no_ack: true }).await.unwrap();
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

    // 5. Cancel while transcoding: the child dies, outputs are deleted, nothing more is reported.
    let long = clips.av("long.mp4", "1280x720", "20");
    let job = h.submit(Some(&long)).await;
    h.wait_for(&job, "the transcoding phase", Duration::from_secs(60), |r| {
        r.iter().any(|r| matches!(r.kind, ReportKind::Progress { phase: Phase::Transcoding, .. }))
    })
    .await;
    let wd = h.work_dir.join(job.operation_id.as_str());
    assert!(wd.exists());
    let t = Instant::now();
    h.publisher
        .publish_json(&h.topology.control_exchange(), "", &CancelTranscode { operation_id: job.operation_id.clone() }, None)
        .await
        .unwrap();
    // The issue asks for 2 s on an idle machine; the bound here only catches
    // a cancel that is lost or waits for the encode (the clip is 20 s long).
    while wd.exists() {
        assert!(t.elapsed() < Duration::from_secs(10), "work not stopped within 10 s of the cancel");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stopped_after = t.elapsed();
    let stopped_at = chrono::Utc::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r = h.reports(&job);
    eprintln!("cancel: stopped after {stopped_after:?}; reports {:?}", r.iter().map(|r| &r.kind).collect::<Vec<_>>());
    assert!(r.iter().all(|r| !is_terminal(r)), "nothing terminal after a cancel: {r:#?}");
    let late: Vec<_> = r.iter().filter(|r| r.emitted_at > stopped_at + chrono::Duration::seconds(1)).collect();
    assert!(late.is_empty(), "nothing reported once the work stopped: {late:#?}");
    assert!(h.keys_under(&job.output_prefix).await.is_empty(), "no outputs left after a cancel");

    // 6. Graceful shutdown with a job running: killed after the grace period and handed back to the queue.
    let job = h.submit(Some(&long)).await;
    h.wait_for(&job, "the transcoding phase", Duration::from_secs(60), |r| {
        r.iter().any(|r| matches!(r.kind, ReportKind::Progress { phase: Phase::Transcoding, .. }))
    })
    .await;
    let t = Instant::now();
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(15), running).await.expect("shutdown finishes").unwrap().unwrap();
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    assert!(!ready.load(Ordering::SeqCst));
    assert!(h.reports(&job).iter().all(|r| !is_terminal(r)));
    assert!(!h.work_dir.join(job.operation_id.as_str()).exists(), "work dir removed on shutdown");
    assert_eq!(std::fs::read_dir(&h.work_dir).unwrap().count(), 0, "no job directory or lock file left");
    let q = ch
        .queue_declare(&h.topology.transcode_jobs(), QueueDeclareOptions { passive: true, ..Default::default() }, FieldTable::default())
        .await
        .unwrap();
    assert_eq!(q.message_count(), 1, "only the requeued shutdown job is left (the others were acked)");
    let m = ch.basic_get(&h.topology.transcode_jobs(), BasicGetOptions { no_ack: true }).await.unwrap().expect("handed-back job");
    assert_eq!(serde_json::from_slice::<TranscodeJob>(&m.delivery.data).unwrap().operation_id, job.operation_id);

    // 7. The worker's /metrics page counted all of it (this test's queue is its own;
    // the job counters are process-wide, hence at least).
    let page = vid_transcoder::health::render_metrics();
    let sample = |name: &str, labels: &[(&str, &str)]| -> f64 {
        page.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    let jobs_queue = h.topology.transcode_jobs();
    assert_eq!(
        sample("amqp_messages_consumed_total", &[("queue", &jobs_queue), ("outcome", "ack")]),
        4.0,
        "success, failure, malformed, cancel:\n{page}"
    );
    assert!(sample("amqp_messages_consumed_total", &[("queue", &jobs_queue), ("outcome", "requeue")]) >= 5.0, "{page}");
    assert!(sample("amqp_messages_consumed_total", &[("queue", &h.topology.control_exchange()), ("outcome", "ack")]) >= 1.0, "{page}");
    for (outcome, at_least) in
        [("succeeded", 1.0), ("failed", 1.0), ("malformed", 1.0), ("retry", 5.0), ("cancelled", 1.0), ("shutdown", 1.0)]
    {
        assert!(sample("transcode_jobs_total", &[("outcome", outcome)]) >= at_least, "transcode_jobs_total{{outcome={outcome}}}:\n{page}");
    }
    assert!(sample("transcode_duration_seconds_count", &[("rendition", "360p")]) >= 1.0, "{page}");
    assert!(page.contains("vid_transcoder_scans_total{outcome="), "the scan counters stay on the page:\n{page}");

    // Clean up the broker and the bucket.
    delete_broker_names(&ch, &h.topology).await;
    for k in h.keys_under(&h.key_prefix).await {
        let _ = h.s3.delete_object().bucket(&h.bucket).key(k).send().await;
    }
}
