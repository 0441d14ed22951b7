//! `Idempotency-Key` (services/api/src/idempotency.rs) against the real api,
//! PostgreSQL and Garage: a client that disconnects mid-request, answers that
//! are not stored, the in-progress lease, and the purge of expired keys.

mod common;

use std::time::{Duration, Instant};

use common::{problem_code, TestApi};
use diesel::prelude::*;
use diesel_async::SimpleAsyncConnection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vid_core::upload::{CreateUpload, UploadStatus};
use vid_db::schema::{idempotency_keys as ik, uploads};
use vid_db::RunQueryDsl;

fn req(size: u64) -> CreateUpload {
    CreateUpload { size_bytes: size, content_type: "video/mp4".into(), filename: Some("a.mp4".into()), ..Default::default() }
}

/// `(status, Idempotent-Replayed, body)` of a `POST` with an `Idempotency-Key`.
async fn post_with_key(api: &TestApi, path: &str, key: &str, body: Option<&serde_json::Value>) -> (u16, bool, serde_json::Value) {
    let mut r = api.client().http().post(format!("{}{path}", api.url)).bearer_auth(&api.key).header("Idempotency-Key", key);
    if let Some(b) = body {
        r = r.json(b);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let replayed = resp.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
    let text = resp.text().await.unwrap();
    (status, replayed, serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
}

/// The stored `response_status` of every row with this key (of any route and tenant).
async fn key_rows(api: &TestApi, key: &str) -> Vec<Option<i32>> {
    let mut conn = api.state.db.get().await.unwrap();
    ik::table.filter(ik::idempotency_key.eq(key)).select(ik::response_status).load(&mut conn).await.unwrap()
}

async fn upload_ids(api: &TestApi) -> Vec<vid_core::UploadId> {
    let mut conn = api.state.db.get().await.unwrap();
    uploads::table.select(uploads::id).order(uploads::id).load(&mut conn).await.unwrap()
}

/// Sends a whole `POST /uploads` (with `Idempotency-Key: key` if given) over
/// a raw connection and returns it unread: dropping it is the client going away.
async fn send_create_raw(api: &TestApi, key: Option<&str>) -> tokio::net::TcpStream {
    let body = serde_json::to_vec(&req(100)).unwrap();
    let addr = api.url.trim_start_matches("http://").to_owned();
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let key = key.map(|k| format!("Idempotency-Key: {k}\r\n")).unwrap_or_default();
    let head = format!(
        "POST /uploads HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n{key}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        api.key,
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&body).await.unwrap();
    tcp
}

/// Waits until a backend of this database waits on a lock: the request is
/// provably blocked on the lock the test holds.
async fn wait_for_a_lock_waiter(api: &TestApi, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut conn = api.state.db.get().await.unwrap();
        let waiting: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
            "(SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock')",
        ))
        .get_result(&mut conn)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "the request never reached {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The client goes away mid-request: it closes its side (FIN), then waits
/// until the server closes the connection without an answer, which is the
/// server dropping the request (`h1_allow_half_closed(false)` in `lib.rs`).
async fn disconnect(mut tcp: tokio::net::TcpStream) {
    tcp.shutdown().await.unwrap();
    let mut buf = [0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf)).await.expect("the server closes the connection");
    assert_eq!(read.unwrap(), 0, "no answer while the handler is blocked: {:?}", String::from_utf8_lossy(&buf));
}

