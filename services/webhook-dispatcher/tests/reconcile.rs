//! Event reconciliation (issue 24): events recorded in PostgreSQL become
//! deliveries when RabbitMQ lost their message; one endpoint-matching rule
//! for the message fan-in and the reconciliation. Real PostgreSQL, RabbitMQ
//! and HTTP receivers on 127.0.0.1.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use diesel_async::AsyncPgConnection;
use vid_core::{EndpointId, EventId};
use vid_db::schema::{events, webhook_deliveries as dl, webhook_endpoints as ep};
use vid_db::RunQueryDsl;
use vid_deliveries::reconcile::{self, Window};

const WAIT: Duration = Duration::from_secs(30);

/// Reconcile events older than 1 s, every 200 ms (the defaults are 300 s and 60 s).
const FAST: [(&str, &str); 2] = [("dispatcher.reconcile_grace_seconds", "1"), ("dispatcher.reconcile_interval_seconds", "0.2")];

/// A pass over everything recorded so far (no grace), as the dispatcher runs it.
const NOW: Window = Window { grace: Duration::ZERO, lookback: Duration::from_secs(3600), batch: 1000 };

/// Empties the world's `P.webhook.events` queue; returns how many messages it held.
async fn purge(w: &World) -> u32 {
    let amqp = vid_infra::amqp::connect(&w.settings.amqp, Duration::from_secs(10)).await.expect("RabbitMQ");
    let ch = amqp.create_channel().await.unwrap();
    let n = ch.queue_purge(&format!("{}.webhook.events", w.prefix), Default::default()).await.unwrap();
    let _ = amqp.close(200, "done").await;
    n
}

/// `(event_id, endpoint_id)` of every delivery, sorted.
async fn pairs(conn: &mut AsyncPgConnection) -> Vec<(String, String)> {
    dl::table.select((dl::event_id, dl::endpoint_id)).order((dl::event_id, dl::endpoint_id)).load(conn).await.unwrap()
}

/// The stack's broker lost the message: the dispatcher was down, the event
/// was recorded and published, the queue was purged. After the restart the
/// reconciliation creates the delivery and it is sent, signed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_event_is_delivered_and_its_signature_verifies() {
    let w = World::new(&FAST).await;
    let rx = Receiver::always(200).await;
    let (endpoint, secret) = w.endpoint(&rx.url()).await;
    let d = w.start(no_dns());
    d.stop().await;

    let (event_id, payload) = w.publish().await;
    assert_eq!(purge(&w).await, 1, "the message was in the queue");

    let d = w.start(no_dns());
    let got = eventually(WAIT, "the reconciled webhook", || async { rx.received().into_iter().next() }).await;
    assert_eq!(got.header("webhook-id"), Some(event_id.as_str()));
    assert_eq!(got.body, payload.as_bytes(), "the body is the recorded payload");
    verify(&got, &[&secret]).expect("signature verifies");
    eventually(WAIT, "succeeded", || async {
        w.deliveries(&endpoint).await.as_slice().first().is_some_and(|d| d.status == "succeeded" && d.at_rest()).then_some(())
    })
    .await;
    // Process-wide counter (other tests of this binary may add to it).
    let reconciled = d.metric("events_reconciled_total", &[]).await.unwrap_or(0.0);
    assert!(reconciled >= 1.0, "events_reconciled_total = {reconciled}");
    d.stop().await;
    assert_eq!(w.deliveries(&endpoint).await.len(), 1);
    assert_eq!(rx.received().len(), 1, "sent once");
}

