//! Test harness: a fresh database and queue prefix per test, scripted HTTP
//! receivers on 127.0.0.1, an in-process dispatcher, and DB helpers.
#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use vid_core::event::{Event, EventData, EventType, VideoEventData};
use vid_core::messages::EventPublished;
use vid_core::{EndpointId, EventId, OperationId, TenantId, VideoId};
use vid_db::schema::{events, tenants, webhook_attempts as at, webhook_deliveries as dl, webhook_endpoints as ep};
use vid_db::seal::SealingKey;
use vid_db::RunQueryDsl;
use vid_infra::amqp::{Publisher, Topology, RK_EVENT};
use vid_infra::ExposeSecret;
use vid_netguard::Resolve;
use vid_webhook_dispatcher::{ConnectObserver, Dispatcher, Settings};
use vid_webhooks::Secret;

/// One test's isolated world.
pub struct World {
    pub db_url: String,
    pub prefix: String,
    pub settings: Settings,
    pub tenant: TenantId,
    publisher: Publisher,
    _amqp: lapin::Connection,
}

impl World {
    /// Fresh database, unique prefix, topology declared, one tenant.
    /// `overrides` are extra dotted settings (e.g. `("dispatcher.request_timeout_ms", "1000")`).
    pub async fn new(overrides: &[(&str, &str)]) -> World {
        let db_url = vid_testkit::fresh_database().await;
        let prefix = vid_testkit::unique_prefix();
        let mut all: Vec<(&str, &str)> = vec![
            ("database.url", &db_url),
            ("amqp.prefix", &prefix),
            ("dispatcher.health_listen", "127.0.0.1:0"),
            ("database.pool_size", "8"),
        ];
        all.extend_from_slice(overrides);
        let settings: Settings = vid_testkit::settings(&all);
        let amqp = vid_infra::amqp::connect(&settings.amqp, Duration::from_secs(10)).await.expect("RabbitMQ");
        let publisher = Publisher::new(&amqp).await.unwrap();
        Topology::new(&prefix).declare(publisher.channel()).await.unwrap();
        let tenant = TenantId::generate();
        let mut conn = AsyncPgConnection::establish(&db_url).await.unwrap();
        diesel::insert_into(tenants::table).values((tenants::id.eq(&tenant), tenants::name.eq("test"))).execute(&mut conn).await.unwrap();
        World { db_url, prefix, settings, tenant, publisher, _amqp: amqp }
    }

