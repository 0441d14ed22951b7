//! `Idempotency-Key` on `POST /ingests` (issue 21 item 4; the rules of
//! `services/api/src/idempotency.rs`): the same key and body replay the
//! first `202` (the same operation, `Idempotent-Replayed: true`) and create
//! ONE upload, video, operation and ingest job; the same key with another
//! body is `422 idempotency_key_reused` and creates nothing; the key belongs
//! to its tenant. Real api in-process, real PostgreSQL and RabbitMQ; the
//! ingest jobs are read off their queue (no worker runs, nothing is fetched).

mod common;

use std::time::Duration;

use common::TestApi;
use diesel::prelude::*;
use lapin::options::BasicGetOptions;
use vid_core::ingest::IngestJob;
use vid_db::schema::{operations, outbox, uploads, videos};
use vid_db::RunQueryDsl;

impl common::Broker {
    /// Every message waiting in `queue` now (taken off it).
    async fn take<T: serde::de::DeserializeOwned>(&self, queue: &str) -> Vec<T> {
        let mut out = Vec::new();
        while let Some(m) = self.channel.basic_get(queue, BasicGetOptions { no_ack: true }).await.unwrap() {
            out.push(serde_json::from_slice(&m.delivery.data).unwrap());
        }
        out
    }
}

/// Every ingest job the api has published so far: waits (50 ms polls, up to
/// 30 s) until the outbox is empty (the relay deletes a row once the broker
/// confirmed its message), then takes the queue.
async fn published_jobs(api: &TestApi, broker: &common::Broker) -> Vec<IngestJob> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut conn = api.state.db.get().await.unwrap();
        let staged: i64 = outbox::table.count().get_result(&mut conn).await.unwrap();
        if staged == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{staged} outbox rows never published");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    broker.take(&broker.topology.ingest_jobs()).await
}

/// (uploads, videos, operations) rows, of every tenant.
async fn row_counts(api: &TestApi) -> (i64, i64, i64) {
    let mut conn = api.state.db.get().await.unwrap();
    let u = uploads::table.count().get_result(&mut conn).await.unwrap();
    let v = videos::table.count().get_result(&mut conn).await.unwrap();
    let o = operations::table.count().get_result(&mut conn).await.unwrap();
    (u, v, o)
}

/// `(status, Idempotent-Replayed, Location, body)` of `POST /ingests` with `Idempotency-Key: key`.
async fn post_ingest(url: &str, api_key: &str, key: &str, body: &serde_json::Value) -> (u16, bool, Option<String>, serde_json::Value) {
    let resp = reqwest::Client::new()
        .post(format!("{url}/ingests"))
        .bearer_auth(api_key)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let replayed = resp.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
    let location = resp.headers().get("location").map(|v| v.to_str().unwrap().to_owned());
    (status, replayed, location, resp.json().await.unwrap())
}

#[tokio::test]
async fn the_same_key_and_body_replay_one_ingest_and_another_body_is_refused() {
    let api = TestApi::start(&[("operations.janitor_interval_seconds", "3600")]).await;
    let broker = common::Broker::connect(&api).await;
    // Port 9 (discard) on loopback: the test profile allows it, and no worker runs to fetch it.
    let body = serde_json::json!({ "source_url": "http://127.0.0.1:9/clips/a.mp4", "filename": "a.mp4", "max_size_bytes": 4096 });

    let (status, replayed, location, first) = post_ingest(&api.url, &api.key, "ingest-1", &body).await;
    assert_eq!((status, replayed), (202, false), "{first}");
    let op = first["id"].as_str().expect("an operation id").to_owned();
    assert_eq!(location.as_deref(), Some(format!("/operations/{op}").as_str()));

    // The retry: the stored answer, the same operation and Location.
    let (status, replayed, again_location, again) = post_ingest(&api.url, &api.key, "ingest-1", &body).await;
    assert_eq!((status, replayed), (202, true), "{again}");
    assert_eq!(again["id"], first["id"]);
    assert_eq!(again_location, location);

    // One of everything: rows and jobs.
    assert_eq!(row_counts(&api).await, (1, 1, 1), "one upload, video and operation");
    let jobs = published_jobs(&api, &broker).await;
    assert_eq!(jobs.len(), 1, "one ingest job: {jobs:?}");
    assert_eq!((jobs[0].operation_id.as_str(), jobs[0].attempt, jobs[0].max_size_bytes), (op.as_str(), 1, 4096));
    assert_eq!(jobs[0].source_url, "http://127.0.0.1:9/clips/a.mp4");

    // The same key with another body (another limit): refused, nothing created, no job.
    let other = serde_json::json!({ "source_url": "http://127.0.0.1:9/clips/a.mp4", "filename": "a.mp4", "max_size_bytes": 8192 });
    let (status, replayed, _, refused) = post_ingest(&api.url, &api.key, "ingest-1", &other).await;
    assert_eq!((status, replayed, refused["code"].as_str()), (422, false, Some("idempotency_key_reused")), "{refused}");
    assert_eq!(row_counts(&api).await, (1, 1, 1), "a refused reuse creates nothing");
    assert!(published_jobs(&api, &broker).await.is_empty(), "a refused reuse queues no job");

    // The first body still replays the first answer after the refusal.
    let (status, replayed, _, third) = post_ingest(&api.url, &api.key, "ingest-1", &body).await;
    assert_eq!((status, replayed, &third["id"]), (202, true, &first["id"]));

    // A key belongs to its tenant: another tenant's same key and body is a new ingest of its own.
    let (_, other_key) = vid_api::auth::create_tenant(&api.state.db, "other").await.unwrap();
    let (status, replayed, _, theirs) = post_ingest(&api.url, &other_key, "ingest-1", &body).await;
    assert_eq!((status, replayed), (202, false), "{theirs}");
    assert_ne!(theirs["id"], first["id"]);
    assert_eq!(row_counts(&api).await, (2, 2, 2));
    let jobs = published_jobs(&api, &broker).await;
    assert_eq!(jobs.iter().map(|j| j.operation_id.as_str()).collect::<Vec<_>>(), vec![theirs["id"].as_str().unwrap()]);
}
