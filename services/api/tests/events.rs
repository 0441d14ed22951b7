//! `GET /events` and `GET /events/{id}` against real PostgreSQL (issue 5):
//! filter by type and time, page with the cursor, refuse unknown parameters,
//! and return every event exactly as it was sent.

mod common;

use chrono::{DateTime, Duration, TimeZone, Utc};
use common::TestApi;
use diesel::prelude::*;
use serde_json::Value;
use vid_core::{EventId, TenantId};
use vid_db::schema::{api_keys, events};
use vid_db::RunQueryDsl;

/// The tenant of the test's API key.
async fn tenant_of(api: &TestApi, key: &str) -> TenantId {
    let mut conn = api.state.db.get().await.unwrap();
    api_keys::table.filter(api_keys::key_hash.eq(vid_api::auth::hash_key(key))).select(api_keys::tenant_id).first(&mut conn).await.unwrap()
}

/// Inserts an event row as the outbox does, with an explicit `created_at`.
async fn insert(api: &TestApi, tenant: &TenantId, id: &EventId, type_: &str, payload: &str, at: DateTime<Utc>) {
    let mut conn = api.state.db.get().await.unwrap();
    diesel::insert_into(events::table)
        .values((
            events::id.eq(id),
            events::tenant_id.eq(tenant),
            events::event_type.eq(type_),
            events::resource_id.eq("vid_x"),
            events::payload.eq(payload),
            events::created_at.eq(at),
        ))
        .execute(&mut conn)
        .await
        .unwrap();
}

/// `n` event ids in increasing (cursor) order.
fn ids(n: usize) -> Vec<EventId> {
    let mut ids: Vec<EventId> = (0..n).map(|_| EventId::generate()).collect();
    ids.sort();
    ids
}

/// A `video.*` event payload in the shape the outbox writes.
fn payload(id: &EventId, type_: &str, at: DateTime<Utc>) -> String {
    serde_json::json!({
        "id": id,
        "type": type_,
        "created": at.timestamp(),
        "data": {"video_id": vid_core::VideoId::generate(), "operation_id": vid_core::OperationId::generate(), "version": 1},
    })
    .to_string()
}

/// `GET {path_and_query}` with `key`: status, content type and body text.
async fn get(api: &TestApi, key: &str, path_and_query: &str) -> (u16, String, String) {
    let resp = api.client().http().get(format!("{}{path_and_query}", api.url)).bearer_auth(key).send().await.unwrap();
    let status = resp.status().as_u16();
    let ct = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    (status, ct, resp.text().await.unwrap())
}

/// The ids of a `GET /events` page, and its `next_cursor`.
async fn page(api: &TestApi, key: &str, query: &str) -> (Vec<String>, Option<String>) {
    let (status, _, body) = get(api, key, &format!("/events?{query}")).await;
    assert_eq!(status, 200, "{query}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let ids = v["data"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect();
    (ids, v["next_cursor"].as_str().map(str::to_owned))
}

/// Percent-encodes what a query value needs here (`+` and `:`).
fn enc(s: &str) -> String {
    s.replace('+', "%2B").replace(':', "%3A")
}

/// Six events one minute apart from 2026-01-01T00:00:00Z, alternately
/// `video.ready` and `video.failed`; returns their ids oldest first and the times.
async fn six_events(api: &TestApi, tenant: &TenantId) -> (Vec<String>, Vec<DateTime<Utc>>) {
    let base = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
    let ids = ids(6);
    let mut times = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let at = base + Duration::minutes(i as i64);
        let type_ = if i % 2 == 0 { "video.ready" } else { "video.failed" };
        insert(api, tenant, id, type_, &payload(id, type_, at), at).await;
        times.push(at);
    }
    (ids.iter().map(|i| i.to_string()).collect(), times)
}

fn newest_first(ids: &[String], which: &[usize]) -> Vec<String> {
    which.iter().rev().map(|&i| ids[i].clone()).collect()
}

