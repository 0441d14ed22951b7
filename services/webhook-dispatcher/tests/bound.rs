//! The per-endpoint bound across replicas (issue 22): two dispatchers share
//! one endpoint whose bound is 2; the receiver counts the requests open at
//! once and never sees more than 2, while both replicas send. Real
//! RabbitMQ and PostgreSQL, the receiver on 127.0.0.1.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use vid_webhook_dispatcher::ConnectObserver;

/// A receiver that holds every request `hold` before answering `200`,
/// counting open requests (arrived, not yet answered) with an atomic and
/// keeping the largest count seen; also how often each `webhook-id` came.
struct Counting {
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    max_open: Arc<AtomicUsize>,
    ids: Arc<Mutex<HashMap<String, usize>>>,
}

impl Counting {
    async fn start(hold: Duration) -> Counting {
        let (open, max_open, ids) =
            (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::<Mutex<HashMap<String, usize>>>::default());
        let (o, m, i) = (open.clone(), max_open.clone(), ids.clone());
        let addr = serve(move |id| {
            let (o, m, i) = (o.clone(), m.clone(), i.clone());
            async move {
                let now_open = o.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(now_open, Ordering::SeqCst);
                *i.lock().unwrap().entry(id.unwrap_or_default()).or_default() += 1;
                tokio::time::sleep(hold).await;
                // Closed before the answer leaves: the dispatcher can only free the
                // slot after it has the answer, so this never under-counts.
                o.fetch_sub(1, Ordering::SeqCst);
                200
            }
        })
        .await;
        Counting { addr, open, max_open, ids }
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }
}

