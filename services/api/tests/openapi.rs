//! The OpenAPI document (issue 8, item 1): served at `/openapi.json`, OpenAPI
//! 3.1, every route the api serves is in it, every route in it is served, and
//! the Swagger UI at `/docs` comes from the binary.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::TestApi;
use serde_json::Value;

/// Routes served on purpose without being in the document: the UI that shows
/// it and the web console's page and static files (not API routes).
const NOT_DOCUMENTED: &[(&str, &str)] = &[("get", "/docs"), ("get", "/console"), ("get", "/console/"), ("get", "/console/{file}")];

/// Every `(method, path)` the api registers, read from the source so that a
/// route added anywhere under `src/` without a `#[utoipa::path]` makes this
/// test fail: `web::resource("…")` followed by its `.route(web::METHOD()…)`
/// calls (up to the `;` ending the statement), and any
/// `.route("…", web::METHOD()…)` (which `tests/methods.rs` refuses, but a
/// route is a route). `{id:[^/:]+}` is written `{id}`. Each file is read up
/// to its `#[cfg(test)]` module: routes of unit tests are not served.
fn registered_routes() -> BTreeSet<(String, String)> {
    let resource = regex::Regex::new(r#"web::resource\(\s*"([^"]+)"\s*\)"#).unwrap();
    let method = regex::Regex::new(r#"\.route\(\s*web::(get|post|put|patch|delete|head)\(\)"#).unwrap();
    let route = regex::Regex::new(r#"\.route\(\s*"([^"]+)"\s*,\s*web::(get|post|put|patch|delete|head)\(\)"#).unwrap();
    let param = regex::Regex::new(r"\{([A-Za-z_][A-Za-z0-9_]*):[^}]*\}").unwrap();
    let mut files = Vec::new();
    common::collect_rs(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
    let mut out = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let text = text.split("#[cfg(test)]").next().unwrap();
        for c in resource.captures_iter(text) {
            let path = param.replace_all(&c[1], "{$1}").into_owned();
            let rest = &text[c.get(0).unwrap().end()..];
            let chain = &rest[..rest.find(';').unwrap_or(rest.len())];
            let chain = &chain[..chain.find("web::resource(").unwrap_or(chain.len())];
            for m in method.captures_iter(chain) {
                out.insert((m[1].to_owned(), path.clone()));
            }
        }
        for c in route.captures_iter(text) {
            let path = param.replace_all(&c[1], "{$1}").into_owned();
            out.insert((c[2].to_owned(), path));
        }
    }
    out
}

fn documented_routes(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in ["get", "post", "put", "patch", "delete", "head"] {
            if item.get(method).is_some() {
                out.insert((method.to_owned(), path.clone()));
            }
        }
    }
    out
}

/// Every `$ref` in the document, with where it points.
fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                out.push(r);
            }
            m.values().for_each(|v| refs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

async fn fetch_doc(api: &TestApi) -> Value {
    let resp = api.client().http().get(format!("{}/openapi.json", api.url)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("application/json"));
    resp.json().await.unwrap()
}

#[tokio::test]
async fn every_served_route_is_documented_and_every_documented_route_is_served() {
    let api = TestApi::start(&[]).await;
    let doc = fetch_doc(&api).await;
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1."), "{}", doc["openapi"]);
    assert!(!doc["info"]["title"].as_str().unwrap().is_empty());

    let registered = registered_routes();
    assert!(registered.len() >= 20, "the route scan found only {registered:?}");
    let documented = documented_routes(&doc);
    let missing: Vec<_> = registered
        .iter()
        .filter(|(m, p)| !documented.contains(&(m.clone(), p.clone())))
        .filter(|(m, p)| !NOT_DOCUMENTED.contains(&(m.as_str(), p.as_str())))
        .collect();
    assert!(missing.is_empty(), "served but not in /openapi.json (add a #[utoipa::path] and list it in openapi.rs): {missing:?}");

    // The other way round: each documented operation reaches a handler (a
    // handler answers `not_found` for an unknown id; only the fallback says
    // "no such route"), with the API key when the document asks for one.
    let http = api.client().http().clone();
    for (method, path) in &documented {
        let url = format!("{}{}", api.url, path.replace("{id}", "x").replace("{delivery_id}", "x"));
        let op = &doc["paths"][path][method];
        let mut req = http.request(method.to_uppercase().parse().unwrap(), &url);
        if op.get("security").is_some() {
            req = req.bearer_auth(&api.key);
        }
        if method == "post" || method == "patch" {
            req = req.header("content-type", "application/json").body("{}");
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap_or_default();
        assert_ne!(status, 405, "{method} {path}: {body}");
        assert!(!body.contains("no such route"), "{method} {path} is documented but not served: {status} {body}");
        let documented_statuses: Vec<&String> = op["responses"].as_object().unwrap().keys().collect();
        assert!(
            documented_statuses.iter().any(|s| s.as_str() == status.to_string()),
            "{method} {path} answered {status}, documented {documented_statuses:?}: {body}"
        );
    }
}

#[tokio::test]
async fn tenant_routes_need_the_bearer_key_and_problems_are_described() {
    let api = TestApi::start(&[]).await;
    let doc = fetch_doc(&api).await;
    let scheme = &doc["components"]["securitySchemes"]["api_key"];
    assert_eq!(scheme["type"], "http");
    assert_eq!(scheme["scheme"], "bearer");
    for name in ["BadRequest", "Unauthorized", "NotFound", "Conflict", "Unprocessable", "TooManyRequests", "Unavailable"] {
        let r = &doc["components"]["responses"][name];
        assert_eq!(r["content"]["application/problem+json"]["schema"]["$ref"], "#/components/schemas/Problem", "{name}");
    }
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let public = ["/healthz", "/readyz", "/metrics", "/openapi.json"].contains(&path.as_str());
            assert_eq!(op.get("security").is_none(), public, "{method} {path}: security");
            if !public {
                assert_eq!(op["responses"]["401"]["$ref"], "#/components/responses/Unauthorized", "{method} {path}");
                assert!(op["responses"].get("503").is_some(), "{method} {path}: 503");
                assert!(op["tags"].as_array().is_some_and(|t| !t.is_empty()), "{method} {path}: tags");
            }
            // Every error answer is a problem.
            for (status, resp) in op["responses"].as_object().unwrap() {
                if status.starts_with('4') || (status.starts_with('5') && path != "/readyz") {
                    assert!(
                        resp.get("$ref").is_some_and(|r| r.as_str().unwrap().starts_with("#/components/responses/")),
                        "{method} {path} {status}"
                    );
                }
            }
        }
    }
    // Problem keeps its extension members.
    let problem = &doc["components"]["schemas"]["Problem"];
    assert!(problem["additionalProperties"].is_object() || problem["additionalProperties"] == true, "{problem}");
    for member in ["type", "title", "status", "code"] {
        assert!(problem["required"].as_array().unwrap().contains(&member.into()), "{member}: {problem}");
    }

    // Links (followed by the fuzzer's stateful phase) name existing operations.
    let ids: Vec<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .filter_map(|op| op["operationId"].as_str())
        .collect();
    let links = doc["paths"]["/uploads"]["post"]["responses"]["201"]["links"].as_object().expect("POST /uploads links");
    for (name, link) in links {
        assert!(ids.contains(&link["operationId"].as_str().unwrap_or("")), "link {name}: {link}");
    }

    // Id schemas describe the ids the api makes.
    let ids = [
        ("UploadId", vid_core::UploadId::generate().to_string()),
        ("VideoId", vid_core::VideoId::generate().to_string()),
        ("OperationId", vid_core::OperationId::generate().to_string()),
        ("EventId", vid_core::EventId::generate().to_string()),
        ("EndpointId", vid_core::EndpointId::generate().to_string()),
        ("DeliveryId", vid_core::DeliveryId::generate().to_string()),
    ];
    for (name, id) in ids {
        let schema = &doc["components"]["schemas"][name];
        let pattern = regex::Regex::new(schema["pattern"].as_str().unwrap()).unwrap();
        assert!(pattern.is_match(&id), "{name} {id} vs {schema}");
        assert_eq!(schema["maxLength"].as_u64(), Some(id.len() as u64), "{name}");
    }

    // Every reference resolves.
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(!all.is_empty());
    for r in all {
        let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("external ref {r}"));
        assert!(doc.pointer(pointer).is_some(), "dangling $ref {r}");
    }
}

