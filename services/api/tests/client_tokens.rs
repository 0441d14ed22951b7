//! Client tokens and CORS (issue 21) against the real api, PostgreSQL and
//! Garage: the token of `POST /uploads` works for exactly its upload and the
//! operation it becomes, answers every other route and id as a stranger
//! would, stops at the upload's expiry and after the operation's terminal
//! state plus the grace period; preflights allow only the upload's
//! `cors_origin`; a malformed `cors_origin` is `422`.

mod common;

use common::TestApi;
use reqwest::header::HeaderMap;
use reqwest::Method;
use serde_json::{json, Value};

const ORIGIN: &str = "http://app.example.test:8080";

/// `(status, headers, body)` of `method path` with `Authorization: Bearer <bearer>` and an `Origin`.
async fn call(
    api: &TestApi,
    method: Method,
    path: &str,
    bearer: Option<&str>,
    origin: Option<&str>,
    body: Option<Value>,
) -> (u16, HeaderMap, Value) {
    let mut req = api.client().http().request(method, format!("{}{path}", api.url));
    if let Some(b) = bearer {
        req = req.bearer_auth(b);
    }
    if let Some(o) = origin {
        req = req.header("Origin", o);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap_or_default();
    (status, headers, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// A 1-byte upload created with the API key; the answer's JSON.
async fn create(api: &TestApi, cors_origin: Option<&str>) -> Value {
    let mut body = json!({"size_bytes": 1, "content_type": "video/mp4", "filename": "a.mp4"});
    if let Some(o) = cors_origin {
        body["cors_origin"] = json!(o);
    }
    let (status, _, created) = call(api, Method::POST, "/uploads", Some(&api.key), None, Some(body)).await;
    assert_eq!(status, 201, "{created}");
    created
}

/// PUTs the one byte of `created` and completes it with `token`; the operation id.
async fn put_and_complete(api: &TestApi, created: &Value, token: &str) -> String {
    let url = created["parts"][0]["url"].as_str().unwrap();
    let put = api.client().http().put(url).body(vec![0u8]).send().await.unwrap();
    assert_eq!(put.status().as_u16(), 200);
    let id = created["id"].as_str().unwrap();
    let (status, _, op) = call(api, Method::POST, &format!("/uploads/{id}/complete"), Some(token), None, None).await;
    assert_eq!(status, 202, "{op}");
    op["id"].as_str().unwrap().to_owned()
}

async fn sql(api: &TestApi, query: &str, id: &str) {
    use diesel::sql_types::Text;
    use vid_db::RunQueryDsl;
    let mut conn = api.state.db.get().await.unwrap();
    let n = diesel::sql_query(query).bind::<Text, _>(id).execute(&mut conn).await.unwrap();
    assert_eq!(n, 1, "{query}");
}

#[tokio::test]
async fn a_client_token_works_for_its_upload_and_operation_only() {
    let api = TestApi::start(&[]).await;
    let a = create(&api, None).await;
    let b = create(&api, None).await;
    let token = a["client_token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("vidu_") && token.len() == 48, "{token}");
    assert_ne!(token, b["client_token"].as_str().unwrap());
    let (a_id, b_id) = (a["id"].as_str().unwrap(), b["id"].as_str().unwrap());

    // Its own upload: GET and parts:sign.
    let (status, _, state) = call(&api, Method::GET, &format!("/uploads/{a_id}"), Some(&token), None, None).await;
    assert_eq!((status, state["missing_parts"].clone()), (200, json!([1])), "{state}");
    let (status, _, signed) =
        call(&api, Method::POST, &format!("/uploads/{a_id}/parts:sign"), Some(&token), None, Some(json!({"part_numbers": [1]}))).await;
    assert_eq!(status, 200, "{signed}");

    // Another upload of the same tenant: 404 with the body of an unknown id.
    let unknown = vid_core::UploadId::generate();
    let (_, _, stranger) = call(&api, Method::GET, &format!("/uploads/{unknown}"), Some(&api.key), None, None).await;
    for (method, path) in [
        (Method::GET, format!("/uploads/{b_id}")),
        (Method::POST, format!("/uploads/{b_id}/complete")),
        (Method::DELETE, format!("/uploads/{b_id}")),
        (Method::GET, format!("/uploads/{unknown}")),
    ] {
        let (status, _, body) = call(&api, method.clone(), &path, Some(&token), None, None).await;
        assert_eq!(status, 404, "{method} {path}: {body}");
        assert_eq!(body, stranger, "{method} {path}");
    }
    let (status, _, body) =
        call(&api, Method::POST, &format!("/uploads/{b_id}/parts:sign"), Some(&token), None, Some(json!({"part_numbers": [1]}))).await;
    assert_eq!((status, body["code"].clone()), (404, json!("not_found")), "{body}");

    // Every other route: 401, as without a key.
    let (_, _, no_key) = call(&api, Method::GET, "/videos", None, None, None).await;
    for (method, path) in [
        (Method::GET, "/videos".to_owned()),
        (Method::GET, "/operations".to_owned()),
        (Method::GET, "/events".to_owned()),
        (Method::GET, "/webhook-endpoints".to_owned()),
        (Method::POST, "/uploads".to_owned()),
    ] {
        let body = (method == Method::POST).then(|| json!({"size_bytes": 1, "content_type": "video/mp4"}));
        let (status, _, answer) = call(&api, method.clone(), &path, Some(&token), None, body).await;
        assert_eq!(status, 401, "{method} {path}: {answer}");
        assert_eq!(answer, no_key, "{method} {path}");
    }

    // Complete with the token; then follow the operation with it.
    let op = put_and_complete(&api, &a, &token).await;
    let (status, _, got) = call(&api, Method::GET, &format!("/operations/{op}"), Some(&token), None, None).await;
    assert_eq!((status, got["id"].clone()), (200, json!(op)), "{got}");
    let (status, _, waited) =
        call(&api, Method::POST, &format!("/operations/{op}:wait"), Some(&token), None, Some(json!({"timeout_seconds": 0}))).await;
    assert_eq!((status, waited["operation"]["id"].clone()), (200, json!(op)), "{waited}");
    let events = api.client().http().get(format!("{}/operations/{op}/events", api.url)).bearer_auth(&token).send().await.unwrap();
    assert_eq!(events.status().as_u16(), 200);
    assert!(events.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    drop(events);
    // Cancelling is not following: 401. Another operation: 404 as unknown.
    let (status, _, _) = call(&api, Method::POST, &format!("/operations/{op}:cancel"), Some(&token), None, None).await;
    assert_eq!(status, 401);
    let (other_op, _) = common::pending_operation(&api, &api.tenant_id().await).await;
    let (_, _, unknown_op) =
        call(&api, Method::GET, &format!("/operations/{}", vid_core::OperationId::generate()), Some(&api.key), None, None).await;
    for path in [format!("/operations/{other_op}"), format!("/operations/{other_op}/events")] {
        let (status, _, body) = call(&api, Method::GET, &path, Some(&token), None, None).await;
        assert_eq!((status, &body), (404, &unknown_op), "{path}");
    }
    // The API key still works on these routes.
    let (status, _, _) = call(&api, Method::GET, &format!("/operations/{op}"), Some(&api.key), None, None).await;
    assert_eq!(status, 200);
    // A token of another tenant's shape but unknown: 401.
    let (status, _, _) = call(&api, Method::GET, &format!("/uploads/{a_id}"), Some(&format!("vidu_{}", "A".repeat(43))), None, None).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn a_client_token_expires_with_its_upload_and_after_the_operation_plus_grace() {
    let api = TestApi::start(&[("uploads.client_token_grace_seconds", "600")]).await;
    // Expired upload: 401 everywhere, as an unknown token.
    let a = create(&api, None).await;
    let (a_id, a_token) = (a["id"].as_str().unwrap(), a["client_token"].as_str().unwrap());
    sql(&api, "UPDATE uploads SET expires_at = now() - interval '1 second' WHERE id = $1", a_id).await;
    for path in [format!("/uploads/{a_id}")] {
        let (status, _, body) = call(&api, Method::GET, &path, Some(a_token), None, None).await;
        assert_eq!((status, body["code"].clone()), (401, json!("unauthorized")), "{body}");
    }
    let (status, _, _) = call(&api, Method::DELETE, &format!("/uploads/{a_id}"), Some(a_token), None, None).await;
    assert_eq!(status, 401);
    // The API key still sees it (expired).
    let (status, _, state) = call(&api, Method::GET, &format!("/uploads/{a_id}"), Some(&api.key), None, None).await;
    assert_eq!((status, state["status"].clone()), (200, json!("expired")));

    // Completed: works past the upload's expiry while the operation runs, and
    // for the grace period after it is terminal; then 401.
    let b = create(&api, None).await;
    let (b_id, b_token) = (b["id"].as_str().unwrap(), b["client_token"].as_str().unwrap());
    let op = put_and_complete(&api, &b, b_token).await;
    sql(&api, "UPDATE uploads SET expires_at = now() - interval '1 second' WHERE id = $1", b_id).await;
    let (status, _, _) = call(&api, Method::GET, &format!("/operations/{op}"), Some(b_token), None, None).await;
    assert_eq!(status, 200, "a running operation is followed past the upload's expiry");
    sql(&api, "UPDATE operations SET status = 'failed', updated_at = now() - interval '9 minutes' WHERE id = $1", &op).await;
    let (status, _, got) = call(&api, Method::GET, &format!("/operations/{op}"), Some(b_token), None, None).await;
    assert_eq!((status, got["status"].clone()), (200, json!("failed")), "within the grace period");
    sql(&api, "UPDATE operations SET updated_at = now() - interval '11 minutes' WHERE id = $1", &op).await;
    for path in [format!("/operations/{op}"), format!("/uploads/{b_id}")] {
        let (status, _, body) = call(&api, Method::GET, &path, Some(b_token), None, None).await;
        assert_eq!((status, body["code"].clone()), (401, json!("unauthorized")), "{path}: {body}");
    }
}

#[tokio::test]
async fn preflights_allow_only_the_uploads_origin_and_answers_carry_it() {
    let api = TestApi::start(&[]).await;
    let a = create(&api, Some(ORIGIN)).await;
    let (a_id, token) = (a["id"].as_str().unwrap(), a["client_token"].as_str().unwrap());
    let preflight = |path: String, origin: &'static str, method: &'static str| {
        let http = api.client().http().clone();
        let url = format!("{}{path}", api.url);
        async move {
            let resp = http
                .request(Method::OPTIONS, url)
                .header("Origin", origin)
                .header("Access-Control-Request-Method", method)
                .header("Access-Control-Request-Headers", "authorization, content-type, idempotency-key")
                .send()
                .await
                .unwrap();
            (resp.status().as_u16(), resp.headers().clone())
        }
    };
    for (path, method, allowed) in [
        (format!("/uploads/{a_id}"), "GET", "GET, DELETE"),
        (format!("/uploads/{a_id}/parts:sign"), "POST", "POST"),
        (format!("/uploads/{a_id}/complete"), "POST", "POST"),
    ] {
        let (status, headers) = preflight(path.clone(), ORIGIN, method).await;
        assert_eq!(status, 204, "{path}");
        assert_eq!(headers["access-control-allow-origin"], ORIGIN, "{path}");
        assert_eq!(headers["access-control-allow-methods"], allowed, "{path}");
        let allow_headers = headers["access-control-allow-headers"].to_str().unwrap().to_ascii_lowercase();
        for h in ["authorization", "content-type", "idempotency-key"] {
            assert!(allow_headers.contains(h), "{path}: {allow_headers}");
        }
        assert!(headers.get_all("vary").iter().any(|v| v == "Origin"), "{path}");
        let (status, headers) = preflight(path.clone(), "http://evil.example.test", method).await;
        assert_eq!(status, 204, "{path}");
        assert!(headers.get("access-control-allow-origin").is_none(), "another origin gets no ACAO: {path}");
        assert!(headers.get("access-control-allow-methods").is_none(), "{path}");
    }
    // An upload without cors_origin, an unknown id, a route that is not a token route.
    let plain = create(&api, None).await;
    for path in [format!("/uploads/{}", plain["id"].as_str().unwrap()), format!("/uploads/{}", vid_core::UploadId::generate())] {
        let (status, headers) = preflight(path.clone(), ORIGIN, "GET").await;
        assert_eq!(status, 204);
        assert!(headers.get("access-control-allow-origin").is_none(), "{path}");
    }
    let (status, headers) = preflight("/videos".into(), ORIGIN, "GET").await;
    assert_eq!(status, 405, "not a token route: the usual 405");
    assert!(headers.get("access-control-allow-origin").is_none());

    // Actual answers: ACAO and Vary for the matching origin only.
    let (status, headers, _) = call(&api, Method::GET, &format!("/uploads/{a_id}"), Some(token), Some(ORIGIN), None).await;
    assert_eq!(status, 200);
    assert_eq!(headers["access-control-allow-origin"], ORIGIN);
    assert!(headers.get_all("vary").iter().any(|v| v == "Origin"));
    let (_, headers, _) = call(&api, Method::GET, &format!("/uploads/{a_id}"), Some(token), Some("http://evil.example.test"), None).await;
    assert!(headers.get("access-control-allow-origin").is_none());
    // The operation's routes allow the upload's origin once it is completed.
    let op = put_and_complete(&api, &a, token).await;
    for (path, method) in
        [(format!("/operations/{op}"), "GET"), (format!("/operations/{op}:wait"), "POST"), (format!("/operations/{op}/events"), "GET")]
    {
        let (status, headers) = preflight(path.clone(), ORIGIN, method).await;
        assert_eq!(
            (status, headers.get("access-control-allow-origin").map(|v| v.to_str().unwrap().to_owned())),
            (204, Some(ORIGIN.to_owned())),
            "{path}"
        );
    }
    let (_, headers, _) = call(&api, Method::GET, &format!("/operations/{op}"), Some(token), Some(ORIGIN), None).await;
    assert_eq!(headers["access-control-allow-origin"], ORIGIN);
}

#[tokio::test]
async fn a_malformed_cors_origin_is_422_and_nothing_is_created() {
    let api = TestApi::start(&[]).await;
    for bad in [
        "app.example.com",
        "https://app.example.com/",
        "https://app.example.com/upload",
        "ftp://x.example",
        "https://u:p@x.example",
        "*",
        "null",
        "https://x.example?a=1",
        "https://*.example.com",
        "http://x.example:0",
    ] {
        let (status, _, body) = call(
            &api,
            Method::POST,
            "/uploads",
            Some(&api.key),
            None,
            Some(json!({"size_bytes": 1, "content_type": "video/mp4", "cors_origin": bad})),
        )
        .await;
        assert_eq!((status, body["code"].clone()), (422, json!("invalid_cors_origin")), "{bad}: {body}");
    }
    use diesel::prelude::*;
    use vid_db::RunQueryDsl;
    let mut conn = api.state.db.get().await.unwrap();
    let n: i64 = vid_db::schema::uploads::table.count().get_result(&mut conn).await.unwrap();
    assert_eq!(n, 0, "a refused create leaves no upload");
    // A valid one is stored in its serialised form.
    let created = create(&api, Some("HTTP://App.Example.TEST:8080")).await;
    let stored: Option<String> = vid_db::schema::uploads::table
        .filter(vid_db::schema::uploads::id.eq(created["id"].as_str().unwrap()))
        .select(vid_db::schema::uploads::cors_origin)
        .first(&mut conn)
        .await
        .unwrap();
    assert_eq!(stored.as_deref(), Some(ORIGIN));
}

#[tokio::test]
async fn only_the_tokens_hash_is_stored_and_an_idempotent_replay_gets_a_new_token() {
    let api = TestApi::start(&[]).await;
    let body = json!({"size_bytes": 1, "content_type": "video/mp4"});
    let send = || {
        api.client().http().post(format!("{}/uploads", api.url)).bearer_auth(&api.key).header("Idempotency-Key", "k-21").json(&body).send()
    };
    let first: Value = send().await.unwrap().json().await.unwrap();
    let replay = send().await.unwrap();
    assert_eq!(replay.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap().to_owned()).as_deref(), Some("true"));
    let second: Value = replay.json().await.unwrap();
    assert_eq!(first["id"], second["id"]);
    let (t1, t2) = (first["client_token"].as_str().unwrap(), second["client_token"].as_str().unwrap());
    assert_ne!(t1, t2);
    for t in [t1, t2] {
        let (status, _, _) = call(&api, Method::GET, &format!("/uploads/{}", first["id"].as_str().unwrap()), Some(t), None, None).await;
        assert_eq!(status, 200);
    }
    use diesel::prelude::*;
    use vid_db::RunQueryDsl;
    let mut conn = api.state.db.get().await.unwrap();
    let stored: Vec<Option<String>> =
        vid_db::schema::idempotency_keys::table.select(vid_db::schema::idempotency_keys::response_body).load(&mut conn).await.unwrap();
    assert!(stored.iter().flatten().all(|b| !b.contains("vidu_")), "{stored:?}");
    let hashes: Vec<String> =
        vid_db::schema::upload_client_tokens::table.select(vid_db::schema::upload_client_tokens::token_hash).load(&mut conn).await.unwrap();
    assert_eq!(hashes.len(), 2);
    assert!(hashes.contains(&vid_api::auth::hash_key(t1)) && hashes.contains(&vid_api::auth::hash_key(t2)));
}

#[tokio::test]
async fn one_client_token_holds_at_most_its_own_watcher_slots() {
    let api = TestApi::start(&[("operations.max_watchers_per_client_token", "2")]).await;
    let a = create(&api, None).await;
    let token = a["client_token"].as_str().unwrap();
    let op = put_and_complete(&api, &a, token).await;
    let events = |bearer: String| {
        let req = api.client().http().get(format!("{}/operations/{op}/events", api.url)).bearer_auth(bearer);
        async move { req.send().await.unwrap() }
    };
    // The operation stays pending (no transcoder here): each stream holds its slot.
    let mut open = Vec::new();
    for _ in 0..2 {
        let resp = events(token.to_owned()).await;
        assert_eq!(resp.status().as_u16(), 200);
        open.push(resp);
    }
    let refused = events(token.to_owned()).await;
    assert_eq!(refused.status().as_u16(), 429);
    assert_eq!(refused.headers()["retry-after"], "5");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "too_many_watchers", "{body}");
    let (status, _, body) =
        call(&api, Method::POST, &format!("/operations/{op}:wait"), Some(token), None, Some(json!({"timeout_seconds": 1}))).await;
    assert_eq!((status, body["code"].clone()), (429, json!("too_many_watchers")), ":wait counts too: {body}");
    // The tenant's own key is not starved by its client token.
    let by_key = events(api.key.clone()).await;
    assert_eq!(by_key.status().as_u16(), 200, "the API key still watches");
    // A closed stream frees the token's slot (polled: the server notices the close).
    drop(open.pop());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let again = events(token.to_owned()).await;
        if again.status().as_u16() == 200 {
            break;
        }
        assert_eq!(again.status().as_u16(), 429);
        assert!(std::time::Instant::now() < deadline, "the dropped stream's slot was not freed");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn refusals_on_token_routes_carry_the_paths_cors_origin_and_every_answer_varies_on_origin() {
    let api = TestApi::start(&[]).await;
    let a = create(&api, Some(ORIGIN)).await;
    let b = create(&api, Some(ORIGIN)).await;
    let plain = create(&api, None).await;
    let (a_id, a_token) = (a["id"].as_str().unwrap(), a["client_token"].as_str().unwrap());
    let b_id = b["id"].as_str().unwrap();
    let varies = |h: &HeaderMap| h.get_all("vary").iter().any(|v| v.to_str().unwrap().contains("Origin"));
    // Another upload's id (which allows this origin): a typed 404 the page can read.
    let (status, headers, body) = call(&api, Method::GET, &format!("/uploads/{b_id}"), Some(a_token), Some(ORIGIN), None).await;
    assert_eq!((status, body["code"].clone()), (404, json!("not_found")), "{body}");
    assert_eq!(headers.get("access-control-allow-origin").map(|v| v.to_str().unwrap()), Some(ORIGIN));
    assert!(varies(&headers));
    // An upload without cors_origin, a foreign origin, an unknown id: no ACAO, but Vary.
    for (path, origin) in [
        (format!("/uploads/{}", plain["id"].as_str().unwrap()), ORIGIN),
        (format!("/uploads/{b_id}"), "http://evil.example.test"),
        (format!("/uploads/{}", vid_core::UploadId::generate()), ORIGIN),
    ] {
        let (status, headers, _) = call(&api, Method::GET, &path, Some(a_token), Some(origin), None).await;
        assert_eq!(status, 404, "{path}");
        assert!(headers.get("access-control-allow-origin").is_none(), "{path} from {origin}");
        assert!(varies(&headers), "{path}");
    }
    // Without Origin (a server): Vary all the same.
    let (status, headers, _) = call(&api, Method::GET, &format!("/uploads/{a_id}"), Some(&api.key), None, None).await;
    assert_eq!(status, 200);
    assert!(varies(&headers));
    // An expired token: a typed 401 with the path's origin.
    sql(&api, "UPDATE uploads SET expires_at = now() - interval '1 second' WHERE id = $1", a_id).await;
    let (status, headers, body) = call(&api, Method::GET, &format!("/uploads/{a_id}"), Some(a_token), Some(ORIGIN), None).await;
    assert_eq!((status, body["code"].clone()), (401, json!("unauthorized")), "{body}");
    assert_eq!(headers.get("access-control-allow-origin").map(|v| v.to_str().unwrap()), Some(ORIGIN));
    let (_, headers, _) = call(&api, Method::GET, &format!("/uploads/{a_id}"), Some(a_token), Some("http://evil.example.test"), None).await;
    assert!(headers.get("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn a_client_token_accepts_its_ids_in_any_case() {
    let api = TestApi::start(&[]).await;
    let a = create(&api, None).await;
    let (a_id, token) = (a["id"].as_str().unwrap(), a["client_token"].as_str().unwrap());
    let upper = |id: &str| {
        let (prefix, body) = id.split_once('_').unwrap();
        format!("{prefix}_{}", body.to_ascii_uppercase())
    };
    for bearer in [api.key.as_str(), token] {
        let (status, _, got) = call(&api, Method::GET, &format!("/uploads/{}", upper(a_id)), Some(bearer), None, None).await;
        assert_eq!((status, got["id"].clone()), (200, json!(a_id)), "{got}");
    }
    let op = put_and_complete(&api, &a, token).await;
    let (status, _, got) = call(&api, Method::GET, &format!("/operations/{}", upper(&op)), Some(token), None, None).await;
    assert_eq!((status, got["id"].clone()), (200, json!(op)), "{got}");
}
