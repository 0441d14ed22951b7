//! The scanning phase against the real clamd that `scripts/stack.sh infra-up`
//! runs on 127.0.0.1:3310 (and `.local/clamav/clamd.sock`), with its generated
//! EICAR signatures (`Vid.Test.EICAR-File` by hash, `Vid.Test.EICAR-Body` anywhere).
//!
//! - `protocol_*`: the `INSTREAM` client alone (framing, verdicts, limits, errors);
//! - `worker_*`: the worker against RabbitMQ, Garage and clamd, each test with
//!   its own AMQP prefix and S3 key prefix: EICAR → `malware_detected` and the
//!   source moved to quarantine; clean → `Scanned{clean}` then success; clamd
//!   unreachable → retries then `scan_unavailable`; clamd reachable within the
//!   retry budget → success; over `StreamMaxLength` → `file_too_large_to_scan`;
//!   scanning disabled → `Scanned{skipped}`.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::AsyncReadExt;
use vid_core::messages::{ReportKind, TranscodeJob, TranscodeReport};
use vid_core::operation::{Phase, ScanOutcome};
use vid_core::{OperationId, TenantId, VideoId};
use vid_infra::amqp::{Publisher, Topology, RK_JOB};
use vid_infra::settings::{AmqpSettings, LogFormat, S3Settings, TelemetrySettings};
use vid_infra::SecretString;
use vid_transcoder::scan::{Address, Client, ScanError, Verdict, METRICS};
use vid_transcoder::settings::{ScannerSettings, Settings, TranscoderSettings};
use vid_transcoder::worker::{quarantine_key, Worker};

/// The EICAR test file (68 bytes), built at run time.
fn eicar() -> Vec<u8> {
    let mut v = b"X5O!P%@AP[4\\PZX54(P^)7CC)7}$".to_vec();
    v.extend_from_slice(b"EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*");
    assert_eq!(v.len(), 68);
    v
}

fn clamd_address() -> String {
    std::env::var("VID__SCANNER__ADDRESS").unwrap_or_else(|_| "127.0.0.1:3310".into())
}

fn client(address: &str) -> Client {
    Client {
        address: Address::parse(address),
        connect_timeout: Duration::from_secs(2),
        io_timeout: Duration::from_secs(10),
        reply_timeout: Duration::from_secs(60),
        chunk_bytes: 64 * 1024,
        max_stream_bytes: 200 * 1024 * 1024,
    }
}