/// The rule: an endpoint created after an event never gets it, whether the
/// event is fanned in from its message or by the reconciliation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_created_after_the_event_gets_nothing_in_either_path() {
    let w = World::new(&[]).await;
    let (a, _) = w.endpoint("http://127.0.0.1:9/a").await;
    let (e1, p1) = w.record_event().await;
    let (b, _) = w.endpoint("http://127.0.0.1:9/b").await;
    let (e2, _) = w.record_event().await;
    let (_c, _) = w.endpoint("http://127.0.0.1:9/c").await;

    // Message path, late: e1 reaches A only (B and C came after it).
    assert_eq!(w.fan_in(&p1).await, 1);
    let mut conn = w.conn().await;
    assert_eq!(pairs(&mut conn).await, vec![(e1.to_string(), a.to_string())]);

    // Reconciliation: e1 is complete; e2 (message lost) reaches A and B, not C.
    let pass = reconcile::pass(&mut conn, NOW).await.unwrap();
    assert_eq!(pass.events, vec![e2.clone()], "only e2 lacked deliveries");
    assert_eq!(pass.deliveries, 2);
    let mut want = vec![(e1.to_string(), a.to_string()), (e2.to_string(), a.to_string()), (e2.to_string(), b.to_string())];
    want.sort();
    assert_eq!(pairs(&mut conn).await, want);
    assert_eq!(reconcile::pass(&mut conn, NOW).await.unwrap().deliveries, 0, "a second pass finds nothing");
}

/// `webhook_endpoint.disabled` skips the disabled endpoint and goes to the
/// enabled ones only; any other event also reaches a disabled (not deleted)
/// endpoint, held `paused`. The reconciliation rebuilds exactly that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_endpoint_events_follow_their_rule_in_both_paths() {
    let w = World::new(&[]).await;
    let (on, _) = w.endpoint("http://127.0.0.1:9/on").await;
    let (failing, _) = w.endpoint("http://127.0.0.1:9/failing").await;
    let (off, _) = w.endpoint("http://127.0.0.1:9/off").await;
    let (gone, _) = w.endpoint("http://127.0.0.1:9/gone").await;
    let mut conn = w.conn().await;
    diesel::update(ep::table.filter(ep::id.eq(&off))).set(ep::status.eq("disabled")).execute(&mut conn).await.unwrap();
    diesel::update(ep::table.filter(ep::id.eq(&gone)))
        .set((ep::status.eq("disabled"), ep::deleted_at.eq(diesel::dsl::now)))
        .execute(&mut conn)
        .await
        .unwrap();

    // Normal path: the dispatcher disables `failing` (one transaction).
    let event = {
        use diesel_async::scoped_futures::ScopedFutureExt;
        use diesel_async::AsyncConnection;
        let (t, f) = (w.tenant.clone(), failing.clone());
        conn.transaction(|c| async move { vid_deliveries::disable(c, &t, &f, "test").await }.scope_boxed()).await.unwrap()
    };
    let only_on = vec![(event.id.to_string(), on.to_string())];
    assert_eq!(pairs(&mut conn).await, only_on, "the disabled event goes to the enabled endpoint only");

    // Its deliveries lost: the reconciliation makes the same set again.
    diesel::delete(dl::table).execute(&mut conn).await.unwrap();
    let pass = reconcile::pass(&mut conn, NOW).await.unwrap();
    assert_eq!(pass.events, vec![event.id.clone()]);
    assert_eq!(pairs(&mut conn).await, only_on);

    // Any other event: every endpoint not deleted, paused where disabled.
    let (e, _) = w.record_event().await;
    let pass = reconcile::pass(&mut conn, NOW).await.unwrap();
    assert_eq!((pass.events, pass.deliveries), (vec![e.clone()], 3));
    let states: HashMap<String, String> = dl::table
        .filter(dl::event_id.eq(&e))
        .select((dl::endpoint_id, dl::status))
        .load::<(String, String)>(&mut conn)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let want: HashMap<String, String> =
        [(on.to_string(), "pending"), (failing.to_string(), "paused"), (off.to_string(), "paused")].map(|(k, v)| (k, v.to_owned())).into();
    assert_eq!(states, want, "nothing to the deleted endpoint; held for the disabled ones");
}

