//! Behaviour of the reference receiver against the real local PostgreSQL and
//! RabbitMQ. Every test gets its own database (`receivertest_<ulid>`, created
//! by `App::build`, dropped at the end) and its own queue.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties};
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use vid_webhook_receiver::schema::{applied_effects, seen_events, videos};
use vid_webhook_receiver::{consume, App, Config, ConsumerExit, ConsumerOptions, ConsumerStats, Pool};
use vid_webhooks::{sign_standard, sign_webhook_signature, Secret};

fn postgres_server() -> String {
    std::env::var("RECEIVER_TEST_POSTGRES_SERVER").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

fn amqp_url() -> String {
    std::env::var("RECEIVER_TEST_AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

fn unique() -> String {
    ulid::Ulid::new().to_string().to_ascii_lowercase()
}

/// A receiver running on a free port, with its own database and queue.
struct Receiver {
    port: u16,
    pool: Pool,
    config: Config,
    secret: Secret,
    db_name: String,
    server: actix_web::dev::ServerHandle,
    consumers: Vec<JoinHandle<()>>,
}

impl Receiver {
    async fn start() -> Self {
        Self::start_with(amqp_url(), vec![]).await
    }

    /// `extra_secrets` are accepted too, after the main one.
    async fn start_with(amqp_url: String, extra_secrets: Vec<Secret>) -> Self {
        Self::start_full(amqp_url, extra_secrets, None).await
    }

    /// With the database reached at `postgres_server` (e.g. a [`DbProxy`]).
    async fn start_via(postgres_server: String) -> Self {
        Self::start_full(amqp_url(), vec![], Some(postgres_server)).await
    }

    async fn start_full(amqp_url: String, extra_secrets: Vec<Secret>, via: Option<String>) -> Self {
        let id = unique();
        let db_name = format!("receivertest_{id}");
        let secret = Secret::generate();
        let mut secrets = vec![secret.clone()];
        secrets.extend(extra_secrets);
        let config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            database_url: format!("{}/{db_name}", via.unwrap_or_else(postgres_server)),
            amqp_url,
            queue: format!("receivertest.{id}"),
            secrets,
            tolerance_seconds: 300,
            publish_timeout_ms: 3000,
            prefetch: 10,
            db_pool_size: 4,
        };
        let app = App::build(config.clone()).await.expect("receiver starts");
        let (port, pool, server) = (app.port(), app.pool().clone(), app.handle());
        tokio::spawn(app.run());
        Receiver { port, pool, config, secret, db_name, server, consumers: vec![] }
    }

    fn consumer_options(&self) -> ConsumerOptions {
        ConsumerOptions::from_config(&self.config)
    }

    /// Starts a consumer in the background; returns its counters.
    ///
    /// A 541 `INTERNAL_ERROR` before the first message arrives is retried,
    /// as `run_consumer` would: a quorum queue answers `basic.consume` so
    /// while its Raft member is still starting (slow on a loaded CI
    /// machine), and nothing has been taken from the queue yet. Any other
    /// error, or any exit after a message arrived, panics.
    fn start_consumer(&mut self) -> std::sync::Arc<ConsumerStats> {
        let stats = std::sync::Arc::new(ConsumerStats::default());
        let (pool, options, task_stats) = (self.pool.clone(), self.consumer_options(), stats.clone());
        self.consumers.push(tokio::spawn(async move {
            let mut attempts = 0;
            loop {
                attempts += 1;
                let exit = consume(&pool, &options, &task_stats).await;
                match exit {
                    Err(error) if task_stats.snapshot().received == 0 && attempts < 20 && is_internal_error(&error) => {
                        eprintln!("consumer failed before receiving anything (attempt {attempts}); retrying: {error:#}");
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    exit => panic!("consumer stopped after {attempts} attempt(s): {exit:?}"),
                }
            }
        }));
        stats
    }

    /// POSTs `body` to `/webhooks` signed in our `webhook-signature` format with `secret` at `timestamp`.
    async fn post_signed(&self, secret: &Secret, timestamp: i64, body: &[u8]) -> (u16, Value) {
        let id = serde_json::from_slice::<Value>(body).ok().and_then(|v| v["id"].as_str().map(str::to_owned));
        let mut headers = vec![("webhook-signature", sign_webhook_signature([secret], timestamp, body))];
        if let Some(id) = id {
            headers.push(("webhook-id", id));
        }
        self.request("POST", "/webhooks", &headers, body).await
    }

    async fn deliver(&self, body: &[u8]) -> (u16, Value) {
        self.post_signed(&self.secret, now(), body).await
    }

    async fn request(&self, method: &str, path: &str, headers: &[(&str, String)], body: &[u8]) -> (u16, Value) {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", format!("127.0.0.1:{}", self.port))
            .header("content-type", "application/json");
        for (name, value) in headers {
            req = req.header(*name, value);
        }
        let res = sender.send_request(req.body(Full::new(Bytes::copy_from_slice(body))).unwrap()).await.unwrap();
        let status = res.status().as_u16();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// A direct connection (never through a proxy).
    async fn conn(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&format!("{}/{}", postgres_server(), self.db_name)).await.unwrap()
    }

    async fn seen_count(&self) -> i64 {
        seen_events::table.count().get_result(&mut self.conn().await).await.unwrap()
    }

    async fn effects_for(&self, event_id: &str) -> i64 {
        applied_effects::table.filter(applied_effects::event_id.eq(event_id)).count().get_result(&mut self.conn().await).await.unwrap()
    }

    async fn outcome(&self, event_id: &str) -> Option<String> {
        seen_events::table.find(event_id).select(seen_events::outcome).first(&mut self.conn().await).await.optional().unwrap()
    }

    async fn video(&self, video_id: &str) -> Option<(String, i64)> {
        videos::table.find(video_id).select((videos::status, videos::version)).first(&mut self.conn().await).await.optional().unwrap()
    }

    /// Ready messages in the queue (declaring it if needed).
    async fn queued(&self) -> u32 {
        let (conn, channel) = amqp().await;
        vid_webhook_receiver::queue::declare_queue(&channel, &self.config.queue).await.unwrap();
        let q = channel
            .queue_declare(&self.config.queue, QueueDeclareOptions { passive: true, ..Default::default() }, FieldTable::default())
            .await
            .unwrap();
        conn.close(0, "done").await.ok();
        q.message_count()
    }

    /// Messages in the dead-letter queue `<queue>.dead`.
    async fn dead_lettered(&self) -> u32 {
        let (conn, channel) = amqp().await;
        let q = channel
            .queue_declare(
                &format!("{}.dead", self.config.queue),
                QueueDeclareOptions { passive: true, ..Default::default() },
                FieldTable::default(),
            )
            .await
            .unwrap();
        conn.close(0, "done").await.ok();
        q.message_count()
    }

    async fn delete_queue(&self) {
        let (conn, channel) = amqp().await;
        channel.queue_delete(&self.config.queue, QueueDeleteOptions::default()).await.ok();
        channel.queue_delete(&format!("{}.dead", self.config.queue), QueueDeleteOptions::default()).await.ok();
        conn.close(0, "done").await.ok();
    }

    async fn cleanup(self) {
        for consumer in &self.consumers {
            consumer.abort();
        }
        self.server.stop(false).await;
        self.delete_queue().await;
        self.pool.close();
        let mut admin = AsyncPgConnection::establish(&format!("{}/postgres", postgres_server())).await.unwrap();
        diesel::sql_query(format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.db_name)).execute(&mut admin).await.ok();
    }
}

async fn amqp() -> (Connection, Channel) {
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default()).await.unwrap();
    let channel = conn.create_channel().await.unwrap();
    (conn, channel)
}

fn video_event(event_id: &str, type_: &str, video_id: &str, version: i64) -> Vec<u8> {
    json!({
        "id": event_id,
        "type": type_,
        "created": now(),
        "data": { "video_id": video_id, "operation_id": "op_test", "version": version },
    })
    .to_string()
    .into_bytes()
}

/// Polls `check` until it returns true, for at most 15 s.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_event_delivered_three_times_has_its_effect_once() {
    let mut r = Receiver::start().await;
    let event_id = format!("evt_{}", unique());
    let body = video_event(&event_id, "video.ready", "vid_1", 1);

    // Three deliveries before the consumer runs: all three are queued, so the
    // consumer (not the handler's check) must make the copies harmless.
    for _ in 0..3 {
        let (status, reply) = r.deliver(&body).await;
        assert_eq!((status, reply["status"].as_str()), (200, Some("queued")));
    }
    assert_eq!(r.queued().await, 3);
    assert_eq!(r.seen_count().await, 0, "the handler never records the id");

    let stats = r.start_consumer();
    eventually("three messages processed", || async { stats.snapshot().received == 3 && r.queued().await == 0 }).await;
    let s = stats.snapshot();
    assert_eq!((s.applied, s.duplicates, s.stale), (1, 2, 0));
    assert_eq!(r.effects_for(&event_id).await, 1);
    assert_eq!(r.seen_count().await, 1);
    assert_eq!(r.video("vid_1").await, Some(("ready".into(), 1)));

    // A fourth delivery after processing stops at the handler's cheap check.
    let (status, reply) = r.deliver(&body).await;
    assert_eq!((status, reply["status"].as_str()), (200, Some("already_processed")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(stats.snapshot().received, 3, "nothing more was queued");
    assert_eq!(r.effects_for(&event_id).await, 1);
    r.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_event_arriving_late_does_not_overwrite_a_newer_state() {
    let mut r = Receiver::start().await;
    let ready = format!("evt_{}", unique());
    let processing = format!("evt_{}", unique());
    // Queued in this order, so the consumer sees `ready` (v2) first.
    assert_eq!(r.deliver(&video_event(&ready, "video.ready", "vid_7", 2)).await.0, 200);
    assert_eq!(r.deliver(&video_event(&processing, "video.processing", "vid_7", 1)).await.0, 200);

    let stats = r.start_consumer();
    eventually("both processed", || async { stats.snapshot().received == 2 }).await;
    assert_eq!(r.video("vid_7").await, Some(("ready".into(), 2)));
    assert_eq!(r.outcome(&ready).await.as_deref(), Some("applied"));
    assert_eq!(r.outcome(&processing).await.as_deref(), Some("stale"));
    assert_eq!(r.effects_for(&processing).await, 0);

    // A newer event does move the state on.
    let failed = format!("evt_{}", unique());
    assert_eq!(r.deliver(&video_event(&failed, "video.failed", "vid_7", 3)).await.0, 200);
    eventually("failed applied", || async { r.video("vid_7").await == Some(("failed".into(), 3)) }).await;

    // Other event types are recorded with no effect.
    let other = format!("evt_{}", unique());
    let body = json!({"id": other, "type": "webhook_endpoint.disabled", "created": now(), "data": {"endpoint_id": "ep_1", "reason": "x"}});
    assert_eq!(r.deliver(body.to_string().as_bytes()).await.0, 200);
    eventually("other recorded", || async { r.outcome(&other).await.as_deref() == Some("ignored") }).await;

    // The demo view shows it all.
    let (status, view) = r.request("GET", "/events", &[], b"").await;
    assert_eq!(status, 200);
    assert_eq!(view["videos"][0]["status"], "failed");
    assert_eq!(view["events"].as_array().unwrap().len(), 4);
    assert_eq!(view["effects"].as_array().unwrap().len(), 2);
    assert_eq!(r.request("GET", "/healthz", &[], b"").await.0, 200);
    r.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_unavailable_answers_503_and_records_nothing() {
    // Nothing listens on port 1.
    let r = Receiver::start_with("amqp://guest:guest@127.0.0.1:1/%2f".into(), vec![]).await;
    let event_id = format!("evt_{}", unique());
    let (status, reply) = r.deliver(&video_event(&event_id, "video.ready", "vid_1", 1)).await;
    assert_eq!(status, 503, "{reply}");
    assert_eq!(reply["error"], "queue_unavailable");
    assert_eq!(r.seen_count().await, 0);
    r.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_that_vanishes_answers_503_then_recovers() {
    let r = Receiver::start().await;
    let first = format!("evt_{}", unique());
    assert_eq!(r.deliver(&video_event(&first, "video.ready", "vid_1", 1)).await.0, 200);

    // The queue is deleted under the open channel: the mandatory publish comes back unroutable.
    r.delete_queue().await;
    let second = format!("evt_{}", unique());
    let (status, reply) = r.deliver(&video_event(&second, "video.ready", "vid_2", 1)).await;
    assert_eq!(status, 503, "{reply}");
    assert_eq!(r.seen_count().await, 0);

    // The sender's retry goes through a fresh channel, which declares the queue again.
    let (status, reply) = r.deliver(&video_event(&second, "video.ready", "vid_2", 1)).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(r.queued().await, 1);
    r.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_between_commit_and_ack_applies_the_effect_once() {
    let mut r = Receiver::start().await;
    let event_id = format!("evt_{}", unique());
    assert_eq!(r.deliver(&video_event(&event_id, "video.ready", "vid_9", 4)).await.0, 200);

    let crashing = ConsumerOptions { crash_after_commit: true, ..r.consumer_options() };
    let crash_stats = ConsumerStats::default();
    let exit = tokio::time::timeout(Duration::from_secs(15), consume(&r.pool, &crashing, &crash_stats))
        .await
        .expect("the crashing consumer returns")
        .unwrap();
    assert_eq!(exit, ConsumerExit::SimulatedCrash { event_id: event_id.clone() });
    assert_eq!(r.effects_for(&event_id).await, 1, "the effect was committed");
    // Never acknowledged: RabbitMQ has the message again.
    eventually("message back in the queue", || async { r.queued().await == 1 }).await;

    let stats = r.start_consumer();
    eventually("redelivery processed", || async { stats.snapshot().received == 1 && r.queued().await == 0 }).await;
    let s = stats.snapshot();
    assert_eq!((s.redelivered, s.duplicates, s.applied), (1, 1, 0), "{s:?}");
    assert_eq!(r.effects_for(&event_id).await, 1);
    assert_eq!(r.outcome(&event_id).await.as_deref(), Some("applied"));
    assert_eq!(r.video("vid_9").await, Some(("ready".into(), 4)));
    r.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_signatures_and_stale_timestamps_are_400_and_nothing_is_queued() {
    let r = Receiver::start().await;
    let body = video_event(&format!("evt_{}", unique()), "video.ready", "vid_1", 1);
    let t = now();

    let mut altered = body.clone();
    altered[10] ^= 1;
    let mut with_newline = body.clone();
    with_newline.push(b'\n');
    let sig = sign_webhook_signature([&r.secret], t, &body);
    type Case<'a> = (&'a str, Vec<(&'a str, String)>, &'a [u8], &'a str);
    let cases: Vec<Case> = vec![
        (
            "wrong secret",
            vec![("webhook-signature", sign_webhook_signature([&Secret::generate()], t, &body))],
            &body,
            "no_matching_signature",
        ),
        ("one byte changed", vec![("webhook-signature", sig.clone())], &altered, "no_matching_signature"),
        ("trailing newline", vec![("webhook-signature", sig.clone())], &with_newline, "no_matching_signature"),
        ("stale", vec![("webhook-signature", sign_webhook_signature([&r.secret], t - 301, &body))], &body, "timestamp_too_old"),
        // Well past the 300 s tolerance: `t` was read before the earlier cases ran,
        // and t + 301 falls inside it once a second has passed (seen on a busy CI).
        ("future", vec![("webhook-signature", sign_webhook_signature([&r.secret], t + 360, &body))], &body, "timestamp_too_new"),
        (
            "milliseconds",
            vec![("webhook-signature", sign_webhook_signature([&r.secret], t * 1000, &body))],
            &body,
            "timestamp_in_milliseconds",
        ),
        ("no header", vec![], &body, "header_missing"),
    ];
    for (name, headers, sent, code) in cases {
        let (status, reply) = r.request("POST", "/webhooks", &headers, sent).await;
        assert_eq!((status, reply["error"].as_str()), (400, Some(code)), "{name}: {reply}");
    }
    // A verified body that is not an event.
    let not_event = br#"{"hello":"world"}"#;
    let (status, reply) = r.post_signed(&r.secret, t, not_event).await;
    assert_eq!((status, reply["error"].as_str()), (400, Some("invalid_event")));

    assert_eq!(r.queued().await, 0, "nothing was queued");
    assert_eq!(r.seen_count().await, 0);
    // The same request, correctly signed, is queued: the count above could have been 1.
    assert_eq!(r.request("POST", "/webhooks", &[("webhook-signature", sig)], &body).await.0, 200);
    assert_eq!(r.queued().await, 1);
    r.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standard_webhooks_delivery_signed_with_a_rotated_secret_verifies() {
    let new_secret = Secret::generate();
    let mut r = Receiver::start_with(amqp_url(), vec![new_secret.clone()]).await;
    let event_id = format!("evt_{}", unique());
    let body = video_event(&event_id, "video.cancelled", "vid_3", 5);
    let t = now();
    let headers = vec![
        ("webhook-id", event_id.clone()),
        ("webhook-timestamp", t.to_string()),
        ("webhook-signature", sign_standard([&new_secret], &event_id, t, &body)),
    ];
    let (status, reply) = r.request("POST", "/webhooks", &headers, &body).await;
    assert_eq!(status, 200, "{reply}");

    // The signed webhook-id is part of the signature: a different id fails.
    let mut forged = headers.clone();
    forged[0].1 = format!("evt_{}", unique());
    let (status, reply) = r.request("POST", "/webhooks", &forged, &body).await;
    assert_eq!((status, reply["error"].as_str()), (400, Some("no_matching_signature")));

    let stats = r.start_consumer();
    eventually("applied", || async { stats.snapshot().applied == 1 }).await;
    assert_eq!(r.video("vid_3").await, Some(("cancelled".into(), 5)));
    assert_eq!(r.effects_for(&event_id).await, 1);
    r.cleanup().await;
}

/// What a [`DbProxy`] does with connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProxyMode {
    /// Forward to the real PostgreSQL.
    Forward,
    /// Stop forwarding: connections stay open and silent, new ones are
    /// accepted and never answered (a hung server).
    Hang,
    /// Close every connection, and each new one at once (a server that is down).
    Refuse,
}

/// A TCP proxy in front of the local PostgreSQL whose behaviour a test switches.
struct DbProxy {
    port: u16,
    mode: tokio::sync::watch::Sender<ProxyMode>,
}

impl DbProxy {
    async fn start() -> Self {
        let target = postgres_server().rsplit_once('@').map_or("127.0.0.1:5432".to_owned(), |(_, hostport)| hostport.to_owned());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (mode, watch) = tokio::sync::watch::channel(ProxyMode::Forward);
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else { return };
                let mut watch = watch.clone();
                let target = target.clone();
                tokio::spawn(async move {
                    let start_mode = *watch.borrow_and_update();
                    match start_mode {
                        ProxyMode::Refuse => return,
                        ProxyMode::Hang => {
                            let _ = watch.wait_for(|m| *m == ProxyMode::Refuse).await;
                            return;
                        }
                        ProxyMode::Forward => {}
                    }
                    let Ok(mut server) = tokio::net::TcpStream::connect(&target).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
                        _ = watch.wait_for(|m| *m != ProxyMode::Forward) => {}
                    }
                    // Hang: hold both sockets silently until told to refuse.
                    let _ = watch.wait_for(|m| *m == ProxyMode::Refuse).await;
                });
            }
        });
        DbProxy { port, mode }
    }

    fn set(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    /// `postgres://user@127.0.0.1:<proxy port>`.
    fn server(&self) -> String {
        let server = postgres_server();
        let (scheme_user, _) = server.rsplit_once('@').unwrap();
        format!("{scheme_user}@127.0.0.1:{}", self.port)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_database_does_not_hold_post_webhooks() {
    let proxy = DbProxy::start().await;
    let r = Receiver::start_via(proxy.server()).await;
    // Warm the pool: an idle connection exists when the database hangs.
    let first = format!("evt_{}", unique());
    assert_eq!(r.deliver(&video_event(&first, "video.ready", "vid_1", 1)).await.0, 200);

    proxy.set(ProxyMode::Hang);
    for round in 0..3 {
        let event_id = format!("evt_{}", unique());
        let started = std::time::Instant::now();
        let (status, reply) = tokio::time::timeout(Duration::from_secs(12), r.deliver(&video_event(&event_id, "video.ready", "vid_1", 2)))
            .await
            .expect("POST /webhooks answers within the sender's timeout");
        let took = started.elapsed();
        assert_eq!((status, reply["status"].as_str()), (200, Some("queued")), "round {round}: {reply}");
        assert!(took < vid_webhook_receiver::SEEN_CHECK_BUDGET + Duration::from_secs(5), "round {round} took {took:?}");
    }
    assert_eq!(r.queued().await, 4);

    // Other routes: GET /webhooks is 405 with `Allow: POST`.
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", r.port)).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::builder().uri("/webhooks").header("host", "x").body(Full::new(Bytes::new())).unwrap();
    let res = sender.send_request(req).await.unwrap();
    assert_eq!(res.status().as_u16(), 405);
    assert_eq!(res.headers().get("allow").map(|v| v.to_str().unwrap()), Some("POST"));

    proxy.set(ProxyMode::Refuse);
    r.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_a_silent_database_fails_within_the_connect_timeout() {
    // Accepts TCP connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut sockets = vec![];
        while let Ok((socket, _)) = silent.accept().await {
            sockets.push(socket);
        }
    });
    let started = std::time::Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(15),
        vid_webhook_receiver::db::ensure_database(&format!("postgres://postgres@127.0.0.1:{port}/receiver")),
    )
    .await
    .expect("ensure_database gives up by itself");
    assert!(result.is_err());
    assert!(started.elapsed() < vid_webhook_receiver::db::CONNECT_TIMEOUT + Duration::from_secs(2), "{:?}", started.elapsed());
    held.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unstorable_event_is_dead_lettered_and_does_not_stall_the_others() {
    let mut r = Receiver::start().await;
    let poison = format!("evt_{}\u{0}x", unique());
    let good = format!("evt_{}", unique());
    // Signed without a `webhook-id` header (a header cannot carry NUL).
    let body = video_event(&poison, "video.ready", "vid_p", 1);
    let headers = [("webhook-signature", sign_webhook_signature([&r.secret], now(), &body))];
    let (status, reply) = r.request("POST", "/webhooks", &headers, &body).await;
    assert_eq!((status, reply["status"].as_str()), (200, Some("queued")), "{reply}");
    assert_eq!(r.deliver(&video_event(&good, "video.ready", "vid_g", 1)).await.0, 200);

    let stats = r.start_consumer();
    eventually("good event applied", || async { r.outcome(&good).await.as_deref() == Some("applied") }).await;
    eventually("poison dead-lettered", || async { r.dead_lettered().await == 1 }).await;
    let s = stats.snapshot();
    assert_eq!((s.received, s.dead_lettered, s.applied, s.redelivered), (2, 1, 1, 0), "{s:?}");
    assert_eq!(r.queued().await, 0);
    assert_eq!(r.seen_count().await, 1);
    r.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_is_waited_out_without_spending_deliveries() {
    let proxy = DbProxy::start().await;
    let mut r = Receiver::start_via(proxy.server()).await;
    let stats = r.start_consumer();

    proxy.set(ProxyMode::Refuse);
    let event_id = format!("evt_{}", unique());
    let (status, reply) = r.deliver(&video_event(&event_id, "video.ready", "vid_o", 1)).await;
    assert_eq!((status, reply["status"].as_str()), (200, Some("queued")), "{reply}");

    // The consumer holds the message and retries in-process.
    eventually("several retries", || async { stats.snapshot().retried >= 3 }).await;
    let s = stats.snapshot();
    assert_eq!((s.received, s.redelivered), (1, 0), "never handed back to the broker: {s:?}");

    proxy.set(ProxyMode::Forward);
    eventually("applied after the outage", || async { r.outcome(&event_id).await.as_deref() == Some("applied") }).await;
    let s = stats.snapshot();
    assert_eq!((s.received, s.redelivered, s.applied, s.dead_lettered), (1, 0, 1, 0), "{s:?}");
    eventually("acknowledged", || async { r.queued().await == 0 }).await;
    assert_eq!(r.dead_lettered().await, 0);
    assert_eq!(r.video("vid_o").await, Some(("ready".into(), 1)));
    r.cleanup().await;
}

/// Whether `error` carries RabbitMQ's reply code 541 `INTERNAL_ERROR`
/// (AMQP 0-9-1 hard error; lapin names it `INTERNAL-ERROR`), found by type in
/// the error's chain rather than by its text.
fn is_internal_error(error: &anyhow::Error) -> bool {
    error
        .chain()
        .any(|cause| matches!(cause.downcast_ref::<lapin::Error>(), Some(lapin::Error::ProtocolError(amqp)) if amqp.get_id() == 541))
}

#[test]
fn the_consumer_retry_recognises_541_by_code_under_context() {
    use lapin::protocol::AMQPError;
    let from = |id: u16, text: &str| AMQPError::from_id(id, text.into()).expect("a known AMQP reply code");
    let internal = anyhow::Error::new(lapin::Error::ProtocolError(from(541, "INTERNAL_ERROR - timed out consuming")))
        .context("subscribing to webhook-receiver.events");
    assert!(is_internal_error(&internal), "{internal:#}");
    // Another code whose text mentions INTERNAL_ERROR is not retried; nor is a plain message.
    let not_found = anyhow::Error::new(lapin::Error::ProtocolError(from(404, "NOT_FOUND - INTERNAL_ERROR"))).context("subscribing");
    assert!(!is_internal_error(&not_found), "{not_found:#}");
    assert!(!is_internal_error(&anyhow::anyhow!("INTERNAL_ERROR")));
}