/// Serves HTTP/1 on 127.0.0.1 (a free port), answering each request with
/// the status `handle` gives for its `webhook-id` header.
async fn serve<F, Fut>(handle: F) -> SocketAddr
where
    F: Fn(Option<String>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = u16> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let handle = handle.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let id = req.headers().get("webhook-id").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                    let answer = handle(id);
                    async move {
                        let status = answer.await;
                        let mut r = hyper::Response::new(Full::new(Bytes::from_static(b"ok")));
                        *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                        Ok::<_, Infallible>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    addr
}

/// One replica leasing ahead, for an endpoint whose bound is 2: small
/// batches, eight slots, 64 places ahead.
const AHEAD_BOUND_2: &[(&str, &str)] = &[
    ("dispatcher.per_endpoint_concurrency", "2"),
    ("dispatcher.batch_size", "4"),
    ("dispatcher.prefetch", "64"),
    ("dispatcher.max_in_flight", "8"),
    ("dispatcher.lease_ahead", "64"),
];

/// Counts the connections a replica opens (each is opened for a request it sends).
fn counting_observer() -> (ConnectObserver, Arc<AtomicUsize>) {
    let n = Arc::new(AtomicUsize::new(0));
    let m = n.clone();
    (
        Arc::new(move |_| {
            m.fetch_add(1, Ordering::SeqCst);
        }),
        n,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_never_exceed_an_endpoints_bound() {
    // Small batches and prefetch, so both replicas' fan-ins take messages
    // (RabbitMQ hands them out round-robin) and both claim. Two in-process
    // slots per replica (each held until its attempt is recorded): a replica
    // cannot keep the endpoint by re-leasing its answered slots while its
    // records are written (the bound counts open requests, so one replica
    // with a backlog may otherwise hold all of it), and a replica-local
    // bound would still allow four open at once.
    let w = World::new(&[
        ("dispatcher.per_endpoint_concurrency", "2"),
        ("dispatcher.batch_size", "4"),
        ("dispatcher.prefetch", "4"),
        ("dispatcher.max_in_flight", "2"),
    ])
    .await;
    let rx = Counting::start(Duration::from_millis(30)).await;
    let (endpoint, _) = w.endpoint(&rx.url()).await;
    let (obs1, sent1) = counting_observer();
    let (obs2, sent2) = counting_observer();
    let r1 = w.start_with(w.settings.clone(), no_dns(), Some(obs1));
    let r2 = w.start_with(w.settings.clone(), no_dns(), Some(obs2));
    let n = 60;
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        ids.push(w.publish().await.0);
    }
    eventually(Duration::from_secs(60), "every delivery succeeded", || async {
        (w.deliveries(&endpoint).await.iter().filter(|d| d.status == "succeeded").count() == n).then_some(())
    })
    .await;
    let max_open = rx.max_open.load(Ordering::SeqCst);
    assert!(max_open <= 2, "at most 2 requests open at the receiver at any moment, saw {max_open}");
    assert_eq!(max_open, 2, "the bound was used (two at once), so a replica-local bound would have shown up");
    let (s1, s2) = (sent1.load(Ordering::SeqCst), sent2.load(Ordering::SeqCst));
    assert!(s1 > 0 && s2 > 0, "both replicas sent: connections opened {s1} and {s2}");
    let counts = rx.ids.lock().unwrap().clone();
    for id in &ids {
        assert_eq!(counts.get(id.as_str()), Some(&1), "event {id} sent once");
    }
    assert_eq!(rx.open.load(Ordering::SeqCst), 0);
    assert_eq!(w.attempts(&endpoint).await.len(), n);
    r1.stop().await;
    r2.stop().await;
}

/// Leasing ahead (`dispatcher.lease_ahead`): one replica, an endpoint whose
/// bound is 2 and a burst of 40 events. The fan-in leases past the bound
/// (the table holds more than 2 live leases of the endpoint at once), yet
/// the receiver never sees more than 2 requests open: the endpoint's gate in
/// the replica holds the rest back. Each event is sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_taken_ahead_of_the_bound_wait_at_the_gate() {
    let w = World::new(AHEAD_BOUND_2).await;
    let rx = Counting::start(Duration::from_millis(20)).await;
    let (endpoint, _) = w.endpoint(&rx.url()).await;
    let n = 40;
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        ids.push(w.publish().await.0);
    }
    // Published before the replica starts: its fan-in takes them in batches.
    let r = w.start_with(w.settings.clone(), no_dns(), None);
    let most_live = std::sync::atomic::AtomicI64::new(0);
    eventually(Duration::from_secs(60), "every delivery succeeded", || async {
        most_live.fetch_max(live_leases(&w, &endpoint).await, Ordering::SeqCst);
        (w.deliveries(&endpoint).await.iter().filter(|d| d.status == "succeeded").count() == n).then_some(())
    })
    .await;
    let most_live = most_live.load(Ordering::SeqCst);
    assert!(most_live > 2, "leased ahead of the bound of 2: at most {most_live} live leases seen");
    let max_open = rx.max_open.load(Ordering::SeqCst);
    assert_eq!(max_open, 2, "at most (and at some moment exactly) 2 requests open at the receiver, saw {max_open}");
    let counts = rx.ids.lock().unwrap().clone();
    for id in &ids {
        assert_eq!(counts.get(id.as_str()), Some(&1), "event {id} sent once");
    }
    assert_eq!(w.attempts(&endpoint).await.len(), n);
    r.stop().await;
}

