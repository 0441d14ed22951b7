//! Issue 24 end to end: PostgreSQL is the truth for transcode jobs. Through
//! the real `api`, `transcoder` and `webhook-dispatcher` binaries and the
//! real broker: a job purged from the queue is re-driven by the api's janitor
//! and the operation succeeds; the same job message delivered twice gives one
//! completed transcode and one `video.ready` (the duplicate run is cancelled).

use std::path::Path;
use std::time::{Duration, Instant};

use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueuePurgeOptions};
use lapin::types::FieldTable;
use vid_client::upload::Uploader;
use vid_client::{Client, EventFilter};
use vid_core::event::{EventData, EventType};
use vid_core::operation::{Operation, OperationStatus};
use vid_e2e::{make_video, metric_value, temp_dir, Stack};
use vid_infra::amqp::{Publisher, Topology, RK_JOB};

const TERMINAL_TIMEOUT: Duration = Duration::from_secs(600);

/// The stack's broker, as the test sees it: a channel and a confirming publisher.
struct Broker {
    _conn: lapin::Connection,
    channel: lapin::Channel,
    publisher: Publisher,
    topology: Topology,
}

impl Broker {
    async fn connect(stack: &Stack) -> Broker {
        let settings = vid_infra::settings::AmqpSettings {
            url: stack.env_value("VID__AMQP__URL").unwrap_or("amqp://guest:guest@127.0.0.1:5672/%2f").to_owned().into(),
            prefix: stack.env_value("VID__AMQP__PREFIX").expect("set by Stack::start").to_owned(),
        };
        let conn = vid_infra::amqp::connect(&settings, Duration::from_secs(30)).await.unwrap();
        let channel = conn.create_channel().await.unwrap();
        let topology = Topology::new(settings.prefix.clone());
        topology.declare(&channel).await.unwrap();
        let publisher = Publisher::new(&conn).await.unwrap();
        Broker { _conn: conn, channel, publisher, topology }
    }

    /// Messages ready in the jobs queue.
    async fn jobs_ready(&self) -> u32 {
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        self.channel.queue_declare(&self.topology.transcode_jobs(), passive, FieldTable::default()).await.unwrap().message_count()
    }

