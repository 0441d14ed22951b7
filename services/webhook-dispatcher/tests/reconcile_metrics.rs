//! The reconciliation on a healthy system: every event reaches its
//! endpoint through the message path, and the passes that cover those
//! events find nothing (`events_reconciled_total` stays 0). Its own test
//! binary, so the process-wide metrics recorder sees only this test.

mod common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use common::*;
use diesel::prelude::*;
use diesel::sql_types::Timestamptz;
use vid_db::schema::events;
use vid_db::RunQueryDsl;

#[derive(QueryableByName)]
struct Mark {
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_system_reconciles_nothing() {
    let wait = Duration::from_secs(30);
    let w = World::new(&[("dispatcher.reconcile_grace_seconds", "2"), ("dispatcher.reconcile_interval_seconds", "0.2")]).await;
    let rx = Receiver::always(200).await;
    let (endpoint, _) = w.endpoint(&rx.url()).await;
    let d = w.start(no_dns());
    for _ in 0..10 {
        w.publish().await;
    }
    eventually(wait, "every event delivered", || async {
        let d = w.deliveries(&endpoint).await;
        (d.len() == 10 && d.iter().all(|d| d.status == "succeeded" && d.at_rest())).then_some(())
    })
    .await;
    // Wait until a completed pass has moved the mark past the newest event.
    let mut conn = w.conn().await;
    let newest: DateTime<Utc> =
        events::table.select(diesel::dsl::max(events::created_at)).first::<Option<_>>(&mut conn).await.unwrap().unwrap();
    eventually(wait, "the reconciliation passed every event", || async {
        let mut conn = w.conn().await;
        let mark: Option<Mark> =
            diesel::sql_query("SELECT created_at FROM webhook_reconcile_mark").get_result(&mut conn).await.optional().unwrap();
        mark.filter(|m| m.created_at >= newest).map(|_| ())
    })
    .await;
    assert_eq!(d.metric("events_reconciled_total", &[]).await, Some(0.0), "nothing was missing");
    assert_eq!(d.metric("webhook_deliveries_reconciled_total", &[]).await, Some(0.0));
    let last = d.metric("events_reconcile_last_success_timestamp_seconds", &[]).await.expect("last success gauge");
    assert!((Utc::now().timestamp() as f64 - last).abs() < 30.0, "a recent pass: {last}");
    let lag = d.metric("events_reconcile_mark_lag_seconds", &[]).await.expect("mark lag gauge");
    assert!((2.0..30.0).contains(&lag), "the mark trails now by the grace plus at most a pass: {lag}");
    d.stop().await;
    assert_eq!(rx.received().len(), 10, "each sent once");
}
