//! The S3 multipart contract against real Garage and PostgreSQL (issue 3).

mod common;

use std::time::Duration;

use common::{problem_code, TestApi};
use vid_core::upload::{CompleteUpload, CompletedPart, CreateUpload, PartUrl, UploadStatus};

const MIB: u64 = 1024 * 1024;

fn data(size: u64) -> Vec<u8> {
    (0..size).map(|i| (i * 31 % 251) as u8).collect()
}

async fn put(client: &vid_client::Client, part: &PartUrl, bytes: &[u8]) -> (u16, String, String) {
    let resp = match client.http().put(&part.url).body(bytes.to_vec()).send().await {
        Ok(resp) => resp,
        // Storage may refuse and close the connection before reading the body.
        Err(e) => return (0, String::new(), e.to_string()),
    };
    let status = resp.status().as_u16();
    let etag = resp.headers().get("etag").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    (status, etag, resp.text().await.unwrap_or_default())
}

fn slice<'a>(all: &'a [u8], part: &PartUrl) -> &'a [u8] {
    &all[part.offset as usize..(part.offset + part.length) as usize]
}

fn req(size: u64) -> CreateUpload {
    CreateUpload { size_bytes: size, content_type: "video/mp4".into(), filename: Some("a.mp4".into()), ..Default::default() }
}

#[tokio::test]
async fn parts_sent_out_of_order_assemble_and_complete_twice_returns_the_same_operation() {
    let api = TestApi::start(&[("uploads.target_part_size_bytes", "5242880")]).await;
    let client = api.client();
    let size = 10 * MIB + 12345;
    let bytes = data(size);
    let created = client.create_upload(&req(size), None).await.unwrap();
    assert_eq!(created.parts.len(), 3);
    assert_eq!(created.part_size, 5 * MIB);
    assert_eq!(created.parts[2].length, 12345);
    let mut etags = Vec::new();
    for part in created.parts.iter().rev() {
        let (status, etag, body) = put(&client, part, slice(&bytes, part)).await;
        assert_eq!(status, 200, "{body}");
        etags.push(CompletedPart { part_number: part.part_number, etag: etag.trim_matches('"').to_owned() });
    }
    // ETags listed in reverse order and without quotes: both accepted.
    let body = CompleteUpload { parts: Some(etags) };
    let first = client.complete_upload(&created.id, Some(&body)).await.unwrap();
    assert_eq!(first.location, format!("/operations/{}", first.operation.id));
    let second = client.complete_upload(&created.id, None).await.unwrap();
    assert_eq!(second.operation.id, first.operation.id);
    assert_eq!(second.location, first.location);
    let state = client.get_upload(&created.id).await.unwrap();
    assert_eq!(state.status, UploadStatus::Completed);
    assert_eq!(state.operation_id.as_ref(), Some(&first.operation.id));
    // The assembled object is the file, byte for byte.
    let obj = api
        .state
        .s3
        .get_object()
        .bucket(&api.state.settings.s3.bucket)
        .key(vid_api::routes::uploads::source_key(&api.tenant_id().await, &created.id))
        .send()
        .await
        .unwrap();
    let stored = obj.body.collect().await.unwrap().into_bytes();
    assert_eq!(stored.len() as u64, size);
    assert!(stored.as_ref() == bytes.as_slice());
}

#[tokio::test]
async fn a_missing_part_is_named_and_resume_sends_only_the_rest() {
    let api = TestApi::start(&[("uploads.target_part_size_bytes", "5242880")]).await;
    let client = api.client();
    let size = 10 * MIB + 1;
    let bytes = data(size);
    let created = client.create_upload(&req(size), None).await.unwrap();
    let (p1, p3) = (&created.parts[0], &created.parts[2]);
    assert_eq!(put(&client, p1, slice(&bytes, p1)).await.0, 200);
    assert_eq!(put(&client, p3, slice(&bytes, p3)).await.0, 200);

    let err = client.complete_upload(&created.id, None).await.unwrap_err();
    assert_eq!(problem_code(&err), "upload_incomplete");
    assert_eq!(err.problem().unwrap().extensions["missing_parts"], serde_json::json!([2]));

    // Resume: the status names what storage holds and what is missing.
    let state = client.get_upload(&created.id).await.unwrap();
    assert_eq!(state.status, UploadStatus::Created);
    assert_eq!(state.parts.iter().map(|p| p.part_number).collect::<Vec<_>>(), vec![1, 3]);
    assert_eq!(state.missing_parts, vec![2]);
    let fresh = client.sign_parts(&created.id, &state.missing_parts).await.unwrap();
    assert_eq!(fresh.parts.len(), 1);
    let p2 = &fresh.parts[0];
    assert_eq!((p2.part_number, p2.offset, p2.length), (2, 5 * MIB, 5 * MIB));
    assert_eq!(put(&client, p2, slice(&bytes, p2)).await.0, 200);
    let accepted = client.complete_upload(&created.id, None).await.unwrap();
    assert!(accepted.location.starts_with("/operations/op_"));
}