/// Two passes at once over the same lost events create each delivery once,
/// and together report each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_passes_create_each_delivery_once() {
    let w = World::new(&[]).await;
    w.endpoint("http://127.0.0.1:9/a").await;
    w.endpoint("http://127.0.0.1:9/b").await;
    let n = 300;
    for _ in 0..n {
        w.record_event().await;
    }
    let small = Window { batch: 7, ..NOW };
    let (mut c1, mut c2) = (w.conn().await, w.conn().await);
    let (p1, p2) = tokio::join!(reconcile::pass(&mut c1, small), reconcile::pass(&mut c2, small));
    let (p1, p2) = (p1.unwrap(), p2.unwrap());
    assert_eq!(p1.deliveries + p2.deliveries, 2 * n, "{} + {}", p1.deliveries, p2.deliveries);
    assert_eq!(p1.events.len() + p2.events.len(), n);
    let all = pairs(&mut c1).await;
    assert_eq!(all.len(), 2 * n);
    let mut distinct = all.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), all.len());
}

/// Two dispatcher replicas start at once on events whose messages were
/// lost: each event is delivered to the endpoint exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_deliver_each_lost_event_once() {
    let w = World::new(&FAST).await;
    let rx = Receiver::always(200).await;
    let (endpoint, _) = w.endpoint(&rx.url()).await;
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.push(w.record_event().await.0);
    }
    let (d1, d2) = (w.start(no_dns()), w.start(no_dns()));
    let deliveries = eventually(WAIT, "every lost event delivered", || async {
        let d = w.deliveries(&endpoint).await;
        (d.len() == ids.len() && d.iter().all(|d| d.status == "succeeded" && d.at_rest())).then_some(d)
    })
    .await;
    d1.stop().await;
    d2.stop().await;
    let mut got: Vec<&str> = deliveries.iter().map(|d| d.event_id.as_str()).collect();
    got.sort();
    let mut want: Vec<&str> = ids.iter().map(EventId::as_str).collect();
    want.sort();
    assert_eq!(got, want, "one delivery per event");
    let counts = rx.counts();
    assert_eq!(counts.len(), ids.len());
    assert!(counts.values().all(|n| *n == 1), "each sent once: {counts:?}");
}

/// Inserts `n` events of the world's tenant, spread over the hour before
/// the grace, each with its delivery to `endpoint` (a healthy system).
async fn healthy_history(w: &World, conn: &mut AsyncPgConnection, endpoint: &EndpointId, n: i64) {
    diesel::sql_query(
        "INSERT INTO events (id, tenant_id, event_type, resource_id, payload, created_at) \
         SELECT 'evt_' || lpad(i::text, 26, '0'), $1, 'video.ready', 'vid_x', '{}', \
                now() - interval '2 hours' + i * interval '1 hour' / $2 \
         FROM generate_series(1, $2) i",
    )
    .bind::<Text, _>(&w.tenant)
    .bind::<BigInt, _>(n)
    .execute(conn)
    .await
    .unwrap();
    diesel::sql_query(
        "INSERT INTO webhook_deliveries (id, tenant_id, endpoint_id, event_id, event_type, payload, status) \
         SELECT 'dlv_' || substr(e.id, 5), e.tenant_id, $1, e.id, e.event_type, e.payload, 'succeeded' FROM events e",
    )
    .bind::<Text, _>(endpoint)
    .execute(conn)
    .await
    .unwrap();
    diesel::sql_query("ANALYZE events").execute(conn).await.unwrap();
    diesel::sql_query("ANALYZE webhook_deliveries").execute(conn).await.unwrap();
}

#[derive(QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
    line: String,
}

async fn explain(conn: &mut AsyncPgConnection, sql: &str) -> String {
    let lines: Vec<PlanLine> = diesel::sql_query(format!("EXPLAIN (ANALYZE, BUFFERS) {sql}")).load(conn).await.unwrap();
    lines.into_iter().map(|l| l.line).collect::<Vec<_>>().join("\n")
}

