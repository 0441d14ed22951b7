//! A known path asked with a method it does not support answers
//! `405 method_not_allowed` (an RFC 9457 problem) with an `Allow` header
//! listing the path's methods (RFC 9110 §15.5.6); a path the api does not
//! serve stays `404 not_found`. Checked for every path of the OpenAPI
//! document, the way `scripts/fuzz-api.sh` (schemathesis' `unsupported_method`
//! check) sends them.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::TestApi;
use serde_json::Value;

/// Methods tried on every path; those the path does not serve must be `405`.
/// The first six and `OPTIONS` are what schemathesis sends as unspecified
/// methods (it does not judge `OPTIONS`); `QUERY` is an extension method.
const METHODS: [&str; 8] = ["GET", "POST", "PUT", "PATCH", "DELETE", "TRACE", "OPTIONS", "QUERY"];

/// Served paths that are not in the document (the docs UI and the console), with their methods.
const UNDOCUMENTED: &[(&str, &[&str])] =
    &[("/docs", &["GET"]), ("/console", &["GET"]), ("/console/", &["GET"]), ("/console/app.js", &["GET"])];

/// `(status, headers, body)` of `method url`, with the API key when `key` is set.
async fn send(api: &TestApi, method: &str, url: &str, key: bool) -> (u16, reqwest::header::HeaderMap, String) {
    let mut req = api.client().http().request(method.parse().unwrap(), url);
    if key {
        req = req.bearer_auth(&api.key);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.headers().clone(), resp.text().await.unwrap_or_default())
}

/// The methods an `Allow` header lists.
fn allow(headers: &reqwest::header::HeaderMap) -> BTreeSet<String> {
    let value = headers.get("allow").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    value.split(',').map(|m| m.trim().to_owned()).filter(|m| !m.is_empty()).collect()
}

/// Every path of the document with its methods, upper case; path parameters
/// filled with a value the path's pattern matches.
async fn documented_paths(api: &TestApi) -> BTreeMap<String, BTreeSet<String>> {
    let doc: Value = api.client().http().get(format!("{}/openapi.json", api.url)).send().await.unwrap().json().await.unwrap();
    let mut out = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        let methods = item.as_object().unwrap().keys().map(|m| m.to_uppercase()).filter(|m| METHODS.contains(&m.as_str())).collect();
        out.insert(path.replace("{id}", "x1").replace("{delivery_id}", "x2"), methods);
    }
    for (path, methods) in UNDOCUMENTED {
        out.insert((*path).to_owned(), methods.iter().map(|m| (*m).to_owned()).collect());
    }
    out
}

#[tokio::test]
async fn every_known_path_answers_other_methods_with_405_and_allow() {
    let api = TestApi::start(&[]).await;
    let paths = documented_paths(&api).await;
    assert!(paths.len() >= 20, "{paths:?}");
    for (path, allowed) in &paths {
        let url = format!("{}{path}", api.url);
        for method in METHODS.iter().filter(|m| !allowed.contains(**m)) {
            let (status, headers, body) = send(&api, method, &url, true).await;
            assert_eq!(status, 405, "{method} {path}: {body}");
            let mut expected = allowed.clone();
            if allowed.contains("GET") {
                expected.insert("HEAD".to_owned()); // served wherever GET is
            }
            assert_eq!(allow(&headers), expected, "{method} {path}: Allow {:?}", headers.get("allow"));
            let ct = headers.get("content-type").unwrap().to_str().unwrap();
            assert!(ct.starts_with("application/problem+json"), "{method} {path}: {ct}");
            assert!(headers.get("x-request-id").is_some(), "{method} {path}: the request middleware saw it");
            let p: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{method} {path}: {e}: {body}"));
            assert_eq!(p["code"], "method_not_allowed", "{body}");
            assert_eq!(p["status"], 405, "{body}");
            assert_eq!(p["title"], "Method not allowed", "{body}");
            assert!(p["type"].as_str().is_some_and(|t| !t.is_empty()), "{body}");
            let detail = p["detail"].as_str().unwrap();
            assert!(detail.contains(&format!("`{method}`")) && allowed.iter().all(|m| detail.contains(m.as_str())), "{detail}");
        }
    }

    // Routing comes before authentication: no key, same answer.
    let (status, headers, _) = send(&api, "DELETE", &format!("{}/operations", api.url), false).await;
    assert_eq!((status, allow(&headers)), (405, BTreeSet::from(["GET".to_owned(), "HEAD".to_owned()])));
    // HEAD where there is no GET: 405 naming HEAD, with the header and no body.
    let (status, headers, body) = send(&api, "HEAD", &format!("{}/uploads/x1/complete", api.url), true).await;
    assert_eq!(status, 405, "{body}");
    assert_eq!(allow(&headers), ["POST"].map(str::to_owned).into());
    assert!(body.is_empty(), "{body}");
    let (_, _, body) = send(&api, "PUT", &format!("{}/uploads/x1/complete", api.url), true).await;
    assert!(body.contains("`PUT`"), "{body}");
}

