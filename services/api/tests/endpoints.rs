//! `POST`/`PATCH /webhook-endpoints`: input validation, atomic updates and
//! clearing fields with `null`. Real api in-process, real PostgreSQL.
//!
//! URLs are IP literals of a public address so that no DNS is involved.

mod common;

use common::{problem_code, TestApi};
use reqwest::Method;
use serde_json::{json, Value};
use vid_client::EndpointChanges;
use vid_core::endpoint::CreateEndpoint;
use vid_core::event::EventType;
use vid_core::EndpointId;

const URL_A: &str = "https://93.184.216.34/hooks/a";
const URL_B: &str = "https://93.184.216.35/hooks/b";

/// Sends `body` as JSON with the tenant's key; returns the status and the body.
/// Every error answer must be a problem with a `code`.
async fn send(api: &TestApi, method: Method, path: &str, body: Value) -> (u16, Value) {
    let resp =
        api.client().http().request(method.clone(), format!("{}{path}", api.url)).bearer_auth(&api.key).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    let content_type = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if status >= 400 {
        assert_eq!(content_type, "application/problem+json", "{method} {path}: {status} {body}");
        assert_eq!(body["status"], status, "{body}");
        assert!(body["code"].as_str().is_some_and(|c| !c.is_empty()), "{body}");
    }
    (status, body)
}

async fn create(api: &TestApi, body: Value) -> (u16, Value) {
    send(api, Method::POST, "/webhook-endpoints", body).await
}

async fn patch(api: &TestApi, id: &str, body: Value) -> (u16, Value) {
    send(api, Method::PATCH, &format!("/webhook-endpoints/{id}"), body).await
}

