//! Watching operations without polling (issue 12): `:wait`, the event stream,
//! wake-ups across api instances through PostgreSQL LISTEN/NOTIFY, and the
//! per-tenant bound. Real api in-process, real PostgreSQL; changes are driven
//! through `vid_api::domain::operation::apply` (what the transcoder-report consumer calls).

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{problem_code, TestApi};
use vid_api::domain::operation::{self, Applied, Outcome, Transition};
use vid_core::operation::{OperationStatus, Phase, WaitReason};
use vid_core::video::SourceMetadata;
use vid_core::{OperationId, TenantId};
use vid_db::RunQueryDsl;

/// A tenant with a key, and a `pending` operation of it (rows as `complete` writes them).
async fn tenant_with_operation(api: &TestApi) -> (TenantId, vid_client::Client, OperationId) {
    let (tenant, key) = vid_api::auth::create_tenant(&api.state.db, "watcher").await.unwrap();
    let op = new_operation(api, &tenant).await;
    (tenant, vid_client::Client::new(&api.url, &key), op)
}

async fn new_operation(api: &TestApi, tenant: &TenantId) -> OperationId {
    common::pending_operation(api, tenant).await.0
}

/// Applies a transition as the consumers do.
async fn apply(api: &TestApi, op: &OperationId, transition: Transition) -> Applied {
    let mut conn = api.state.db.get().await.unwrap();
    operation::apply(&mut conn, &api.state.outbox, op, transition).await.unwrap()
}

async fn progress(api: &TestApi, op: &OperationId, phase: Phase, percent: u8) {
    assert_eq!(apply(api, op, Transition::Progress { phase: Some(phase), percent }).await, Applied::Changed);
}

async fn succeed(api: &TestApi, op: &OperationId) {
    let source = SourceMetadata {
        container: "mov,mp4,m4a,3gp,3g2,mj2".into(),
        duration_seconds: Some(1.0),
        width: 64,
        height: 64,
        rotation: 0,
        video_codec: "h264".into(),
        audio_codec: None,
        frame_rate: Some(25.0),
        size_bytes: 1,
    };
    let outcome = Outcome::Succeeded { source, renditions: Vec::new(), poster: None, stream: None };
    assert_eq!(apply(api, op, Transition::Finish(outcome)).await, Applied::Changed);
}

