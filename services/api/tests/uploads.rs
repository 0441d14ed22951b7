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
    CreateUpload { size_bytes: size, content_type: "video/mp4".into(), filename: Some("a.mp4".into()) }
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
        .key(vid_api::routes::uploads::source_key(&tenant_of(&api).await, &created.id))
        .send()
        .await
        .unwrap();
    let stored = obj.body.collect().await.unwrap().into_bytes();
    assert_eq!(stored.len() as u64, size);
    assert!(stored.as_ref() == bytes.as_slice());
}

async fn tenant_of(api: &TestApi) -> vid_core::TenantId {
    use diesel::prelude::*;
    use vid_db::RunQueryDsl;
    let mut conn = api.state.db.get().await.unwrap();
    vid_db::schema::api_keys::table
        .filter(vid_db::schema::api_keys::key_hash.eq(vid_api::auth::hash_key(&api.key)))
        .select(vid_db::schema::api_keys::tenant_id)
        .first(&mut conn)
        .await
        .unwrap()
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
    let api = TestApi::start(&[("uploads.target_part_size_bytes", "5242880"), ("uploads.part_url_ttl_seconds", "1")]).await;
    let client = api.client();
    let size = 5 * MIB + 10;
    let bytes = data(size);
    let created = client.create_upload(&req(size), None).await.unwrap();
    let (p1, p2) = (&created.parts[0], &created.parts[1]);
    assert_eq!(put(&client, p1, slice(&bytes, p1)).await.0, 200);
    tokio::time::sleep(Duration::from_millis(2500)).await;
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
        (CreateUpload { size_bytes: 10, content_type: "image/png".into(), filename: None }, "unsupported_content_type"),
    ];
    for (body, code) in cases {
        let err = client.create_upload(&body, None).await.unwrap_err();
        assert_eq!(problem_code(&err), code);
        assert_eq!(err.problem().unwrap().status, 422);
        assert_eq!(err.problem().unwrap().type_, format!("/problems/{code}"));
    }
    // Parameters and case in the media type are tolerated.
    client
        .create_upload(&CreateUpload { size_bytes: 10, content_type: "Video/MP4; codecs=avc1".into(), filename: None }, None)
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
    {
        use diesel::prelude::*;
        use vid_db::RunQueryDsl;
        let mut conn = api.state.db.get().await.unwrap();
        diesel::update(vid_db::schema::tenants::table)
            .set(vid_db::schema::tenants::max_uploads_in_flight.eq(Some(1)))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let client = api.client();
    client.create_upload(&req(10), None).await.unwrap();
    let err = client.create_upload(&req(10), None).await.unwrap_err();
    assert_eq!(problem_code(&err), "too_many_requests");
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