    pub async fn conn(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.db_url).await.unwrap()
    }

    pub fn sealing_key(&self) -> SealingKey {
        SealingKey::from_hex(self.settings.webhooks.secret_key.expose_secret()).unwrap()
    }

    /// Inserts an enabled endpoint (as the api would) and returns its id and secret.
    pub async fn endpoint(&self, url: &str) -> (EndpointId, Secret) {
        self.endpoint_with(url, "webhook-signature", None).await
    }

    pub async fn endpoint_with(&self, url: &str, format: &str, event_types: Option<Vec<String>>) -> (EndpointId, Secret) {
        let id = EndpointId::generate();
        let secret = Secret::generate();
        let sealed = self.sealing_key().seal(id.as_str(), secret.as_str().as_bytes()).unwrap();
        let mut conn = self.conn().await;
        diesel::insert_into(ep::table)
            .values((
                ep::id.eq(&id),
                ep::tenant_id.eq(&self.tenant),
                ep::url.eq(url),
                ep::event_types.eq(event_types),
                ep::signature_format.eq(format),
                ep::status.eq("enabled"),
                ep::secret_sealed.eq(sealed),
            ))
            .execute(&mut conn)
            .await
            .unwrap();
        (id, secret)
    }

    /// Records a `video.ready` event in `events` and publishes it, as the
    /// api and its outbox relay would; returns it and its payload.
    pub async fn publish(&self) -> (EventId, String) {
        let (id, payload) = self.record_event().await;
        self.publish_recorded(&payload).await;
        (id, payload)
    }

    /// Records a `video.ready` event in `events` only (as the api does in
    /// the transaction of the change); returns its id and payload.
    pub async fn record_event(&self) -> (EventId, String) {
        let event = Event {
            id: EventId::generate(),
            type_: EventType::VideoReady,
            created: Utc::now().timestamp(),
            data: EventData::Video(VideoEventData { video_id: VideoId::generate(), operation_id: OperationId::generate(), version: 2 }),
        };
        let payload = serde_json::to_string(&event).unwrap();
        let mut conn = self.conn().await;
        diesel::insert_into(events::table)
            .values((
                events::id.eq(&event.id),
                events::tenant_id.eq(&self.tenant),
                events::event_type.eq(event.type_.as_str()),
                events::resource_id.eq(event.id.as_str()),
                events::payload.eq(&payload),
            ))
            .execute(&mut conn)
            .await
            .unwrap();
        (event.id, payload)
    }

    /// Publishes a recorded event's message (the outbox relay's part).
    pub async fn publish_recorded(&self, payload: &str) {
        let event: Event = serde_json::from_str(payload).unwrap();
        let msg = EventPublished { tenant_id: self.tenant.clone(), event: event.clone(), payload: payload.to_owned() };
        self.publisher.publish_json(&Topology::new(&self.prefix).events_exchange(), RK_EVENT, &msg, Some(event.id.as_str())).await.unwrap();
    }

    /// Fans the event `payload` (as [`World::publish`] returned it) in
    /// directly, as the dispatcher's fan-in does with a consumed message
    /// ([`vid_webhook_dispatcher::fanin::fan_in`]); returns how many
    /// deliveries were new.
    pub async fn fan_in(&self, payload: &str) -> usize {
        let pool = vid_db::pool(&self.settings.database).unwrap();
        let msg =
            EventPublished { tenant_id: self.tenant.clone(), event: serde_json::from_str(payload).unwrap(), payload: payload.to_owned() };
        vid_webhook_dispatcher::fanin::fan_in(&pool, &msg).await.unwrap()
    }

    /// Starts an in-process dispatcher with the world's settings.
    pub fn start(&self, resolver: Arc<dyn Resolve>) -> Running {
        self.start_with(self.settings.clone(), resolver, None)
    }

    pub fn start_with(&self, settings: Settings, resolver: Arc<dyn Resolve>, observer: Option<ConnectObserver>) -> Running {
        let mut d = Dispatcher::build(settings, resolver).unwrap();
        if let Some(o) = observer {
            d = d.with_connect_observer(o);
        }
        let health = d.health_addr();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(d.run(async move {
            let _ = rx.await;
        }));
        Running { stop: Some(tx), task, health }
    }

    /// The endpoint's attempts once there are at least `n` (polled until `limit`).
    pub async fn wait_attempts(&self, endpoint: &EndpointId, n: usize, limit: Duration) -> Vec<AttemptRow> {
        eventually(limit, &format!("{n} attempt(s) recorded"), || async {
            let a = self.attempts(endpoint).await;
            (a.len() >= n).then_some(a)
        })
        .await
    }

    pub async fn attempts(&self, endpoint: &EndpointId) -> Vec<AttemptRow> {
        let mut conn = self.conn().await;
        at::table
            .filter(at::endpoint_id.eq(endpoint))
            .order((at::started_at.asc(), at::attempt_number.asc()))
            .select(AttemptRow::as_select())
            .load(&mut conn)
            .await
            .unwrap()
    }

    pub async fn deliveries(&self, endpoint: &EndpointId) -> Vec<DeliveryRow> {
        let mut conn = self.conn().await;
        dl::table.filter(dl::endpoint_id.eq(endpoint)).order(dl::id.asc()).select(DeliveryRow::as_select()).load(&mut conn).await.unwrap()
    }

    pub async fn endpoint_state(&self, endpoint: &EndpointId) -> (String, Option<String>, Option<DateTime<Utc>>) {
        let mut conn = self.conn().await;
        ep::table.filter(ep::id.eq(endpoint)).select((ep::status, ep::disabled_reason, ep::disabled_at)).first(&mut conn).await.unwrap()
    }

    /// Waits (up to `limit`) until a claim of this world's database, a
    /// statement calling `webhook_deliveries_claim`, waits on another
    /// transaction's row lock (`pg_stat_activity`: wait event `Lock` /
    /// `transactionid`): the event a test holding that lock waits for
    /// before it commits, instead of a fixed sleep.
    pub async fn until_a_claim_waits_on_a_row_lock(&self, limit: Duration) {
        #[derive(QueryableByName)]
        struct Waiting {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        eventually(limit, "a claim waiting on a row lock", || async {
            let mut watcher = self.conn().await;
            let n = diesel::sql_query(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' \
                 AND wait_event = 'transactionid' AND query LIKE '%webhook_deliveries_claim(%'",
            )
            .get_result::<Waiting>(&mut watcher)
            .await
            .unwrap()
            .n;
            (n >= 1).then_some(())
        })
        .await;
    }
}

#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = at)]
pub struct AttemptRow {
    pub delivery_id: String,
    pub attempt_number: i32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub response_status: Option<i32>,
    pub error_class: Option<String>,
    pub error_detail: Option<String>,
    pub response_body: Option<String>,
    pub next_attempt_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = dl)]