/// Deterministic non-matching bytes.
fn noise(n: usize) -> Vec<u8> {
    let mut x: u32 = 0x1234_5678;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

// ------------------------------------------------------------- protocol --

#[tokio::test]
async fn protocol_verdicts_and_framing() {
    let c = client(&clamd_address());
    c.ping().await.expect("clamd answers PING: run scripts/stack.sh infra-up");

    // The exact EICAR file: the hash signature (clamd suffixes local signatures with .UNOFFICIAL).
    match c.scan(&eicar()[..], |_| {}).await.unwrap() {
        Verdict::Infected { signature } => assert!(signature.starts_with("Vid.Test.EICAR"), "{signature}"),
        v => panic!("EICAR not detected: {v:?}"),
    }

    // EICAR inside a larger stream, straddling a chunk boundary (1 KiB chunks): the body signature.
    let mut data = noise(5000);
    data.splice(1000..1000, eicar());
    let small = Client { chunk_bytes: 1024, ..c.clone() };
    let mut seen = Vec::new();
    match small.scan(&data[..], |n| seen.push(n)).await.unwrap() {
        Verdict::Infected { signature } => assert_eq!(signature, "Vid.Test.EICAR-Body.UNOFFICIAL"),
        v => panic!("embedded EICAR not detected: {v:?}"),
    }
    assert_eq!(seen.last().copied(), Some(data.len() as u64), "progress reports every byte sent");
    assert_eq!(seen.len(), data.len().div_ceil(1024), "one frame per 1 KiB chunk");

    // Clean streams: several sizes and chunkings, including empty.
    for (len, chunk) in [(0usize, 64 * 1024), (1, 1024), (3 * 1024 * 1024 + 7, 64 * 1024), (100_000, 4096)] {
        let data = noise(len);
        let c = Client { chunk_bytes: chunk, ..c.clone() };
        assert_eq!(c.scan(&data[..], |_| {}).await.unwrap(), Verdict::Clean, "len {len} chunk {chunk}");
    }

    // From a file on disk, as the worker does.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("eicar.mp4");
    std::fs::write(&f, eicar()).unwrap();
    let file = tokio::fs::File::open(&f).await.unwrap();
    assert!(matches!(c.scan(file, |_| {}).await.unwrap(), Verdict::Infected { .. }));
}

#[tokio::test]
async fn protocol_unix_socket() {
    let sock = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.local/clamav/clamd.sock");
    assert!(sock.exists(), "{} missing: run scripts/stack.sh infra-up", sock.display());
    let c = client(&format!("unix:{}", sock.display()));
    c.ping().await.unwrap();
    assert!(matches!(c.scan(&eicar()[..], |_| {}).await.unwrap(), Verdict::Infected { .. }));
    assert_eq!(c.scan(&noise(10_000)[..], |_| {}).await.unwrap(), Verdict::Clean);
}

#[tokio::test]
async fn protocol_size_limits() {
    // Client side: never sends more than max_stream_bytes.
    let c = Client { max_stream_bytes: 1024 * 1024, ..client(&clamd_address()) };
    assert_eq!(c.scan(&noise(1024 * 1024)[..], |_| {}).await.unwrap(), Verdict::Clean, "exactly the limit is fine");
    let mut sent = 0;
    match c.scan(&noise(1024 * 1024 + 1)[..], |n| sent = n).await {
        Err(ScanError::TooLarge { limit, by }) => assert_eq!((limit, by), (1024 * 1024, "client")),
        r => panic!("{r:?}"),
    }
    assert!(sent <= 1024 * 1024);

    // clamd side: its StreamMaxLength is 200M; with no client limit, clamd says
    // "INSTREAM size limit exceeded" (and may close while we still write).
    let c = Client { max_stream_bytes: u64::MAX, chunk_bytes: 1024 * 1024, ..client(&clamd_address()) };
    let over = tokio::io::repeat(0).take(200 * 1024 * 1024 + 1);
    match c.scan(over, |_| {}).await {
        Err(ScanError::TooLarge { by, .. }) => assert_eq!(by, "clamd"),
        r => panic!("{r:?}"),
    }
}

#[tokio::test]
async fn protocol_unavailable_scanners() {
    // Nothing listens on port 1.
    let t = Instant::now();
    let e = client("127.0.0.1:1").scan(&b"x"[..], |_| {}).await.unwrap_err();
    assert!(matches!(e, ScanError::Unavailable { .. }) && e.is_transient(), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(client("unix:/nonexistent/clamd.sock").ping().await.is_err());

    // Something that is not clamd: answers garbage.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            });
        }
    });
    let e = client(&addr.to_string()).scan(&noise(10)[..], |_| {}).await.unwrap_err();
    assert!(matches!(e, ScanError::Unavailable { .. }), "{e:?}");

    // Accepts, reads, never answers: the reply timeout.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    let c = Client { reply_timeout: Duration::from_millis(300), ..client(&addr.to_string()) };
    let t = Instant::now();
    let e = c.scan(&noise(10)[..], |_| {}).await.unwrap_err();
    assert!(matches!(&e, ScanError::Unavailable { reason, .. } if reason.contains("no reply")), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(3));
}

// --------------------------------------------------------------- worker --

type Collected = Reports;

/// One worker with its own AMQP prefix, S3 key prefix and scanner settings.
struct Stack {
    s3: aws_sdk_s3::Client,
    bucket: String,
    publisher: Publisher,
    topology: Topology,
    channel: lapin::Channel,
    reports: Collected,
    key_prefix: String,
    stop: tokio::sync::watch::Sender<bool>,
    running: tokio::task::JoinHandle<anyhow::Result<()>>,
    _work_dir: tempfile::TempDir,
}