#[tokio::test]
async fn storage_refuses_a_part_of_the_wrong_size_and_a_url_reused_for_another_part() {
    let api = TestApi::start(&[("uploads.target_part_size_bytes", "5242880")]).await;
    let client = api.client();
    let size = 10 * MIB;
    let bytes = data(size);
    let created = client.create_upload(&req(size), None).await.unwrap();
    let p1 = &created.parts[0];
    // The URL binds Content-Length: one byte short is refused by storage itself.
    let (status, _, body) = put(&client, p1, &slice(&bytes, p1)[1..]).await;
    assert!(status == 0 || (400..500).contains(&status), "short part accepted with {status}: {body}");
    // The URL binds the part number: rewriting it breaks the signature.
    let mut forged = p1.clone();
    forged.url = p1.url.replace("partNumber=1", "partNumber=2");
    assert_ne!(forged.url, p1.url);
    let (status, _, body) = put(&client, &forged, slice(&bytes, p1)).await;
    assert!(status == 0 || (400..500).contains(&status), "forged part number accepted with {status}: {body}");
    let state = client.get_upload(&created.id).await.unwrap();
    assert!(state.parts.is_empty(), "nothing may have been stored: {:?}", state.parts);
}

#[tokio::test]
async fn an_expired_url_is_refused_and_renewed_without_resending_other_parts() {
    // The URLs' validity starts at the signing time rounded down to the whole
    // second, so a 3 s TTL leaves at least 2 s for the PUTs that must succeed.
    let api = TestApi::start(&[("uploads.target_part_size_bytes", "5242880"), ("uploads.part_url_ttl_seconds", "3")]).await;
    let client = api.client();
    let size = 5 * MIB + 10;
    let bytes = data(size);
    let created = client.create_upload(&req(size), None).await.unwrap();
    let (p1, p2) = (&created.parts[0], &created.parts[1]);
    assert_eq!(put(&client, p1, slice(&bytes, p1)).await.0, 200);
    // Past p2's expiry: storage refuses it.
    let until = (p2.expires_at - chrono::Utc::now() + chrono::Duration::seconds(1)).to_std().unwrap_or_default();
    tokio::time::sleep(until).await;
    let (status, _, body) = put(&client, p2, slice(&bytes, p2)).await;
    assert!(status == 400 || status == 403, "expired URL answered {status}: {body}");
    let renewed = client.sign_parts(&created.id, &[2]).await.unwrap();
    assert_eq!(put(&client, &renewed.parts[0], slice(&bytes, p2)).await.0, 200);
    let state = client.get_upload(&created.id).await.unwrap();
    assert!(state.missing_parts.is_empty());
    client.complete_upload(&created.id, None).await.unwrap();
}

