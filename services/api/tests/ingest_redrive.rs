//! Lost ingest jobs are healed from PostgreSQL (issue 21 item 4, issue 24):
//! an operation still awaiting its source with no sign of life gets its
//! ingest job published again through the outbox, rebuilt from what its rows
//! hold (every input of the job: URL, key, limit, declared and allowed media
//! types, `mp4_support`), and fails `job_lost` once its total deadline
//! passed (with the cancel broadcast, so a worker still downloading stops).
//! Real api in-process, real PostgreSQL and RabbitMQ; jobs are read off the
//! ingest jobs queue (no worker runs), reports published as the worker does.
//! Janitor passes run with an explicit `now` (a pass "later").

mod common;

use std::time::Duration;

use chrono::Utc;
use common::{until, Broker, TestApi};
use lapin::options::BasicGetOptions;
use vid_core::ingest::{IngestJob, IngestReport, IngestReportKind};
use vid_core::messages::TranscodeJob;
use vid_core::operation::{Operation, OperationStatus};
use vid_core::OperationId;

const QUIET_JANITOR: (&str, &str) = ("operations.janitor_interval_seconds", "3600");

impl Broker {
    /// Every message waiting in `queue` now (taken off it).
    async fn take<T: serde::de::DeserializeOwned>(&self, queue: &str) -> Vec<T> {
        let mut out = Vec::new();
        while let Some(m) = self.channel.basic_get(queue, BasicGetOptions { no_ack: true }).await.unwrap() {
            out.push(serde_json::from_slice(&m.delivery.data).unwrap());
        }
        out
    }