    /// Waits until the relay has put at least one job in the queue.
    async fn wait_job_queued(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.jobs_ready().await == 0 {
            assert!(Instant::now() < deadline, "the job never reached the jobs queue");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

async fn upload(client: &Client, path: &Path) -> Operation {
    Uploader::new(client).parallel(2).state_dir(None).upload_file(path, None).await.expect("upload").operation
}

async fn wait_terminal(stack: &Stack, client: &Client, op: &Operation) -> Operation {
    client
        .wait_operation(&op.id, TERMINAL_TIMEOUT, |_| {})
        .await
        .unwrap_or_else(|e| panic!("operation {} did not end: {e}; logs in {}", op.id, stack.log_dir().display()))
}

/// The types of every event of `video`, by the video version each carries.
async fn video_event_types(client: &Client, video: &str) -> Vec<EventType> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = client.list_events(&EventFilter { cursor: cursor.as_deref(), ..Default::default() }).await.unwrap();
        for e in &page.data {
            if let EventData::Video(d) = &e.data {
                if d.video_id.as_str() == video {
                    out.push((d.version, e.type_));
                }
            }
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    out.sort_by_key(|e| e.0);
    out.into_iter().map(|e| e.1).collect()
}

async fn metrics_page(url: &str) -> String {
    reqwest::get(format!("{url}/metrics")).await.unwrap().text().await.unwrap()
}

/// (a) The transcoder is stopped, the upload completes, the jobs queue is
/// purged (the broker lost the job), the transcoder starts: the api's janitor
/// re-drives the job from PostgreSQL and the operation succeeds.
#[tokio::test]
async fn a_purged_job_is_redriven_and_the_operation_succeeds() {
    let dir = temp_dir();
    let source = dir.join("clip.mp4");
    make_video(&source, 320, 240, 2.0, "500k");
    // Janitor every second (test.toml: re-drive after 5 s); job_lost far away, so a slow start cannot end it.
    let mut stack =
        Stack::start(&[("VID__OPERATIONS__JANITOR_INTERVAL_SECONDS", "1"), ("VID__OPERATIONS__JOB_LOST_AFTER_SECONDS", "3600")]).await;
    stack.kill("transcoder");
    let broker = Broker::connect(&stack).await;
    let client = stack.client();
    let op = upload(&client, &source).await;
    broker.wait_job_queued().await;
    broker.channel.queue_purge(&broker.topology.transcode_jobs(), QueuePurgeOptions::default()).await.unwrap();
    assert_eq!(client.get_operation(&op.id).await.unwrap().status, OperationStatus::Pending);

    stack.spawn("transcoder");
    let last = wait_terminal(&stack, &client, &op).await;
    assert_eq!(last.status, OperationStatus::Succeeded, "{:?}; logs in {}", last.error, stack.log_dir().display());
    let redriven = metric_value(&metrics_page(&stack.api_url).await, "jobs_redriven_total", &[]);
    assert!(redriven >= 1.0, "succeeded without a re-drive? jobs_redriven_total = {redriven}");
    let video = last.result.as_ref().unwrap().video_id.as_str().to_owned();
    assert_eq!(video_event_types(&client, &video).await, [EventType::VideoProcessing, EventType::VideoReady]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// (b) The same job message published twice (as a broker redelivery or a
/// re-drive racing the original would): one completed transcode, one
/// `video.ready`; the transcoder's second run is cancelled (its metrics count
/// one `succeeded` and one `cancelled` job). (e) Nothing is re-driven.
#[tokio::test]
async fn a_job_delivered_twice_gives_one_transcode_and_one_video_ready() {
    let dir = temp_dir();
    let source = dir.join("clip.mp4");
    make_video(&source, 640, 360, 4.0, "1M");
    // Janitor every second; re-drive only after 60 s, so a slow transcoder start does not add a third copy.
    let mut stack =
        Stack::start(&[("VID__OPERATIONS__JANITOR_INTERVAL_SECONDS", "1"), ("VID__OPERATIONS__REDRIVE_AFTER_SECONDS", "60")]).await;
    stack.kill("transcoder");
    let broker = Broker::connect(&stack).await;
    let client = stack.client();
    let op = upload(&client, &source).await;
    broker.wait_job_queued().await;
    let original = broker.channel.basic_get(&broker.topology.transcode_jobs(), BasicGetOptions { no_ack: true }).await.unwrap().unwrap();
    let job: vid_core::messages::TranscodeJob = serde_json::from_slice(&original.delivery.data).unwrap();
    assert_eq!((&job.operation_id, job.attempt), (&op.id, 1));
    for _ in 0..2 {
        broker
            .publisher
            .publish(&broker.topology.transcode_exchange(), RK_JOB, &original.delivery.data, Some(op.id.as_str()))
            .await
            .unwrap();
    }
    assert_eq!(broker.jobs_ready().await, 2);

    stack.spawn("transcoder");
    let last = wait_terminal(&stack, &client, &op).await;
    assert_eq!(last.status, OperationStatus::Succeeded, "{:?}; logs in {}", last.error, stack.log_dir().display());
    // The second copy's run starts after the first finished and is cancelled by the api.
    let transcoder = stack.transcoder_health_url();
    let deadline = Instant::now() + Duration::from_secs(120);
    let page = loop {
        let page = metrics_page(&transcoder).await;
        if metric_value(&page, "transcode_jobs_total", &[("outcome", "cancelled")]) >= 1.0 {
            break page;
        }
        assert!(Instant::now() < deadline, "the duplicate run was never cancelled:\n{page}\nlogs in {}", stack.log_dir().display());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(metric_value(&page, "transcode_jobs_total", &[("outcome", "succeeded")]), 1.0, "{page}");
    assert_eq!(metric_value(&page, "transcode_jobs_total", &[("outcome", "cancelled")]), 1.0, "{page}");
    assert_eq!(broker.jobs_ready().await, 0);
    let video = last.result.as_ref().unwrap().video_id.as_str().to_owned();
    assert_eq!(video_event_types(&client, &video).await, [EventType::VideoProcessing, EventType::VideoReady]);
    let after = client.get_operation(&op.id).await.unwrap();
    assert_eq!((after.status, after.progress), (OperationStatus::Succeeded, 100));
    assert_eq!(metric_value(&metrics_page(&stack.api_url).await, "jobs_redriven_total", &[]), 0.0, "a healthy system re-drove a job");
    let _ = std::fs::remove_dir_all(&dir);
}