#[tokio::test]
async fn abort_then_complete_and_janitor_expiry() {
    let api = TestApi::start(&[("uploads.expire_after_seconds", "1")]).await;
    let client = api.client();
    let created = client.create_upload(&req(100), None).await.unwrap();
    client.abort_upload(&created.id).await.unwrap();
    client.abort_upload(&created.id).await.expect("abort is idempotent");
    assert_eq!(client.get_upload(&created.id).await.unwrap().status, UploadStatus::Aborted);
    assert_eq!(problem_code(&client.complete_upload(&created.id, None).await.unwrap_err()), "upload_aborted");

    let stale = client.create_upload(&req(100), None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (expired, _) = vid_api::janitor::sweep(&api.state).await.unwrap();
    assert!(expired >= 1);
    assert_eq!(client.get_upload(&stale.id).await.unwrap().status, UploadStatus::Expired);
    assert_eq!(problem_code(&client.complete_upload(&stale.id, None).await.unwrap_err()), "upload_expired");
    let err = client.sign_parts(&stale.id, &[1]).await.unwrap_err();
    assert_eq!(problem_code(&err), "upload_expired");
}

#[tokio::test]
async fn limits_and_bad_input_are_problem_details() {
    let api = TestApi::start(&[]).await;
    let client = api.client();
    let cases = [
        (req(0), "invalid_size"),
        (req(21474836480 + 1), "file_too_large"),
        (
            CreateUpload { size_bytes: 10, content_type: "image/png".into(), filename: None, ..Default::default() },
            "unsupported_content_type",
        ),
    ];
    for (body, code) in cases {
        let err = client.create_upload(&body, None).await.unwrap_err();
        assert_eq!(problem_code(&err), code);
        assert_eq!(err.problem().unwrap().status, 422);
        assert_eq!(err.problem().unwrap().type_, format!("/problems/{code}"));
    }
    // Parameters and case in the media type are tolerated.
    client
        .create_upload(
            &CreateUpload { size_bytes: 10, content_type: "Video/MP4; codecs=avc1".into(), filename: None, ..Default::default() },
            None,
        )
        .await
        .unwrap();
    // Malformed JSON, unknown fields, wrong types: 400 with a problem body.
    for raw in [
        r#"{"size_bytes": 10"#,
        r#"{"size_bytes":10,"content_type":"video/mp4","extra":1}"#,
        r#"{"size_bytes":"10","content_type":"video/mp4"}"#,
    ] {
        let resp = client
            .http()
            .post(format!("{}/uploads", api.url))
            .bearer_auth(&api.key)
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{raw}");
        assert_eq!(resp.headers()["content-type"], "application/problem+json");
        let p: vid_core::Problem = resp.json().await.unwrap();
        assert_eq!(p.code, "invalid_json");
    }
    // No key, or a wrong one: 401.
    let anon = vid_client::Client::new(&api.url, "vidk_nope");
    assert_eq!(problem_code(&anon.create_upload(&req(10), None).await.unwrap_err()), "unauthorized");
    let resp = client.http().get(format!("{}/operations", api.url)).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
}

#[tokio::test]
async fn another_tenants_upload_is_not_found() {
    let api = TestApi::start(&[]).await;
    let mine = api.client().create_upload(&req(10), None).await.unwrap();
    let other = api.other_tenant().await;
    for err in [
        other.get_upload(&mine.id).await.unwrap_err(),
        other.complete_upload(&mine.id, None).await.unwrap_err(),
        other.sign_parts(&mine.id, &[1]).await.unwrap_err(),
        other.abort_upload(&mine.id).await.unwrap_err(),
    ] {
        assert_eq!(problem_code(&err), "not_found");
    }
    assert_eq!(api.client().get_upload(&mine.id).await.unwrap().status, UploadStatus::Created);
}

#[tokio::test]
async fn an_in_flight_cap_refuses_with_429() {
    let api = TestApi::start(&[]).await;
    api.set_upload_cap(1).await;
    let client = api.client();
    client.create_upload(&req(10), None).await.unwrap();
    let err = client.create_upload(&req(10), None).await.unwrap_err();
    assert_eq!(problem_code(&err), "too_many_uploads");
}

#[tokio::test]
async fn idempotency_keys_replay_the_first_answer_and_refuse_another_body() {
    let api = TestApi::start(&[]).await;
    let client = api.client();
    let first = client.create_upload(&req(100), Some("key-1")).await.unwrap();
    let replay = client.create_upload(&req(100), Some("key-1")).await.unwrap();
    assert_eq!(replay.id, first.id, "the same key and body replay the first answer");
    assert_eq!(replay.parts, first.parts);
    let err = client.create_upload(&req(200), Some("key-1")).await.unwrap_err();
    assert_eq!(problem_code(&err), "idempotency_key_reused");
    assert_eq!(err.problem().unwrap().status, 422);
    // Another key is another upload; keys belong to their tenant.
    let other_key = client.create_upload(&req(100), Some("key-2")).await.unwrap();
    assert_ne!(other_key.id, first.id);
    let other_tenant = api.other_tenant().await.create_upload(&req(100), Some("key-1")).await.unwrap();
    assert_ne!(other_tenant.id, first.id);
    // A replayed answer says so.
    let resp = client
        .http()
        .post(format!("{}/uploads", api.url))
        .bearer_auth(&api.key)
        .header("Idempotency-Key", "key-1")
        .json(&req(100))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    assert_eq!(resp.headers()["idempotent-replayed"], "true");
    assert_eq!(resp.headers()["location"], format!("/uploads/{}", first.id).as_str());
}

// ---------------------------------------------------------------------------
// Review of the upload path: caps, races with DELETE, complete bodies, parts
// changed during complete, storage errors, expiry, config and filenames.
// ---------------------------------------------------------------------------

/// Creates an upload of `size` bytes and PUTs every part; returns it and the bytes.
async fn uploaded(client: &vid_client::Client, size: u64) -> (vid_core::upload::CreatedUpload, Vec<u8>) {
    let bytes = data(size);
    let created = client.create_upload(&req(size), None).await.unwrap();
    for part in &created.parts {
        let (status, _, body) = put(client, part, slice(&bytes, part)).await;
        assert_eq!(status, 200, "{body}");
    }
    (created, bytes)
}

/// A raw request: (status, headers, body as JSON or Null).
async fn raw(
    api: &TestApi,
    method: reqwest::Method,
    path: &str,
    content_type: Option<&str>,
    body: Option<&str>,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    let mut rq = api.client().http().request(method, format!("{}{path}", api.url)).bearer_auth(&api.key);
    if let Some(ct) = content_type {
        rq = rq.header("content-type", ct);
    }
    rq = match body {
        Some(b) => rq.body(b.to_owned()),
        None => rq.header("content-length", "0"),
    };
    let resp = rq.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    (status, headers, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
}

/// Waits until `n` sessions of the test database wait for a lock.
async fn wait_for_lock_waiters(api: &TestApi, n: i64) {
    use vid_db::RunQueryDsl;
    let mut conn = api.state.db.get().await.unwrap();
    for _ in 0..1000 {
        let waiting: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
            "(SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock')",
        ))
        .get_result(&mut conn)
        .await
        .unwrap();
        if waiting >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{n} session(s) never waited for a lock");
}

/// A connection holding an open transaction (`BEGIN` + `sql`), for ordering races.
async fn hold(api: &TestApi, sql: &str) -> vid_db::PooledConn {
    use diesel_async::SimpleAsyncConnection;
    let mut conn = api.state.db.get().await.unwrap();
    conn.batch_execute(&format!("BEGIN; {sql}")).await.unwrap();
    conn
}

/// Holds `sql`'s locks in an open transaction, starts `POST /uploads/{id}/complete`
/// and returns once it waits on them: the blocker (commit or roll back to let
/// it go on) and the pending complete.
async fn complete_behind(
    api: &TestApi,
    sql: &str,
    id: &vid_core::UploadId,
) -> (vid_db::PooledConn, tokio::task::JoinHandle<Result<vid_client::Accepted, vid_client::ClientError>>) {
    let blocker = hold(api, sql).await;
    let completing = tokio::spawn({
        let client = api.client();
        let id = id.clone();
        async move { client.complete_upload(&id, None).await }
    });
    wait_for_lock_waiters(api, 1).await;
    (blocker, completing)
}

async fn source_exists(api: &TestApi, upload: &vid_core::UploadId) -> bool {
    let key = vid_api::routes::uploads::source_key(&api.tenant_id().await, upload);
    match api.state.s3.head_object().bucket(&api.state.settings.s3.bucket).key(key).send().await {
        Ok(_) => true,
        Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => false,
        Err(e) => panic!("HeadObject: {e:?}"),
    }
}

async fn multipart_exists(api: &TestApi, upload: &vid_core::UploadId) -> bool {
    use aws_sdk_s3::error::ProvideErrorMetadata;
    use diesel::prelude::*;
    use vid_db::RunQueryDsl;
    let mut conn = api.state.db.get().await.unwrap();
    let (key, s3_id): (String, String) = vid_db::schema::uploads::table
        .filter(vid_db::schema::uploads::id.eq(upload))
        .select((vid_db::schema::uploads::storage_key, vid_db::schema::uploads::s3_upload_id))
        .first(&mut conn)
        .await
        .unwrap();
    match api.state.s3.list_parts().bucket(&api.state.settings.s3.bucket).key(key).upload_id(s3_id).send().await {
        Ok(_) => true,
        Err(e) if e.as_service_error().and_then(|s| s.code()) == Some("NoSuchUpload") => false,
        Err(e) => panic!("ListParts: {e:?}"),
    }
}

/// Fix 1: the cap holds under parallel creates, and the 429 says when to retry.
#[tokio::test]
async fn parallel_creates_never_exceed_the_in_flight_cap() {
    let api = TestApi::start(&[]).await;
    api.set_upload_cap(3).await;
    let body = serde_json::to_string(&req(100)).unwrap();
    let answers =
        futures::future::join_all((0..16).map(|_| raw(&api, reqwest::Method::POST, "/uploads", Some("application/json"), Some(&body))))
            .await;
    let created = answers.iter().filter(|(s, _, _)| *s == 201).count();
    assert_eq!(created, 3, "{:?}", answers.iter().map(|(s, _, b)| (s, b["code"].clone())).collect::<Vec<_>>());
    for (status, headers, problem) in answers.iter().filter(|(s, _, _)| *s != 201) {
        assert_eq!(*status, 429, "{problem}");
        assert_eq!(problem["code"], "too_many_uploads", "{problem}");
        assert_eq!(problem["limit"], 3, "{problem}");
        let retry_after: u64 = headers["retry-after"].to_str().unwrap().parse().expect("Retry-After is delay-seconds");
        assert!(retry_after >= 1, "{retry_after}");
    }
    // Aborting one frees a slot.
    let id: vid_core::UploadId = serde_json::from_value(answers.iter().find(|(s, _, _)| *s == 201).unwrap().2["id"].clone()).unwrap();
    api.client().abort_upload(&id).await.unwrap();
    api.client().create_upload(&req(100), None).await.unwrap();
}

/// Only a tenant with a cap serialises its creates on its row: while its row
/// is held `FOR NO KEY UPDATE` (what a capped create takes), a tenant without
/// a cap still creates at once; once a cap is set, a create waits for the row.
#[tokio::test]
async fn only_capped_tenants_serialise_their_creates() {
    use diesel_async::SimpleAsyncConnection;
    let api = TestApi::start(&[]).await;
    let tenant = api.tenant_id().await;
    let hold = format!("BEGIN; SELECT 1 FROM tenants WHERE id = '{tenant}' FOR NO KEY UPDATE");
    let mut blocker = api.state.db.get().await.unwrap();
    blocker.batch_execute(&hold).await.unwrap();
    let created = tokio::time::timeout(Duration::from_secs(10), api.client().create_upload(&req(100), None)).await;
    assert!(matches!(created, Ok(Ok(_))), "a tenant without a cap does not wait on its row: {created:?}");
    blocker.batch_execute("ROLLBACK").await.unwrap();

    api.set_upload_cap(5).await;
    blocker.batch_execute(&hold).await.unwrap();
    let waiting = tokio::spawn({
        let client = api.client();
        async move { client.create_upload(&req(100), None).await }
    });
    use vid_db::RunQueryDsl;
    // No fixed sleep: the create is seen waiting, as a backend blocked on a
    // lock (the tenant row this test holds), before it could finish.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        assert!(!waiting.is_finished(), "a capped tenant's create waits for the row it counts under");
        let mut conn = api.state.db.get().await.unwrap();
        let blocked: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
            "(SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock')",
        ))
        .get_result(&mut conn)
        .await
        .unwrap();
        if blocked > 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the capped create never reached the tenant row lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!waiting.is_finished(), "a capped tenant's create waits for the row it counts under");
    blocker.batch_execute("ROLLBACK").await.unwrap();
    waiting.await.unwrap().expect("and goes through once the row is free");
}