#[tokio::test]
async fn the_time_filters_are_exclusive_bounds_that_combine_with_type_and_cursor() {
    let api = TestApi::start(&[]).await;
    let tenant = tenant_of(&api, &api.key).await;
    let (ids, t) = six_events(&api, &tenant).await;
    let key = api.key.clone();
    let rfc = |d: DateTime<Utc>| enc(&d.to_rfc3339());

    // No filter: all six, newest first.
    assert_eq!(page(&api, &key, "").await.0, newest_first(&ids, &[0, 1, 2, 3, 4, 5]));
    // `created_after` is exclusive.
    assert_eq!(page(&api, &key, &format!("created_after={}", rfc(t[1]))).await.0, newest_first(&ids, &[2, 3, 4, 5]));
    // `created_before` is exclusive.
    assert_eq!(page(&api, &key, &format!("created_before={}", rfc(t[3]))).await.0, newest_first(&ids, &[0, 1, 2]));
    // Both: a window.
    let both = format!("created_after={}&created_before={}", rfc(t[1]), rfc(t[4]));
    assert_eq!(page(&api, &key, &both).await.0, newest_first(&ids, &[2, 3]));
    // Sub-second precision and an offset other than Z name the same instants.
    let just_after = (t[1] + Duration::milliseconds(1)).with_timezone(&chrono::FixedOffset::east_opt(3600).unwrap());
    let q = format!("created_after={}", enc(&just_after.to_rfc3339_opts(chrono::SecondsFormat::Millis, false)));
    assert_eq!(page(&api, &key, &q).await.0, newest_first(&ids, &[2, 3, 4, 5]));
    // An unencoded `+` (decoded as a space) in the offset is understood too.
    let q = format!("created_after={}", just_after.to_rfc3339_opts(chrono::SecondsFormat::Millis, false));
    assert!(q.contains('+'));
    assert_eq!(page(&api, &key, &q).await.0, newest_first(&ids, &[2, 3, 4, 5]));
    // Unix seconds work as well.
    let q = format!("created_after={}&created_before={}", t[1].timestamp(), t[4].timestamp());
    assert_eq!(page(&api, &key, &q).await.0, newest_first(&ids, &[2, 3]));
    // Combined with the type filter.
    let q = format!("type=video.ready&created_after={}", rfc(t[0]));
    assert_eq!(page(&api, &key, &q).await.0, newest_first(&ids, &[2, 4]));
    // An empty window is an empty page, not an error.
    let q = format!("created_after={}&created_before={}", rfc(t[3]), rfc(t[3]));
    assert_eq!(page(&api, &key, &q).await, (vec![], None));

    // Paging through a window with the cursor keeps the window.
    let window = format!("created_after={}&created_before={}", rfc(t[0]), rfc(t[5]));
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let q = match &cursor {
            Some(c) => format!("{window}&limit=2&cursor={c}"),
            None => format!("{window}&limit=2"),
        };
        let (got, next) = page(&api, &key, &q).await;
        assert!(got.len() <= 2);
        seen.extend(got);
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen, newest_first(&ids, &[1, 2, 3, 4]));

    // Another tenant sees none of these, whatever the window.
    let (other_tenant, other_key) = vid_api::auth::create_tenant(&api.state.db, "other").await.unwrap();
    let theirs = EventId::generate();
    insert(&api, &other_tenant, &theirs, "video.ready", &payload(&theirs, "video.ready", t[2]), t[2]).await;
    assert_eq!(page(&api, &other_key, &window).await.0, vec![theirs.to_string()]);
    assert!(!page(&api, &key, "").await.0.contains(&theirs.to_string()));
}

#[tokio::test]
async fn invalid_time_values_are_invalid_query_problems_naming_the_parameter() {
    let api = TestApi::start(&[]).await;
    for (param, value) in [
        ("created_after", "yesterday"),
        ("created_after", "2026-13-01T00:00:00Z"),
        ("created_before", "2026-01-01"),
        ("created_before", ""),
        ("created_after", "1.5"),
        ("created_before", "99999999999999999999"),
    ] {
        let (status, ct, body) = get(&api, &api.key, &format!("/events?{param}={value}")).await;
        assert_eq!(status, 400, "{param}={value}: {body}");
        assert!(ct.starts_with("application/problem+json"), "{ct}");
        let p: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(p["code"], "invalid_query", "{param}={value}: {body}");
        assert!(p["detail"].as_str().unwrap().contains(param), "{param}={value}: {body}");
    }
}