/// The endpoint's live leases (pending, unexpired), as every leasing statement counts them.
async fn live_leases(w: &World, endpoint: &vid_core::EndpointId) -> i64 {
    use diesel::sql_types::{BigInt, Text};
    use vid_db::RunQueryDsl;
    #[derive(diesel::QueryableByName)]
    struct Live {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let mut conn = w.conn().await;
    let live: Live = diesel::sql_query(
        "SELECT count(*) AS n FROM webhook_deliveries WHERE endpoint_id = $1 AND status = 'pending' AND locked_until >= now()",
    )
    .bind::<Text, _>(endpoint.as_str())
    .get_result(&mut conn)
    .await
    .unwrap();
    live.n
}

/// A receiver that counts the requests that arrive and answers `200` only
/// as the test lets it ([`Gated::release`]).
struct Gated {
    addr: SocketAddr,
    arrived: Arc<AtomicUsize>,
    answer: Arc<tokio::sync::Semaphore>,
}

impl Gated {
    async fn start() -> Gated {
        let (arrived, answer) = (Arc::new(AtomicUsize::new(0)), Arc::new(tokio::sync::Semaphore::new(0)));
        let (a, s) = (arrived.clone(), answer.clone());
        let addr = serve(move |_| {
            let (a, s) = (a.clone(), s.clone());
            async move {
                a.fetch_add(1, Ordering::SeqCst);
                s.acquire().await.unwrap().forget();
                200
            }
        })
        .await;
        Gated { addr, arrived, answer }
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    fn release(&self, n: usize) {
        self.answer.add_permits(n);
    }
}

/// A lease taken ahead of the bound that has waited at its endpoint's gate
/// is sent only if the endpoint is still as the lease read it: an endpoint
/// paused (as disabling does it) while nine leases waited behind its one
/// open request gets none of them; they are given back, and only the
/// request already open was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_waiting_at_the_gate_are_not_sent_to_an_endpoint_paused_meanwhile() {
    let w = World::new(&[
        ("dispatcher.per_endpoint_concurrency", "1"),
        ("dispatcher.batch_size", "4"),
        ("dispatcher.prefetch", "64"),
        ("dispatcher.max_in_flight", "8"),
        ("dispatcher.lease_ahead", "64"),
    ])
    .await;
    let rx = Gated::start().await;
    let (endpoint, _) = w.endpoint(&rx.url()).await;
    let n = 10;
    for _ in 0..n {
        w.publish().await;
    }
    let r = w.start_with(w.settings.clone(), no_dns(), None);
    eventually(Duration::from_secs(30), "all ten leased, one of them open at the receiver", || async {
        (live_leases(&w, &endpoint).await == n as i64 && rx.arrived.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    pause(&w, &endpoint).await;
    // The waiting leases must be older than the gate's recheck interval (1 s)
    // when they pass it: that age, not an event, is what this waits for.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    rx.release(n);
    eventually(Duration::from_secs(30), "the nine waiting leases given back", || async {
        let held = w.deliveries(&endpoint).await.iter().filter(|d| d.locked_until.is_some()).count();
        (held <= 1).then_some(())
    })
    .await;
    assert_eq!(rx.arrived.load(Ordering::SeqCst), 1, "only the request open before the pause reached the receiver");
    r.stop().await;
}

/// Disables the endpoint and pauses its pending deliveries, leased ones too,
/// as `vid_deliveries::disable` does.
async fn pause(w: &World, endpoint: &vid_core::EndpointId) {
    use diesel::sql_types::Text;
    use vid_db::RunQueryDsl;
    let mut conn = w.conn().await;
    diesel::sql_query("UPDATE webhook_endpoints SET status = 'disabled', disabled_reason = 'test', disabled_at = now() WHERE id = $1")
        .bind::<Text, _>(endpoint.as_str())
        .execute(&mut conn)
        .await
        .unwrap();
    diesel::sql_query("UPDATE webhook_deliveries SET status = 'paused' WHERE endpoint_id = $1 AND status = 'pending'")
        .bind::<Text, _>(endpoint.as_str())
        .execute(&mut conn)
        .await
        .unwrap();
}

/// Leases taken ahead of the bound wait at their endpoint's gate and then
/// for a slot of `max_in_flight`; only then is it decided whether each may
/// still be sent (issue 22 review). Replica A has one slot and leases ahead
/// three deliveries for each of four endpoints whose bound is 2; its
/// receivers hold each request 2 s, so most of A's leases run short while
/// they wait, are given back, and replica B (eight slots) claims them. No
/// endpoint ever has more than 2 requests open, and no event is sent twice:
/// a lease too short for a whole attempt by the time it has a slot is not
/// sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_ran_short_waiting_for_a_slot_is_given_back_not_sent() {
    let w = World::new(&[
        ("dispatcher.per_endpoint_concurrency", "2"),
        ("dispatcher.batch_size", "8"),
        ("dispatcher.prefetch", "64"),
        ("dispatcher.max_in_flight", "1"),
        ("dispatcher.lease_ahead", "64"),
        ("dispatcher.lease_ms", "9000"),
        ("dispatcher.request_timeout_ms", "2500"),
    ])
    .await;
    let mut rxs = Vec::new();
    let mut eps = Vec::new();
    for _ in 0..4 {
        let rx = Counting::start(Duration::from_millis(2000)).await;
        eps.push(w.endpoint(&rx.url()).await.0);
        rxs.push(rx);
    }
    let n = 3;
    for _ in 0..n {
        w.publish().await;
    }
    let a = w.start_with(w.settings.clone(), no_dns(), None);
    eventually(Duration::from_secs(20), "every delivery fanned in and leased by A", || async {
        let mut leased = 0;
        for e in &eps {
            leased += live_leases(&w, e).await;
        }
        (leased == (n * 4) as i64).then_some(())
    })
    .await;
    let mut b_settings = w.settings.clone();
    b_settings.dispatcher.max_in_flight = 8;
    let b = w.start_with(b_settings, no_dns(), None);
    eventually(Duration::from_secs(120), "every delivery succeeded", || async {
        let mut ok = 0;
        for e in &eps {
            ok += w.deliveries(e).await.iter().filter(|d| d.status == "succeeded").count();
        }
        (ok == n * 4).then_some(())
    })
    .await;
    // Stopping waits for every attempt in flight: whatever either replica
    // would still send is sent (or given back) before the counts are read.
    a.stop().await;
    b.stop().await;
    for rx in &rxs {
        let max_open = rx.max_open.load(Ordering::SeqCst);
        assert!(max_open <= 2, "bound 2 exceeded: {max_open} open at once");
        let counts = rx.ids.lock().unwrap().clone();
        assert_eq!(counts.len(), n, "each endpoint got every event");
        assert!(counts.values().all(|c| *c == 1), "an event sent twice: {counts:?}");
    }
}

/// Found by the second review: a lease this replica claimed (within the
/// bound, so it passes no gate) is not counted as the fan-in's own, so while
/// one is open the fan-in leases within the bound only and never lets its
/// gate open `per_endpoint_concurrency` more beside it. Bound 2: the first
/// two requests fail, their retries are claimed and held open 3 s, and four
/// more events arrive meanwhile; never more than 2 requests open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claimed_leases_and_leases_taken_ahead_share_the_bound() {
    let mut w = World::new(AHEAD_BOUND_2).await;
    w.settings.dispatcher.retry_schedule_seconds = vec![1, 1, 1, 1];
    let (seen, open, max_open) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (s, o, m) = (seen.clone(), open.clone(), max_open.clone());
    let addr = serve(move |_| {
        let (s, o, m) = (s.clone(), o.clone(), m.clone());
        async move {
            let now_open = o.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now_open, Ordering::SeqCst);
            let status = if s.fetch_add(1, Ordering::SeqCst) < 2 {
                500
            } else {
                tokio::time::sleep(Duration::from_secs(3)).await;
                200
            };
            o.fetch_sub(1, Ordering::SeqCst);
            status
        }
    })
    .await;
    let (endpoint, _) = w.endpoint(&format!("http://{addr}/hook")).await;
    let r = w.start_with(w.settings.clone(), no_dns(), None);
    w.publish().await;
    w.publish().await;
    eventually(Duration::from_secs(20), "the two claimed retries open", || async {
        (open.load(Ordering::SeqCst) == 2 && seen.load(Ordering::SeqCst) >= 4).then_some(())
    })
    .await;
    for _ in 0..4 {
        w.publish().await;
    }
    eventually(Duration::from_secs(60), "every delivery succeeded", || async {
        (w.deliveries(&endpoint).await.iter().filter(|d| d.status == "succeeded").count() == 6).then_some(())
    })
    .await;
    r.stop().await;
    let max_open = max_open.load(Ordering::SeqCst);
    assert!(max_open <= 2, "bound 2, saw {max_open} open at once");
    assert_eq!(max_open, 2, "the bound was used");
}
