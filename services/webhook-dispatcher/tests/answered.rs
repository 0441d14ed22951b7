//! The per-endpoint bound counts requests open at the receiver (issue 22,
//! 2026-12-05 night): only a succeeded attempt's slot is leased again while
//! its outcome is still being written, and a 429's slot stays taken until
//! the 429, which throttles the endpoint, is recorded (a review found it
//! re-leased before). In both tests the endpoint's row is held by another
//! transaction so that the recording waits. (That an answered mark of an expired lease
//! frees nothing is `context::tests`, and in SQL
//! `a_claim_leaves_out_the_callers_answered_leases_only`.) Real RabbitMQ and
//! PostgreSQL, the receiver on 127.0.0.1.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use vid_db::schema::webhook_endpoints as ep;

/// Holds the endpoint's row `FOR NO KEY UPDATE` in a transaction of its own
/// until the returned sender fires: the recording of any failure, and of an
/// endpoint's first success (which writes its health), waits for it;
/// claims and the fan-in's key checks do not.
async fn hold_endpoint_row(db_url: &str, endpoint: &vid_core::EndpointId) -> tokio::sync::oneshot::Sender<()> {
    let mut conn = AsyncPgConnection::establish(db_url).await.unwrap();
    conn.batch_execute(&format!("BEGIN; SELECT 1 FROM webhook_endpoints WHERE id = '{}' FOR NO KEY UPDATE;", endpoint.as_str()))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = rx.await;
        conn.batch_execute("COMMIT").await.unwrap();
    });
    tx
}

/// Bound 2, an endpoint answering every request 429 with `Retry-After: 30`,
/// and its failures' records held up: until the first 429 is recorded (and
/// throttles the endpoint) its slot stays taken, so exactly the two first
/// requests are sent, not one per free in-process slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_keeps_its_slot_until_recorded() {
    let w = World::new(&[("dispatcher.per_endpoint_concurrency", "2")]).await;
    let rx = Receiver::start(Arc::new(|_, _| Reply::Status(429, vec![("retry-after", "30".to_owned())]))).await;
    let (endpoint, _) = w.endpoint(&rx.url()).await;
    let release = hold_endpoint_row(&w.db_url, &endpoint).await;
    for _ in 0..10 {
        w.publish().await;
    }
    let d = w.start(no_dns());
    eventually(Duration::from_secs(30), "the two first requests answered", || async {
        (rx.answered.lock().unwrap().len() >= 2).then_some(())
    })
    .await;
    let _ = release.send(());
    eventually(Duration::from_secs(30), "the 429 recorded and the endpoint throttled", || async {
        let mut conn = w.conn().await;
        let until: Option<chrono::DateTime<chrono::Utc>> =
            ep::table.filter(ep::id.eq(&endpoint)).select(ep::throttled_until).first(&mut conn).await.unwrap();
        until.is_some().then_some(())
    })
    .await;
    d.stop().await;
    let got = rx.received().len();
    assert_eq!(got, 2, "requests sent to an endpoint answering 429 with a bound of 2");
}

/// Bound 2, an endpoint answering 200 after 20 ms, and the recording of its
/// successes held up: every delivery is still sent before any outcome is
/// written (a succeeded attempt's slot is leased again at the loop's next
/// wake-up, here at the latest the idle poll), and never more than 2
/// requests are open at the receiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_succeeded_attempt_frees_its_slot_before_its_record() {
    let w = World::new(&[("dispatcher.per_endpoint_concurrency", "2")]).await;
    let rx = Receiver::start(Arc::new(|_, _| Reply::Slow(Duration::from_millis(20), 200))).await;
    let (endpoint, _) = w.endpoint(&rx.url()).await;
    let release = hold_endpoint_row(&w.db_url, &endpoint).await;
    for _ in 0..6 {
        w.publish().await;
    }
    let d = w.start(no_dns());
    eventually(Duration::from_secs(30), "all six sent while no outcome could be written", || async {
        (rx.counts().len() >= 6).then_some(())
    })
    .await;
    let recorded = w.deliveries(&endpoint).await.iter().filter(|d| d.status == "succeeded").count();
    let _ = release.send(());
    assert_eq!(recorded, 0, "an outcome was written while the endpoint's row was held");
    eventually(Duration::from_secs(30), "every delivery succeeded", || async {
        w.deliveries(&endpoint).await.iter().all(|d| d.status == "succeeded").then_some(())
    })
    .await;
    d.stop().await;
    let in_flight: Vec<usize> = rx.received().iter().map(|r| r.in_flight).collect();
    assert!(in_flight.iter().all(|n| *n <= 2), "bound 2 exceeded at the receiver: {in_flight:?}");
}