pub struct DeliveryRow {
    pub id: String,
    pub event_id: String,
    pub event_type: String,
    pub status: String,
    pub attempt_count: i32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub locked_until: Option<DateTime<Utc>>,
}

impl DeliveryRow {
    /// At rest: not `pending` and not leased. The dispatcher never attempts
    /// such a delivery (a claim takes only unleased `pending` rows) and none
    /// of its attempts is in flight (an attempt holds the lease until its
    /// outcome is recorded, and the receiver logs a request before
    /// answering it). So once every delivery of an endpoint is at rest,
    /// what its receiver logged is final until something re-arms one
    /// (`:retry`, `:enable`): the observable a test waits on instead of a
    /// fixed sleep to show that nothing more is sent.
    pub fn at_rest(&self) -> bool {
        self.status != "pending" && self.locked_until.is_none()
    }
}

/// A dispatcher running in this process.
pub struct Running {
    stop: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<anyhow::Result<()>>,
    pub health: SocketAddr,
}

impl Running {
    /// Graceful stop (what SIGTERM does in the binary).
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(30), &mut self.task).await.expect("stops in time").unwrap().unwrap();
    }
}

impl Running {
    /// The value of the sample `name{labels…}` on this dispatcher's
    /// `GET /metrics` (see [`sample`]).
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let (_, _, text) = http_request(self.health, "GET", "/metrics").await;
        sample(&text, name, labels)
    }
}

/// The value of the sample `name{labels…}` whose labels include every one of
/// `labels` (`key="value"` pairs, any order) in a Prometheus text exposition;
/// `None` if absent.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
        if metric != name {
            return None;
        }
        labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))).then(|| value.parse().ok())?
    })
}

/// A request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Received {
    pub at: Instant,
    /// Requests in flight at the receiver right after this one arrived,
    /// itself included (arrived and not yet answered).
    pub in_flight: usize,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    pub fn id(&self) -> String {
        self.header("webhook-id").unwrap_or_default().to_owned()
    }
}

