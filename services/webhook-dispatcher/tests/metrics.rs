//! `GET /metrics` on the dispatcher's health server: the counters move with
//! real deliveries. Its own test binary, so the process-wide recorder sees
//! only this test's traffic and the values can be asserted exactly.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::*;

/// `GET path` on a local address; returns the status, the `Content-Type` and the body.
async fn http_get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let (status, headers, body) = http_request(addr, "GET", path).await;
    let content_type = headers.into_iter().find(|(k, _)| k == "content-type").map(|(_, v)| v).unwrap_or_default();
    (status, content_type, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_move_with_deliveries() {
    let w = World::new(&[("dispatcher.retry_backlog_interval_ms", "200")]).await;
    // First attempt 500, the retry 200.
    let rx = Receiver::start(Arc::new(|_, prior| Reply::Status(if prior == 0 { 500 } else { 200 }, vec![]))).await;
    let (endpoint, _) = w.endpoint(&rx.url()).await;
    let d = w.start(no_dns());
    let queue = format!("{}.webhook.events", w.prefix);

    let (status, content_type, before) = http_get(d.health, "/metrics").await;
    assert_eq!(status, 200);
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    assert_eq!(sample(&before, "webhook_delivery_attempts_total", &[("outcome", "succeeded")]), None, "{before}");

    w.publish().await;
    eventually(Duration::from_secs(30), "delivered after one retry", || async {
        let d = w.deliveries(&endpoint).await;
        (d.len() == 1 && d[0].status == "succeeded").then_some(())
    })
    .await;

    let (_, _, after) = http_get(d.health, "/metrics").await;
    assert_eq!(sample(&after, "webhook_delivery_attempts_total", &[("outcome", "http_5xx")]), Some(1.0), "{after}");
    assert_eq!(sample(&after, "webhook_delivery_attempts_total", &[("outcome", "succeeded")]), Some(1.0), "{after}");
    // ≥: the other test of this binary may be sending too.
    assert!(sample(&after, "webhook_delivery_attempt_duration_seconds_count", &[]).unwrap_or(0.0) >= 2.0, "{after}");
    assert_eq!(sample(&after, "amqp_messages_consumed_total", &[("queue", &queue), ("outcome", "ack")]), Some(1.0), "{after}");
    // Two attempts, each under a lease: the retry's can only come from a
    // claim (the fan-in leases only the rows it inserts). ≥, as above.
    let leased = |by: &str| sample(&after, "webhook_deliveries_leased_total", &[("by", by)]).unwrap_or(0.0);
    assert!(leased("claim") >= 1.0, "{after}");
    assert!(leased("fanin") + leased("claim") >= 2.0, "{after}");
    assert!(sample(&after, "webhook_claims_total", &[("result", "leased")]).unwrap_or(0.0) >= 1.0, "{after}");
    // The backlog gauge is refreshed every 200 ms here; after the success nothing waits for a retry.
    let backlog = eventually(Duration::from_secs(10), "backlog gauge back to 0", || async {
        let (_, _, text) = http_get(d.health, "/metrics").await;
        sample(&text, "webhook_retry_backlog", &[]).filter(|v| *v == 0.0)
    })
    .await;
    assert_eq!(backlog, 0.0);
    assert_eq!(rx.received().len(), 2);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_endpoint_is_counted_as_disabled() {
    let w = World::new(&[]).await;
    let rx = Receiver::always(410).await;
    let (endpoint, _) = w.endpoint(&rx.url()).await;
    let d = w.start(no_dns());
    w.publish().await;
    eventually(Duration::from_secs(30), "endpoint disabled", || async {
        (w.endpoint_state(&endpoint).await.0 == "disabled").then_some(())
    })
    .await;
    // The counter is bumped right after the disabling transaction commits.
    let text = eventually(Duration::from_secs(10), "disabled counter", || async {
        let (_, _, text) = http_get(d.health, "/metrics").await;
        sample(&text, "webhook_endpoints_disabled_total", &[("reason", "gone")]).map(|_| text)
    })
    .await;
    assert_eq!(sample(&text, "webhook_endpoints_disabled_total", &[("reason", "gone")]), Some(1.0), "{text}");
    assert!(sample(&text, "webhook_delivery_attempts_total", &[("outcome", "http_4xx")]).unwrap_or(0.0) >= 1.0, "{text}");
    d.stop().await;
}