/// Fix 2a: complete wins (its transaction commits while DELETE waits): DELETE is 409.
#[tokio::test]
async fn delete_losing_to_complete_is_409_upload_completed() {
    let api = TestApi::start(&[]).await;
    let client = api.client();
    let (created, _) = uploaded(&client, 1000).await;
    let tenant = api.tenant_id().await;
    // Holding the tenant row stops complete's transaction at its video insert
    // (foreign key), after it claimed the upload row.
    let (mut blocker, completing) =
        complete_behind(&api, &format!("SELECT 1 FROM tenants WHERE id = '{tenant}' FOR UPDATE"), &created.id).await;
    let deleting = tokio::spawn({
        let client = api.client();
        let id = created.id.clone();
        async move { client.abort_upload(&id).await }
    });
    wait_for_lock_waiters(&api, 2).await;
    {
        use diesel_async::SimpleAsyncConnection;
        blocker.batch_execute("COMMIT").await.unwrap();
    }
    let accepted = completing.await.unwrap().expect("complete wins");
    let err = deleting.await.unwrap().expect_err("DELETE must not say 204 for an upload that completed");
    assert_eq!(problem_code(&err), "upload_completed");
    let detail = err.problem().unwrap().detail.clone().unwrap_or_default();
    assert!(!detail.contains("delete the video"), "no DELETE /videos exists: {detail}");
    let state = client.get_upload(&created.id).await.unwrap();
    assert_eq!(state.status, UploadStatus::Completed);
    assert_eq!(state.operation_id.as_ref(), Some(&accepted.operation.id));
    assert!(source_exists(&api, &created.id).await);
}