    /// Waits until the relay has published `n` messages to `queue` since the last take; returns them.
    async fn wait<T: serde::de::DeserializeOwned + std::fmt::Debug>(&self, queue: &str, n: usize) -> Vec<T> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut got = Vec::new();
        while got.len() < n {
            assert!(tokio::time::Instant::now() < deadline, "only {} of {n} messages on {queue}: {got:?}", got.len());
            got.extend(self.take::<T>(queue).await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        got
    }

    async fn report(&self, op: &OperationId, kind: IngestReportKind) {
        let report = IngestReport { operation_id: op.clone(), worker: "test".into(), emitted_at: Utc::now(), kind };
        let exchange = self.topology.ingest_exchange();
        self.publisher.publish_json(&exchange, vid_infra::amqp::RK_REPORT, &report, Some(op.as_str())).await.unwrap();
    }
}

async fn post_ingest(api: &TestApi, body: serde_json::Value) -> Operation {
    let resp = reqwest::Client::new().post(format!("{}/ingests", api.url)).bearer_auth(&api.key).json(&body).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    resp.json().await.unwrap()
}

async fn pass(api: &TestApi, at: chrono::DateTime<Utc>) -> vid_api::janitor::IngestsRedriven {
    let mut conn = api.state.db.get().await.unwrap();
    vid_api::janitor::redrive_ingests(&api.state, &mut conn, at).await.unwrap()
}

#[tokio::test]
async fn a_lost_ingest_job_is_published_again_with_every_input_then_fails_job_lost_past_its_deadline() {
    let api = TestApi::start(&[QUIET_JANITOR, ("operations.max_redrives", "2")]).await;
    let mut broker = Broker::connect(&api).await;
    let jobs = broker.topology.ingest_jobs();
    let o = api.state.settings.operations.clone();
    let (redrive_after, lost_after) = (o.ingest_redrive_after_seconds as i64, o.ingest_lost_after_seconds as i64);

    let op = post_ingest(
        &api,
        serde_json::json!({
            "source_url": "http://127.0.0.1:9/clips/a.mp4?sig=1",
            "content_type": "video/webm",
            "filename": "a.webm",
            "max_size_bytes": 12345,
        }),
    )
    .await;
    // The first copy: the broker loses it (the test takes it and drops it).
    let [original]: [IngestJob; 1] = broker.wait(&jobs, 1).await.try_into().unwrap();
    assert_eq!((original.attempt, original.max_size_bytes, original.content_type.as_deref()), (1, 12345, Some("video/webm")));

    // Not yet silent long enough: nothing.
    let start = Utc::now();
    assert_eq!(pass(&api, start + chrono::Duration::seconds(redrive_after - 60)).await.redriven, 0);
    // Silent past `ingest_redrive_after_seconds`: the same job again, attempt 2.
    let later = start + chrono::Duration::seconds(redrive_after + 1);
    assert_eq!(pass(&api, later).await.redriven, 1);
    let [again]: [IngestJob; 1] = broker.wait(&jobs, 1).await.try_into().unwrap();
    assert_eq!(again, IngestJob { attempt: 2, ..original.clone() }, "every input of the job is rebuilt from the rows");
    let seen = api.client().get_operation(&op.id).await.unwrap();
    assert_eq!(seen.status, OperationStatus::Pending, "a re-drive changes nothing visible");

    // A download report is a sign of life: a pass just under the timeout after it does nothing.
    broker.report(&op.id, IngestReportKind::Progress { bytes_downloaded: 10, total_bytes: Some(100) }).await;
    until(&api.client(), &op.id, "the progress", |o| o.metadata.download.is_some_and(|d| d.bytes_downloaded == 10)).await;
    assert_eq!(pass(&api, Utc::now() + chrono::Duration::seconds(redrive_after - 60)).await.redriven, 0);
    assert!(broker.take::<IngestJob>(&jobs).await.is_empty());

    // Re-drives used up (max_redrives 2): the pass waits for the deadline.
    let much_later = Utc::now() + chrono::Duration::seconds(redrive_after + 1);
    assert_eq!(pass(&api, much_later).await.redriven, 1);
    assert_eq!(broker.wait::<IngestJob>(&jobs, 1).await[0].attempt, 3);
    assert_eq!(pass(&api, much_later + chrono::Duration::seconds(redrive_after + 1)).await, Default::default());

    // Past the total deadline: job_lost, and the cancel broadcast tells a worker still at it to stop.
    let done = pass(&api, start + chrono::Duration::seconds(lost_after + 1)).await;
    assert_eq!((done.redriven, done.lost), (0, 1));
    let failed = until(&api.client(), &op.id, "job_lost", |o| o.status.is_terminal()).await;
    assert_eq!((failed.status, failed.error.as_ref().map(|e| e.code.as_str())), (OperationStatus::Failed, Some("job_lost")));
    let cancel = broker.next_cancel().await;
    assert_eq!((cancel.operation_id, cancel.run_id), (op.id.clone(), None));
    assert!(broker.take::<IngestJob>(&jobs).await.is_empty());
}

#[tokio::test]
async fn a_redriven_ingest_that_downloads_queues_its_transcode_job_as_attempt_1_and_is_not_redriven_again() {
    let api = TestApi::start(&[QUIET_JANITOR]).await;
    let broker = Broker::connect(&api).await;
    let jobs = broker.topology.ingest_jobs();
    let op = post_ingest(&api, serde_json::json!({ "source_url": "http://127.0.0.1:9/b.mp4" })).await;
    let [original]: [IngestJob; 1] = broker.wait(&jobs, 1).await.try_into().unwrap();
    // The defaults are stored too: the limit and allow-list of the time, no declared type.
    assert_eq!(original.max_size_bytes, api.state.settings.uploads.max_size_bytes);
    assert_eq!(original.allowed_content_types, api.state.settings.uploads.allowed_content_types);
    assert_eq!(original.content_type, None);
    let redrive_after = api.state.settings.operations.ingest_redrive_after_seconds as i64;
    assert_eq!(pass(&api, Utc::now() + chrono::Duration::seconds(redrive_after + 1)).await.redriven, 1);
    assert_eq!(broker.wait::<IngestJob>(&jobs, 1).await, vec![IngestJob { attempt: 2, ..original }]);

    // The re-driven copy downloads the source: the transcode job is attempt 1,
    // as for any upload (the transcoder's reports and dead letters carry it).
    broker.report(&op.id, IngestReportKind::Downloaded { size_bytes: 1000, content_type: "video/mp4".into() }).await;
    let [job]: [TranscodeJob; 1] = broker.wait(&broker.topology.transcode_jobs(), 1).await.try_into().unwrap();
    assert_eq!((job.operation_id.clone(), job.attempt, job.source_size_bytes), (op.id.clone(), 1, 1000));
    // No longer awaiting its source: the ingest pass leaves it alone even far later.
    let far = Utc::now() + chrono::Duration::seconds(api.state.settings.operations.ingest_lost_after_seconds as i64 + 1);
    assert_eq!(pass(&api, far).await, Default::default());
    assert!(broker.take::<IngestJob>(&jobs).await.is_empty());
}
