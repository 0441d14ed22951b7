//! The endpoint-management routes of the api (`:enable`, `:rotate-secret`,
//! `/deliveries`, `:retry`) working with a running dispatcher.

mod common;

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use vid_core::EndpointId;
use vid_webhooks::Secret;

const WAIT: Duration = Duration::from_secs(20);

async fn register(api: &Api, url: &str) -> (EndpointId, Secret) {
    let (status, body) = api.call("POST", "/webhook-endpoints", Some(serde_json::json!({ "url": url }))).await;
    assert_eq!(status, 201, "{body}");
    (body["id"].as_str().unwrap().parse().unwrap(), Secret::parse(body["secret"].as_str().unwrap()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_endpoint_keeps_its_backlog_until_enabled() {
    let mut w = World::new(&[]).await;
    let api = Api::start(&mut w).await;
    let answer = Arc::new(AtomicU16::new(410));
    let a2 = answer.clone();
    let rx = Receiver::start(Arc::new(move |_, _| Reply::Status(a2.load(Ordering::SeqCst), vec![]))).await;
    let (endpoint, secret) = register(&api, &rx.url()).await;
    let d = w.start(no_dns());

    let (first, _) = w.publish().await;
    eventually(WAIT, "disabled by 410", || async { (w.endpoint_state(&endpoint).await.0 == "disabled").then_some(()) }).await;
    let (status, body) = api.call("GET", &format!("/webhook-endpoints/{endpoint}"), None).await;
    assert_eq!(status, 200);
    assert_eq!(body["status"], "disabled");
    assert!(body["disabled_reason"].as_str().unwrap().contains("410"));
    assert!(body["disabled_at"].is_string());
    // The single endpoint carries its delivery health, like the list.
    let h = &body["health"];
    assert_eq!((h["recent_deliveries"].as_i64(), h["recent_succeeded"].as_i64()), (Some(1), Some(0)), "{h}");
    assert_eq!(h["success_rate"].as_f64(), Some(0.0));
    assert_eq!((h["last_attempt_status"].as_i64(), h["last_attempt_error_class"].as_str()), (Some(410), Some("http")), "{h}");

    // Events while disabled: kept as paused, not sent.
    let mut backlog = vec![first];
    for _ in 0..3 {
        backlog.push(w.publish().await.0);
    }
    // Paused and unleased (at rest): none is attempted or in flight, so what
    // the receiver logged is final (no fixed sleep needed).
    eventually(WAIT, "four paused deliveries at rest", || async {
        let d = w.deliveries(&endpoint).await;
        (d.len() == 4 && d.iter().all(|d| d.status == "paused" && d.at_rest())).then_some(())
    })
    .await;
    let (status, list) = api.call("GET", &format!("/webhook-endpoints/{endpoint}/deliveries?status=paused"), None).await;
    assert_eq!(status, 200);
    assert_eq!(list["data"].as_array().unwrap().len(), 4);
    assert_eq!(rx.received().len(), 1, "only the 410 attempt was sent");

    // Retry is refused while disabled.
    let dlv = list["data"][0]["id"].as_str().unwrap();
    let (status, body) = api.call("POST", &format!("/webhook-endpoints/{endpoint}/deliveries/{dlv}:retry"), None).await;
    assert_eq!((status, body["code"].as_str()), (409, Some("endpoint_disabled")));

    answer.store(200, Ordering::SeqCst);
    // The 410 left its mark; enabling starts afresh.
    {
        use diesel::prelude::*;
        use vid_db::schema::webhook_endpoints as ep;
        use vid_db::RunQueryDsl;
        diesel::update(ep::table.filter(ep::id.eq(&endpoint)))
            .set(ep::concurrency_limit.eq(Some(1)))
            .execute(&mut w.conn().await)
            .await
            .unwrap();
    }
    let (status, body) = api.call("POST", &format!("/webhook-endpoints/{endpoint}:enable"), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "enabled");
    assert!(body["disabled_reason"].is_null());
    assert!(body["concurrency_limit"].is_null(), "enabling a disabled endpoint restores its full concurrency: {body}");
    eventually(WAIT, "backlog delivered", || async {
        let d = w.deliveries(&endpoint).await;
        d.iter().all(|d| d.status == "succeeded").then_some(())
    })
    .await;
    let counts = rx.counts();
    for id in &backlog {
        assert!(counts.contains_key(id.as_str()), "{id} delivered after enable");
    }
    for r in rx.received() {
        verify(&r, &[&secret]).unwrap();
    }
    let (status, body) = api.call("GET", &format!("/webhook-endpoints/{endpoint}"), None).await;
    assert_eq!(status, 200);
    let h = &body["health"];
    assert_eq!(
        (h["recent_deliveries"].as_i64(), h["recent_succeeded"].as_i64(), h["success_rate"].as_f64()),
        (Some(4), Some(4), Some(1.0)),
        "{h}"
    );
    assert_eq!(h["last_attempt_status"].as_i64(), Some(200));
    assert!(h["last_attempt_error_class"].is_null() && h["last_attempt_at"].is_string(), "{h}");
    let (status, list) = api.call("GET", "/webhook-endpoints", None).await;
    assert_eq!(status, 200);
    assert_eq!(list["data"][0]["health"], *h, "the list shows the same health");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotate_secret_signs_with_both_until_the_overlap_ends() {
    let mut w = World::new(&[]).await;
    let api = Api::start(&mut w).await;
    let rx = Receiver::always(200).await;
    let (endpoint, old) = register(&api, &rx.url()).await;
    let (status, body) = api.call("POST", &format!("/webhook-endpoints/{endpoint}:rotate-secret"), None).await;
    assert_eq!(status, 200, "{body}");
    let new = Secret::parse(body["secret"].as_str().unwrap()).unwrap();
    assert_ne!(new.as_str(), old.as_str());
    let expires: chrono::DateTime<chrono::Utc> = body["previous_secret_expires_at"].as_str().unwrap().parse().unwrap();
    let overlap = expires - chrono::Utc::now();
    assert!(overlap > chrono::Duration::hours(23) && overlap <= chrono::Duration::hours(24), "{overlap}");

    let d = w.start(no_dns());
    w.publish().await;
    let got = eventually(WAIT, "webhook", || async { rx.received().into_iter().next() }).await;
    let sig = got.header("webhook-signature").unwrap();
    assert_eq!(sig.matches("v1=").count(), 2, "{sig}");
    verify(&got, &[&new]).expect("the new secret verifies");
    verify(&got, &[&old]).expect("the old secret verifies");
    d.stop().await;

    // Another tenant cannot rotate it.
    let (status, _) = api.call_as("vidk_nope", "POST", &format!("/webhook-endpoints/{endpoint}:rotate-secret"), None).await;
    assert_eq!(status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_log_and_manual_retry() {
    let mut w = World::new(&[]).await;
    let api = Api::start(&mut w).await;
    let rx = Receiver::start(Arc::new(|_, prior| Reply::Status(if prior == 0 { 500 } else { 200 }, vec![]))).await;
    let (endpoint, _) = register(&api, &rx.url()).await;
    let d = w.start(no_dns());
    let (event_id, _) = w.publish().await;
    eventually(WAIT, "succeeded", || async { w.deliveries(&endpoint).await.iter().any(|d| d.status == "succeeded").then_some(()) }).await;

    let (status, list) = api.call("GET", &format!("/webhook-endpoints/{endpoint}/deliveries"), None).await;
    assert_eq!(status, 200, "{list}");
    let item = &list["data"][0];
    assert_eq!(item["event_id"], event_id.as_str());
    assert_eq!(item["event_type"], "video.ready");
    assert_eq!(item["status"], "succeeded");
    assert_eq!(item["attempt_count"], 2);
    let attempts = item["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0]["response_status"], 500);
    assert_eq!(attempts[0]["error_class"], "http");
    assert_eq!(attempts[0]["response_body"], "answer 500");
    assert!(attempts[0]["next_attempt_at"].is_string());
    assert!(attempts[0]["duration_ms"].is_number());
    assert!(attempts[0]["started_at"].is_string());
    assert_eq!(attempts[1]["response_status"], 200);
    assert!(attempts[1]["error_class"].is_null());

    let (status, filtered) = api.call("GET", &format!("/webhook-endpoints/{endpoint}/deliveries?status=failed"), None).await;
    assert_eq!(status, 200);
    assert!(filtered["data"].as_array().unwrap().is_empty());
    let (status, _) = api.call("GET", &format!("/webhook-endpoints/{endpoint}/deliveries?status=bogus"), None).await;
    assert_eq!(status, 400);
    let (status, _) = api.call("GET", &format!("/webhook-endpoints/{}/deliveries", EndpointId::generate()), None).await;
    assert_eq!(status, 404);

    // Resend a succeeded delivery: exactly one more attempt.
    let dlv = item["id"].as_str().unwrap();
    let (status, body) = api.call("POST", &format!("/webhook-endpoints/{endpoint}/deliveries/{dlv}:retry"), None).await;
    assert_eq!(status, 202, "{body}");
    eventually(WAIT, "third attempt", || async { (rx.received().len() == 3).then_some(()) }).await;
    // Recorded and at rest (succeeded, unleased): nothing more is sent, so
    // the receiver's log is final (no fixed sleep needed).
    let done = eventually(WAIT, "recorded", || async {
        w.deliveries(&endpoint).await.into_iter().find(|d| d.attempt_count == 3 && d.status == "succeeded" && d.at_rest())
    })
    .await;
    assert_eq!(done.next_attempt_at, None, "no attempt scheduled after the manual one");
    assert_eq!(rx.received().len(), 3, "sent once, not again");
    assert_eq!(rx.received()[2].id(), event_id.as_str());
    d.stop().await;
}

/// The manual attempt of a `failed` delivery is its last: it ends `failed`
/// even where the retry schedule would have had another step for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_retry_of_a_failed_delivery_is_a_single_attempt() {
    let mut w = World::new(&[]).await;
    let api = Api::start(&mut w).await;
    let rx = Receiver::always(500).await;
    let (endpoint, _) = register(&api, &rx.url()).await;
    let d = w.start(no_dns());
    w.publish().await;
    let dlv = eventually(WAIT, "failed", || async { w.deliveries(&endpoint).await.into_iter().find(|d| d.status == "failed") }).await;
    assert_eq!(dlv.attempt_count, 4);
    // A schedule with a step after attempt 5 ([1, 1, 2] → [1, 1, 2, 1, 1];
    // step n follows attempt n): without the one-shot mark, failed attempt 5
    // would be put back on it (pending, due ~1 s later) instead of ending `failed`.
    d.stop().await;
    let mut longer = w.settings.clone();
    longer.dispatcher.retry_schedule_seconds.extend([1, 1]);
    assert_eq!(longer.dispatcher.retry_schedule_seconds.len(), 5);
    let d = w.start_with(longer, no_dns(), None);
    let (status, _) = api.call("POST", &format!("/webhook-endpoints/{endpoint}/deliveries/{}:retry", dlv.id), None).await;
    assert_eq!(status, 202);
    // Failed and at rest (unleased): nothing more is sent, so the receiver's
    // log is final (no fixed sleep needed).
    let done = eventually(WAIT, "failed again after one attempt", || async {
        w.deliveries(&endpoint).await.into_iter().find(|d| d.status == "failed" && d.attempt_count == 5 && d.at_rest())
    })
    .await;
    assert_eq!(done.next_attempt_at, None, "no schedule after the manual attempt");
    assert_eq!(rx.received().len(), 5, "one extra attempt, no schedule after it");
    d.stop().await;
}

/// Two `:retry` calls at once on a finished delivery still mean one more
/// attempt, not a return to the retry schedule: the second call sees the
/// delivery already `pending` and must keep the first call's one-shot mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retries_are_still_a_single_attempt() {
    let mut w = World::new(&[]).await;
    let api = Api::start(&mut w).await;
    let rx = Receiver::always(500).await;
    let (endpoint, _) = register(&api, &rx.url()).await;
    let d = w.start(no_dns());
    w.publish().await;
    let dlv = eventually(WAIT, "failed", || async { w.deliveries(&endpoint).await.into_iter().find(|d| d.status == "failed") }).await;
    // No dispatcher while the two calls land, so neither is consumed before the other.
    d.stop().await;
    let path = format!("/webhook-endpoints/{endpoint}/deliveries/{}:retry", dlv.id);
    let ((s1, b1), (s2, b2)) = tokio::join!(api.call("POST", &path, None), api.call("POST", &path, None));
    assert_eq!((s1, s2), (202, 202), "{b1} {b2}");
    assert!(b1["status"] == "pending" && b2["status"] == "pending", "{b1} {b2}");
    let mut conn = w.conn().await;
    let manual: bool = {
        use diesel::prelude::*;
        use vid_db::schema::webhook_deliveries as dl;
        use vid_db::RunQueryDsl;
        dl::table.filter(dl::id.eq(dlv.id.as_str())).select(dl::manual_retry).first(&mut conn).await.unwrap()
    };
    assert!(manual, "both calls leave the one-shot mark");
    let d = w.start(no_dns());
    eventually(WAIT, "failed again after one attempt", || async {
        w.deliveries(&endpoint)
            .await
            .into_iter()
            .find(|x| x.id == dlv.id && x.status == "failed" && x.attempt_count == dlv.attempt_count + 1)
    })
    .await;
    d.stop().await;
}

/// `:enable` on an enabled endpoint changes nothing about it: a receiver's
/// `429`/`503` slow-down and the failure clock stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enabling_an_enabled_endpoint_keeps_its_throttling_and_failure_clock() {
    use diesel::prelude::*;
    use vid_db::schema::webhook_endpoints as ep;
    use vid_db::RunQueryDsl;
    let mut w = World::new(&[]).await;
    let api = Api::start(&mut w).await;
    let (endpoint, _) = register(&api, "http://127.0.0.1:9/unused").await;
    let until = chrono::Utc::now() + chrono::Duration::hours(1);
    let since = chrono::Utc::now() - chrono::Duration::hours(2);
    let mut conn = w.conn().await;
    diesel::update(ep::table.filter(ep::id.eq(&endpoint)))
        .set((
            ep::throttled_until.eq(Some(until)),
            ep::failing_since.eq(Some(since)),
            ep::consecutive_failures.eq(2),
            ep::concurrency_limit.eq(Some(2)),
        ))
        .execute(&mut conn)
        .await
        .unwrap();
    let (status, body) = api.call("POST", &format!("/webhook-endpoints/{endpoint}:enable"), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "enabled");
    assert_eq!(
        body["throttled_until"].as_str().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()).map(|t| t.timestamp()),
        Some(until.timestamp()),
        "the endpoint shows its throttling: {body}"
    );
    assert_eq!(body["concurrency_limit"], 2, "and its slowed-down concurrency: {body}");
    let (t, f, c): (Option<chrono::DateTime<chrono::Utc>>, Option<chrono::DateTime<chrono::Utc>>, i32) = ep::table
        .filter(ep::id.eq(&endpoint))
        .select((ep::throttled_until, ep::failing_since, ep::consecutive_failures))
        .first(&mut conn)
        .await
        .unwrap();
    assert_eq!(t.map(|t| t.timestamp_micros()), Some(until.timestamp_micros()), "throttling kept");
    assert_eq!(f.map(|t| t.timestamp_micros()), Some(since.timestamp_micros()), "failure clock kept");
    assert_eq!(c, 2);
}
