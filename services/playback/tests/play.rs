//! The playback service against the real PostgreSQL and Garage, with a real
//! CMAF stream (ffmpeg-made, in the transcoder's layout): the master
//! playlist and the MPD parse with independent parsers (`m3u8`, `mpegdash`)
//! and every URI they name resolves and serves the stored bytes; ffprobe
//! plays the HLS URL; ranges; every 404; 403 for a signed ID; CORS; no key;
//! nothing shows the bucket, the key layout or the tenant; two replicas
//! answer alike; a deleted playback ID stops within the cache bound.

mod common;

use std::time::{Duration, Instant};

use common::*;
use reqwest::header::{HeaderMap, ACCESS_CONTROL_ALLOW_ORIGIN, CACHE_CONTROL, CONTENT_RANGE, CONTENT_TYPE, ETAG};
use serde_json::Value;

fn header(h: &HeaderMap, name: impl reqwest::header::AsHeaderName) -> &str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// Nothing in `text` names the tenant, the bucket or the key layout.
fn assert_no_leak(w: &World, what: &str, text: &str) {
    for secret in [w.tenant.as_str(), w.bucket.as_str(), "tenants/", w.prefix.as_str(), "stream/"] {
        assert!(!text.contains(secret), "{what} shows {secret:?}: {text}");
    }
}

