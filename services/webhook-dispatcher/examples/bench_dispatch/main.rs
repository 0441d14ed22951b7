//! Webhook dispatcher throughput and latency (issue 5, "Performance"); run by
//! `scripts/bench-dispatch.sh`, which also measures wrk against the same receiver.
//!
//! 1. Starts a fast HTTP receiver on 127.0.0.1 (answers `200` at once,
//!    stamps the arrival of each `Webhook-Id`), prints
//!    `RECEIVER_URL <url>` and waits for one line on stdin: wrk's requests
//!    per second against that URL (empty or unparseable: no ratio).
//! 2. A fresh database and amqp prefix, one tenant, `ENDPOINTS` endpoints
//!    (default 1) at the receiver, an in-process dispatcher.
//! 3. Ceilings of the other two parts every delivery goes through, measured
//!    in this same run so the ratio can be read against them:
//!    - broker: the same `EventPublished` messages through the same route
//!      (events exchange → durable quorum queue, publisher confirms, same
//!      `PUBLISH_CONCURRENCY`) to a consumer that acks them in batches
//!      (`PREFETCH`), under a second amqp prefix; messages/s;
//!    - database: the dispatcher's own statements for a delivery, without
//!      HTTP or RabbitMQ, in a second fresh database: the events' rows
//!      (as the api records them; the fan-in reads them), fan-in batch
//!      ([`fanin::fan_in_batch`]), claim with endpoints ([`store::claim_for_send`]), record
//!      ([`store::record_successes`]), `BATCH_SIZE` deliveries a round,
//!      two workers at once (two cores); deliveries/s;
//!    - write floor: the two writes every delivery needs at least, in a
//!      third fresh database: `BATCH_SIZE` deliveries inserted already
//!      leased (one multi-row insert) and recorded as successes
//!      ([`store::record_successes`]), two workers; no claim, no advisory
//!      locks, no reads beyond the writes' own key lookups. The gap between it and the database ceiling is what the
//!      leasing's reads, locks and planning cost.
//! 4. Burst: publishes `EVENTS` (default 4000) `EventPublished` messages as
//!    fast as the broker confirms them (`PUBLISH_CONCURRENCY` in flight,
//!    default 256, each publish awaiting its own confirm) and waits until every
//!    delivery has been received. Throughput = deliveries / (last receipt −
//!    first publish).
//! 5. Paced: publishes at half the burst throughput (each publish scheduled
//!    on its own, so confirms do not slow the pace) for about 8 s.
//!
//! For the burst and the paced phase it also prints how the deliveries were
//! leased (the dispatcher's `webhook_deliveries_leased_total{by}` and
//! `webhook_claims_total{result}`), and it writes `phase burst start`,
//! `phase burst end`, `phase paced start` and `phase paced end` lines with a
//! Unix time in ms to stderr (each start after that phase's events are
//! recorded in `events`, just before the first publish), so a profiler can
//! be cut to a phase.
//!
//! CPU (`cpu.rs`, from `/proc`; its docs give the figures' limits): for
//! the burst and the paced phase, the CPU time a delivery cost PostgreSQL,
//! RabbitMQ, this process and the rest of the machine, with its idle and
//! steal; for wrk, the whole machine's busy time per request (wrk and the
//! receiver); for the broker ceiling, RabbitMQ's and this process's per
//! message; for the write floor, PostgreSQL's and this process's per
//! delivery; for the database ceiling, PostgreSQL's per delivery; and the
//! sum of the first three, the CPU a delivery would cost with every part at
//! its floor, as deliveries/s the machine's cores could carry at most.
//!
//! Latency = first receipt of a delivery − the instant just before its
//! `publish` (which includes the broker confirm), same process, same clock.
//! Figures only: nothing is asserted.
//!
//! Environment: `EVENTS`, `ENDPOINTS`, `PER_ENDPOINT_CONCURRENCY` (default 64),
//! `BATCH_SIZE` (64), `MAX_IN_FLIGHT` (256), `PREFETCH` (256), `POOL_SIZE` (16),
//! `PUBLISH_CONCURRENCY` (256); `PLAN_CACHE_MODE` (unset: PostgreSQL's
//! default `auto`; e.g. `force_custom_plan`, set on the bench's database for
//! every connection); `LEASE_AT_FANIN` (1; 0 sets `dispatcher.lease_at_fanin`
//! false: every delivery waits for a claim); `LEASE_AHEAD` (4096;
//! `dispatcher.lease_ahead`, 0: the fan-in leases within the bound only). The fan-out case (one event to 100 endpoints of one
//! tenant) is `ENDPOINTS=100 EVENTS=400` (40,000 deliveries a burst);
//! the local stack must be up (`.local/stack.env`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use vid_core::messages::EventPublished;
use vid_core::{EndpointId, TenantId};
use vid_db::schema::{tenants, webhook_attempts as at, webhook_deliveries as dl, webhook_endpoints as ep};
use vid_db::seal::SealingKey;
use vid_infra::amqp::{Publisher, Topology, RK_EVENT};
use vid_infra::ExposeSecret;
use vid_webhook_dispatcher::{Dispatcher, Settings};
use vid_webhooks::Secret;