async fn get(api: &TestApi, id: &str) -> Value {
    let (status, body) = send(api, Method::GET, &format!("/webhook-endpoints/{id}"), Value::Null).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Creates an endpoint with `body` (must succeed); returns its id.
async fn created(api: &TestApi, body: Value) -> String {
    let (status, body) = create(api, body).await;
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().unwrap().to_owned()
}

async fn endpoint_count(api: &TestApi) -> usize {
    api.client().list_endpoints().await.unwrap().data.len()
}

#[tokio::test]
async fn control_and_bidi_characters_in_the_description_are_refused_on_create_and_update() {
    let api = TestApi::start(&[]).await;
    // Controls, and what misleads on display: bidi overrides/isolates,
    // zero-width characters, BOM, line and paragraph separators.
    for bad in [
        "a\u{0}b",
        "\u{0}",
        "bell\u{7}",
        "line\nbreak",
        "tab\there",
        "del\u{7f}",
        "c1\u{85}",
        "prod\u{202E}gnits",
        "x\u{2066}y",
        "a\u{200B}b",
        "\u{FEFF}a",
        "a\u{2028}b",
        "a\u{2029}b",
    ] {
        let (status, body) = create(&api, json!({ "url": URL_A, "description": bad })).await;
        assert_eq!((status, body["code"].as_str()), (422, Some("invalid_description")), "{bad:?}: {body}");
    }
    assert_eq!(endpoint_count(&api).await, 0, "nothing may have been created");

    let id = created(&api, json!({ "url": URL_A, "description": "fine — ünïcode is fine" })).await;
    for bad in ["a\u{0}b", "line\nbreak", "esc\u{1b}[31m"] {
        let (status, body) = patch(&api, &id, json!({ "description": bad })).await;
        assert_eq!((status, body["code"].as_str()), (422, Some("invalid_description")), "{bad:?}: {body}");
    }
    assert_eq!(get(&api, &id).await["description"], "fine — ünïcode is fine");

    // The length limit still holds (bytes, not characters).
    let (status, body) = create(&api, json!({ "url": URL_A, "description": "é".repeat(513) })).await;
    assert_eq!((status, body["code"].as_str()), (422, Some("invalid_description")), "{body}");
    let (status, body) = create(&api, json!({ "url": URL_A, "description": "é".repeat(512) })).await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test]
async fn a_control_character_in_the_url_is_refused_on_create_and_update() {
    let api = TestApi::start(&[]).await;
    let bad_urls = [
        "https://93.184.216.34/a\u{0}b".to_owned(),
        "https://93.184.216.34/a\nb".to_owned(),
        "https://93.184.216.34/a\u{7f}".to_owned(),
        "https://93.184.216.34\u{0}.example.com/".to_owned(),
        format!("{URL_A}\u{85}"),
    ];
    for bad in &bad_urls {
        let (status, body) = create(&api, json!({ "url": bad })).await;
        assert_eq!((status, body["code"].as_str()), (422, Some("invalid_url")), "{bad:?}: {body}");
    }
    assert_eq!(endpoint_count(&api).await, 0);
    let id = created(&api, json!({ "url": URL_A })).await;
    for bad in &bad_urls {
        let (status, body) = patch(&api, &id, json!({ "url": bad })).await;
        assert_eq!((status, body["code"].as_str()), (422, Some("invalid_url")), "{bad:?}: {body}");
    }
    assert_eq!(get(&api, &id).await["url"], URL_A);
}

#[tokio::test]
async fn a_refused_patch_changes_nothing() {
    let api = TestApi::start(&[]).await;
    let id = created(
        &api,
        json!({ "url": URL_A, "description": "old", "event_types": ["video.ready"], "signature_format": "webhook-signature" }),
    )
    .await;
    let before = get(&api, &id).await;
    let refused = [
        (json!({ "url": URL_B, "description": "new\u{0}" }), "invalid_description"),
        (json!({ "url": URL_B, "description": "x".repeat(1025) }), "invalid_description"),
        (json!({ "url": URL_B, "event_types": [] }), "invalid_event_types"),
        (json!({ "description": "new", "event_types": ["video.failed"], "url": "https://169.254.169.254/" }), "blocked_address"),
        (json!({ "description": "new", "signature_format": "standard-webhooks", "url": "ftp://93.184.216.35/" }), "scheme_not_allowed"),
        (
            json!({ "url": URL_B, "description": null, "event_types": null, "signature_format": "standard-webhooks", "extra": 1 }),
            "invalid_json",
        ),
    ];
    for (body, code) in refused {
        let (status, answer) = patch(&api, &id, body.clone()).await;
        assert_eq!(answer["code"], code, "{body}: {answer}");
        assert!(status == 422 || (code == "invalid_json" && status == 400), "{body}: {status} {answer}");
        assert_eq!(get(&api, &id).await, before, "{body} changed the endpoint");
    }
}

/// With `webhooks.allowed_ports` set (k8s/base: 443,80, what the dispatcher's
/// egress policy lets through), an endpoint on another port is refused at
/// registration and on update, instead of timing out at every delivery.
#[tokio::test]
async fn endpoint_ports_outside_allowed_ports_are_refused() {
    let api = TestApi::start(&[("webhooks.allowed_ports", "443,80")]).await;
    let (status, ok) = create(&api, json!({ "url": URL_A, "event_types": ["video.ready"] })).await;
    assert_eq!(status, 201, "{ok}");
    let (status, refused) = create(&api, json!({ "url": "https://93.184.216.34:8443/hooks", "event_types": ["video.ready"] })).await;
    assert_eq!((status, refused["code"].as_str()), (422, Some("port_not_allowed")), "{refused}");
    // The refused port is named (not the wording around it).
    assert!(refused["detail"].as_str().unwrap().contains("8443"), "{refused}");
    let id = ok["id"].as_str().unwrap();
    let (status, refused) = patch(&api, id, json!({ "url": "http://93.184.216.34:8080/" })).await;
    assert_eq!((status, refused["code"].as_str()), (422, Some("port_not_allowed")), "{refused}");
    assert_eq!(get(&api, id).await["url"], URL_A);
}

#[tokio::test]
async fn empty_event_types_are_refused_on_create_like_on_update() {
    let api = TestApi::start(&[]).await;
    let (status, body) = create(&api, json!({ "url": URL_A, "event_types": [] })).await;
    assert_eq!((status, body["code"].as_str()), (422, Some("invalid_event_types")), "{body}");
    // Through the typed client too.
    let err = api
        .client()
        .create_endpoint(&CreateEndpoint { url: URL_A.into(), description: None, event_types: Some(vec![]), signature_format: None })
        .await
        .unwrap_err();
    assert_eq!(problem_code(&err), "invalid_event_types");
    assert_eq!(endpoint_count(&api).await, 0);

    let id = created(&api, json!({ "url": URL_A })).await;
    let (status, body) = patch(&api, &id, json!({ "event_types": [] })).await;
    assert_eq!((status, body["code"].as_str()), (422, Some("invalid_event_types")), "{body}");
}

#[tokio::test]
async fn event_types_are_stored_once_each_in_the_order_given() {
    let api = TestApi::start(&[]).await;
    let (status, body) = create(
        &api,
        json!({ "url": URL_A, "event_types": ["video.failed", "video.ready", "video.failed", "video.failed", "video.ready"] }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["event_types"], json!(["video.failed", "video.ready"]));
    let id = body["id"].as_str().unwrap().to_owned();
    assert_eq!(get(&api, &id).await["event_types"], json!(["video.failed", "video.ready"]));

    let (status, body) =
        patch(&api, &id, json!({ "event_types": ["webhook_endpoint.disabled", "video.ready", "webhook_endpoint.disabled"] })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["event_types"], json!(["webhook_endpoint.disabled", "video.ready"]));
    assert_eq!(get(&api, &id).await["event_types"], json!(["webhook_endpoint.disabled", "video.ready"]));
}

#[tokio::test]
async fn patch_null_clears_and_absent_keeps() {
    let api = TestApi::start(&[]).await;
    let id = created(&api, json!({ "url": URL_A, "description": "mine", "event_types": ["video.ready", "video.failed"] })).await;

    // Absent keeps everything.
    let (status, body) = patch(&api, &id, json!({ "url": URL_B })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!((body["url"].as_str(), body["description"].as_str()), (Some(URL_B), Some("mine")));
    assert_eq!(body["event_types"], json!(["video.ready", "video.failed"]));
    let (status, body) = patch(&api, &id, json!({})).await;
    assert_eq!(status, 200, "{body}");
    let mut stored = get(&api, &id).await;
    stored.as_object_mut().unwrap().remove("health");
    assert_eq!(body, stored, "an empty PATCH changes nothing");

    // `event_types: null` → every type; the description stays.
    let (status, body) = patch(&api, &id, json!({ "event_types": null })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["event_types"], Value::Null);
    assert_eq!(body["description"], "mine");
    let stored = get(&api, &id).await;
    assert_eq!((stored["event_types"].clone(), stored["description"].clone()), (Value::Null, json!("mine")));

    // `description: null` → no description; the filter stays as it is.
    let (status, body) = patch(&api, &id, json!({ "event_types": ["video.cancelled"] })).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = patch(&api, &id, json!({ "description": null })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["description"], Value::Null);
    assert_eq!(body["event_types"], json!(["video.cancelled"]));
    let stored = get(&api, &id).await;
    assert_eq!((stored["description"].clone(), stored["event_types"].clone()), (Value::Null, json!(["video.cancelled"])));
    assert_eq!(stored["url"], URL_B);

    // Both at once, with a new description: set wins over nothing, null clears.
    let (status, body) = patch(&api, &id, json!({ "description": "again", "event_types": null })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!((body["description"].clone(), body["event_types"].clone()), (json!("again"), Value::Null));

    // `null` for a field that cannot be cleared keeps it, as before.
    let (status, body) = patch(&api, &id, json!({ "url": null, "signature_format": null })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!((body["url"].as_str(), body["signature_format"].as_str()), (Some(URL_B), Some("webhook-signature")));
}

#[tokio::test]
async fn the_client_clears_the_description_and_the_filter() {
    let api = TestApi::start(&[]).await;
    let client = api.client();
    let created = client
        .create_endpoint(&CreateEndpoint {
            url: URL_A.into(),
            description: Some("mine".into()),
            event_types: Some(vec![EventType::VideoReady, EventType::VideoReady]),
            signature_format: None,
        })
        .await
        .unwrap();
    assert_eq!(created.endpoint.event_types, Some(vec![EventType::VideoReady]));
    let id = created.endpoint.id;
    // Unset flags keep both.
    let e = client.update_endpoint(&id, &EndpointChanges { url: Some(URL_B), ..Default::default() }).await.unwrap();
    assert_eq!((e.url.as_str(), e.description.as_deref(), e.event_types.clone()), (URL_B, Some("mine"), Some(vec![EventType::VideoReady])));
    let e = client.update_endpoint(&id, &EndpointChanges { all_event_types: true, ..Default::default() }).await.unwrap();
    assert_eq!((e.description.as_deref(), e.event_types), (Some("mine"), None));
    let e = client.update_endpoint(&id, &EndpointChanges { clear_description: true, ..Default::default() }).await.unwrap();
    assert_eq!(e.description, None);
    let stored = client.get_endpoint(&id).await.unwrap().endpoint;
    assert_eq!((stored.url.as_str(), stored.description, stored.event_types), (URL_B, None, None));
}

#[tokio::test]
async fn patch_of_an_unknown_deleted_or_foreign_endpoint_is_not_found() {
    let api = TestApi::start(&[]).await;
    let id = created(&api, json!({ "url": URL_A })).await;
    let other = api.other_tenant().await;
    let typed: EndpointId = id.parse().unwrap();
    let err = other.update_endpoint(&typed, &EndpointChanges { url: Some(URL_B), ..Default::default() }).await.unwrap_err();
    assert_eq!(problem_code(&err), "not_found");
    assert_eq!(get(&api, &id).await["url"], URL_A);
    api.client().delete_endpoint(&typed).await.unwrap();
    let (status, body) = patch(&api, &id, json!({ "description": "x" })).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")), "{body}");
    let (status, body) = patch(&api, &EndpointId::generate().to_string(), json!({ "event_types": [EventType::VideoReady] })).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")), "{body}");
}

#[tokio::test]
async fn the_openapi_document_describes_the_rules() {
    let api = TestApi::start(&[]).await;
    let doc: Value = api.client().http().get(format!("{}/openapi.json", api.url)).send().await.unwrap().json().await.unwrap();
    let update = &doc["components"]["schemas"]["UpdateEndpoint"];
    let create_schema = &doc["components"]["schemas"]["CreateEndpoint"];
    // PATCH: every field optional, no other field, `null` allowed where it clears.
    assert_eq!(update["additionalProperties"], false, "{update}");
    assert!(update.get("required").is_none_or(|r| r.as_array().unwrap().is_empty()), "{update}");
    assert_eq!(update["properties"]["description"]["type"], json!(["string", "null"]), "{update}");
    assert_eq!(update["properties"]["event_types"]["type"], json!(["array", "null"]), "{update}");
    let id = created(&api, json!({ "url": URL_A })).await;
    for (schema, is_update) in [(create_schema, false), (update, true)] {
        let description = &schema["properties"]["description"];
        assert_eq!(description["maxLength"], 1024, "{schema}");
        assert_eq!(schema["properties"]["event_types"]["minItems"], 1, "{schema}");
        // The pattern is the api's rule: no control character.
        let pattern = regex::Regex::new(description["pattern"].as_str().unwrap()).unwrap();
        for (text, ok) in
            [("plain", true), ("ünïcode — ok", true), ("", true), ("a\u{0}", false), ("a\nb", false), ("\u{7f}", false), ("\u{9f}", false)]
        {
            assert_eq!(pattern.is_match(text), ok, "{text:?} vs {pattern}");
            let (status, body) = if is_update {
                patch(&api, &id, json!({ "description": text })).await
            } else {
                create(&api, json!({ "url": URL_A, "description": text })).await
            };
            assert_eq!(status < 300, ok, "{text:?}: {status} {body}");
        }
    }
}

/// The answers carrying a one-time signing secret (create, `:rotate-secret`)
/// are `Cache-Control: no-store`, so no cache keeps the secret; a plain GET is not.
#[tokio::test]
async fn answers_with_a_secret_are_no_store() {
    let api = TestApi::start(&[]).await;
    let http = api.client().http().clone();
    let post = |path: String, body: Value| http.post(format!("{}{path}", api.url)).bearer_auth(&api.key).json(&body).send();
    let resp = post("/webhook-endpoints".into(), json!({ "url": URL_A })).await.unwrap();
    assert_eq!(resp.status(), 201);
    assert_eq!(resp.headers().get("cache-control").and_then(|v| v.to_str().ok()), Some("no-store"), "create");
    let body: Value = resp.json().await.unwrap();
    assert!(body["secret"].as_str().is_some_and(|s| !s.is_empty()), "{body}");
    let id = body["id"].as_str().unwrap().to_owned();

    let resp = post(format!("/webhook-endpoints/{id}:rotate-secret"), Value::Null).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("cache-control").and_then(|v| v.to_str().ok()), Some("no-store"), "rotate-secret");
    let rotated: Value = resp.json().await.unwrap();
    assert!(rotated["secret"].as_str().is_some_and(|s| s != body["secret"]), "{rotated}");

    let resp = http.get(format!("{}/webhook-endpoints/{id}", api.url)).bearer_auth(&api.key).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_ne!(resp.headers().get("cache-control").and_then(|v| v.to_str().ok()), Some("no-store"), "GET shows no secret");
}