/// HEAD is served wherever GET is (RFC 9110 §9.3.2): GET's status and
/// header fields, `Content-Length` included, and no content.
#[tokio::test]
async fn head_answers_like_get_without_content() {
    let api = TestApi::start(&[]).await;
    for (path, expected) in [("/healthz", 200), ("/operations", 200), ("/openapi.json", 200), ("/webhook-endpoints/x1", 404)] {
        let url = format!("{}{path}", api.url);
        let (get_status, get_headers, get_body) = send(&api, "GET", &url, true).await;
        let (status, headers, body) = send(&api, "HEAD", &url, true).await;
        assert_eq!((get_status, status), (expected, expected), "{path}: {get_body}");
        assert!(body.is_empty(), "HEAD {path}: {body}");
        assert!(!get_body.is_empty(), "GET {path}");
        assert_eq!(headers.get("content-type"), get_headers.get("content-type"), "{path}");
        let length = headers.get("content-length").map(|v| v.to_str().unwrap().parse::<usize>().unwrap());
        assert_eq!(length, Some(get_body.len()), "HEAD {path}: Content-Length is GET's");
        assert!(headers.get("x-request-id").is_some(), "{path}");
    }
}

#[tokio::test]
async fn unknown_paths_stay_404_and_served_methods_are_unchanged() {
    let api = TestApi::start(&[]).await;
    for (method, path) in [
        ("GET", "/nope"),
        ("DELETE", "/nope"),
        ("POST", "/uploads/x1/parts"),
        ("GET", "/uploads/x1/complete/more"),
        ("POST", "/operations/x1:bogus"),
        ("GET", "/operations/x1/events/x2"),
        ("PUT", "/v1/videos"),
        ("GET", "/eventsx"),
    ] {
        let (status, headers, body) = send(&api, method, &format!("{}{path}", api.url), true).await;
        assert_eq!(status, 404, "{method} {path}: {body}");
        assert!(headers.get("allow").is_none(), "{method} {path}");
        let p: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(p["code"], "not_found", "{method} {path}: {body}");
    }
    // A served method with an id that names nothing is still the handler's `404`.
    let (status, _, body) = send(&api, "GET", &format!("{}/operations/x1", api.url), true).await;
    assert_eq!(status, 404, "{body}");
    assert!(!body.contains("no such route"), "{body}");
    let (status, _, _) = send(&api, "GET", &format!("{}/operations", api.url), true).await;
    assert_eq!(status, 200);
}

/// The `405` comes from registering each path once, as one `web::resource`
/// with a route per method. `ServiceConfig::route("…", …)` (or `App::route`)
/// registers a resource per method instead, whose other methods would fall
/// through to the `404`: none may be left under `src/`, and no path may be
/// registered twice.
#[test]
fn each_path_is_registered_once_as_a_resource() {
    let route_with_path = regex::Regex::new(r#"\.route\(\s*""#).unwrap();
    let resource = regex::Regex::new(r#"web::resource\(\s*"([^"]+)"\s*\)"#).unwrap();
    let mut seen = BTreeMap::new();
    let mut files = Vec::new();
    common::collect_rs(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let text = text.split("#[cfg(test)]").next().unwrap();
        assert!(!route_with_path.is_match(text), "{}: register the path with `web::resource(\"…\").route(…)`", file.display());
        for c in resource.captures_iter(text) {
            if let Some(first) = seen.insert(c[1].to_owned(), file.display().to_string()) {
                panic!("{} is registered twice ({first} and {})", &c[1], file.display());
            }
        }
    }
    assert!(seen.len() >= 20, "{seen:?}");
}