/// Waits until the tenant holds `n` watchers on `api` (i.e. a wait or stream is registered).
async fn until_watchers(api: &TestApi, tenant: &TenantId, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.state.watchers.watchers(tenant) != n {
        assert!(Instant::now() < deadline, "tenant holds {} watchers, expected {n}", api.state.watchers.watchers(tenant));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A second api process on the same database and RabbitMQ prefix.
async fn second_instance(api: &TestApi, overrides: &[(&str, &str)]) -> TestApi {
    let db = api.state.settings.database.url.clone();
    let db = vid_infra::ExposeSecret::expose_secret(&db).to_owned();
    let prefix = api.state.settings.amqp.prefix.clone();
    let mut all: Vec<(&str, &str)> = vec![("database.url", &db), ("amqp.prefix", &prefix), ("api.listen", "127.0.0.1:0")];
    all.extend_from_slice(overrides);
    let app = vid_api::Application::build(vid_testkit::settings(&all)).expect("api builds");
    let url = format!("http://127.0.0.1:{}", app.port());
    let state = app.state().clone();
    tokio::spawn(app.run());
    TestApi { url, key: api.key.clone(), state }
}

#[tokio::test]
async fn wait_answers_within_a_second_of_a_change_at_the_timeout_otherwise_and_at_once_when_terminal() {
    let api = TestApi::start(&[]).await;
    let (tenant, client, op) = tenant_with_operation(&api).await;

    // A progress change wakes the waiter.
    let waiter = {
        let (client, op) = (client.clone(), op.clone());
        tokio::spawn(async move {
            let answer = client.wait_operation_once(&op, Some(20), None).await.unwrap();
            (answer, Instant::now())
        })
    };
    until_watchers(&api, &tenant, 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let committed = Instant::now();
    progress(&api, &op, Phase::Transcoding, 10).await;
    let (answer, answered) = waiter.await.unwrap();
    let latency = answered.duration_since(committed);
    eprintln!(":wait answered {latency:?} after the commit");
    // Generous for a loaded machine sharing this thread with the api; a missed
    // wake-up still fails (it would answer at the 20 s timeout, not `Changed`).
    assert!(latency < Duration::from_secs(5), "answered {latency:?} after the change");
    assert_eq!(answer.reason, WaitReason::Changed);
    assert_eq!(answer.operation.status, OperationStatus::Running);
    assert_eq!(answer.operation.progress, 10);
    assert_eq!(answer.revision, 1);
    until_watchers(&api, &tenant, 0).await;

    // Nothing changes: the answer comes at the timeout, with the current operation.
    let started = Instant::now();
    let answer = client.wait_operation_once(&op, Some(1), None).await.unwrap();
    let took = started.elapsed();
    assert_eq!(answer.reason, WaitReason::Timeout);
    assert_eq!(answer.operation.progress, 10);
    assert!(took >= Duration::from_millis(950) && took < Duration::from_secs(5), "timeout took {took:?}");

    // An older revision answers at once with what changed since.
    let answer = client.wait_operation_once(&op, Some(10), Some(0)).await.unwrap();
    assert_eq!((answer.reason, answer.revision), (WaitReason::Changed, 1));

    // A repeated heartbeat with the same progress is not a change.
    progress(&api, &op, Phase::Transcoding, 10).await;
    let answer = client.wait_operation_once(&op, Some(1), Some(1)).await.unwrap();
    assert_eq!((answer.reason, answer.revision), (WaitReason::Timeout, 1));

    // Terminal: at once.
    succeed(&api, &op).await;
    let started = Instant::now();
    let answer = client.wait_operation_once(&op, Some(30), None).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "terminal answered after {:?}", started.elapsed());
    assert_eq!(answer.reason, WaitReason::Terminal);
    assert_eq!(answer.operation.status, OperationStatus::Succeeded);

    // Malformed bodies and unknown or foreign operations.
    let bad = client
        .raw(vid_client::HttpMethod::POST, &format!("/operations/{op}:wait"), Some(&serde_json::json!({"timeout": 1})))
        .await
        .unwrap_err();
    assert_eq!(problem_code(&bad), "invalid_json");
    let foreign = api.client().wait_operation_once(&op, Some(1), None).await.unwrap_err();
    assert_eq!(problem_code(&foreign), "not_found");
    until_watchers(&api, &tenant, 0).await;
    assert_eq!(api.state.watchers.watched_operations(), 0);
}

#[tokio::test]
async fn the_sdk_follows_an_operation_with_wait() {
    let api = TestApi::start(&[]).await;
    let (_, client, op) = tenant_with_operation(&api).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let follower = {
        let (client, op, seen) = (client.clone(), op.clone(), seen.clone());
        tokio::spawn(async move {
            client.wait_operation(&op, Duration::from_secs(30), |o| seen.lock().unwrap().push((o.status, o.progress))).await.unwrap()
        })
    };
    // `:wait` answers with the current state, so two changes within one round
    // trip would reach the follower as one. Each change is made only once the
    // follower has recorded the previous state: it must then see every one.
    let until_seen = |n: usize| {
        let seen = seen.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while seen.lock().unwrap().len() < n {
                assert!(Instant::now() < deadline, "the follower saw {:?}, expected {n} states", seen.lock().unwrap());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    until_seen(1).await;
    for (i, pct) in [0, 30, 60].into_iter().enumerate() {
        progress(&api, &op, Phase::Transcoding, pct).await;
        until_seen(i + 2).await;
    }
    succeed(&api, &op).await;
    let done = tokio::time::timeout(Duration::from_secs(10), follower).await.unwrap().unwrap();
    assert_eq!(done.status, OperationStatus::Succeeded);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            (OperationStatus::Pending, 0),
            (OperationStatus::Running, 0),
            (OperationStatus::Running, 30),
            (OperationStatus::Running, 60),
            (OperationStatus::Succeeded, 100)
        ]
    );
}

#[tokio::test]
async fn the_stream_delivers_every_change_in_order_and_closes_after_the_terminal_event() {
    let api = TestApi::start(&[]).await;
    let (_, client, op) = tenant_with_operation(&api).await;
    let mut events = client.operation_events(&op, None).await.unwrap().expect("a stream");
    let first = events.next().await.unwrap().unwrap();
    assert_eq!((first.id, first.operation.status), (Some(0), OperationStatus::Pending));

    // Paced like a real transcode: every change arrives, in order.
    let steps: [(Phase, u8); 4] = [(Phase::Downloading, 0), (Phase::Probing, 5), (Phase::Transcoding, 40), (Phase::Uploading, 95)];
    for (i, (phase, pct)) in steps.iter().enumerate() {
        progress(&api, &op, *phase, *pct).await;
        let event = tokio::time::timeout(Duration::from_secs(5), events.next()).await.expect("event in time").unwrap().unwrap();
        assert_eq!(event.id, Some(i as i64 + 1));
        assert_eq!(event.operation.status, OperationStatus::Running);
        assert_eq!((event.operation.metadata.phase, event.operation.progress), (Some(*phase), *pct));
    }
    succeed(&api, &op).await;
    let last = tokio::time::timeout(Duration::from_secs(5), events.next()).await.unwrap().unwrap().unwrap();
    assert_eq!((last.id, last.operation.status, last.operation.progress), (Some(5), OperationStatus::Succeeded, 100));
    // …and the stream ends.
    assert!(tokio::time::timeout(Duration::from_secs(2), events.next()).await.unwrap().unwrap().is_none());

    // A burst of changes with nobody pacing them: never out of order, never
    // backwards, and it always ends with the terminal state.
    let (_, client, op) = tenant_with_operation(&api).await;
    let mut events = client.operation_events(&op, None).await.unwrap().unwrap();
    assert_eq!(events.next().await.unwrap().unwrap().id, Some(0));
    for pct in (0..=90).step_by(10) {
        progress(&api, &op, Phase::Transcoding, pct).await;
    }
    succeed(&api, &op).await;
    let mut seen = Vec::new();
    while let Some(event) = tokio::time::timeout(Duration::from_secs(5), events.next()).await.unwrap().unwrap() {
        seen.push((event.id.unwrap(), event.operation.status, event.operation.progress));
    }
    assert!(seen.windows(2).all(|w| w[0].0 < w[1].0 && w[0].2 <= w[1].2), "{seen:?}");
    assert_eq!(seen.last().map(|s| (s.0, s.1)), Some((11, OperationStatus::Succeeded)), "{seen:?}");
}

#[tokio::test]
async fn reconnecting_with_last_event_id_resumes() {
    let api = TestApi::start(&[]).await;
    let (_, client, op) = tenant_with_operation(&api).await;
    let mut events = client.operation_events(&op, None).await.unwrap().unwrap();
    assert_eq!(events.next().await.unwrap().unwrap().id, Some(0));
    progress(&api, &op, Phase::Downloading, 0).await;
    assert_eq!(events.next().await.unwrap().unwrap().id, Some(1));
    drop(events);

    // Missed two changes while away: gets the current state at once.
    progress(&api, &op, Phase::Transcoding, 20).await;
    progress(&api, &op, Phase::Transcoding, 50).await;
    let mut events = client.operation_events(&op, Some(1)).await.unwrap().unwrap();
    let event = events.next().await.unwrap().unwrap();
    assert_eq!((event.id, event.operation.progress), (Some(3), 50));
    drop(events);

    // Missed nothing: nothing until the next change.
    let mut events = client.operation_events(&op, Some(3)).await.unwrap().unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(500), events.next()).await.is_err(), "no event without a change");
    progress(&api, &op, Phase::Transcoding, 70).await;
    let event = tokio::time::timeout(Duration::from_secs(2), events.next()).await.unwrap().unwrap().unwrap();
    assert_eq!((event.id, event.operation.progress), (Some(4), 70));
    drop(events);

    // Missed the end: gets the terminal event, then the stream closes.
    succeed(&api, &op).await;
    let mut events = client.operation_events(&op, Some(4)).await.unwrap().unwrap();
    let event = events.next().await.unwrap().unwrap();
    assert_eq!((event.id, event.operation.status), (Some(5), OperationStatus::Succeeded));
    assert!(events.next().await.unwrap().is_none());
    // Saw the end already: 204, nothing more (EventSource stops reconnecting).
    assert!(client.operation_events(&op, Some(5)).await.unwrap().is_none());
}