impl Stack {
    async fn start(scanner: ScannerSettings) -> Self {
        let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_test_writer().try_init();
        let env = stack_env();
        let unique = format!("vidscan{}", OperationId::generate().as_str().to_lowercase().replace("op_", ""));
        let work_dir = tempfile::tempdir().unwrap();
        let settings = Settings {
            telemetry: TelemetrySettings { format: LogFormat::Pretty, level: "warn".into() },
            amqp: AmqpSettings { url: SecretString::from(env["VID__AMQP__URL"].clone()), prefix: unique.clone() },
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
                concurrency: 1,
                work_dir: work_dir.path().into(),
                max_duration_seconds: 600.0,
                max_width: 4096,
                max_height: 4096,
                stall_timeout_seconds: 60,
                ladder: vec![360],
                shutdown_grace_seconds: 1,
                retry_backoff_seconds: 0.2,
                segment_seconds: 4.0,
            },
            scanner,
        };
        let (publisher, topology, reports) = broker_side(&settings.amqp, false).await;
        let channel = publisher.channel().clone();
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
            channel,
            reports,
            key_prefix: format!("test/{unique}/"),
            stop,
            running,
            _work_dir: work_dir,
        }
    }

    /// Uploads `bytes` as a source and publishes its job (`declared`: the size the job claims).
    async fn submit(&self, bytes: Vec<u8>, declared: Option<u64>) -> TranscodeJob {
        let op = OperationId::generate();
        let tenant = TenantId::generate();
        let job = TranscodeJob {
            operation_id: op.clone(),
            video_id: VideoId::generate(),
            tenant_id: tenant.clone(),
            source_key: format!("{}tenants/{tenant}/uploads/{op}/source", self.key_prefix),
            source_size_bytes: declared.unwrap_or(bytes.len() as u64),
            output_prefix: format!("{}{op}/out/", self.key_prefix),
            attempt: 1,
            mp4_support: Default::default(),
            poster_time: None,
        };
        self.s3.put_object().bucket(&self.bucket).key(&job.source_key).body(bytes.into()).send().await.unwrap();
        self.publish(&job).await;
        job
    }

    async fn publish(&self, job: &TranscodeJob) {
        self.publisher.publish_json(&self.topology.transcode_exchange(), RK_JOB, job, Some(job.operation_id.as_str())).await.unwrap();
    }

    fn reports(&self, job: &TranscodeJob) -> Vec<TranscodeReport> {
        self.reports.lock().unwrap().get(job.operation_id.as_str()).cloned().unwrap_or_default()
    }

    async fn terminal(&self, job: &TranscodeJob, after: usize, timeout: Duration) -> Vec<TranscodeReport> {
        let t = Instant::now();
        loop {
            let r = self.reports(job);
            if r.iter().skip(after).any(is_terminal) {
                return r;
            }
            assert!(t.elapsed() < timeout, "no terminal report within {timeout:?}: {r:#?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn exists(&self, key: &str) -> bool {
        self.s3.head_object().bucket(&self.bucket).key(key).send().await.is_ok()
    }

    async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(15), self.running).await;
        delete_broker_names(&self.channel, &self.topology).await;
        let out = self.s3.list_objects_v2().bucket(&self.bucket).prefix(&self.key_prefix).send().await.unwrap();
        for k in out.contents().iter().filter_map(|o| o.key()) {
            let _ = self.s3.delete_object().bucket(&self.bucket).key(k).send().await;
        }
    }
}

fn is_terminal(r: &TranscodeReport) -> bool {
    matches!(r.kind, ReportKind::Succeeded { .. } | ReportKind::Failed { .. })
}

fn failed_code(r: &[TranscodeReport]) -> (String, u16, Option<String>) {
    match &r.last().unwrap().kind {
        ReportKind::Failed { error, .. } => (error.code.clone(), error.status, error.detail.clone()),
        k => panic!("expected Failed, got {k:?}: {r:#?}"),
    }
}

