//! The real `transcoder` binary stopped mid-job, against RabbitMQ, Garage and
//! clamd (`scripts/stack.sh infra-up`; credentials from `.local/stack.env`).
//! Each test has its own AMQP prefix, S3 key prefix and work dir; the
//! binaries' logs go to `.local/test-logs/<prefix>/`.
//!
//! - graceful stops (SIGTERM, grace 0) mid-transcode, more of them than the
//!   queue's delivery limit: each hands the job back without spending a
//!   delivery, and the job then succeeds, reported once;
//! - crashes (SIGKILL) mid-job do spend deliveries: the job is dead-lettered
//!   after the limit, and the job directories the killed processes left
//!   behind are swept by the next process to start;
//! - SIGTERM while RabbitMQ is unreachable: the process exits at once instead
//!   of finishing its connect retries.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::*;
use lapin::options::{BasicGetOptions, BasicNackOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use vid_core::messages::{ReportKind, TranscodeJob, TranscodeReport};
use vid_core::operation::Phase;
use vid_core::{OperationId, TenantId, VideoId};
use vid_infra::amqp::{Publisher, Topology, RK_JOB, TRANSCODE_DELIVERY_LIMIT};
use vid_infra::settings::{AmqpSettings, S3Settings};
use vid_infra::SecretString;

type Collected = Reports;

/// One test's private broker names, key prefix and work dir, and the
/// `transcoder` processes it starts.
struct Bench {
    env: Vec<(String, String)>,
    s3: aws_sdk_s3::Client,
    bucket: String,
    publisher: Publisher,
    topology: Topology,
    channel: lapin::Channel,
    reports: Collected,
    key_prefix: String,
    work_dir: tempfile::TempDir,
    log_dir: PathBuf,
    spawned: usize,
}

impl Bench {
    /// Declares the topology under a fresh prefix and collects its reports.
    /// `extra` (`VID__…` pairs) is added to every process's environment.
    async fn new(extra: &[(&str, &str)]) -> Self {
        let stack = stack_env();
        let prefix = vid_testkit::unique_prefix();
        let root = vid_testkit::repo_root();
        let work_dir = tempfile::tempdir().unwrap();
        let log_dir = root.join(".local/test-logs").join(&prefix);
        std::fs::create_dir_all(&log_dir).unwrap();
        let mut env: Vec<(String, String)> = stack.clone().into_iter().collect();
        env.extend([
            ("VID_PROFILE".into(), "test".into()),
            ("VID_CONFIG_DIR".into(), root.join("config").display().to_string()),
            ("VID__AMQP__PREFIX".into(), prefix.clone()),
            ("VID__TRANSCODER__HEALTH_LISTEN".into(), "127.0.0.1:0".into()),
            ("VID__TRANSCODER__WORK_DIR".into(), work_dir.path().display().to_string()),
            ("VID__TRANSCODER__LADDER".into(), "360".into()),
            ("VID__TELEMETRY__LEVEL".into(), "info".into()),
        ]);
        env.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));

        let amqp = AmqpSettings { url: SecretString::from(stack["VID__AMQP__URL"].clone()), prefix: prefix.clone() };
        let (publisher, topology, reports) = broker_side(&amqp, false).await;
        let channel = publisher.channel().clone();
        let s3 = S3Settings {
            endpoint: stack["VID__S3__ENDPOINT"].clone(),
            public_endpoint: None,
            region: stack.get("VID__S3__REGION").cloned().unwrap_or_else(|| "garage".into()),
            bucket: stack["VID__S3__BUCKET"].clone(),
            access_key_id: stack["VID__S3__ACCESS_KEY_ID"].clone(),
            secret_access_key: SecretString::from(stack["VID__S3__SECRET_ACCESS_KEY"].clone()),
        };
        Self {
            env,
            s3: vid_infra::storage::client(&s3),
            bucket: s3.bucket.clone(),
            publisher,
            topology,
            channel,
            reports,
            key_prefix: format!("test/{prefix}/"),
            work_dir,
            log_dir,
            spawned: 0,
        }
    }

    /// Starts `transcoder run`; its output goes to `transcoder-<n>.log`.
    fn spawn(&mut self) -> Child {
        self.spawned += 1;
        let log = std::fs::File::create(self.log_dir.join(format!("transcoder-{}.log", self.spawned))).unwrap();
        Command::new(env!("CARGO_BIN_EXE_transcoder"))
            .arg("run")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(self.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    /// Uploads `source` and publishes its job, as the api's outbox does.
    async fn submit(&self, source: &Path) -> TranscodeJob {
        let op = OperationId::generate();
        let tenant = TenantId::generate();
        let job = TranscodeJob {
            operation_id: op.clone(),
            video_id: VideoId::generate(),
            tenant_id: tenant.clone(),
            source_key: format!("{}tenants/{tenant}/uploads/{op}/source", self.key_prefix),
            source_size_bytes: std::fs::metadata(source).unwrap().len(),
            output_prefix: format!("{}{op}/out/", self.key_prefix),
            attempt: 1,
            mp4_support: Default::default(),
            poster_time: None,
        };
        let body = aws_sdk_s3::primitives::ByteStream::from_path(source).await.unwrap();
        self.s3.put_object().bucket(&self.bucket).key(&job.source_key).body(body).send().await.unwrap();
        self.publisher.publish_json(&self.topology.transcode_exchange(), RK_JOB, &job, Some(op.as_str())).await.unwrap();
        job
    }

    fn reports(&self, job: &TranscodeJob) -> Vec<TranscodeReport> {
        self.reports.lock().unwrap().get(job.operation_id.as_str()).cloned().unwrap_or_default()
    }

    /// Polls the reports of `job` until `f` holds; panics after `timeout`.
    async fn wait_for(&self, job: &TranscodeJob, what: &str, timeout: Duration, f: impl Fn(&[TranscodeReport]) -> bool) {
        let t = Instant::now();
        loop {
            let r = self.reports(job);
            if f(&r) {
                return;
            }
            assert!(
                t.elapsed() < timeout,
                "timed out waiting for {what}; logs in {}; reports so far: {:#?}",
                self.log_dir.display(),
                r.iter().map(|r| &r.kind).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Messages ready in `queue`.
    async fn depth(&self, queue: &str) -> u32 {
        let q = self
            .channel
            .queue_declare(queue, QueueDeclareOptions { passive: true, ..Default::default() }, FieldTable::default())
            .await
            .unwrap();
        q.message_count()
    }

    /// The names in the work dir.
    fn work_entries(&self) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(self.work_dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    /// Deletes this test's queues, exchanges and objects.
    async fn cleanup(&self) {
        delete_broker_names(&self.channel, &self.topology).await;
        let listed = self.s3.list_objects_v2().bucket(&self.bucket).prefix(&self.key_prefix).send().await.unwrap();
        for k in listed.contents().iter().filter_map(|o| o.key()) {
            let _ = self.s3.delete_object().bucket(&self.bucket).key(k).send().await;
        }
    }
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on a child we spawned and have not reaped yet.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({}, {sig})", child.id());
}

/// Waits (polling) for `child` to exit; `None` after `timeout`.
async fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if t.elapsed() > timeout {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn is_terminal(r: &TranscodeReport) -> bool {
    matches!(r.kind, ReportKind::Succeeded { .. } | ReportKind::Failed { .. })
}

fn started(r: &[TranscodeReport]) -> usize {
    r.iter().filter(|r| r.kind == ReportKind::Started).count()
}

/// The `n`-th delivery (1-based) has reached the transcoding phase.
fn transcoding_in_delivery(r: &[TranscodeReport], n: usize) -> bool {
    let Some(i) = r.iter().enumerate().filter(|(_, r)| r.kind == ReportKind::Started).map(|(i, _)| i).nth(n - 1) else {
        return false;
    };
    r[i..].iter().any(|r| matches!(r.kind, ReportKind::Progress { phase: Phase::Transcoding, .. }))
}

/// More graceful stops mid-transcode than the delivery limit allows
/// deliveries: the job is never dead-lettered, its message comes back with
/// no delivery spent, and it then succeeds once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdowns_mid_transcode_do_not_spend_the_delivery_limit() {
    let mut b = Bench::new(&[("VID__TRANSCODER__SHUTDOWN_GRACE_SECONDS", "0")]).await;
    let clips_dir = tempfile::tempdir().unwrap();
    // Long enough to still be transcoding when the stop comes, short enough for the final run.
    let source = Clips::new(clips_dir.path()).av("long.mp4", "640x360", "60");
    let job = b.submit(&source).await;
    let (jobs, dead) = (b.topology.transcode_jobs(), b.topology.transcode_dead());
    let stops = TRANSCODE_DELIVERY_LIMIT as usize + 1; // the broker dead-letters at the 6th return

    for n in 1..=stops {
        let mut child = b.spawn();
        b.wait_for(&job, &format!("delivery {n} to reach the transcoding phase"), Duration::from_secs(60), |r| {
            transcoding_in_delivery(r, n)
        })
        .await;
        signal(&child, libc::SIGTERM);
        let status = wait_exit(&mut child, Duration::from_secs(20)).await.expect("the transcoder exits after SIGTERM");
        assert!(status.success(), "exit status {status}; logs in {}", b.log_dir.display());
        let log = std::fs::read_to_string(b.log_dir.join(format!("transcoder-{}.log", b.spawned))).unwrap();
        assert!(log.contains("job requeued for shutdown"), "stop {n}: the job was handed back:\n{log}");
        assert!(b.reports(&job).iter().all(|r| !is_terminal(r)), "a shutdown reports nothing terminal");
        assert_eq!(b.depth(&dead).await, 0, "stop {n}: dead-lettered; logs in {}", b.log_dir.display());
        assert_eq!(b.depth(&jobs).await, 1, "stop {n}: the job is back in its queue");
        assert_eq!(b.work_entries(), Vec::<String>::new(), "stop {n}: the job dir and its lock are gone");
    }

    // The message in the queue has spent no delivery: the broker adds
    // `x-delivery-count` to a message returned to a quorum queue. (Looking
    // costs one: the nack below returns it.)
    let got = b.channel.basic_get(&jobs, BasicGetOptions::default()).await.unwrap().expect("the job is queued");
    let count = got.delivery.properties.headers().as_ref().and_then(|h| h.inner().get("x-delivery-count").cloned());
    assert!(matches!(count, None | Some(AMQPValue::LongLongInt(0)) | Some(AMQPValue::LongInt(0))), "delivery count {count:?}");
    assert_eq!(vid_infra::amqp::correlation_id(&got.delivery.properties).as_deref(), Some(job.operation_id.as_str()));
    assert_eq!(serde_json::from_slice::<TranscodeJob>(&got.delivery.data).unwrap(), job);
    got.delivery.nack(BasicNackOptions { requeue: true, ..Default::default() }).await.unwrap();

    // Now one runs it to the end.
    let mut child = b.spawn();
    let t = Instant::now();
    loop {
        let r = b.reports(&job);
        if r.iter().any(is_terminal) {
            break;
        }
        assert_eq!(b.depth(&dead).await, 0, "dead-lettered; logs in {}", b.log_dir.display());
        assert!(t.elapsed() < Duration::from_secs(180), "no outcome; logs in {}", b.log_dir.display());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = b.reports(&job);
    assert!(matches!(r.last().unwrap().kind, ReportKind::Succeeded { .. }), "{:#?}", r.last());
    assert_eq!(r.iter().filter(|r| is_terminal(r)).count(), 1);
    assert_eq!(started(&r), stops + 1, "one Started per delivery");
    signal(&child, libc::SIGTERM);
    assert!(wait_exit(&mut child, Duration::from_secs(20)).await.expect("exits").success());
    assert_eq!(b.depth(&jobs).await, 0, "acked once finished");
    assert_eq!(b.work_entries(), Vec::<String>::new());
    b.cleanup().await;
}

/// Crashes (SIGKILL) mid-job spend the job's deliveries: after the limit the
/// broker dead-letters it. Each killed process leaves its job directory and
/// lock file behind; the next process to start sweeps them away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_mid_job_spend_the_delivery_limit_and_their_leftovers_are_swept() {
    let mut b = Bench::new(&[]).await;
    let clips_dir = tempfile::tempdir().unwrap();
    let source = Clips::new(clips_dir.path()).av("clip.mp4", "640x360", "20");
    let job = b.submit(&source).await;
    let (jobs, dead) = (b.topology.transcode_jobs(), b.topology.transcode_dead());
    let op = job.operation_id.to_string();
    let leftovers = vec![op.clone(), format!("{op}.lock")];

    let limit = TRANSCODE_DELIVERY_LIMIT as usize;
    let mut kills = 0;
    loop {
        let mut child = b.spawn();
        // `Started` is sent once the job holds its directory.
        b.wait_for(&job, &format!("delivery {}", kills + 1), Duration::from_secs(60), |r| started(r) > kills).await;
        signal(&child, libc::SIGKILL);
        wait_exit(&mut child, Duration::from_secs(10)).await.expect("a killed process exits");
        kills += 1;
        assert_eq!(b.work_entries(), leftovers, "kill {kills}: the killed process left its job directory and lock");
        // The broker returns the unacked delivery, or dead-letters it past the limit.
        let t = Instant::now();
        let (queued, dead_lettered) = loop {
            let (q, d) = (b.depth(&jobs).await, b.depth(&dead).await);
            if q + d == 1 {
                break (q, d);
            }
            assert!(t.elapsed() < Duration::from_secs(10), "kill {kills}: the job is neither back nor dead-lettered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if dead_lettered == 1 {
            break;
        }
        assert_eq!(queued, 1);
        assert!(kills <= limit, "{kills} crashes and the job is still not dead-lettered");
    }
    assert!(kills >= limit, "dead-lettered after only {kills} crashes");
    assert!(b.reports(&job).iter().all(|r| !is_terminal(r)));

    // Nothing to consume now; a new process sweeps the last leftovers when it starts.
    let mut child = b.spawn();
    let t = Instant::now();
    while !b.work_entries().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(20), "leftovers not swept: {:?}; logs in {}", b.work_entries(), b.log_dir.display());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal(&child, libc::SIGTERM);
    assert!(wait_exit(&mut child, Duration::from_secs(20)).await.expect("exits").success());
    let log = std::fs::read_to_string(b.log_dir.join(format!("transcoder-{}.log", b.spawned))).unwrap();
    assert!(log.contains("work dir swept"), "{log}");
    b.cleanup().await;
}

/// SIGTERM while RabbitMQ cannot be reached: the process stops at once
/// instead of finishing its 30 s of connect retries first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_rabbitmq_is_unreachable_exits_at_once() {
    // A loopback port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let root = vid_testkit::repo_root();
    let work_dir = tempfile::tempdir().unwrap();
    let log_path = work_dir.path().join("transcoder.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_transcoder"))
        .arg("run")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(stack_env())
        .env("VID_PROFILE", "test")
        .env("VID_CONFIG_DIR", root.join("config"))
        .env("VID__AMQP__URL", format!("amqp://guest:guest@127.0.0.1:{port}/%2f"))
        .env("VID__TRANSCODER__HEALTH_LISTEN", "127.0.0.1:0")
        .env("VID__TRANSCODER__WORK_DIR", work_dir.path().join("work"))
        .env("VID__TELEMETRY__LEVEL", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !std::fs::read_to_string(&log_path).unwrap().contains("RabbitMQ not reachable; retrying") {
        assert!(t.elapsed() < Duration::from_secs(20), "{}", std::fs::read_to_string(&log_path).unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = Instant::now();
    signal(&child, libc::SIGTERM);
    let status = wait_exit(&mut child, Duration::from_secs(30)).await;
    let took = t.elapsed();
    let log = std::fs::read_to_string(&log_path).unwrap();
    let status = status.unwrap_or_else(|| {
        let _ = child.kill();
        panic!("still running 30 s after SIGTERM:\n{log}")
    });
    assert!(status.success(), "{status}:\n{log}");
    assert!(took < Duration::from_secs(5), "exited {took:?} after SIGTERM:\n{log}");
    assert!(log.contains("transcoder stopped"), "{log}");
}