/// What the receiver answers.
#[derive(Debug, Clone)]
pub enum Reply {
    Status(u16, Vec<(&'static str, String)>),
    /// Never answer (the connection stays open until the client gives up).
    Hang,
    /// Answer `status` after a delay.
    Slow(Duration, u16),
}

/// Decides the reply from the request and how many earlier requests had the same `webhook-id`.
pub type Script = Arc<dyn Fn(&Received, usize) -> Reply + Send + Sync>;

/// An HTTP receiver on 127.0.0.1 that records every request.
pub struct Receiver {
    pub addr: SocketAddr,
    pub log: Arc<Mutex<Vec<Received>>>,
    pub connections: Arc<AtomicUsize>,
    /// When each request was answered (or given up by the client), in order.
    pub answered: Arc<Mutex<Vec<Instant>>>,
    task: JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Counts a request as in flight from its arrival (see [`Received::in_flight`])
/// until it is answered or the connection goes away; logs when that happens.
struct InFlight {
    count: Arc<AtomicUsize>,
    answered: Arc<Mutex<Vec<Instant>>>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Under the same lock as the arrivals, so the log and the counts agree.
        let mut answered = self.answered.lock().unwrap();
        self.count.fetch_sub(1, Ordering::SeqCst);
        answered.push(Instant::now());
    }
}

impl Receiver {
    pub async fn start(script: Script) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log: Arc<Mutex<Vec<Received>>> = Arc::default();
        let connections = Arc::new(AtomicUsize::new(0));
        let answered: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let (log2, conns2, answered2) = (log.clone(), connections.clone(), answered.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                conns2.fetch_add(1, Ordering::SeqCst);
                let (log, script, answered, in_flight) = (log2.clone(), script.clone(), answered2.clone(), in_flight.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let (log, script, answered, in_flight) = (log.clone(), script.clone(), answered.clone(), in_flight.clone());
                        async move {
                            let headers = req
                                .headers()
                                .iter()
                                .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
                                .collect();
                            let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                            let (reply, _in_flight) = {
                                let mut log = log.lock().unwrap();
                                // Arrival: counted and timestamped under the answers' lock (see InFlight).
                                let received = {
                                    let _answers = answered.lock().unwrap();
                                    let n = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                                    Received { at: Instant::now(), in_flight: n, headers, body }
                                };
                                let guard = InFlight { count: in_flight, answered };
                                let prior = log.iter().filter(|r| r.id() == received.id()).count();
                                let reply = script(&received, prior);
                                log.push(received);
                                (reply, guard)
                            };
                            match reply {
                                Reply::Hang => futures::future::pending::<Result<hyper::Response<Full<Bytes>>, Infallible>>().await,
                                Reply::Slow(delay, status) => {
                                    tokio::time::sleep(delay).await;
                                    Ok(hyper::Response::builder().status(status).body(Full::new(Bytes::from("slow"))).unwrap())
                                }
                                Reply::Status(status, headers) => {
                                    let mut b = hyper::Response::builder().status(status);
                                    for (k, v) in headers {
                                        b = b.header(k, v);
                                    }
                                    Ok::<_, Infallible>(b.body(Full::new(Bytes::from(format!("answer {status}")))).unwrap())
                                }
                            }
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Receiver { addr, log, connections, answered, task }
    }

    /// Always answers `status`.
    pub async fn always(status: u16) -> Receiver {
        Receiver::start(Arc::new(move |_, _| Reply::Status(status, vec![]))).await
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub fn received(&self) -> Vec<Received> {
        self.log.lock().unwrap().clone()
    }

    /// Requests per `webhook-id`.
    pub fn counts(&self) -> HashMap<String, usize> {
        let mut m = HashMap::new();
        for r in self.received() {
            *m.entry(r.id()).or_default() += 1;
        }
        m
    }
}

/// Polls `check` every 25 ms until it returns `Some`, or panics after `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Verifies a received request's signature with exactly these secrets.
pub fn verify(r: &Received, secrets: &[&Secret]) -> Result<vid_webhooks::Verified, vid_webhooks::VerifyError> {
    vid_webhooks::verify(secrets.iter().copied(), &r.headers, &r.body, Utc::now().timestamp())
}

/// A resolver that resolves nothing (tests use IP-literal URLs).
pub fn no_dns() -> Arc<dyn Resolve> {
    Arc::new(vid_netguard::StaticResolver::new())
}

/// `GET path` on a local address; returns the status code.
pub async fn http_get_status(addr: SocketAddr, path: &str) -> u16 {
    http_request(addr, "GET", path).await.0
}

/// `method path` over a fresh connection; returns the status, the header
/// lines (names lower-cased) and the body.
pub async fn http_request(addr: SocketAddr, method: &str, path: &str) -> (u16, Vec<(String, String)>, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let headers =
        head.lines().skip(1).filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned())).collect();
    (status, headers, body.to_owned())
}

/// A running api (the real `vid_api::Application`) with a tenant and its key.
pub struct Api {
    pub addr: SocketAddr,
    pub key: String,
    _task: JoinHandle<()>,
}

impl Api {
    /// Starts the api on the world's database and prefix and makes the world's
    /// tenant the api tenant (so events published by the world reach its endpoints).
    pub async fn start(w: &mut World) -> Api {
        let settings: vid_api::Settings = vid_testkit::settings(&[
            ("database.url", &w.db_url),
            ("amqp.prefix", &w.prefix),
            ("api.listen", "127.0.0.1:0"),
            ("database.pool_size", "4"),
        ]);
        let app = vid_api::Application::build(settings).unwrap();
        let (tenant, key) = vid_api::auth::create_tenant(&app.state().db, "api-tenant").await.unwrap();
        w.tenant = tenant;
        let addr: SocketAddr = format!("127.0.0.1:{}", app.port()).parse().unwrap();
        let task = tokio::spawn(async move {
            let _ = app.run().await;
        });
        Api { addr, key, _task: task }
    }

    /// Sends a request; returns the status and the JSON body (`Null` when empty).
    pub async fn call(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> (u16, serde_json::Value) {
        self.call_as(&self.key, method, path, body).await
    }

    pub async fn call_as(&self, key: &str, method: &str, path: &str, body: Option<serde_json::Value>) -> (u16, serde_json::Value) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut s = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        let text = String::from_utf8_lossy(&buf);
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        let json = if body.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(body).unwrap_or(serde_json::Value::String(body.to_owned()))
        };
        (status, json)
    }
}
