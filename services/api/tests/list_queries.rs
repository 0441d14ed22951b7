//! `GET /videos` and `GET /operations` each take only their own query
//! parameters: anything else is `400 invalid_query` naming it (as
//! `GET /events` does), and the OpenAPI document lists exactly what each takes.

mod common;

use common::TestApi;
use serde_json::Value;

/// `GET {path_and_query}` with the test's key: status, content type and body.
async fn get(api: &TestApi, path_and_query: &str) -> (u16, String, String) {
    let resp = api.client().http().get(format!("{}{path_and_query}", api.url)).bearer_auth(&api.key).send().await.unwrap();
    let status = resp.status().as_u16();
    let ct = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    (status, ct, resp.text().await.unwrap())
}

#[tokio::test]
async fn parameters_a_list_does_not_take_are_refused_by_name() {
    let api = TestApi::start(&[]).await;
    for (query, name) in [
        ("/videos?status=ready", "status"),
        ("/videos?type=video.ready", "type"),
        ("/videos?limit=5&colour=red", "colour"),
        ("/operations?type=video.ready", "type"),
        ("/operations?status=running&event_type=video.ready", "event_type"),
        ("/operations?created_after=0", "created_after"),
    ] {
        let (status, ct, body) = get(&api, query).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(ct.starts_with("application/problem+json"), "{query}: {ct}");
        let p: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(p["code"], "invalid_query", "{query}: {body}");
        assert!(p["detail"].as_str().unwrap().contains(&format!("`{name}`")), "{query}: {body}");
    }
    // What each takes still works, and its own errors keep their codes.
    for ok in ["/videos", "/videos?limit=5", "/operations?status=running&limit=5", "/operations?limit=200"] {
        let (status, _, body) = get(&api, ok).await;
        assert_eq!(status, 200, "{ok}: {body}");
    }
    for (query, code) in [
        ("/videos?limit=many", "invalid_query"),
        ("/videos?cursor=nope", "invalid_cursor"),
        ("/operations?status=bogus", "invalid_status"),
        ("/operations?cursor=vid_01jd0000000000000000000000", "invalid_cursor"),
    ] {
        let (status, _, body) = get(&api, query).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["code"], code, "{query}: {body}");
    }
    // The SDK's list calls send only what the lists take.
    let client = api.client();
    client.list_videos(None).await.unwrap();
    client.list_operations(Some("succeeded"), None).await.unwrap();
}

#[tokio::test]
async fn the_document_lists_exactly_the_parameters_each_list_takes() {
    let api = TestApi::start(&[]).await;
    let doc: Value = api.client().http().get(format!("{}/openapi.json", api.url)).send().await.unwrap().json().await.unwrap();
    let params = |path: &str| -> Vec<(String, String, bool)> {
        doc["paths"][path]["get"]["parameters"]
            .as_array()
            .unwrap_or_else(|| panic!("{path}: no parameters"))
            .iter()
            .map(|p| {
                (p["name"].as_str().unwrap().to_owned(), p["in"].as_str().unwrap().to_owned(), p["required"].as_bool().unwrap_or(false))
            })
            .collect()
    };
    let query = |names: &[&str]| names.iter().map(|n| ((*n).to_owned(), "query".to_owned(), false)).collect::<Vec<_>>();
    assert_eq!(params("/videos"), query(&["limit", "cursor"]));
    assert_eq!(params("/operations"), query(&["status", "limit", "cursor"]));
    // Typed as before: the cursor is the resource's id, the status an operation status.
    let param = |path: &str, name: &str| {
        doc["paths"][path]["get"]["parameters"].as_array().unwrap().iter().find(|p| p["name"] == name).unwrap()["schema"].to_string()
    };
    assert!(param("/videos", "cursor").contains("VideoId"), "{}", param("/videos", "cursor"));
    assert!(param("/operations", "cursor").contains("OperationId"), "{}", param("/operations", "cursor"));
    assert!(param("/operations", "status").contains("OperationStatus"), "{}", param("/operations", "status"));
    assert!(param("/operations", "limit").contains("integer"), "{}", param("/operations", "limit"));
    for path in ["/videos", "/operations"] {
        for p in doc["paths"][path]["get"]["parameters"].as_array().unwrap() {
            assert!(p["description"].as_str().is_some_and(|d| !d.is_empty()), "{path}: {p}");
        }
    }
}