mod ceilings;
mod config;
mod cpu;
mod events;
mod report;

use ceilings::{broker_ceiling, database_ceiling, write_floor};
use config::Config;
use cpu::Snapshot;
use events::{bench_event, record_events};
use report::{report, Burst, Ceilings, LeaseCounts, Paced, Wrk};

/// `(webhook-id, arrival)` of every request, in arrival order.
type Log = Arc<Mutex<Vec<(String, Instant)>>>;

/// The receiver: HTTP/1.1 keep-alive, reads the whole body, records the
/// `webhook-id` header (wrk's requests carry one too, so both measurements do
/// the same work), answers `200 ok`.
async fn start_receiver(log: Log) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            let log = log.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let log = log.clone();
                    async move {
                        let id = req.headers().get("webhook-id").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                        let _body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        let now = Instant::now();
                        log.lock().unwrap().push((id.unwrap_or_default(), now));
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"ok"))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    addr
}

/// Milliseconds since the Unix epoch (the phase lines' clock).
fn unix_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

struct Bench {
    tenant: TenantId,
    db: vid_db::Pool,
    prefix: String,
    publisher: Publisher,
    log: Log,
    expected_per_event: usize,
}

impl Bench {
    /// `n` new events, recorded in `events` as the api would (before any
    /// clock starts: recording is the api's cost, not the dispatcher's).
    async fn record(&self, n: usize) -> Vec<EventPublished> {
        let messages: Vec<EventPublished> = (0..n).map(|_| bench_event(&self.tenant)).collect();
        let mut conn = self.db.get().await.unwrap();
        record_events(&mut conn, &messages).await;
        messages
    }

    async fn publish_one(&self, msg: EventPublished) -> (String, Instant) {
        let id = msg.event.id.as_str().to_owned();
        let t0 = Instant::now();
        self.publisher.publish_json(&Topology::new(&self.prefix).events_exchange(), RK_EVENT, &msg, Some(&id)).await.expect("publish");
        (id, t0)
    }

    /// Waits until every event of `published` reached the receiver
    /// `expected_per_event` times (distinct endpoints), or `limit` passes.
    /// Returns the latency of every delivery (first receipt per event and
    /// endpoint slot) and the last receipt.
    ///
    /// Reads the log incrementally: each look (every 20 ms) takes only the
    /// receipts that arrived since the previous one, so the receiver's lock
    /// is held for those few entries. (Until 2026-12-05 every look re-read
    /// and re-hashed the whole log under the lock: O(receipts²) over a
    /// burst, about a tenth of the machine's CPU during it, and every
    /// receipt meanwhile waited for the lock; BENCHMARKS.md.)
    async fn collect(&self, published: &HashMap<String, Instant>, limit: Duration) -> (Vec<Duration>, Option<Instant>, usize) {
        let want = published.len() * self.expected_per_event;
        let deadline = Instant::now() + limit;
        let mut seen: HashMap<String, usize> = HashMap::with_capacity(published.len());
        let mut lat = Vec::with_capacity(want);
        let mut last: Option<Instant> = None;
        let mut dups = 0;
        let mut cursor = 0;
        loop {
            {
                let log = self.log.lock().unwrap();
                for (id, at) in &log[cursor.min(log.len())..] {
                    let Some(t0) = published.get(id) else { continue };
                    let n = seen.entry(id.clone()).or_default();
                    *n += 1;
                    if *n > self.expected_per_event {
                        dups += 1;
                        continue;
                    }
                    lat.push(at.saturating_duration_since(*t0));
                    last = Some(last.map_or(*at, |l: Instant| l.max(*at)));
                }
                cursor = log.len();
            }
            if lat.len() >= want || Instant::now() >= deadline {
                if lat.len() < want {
                    eprintln!("WARNING: only {} of {want} deliveries received within {limit:?}", lat.len());
                }
                return (lat, last, dups);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `ALTER DATABASE … SET plan_cache_mode` on the database of `db_url`: every
/// later connection (the dispatcher's pool) plans with `mode`.
async fn set_plan_cache_mode(db_url: &str, mode: &str) {
    let name = db_url.rsplit('/').next().unwrap_or_default().split('?').next().unwrap_or_default().to_owned();
    assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "database name {name:?}");
    assert!(mode.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "PLAN_CACHE_MODE {mode:?}");
    let mut conn = AsyncPgConnection::establish(db_url).await.unwrap();
    diesel::sql_query(format!("ALTER DATABASE \"{name}\" SET plan_cache_mode = '{mode}'")).execute(&mut conn).await.unwrap();
}

/// Step 1: starts the receiver, prints `RECEIVER_URL <url>` and waits for
/// wrk's requests/s on stdin (run by the script). Returns the receiver's URL
/// and wrk's figures; the log is cleared of wrk's requests.
async fn receiver_and_wrk(log: &Log) -> (String, Wrk) {
    let addr = start_receiver(log.clone()).await;
    let url = format!("http://{addr}/hook");
    let cpu = Snapshot::take();
    println!("RECEIVER_URL {url}");
    std::io::stdout().flush().unwrap();
    let wrk_rps: Option<f64> = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).ok()?;
        line.trim().parse().ok()
    })
    .await
    .unwrap();
    let cpu = cpu.until(&Snapshot::take());
    let requests = std::mem::take(&mut *log.lock().unwrap()).len();
    (url, Wrk { rps: wrk_rps, requests, cpu })
}