#[tokio::test]
async fn unknown_query_parameters_are_refused_by_name() {
    let api = TestApi::start(&[]).await;
    for (query, name) in [("status=bogus", "status"), ("type=video.ready&colour=red", "colour"), ("event_type=video.ready", "event_type")] {
        let (status, ct, body) = get(&api, &api.key, &format!("/events?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(ct.starts_with("application/problem+json"), "{ct}");
        let p: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(p["code"], "invalid_query", "{query}: {body}");
        assert!(p["detail"].as_str().unwrap().contains(&format!("`{name}`")), "{query}: {body}");
    }
    // The supported ones still work, and the client's list call still parses.
    let (status, _, body) = get(&api, &api.key, "/events?type=video.ready&limit=5").await;
    assert_eq!(status, 200, "{body}");
    let page = api.client().list_events(&vid_client::EventFilter { type_: Some("video.ready"), ..Default::default() }).await.unwrap();
    assert!(page.data.is_empty() && page.next_cursor.is_none());
}

#[tokio::test]
async fn listed_events_are_byte_identical_to_the_stored_payloads() {
    let api = TestApi::start(&[]).await;
    let tenant = tenant_of(&api, &api.key).await;
    let at = Utc.with_ymd_and_hms(2026, 2, 3, 4, 5, 6).unwrap();
    let [a, b]: [EventId; 2] = ids(2).try_into().unwrap();
    // Keys in another order than the struct's, and spacing: what a receiver
    // got must come back unchanged, not re-serialised.
    let odd = format!(
        r#"{{"data": {{"version": 7, "operation_id": "{}", "video_id": "{}"}}, "created": {}, "type": "video.ready", "id": "{a}"}}"#,
        vid_core::OperationId::generate(),
        vid_core::VideoId::generate(),
        at.timestamp()
    );
    let usual = payload(&b, "video.failed", at);
    insert(&api, &tenant, &a, "video.ready", &odd, at).await;
    insert(&api, &tenant, &b, "video.failed", &usual, at).await;

    let (status, ct, body) = get(&api, &api.key, "/events").await;
    assert_eq!(status, 200, "{body}");
    assert!(ct.starts_with("application/json"), "{ct}");
    assert!(body.contains(&odd), "{odd} not verbatim in {body}");
    assert!(body.contains(&usual), "{usual} not verbatim in {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    assert_eq!(v["data"][0], serde_json::from_str::<Value>(&usual).unwrap());
    assert_eq!(v["data"][1], serde_json::from_str::<Value>(&odd).unwrap());
    assert_eq!(v["next_cursor"], Value::Null);

    // The same bytes as `GET /events/{id}`.
    assert_eq!(get(&api, &api.key, &format!("/events/{a}")).await.2, odd);
    assert_eq!(get(&api, &api.key, &format!("/events/{b}")).await.2, usual);

    // With a next page, the cursor is still there, and the client parses the page.
    let (_, _, body) = get(&api, &api.key, "/events?limit=1").await;
    assert!(body.contains(&usual), "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["next_cursor"], b.to_string());
    let page = api.client().list_events(&vid_client::EventFilter::default()).await.unwrap();
    assert_eq!(page.data.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), vec![b.clone(), a.clone()]);
}

/// `vid_client::Client::list_events` sends the time filters (typed instants,
/// RFC 3339 in UTC) and they reach the real api as the same exclusive bounds.
#[tokio::test]
async fn the_sdk_filters_events_by_time_type_and_cursor() {
    use vid_client::EventFilter;

    let api = TestApi::start(&[]).await;
    let tenant = tenant_of(&api, &api.key).await;
    let (ids, t) = six_events(&api, &tenant).await;
    let client = api.client();
    let listed = |filter: EventFilter<'static>| {
        let client = client.clone();
        async move {
            let page = client.list_events(&filter).await.unwrap();
            (page.data.into_iter().map(|e| e.id.to_string()).collect::<Vec<_>>(), page.next_cursor)
        }
    };

    // Exclusive bounds, alone and together.
    let after = EventFilter { created_after: Some(t[1]), ..Default::default() };
    assert_eq!(listed(after).await.0, newest_first(&ids, &[2, 3, 4, 5]));
    let before = EventFilter { created_before: Some(t[3]), ..Default::default() };
    assert_eq!(listed(before).await.0, newest_first(&ids, &[0, 1, 2]));
    let window = EventFilter { created_after: Some(t[1]), created_before: Some(t[4]), ..Default::default() };
    assert_eq!(listed(window).await.0, newest_first(&ids, &[2, 3]));
    // Sub-second instants keep their precision on the way.
    let just_after = EventFilter { created_after: Some(t[1] + Duration::microseconds(1)), ..Default::default() };
    assert_eq!(listed(just_after).await.0, newest_first(&ids, &[2, 3, 4, 5]));
    let just_before = EventFilter { created_before: Some(t[2] + Duration::microseconds(1)), ..Default::default() };
    assert_eq!(listed(just_before).await.0, newest_first(&ids, &[0, 1, 2]));
    // With the type filter.
    let ready = EventFilter { type_: Some("video.ready"), created_after: Some(t[0]), ..Default::default() };
    assert_eq!(listed(ready).await.0, newest_first(&ids, &[2, 4]));

    // Paging a window with `limit` and the cursor keeps the window.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let filter = EventFilter {
            created_after: Some(t[0]),
            created_before: Some(t[5]),
            limit: Some(3),
            cursor: cursor.as_deref(),
            ..Default::default()
        };
        let page = client.list_events(&filter).await.unwrap();
        assert!(page.data.len() <= 3);
        seen.extend(page.data.into_iter().map(|e| e.id.to_string()));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen, newest_first(&ids, &[1, 2, 3, 4]));

    // An empty window is an empty page; a bad type is the api's problem.
    let empty = EventFilter { created_after: Some(t[3]), created_before: Some(t[3]), ..Default::default() };
    assert_eq!(listed(empty).await, (vec![], None));
    let err = client.list_events(&EventFilter { type_: Some("video.nope"), ..Default::default() }).await.unwrap_err();
    assert_eq!(common::problem_code(&err), "invalid_event_type");
}