async fn get(url: &str) -> reqwest::Response {
    http().get(url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

#[tokio::test]
async fn the_master_playlist_parses_and_every_uri_serves_the_stored_bytes() {
    let w = seed().await;
    let pb = Playback::start(&w.db, &[]).await;
    let master_url = pb.at(&format!("/play/{}.m3u8", w.public));
    let res = get(&master_url).await;
    assert_eq!(res.status(), 200);
    let h = res.headers().clone();
    assert_eq!(header(&h, CONTENT_TYPE), "application/vnd.apple.mpegurl");
    assert_eq!(header(&h, ACCESS_CONTROL_ALLOW_ORIGIN), "*");
    assert_eq!(header(&h, CACHE_CONTROL), "public, max-age=10");
    let body = res.text().await.unwrap();
    assert_no_leak(&w, "the master playlist", &body);
    assert!(body.contains(&format!("\n{}/360p/index.m3u8\n", w.public)), "{body}");

    let parsed = parsers("hls", &master_url);
    let variants = parsed["variants"].as_array().unwrap();
    assert_eq!(variants.len(), RUNGS.len(), "{parsed}");
    for (v, (name, width, height)) in variants.iter().zip(RUNGS) {
        assert_eq!(v["uri"], pb.at(&format!("/play/{}/{name}/index.m3u8", w.public)));
        assert_eq!(v["resolution"], serde_json::json!([width, height]));
        assert!(v["codecs"].as_str().unwrap().contains("mp4a.40.2"), "{v}");
    }
    assert_eq!(parsed["media"], serde_json::json!([pb.at(&format!("/play/{}/audio/index.m3u8", w.public))]));
    let tracks = parsed["tracks"].as_array().unwrap();
    assert_eq!(tracks.len(), RUNGS.len() + 1);
    for t in tracks {
        assert_eq!(t["endlist"], true);
        let playlist = t["playlist"].as_str().unwrap();
        let track = playlist.rsplit('/').nth(1).unwrap();
        let res = get(playlist).await;
        assert_eq!(res.status(), 200, "{playlist}");
        assert_eq!(header(res.headers(), CONTENT_TYPE), "application/vnd.apple.mpegurl");
        assert_eq!(res.bytes().await.unwrap(), stream_bytes(&format!("{track}/index.m3u8")), "a media playlist is served as stored");
        let media: Vec<&str> =
            t["init"].as_array().unwrap().iter().chain(t["segments"].as_array().unwrap()).map(|u| u.as_str().unwrap()).collect();
        let stored = stream_files().iter().filter(|(f, _)| f.starts_with(&format!("{track}/seg-"))).count();
        assert!(stored >= SEGMENTS, "{track}: {stored} segments");
        assert_eq!(media.len(), 1 + stored, "every stored segment is listed: {t}");
        for url in media {
            let file = url.rsplit('/').next().unwrap();
            assert_eq!(url, pb.at(&format!("/play/{}/{track}/{file}", w.public)));
            let res = get(url).await;
            assert_eq!(res.status(), 200, "{url}");
            let h = res.headers().clone();
            assert_eq!(header(&h, CONTENT_TYPE), if track == "audio" { "audio/mp4" } else { "video/mp4" }, "{url}");
            assert_eq!(header(&h, CACHE_CONTROL), "public, max-age=31536000, immutable");
            assert_eq!(header(&h, ACCESS_CONTROL_ALLOW_ORIGIN), "*");
            assert!(!header(&h, ETAG).is_empty(), "the store's ETag is passed on");
            assert_eq!(res.bytes().await.unwrap(), stream_bytes(&format!("{track}/{file}")), "{url}");
        }
    }

    // A real player reads it: ffprobe through the service, video and audio.
    let out = std::process::Command::new("ffprobe")
        .args(["-v", "error", "-show_entries", "stream=codec_name,width,height", "-of", "json", &master_url])
        .output()
        .expect("ffprobe runs");
    assert!(out.status.success(), "ffprobe {master_url}: {}", String::from_utf8_lossy(&out.stderr));
    let probe: Value = serde_json::from_slice(&out.stdout).unwrap();
    let codecs: Vec<&str> = probe["streams"].as_array().unwrap().iter().filter_map(|s| s["codec_name"].as_str()).collect();
    assert!(codecs.contains(&"h264") && codecs.contains(&"aac"), "{probe}");
}

#[tokio::test]
async fn the_mpd_parses_and_its_templates_resolve_under_the_playback_id() {
    let w = seed().await;
    let pb = Playback::start(&w.db, &[]).await;
    let mpd_url = pb.at(&format!("/play/{}.mpd", w.public));
    let res = get(&mpd_url).await;
    assert_eq!(res.status(), 200);
    assert_eq!(header(res.headers(), CONTENT_TYPE), "application/dash+xml");
    assert_eq!(header(res.headers(), ACCESS_CONTROL_ALLOW_ORIGIN), "*");
    let body = res.text().await.unwrap();
    assert_no_leak(&w, "the MPD", &body);
    let parsed = parsers("dash", &mpd_url);
    let reps = parsed["representations"].as_array().unwrap();
    assert_eq!(reps.len(), RUNGS.len() + 1, "{parsed}");
    let base = url::Url::parse(&mpd_url).unwrap();
    for rep in reps {
        let id = rep["id"].as_str().unwrap();
        let init = base.join(rep["initialization"].as_str().unwrap()).unwrap();
        assert_eq!(init.path(), format!("/play/{}/{id}/init.mp4", w.public));
        let res = get(init.as_str()).await;
        assert_eq!(res.status(), 200, "{init}");
        assert_eq!(res.bytes().await.unwrap(), stream_bytes(&format!("{id}/init.mp4")));
        for n in 1..=SEGMENTS {
            let media = base.join(&rep["media"].as_str().unwrap().replace("$Number%05d$", &format!("{n:05}"))).unwrap();
            let res = get(media.as_str()).await;
            assert_eq!(res.status(), 200, "{media}");
            assert_eq!(res.bytes().await.unwrap(), stream_bytes(&format!("{id}/seg-{n:05}.m4s")), "{media}");
        }
    }
}

#[tokio::test]
async fn ranges_answer_206_and_past_the_end_416_and_conditionals_304() {
    let w = seed().await;
    let pb = Playback::start(&w.db, &[]).await;
    let url = pb.at(&format!("/play/{}/360p/seg-00002.m4s", w.public));
    let whole = stream_bytes("360p/seg-00002.m4s");
    let size = whole.len();
    let client = http();
    let range = |r: &'static str| client.get(&url).header("Range", r).send();

    let res = range("bytes=0-99").await.unwrap();
    assert_eq!(res.status(), 206);
    assert_eq!(header(res.headers(), CONTENT_RANGE), format!("bytes 0-99/{size}"));
    assert_eq!(header(res.headers(), CONTENT_TYPE), "video/mp4");
    assert_eq!(res.bytes().await.unwrap(), whole[..100]);

    let res = range("bytes=-10").await.unwrap();
    assert_eq!(res.status(), 206);
    assert_eq!(header(res.headers(), CONTENT_RANGE), format!("bytes {}-{}/{size}", size - 10, size - 1));
    assert_eq!(res.bytes().await.unwrap(), whole[size - 10..]);

    let res = range("bytes=100-").await.unwrap();
    assert_eq!(res.status(), 206);
    assert_eq!(res.bytes().await.unwrap(), whole[100..]);

    let res = client.get(&url).header("Range", format!("bytes={}-", size + 10)).send().await.unwrap();
    assert_eq!(res.status(), 416);
    assert_eq!(header(res.headers(), CONTENT_RANGE), format!("bytes */{size}"));
    assert_eq!(header(res.headers(), CACHE_CONTROL), "no-store");
    let problem: Value = res.json().await.unwrap();
    assert_eq!(problem["code"], "range_not_satisfiable");

    // A first position too long for any object: 416, not the whole body.
    let res = client.get(&url).header("Range", "bytes=123456789012345678901234-").send().await.unwrap();
    assert_eq!(res.status(), 416);
    assert_eq!(header(res.headers(), CONTENT_RANGE), format!("bytes */{size}"));
    // A last position too long for u64 means "to the end".
    let res = client.get(&url).header("Range", "bytes=100-123456789012345678901234").send().await.unwrap();
    assert_eq!(res.status(), 206);
    assert_eq!(res.bytes().await.unwrap(), whole[100..]);

    // HEAD: the GET's headers and length, no body.
    let res = client.head(&url).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(header(res.headers(), reqwest::header::CONTENT_LENGTH), size.to_string());
    assert_eq!(header(res.headers(), CONTENT_TYPE), "video/mp4");
    assert!(!header(res.headers(), ETAG).is_empty());
    assert!(res.bytes().await.unwrap().is_empty());
    let res = client.head(pb.at(&format!("/play/{}/360p/seg-09999.m4s", w.public))).send().await.unwrap();
    assert_eq!(res.status(), 404, "HEAD of a made-up segment");

    // Not one valid byte range: ignored, the whole object.
    for ignored in ["bytes=0-1,5-9", "bytes=9-5", "lines=0-1"] {
        let res = range(ignored).await.unwrap();
        assert_eq!(res.status(), 200, "{ignored}");
        assert_eq!(res.bytes().await.unwrap().len(), size, "{ignored}");
    }

    // ETag passthrough and conditional GET, media and manifests.
    let res = get(&url).await;
    let etag = header(res.headers(), ETAG).to_owned();
    assert!(!etag.is_empty());
    let res = client.get(&url).header("If-None-Match", &etag).send().await.unwrap();
    assert_eq!(res.status(), 304, "conditional GET");
    assert_eq!(header(res.headers(), ETAG), etag);
    // RFC 9110 §13: weak comparison and lists for If-None-Match (the ETag is
    // sent on every 304), strong If-Match (412), If-Range.
    for inm in [format!("W/{etag}"), format!("\"other\", {etag}"), "*".to_owned()] {
        let res = client.get(&url).header("If-None-Match", &inm).send().await.unwrap();
        assert_eq!(res.status(), 304, "{inm}");
        assert_eq!(header(res.headers(), ETAG), etag, "{inm}");
    }
    let res = client.get(&url).header("If-Match", "\"other\"").send().await.unwrap();
    assert_eq!(res.status(), 412);
    let problem: Value = res.json().await.unwrap();
    assert_eq!(problem["code"], "precondition_failed");
    let res = client.get(&url).header("If-Match", &etag).header("Range", "bytes=0-9").send().await.unwrap();
    assert_eq!(res.status(), 206, "If-Match holds");
    let res = client.get(&url).header("If-Range", &etag).header("Range", "bytes=0-9").send().await.unwrap();
    assert_eq!(res.status(), 206, "If-Range matches: the range");
    assert_eq!(res.bytes().await.unwrap(), whole[..10]);
    let res = client.get(&url).header("If-Range", "\"stale\"").header("Range", "bytes=0-9").send().await.unwrap();
    assert_eq!(res.status(), 200, "If-Range does not match: the whole object");
    assert_eq!(res.bytes().await.unwrap().len(), size);
    let res = client.get(&url).header("If-Modified-Since", "Fri, 01 Jan 2100 00:00:00 GMT").send().await.unwrap();
    assert_eq!(res.status(), 304, "not modified since a later date");
    let res = client.get(&url).header("If-Modified-Since", "Thu, 01 Jan 1970 00:00:00 GMT").send().await.unwrap();
    assert_eq!(res.status(), 200);
    let master = pb.at(&format!("/play/{}.m3u8", w.public));
    let res = get(&master).await;
    let tag = header(res.headers(), ETAG).to_owned();
    assert!(!tag.is_empty());
    let res = client.get(&master).header("If-None-Match", &tag).send().await.unwrap();
    assert_eq!(res.status(), 304);
    assert_eq!(header(res.headers(), CACHE_CONTROL), "public, max-age=10");
    let res = client.get(&master).header("If-None-Match", "\"other\"").send().await.unwrap();
    assert_eq!(res.status(), 200);
}

#[tokio::test]
async fn everything_outside_a_ready_public_stream_is_a_404_problem_without_details() {
    let w = seed().await;
    let pb = Playback::start(&w.db, &[]).await;
    let p = &w.public;
    let unknown = vid_core::PlaybackId::generate();
    let upper = p.to_string().to_uppercase().replacen("PB_", "pb_", 1);
    let paths = [
        format!("/play/{unknown}.m3u8"),
        format!("/play/{unknown}.mpd"),
        format!("/play/{unknown}/360p/init.mp4"),
        format!("/play/{}.m3u8", w.processing),
        format!("/play/{}/360p/seg-00001.m4s", w.processing),
        format!("/play/{}.m3u8", w.no_stream),
        format!("/play/{}.mpd", w.no_stream),
        format!("/play/{p}.mp4"),
        format!("/play/{p}.m3u"),
        format!("/play/{p}.m3u8.m3u8"),
        format!("/play/{p}"),
        format!("/play/{upper}.m3u8"),
        format!("/play/{p}/999p/index.m3u8"),
        format!("/play/{p}/1080p/init.mp4"),
        format!("/play/{p}/video/index.m3u8"),
        format!("/play/{p}/360p/seg-00099.m4s"),
        format!("/play/{p}/360p/seg-1.m4s"),
        format!("/play/{p}/360p/seg-00000.m4s"),
        format!("/play/{p}/360p/master.m3u8"),
        format!("/play/{p}/360p/../../{p}.m3u8"),
        format!("/play/{p}/../{p}.m3u8"),
        format!("/play/{p}/%2e%2e/360p/init.mp4"),
        format!("/play/{p}/360p/%2e%2e%2finit.mp4"),
        format!("/play/{p}/360p/init.mp4/x"),
        format!("/play/{p}/360p//init.mp4"),
        format!("/play/{p}//360p/init.mp4"),
        format!("/play/{p}/360p/init.mp4%00"),
        // One spelling per resource: no query string (a CDN cache key walk-around).
        format!("/play/{p}.m3u8?a=1"),
        format!("/play/{p}.mpd?"),
        format!("/play/{p}/360p/index.m3u8?x"),
        format!("/play/{p}/360p/seg-00001.m4s?token=x"),
        "/play/".into(),
        "/play/.m3u8".into(),
        "/play/master.m3u8".into(),
        "/".into(),
        "/vid-media/x".into(),
    ];
    for path in &paths {
        // Byte for byte, so `..` and escapes reach the server as written.
        let (status, body) = raw_get(&pb.addr, path).await;
        assert_eq!(status, 404, "{path}: {body}");
        let problem: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{path}: not JSON: {body}"));
        assert_eq!(problem["code"], "not_found", "{path}");
        assert_eq!(problem["status"], 404, "{path}");
        assert_no_leak(&w, path, &body);
        assert!(!body.to_lowercase().contains("nosuchkey") && !body.contains("key"), "{path}: {body}");
    }
    // The headers of a 404 (through a normal client).
    let res = get(&pb.at(&format!("/play/{unknown}.m3u8"))).await;
    assert_eq!(res.status(), 404);
    assert_eq!(header(res.headers(), CONTENT_TYPE), "application/problem+json");
    assert_eq!(header(res.headers(), CACHE_CONTROL), "no-store");
    assert_eq!(header(res.headers(), ACCESS_CONTROL_ALLOW_ORIGIN), "*");
}

#[tokio::test]
async fn a_signed_playback_id_needs_a_token() {
    let w = seed().await;
    let pb = Playback::start(&w.db, &[]).await;
    for path in [format!("/play/{}.m3u8", w.signed), format!("/play/{}.mpd", w.signed), format!("/play/{}/360p/seg-00001.m4s", w.signed)] {
        let res = get(&pb.at(&path)).await;
        assert_eq!(res.status(), 403, "{path}");
        assert_eq!(header(res.headers(), CONTENT_TYPE), "application/problem+json");
        assert_eq!(header(res.headers(), CACHE_CONTROL), "no-store");
        let body = res.text().await.unwrap();
        assert_no_leak(&w, &path, &body);
        let problem: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(problem["code"], "playback_token_required", "{path}");
    }
}

#[tokio::test]
async fn cors_preflight_allows_range_and_other_methods_are_405() {
    let w = seed().await;
    let pb = Playback::start(&w.db, &[]).await;
    let url = pb.at(&format!("/play/{}/360p/seg-00001.m4s", w.public));
    let res = http()
        .request(reqwest::Method::OPTIONS, &url)
        .header("Origin", "https://player.example")
        .header("Access-Control-Request-Method", "GET")
        .header("Access-Control-Request-Headers", "range")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    let h = res.headers();
    assert_eq!(header(h, ACCESS_CONTROL_ALLOW_ORIGIN), "*");
    assert!(header(h, "access-control-allow-methods").contains("GET"), "{h:?}");
    assert!(header(h, "access-control-allow-headers").to_ascii_lowercase().contains("range"), "{h:?}");
    // A cross-origin GET with an Authorization header changes nothing: no key is needed or read.
    let res = http().get(&url).header("Origin", "https://player.example").header("Authorization", "Bearer nonsense").send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(header(res.headers(), "access-control-expose-headers").contains("Content-Range"));
    for method in [reqwest::Method::POST, reqwest::Method::PUT, reqwest::Method::DELETE] {
        let res = http().request(method.clone(), pb.at(&format!("/play/{}.m3u8", w.public))).send().await.unwrap();
        assert_eq!(res.status(), 405, "{method}");
        assert!(header(res.headers(), "allow").contains("GET"));
        let problem: Value = res.json().await.unwrap();
        assert_eq!(problem["code"], "method_not_allowed");
    }
    // HEAD: the same head, no body.
    let res = http().head(pb.at(&format!("/play/{}.m3u8", w.public))).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(header(res.headers(), CONTENT_TYPE), "application/vnd.apple.mpegurl");
}

#[tokio::test]
async fn two_replicas_give_identical_answers() {
    let w = seed().await;
    let a = Playback::start(&w.db, &[]).await;
    let b = Playback::start(&w.db, &[]).await;
    let paths = [
        format!("/play/{}.m3u8", w.public),
        format!("/play/{}.mpd", w.public),
        format!("/play/{}/180p/index.m3u8", w.public),
        format!("/play/{}/audio/init.mp4", w.public),
        format!("/play/{}/360p/seg-00003.m4s", w.public),
        format!("/play/{}.m3u8", w.signed),
        format!("/play/{}.m3u8", w.processing),
    ];
    for path in &paths {
        // Twice each: the first answer comes from storage, the second from the caches.
        for round in 0..2 {
            let (ra, rb) = (get(&a.at(path)).await, get(&b.at(path)).await);
            assert_eq!(ra.status(), rb.status(), "{path}");
            for name in [CONTENT_TYPE, CACHE_CONTROL, ETAG, CONTENT_RANGE] {
                assert_eq!(header(ra.headers(), name.clone()), header(rb.headers(), name.clone()), "{path} {name} round {round}");
            }
            assert_eq!(ra.bytes().await.unwrap(), rb.bytes().await.unwrap(), "{path} round {round}");
        }
    }
}

/// Polls `url` until it answers 404; the time that took.
async fn until_404(url: &str, give_up: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let status = get(url).await.status();
        if status == 404 {
            return start.elapsed();
        }
        assert_eq!(status, 200, "{url}");
        assert!(start.elapsed() < give_up, "{url} still plays {give_up:?} after its playback ID was deleted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_deleted_playback_id_stops_within_the_lookup_cache_bound() {
    let w = seed().await;
    // No lookup cache: the very next request.
    let uncached = Playback::start(&w.db, &[("playback.lookup_cache_ms", "0")]).await;
    // The default bound (1 s).
    let cached = Playback::start(&w.db, &[("playback.lookup_cache_ms", "1000")]).await;
    let master = format!("/play/{}.m3u8", w.public);
    let segment = format!("/play/{}/360p/seg-00001.m4s", w.public);
    for p in [&uncached, &cached] {
        for path in [&master, &segment] {
            assert_eq!(get(&p.at(path)).await.status(), 200, "{path}");
        }
    }
    delete_playback_id(&w.db, &w.public).await;
    for path in [&master, &segment] {
        let (status, body) = raw_get(&uncached.addr, path).await;
        assert_eq!(status, 404, "{path} on the next request: {body}");
    }
    // Bound 1 s; the slack is for a loaded machine, not the cache.
    let took = until_404(&cached.at(&master), Duration::from_secs(5)).await;
    assert!(took <= Duration::from_millis(1000) + Duration::from_millis(1500), "{took:?}");
    assert_eq!(get(&cached.at(&segment)).await.status(), 404);
    // The other ID of the same video is untouched (it is signed: 403, not 404).
    assert_eq!(get(&cached.at(&format!("/play/{}.m3u8", w.signed))).await.status(), 403);
}

#[tokio::test]
async fn health_readiness_and_metrics_by_route_pattern() {
    let w = seed().await;
    let pb = Playback::start(&w.db, &[]).await;
    assert_eq!(get(&pb.at("/healthz")).await.status(), 200);
    let res = get(&pb.at("/readyz")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap(), serde_json::json!({"database": true, "storage": true}));
    get(&pb.at(&format!("/play/{}.m3u8", w.public))).await;
    get(&pb.at(&format!("/play/{}/360p/init.mp4", w.public))).await;
    get(&pb.at("/nothing/here")).await;
    let page = get(&pb.at("/metrics")).await.text().await.unwrap();
    for want in [
        r#"route="/play/{pb}.m3u8",status="200""#,
        r#"route="/play/{pb}/{track}/{file}",status="200""#,
        r#"route="unmatched",status="404""#,
        "http_request_duration_seconds_bucket",
        "playback_cache_lookups_total",
    ] {
        assert!(page.contains(want), "{want} missing from /metrics:\n{page}");
    }
    assert!(!page.contains(w.public.as_str()), "no raw path in a label");
}

#[tokio::test]
async fn a_dead_database_makes_it_unready_not_stuck() {
    let w = seed().await;
    let pb = Playback::start(&w.db, &[("database.url", "postgres://postgres@127.0.0.1:1/none")]).await;
    let res = get(&pb.at("/readyz")).await;
    assert_eq!(res.status(), 503);
    assert_eq!(res.json::<Value>().await.unwrap()["database"], false);
    let res = get(&pb.at(&format!("/play/{}.m3u8", w.public))).await;
    assert_eq!(res.status(), 503);
    assert_eq!(header(res.headers(), CACHE_CONTROL), "no-store");
    let body = res.text().await.unwrap();
    assert_no_leak(&w, "a 503", &body);
    assert!(!body.contains("127.0.0.1") && !body.contains("postgres"), "{body}");
}

#[tokio::test]
async fn objects_the_manifests_do_not_list_are_404_before_storage_is_asked() {
    let w = seed().await;
    let pb = Playback::start(&w.db, &[]).await;
    // Stored, but named by no manifest: a track the master does not list,
    // and a segment number past the track's media playlist.
    let settings: vid_playback::Settings = vid_testkit::settings(&[("database.url", w.db.as_str())]);
    let s3 = vid_infra::storage::client(&settings.s3);
    let unlisted = ["999p/init.mp4", "999p/seg-00001.m4s", "360p/seg-09999.m4s"];
    for rel in unlisted {
        s3.put_object().bucket(&w.bucket).key(format!("{}{rel}", w.prefix)).body(b"not listed".to_vec().into()).send().await.unwrap();
    }
    for rel in unlisted {
        let res = get(&pb.at(&format!("/play/{}/{rel}", w.public))).await;
        assert_eq!(res.status(), 404, "{rel} is in storage but in no manifest");
    }
    // What the manifests list still serves.
    let res = get(&pb.at(&format!("/play/{}/360p/seg-00001.m4s", w.public))).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.bytes().await.unwrap(), stream_bytes("360p/seg-00001.m4s"));
}