/// 100,000 events, all fanned in: the reconciliation creates nothing, and
/// once the mark is past them a pass reads only the window (an index range
/// on events_created_id), not the table. Figures are printed (`--nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_over_100k_events_is_cheap() {
    let w = World::new(&[]).await;
    let (endpoint, _) = w.endpoint("http://127.0.0.1:9/a").await;
    let mut conn = w.conn().await;
    // The endpoint must predate the history (the rule).
    diesel::update(ep::table.filter(ep::id.eq(&endpoint)))
        .set(ep::created_at.eq(diesel::dsl::sql::<diesel::sql_types::Timestamptz>("now() - interval '3 hours'")))
        .execute(&mut conn)
        .await
        .unwrap();
    let t = Instant::now();
    healthy_history(&w, &mut conn, &endpoint, 100_000).await;
    println!("inserted 100000 events + deliveries in {:?}", t.elapsed());
    let window = Window { grace: Duration::from_secs(300), lookback: Duration::from_secs(3 * 3600), batch: 1000 };

    let t = Instant::now();
    let first = reconcile::pass(&mut conn, window).await.unwrap();
    println!("first pass (no mark yet, all 100000 in the window): {:?}, scanned {}", t.elapsed(), first.scanned);
    assert_eq!((first.scanned, first.deliveries), (100_000, 0), "a healthy history needs nothing");

    let mut times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let steady = reconcile::pass(&mut conn, window).await.unwrap();
        times.push(t.elapsed());
        assert_eq!((steady.scanned, steady.deliveries), (0, 0));
    }
    times.sort();
    println!("steady pass (mark past every event), 5 runs: median {:?}, max {:?}", times[2], times[4]);

    let (at, id): (chrono::DateTime<chrono::Utc>, String) = events::table
        .order((events::created_at.desc(), events::id.desc()))
        .select((events::created_at, events::id))
        .first(&mut conn)
        .await
        .unwrap();
    let window_sql = reconcile::WINDOW
        .replace("$1", &format!("'{}'::timestamptz", at.to_rfc3339()))
        .replace("$2", &format!("'{id}'"))
        .replace("$3", "300")
        .replace("$4", "1000");
    let plan = explain(&mut conn, &window_sql).await;
    println!("steady window:\n{plan}");
    assert!(plan.contains("events_created_id"), "the window is an index range:\n{plan}");
    assert!(!plan.contains("Seq Scan"), "no table scan:\n{plan}");

    let full_window = reconcile::WINDOW.replace("$1", "'-infinity'").replace("$2", "''").replace("$3", "300").replace("$4", "1000");
    let plan = explain(&mut conn, &full_window).await;
    println!("first batch of a full window:\n{plan}");
    assert!(!plan.contains("Seq Scan"), "a batch reads 1000 index entries, not the table:\n{plan}");

    // The fan-in of one batch of 1000 fanned-in events (both paths run it).
    let batch = "ARRAY(SELECT id FROM events ORDER BY created_at, id LIMIT 1000)";
    let plan = explain(&mut conn, &vid_deliveries::fanin::missing_sql().replace("$1", batch)).await;
    println!("fan-in of 1000 fanned-in events:\n{plan}");
    assert!(!plan.contains("Seq Scan on events"), "events by primary key:\n{plan}");

    // The message fan-in's common case: a batch of 64 of the newest events,
    // after the endpoint, their ids known to the planner as the bound array
    // of a custom plan is.
    diesel::sql_query("UPDATE webhook_endpoints SET created_at = now() - interval '3 hours'").execute(&mut conn).await.unwrap();
    let newest: Vec<String> = events::table.order(events::created_at.desc()).select(events::id).limit(64).load(&mut conn).await.unwrap();
    let batch = format!("'{{{}}}'::text[]", newest.join(","));
    let plan = explain(&mut conn, &vid_deliveries::fanin::missing_sql().replace("$1", &batch)).await;
    println!("fan-in of 64 new events:\n{plan}");
    assert!(!plan.contains("events_tenant_created"), "never a scan of the tenant's event history:\n{plan}");
    assert!(plan.contains("events_pkey"), "events by primary key:\n{plan}");
    assert!(!plan.contains("Seq Scan on webhook_deliveries"), "deliveries by their unique key:\n{plan}");
}