/// One tenant and `endpoints` enabled endpoints at `url` (secrets sealed with
/// the configured key). Returns the tenant and the connection, kept for the
/// counts at the end.
async fn seed_endpoints(settings: &Settings, db_url: &str, url: &str, endpoints: usize) -> (TenantId, AsyncPgConnection) {
    let tenant = TenantId::generate();
    let mut conn = AsyncPgConnection::establish(db_url).await.unwrap();
    diesel::insert_into(tenants::table).values((tenants::id.eq(&tenant), tenants::name.eq("bench"))).execute(&mut conn).await.unwrap();
    let key = SealingKey::from_hex(settings.webhooks.secret_key.expose_secret()).unwrap();
    for _ in 0..endpoints {
        let id = EndpointId::generate();
        let secret = Secret::generate();
        let sealed = key.seal(id.as_str(), secret.as_str().as_bytes()).unwrap();
        diesel::insert_into(ep::table)
            .values((
                ep::id.eq(&id),
                ep::tenant_id.eq(&tenant),
                ep::url.eq(url),
                ep::signature_format.eq("webhook-signature"),
                ep::status.eq("enabled"),
                ep::secret_sealed.eq(sealed),
            ))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    (tenant, conn)
}

/// The in-process dispatcher, running until the returned sender fires.
fn start_dispatcher(settings: Settings) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<anyhow::Result<()>>) {
    let dispatcher = Dispatcher::build(settings, Arc::new(vid_netguard::StaticResolver::new())).unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(dispatcher.run(async move {
        let _ = stop_rx.await;
    }));
    (stop_tx, running)
}

/// Step 4: `events` events published as fast as confirmed, then every delivery awaited.
async fn burst(bench: &Arc<Bench>, events: usize, publish_concurrency: usize) -> Burst {
    let burst = bench.record(events).await;
    eprintln!("phase burst start {}", unix_ms());
    let cpu = Snapshot::take();
    let start = Instant::now();
    let published: HashMap<String, Instant> = futures::stream::iter(burst)
        .map(|msg| {
            let b = bench.clone();
            async move { b.publish_one(msg).await }
        })
        .buffer_unordered(publish_concurrency.max(1))
        .collect()
        .await;
    let published_in = start.elapsed();
    let (mut lat, last, dups) = bench.collect(&published, Duration::from_secs(300)).await;
    let cpu = cpu.until(&Snapshot::take());
    let span = last.map_or(Duration::ZERO, |l| l.saturating_duration_since(start));
    let deliveries = lat.len();
    let rate = deliveries as f64 / span.as_secs_f64().max(1e-9);
    lat.sort();
    Burst { lat, span, published_in, deliveries, rate, dups, cpu }
}