fn scanned(r: &[TranscodeReport]) -> Vec<ScanOutcome> {
    r.iter().filter_map(|r| if let ReportKind::Scanned { outcome } = r.kind { Some(outcome) } else { None }).collect()
}

/// No probing/transcoding progress was ever reported: the file never reached the child.
fn never_decoded(r: &[TranscodeReport]) -> bool {
    !r.iter().any(|r| matches!(r.kind, ReportKind::Progress { phase: Phase::Probing | Phase::Transcoding | Phase::Uploading, .. }))
}

/// A 1-second 160×120 H.264/AAC clip.
fn clip() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let p = Clips::new(dir.path()).av("clean.mp4", "160x120", "1");
    std::fs::read(p).unwrap()
}

fn scanner() -> ScannerSettings {
    ScannerSettings {
        address: clamd_address(),
        retry_attempts: 2,
        retry_backoff_seconds: 0.1,
        retry_backoff_max_seconds: 1.0,
        ..ScannerSettings::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_eicar_is_quarantined_and_fails_malware_detected() {
    let s = Stack::start(scanner()).await;
    let job = s.submit(eicar(), None).await;
    let r = s.terminal(&job, 0, Duration::from_secs(60)).await;
    let (code, status, detail) = failed_code(&r);
    assert_eq!((code.as_str(), status), ("malware_detected", 422));
    // Both local signatures match the exact file; clamd names the first that hits.
    let detail = detail.unwrap_or_default();
    let signature = detail.strip_prefix("signature: ").expect("detail names the signature");
    assert!(signature.starts_with("Vid.Test.EICAR-") && signature.ends_with(".UNOFFICIAL"), "{detail}");
    assert!(scanned(&r).is_empty() && never_decoded(&r), "{r:#?}");
    assert_eq!(r.iter().filter(|r| is_terminal(r)).count(), 1);

    // Gone from the source key; in quarantine, with the signature recorded.
    assert!(!s.exists(&job.source_key).await, "the infected source is still at its upload key");
    let qkey = quarantine_key("quarantine/", &job);
    assert!(qkey.starts_with(&format!("quarantine/{}/", job.tenant_id)) && qkey.ends_with("/source"), "{qkey}");
    // The api's key shape `tenants/<t>/uploads/<u>/source` becomes `quarantine/<t>/uploads/<u>/source`.
    let api_shape = TranscodeJob { source_key: format!("tenants/{}/uploads/upl_x/source", job.tenant_id), ..job.clone() };
    assert_eq!(quarantine_key("quarantine/", &api_shape), format!("quarantine/{}/uploads/upl_x/source", job.tenant_id));
    let head = s.s3.head_object().bucket(&s.bucket).key(&qkey).send().await.expect("quarantined copy");
    assert_eq!(head.metadata().and_then(|m| m.get("signature")).map(String::as_str), Some(signature));
    assert_eq!(head.content_length(), Some(68));

    // A redelivery (e.g. the Failed report was lost) reports the same outcome, not a retry loop.
    let before = r.len();
    s.publish(&job).await;
    let r = s.terminal(&job, before, Duration::from_secs(30)).await;
    let again = failed_code(&r);
    assert_eq!((again.0.as_str(), again.2.as_deref()), ("malware_detected", Some(detail.as_str())));
    assert!(METRICS.count(vid_transcoder::scan::Outcome::Infected) >= 1);

    let _ = s.s3.delete_object().bucket(&s.bucket).key(&qkey).send().await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_clean_source_is_scanned_then_transcoded() {
    let s = Stack::start(scanner()).await;
    let job = s.submit(clip(), None).await;
    let r = s.terminal(&job, 0, Duration::from_secs(120)).await;
    assert!(matches!(r.last().unwrap().kind, ReportKind::Succeeded { .. }), "{r:#?}");
    assert_eq!(scanned(&r), vec![ScanOutcome::Clean]);
    // The verdict comes before any probing.
    let scan_at = r.iter().position(|r| matches!(r.kind, ReportKind::Scanned { .. })).unwrap();
    assert!(never_decoded(&r[..scan_at]), "{r:#?}");
    assert!(s.exists(&job.source_key).await, "a clean source stays where it is");
    assert!(METRICS.count(vid_transcoder::scan::Outcome::Clean) >= 1);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_scanner_unreachable_retries_then_scan_unavailable() {
    let s = Stack::start(ScannerSettings { address: "127.0.0.1:1".into(), ..scanner() }).await;
    let t = Instant::now();
    let failures = vid_transcoder::scan::METRICS.render();
    let job = s.submit(clip(), None).await;
    let r = s.terminal(&job, 0, Duration::from_secs(60)).await;
    let (code, status, _) = failed_code(&r);
    assert_eq!((code.as_str(), status), ("scan_unavailable", 503));
    assert!(t.elapsed() >= Duration::from_millis(300), "two retries with 0.1 s + 0.2 s backoff: {:?}", t.elapsed());
    assert!(scanned(&r).is_empty() && never_decoded(&r), "{r:#?}");
    assert!(s.exists(&job.source_key).await, "not infected: left in place");
    assert_ne!(failures, vid_transcoder::scan::METRICS.render());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_scanner_back_within_the_budget_succeeds() {
    // A port nothing listens on yet; after ~1.5 s a proxy to the real clamd starts there.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let s = Stack::start(ScannerSettings {
        address: format!("127.0.0.1:{port}"),
        retry_attempts: 8,
        retry_backoff_seconds: 0.25,
        retry_backoff_max_seconds: 1.0,
        ..scanner()
    })
    .await;
    let job = s.submit(clip(), None).await;
    let clamd = clamd_address();
    let proxy = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let l = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        while let Ok((mut inbound, _)) = l.accept().await {
            let clamd = clamd.clone();
            tokio::spawn(async move {
                let mut out = tokio::net::TcpStream::connect(clamd.as_str()).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
            });
        }
    });
    let r = s.terminal(&job, 0, Duration::from_secs(120)).await;
    assert!(matches!(r.last().unwrap().kind, ReportKind::Succeeded { .. }), "{r:#?}");
    assert_eq!(scanned(&r), vec![ScanOutcome::Clean]);
    proxy.abort();
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_over_stream_max_length_fails_closed() {
    let s = Stack::start(ScannerSettings { stream_max_length_bytes: 1024 * 1024, ..scanner() }).await;
    // Declared size over the limit: refused before downloading.
    let job = s.submit(noise(1024 * 1024 + 1), None).await;
    let r = s.terminal(&job, 0, Duration::from_secs(60)).await;
    let (code, status, detail) = failed_code(&r);
    assert_eq!((code.as_str(), status), ("file_too_large_to_scan", 413), "{detail:?}");
    assert!(never_decoded(&r) && scanned(&r).is_empty());
    // Declared size under it, actual object over it: caught from the object's length.
    let job = s.submit(noise(2 * 1024 * 1024), Some(1000)).await;
    let r = s.terminal(&job, 0, Duration::from_secs(60)).await;
    assert_eq!(failed_code(&r).0, "file_too_large_to_scan");
    assert!(never_decoded(&r));
    assert!(s.exists(&job.source_key).await, "not known to be infected: left in place");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_scanning_disabled_records_skipped() {
    // Also with an unreachable address: disabled means clamd is never contacted.
    let s = Stack::start(ScannerSettings { enabled: false, address: "127.0.0.1:1".into(), ..scanner() }).await;
    let job = s.submit(clip(), None).await;
    let r = s.terminal(&job, 0, Duration::from_secs(120)).await;
    assert!(matches!(r.last().unwrap().kind, ReportKind::Succeeded { .. }), "{r:#?}");
    assert_eq!(scanned(&r), vec![ScanOutcome::Skipped]);
    s.shutdown().await;
}
