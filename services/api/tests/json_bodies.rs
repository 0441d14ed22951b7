//! Every JSON body of the api is an object: serde alone reads a struct from a
//! JSON array too (its sequence visitor fills the fields by position), so
//! `["http://…"]` would pass as `{"source_url": "http://…"}`. Each route that
//! takes a JSON body answers any non-object (array, string, number, boolean;
//! `null` too, except on `complete`, where it means "no part list") with
//! `400 invalid_json`, before it looks at anything else (the ids below name
//! nothing: the body is refused first).

mod common;

use common::TestApi;

#[tokio::test]
async fn every_json_route_refuses_a_body_that_is_not_an_object() {
    let api = TestApi::start(&[]).await;
    let http = reqwest::Client::new();
    let op = vid_core::OperationId::generate();
    let upload = vid_core::UploadId::generate();
    let video = vid_core::VideoId::generate();
    // Each array is what serde would take positionally for the route's struct.
    let routes: Vec<(reqwest::Method, String, &str)> = vec![
        (reqwest::Method::POST, "/uploads".into(), r#"["clip.mp4", "video/mp4", 1000]"#),
        (reqwest::Method::POST, "/ingests".into(), r#"["http://127.0.0.1:9/clip.mp4"]"#),
        (reqwest::Method::POST, "/webhook-endpoints".into(), r#"["https://hooks.example.com/in"]"#),
        (reqwest::Method::PATCH, format!("/webhook-endpoints/{}", vid_core::EndpointId::generate()), "[]"),
        (reqwest::Method::POST, format!("/uploads/{upload}/parts:sign"), "[[1]]"),
        (reqwest::Method::POST, format!("/uploads/{upload}/complete"), "[[]]"),
        (reqwest::Method::POST, format!("/videos/{video}/playback-ids"), r#"["public"]"#),
        (reqwest::Method::POST, format!("/operations/{op}:wait"), "[0]"),
    ];
    for (method, path, array) in &routes {
        let mut bodies = vec![*array, r#""text""#, "7", "true"];
        if !path.ends_with("/complete") {
            bodies.push("null");
        }
        for body in bodies {
            let resp = http
                .request(method.clone(), format!("{}{path}", api.url))
                .bearer_auth(&api.key)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            assert_eq!(resp.headers()["content-type"], "application/problem+json", "{method} {path} {body}");
            let problem: serde_json::Value = resp.json().await.unwrap();
            assert_eq!((status, problem["code"].as_str()), (400, Some("invalid_json")), "{method} {path} {body}: {problem}");
            let detail = problem["detail"].as_str().unwrap_or_default();
            assert!(detail.contains("must be a JSON object"), "{method} {path} {body}: {detail}");
        }
    }
    // Nothing was created by any of them.
    let listed: serde_json::Value =
        http.get(format!("{}/operations", api.url)).bearer_auth(&api.key).send().await.unwrap().json().await.unwrap();
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(0), "{listed}");
    // An object is still read, and its errors keep their codes.
    let resp = http
        .post(format!("{}/ingests", api.url))
        .bearer_auth(&api.key)
        .header("content-type", "application/json")
        .body(r#"{"source_url": "http://10.0.0.1/clip.mp4"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 422);
    let problem: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(problem["code"], "blocked_address", "{problem}");
    // Malformed JSON and another media type keep theirs.
    let resp = http
        .post(format!("{}/uploads", api.url))
        .bearer_auth(&api.key)
        .header("content-type", "application/json")
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let resp = http
        .post(format!("{}/uploads", api.url))
        .bearer_auth(&api.key)
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 415);
}

/// A key given twice is refused (`400 invalid_json`, "duplicate field"), on
/// every JSON route: the body is read from its text, never through a map
/// that keeps the last value (a gateway reading the first would see another
/// request). And `:wait`, which reads its optional body itself, keeps the
/// JSON media-type rule of every JSON route (`415` for `text/plain`).
#[tokio::test]
async fn every_json_route_refuses_a_duplicate_key_and_wait_keeps_the_media_type_rule() {
    let api = TestApi::start(&[]).await;
    let http = reqwest::Client::new();
    let op = vid_core::OperationId::generate();
    let upload = vid_core::UploadId::generate();
    let video = vid_core::VideoId::generate();
    let routes: Vec<(reqwest::Method, String, &str)> = vec![
        (reqwest::Method::POST, "/uploads".into(), r#"{"size_bytes": 1000, "content_type": "video/mp4", "size_bytes": 2000}"#),
        (reqwest::Method::POST, "/ingests".into(), r#"{"source_url": "http://10.0.0.1/x", "source_url": "http://127.0.0.1:9/clip.mp4"}"#),
        (reqwest::Method::POST, "/webhook-endpoints".into(), r#"{"url": "https://a.example.test/in", "url": "https://b.example.test/in"}"#),
        (
            reqwest::Method::PATCH,
            format!("/webhook-endpoints/{}", vid_core::EndpointId::generate()),
            r#"{"url": "https://a.example.test/in", "url": "https://b.example.test/in"}"#,
        ),
        (reqwest::Method::POST, format!("/uploads/{upload}/parts:sign"), r#"{"part_numbers": [1], "part_numbers": [2]}"#),
        (reqwest::Method::POST, format!("/uploads/{upload}/complete"), r#"{"parts": [], "parts": []}"#),
        (reqwest::Method::POST, format!("/videos/{video}/playback-ids"), r#"{"policy": "public", "policy": "signed"}"#),
        (reqwest::Method::POST, format!("/operations/{op}:wait"), r#"{"timeout_seconds": 1, "timeout_seconds": 2}"#),
    ];
    for (method, path, body) in &routes {
        let resp = http
            .request(method.clone(), format!("{}{path}", api.url))
            .bearer_auth(&api.key)
            .header("content-type", "application/json")
            .body(*body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let problem: serde_json::Value = resp.json().await.unwrap();
        assert_eq!((status, problem["code"].as_str()), (400, Some("invalid_json")), "{method} {path} {body}: {problem}");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("duplicate field"), "{method} {path} {body}: {detail}");
    }
    let wait = format!("{}/operations/{op}:wait", api.url);
    for content_type in ["text/plain", "application/x-www-form-urlencoded"] {
        let resp = http
            .post(&wait)
            .bearer_auth(&api.key)
            .header("content-type", content_type)
            .body(r#"{"timeout_seconds": 1}"#)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let problem: serde_json::Value = resp.json().await.unwrap();
        assert_eq!((status, problem["code"].as_str()), (415, Some("unsupported_media_type")), "{content_type}: {problem}");
    }
    // A JSON body still reaches the route (an unknown operation: 404).
    let resp = http
        .post(&wait)
        .bearer_auth(&api.key)
        .header("content-type", "application/json")
        .body(r#"{"timeout_seconds": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    // No body at all is still the default wait (the route reads an optional body).
    let resp = http.post(&wait).bearer_auth(&api.key).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 404);
}