/// Step 5: paced at half the burst throughput (in events/s: deliveries / endpoints).
async fn paced(bench: &Arc<Bench>, burst_rate: f64, cfg: &Config) -> Paced {
    let paced_rate = (burst_rate / 2.0 / cfg.endpoints as f64).max(1.0);
    let paced_n = ((paced_rate * 8.0) as usize).max(200).min(cfg.events);
    let interval = Duration::from_secs_f64(1.0 / paced_rate);
    let paced_events = bench.record(paced_n).await;
    eprintln!("phase paced start {}", unix_ms());
    let cpu = Snapshot::take();
    let p_start = Instant::now();
    let mut handles = Vec::with_capacity(paced_n);
    for (i, msg) in paced_events.into_iter().enumerate() {
        let at = p_start + interval.mul_f64(i as f64);
        tokio::time::sleep_until(at.into()).await;
        let b = bench.clone();
        handles.push(tokio::spawn(async move { b.publish_one(msg).await }));
    }
    let mut paced = HashMap::new();
    for h in handles {
        let (id, t0) = h.await.unwrap();
        paced.insert(id, t0);
    }
    let paced_elapsed = p_start.elapsed();
    let (mut plat, _, pdups) = bench.collect(&paced, Duration::from_secs(120)).await;
    let cpu = cpu.until(&Snapshot::take());
    plat.sort();
    Paced { rate: paced_rate, n: paced_n, elapsed: paced_elapsed, lat: plat, dups: pdups, cpu }
}

#[tokio::main]
async fn main() {
    let cfg = Config::from_env();

    // 1. Receiver, then wrk (run by the script) against it.
    let log: Log = Arc::default();
    let (url, wrk) = receiver_and_wrk(&log).await;

    // 2. World.
    let db_url = vid_testkit::fresh_database().await;
    let prefix = vid_testkit::unique_prefix();
    let settings = cfg.settings(&db_url, &prefix);
    if let Some(mode) = &cfg.plan_cache_mode {
        set_plan_cache_mode(&db_url, mode).await;
    }

    // 3. Ceilings of the broker and of the database, before the dispatcher runs.
    let ceilings = Ceilings {
        broker: broker_ceiling(&settings, cfg.events, cfg.publish_concurrency, cfg.prefetch).await,
        database: database_ceiling(&settings, cfg.events, cfg.batch as usize, 2).await,
        floor: write_floor(&settings, cfg.events, cfg.batch as usize, 2).await,
    };
    let amqp = vid_infra::amqp::connect(&settings.amqp, Duration::from_secs(10)).await.expect("RabbitMQ");
    let publisher = Publisher::new(&amqp).await.unwrap();
    Topology::new(&prefix).declare(publisher.channel()).await.unwrap();
    let (tenant, mut conn) = seed_endpoints(&settings, &db_url, &url, cfg.endpoints).await;
    let bench_db_settings = settings.database.clone();
    // REPLICAS dispatchers in this process: competing consumers of one queue, one database, as replicas run.
    let replicas: Vec<_> = (0..cfg.replicas).map(|_| start_dispatcher(settings.clone())).collect();
    let bench_db = vid_db::pool(&bench_db_settings).unwrap();
    let bench = Arc::new(Bench { tenant, db: bench_db, prefix, publisher, log: log.clone(), expected_per_event: cfg.endpoints });

    // Warm-up (connections, prepared statements, queue consumer), not counted.
    let mut warm = HashMap::new();
    for msg in bench.record(20).await {
        let (id, t0) = bench.publish_one(msg).await;
        warm.insert(id, t0);
    }
    bench.collect(&warm, Duration::from_secs(60)).await;

    // 4. Burst. The phase lines go to stderr with a Unix time in ms, so a
    // profiler run beside the bench (e.g. `perf record -a`) can be cut to a
    // phase (BENCHMARKS.md, 2026-12-06 third session).
    let before = LeaseCounts::read();
    let burst = burst(&bench, cfg.events, cfg.publish_concurrency).await;
    eprintln!("phase burst end {}", unix_ms());
    let after_burst = LeaseCounts::read();
    // 5. Paced at half the burst throughput.
    let paced = paced(&bench, burst.rate, &cfg).await;
    eprintln!("phase paced end {}", unix_ms());
    let leases = (after_burst.since(&before), LeaseCounts::read().since(&after_burst));

    // Attempts that did not get a 200 (retried; they inflate the tail).
    let non_200: i64 =
        at::table.filter(at::response_status.ne(200).or(at::response_status.is_null())).count().get_result(&mut conn).await.unwrap_or(-1);

    // Counted once the dispatcher has stopped: its drain records every attempt that went out.
    let (stops, running): (Vec<_>, Vec<_>) = replicas.into_iter().unzip();
    for stop in stops {
        let _ = stop.send(());
    }
    let _ = tokio::time::timeout(Duration::from_secs(30), futures::future::join_all(running)).await;
    let not_succeeded: i64 = dl::table.filter(dl::status.ne("succeeded")).count().get_result(&mut conn).await.unwrap_or(-1);

    report(&cfg, &wrk, &ceilings, &burst, &paced, (non_200, not_succeeded), leases);
}
