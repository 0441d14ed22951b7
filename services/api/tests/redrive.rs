//! Issue 24, the api half: transcode jobs re-driven from PostgreSQL, and "the
//! latest Started wins". Real api in-process, real PostgreSQL and RabbitMQ:
//! reports are published to the reports exchange and applied by the api's own
//! consumer; re-driven jobs are read from the jobs queue, targeted cancels
//! from a queue bound to the control exchange. Janitor passes are run with an
//! explicit `now` (a pass "later") instead of waiting for the clock.

mod common;

use std::time::Duration;

use chrono::Utc;
use common::{until, Broker, TestApi};
use diesel::prelude::*;
use lapin::options::BasicGetOptions;
use vid_core::messages::{CancelTranscode, ReportKind, TranscodeJob, TranscodeReport};
use vid_core::operation::{OperationStatus, Phase};
use vid_core::video::SourceMetadata;
use vid_core::{OperationId, TenantId, VideoId};
use vid_db::RunQueryDsl;

/// Janitor passes only when the test runs them.
const QUIET_JANITOR: (&str, &str) = ("operations.janitor_interval_seconds", "3600");

impl Broker {
    /// Publishes a report of run `run` (of a job at attempt 1) as a transcoder does.
    async fn report(&self, op: &OperationId, video: &VideoId, run: &str, kind: ReportKind) {
        self.report_attempt(op, video, run, 1, kind).await;
    }

    /// Publishes a report of run `run` of a job at `attempt`.
    async fn report_attempt(&self, op: &OperationId, video: &VideoId, run: &str, attempt: u32, kind: ReportKind) {
        let report = TranscodeReport {
            operation_id: op.clone(),
            video_id: video.clone(),
            worker: "test".into(),
            emitted_at: Utc::now(),
            run_id: run.into(),
            attempt,
            kind,
        };
        let (exchange, rk) = (self.topology.reports_exchange(), vid_infra::amqp::RK_REPORT);
        self.publisher.publish_json(&exchange, rk, &report, Some(op.as_str())).await.unwrap();
    }

    /// Dead-letters `job` as the broker does after the delivery limit.
    async fn dead_letter(&self, job: &TranscodeJob) {
        let (exchange, rk) = (self.topology.dead_letter_exchange(), vid_infra::amqp::RK_TRANSCODE_DEAD);
        self.publisher.publish_json(&exchange, rk, job, Some(job.operation_id.as_str())).await.unwrap();
    }

    /// Every job waiting in the jobs queue now (taken off it).
    async fn take_jobs(&self) -> Vec<TranscodeJob> {
        let mut jobs = Vec::new();
        let queue = self.topology.transcode_jobs();
        while let Some(m) = self.channel.basic_get(&queue, BasicGetOptions { no_ack: true }).await.unwrap() {
            jobs.push(serde_json::from_slice(&m.delivery.data).unwrap());
        }
        jobs
    }