/// Fixes 2b and 2c: an abort landing while complete runs wins cleanly:
/// complete answers `upload_aborted` and no source object is left behind.
#[tokio::test]
async fn complete_losing_to_an_abort_is_upload_aborted_and_leaves_no_object() {
    let api = TestApi::start(&[]).await;
    let client = api.client();
    // Storage aborted too (2c), or not yet (2b: the DELETE's storage call is still on its way).
    for storage_aborted_too in [true, false] {
        let (created, _) = uploaded(&client, 1000).await;
        let (mut blocker, completing) =
            complete_behind(&api, &format!("SELECT 1 FROM uploads WHERE id = '{}' FOR UPDATE", created.id), &created.id).await;
        {
            use diesel_async::SimpleAsyncConnection;
            if storage_aborted_too {
                let tenant = api.tenant_id().await;
                let key = vid_api::routes::uploads::source_key(&tenant, &created.id);
                let s3_id: String = {
                    use diesel::prelude::*;
                    use vid_db::RunQueryDsl;
                    let mut conn = api.state.db.get().await.unwrap();
                    vid_db::schema::uploads::table
                        .filter(vid_db::schema::uploads::id.eq(&created.id))
                        .select(vid_db::schema::uploads::s3_upload_id)
                        .first(&mut conn)
                        .await
                        .unwrap()
                };
                vid_api::storage::abort_multipart(&api.state, &key, &s3_id).await.unwrap();
            }
            blocker.batch_execute(&format!("UPDATE uploads SET status = 'aborted' WHERE id = '{}'; COMMIT", created.id)).await.unwrap();
        }
        let err = completing.await.unwrap().expect_err("the abort won");
        assert_eq!(problem_code(&err), "upload_aborted", "storage aborted too: {storage_aborted_too}");
        assert_eq!(client.get_upload(&created.id).await.unwrap().status, UploadStatus::Aborted);
        assert!(
            !source_exists(&api, &created.id).await,
            "an aborted upload left its source object (storage aborted too: {storage_aborted_too})"
        );
        assert!(!multipart_exists(&api, &created.id).await || !storage_aborted_too);
    }
}

/// Fix 2: complete and DELETE sent together, at many offsets: the two answers
/// always agree with the final state, and an aborted upload leaves nothing in storage.
#[tokio::test]
async fn complete_and_delete_racing_always_agree() {
    let api = TestApi::start(&[]).await;
    let client = api.client();
    // How long one complete takes here, to spread DELETEs across it.
    let (probe, _) = uploaded(&client, 1000).await;
    let started = std::time::Instant::now();
    client.complete_upload(&probe.id, None).await.unwrap();
    let took = started.elapsed();
    let mut outcomes = std::collections::BTreeMap::new();
    for i in 0..24u32 {
        let (created, _) = uploaded(&client, 1000).await;
        let delay = took * i / 16;
        let (completed, deleted) = tokio::join!(client.complete_upload(&created.id, None), async {
            tokio::time::sleep(delay).await;
            client.abort_upload(&created.id).await
        });
        let status = client.get_upload(&created.id).await.unwrap().status;
        let key = (
            completed.as_ref().map(|_| "202".to_owned()).unwrap_or_else(problem_code),
            deleted.as_ref().map(|_| "204".to_owned()).unwrap_or_else(problem_code),
            format!("{status:?}"),
        );
        match (&key.0[..], &key.1[..], status) {
            ("202", "upload_completed", UploadStatus::Completed) => assert!(source_exists(&api, &created.id).await),
            ("upload_aborted", "204", UploadStatus::Aborted) => {
                assert!(!source_exists(&api, &created.id).await, "aborted upload {} left its source object", created.id)
            }
            _ => panic!("inconsistent outcome at delay {delay:?}: {key:?}"),
        }
        *outcomes.entry(key).or_insert(0) += 1;
    }
    eprintln!("complete took {took:?}; outcomes: {outcomes:?}");
}