/// The client sends `POST /uploads` with a key and closes its connection while
/// the handler is provably mid-way (blocked on its `INSERT INTO uploads` by a
/// table lock this test holds). The handler must still finish and store its
/// answer: the retry gets that answer (the same upload id), not
/// `409 idempotency_key_in_use`, and no second or orphan upload exists.
#[tokio::test]
async fn a_client_that_disconnects_mid_request_gets_the_original_answer_on_retry() {
    let api = TestApi::start(&[]).await;
    let mut blocker = api.state.db.get().await.unwrap();
    blocker.batch_execute("BEGIN; LOCK TABLE uploads IN EXCLUSIVE MODE").await.unwrap();

    let tcp = send_create_raw(&api, Some("k-drop")).await;
    // The key row is written before the handler starts; the handler cannot
    // finish while the lock is held (it inserts into `uploads`).
    let deadline = Instant::now() + Duration::from_secs(10);
    while key_rows(&api, "k-drop").await != vec![None] {
        assert!(Instant::now() < deadline, "the key row never appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for_a_lock_waiter(&api, "the uploads table lock").await;
    disconnect(tcp).await;
    blocker.batch_execute("ROLLBACK").await.unwrap();
    drop(blocker);

    // The retry: `409 idempotency_key_in_use` while the first run finishes, then its answer.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (status, replayed, created) = loop {
        let (status, replayed, body) = post_with_key(&api, "/uploads", "k-drop", Some(&serde_json::to_value(req(100)).unwrap())).await;
        if status != 409 || Instant::now() > deadline {
            break (status, replayed, body);
        }
        assert_eq!(body["code"], "idempotency_key_in_use", "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status, 201, "the retry gets the first run's answer: {created}");
    assert!(replayed, "the answer is the stored one");
    let ids = upload_ids(&api).await;
    assert_eq!(ids.len(), 1, "exactly one upload, the one the answer names: {ids:?}");
    assert_eq!(created["id"], ids[0].to_string());
    assert_eq!(key_rows(&api, "k-drop").await, vec![Some(201)]);
}

/// Without an `Idempotency-Key` too, a client that goes away does not cut the
/// work half-way: `POST /uploads` has already started the storage multipart
/// upload when it waits (here, on the tenant row this test locks), and a cut
/// there would leave that multipart upload with no row for the janitor to
/// expire and abort. The handler runs on, so the row appears.
#[tokio::test]
async fn without_a_key_a_client_that_disconnects_still_gets_its_work_finished() {
    let api = TestApi::start(&[]).await;
    let tenant = api.tenant_id().await;
    let mut blocker = api.state.db.get().await.unwrap();
    blocker.batch_execute(&format!("BEGIN; SELECT 1 FROM tenants WHERE id = '{tenant}' FOR UPDATE")).await.unwrap();

    let tcp = send_create_raw(&api, None).await;
    // The handler is provably mid-way once a backend waits on the row lock.
    wait_for_a_lock_waiter(&api, "the tenant row lock").await;
    disconnect(tcp).await;
    assert!(upload_ids(&api).await.is_empty(), "nothing is inserted while the lock is held");
    blocker.batch_execute("ROLLBACK").await.unwrap();
    drop(blocker);

    let deadline = Instant::now() + Duration::from_secs(10);
    while upload_ids(&api).await.is_empty() {
        assert!(Instant::now() < deadline, "the request was cut when its client went away: no upload row for its multipart upload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(upload_ids(&api).await.len(), 1);
}

/// `complete` with a key before every part is stored is `409 upload_incomplete`;
/// that answer is not stored, so the same key completes once the parts are in,
/// and then replays the `202`.
#[tokio::test]
async fn a_409_is_not_replayed_after_the_state_changed() {
    let api = TestApi::start(&[]).await;
    let client = api.client();
    let created = client.create_upload(&req(100), None).await.unwrap();
    let path = format!("/uploads/{}/complete", created.id);

    let (status, replayed, body) = post_with_key(&api, &path, "c-1", None).await;
    assert_eq!((status, replayed, body["code"].as_str()), (409, false, Some("upload_incomplete")), "{body}");
    assert!(key_rows(&api, "c-1").await.is_empty(), "a 409 releases the key");

    let part = &created.parts[0];
    let put = client.http().put(&part.url).body(vec![7u8; 100]).send().await.unwrap();
    assert!(put.status().is_success(), "{}", put.text().await.unwrap());

    let (status, replayed, first) = post_with_key(&api, &path, "c-1", None).await;
    assert_eq!((status, replayed), (202, false), "the retry runs again: {first}");
    let (status, replayed, again) = post_with_key(&api, &path, "c-1", None).await;
    assert_eq!((status, replayed), (202, true), "{again}");
    assert_eq!(again["id"], first["id"]);
    assert_eq!(client.get_upload(&created.id).await.unwrap().status, UploadStatus::Completed);
}

/// A `429` at the in-flight cap and a `422` refused by validation are not
/// stored: once a slot is free, the same key creates the upload.
#[tokio::test]
async fn a_429_or_422_is_not_replayed() {
    let api = TestApi::start(&[]).await;
    api.set_upload_cap(1).await;
    let client = api.client();

    let (status, _, body) = post_with_key(&api, "/uploads", "v-1", Some(&serde_json::to_value(req(0)).unwrap())).await;
    assert_eq!((status, body["code"].as_str()), (422, Some("invalid_size")), "{body}");
    assert!(key_rows(&api, "v-1").await.is_empty(), "a 422 releases the key");

    let first = client.create_upload(&req(10), None).await.unwrap();
    let err = client.create_upload(&req(10), Some("b-1")).await.unwrap_err();
    assert_eq!(err.problem().map(|p| p.status), Some(429), "{err}");
    assert!(key_rows(&api, "b-1").await.is_empty(), "a 429 releases the key");

    client.abort_upload(&first.id).await.unwrap();
    let second = client.create_upload(&req(10), Some("b-1")).await.expect("the same key runs again once a slot is free");
    assert_ne!(second.id, first.id);
    let replay = client.create_upload(&req(10), Some("b-1")).await.unwrap();
    assert_eq!(replay.id, second.id, "the 201 is stored and replayed");
}

/// Writes an in-progress row for `key` (as a run that is still running, or
/// whose process died) with the given lease end.
async fn in_progress_row(api: &TestApi, key: &str, body: &CreateUpload, locked_until: chrono::DateTime<chrono::Utc>) {
    let tenant = api.tenant_id().await;
    let mut conn = api.state.db.get().await.unwrap();
    diesel::insert_into(ik::table)
        .values((
            ik::tenant_id.eq(&tenant),
            ik::route.eq("POST /uploads"),
            ik::idempotency_key.eq(key),
            ik::request_hash.eq(vid_api::idempotency::request_hash(body)),
            ik::locked_until.eq(locked_until),
            ik::lock_token.eq("a-run-elsewhere"),
        ))
        .execute(&mut conn)
        .await
        .unwrap();
}

/// A key whose run holds a live lease is `409 idempotency_key_in_use`; once
/// the lease has ended (the run's process died without answering), a retry
/// with the same key and body takes it over, runs, and its answer is stored.
#[tokio::test]
async fn a_key_whose_lease_ended_is_taken_over_by_the_retry() {
    let api = TestApi::start(&[]).await;
    let client = api.client();
    let now = chrono::Utc::now();
    in_progress_row(&api, "live", &req(100), now + chrono::Duration::seconds(30)).await;
    in_progress_row(&api, "dead", &req(100), now - chrono::Duration::seconds(1)).await;

    let err = client.create_upload(&req(100), Some("live")).await.unwrap_err();
    assert_eq!(problem_code(&err), "idempotency_key_in_use");
    let err = client.create_upload(&req(200), Some("dead")).await.unwrap_err();
    assert_eq!(problem_code(&err), "idempotency_key_reused", "another body never takes a key over");

    let taken = client.create_upload(&req(100), Some("dead")).await.expect("a retry takes over a key whose lease ended");
    assert_eq!(key_rows(&api, "dead").await, vec![Some(201)]);
    let replay = client.create_upload(&req(100), Some("dead")).await.unwrap();
    assert_eq!(replay.id, taken.id);
    assert_eq!(upload_ids(&api).await, vec![taken.id]);
}

/// The janitor's purge deletes rows past the 24 h window, in batches, and
/// keeps younger ones (answered or running).
#[tokio::test]
async fn the_janitor_purges_expired_keys_and_keeps_fresh_ones() {
    let api = TestApi::start(&[]).await;
    let client = api.client();
    let fresh = client.create_upload(&req(100), Some("fresh")).await.unwrap();
    let tenant = api.tenant_id().await;
    let old = chrono::Utc::now() - chrono::Duration::hours(vid_api::idempotency::KEY_TTL_HOURS) - chrono::Duration::minutes(1);
    let almost = chrono::Utc::now() - chrono::Duration::hours(vid_api::idempotency::KEY_TTL_HOURS) + chrono::Duration::minutes(5);
    {
        // More than one batch of expired rows, and one just inside the window.
        let mut conn = api.state.db.get().await.unwrap();
        let rows: Vec<_> = (0..vid_api::idempotency::PURGE_BATCH + 500)
            .map(|i| {
                (
                    ik::tenant_id.eq(tenant.clone()),
                    ik::route.eq("POST /uploads"),
                    ik::idempotency_key.eq(format!("old-{i}")),
                    ik::request_hash.eq("h"),
                    ik::response_status.eq(Some(201)),
                    ik::response_body.eq(Some("{}")),
                    ik::created_at.eq(old),
                )
            })
            .collect();
        diesel::insert_into(ik::table).values(&rows).execute(&mut conn).await.unwrap();
        diesel::insert_into(ik::table)
            .values((
                ik::tenant_id.eq(&tenant),
                ik::route.eq("POST /uploads"),
                ik::idempotency_key.eq("almost"),
                ik::request_hash.eq("h"),
                ik::response_status.eq(Some(201)),
                ik::created_at.eq(almost),
            ))
            .execute(&mut conn)
            .await
            .unwrap();
    }

    vid_api::janitor::sweep(&api.state).await.unwrap();

    let mut conn = api.state.db.get().await.unwrap();
    let mut left: Vec<String> = ik::table.select(ik::idempotency_key).load(&mut conn).await.unwrap();
    left.sort();
    assert_eq!(left, vec!["almost".to_owned(), "fresh".to_owned()]);
    assert_eq!(vid_api::idempotency::purge_expired(&api.state.db).await.unwrap(), 0, "nothing left to purge");
    assert_eq!(client.create_upload(&req(100), Some("fresh")).await.unwrap().id, fresh.id, "a kept key still replays");
}