    /// Waits until the relay has published `n` jobs since the last take; returns them.
    async fn wait_jobs(&self, n: usize) -> Vec<TranscodeJob> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut jobs = Vec::new();
        while jobs.len() < n {
            assert!(tokio::time::Instant::now() < deadline, "only {} of {n} jobs published: {jobs:?}", jobs.len());
            jobs.extend(self.take_jobs().await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        jobs
    }
}

async fn tenant_client(api: &TestApi) -> (TenantId, vid_client::Client) {
    let (tenant, key) = vid_api::auth::create_tenant(&api.state.db, "redrive").await.unwrap();
    (tenant, vid_client::Client::new(&api.url, &key))
}

async fn events_of(api: &TestApi, video: &VideoId, type_: &str) -> i64 {
    use vid_db::schema::events;
    let mut conn = api.state.db.get().await.unwrap();
    events::table
        .filter(events::resource_id.eq(video.as_str()))
        .filter(events::event_type.eq(type_))
        .count()
        .get_result(&mut conn)
        .await
        .unwrap()
}

/// (`run_id`, `job_attempt`) of an operation.
async fn job_columns(api: &TestApi, op: &OperationId) -> (Option<String>, i32) {
    use vid_db::schema::operations;
    let mut conn = api.state.db.get().await.unwrap();
    operations::table
        .filter(operations::id.eq(op.as_str()))
        .select((operations::run_id, operations::job_attempt))
        .first(&mut conn)
        .await
        .unwrap()
}

fn succeeded() -> ReportKind {
    let source = SourceMetadata {
        container: "mp4".into(),
        duration_seconds: Some(1.0),
        width: 64,
        height: 64,
        rotation: 0,
        video_codec: "h264".into(),
        audio_codec: None,
        frame_rate: Some(25.0),
        size_bytes: 1,
    };
    ReportKind::Succeeded { source, renditions: vec![], poster: None, stream: None }
}

/// One janitor re-drive pass as if the clock read `now`: (re-driven, lost).
async fn pass(api: &TestApi, now: chrono::DateTime<Utc>) -> (usize, usize) {
    let r = pass_full(api, now).await;
    (r.redriven, r.lost)
}

async fn pass_full(api: &TestApi, now: chrono::DateTime<Utc>) -> vid_api::janitor::Redriven {
    let mut conn = api.state.db.get().await.unwrap();
    vid_api::janitor::redrive(&api.state, &mut conn, now).await.unwrap()
}

/// (c) A second run's `Started` makes it the owner and cancels the first run
/// (targeted); reports of the superseded run change nothing, its `Succeeded`
/// included; a `Started` on the terminal operation gets a targeted cancel.
#[tokio::test]
async fn the_latest_started_wins_and_reports_of_other_runs_are_ignored() {
    let api = TestApi::start(&[QUIET_JANITOR]).await;
    let mut broker = Broker::connect(&api).await;
    let (tenant, client) = tenant_client(&api).await;
    let (op, video) = common::pending_operation(&api, &tenant).await;

    broker.report(&op, &video, "run-1", ReportKind::Started).await;
    until(&client, &op, "running under run-1", |o| o.status == OperationStatus::Running).await;
    assert_eq!(job_columns(&api, &op).await.0.as_deref(), Some("run-1"));

    broker.report(&op, &video, "run-2", ReportKind::Started).await;
    let cancel = broker.next_cancel().await;
    assert_eq!(cancel, CancelTranscode { operation_id: op.clone(), run_id: Some("run-1".into()) });
    assert_eq!(job_columns(&api, &op).await.0.as_deref(), Some("run-2"));

    // run-1's progress (60) is ignored; run-2's (30) applies after it, in order.
    broker.report(&op, &video, "run-1", ReportKind::Progress { phase: Phase::Transcoding, percent: 60 }).await;
    broker.report(&op, &video, "run-2", ReportKind::Progress { phase: Phase::Probing, percent: 30 }).await;
    let seen = until(&client, &op, "run-2's progress", |o| o.progress >= 30).await;
    assert_eq!((seen.progress, seen.metadata.phase), (30, Some(Phase::Probing)), "a superseded run's report changed the operation");

    // run-1's success is ignored (run-2 still owns a running operation).
    broker.report(&op, &video, "run-1", succeeded()).await;
    broker.report(&op, &video, "run-2", ReportKind::Progress { phase: Phase::Transcoding, percent: 40 }).await;
    let seen = until(&client, &op, "run-2's second progress", |o| o.progress >= 40).await;
    assert_eq!(seen.status, OperationStatus::Running, "a superseded run's success ended the operation");
    assert_eq!(events_of(&api, &video, "video.ready").await, 0);

    broker.report(&op, &video, "run-2", succeeded()).await;
    until(&client, &op, "succeeded by run-2", |o| o.status == OperationStatus::Succeeded).await;

    // A late copy starting now is told to stop, and only it.
    broker.report(&op, &video, "run-3", ReportKind::Started).await;
    let cancel = broker.next_cancel().await;
    assert_eq!(cancel, CancelTranscode { operation_id: op.clone(), run_id: Some("run-3".into()) });
    let after = client.get_operation(&op).await.unwrap();
    assert_eq!((after.status, after.progress), (OperationStatus::Succeeded, 100));
    assert_eq!(job_columns(&api, &op).await.0.as_deref(), Some("run-2"), "a Started on a terminal operation took ownership");
    assert_eq!(events_of(&api, &video, "video.ready").await, 1);
    assert_eq!(events_of(&api, &video, "video.processing").await, 1);
}

/// (d) A pending operation is re-driven `max_redrives` times (attempt 2, 3:
/// the same job otherwise), then left alone until it is older than
/// `job_lost_after_seconds`, then failed `job_lost` (once, even with two
/// replicas' passes racing).
#[tokio::test]
async fn a_stale_pending_job_is_redriven_then_lost_after_max_redrives_and_the_age() {
    let short = [("operations.redrive_after_seconds", "5"), ("operations.max_redrives", "2"), ("operations.job_lost_after_seconds", "20")];
    let api = TestApi::start(&[QUIET_JANITOR, short[0], short[1], short[2]]).await;
    let o = &api.state.settings.operations;
    assert_eq!((o.redrive_after_seconds, o.max_redrives, o.job_lost_after_seconds), (5, 2, 20));
    let broker = Broker::connect(&api).await;
    let (tenant, client) = tenant_client(&api).await;
    let (op, video) = common::pending_operation(&api, &tenant).await;
    let t0 = Utc::now();
    let s = |secs: i64| t0 + chrono::Duration::seconds(secs);

    assert_eq!(pass(&api, s(1)).await, (0, 0), "re-driven before redrive_after_seconds");
    // Two replicas' passes at once: one re-drive.
    let (a, b) = tokio::join!(pass(&api, s(6)), pass(&api, s(6)));
    assert_eq!(a.0 + b.0, 1, "{a:?} {b:?}");
    let jobs = broker.wait_jobs(1).await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let job = &jobs[0];
    assert_eq!((&job.operation_id, &job.video_id, &job.tenant_id, job.attempt), (&op, &video, &tenant, 2));
    assert_eq!((job.source_key.as_str(), job.source_size_bytes), ("k", 1));
    assert_eq!(job.output_prefix, format!("tenants/{tenant}/videos/{video}/"));

    // The re-drive stamped job_published_at with the database's now (≈ t0): next due 5 s later.
    assert_eq!(pass(&api, s(3)).await, (0, 0), "re-driven again before redrive_after_seconds");
    assert_eq!(pass(&api, s(12)).await, (1, 0));
    assert_eq!(broker.wait_jobs(1).await.iter().map(|j| j.attempt).collect::<Vec<_>>(), [3]);
    assert_eq!(job_columns(&api, &op).await, (None, 3));

    // Re-drives used up, but younger than job_lost_after_seconds: nothing happens.
    assert_eq!(pass(&api, s(18)).await, (0, 0), "lost or re-driven before job_lost_after_seconds");
    assert_eq!(client.get_operation(&op).await.unwrap().status, OperationStatus::Pending);
    assert!(broker.take_jobs().await.is_empty());

    let (a, b) = tokio::join!(pass(&api, s(25)), pass(&api, s(25)));
    assert_eq!((a.0 + b.0, a.1 + b.1), (0, 1), "{a:?} {b:?}");
    let failed = client.get_operation(&op).await.unwrap();
    assert_eq!(failed.status, OperationStatus::Failed);
    assert_eq!(failed.error.as_ref().map(|e| e.code.as_str()), Some("job_lost"));
    assert_eq!(events_of(&api, &video, "video.failed").await, 1);
    assert_eq!(pass(&api, s(60)).await, (0, 0), "a failed operation is left alone");

    let page = vid_infra::metrics::render();
    let sample = |name: &str| page.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert!(sample("jobs_redriven_total").is_some_and(|v| v >= 2.0), "{page}");
    assert!(sample("operations_job_lost_total").is_some_and(|v| v >= 1.0), "{page}");
    assert!(sample("oldest_pending_operation_age_seconds").is_some(), "{page}");
}

/// (e) On a healthy system nothing is re-driven: a fresh pending operation,
/// a running one and a finished one, even a day later; the gauge shows the
/// pending one's age.
#[tokio::test]
async fn nothing_is_redriven_on_a_healthy_system() {
    let api = TestApi::start(&[QUIET_JANITOR]).await;
    let broker = Broker::connect(&api).await;
    let (tenant, client) = tenant_client(&api).await;
    let (pending, _) = common::pending_operation(&api, &tenant).await;
    let (running, running_video) = common::pending_operation(&api, &tenant).await;
    let (done, done_video) = common::pending_operation(&api, &tenant).await;
    broker.report(&running, &running_video, "run-a", ReportKind::Started).await;
    broker.report(&done, &done_video, "run-b", ReportKind::Started).await;
    broker.report(&done, &done_video, "run-b", succeeded()).await;
    until(&client, &done, "succeeded", |o| o.status == OperationStatus::Succeeded).await;
    until(&client, &running, "running", |o| o.status == OperationStatus::Running).await;

    let now = pass_full(&api, Utc::now()).await;
    assert_eq!((now.redriven, now.lost), (0, 0), "a fresh pending operation was re-driven");
    assert!(now.oldest_pending_age_seconds < 60.0, "{now:?}");
    assert!(broker.take_jobs().await.is_empty());
    // A day later only the `pending` one is due, and it is the oldest pending.
    let later = pass_full(&api, Utc::now() + chrono::Duration::days(1)).await;
    assert_eq!((later.redriven, later.lost), (1, 0), "exactly the pending operation is due a day later");
    assert!((86_000.0..86_500.0).contains(&later.oldest_pending_age_seconds), "{later:?}");
    let jobs = broker.wait_jobs(1).await;
    assert_eq!(jobs.iter().map(|j| (&j.operation_id, j.attempt)).collect::<Vec<_>>(), [(&pending, 2)]);
    assert_eq!(client.get_operation(&running).await.unwrap().status, OperationStatus::Running);
    assert_eq!(client.get_operation(&done).await.unwrap().status, OperationStatus::Succeeded);
}

/// One janitor pass over silent `running` operations as if the clock read `now`: (re-driven, worker_lost).
async fn silent_pass(api: &TestApi, now: chrono::DateTime<Utc>) -> (usize, usize) {
    let mut conn = api.state.db.get().await.unwrap();
    let r = vid_api::janitor::silent(&api.state, &mut conn, now).await.unwrap();
    (r.redriven, r.lost)
}

/// Moves the operation's last report `secs` seconds into the past.
async fn age_heartbeat(api: &TestApi, op: &OperationId, secs: i64) {
    use vid_db::schema::operations;
    let mut conn = api.state.db.get().await.unwrap();
    let n = diesel::update(operations::table.filter(operations::id.eq(op.as_str())))
        .set(operations::heartbeat_at.eq(Utc::now() - chrono::Duration::seconds(secs)))
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(n, 1);
}

/// How many dead-lettered jobs of this api's dead queue its consumer acked.
fn dead_acked(api: &TestApi) -> f64 {
    let queue = format!("queue=\"{}\"", api.state.topology.transcode_dead());
    let page = vid_infra::metrics::render();
    page.lines()
        .filter(|l| l.starts_with("amqp_messages_consumed_total{") && l.contains(&queue) && l.contains("outcome=\"ack\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits (up to 30 s) until the dead-letter consumer acked `n` jobs.
async fn until_dead_acked(api: &TestApi, n: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while dead_acked(api) < n {
        assert!(tokio::time::Instant::now() < deadline, "only {} of {n} dead letters consumed", dead_acked(api));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// (f) An open operation without owner (`run_id` NULL: from before the
/// migration, or a report overtaking its `Started`): the first run to report
/// anything takes it — here an old transcoder's run `""` — and the reports of
/// any other run are then ignored.
#[tokio::test]
async fn the_first_run_to_report_on_an_operation_without_owner_takes_it() {
    let api = TestApi::start(&[QUIET_JANITOR]).await;
    let broker = Broker::connect(&api).await;
    let (tenant, client) = tenant_client(&api).await;
    let (op, video) = common::pending_operation(&api, &tenant).await;
    assert_eq!(job_columns(&api, &op).await, (None, 1));

    broker.report(&op, &video, "", ReportKind::Progress { phase: Phase::Transcoding, percent: 40 }).await;
    let seen = until(&client, &op, "the ownerless run's progress", |o| o.progress >= 40).await;
    assert_eq!((seen.status, seen.progress), (OperationStatus::Running, 40));
    assert_eq!(job_columns(&api, &op).await.0.as_deref(), Some(""), "the first reporter did not take ownership");

    broker.report(&op, &video, "run-y", ReportKind::Progress { phase: Phase::Transcoding, percent: 70 }).await;
    broker.report(&op, &video, "", ReportKind::Progress { phase: Phase::Transcoding, percent: 50 }).await;
    let seen = until(&client, &op, "the owner's second progress", |o| o.progress >= 50).await;
    assert_eq!(seen.progress, 50, "another run's report changed an owned operation");

    broker.report(&op, &video, "", succeeded()).await;
    until(&client, &op, "succeeded by the run \"\"", |o| o.status == OperationStatus::Succeeded).await;
    assert_eq!(events_of(&api, &video, "video.ready").await, 1);
    assert_eq!(events_of(&api, &video, "video.processing").await, 1);
}

/// (g) A `running` operation whose worker went silent (broker reset: run
/// aborted, job message wiped) is re-driven from PostgreSQL — owner dropped,
/// status still `running`, progress kept — `max_redrives` times; only then
/// is it failed `worker_lost`.
#[tokio::test]
async fn a_silent_running_operation_is_redriven_then_worker_lost() {
    let settings = [("operations.heartbeat_timeout_seconds", "60"), ("operations.max_redrives", "2")];
    let api = TestApi::start(&[QUIET_JANITOR, settings[0], settings[1]]).await;
    let broker = Broker::connect(&api).await;
    let (tenant, client) = tenant_client(&api).await;
    let (op, video) = common::pending_operation(&api, &tenant).await;
    let t0 = Utc::now();
    let s = |secs: i64| t0 + chrono::Duration::seconds(secs);
    broker.report(&op, &video, "run-1", ReportKind::Started).await;
    broker.report(&op, &video, "run-1", ReportKind::Progress { phase: Phase::Transcoding, percent: 40 }).await;
    until(&client, &op, "running at 40", |o| o.progress >= 40).await;

    assert_eq!(silent_pass(&api, s(30)).await, (0, 0), "re-driven before the heartbeat timeout");
    assert_eq!(silent_pass(&api, s(61)).await, (1, 0), "a silent running operation was not re-driven");
    let jobs = broker.wait_jobs(1).await;
    assert_eq!(jobs.iter().map(|j| (&j.operation_id, j.attempt)).collect::<Vec<_>>(), [(&op, 2)]);
    assert_eq!(job_columns(&api, &op).await, (None, 2));
    let seen = client.get_operation(&op).await.unwrap();
    assert_eq!((seen.status, seen.progress), (OperationStatus::Running, 40), "the re-drive changed what the operation shows");
    // The heartbeat was reset to the pass's clock: not silent again before the timeout.
    assert_eq!(silent_pass(&api, s(100)).await, (0, 0));

    broker.report_attempt(&op, &video, "run-2", 2, ReportKind::Started).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while job_columns(&api, &op).await.0.as_deref() != Some("run-2") {
        assert!(tokio::time::Instant::now() < deadline, "run-2 never took the re-driven operation");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(client.get_operation(&op).await.unwrap().progress, 40, "progress went back");

    assert_eq!(silent_pass(&api, s(125)).await, (1, 0));
    assert_eq!(broker.wait_jobs(1).await.iter().map(|j| j.attempt).collect::<Vec<_>>(), [3]);
    assert_eq!(events_of(&api, &video, "video.failed").await, 0);
    // Re-drives used up: worker_lost, once.
    assert_eq!(silent_pass(&api, s(186)).await, (0, 1));
    let failed = client.get_operation(&op).await.unwrap();
    assert_eq!(failed.status, OperationStatus::Failed);
    assert_eq!(failed.error.as_ref().map(|e| e.code.as_str()), Some("worker_lost"));
    assert_eq!(events_of(&api, &video, "video.failed").await, 1);
    assert!(broker.take_jobs().await.is_empty());
    assert_eq!(silent_pass(&api, s(400)).await, (0, 0));
}

/// (h) A `Started` of another job attempt while the owner's heartbeat is
/// fresh is refused (the newcomer alone is cancelled; the owner keeps its
/// reports counting); one of the same attempt (crash redelivery) takes over;
/// an owner gone silent is displaced by any attempt.
#[tokio::test]
async fn a_copy_of_another_attempt_is_refused_while_the_owner_is_alive() {
    let api = TestApi::start(&[QUIET_JANITOR]).await;
    let mut broker = Broker::connect(&api).await;
    let (tenant, client) = tenant_client(&api).await;
    let (op, video) = common::pending_operation(&api, &tenant).await;

    broker.report_attempt(&op, &video, "run-1", 1, ReportKind::Started).await;
    until(&client, &op, "running under run-1", |o| o.status == OperationStatus::Running).await;
    broker.report_attempt(&op, &video, "run-2", 2, ReportKind::Started).await;
    let cancel = broker.next_cancel().await;
    assert_eq!(cancel, CancelTranscode { operation_id: op.clone(), run_id: Some("run-2".into()) }, "the re-driven copy was not refused");
    assert_eq!(job_columns(&api, &op).await.0.as_deref(), Some("run-1"));
    broker.report_attempt(&op, &video, "run-1", 1, ReportKind::Progress { phase: Phase::Transcoding, percent: 50 }).await;
    until(&client, &op, "the owner's progress", |o| o.progress >= 50).await;

    // Same attempt (the broker redelivered run-1's message): takes over.
    broker.report_attempt(&op, &video, "run-3", 1, ReportKind::Started).await;
    let cancel = broker.next_cancel().await;
    assert_eq!(cancel, CancelTranscode { operation_id: op.clone(), run_id: Some("run-1".into()) });
    assert_eq!(job_columns(&api, &op).await.0.as_deref(), Some("run-3"));

    // The owner went silent (past heartbeat_timeout): any attempt displaces it.
    let timeout = api.state.settings.operations.heartbeat_timeout_seconds as i64;
    age_heartbeat(&api, &op, timeout + 10).await;
    broker.report_attempt(&op, &video, "run-4", 2, ReportKind::Started).await;
    let cancel = broker.next_cancel().await;
    assert_eq!(cancel, CancelTranscode { operation_id: op.clone(), run_id: Some("run-3".into()) });
    assert_eq!(job_columns(&api, &op).await.0.as_deref(), Some("run-4"));
    broker.report_attempt(&op, &video, "run-4", 2, succeeded()).await;
    until(&client, &op, "succeeded by run-4", |o| o.status == OperationStatus::Succeeded).await;
    assert_eq!(client.get_operation(&op).await.unwrap().progress, 100);
    assert_eq!(events_of(&api, &video, "video.ready").await, 1);
}

/// (i) A dead-lettered copy fails the operation only if it is the current
/// attempt and no run of another attempt is alive on it.
#[tokio::test]
async fn dead_letters_of_superseded_copies_or_beside_a_live_run_are_ignored() {
    let short = [("operations.redrive_after_seconds", "5"), ("operations.max_redrives", "2")];
    let api = TestApi::start(&[QUIET_JANITOR, short[0], short[1]]).await;
    let broker = Broker::connect(&api).await;
    let (tenant, client) = tenant_client(&api).await;
    let (op, video) = common::pending_operation(&api, &tenant).await;
    assert_eq!(pass(&api, Utc::now() + chrono::Duration::seconds(6)).await, (1, 0));
    let job2 = broker.wait_jobs(1).await.remove(0);
    assert_eq!(job2.attempt, 2);
    let job1 = TranscodeJob { attempt: 1, ..job2.clone() };
    let acked = dead_acked(&api);

    broker.dead_letter(&job1).await;
    until_dead_acked(&api, acked + 1.0).await;
    assert_eq!(client.get_operation(&op).await.unwrap().status, OperationStatus::Pending, "a superseded dead copy failed the operation");

    // The first copy started late and is alive; the re-driven copy dies.
    broker.report_attempt(&op, &video, "run-1", 1, ReportKind::Started).await;
    until(&client, &op, "running under run-1", |o| o.status == OperationStatus::Running).await;
    broker.dead_letter(&job2).await;
    until_dead_acked(&api, acked + 2.0).await;
    assert_eq!(client.get_operation(&op).await.unwrap().status, OperationStatus::Running, "a dead copy failed a live run's operation");
    assert_eq!(events_of(&api, &video, "video.failed").await, 0);

    // Once run-1 is silent, the current copy's death fails it.
    let timeout = api.state.settings.operations.heartbeat_timeout_seconds as i64;
    age_heartbeat(&api, &op, timeout + 10).await;
    broker.dead_letter(&job2).await;
    let failed = until(&client, &op, "failed", |o| o.status == OperationStatus::Failed).await;
    assert_eq!(failed.error.as_ref().map(|e| e.code.as_str()), Some("transcode_retries_exhausted"));
    assert_eq!(events_of(&api, &video, "video.failed").await, 1);
}
