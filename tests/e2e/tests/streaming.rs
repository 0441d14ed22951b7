//! Issue 19 end to end: a real clip uploaded through the api is transcoded,
//! packaged and played from its stable playback URLs, with no API key, by
//! independent readers: the `m3u8` and `mpegdash` parsers (PyPI) and ffprobe
//! on the URLs themselves; every segment of every rung, fetched over HTTP,
//! starts with a keyframe at the same instants in every rung
//! (`vid_testkit::stream`). The URLs outlive the presigned-URL lifetime.

use std::path::{Path, PathBuf};
use std::time::Duration;

use vid_client::upload::Uploader;
use vid_core::messages::Mp4Support;
use vid_core::operation::OperationStatus;
use vid_core::playback::PlaybackPolicy;
use vid_e2e::{temp_dir, Stack};
use vid_testkit::stream::{check_stream_dir, probe_codecs};

/// The presigned download URLs' lifetime in this test, seconds: short, so the
/// test can show that playback URLs do not depend on it.
const PRESIGN_TTL: &str = "2";

fn sample(name: &str) -> PathBuf {
    vid_testkit::repo_root().join("fixtures/media").join(name)
}

/// A client with no credentials at all: what a viewer's player is.
fn viewer() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

async fn get(url: &str) -> reqwest::Response {
    viewer().get(url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// The URIs a playlist names: its non-tag lines and its `URI="…"` attributes.
fn playlist_uris(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !line.starts_with('#') {
            out.push(line.to_owned());
        } else if let Some((_, rest)) = line.split_once("URI=\"") {
            out.push(rest.split('"').next().unwrap().to_owned());
        }
    }
    out
}

/// Resolves `uri` against the URL `base` (RFC 3986 §5.2, the cases a playlist uses).
fn resolve(base: &str, uri: &str) -> String {
    reqwest::Url::parse(base).unwrap().join(uri).unwrap().to_string()
}

/// Downloads the stream behind `hls_url` and `dash_url` into `dir` as the
/// playback service serves it: `master.m3u8` and `manifest.mpd` at the top,
/// every other object at its path relative to the master's URL. Returns the
/// number of objects fetched. Checks each answer's status, content type and
/// CORS header on the way.
async fn download(hls_url: &str, dash_url: &str, dir: &Path) -> usize {
    let mut fetched = 0;
    let top = resolve(hls_url, "./");
    let save = |url: &str, bytes: &[u8]| {
        let rel = url.strip_prefix(&top).unwrap_or_else(|| panic!("{url} is not under {top}"));
        let rel = rel.split('?').next().unwrap();
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    };
    let fetch = |url: String, content_type: &'static str| async move {
        let r = get(&url).await;
        assert_eq!(r.status(), 200, "GET {url}");
        assert_eq!(r.headers()["access-control-allow-origin"], "*", "GET {url}");
        let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(ct.starts_with(content_type), "GET {url}: content type {ct}, want {content_type}");
        r.bytes().await.unwrap()
    };
    let master = fetch(hls_url.to_owned(), "application/vnd.apple.mpegurl").await;
    std::fs::write(dir.join("master.m3u8"), &master).unwrap();
    let mpd = fetch(dash_url.to_owned(), "application/dash+xml").await;
    std::fs::write(dir.join("manifest.mpd"), &mpd).unwrap();
    fetched += 2;
    for media in playlist_uris(std::str::from_utf8(&master).unwrap()) {
        let media_url = resolve(hls_url, &media);
        let text = fetch(media_url.clone(), "application/vnd.apple.mpegurl").await;
        save(&media_url, &text);
        fetched += 1;
        let audio = media_url.contains("/audio/");
        for obj in playlist_uris(std::str::from_utf8(&text).unwrap()) {
            let url = resolve(&media_url, &obj);
            let bytes = fetch(url.clone(), if audio { "audio/mp4" } else { "video/mp4" }).await;
            save(&url, &bytes);
            fetched += 1;
        }
    }
    fetched
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_video_is_played_from_its_stable_playback_urls_without_a_key() {
    let stack = Stack::start(&[("VID__UPLOADS__DOWNLOAD_URL_TTL_SECONDS", PRESIGN_TTL)]).await;
    let client = stack.client();
    let source = sample("bigbuckbunny.mp4");
    let accepted = Uploader::new(&client).state_dir(None).upload_file(&source, None).await.expect("upload completes");
    let op = client.wait_operation(&accepted.operation.id, Duration::from_secs(300), |_| {}).await.expect("operation ends");
    assert_eq!(op.status, OperationStatus::Succeeded, "{:?}; logs in {}", op.error, stack.log_dir().display());
    let video = client.get_video(&op.result.unwrap().video_id).await.unwrap();

    // One public playback ID (the default policy), with its two stable URLs.
    assert_eq!(video.playback_ids.len(), 1, "{:?}", video.playback_ids);
    let pb = &video.playback_ids[0];
    assert_eq!(pb.policy, PlaybackPolicy::Public);
    assert!(pb.hls_url.ends_with(&format!("/play/{}.m3u8", pb.id)), "{}", pb.hls_url);
    assert!(pb.dash_url.ends_with(&format!("/play/{}.mpd", pb.id)), "{}", pb.dash_url);
    assert_eq!(video.mp4_support, Mp4Support::Standard);
    assert_eq!(video.renditions.len(), 3, "the static MP4s stay by default");

    // Fetched with no key, the stream passes every check the packaging tests make.
    let dir = temp_dir();
    let objects = download(&pb.hls_url, &pb.dash_url, &dir).await;
    let expect = [("720p", 1280, 720), ("480p", 854, 480), ("360p", 640, 360)];
    check_stream_dir(&dir, &source, &expect, true, &format!("{}/", pb.id));
    for url in [&pb.hls_url, &pb.dash_url] {
        let codecs = probe_codecs(url);
        assert!(codecs.iter().any(|c| c == "h264") && codecs.iter().any(|c| c == "aac"), "ffprobe {url}: {codecs:?}");
    }

    // Nothing served names the bucket, the key layout or the tenant.
    let tenant = stack.tenant_of_video(video.id.as_str());
    let bucket = stack.env_value("VID__S3__BUCKET").unwrap_or("vid-media").to_owned();
    for entry in walk(&dir) {
        if entry.extension().is_some_and(|e| e == "m3u8" || e == "mpd") {
            let text = std::fs::read_to_string(&entry).unwrap();
            for secret in [tenant.as_str(), bucket.as_str(), "tenants/", "X-Amz-"] {
                assert!(!text.contains(secret), "{} shows {secret}: {text}", entry.display());
            }
        }
    }

    // Range requests on a segment: 206 with the bytes asked for; beyond the object, 416.
    let seg = resolve(&pb.hls_url, &format!("{}/720p/seg-00001.m4s", pb.id));
    let whole = std::fs::read(dir.join(format!("{}/720p/seg-00001.m4s", pb.id))).unwrap();
    let r = viewer().get(&seg).header("Range", "bytes=10-19").send().await.unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(r.headers()["content-range"].to_str().unwrap(), format!("bytes 10-19/{}", whole.len()));
    assert_eq!(r.bytes().await.unwrap().as_ref(), &whole[10..20]);
    let r = viewer().get(&seg).header("Range", format!("bytes={}-", whole.len() + 10)).send().await.unwrap();
    assert_eq!(r.status(), 416);

    // The playback URLs do not expire with the presigned download URLs.
    let expired_at = video.renditions[0].url_expires_at.expect("a presigned download URL");
    while chrono::Utc::now() <= expired_at + chrono::Duration::seconds(1) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = viewer().get(video.renditions[0].url.as_ref().unwrap()).send().await.unwrap();
    assert!(r.status().is_client_error(), "the presigned MP4 URL has expired: {}", r.status());
    let again = std::env::temp_dir().join(format!("vid-e2e-again-{}", vid_testkit::unique_prefix()));
    std::fs::create_dir_all(&again).unwrap();
    assert_eq!(download(&pb.hls_url, &pb.dash_url, &again).await, objects, "the whole stream still plays");

    // A removed playback ID stops playing within the lookup cache's bound
    // (`playback.lookup_cache_ms`, 1 s by default; polled up to 10 s here).
    client.delete_playback_id(&video.id, &pb.id).await.expect("playback id removed");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let r = loop {
        let r = get(&pb.hls_url).await;
        if r.status() != 200 || std::time::Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(r.status(), 404, "a deleted playback ID still plays");
    assert!(!r.text().await.unwrap().contains(&tenant));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_mp4_support_the_video_is_only_streamed() {
    let stack = Stack::start(&[]).await;
    let client = stack.client();
    let source = sample("carphone_pristine.mp4");
    let uploader = Uploader::new(&client).state_dir(None).mp4_support(Some(Mp4Support::None));
    let accepted = uploader.upload_file(&source, None).await.expect("upload completes");
    let op = client.wait_operation(&accepted.operation.id, Duration::from_secs(300), |_| {}).await.expect("operation ends");
    assert_eq!(op.status, OperationStatus::Succeeded, "{:?}; logs in {}", op.error, stack.log_dir().display());
    let video = client.get_video(&op.result.unwrap().video_id).await.unwrap();
    assert_eq!(video.mp4_support, Mp4Support::None);
    assert!(video.renditions.is_empty(), "no static renditions: {:?}", video.renditions);
    let mp4s: Vec<String> = vid_e2e::list_keys(&stack.outputs_prefix(video.id.as_str()))
        .await
        .into_iter()
        .filter(|k| k.ends_with(".mp4") && !k.contains("/stream/"))
        .collect();
    assert!(mp4s.is_empty(), "no MP4 objects in storage: {mp4s:?}");
    let pb = &video.playback_ids[0];
    let dir = temp_dir();
    download(&pb.hls_url, &pb.dash_url, &dir).await;
    check_stream_dir(&dir, &source, &[("144p", 192, 144)], false, &format!("{}/", pb.id));
}

/// Every file below `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