#[tokio::test]
async fn a_change_through_one_instance_wakes_a_waiter_on_the_other() {
    let a = TestApi::start(&[]).await;
    let b = second_instance(&a, &[]).await;
    let (tenant, client_a, op) = tenant_with_operation(&a).await;
    let client_b = vid_client::Client::new(&b.url, &issue_key(&a, &tenant).await);

    // A waiter and a stream on b; the change is committed through a.
    let waiter = {
        let (client_b, op) = (client_b.clone(), op.clone());
        tokio::spawn(async move { (client_b.wait_operation_once(&op, Some(20), None).await.unwrap(), Instant::now()) })
    };
    let mut events = client_b.operation_events(&op, None).await.unwrap().unwrap();
    assert_eq!(events.next().await.unwrap().unwrap().id, Some(0));
    until_watchers(&b, &tenant, 2).await;
    assert_eq!(a.state.watchers.watchers(&tenant), 0);
    let committed = Instant::now();
    progress(&a, &op, Phase::Transcoding, 30).await;
    let (answer, answered) = waiter.await.unwrap();
    eprintln!("cross-instance :wait answered {:?} after the commit", answered.duration_since(committed));
    assert!(answered.duration_since(committed) < Duration::from_secs(5));
    assert_eq!((answer.reason, answer.operation.progress), (WaitReason::Changed, 30));
    let event = tokio::time::timeout(Duration::from_secs(5), events.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(event.operation.progress, 30);

    // A cancel through a's HTTP API ends b's stream.
    let cancelled = client_a.cancel_operation(&op).await.unwrap();
    assert_eq!(cancelled.status, OperationStatus::Cancelled);
    let event = tokio::time::timeout(Duration::from_secs(5), events.next()).await.unwrap().unwrap().unwrap();
    assert_eq!((event.id, event.operation.status), (Some(2), OperationStatus::Cancelled));
    assert!(events.next().await.unwrap().is_none());
}

async fn issue_key(api: &TestApi, tenant: &TenantId) -> String {
    let mut conn = api.state.db.get().await.unwrap();
    vid_api::auth::issue_key(&mut conn, tenant).await.unwrap()
}

async fn raw_status(
    client: &vid_client::Client,
    key: &str,
    method: vid_client::HttpMethod,
    path: &str,
) -> (u16, Option<String>, serde_json::Value) {
    let url = format!("{}{path}", client.base_url());
    let resp = client.http().request(method, url).bearer_auth(key).send().await.unwrap();
    let status = resp.status().as_u16();
    let retry_after = resp.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    let body = resp.json().await.unwrap_or(serde_json::Value::Null);
    (status, retry_after, body)
}

#[tokio::test]
async fn the_per_tenant_bound_gives_429_and_a_client_that_leaves_frees_its_slot() {
    let api = TestApi::start(&[("operations.max_watchers_per_tenant", "2")]).await;
    let (tenant, client, op) = tenant_with_operation(&api).await;
    let key = issue_key(&api, &tenant).await;

    let mut one = client.operation_events(&op, None).await.unwrap().unwrap();
    one.next().await.unwrap().unwrap();
    let waiter = {
        let (client, op) = (client.clone(), op.clone());
        tokio::spawn(async move { client.wait_operation_once(&op, Some(30), None).await })
    };
    until_watchers(&api, &tenant, 2).await;

    // Third: 429 with Retry-After, for streams and waits alike.
    for (method, path) in [
        (vid_client::HttpMethod::GET, format!("/operations/{op}/events")),
        (vid_client::HttpMethod::POST, format!("/operations/{op}:wait")),
    ] {
        let (status, retry_after, body) = raw_status(&client, &key, method, &path).await;
        assert_eq!(status, 429, "{body}");
        assert_eq!(body["code"], "too_many_watchers");
        assert!(retry_after.unwrap().parse::<u64>().unwrap() >= 1);
    }
    let err = client.operation_events(&op, None).await.unwrap_err();
    assert_eq!(problem_code(&err), "too_many_watchers");
    // Another tenant has its own slots.
    let (_, other, other_op) = tenant_with_operation(&api).await;
    assert_eq!(other.wait_operation_once(&other_op, Some(0), None).await.unwrap().reason, WaitReason::Timeout);

    // A stream client that disconnects frees its slot…
    drop(one);
    until_watchers(&api, &tenant, 1).await;
    let mut two = client.operation_events(&op, None).await.unwrap().unwrap();
    two.next().await.unwrap().unwrap();
    until_watchers(&api, &tenant, 2).await;
    // …and so does a waiter that gives up before the answer.
    waiter.abort();
    let _ = waiter.await;
    let started = Instant::now();
    until_watchers(&api, &tenant, 1).await;
    eprintln!("an abandoned :wait freed its slot after {:?}", started.elapsed());
    drop(two);
    until_watchers(&api, &tenant, 0).await;
    assert_eq!(api.state.watchers.watched_operations(), 0);
}

#[tokio::test]
async fn a_lost_listener_connection_reconnects_and_wakes_waiters_that_missed_a_notification() {
    let api = TestApi::start(&[]).await;
    let (tenant, client, op) = tenant_with_operation(&api).await;
    let waiter = {
        let (client, op) = (client.clone(), op.clone());
        tokio::spawn(async move { client.wait_operation_once(&op, Some(20), None).await.unwrap() })
    };
    until_watchers(&api, &tenant, 1).await;
    // Kill the api's LISTEN connection, and change the operation while it is down.
    let mut conn = api.state.db.get().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        #[derive(diesel::QueryableByName)]
        struct Killed {
            #[diesel(sql_type = diesel::sql_types::Bool)]
            killed: bool,
        }
        let killed: Vec<Killed> = diesel::sql_query(
            "SELECT pg_terminate_backend(pid) AS killed FROM pg_stat_activity
             WHERE datname = current_database() AND query LIKE 'LISTEN operation_changed%' AND pid <> pg_backend_pid()",
        )
        .load(&mut conn)
        .await
        .unwrap();
        if killed.iter().any(|k| k.killed) {
            break;
        }
        assert!(Instant::now() < deadline, "no LISTEN connection found");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(conn);
    progress(&api, &op, Phase::Transcoding, 25).await;
    let answer = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("woken after the reconnect").unwrap();
    assert_eq!((answer.reason, answer.operation.progress), (WaitReason::Changed, 25));
}

/// A late report (or a duplicate copy of the job, or a worker starting the
/// job over after a crash) never rewinds what the operation shows: the phase,
/// like progress, only moves forward, and such a report is no change for
/// `:wait` (the revision stays).
#[tokio::test]
async fn a_late_report_never_rewinds_the_phase() {
    use diesel::{ExpressionMethods, QueryDsl};
    use vid_db::schema::operations;
    let api = TestApi::start(&[]).await;
    let (_, client, op) = tenant_with_operation(&api).await;
    let revision = || async {
        let mut conn = api.state.db.get().await.unwrap();
        operations::table.filter(operations::id.eq(&op)).select(operations::revision).first::<i64>(&mut conn).await.unwrap()
    };
    progress(&api, &op, Phase::Transcoding, 50).await;
    let at = revision().await;

    apply(&api, &op, Transition::Progress { phase: Some(Phase::Downloading), percent: 5 }).await;
    let shown = client.get_operation(&op).await.unwrap();
    assert_eq!((shown.status, shown.progress, shown.metadata.phase), (OperationStatus::Running, 50, Some(Phase::Transcoding)));
    assert_eq!(revision().await, at, "a report that changes nothing shown is no change");

    // Moving on is still seen.
    progress(&api, &op, Phase::Uploading, 90).await;
    let shown = client.get_operation(&op).await.unwrap();
    assert_eq!((shown.progress, shown.metadata.phase), (90, Some(Phase::Uploading)));
    assert!(revision().await > at);
}

/// `:wait` reads its optional body itself; past the api's JSON limit it is a
/// `413 body_too_large` problem (RFC 9457) like every other body, not
/// actix's plain-text answer; bad JSON is `400 invalid_json`.
#[tokio::test]
async fn wait_bodies_past_the_limit_or_malformed_are_problems() {
    let api = TestApi::start(&[]).await;
    let (tenant, key) = vid_api::auth::create_tenant(&api.state.db, "waiter").await.unwrap();
    let op = new_operation(&api, &tenant).await;
    let http = reqwest::Client::new();
    let url = format!("{}/operations/{op}:wait", api.url);
    let limit = vid_api::routes::uploads::MAX_COMPLETE_BODY_BYTES;
    let cases = [
        (format!("{{\"timeout_seconds\": 0{}}}", " ".repeat(limit)), 413, "body_too_large"),
        ("{\"timeout_seconds\": ".to_owned(), 400, "invalid_json"),
        // Not an object (serde alone would read an array positionally), and past u32.
        ("[null, null]".to_owned(), 400, "invalid_json"),
        ("{\"timeout_seconds\": 4294967296}".to_owned(), 400, "invalid_json"),
    ];
    for (body, status, code) in cases {
        let resp = http.post(&url).bearer_auth(&key).header("content-type", "application/json").body(body).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), status);
        assert_eq!(resp.headers()["content-type"], "application/problem+json");
        let problem: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(problem["code"], code, "{problem}");
    }
    // Just under the limit is read (and answers at once: timeout 0).
    let body = format!("{{\"timeout_seconds\": 0{}}}", " ".repeat(limit - 30));
    let resp = http.post(&url).bearer_auth(&key).header("content-type", "application/json").body(body).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}