#[tokio::test]
async fn the_docs_ui_is_served_from_the_binary() {
    let api = TestApi::start(&[]).await;
    let http = reqwest_no_redirect();
    let resp = http.get(format!("{}/docs", api.url)).send().await.unwrap();
    assert_eq!(resp.status(), 308);
    assert_eq!(resp.headers()["location"], "/docs/");
    let page = http.get(format!("{}/docs/", api.url)).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    let html = page.text().await.unwrap();
    assert!(html.contains("swagger-ui"), "{html}");
    // No asset is loaded from anywhere but here.
    assert!(!html.contains("http://") && !html.contains("https://"), "{html}");
    let init = http.get(format!("{}/docs/swagger-initializer.js", api.url)).send().await.unwrap().text().await.unwrap();
    assert!(init.contains("/openapi.json"), "{init}");
    // The API key typed into "Authorize" is not kept in localStorage.
    assert!(!init.contains("persistAuthorization\": true") && !init.contains("persistAuthorization: true"), "{init}");
    // Not framable (clickjacking "Try it out"), not sniffed, no Referer.
    for path in ["/docs/", "/docs/swagger-initializer.js", "/openapi.json", "/healthz"] {
        let resp = http.get(format!("{}{path}", api.url)).send().await.unwrap();
        let h = resp.headers();
        assert_eq!(h["x-frame-options"], "DENY", "{path}");
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("frame-ancestors 'none'"), "{path}");
        if path.starts_with("/docs") {
            assert!(csp.contains("script-src 'self';") && csp.contains("connect-src 'self'"), "{path}: {csp}");
        }
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["referrer-policy"], "no-referrer", "{path}");
    }
    for asset in ["swagger-ui.css", "swagger-ui-bundle.js", "swagger-ui-standalone-preset.js"] {
        let resp = http.get(format!("{}/docs/{asset}", api.url)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{asset}");
        assert!(resp.bytes().await.unwrap().len() > 1000, "{asset}");
    }
}

fn reqwest_no_redirect() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}