/// Fix 3: a present but invalid complete body is refused; the upload is untouched.
#[tokio::test]
async fn a_malformed_complete_body_is_refused_and_changes_nothing() {
    let api = TestApi::start(&[("uploads.target_part_size_bytes", "5242880")]).await;
    let client = api.client();
    let (created, _) = uploaded(&client, 5 * MIB + 10).await;
    let path = format!("/uploads/{}/complete", created.id);
    let json = Some("application/json");
    let cases: [(Option<&str>, &str, u16, &str); 11] = [
        (json, r#"{"parts":[{"part_number":1,"etag":"x"}],"extra":1}"#, 400, "invalid_json"),
        (json, r#"{"parts":"all"}"#, 400, "invalid_json"),
        (json, r#"{"parts":[{"part_number":"1","etag":"x"}]}"#, 400, "invalid_json"),
        (json, r#"{"parts":["#, 400, "invalid_json"),
        (json, r#"[{"part_number":1,"etag":"x"},{"part_number":2,"etag":"y"}]"#, 400, "invalid_json"),
        (json, "not json", 400, "invalid_json"),
        (Some("text/plain"), r#"{"parts":[{"part_number":1,"etag":"x"}]}"#, 415, "unsupported_media_type"),
        (None, r#"{"parts":[{"part_number":1,"etag":"x"}]}"#, 415, "unsupported_media_type"),
        (json, r#"{"parts":[]}"#, 400, "invalid_parts"),
        (json, r#"{"parts":[{"part_number":1,"etag":"x"}]}"#, 400, "invalid_parts"),
        (
            json,
            r#"{"parts":[{"part_number":1,"etag":"x"},{"part_number":1,"etag":"x"},{"part_number":2,"etag":"y"}]}"#,
            400,
            "invalid_parts",
        ),
    ];
    for (ct, body, status, code) in cases {
        let (got, headers, problem) = raw(&api, reqwest::Method::POST, &path, ct, Some(body)).await;
        assert_eq!((got, problem["code"].as_str().unwrap_or("")), (status, code), "{ct:?} {body}: {problem}");
        assert_eq!(headers["content-type"], "application/problem+json", "{body}");
        assert_eq!(client.get_upload(&created.id).await.unwrap().status, UploadStatus::Created, "{body} changed the upload");
    }
    // Every part listed, with a wrong ETag: the ETag check runs.
    let (got, _, problem) =
        raw(&api, reqwest::Method::POST, &path, json, Some(r#"{"parts":[{"part_number":1,"etag":"x"},{"part_number":2,"etag":"y"}]}"#))
            .await;
    assert_eq!((got, problem["code"].as_str().unwrap()), (409, "etag_mismatch"), "{problem}");
    // No body at all (Content-Length: 0), `{}` or `null`: storage's own list is used.
    let (got, headers, op) = raw(&api, reqwest::Method::POST, &path, None, None).await;
    assert_eq!(got, 202, "{op}");
    assert_eq!(headers["location"].to_str().unwrap(), format!("/operations/{}", op["id"].as_str().unwrap()));
    for body in ["{}", "null"] {
        let (got, _, again) = raw(&api, reqwest::Method::POST, &path, json, Some(body)).await;
        assert_eq!((got, &again["id"]), (202, &op["id"]), "{body}: {again}");
    }
}

/// Fix 4: a part re-sent between complete's ListParts and its
/// CompleteMultipartUpload is a 409 naming the part, with no internals in the
/// answer, and the upload is `created` again so it can be checked and completed.
#[tokio::test]
async fn a_part_changed_during_complete_is_409_and_the_upload_recovers() {
    let api = TestApi::start(&[("uploads.target_part_size_bytes", "5242880")]).await;
    let client = api.client();
    let size = 5 * MIB + 1000;
    let (created, bytes) = uploaded(&client, size).await;
    let (mut blocker, completing) =
        complete_behind(&api, &format!("SELECT 1 FROM uploads WHERE id = '{}' FOR UPDATE", created.id), &created.id).await;
    let p2 = &created.parts[1];
    let changed: Vec<u8> = slice(&bytes, p2).iter().map(|b| b ^ 0xff).collect();
    assert_eq!(put(&client, p2, &changed).await.0, 200);
    {
        use diesel_async::SimpleAsyncConnection;
        blocker.batch_execute("COMMIT").await.unwrap();
    }
    let err = completing.await.unwrap().expect_err("storage refuses the stale part list");
    let problem = err.problem().unwrap_or_else(|| panic!("not a problem: {err}")).clone();
    assert_eq!((problem.status, problem.code.as_str()), (409, "etag_mismatch"), "{problem:?}");
    assert_eq!(problem.extensions["part_number"], 2, "{problem:?}");
    let detail = problem.detail.clone().unwrap_or_default();
    for internal in ["vid-media", "tenants/", "ten_", "InvalidPart", "Error", "ServiceError"] {
        assert!(!detail.contains(internal), "detail leaks {internal}: {detail}");
    }
    // The upload is usable again: status, parts, signing and completing all work.
    let state = client.get_upload(&created.id).await.unwrap();
    assert_eq!(state.status, UploadStatus::Created);
    assert_eq!(state.parts.iter().map(|p| p.part_number).collect::<Vec<_>>(), vec![1, 2]);
    assert!(state.missing_parts.is_empty());
    let fresh = client.sign_parts(&created.id, &[2]).await.unwrap();
    assert_eq!(put(&client, &fresh.parts[0], slice(&bytes, p2)).await.0, 200);
    client.complete_upload(&created.id, None).await.unwrap();
    assert_eq!(client.get_upload(&created.id).await.unwrap().status, UploadStatus::Completed);
}

/// Fix 4a: a storage failure is `503 unavailable` with a generic detail; the cause goes to the log.
#[tokio::test]
async fn storage_failures_are_503_without_internals() {
    let api = TestApi::start(&[("s3.bucket", "vid-no-such-bucket-for-tests")]).await;
    let (status, headers, problem) =
        raw(&api, reqwest::Method::POST, "/uploads", Some("application/json"), Some(&serde_json::to_string(&req(100)).unwrap())).await;
    assert_eq!((status, problem["code"].as_str().unwrap()), (503, "unavailable"), "{problem}");
    assert!(headers.contains_key("x-request-id"));
    let detail = problem["detail"].as_str().unwrap();
    for internal in ["vid-no-such-bucket", "tenants/", "upl_", "NoSuchBucket", "Error", "CreateMultipartUpload", "Response"] {
        assert!(!detail.contains(internal), "detail leaks {internal}: {detail}");
    }
}

/// Fix 4b: an upload stuck in `completing` (its complete died midway) is
/// expired by the janitor once past its expiry, and its multipart upload aborted.
#[tokio::test]
async fn the_janitor_expires_uploads_stuck_in_completing() {
    use diesel_async::SimpleAsyncConnection;
    let api = TestApi::start(&[]).await;
    let client = api.client();
    let (stuck, _) = uploaded(&client, 1000).await;
    let (busy, _) = uploaded(&client, 1000).await;
    let mut conn = api.state.db.get().await.unwrap();
    conn.batch_execute(&format!(
        "UPDATE uploads SET status = 'completing', expires_at = now() - interval '1 hour', updated_at = now() - interval '1 hour' WHERE id = '{}';
         UPDATE uploads SET status = 'completing', expires_at = now() - interval '1 second', updated_at = now() WHERE id = '{}'",
        stuck.id, busy.id
    ))
    .await
    .unwrap();
    drop(conn);
    let (expired, _) = vid_api::janitor::sweep(&api.state).await.unwrap();
    assert_eq!(expired, 1);
    assert_eq!(client.get_upload(&stuck.id).await.unwrap().status, UploadStatus::Expired);
    assert!(!multipart_exists(&api, &stuck.id).await, "the stuck multipart upload was not aborted");
    // One whose complete is still running (marked `completing` just now) is left alone.
    assert_eq!(client.get_upload(&busy.id).await.unwrap().status, UploadStatus::Completing);
    assert!(multipart_exists(&api, &busy.id).await);
}

/// Fix 5: with the default configuration the api refuses at `POST /uploads`
/// what the transcoder's malware scan would refuse after the upload.
#[tokio::test]
async fn the_default_config_refuses_what_the_scanner_cannot_scan() {
    #[derive(serde::Deserialize)]
    struct Limits {
        uploads: UploadLimits,
        scanner: ScanLimits,
    }
    #[derive(serde::Deserialize)]
    struct UploadLimits {
        max_size_bytes: u64,
    }
    #[derive(serde::Deserialize)]
    struct ScanLimits {
        enabled: bool,
        stream_max_length_bytes: u64,
    }
    let limits: Limits = vid_testkit::settings(&[]);
    assert!(limits.scanner.enabled);
    assert!(
        limits.uploads.max_size_bytes <= limits.scanner.stream_max_length_bytes,
        "uploads.max_size_bytes {} > scanner.stream_max_length_bytes {}",
        limits.uploads.max_size_bytes,
        limits.scanner.stream_max_length_bytes
    );
    let api = TestApi::start(&[]).await;
    let client = api.client();
    let err = client.create_upload(&req(210 * MIB), None).await.unwrap_err();
    assert_eq!(problem_code(&err), "file_too_large");
    client.create_upload(&req(limits.scanner.stream_max_length_bytes), None).await.unwrap();
}

/// Fix 6: the OpenAPI document says what the api does.
#[tokio::test]
async fn openapi_describes_the_upload_contract() {
    let doc = vid_api::openapi::document();
    let schemas = &doc["components"]["schemas"];
    for (schema, field) in
        [("CreateUpload", "size_bytes"), ("PartUrl", "part_number"), ("StoredPart", "part_number"), ("CompletedPart", "part_number")]
    {
        assert_eq!(schemas[schema]["properties"][field]["minimum"], 1, "{schema}.{field}");
    }
    for (schema, field) in [("SignParts", "part_numbers"), ("UploadState", "missing_parts")] {
        assert_eq!(schemas[schema]["properties"][field]["items"]["minimum"], 1, "{schema}.{field}");
    }
    let created = schemas["CreatedUpload"]["properties"]["expires_at"]["description"].as_str().unwrap();
    let state = schemas["UploadState"]["properties"]["expires_at"]["description"].as_str().unwrap();
    assert!(created.contains("part URL") && created.contains("not the upload"), "{created}");
    assert!(state.contains("the upload itself") && state.contains("not"), "{state}");
    let text = serde_json::to_string(&doc["paths"]).unwrap() + &serde_json::to_string(&doc["components"]["responses"]).unwrap();
    for gone in ["storage_unavailable", "`too_many_requests`", "delete the video"] {
        assert!(!text.contains(gone), "the document still names {gone}");
    }
    for code in ["too_many_uploads", "invalid_filename", "invalid_parts", "upload_completing"] {
        assert!(text.contains(code), "the document does not name {code}");
    }
    let complete = &doc["paths"]["/uploads/{id}/complete"]["post"]["responses"];
    for status in ["413", "415"] {
        assert!(complete.get(status).is_some(), "complete does not document {status}");
    }
}

/// Fix 6: a part URL's `expires_at` is exactly when its signature expires
/// (X-Amz-Date + X-Amz-Expires), never later, so storage accepts it until then.
#[tokio::test]
async fn part_url_expiry_is_the_signature_expiry() {
    let api = TestApi::start(&[("uploads.target_part_size_bytes", "5242880"), ("uploads.part_url_ttl_seconds", "10")]).await;
    let client = api.client();
    let size = 5 * MIB + 10;
    let bytes = data(size);
    let created = client.create_upload(&req(size), None).await.unwrap();
    let signed_until = |part: &PartUrl| {
        let url = reqwest::Url::parse(&part.url).unwrap();
        let q: std::collections::HashMap<_, _> = url.query_pairs().into_owned().collect();
        let date = chrono::NaiveDateTime::parse_from_str(&q["X-Amz-Date"], "%Y%m%dT%H%M%SZ").unwrap().and_utc();
        date + chrono::Duration::seconds(q["X-Amz-Expires"].parse().unwrap())
    };
    for part in &created.parts {
        assert_eq!(part.expires_at, signed_until(part), "part {}", part.part_number);
    }
    assert_eq!(created.expires_at, created.parts.iter().map(|p| p.expires_at).min().unwrap());
    let renewed = client.sign_parts(&created.id, &[1]).await.unwrap();
    assert_eq!(renewed.parts[0].expires_at, signed_until(&renewed.parts[0]));
    // Storage takes the part shortly before the claimed expiry (2 s of slack
    // for a loaded machine; the equalities above pin the exact instant).
    let p2 = &created.parts[1];
    let until = (p2.expires_at - chrono::Utc::now() - chrono::Duration::seconds(2)).to_std().unwrap_or_default();
    tokio::time::sleep(until).await;
    let (status, _, body) = put(&client, p2, slice(&bytes, p2)).await;
    assert_eq!(status, 200, "refused before the claimed expiry: {body}");
}

/// Fix 6: past the upload's `expires_at`, signing and completing answer
/// `upload_expired` at once, without waiting for the janitor.
#[tokio::test]
async fn sign_and_complete_past_the_upload_expiry_are_upload_expired() {
    let api = TestApi::start(&[("uploads.expire_after_seconds", "2")]).await;
    let client = api.client();
    let (created, _) = uploaded(&client, 1000).await;
    let state = client.get_upload(&created.id).await.unwrap();
    let until = (state.expires_at - chrono::Utc::now() + chrono::Duration::milliseconds(100)).to_std().unwrap_or_default();
    tokio::time::sleep(until).await;
    assert_eq!(problem_code(&client.sign_parts(&created.id, &[1]).await.unwrap_err()), "upload_expired");
    assert_eq!(problem_code(&client.complete_upload(&created.id, None).await.unwrap_err()), "upload_expired");
    assert_eq!(client.get_upload(&created.id).await.unwrap().status, UploadStatus::Expired);
    // The janitor then aborts it in storage; DELETE stays a 204.
    vid_api::janitor::sweep(&api.state).await.unwrap();
    assert!(!multipart_exists(&api, &created.id).await);
    client.abort_upload(&created.id).await.unwrap();
}

/// Fix 7: Unicode format characters (category Cf: bidi overrides, zero-width
/// characters) and line separators are refused in filenames like control characters.
#[tokio::test]
async fn filenames_with_format_characters_are_refused() {
    let api = TestApi::start(&[]).await;
    let client = api.client();
    for name in ["clip\u{202E}4pm.exe", "a\u{200B}b.mp4", "\u{FEFF}x.mp4", "a\u{2066}b.mp4", "a\u{2028}b.mp4", "a\u{7}b.mp4"] {
        let body = CreateUpload { size_bytes: 10, content_type: "video/mp4".into(), filename: Some(name.into()), ..Default::default() };
        let err = client.create_upload(&body, None).await.unwrap_err();
        assert_eq!(problem_code(&err), "invalid_filename", "{name:?}");
        assert_eq!(err.problem().unwrap().status, 422);
    }
    for name in ["clip é 日本.mp4", "🎬 take 2.mp4", "مرحبا.mp4"] {
        let body = CreateUpload { size_bytes: 10, content_type: "video/mp4".into(), filename: Some(name.into()), ..Default::default() };
        client.create_upload(&body, None).await.unwrap_or_else(|e| panic!("{name:?}: {e}"));
    }
}