/// A stored state the code does not know (here a phase no release wrote) is
/// never read as a plausible answer: reading it is `500 internal`, and a
/// transition on it fails (the consumer then retries) without changing anything.
#[tokio::test]
async fn a_corrupt_stored_state_is_a_500_not_a_plausible_answer() {
    let api = TestApi::start(&[]).await;
    let (_, client, op) = tenant_with_operation(&api).await;
    progress(&api, &op, Phase::Downloading, 10).await;
    let mut conn = api.state.db.get().await.unwrap();
    diesel::sql_query("UPDATE operations SET phase = 'defragmenting' WHERE id = $1")
        .bind::<diesel::sql_types::Text, _>(op.as_str())
        .execute(&mut conn)
        .await
        .unwrap();
    drop(conn);

    let err = client.get_operation(&op).await.expect_err("a corrupt row is no answer");
    assert_eq!(problem_code(&err), "internal", "{err}");
    assert_eq!(err.problem().map(|p| p.status), Some(500), "{err}");
    let listed = client.list_operations(None, None).await.expect_err("nor is a page holding it");
    assert_eq!(problem_code(&listed), "internal", "{listed}");

    let mut conn = api.state.db.get().await.unwrap();
    let transition = Transition::Progress { phase: Some(Phase::Transcoding), percent: 50 };
    let failed = operation::apply(&mut conn, &api.state.outbox, &op, transition).await;
    assert!(failed.is_err(), "a transition on a corrupt row fails: {failed:?}");
    let progress: i16 = {
        use diesel::{ExpressionMethods, QueryDsl};
        use vid_db::schema::operations;
        operations::table.filter(operations::id.eq(&op)).select(operations::progress).first(&mut conn).await.unwrap()
    };
    assert_eq!(progress, 10, "nothing changed");
}