/// The plan PostgreSQL picks for `sql` on the test's database (`EXPLAIN`, text).
async fn plan(api: &TestApi, sql: &str) -> String {
    use vid_infra::ExposeSecret;
    let (client, connection) =
        tokio_postgres::connect(api.state.settings.database.url.expose_secret(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let rows = client.query(&format!("EXPLAIN {sql}"), &[]).await.unwrap();
    rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>().join("\n")
}

/// Migration `2026-11-30-000050_events_created_at_index`: with a few thousand
/// events, a `GET /events` time window (with or without a type) is read from
/// `events_tenant_created` instead of walking the tenant's newer events, and
/// an unfiltered listing still reads `events_tenant` in id order.
#[tokio::test]
async fn listing_events_by_time_reads_the_created_at_index() {
    use vid_infra::ExposeSecret;
    let api = TestApi::start(&[]).await;
    let tenant = tenant_of(&api, &api.key).await;
    let (other, _) = vid_api::auth::create_tenant(&api.state.db, "other").await.unwrap();
    // 4,000 events for each tenant over 60 days, types in realistic shares,
    // ids increasing with time like ULIDs.
    let (client, connection) =
        tokio_postgres::connect(api.state.settings.database.url.expose_secret(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    for (n, t) in [(0, &tenant), (1, &other)] {
        client
            .batch_execute(&format!(
                "INSERT INTO events (id, tenant_id, event_type, resource_id, payload, created_at)
                 SELECT 'evt_' || lpad((extract(epoch FROM at) * 1000)::bigint::text, 14, '0') || '{n}' || lpad(i::text, 8, '0'),
                        '{t}',
                        CASE WHEN r < 0.40 THEN 'video.processing' WHEN r < 0.75 THEN 'video.ready'
                             WHEN r < 0.90 THEN 'video.failed' WHEN r < 0.99 THEN 'video.cancelled'
                             ELSE 'webhook_endpoint.disabled' END,
                        'vid_' || i, repeat('x', 200), at
                 FROM (SELECT i, timestamptz '2026-10-01 00:00:00+00' + random() * interval '60 days' AS at, random() AS r
                       FROM generate_series(1, 4000) i) g;
                 ANALYZE events;"
            ))
            .await
            .unwrap();
    }
    let list = |filters: &str| format!("SELECT id, payload FROM events WHERE tenant_id = '{tenant}'{filters} ORDER BY id DESC LIMIT 21");
    let day = " AND created_at > '2026-11-15T00:00:00Z' AND created_at < '2026-11-16T00:00:00Z'";

    let p = plan(&api, &list(day)).await;
    assert!(p.contains("using events_tenant_created on events"), "a one-day window:\n{p}");
    assert!(p.contains("created_at >") && p.contains("created_at <"), "the window is the index range:\n{p}");
    let p = plan(&api, &list(&format!("{day} AND event_type = 'video.failed'"))).await;
    assert!(p.contains("using events_tenant_created on events"), "a window and a type:\n{p}");
    assert!(p.lines().any(|l| l.contains("Index Cond") && l.contains("event_type")), "the type is checked in the index:\n{p}");
    let p = plan(&api, &list("")).await;
    assert!(p.contains("using events_tenant on events") && !p.contains("Sort"), "no filter: id order, no sort:\n{p}");
}
