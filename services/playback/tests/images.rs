//! The images of a playback ID (issue 20) against the real PostgreSQL and
//! Garage: the seeded stream of `common` gets the transcoder's image
//! objects (frames made here with the ffmpeg CLI from a `testsrc2` clip:
//! `frames/<ms>.jpg` at 0, 1, 2, 3 s and the last frame, 3.96 s) and its
//! `StreamImages`. Checked: thumbnails at 0, the middle and past the end
//! are those frames (compared with the CLI's frame at that time), widths 1
//! and above the source, the second request served from the stored
//! thumbnail (the object exists; `X-Thumbnail-Cache: hit`), bad parameters
//! as problems, the storyboard files and the poster as stored.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use diesel_async::RunQueryDsl;
use vid_core::messages::{StreamImages, StreamOutputs};
use vid_testkit::frames::{diff, grey_thumbnail as grey};

const FRAMES_MS: [u64; 5] = [0, 1000, 2000, 3000, 3960];

struct Clip {
    dir: tempfile::TempDir,
    src: PathBuf,
}

fn ffmpeg(args: &[&str]) {
    let out = Command::new("ffmpeg").args(["-v", "error", "-y", "-nostdin"]).args(args).output().expect("ffmpeg runs");
    assert!(out.status.success(), "ffmpeg {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A 640×360 4 s `testsrc2` clip and its frames at [`FRAMES_MS`].
fn clip() -> Clip {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.mp4");
    let s = src.to_str().unwrap();
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=640x360:rate=25:duration=4",
        "-c:v",
        "libx264",
        "-preset",
        "ultrafast",
        "-pix_fmt",
        "yuv420p",
        s,
    ]);
    std::fs::create_dir_all(dir.path().join("frames")).unwrap();
    for ms in FRAMES_MS {
        let out = dir.path().join(format!("frames/{ms}.jpg"));
        ffmpeg(&["-ss", &format!("{}", ms as f64 / 1000.0), "-i", s, "-frames:v", "1", "-q:v", "3", out.to_str().unwrap()]);
    }
    Clip { dir, src }
}

/// (width, height) of an image file, by ffprobe.
fn size_of(path: &Path) -> (u64, u64) {
    let v = vid_testkit::stream::ffprobe(path);
    (v["streams"][0]["width"].as_u64().unwrap(), v["streams"][0]["height"].as_u64().unwrap())
}

/// Uploads the image objects under the seeded stream's prefix and adds `images` to its row.
async fn with_images(w: &World, clip: &Clip) -> StreamImages {
    let settings: vid_playback::Settings = vid_testkit::settings(&[("database.url", w.db.as_str())]);
    let s3 = vid_infra::storage::client(&settings.s3);
    let put = |key: String, body: Vec<u8>, ct: &'static str| {
        let s3 = s3.clone();
        let bucket = w.bucket.clone();
        async move { s3.put_object().bucket(bucket).key(key).content_type(ct).body(body.into()).send().await.unwrap() }
    };
    for ms in FRAMES_MS {
        put(format!("{}frames/{ms}.jpg", w.prefix), std::fs::read(clip.dir.path().join(format!("frames/{ms}.jpg"))).unwrap(), "image/jpeg")
            .await;
    }
    put(format!("{}poster.jpg", w.prefix), std::fs::read(clip.dir.path().join("frames/2000.jpg")).unwrap(), "image/jpeg").await;
    put(format!("{}storyboard.jpg", w.prefix), std::fs::read(clip.dir.path().join("frames/1000.jpg")).unwrap(), "image/jpeg").await;
    put(format!("{}storyboard.vtt", w.prefix), VTT.as_bytes().to_vec(), "text/vtt").await;
    put(format!("{}storyboard.json", w.prefix), JSON.as_bytes().to_vec(), "application/json").await;
    let images = StreamImages {
        interval_ms: 1000,
        tile_width: 160,
        tile_height: 90,
        frames_ms: FRAMES_MS.to_vec(),
        frame_width: 640,
        frame_height: 360,
        duration_ms: 4000,
    };
    let mut conn = <diesel_async::AsyncPgConnection as diesel_async::AsyncConnection>::establish(&w.db).await.unwrap();
    let rows: Vec<StreamRow> =
        diesel::sql_query(format!("SELECT stream::text AS stream FROM videos WHERE stream->>'prefix' = '{}'", w.prefix))
            .load(&mut conn)
            .await
            .unwrap();
    let mut stream: StreamOutputs = serde_json::from_str(&rows[0].stream).unwrap();
    stream.images = Some(images.clone());
    let json = serde_json::to_string(&stream).unwrap();
    let n = diesel::sql_query(format!("UPDATE videos SET stream = '{json}'::jsonb WHERE stream->>'prefix' = '{}'", w.prefix))
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(n, 1);
    images
}

#[derive(diesel::QueryableByName)]
struct StreamRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    stream: String,
}

const VTT: &str = "WEBVTT\n\n00:00:00.000 --> 00:00:01.000\nstoryboard.jpg#xywh=0,0,160,90\n\n";
const JSON: &str = r#"{"url":"storyboard.jpg","tile_width":160,"tile_height":90,"duration":4.0,"tiles":[{"start":0.0,"x":0,"y":0}]}"#;

struct Got {
    status: u16,
    cache: String,
    content_type: String,
    cache_control: String,
    etag: String,
    body: Vec<u8>,
}

async fn get(url: &str) -> Got {
    let res = http().get(url).send().await.unwrap();
    let h = |n: &str| res.headers().get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let (status, cache, content_type, cache_control, etag) =
        (res.status().as_u16(), h("x-thumbnail-cache"), h("content-type"), h("cache-control"), h("etag"));
    Got { status, cache, content_type, cache_control, etag, body: res.bytes().await.unwrap().to_vec() }
}

#[tokio::test]
async fn thumbnails_are_the_nearest_frames_resized_once_and_then_served_from_storage() {
    let (w, clip) = (seed().await, clip());
    with_images(&w, &clip).await;
    let pb = Playback::start(&w.db, &[]).await;
    let out = clip.dir.path();
    let thumb = |query: &str| pb.at(&format!("/play/{}/thumbnail.jpg?{query}", w.public));

    // At 0, the middle and past the end: the frames at 0, 2 s and the last (3.96 s).
    for (query, at, wrong, size) in [
        ("time=0&width=320", 0.0, 2.0, (320, 180)),
        ("time=2.1&width=200", 2.0, 3.0, (200, 113)),
        ("time=600&width=320", 3.96, 2.0, (320, 180)),
    ] {
        let first = get(&thumb(query)).await;
        assert_eq!((first.status, first.cache.as_str(), first.content_type.as_str()), (200, "miss", "image/jpeg"), "{query}");
        assert!(first.cache_control.starts_with("public, max-age="), "{query}: {}", first.cache_control);
        let file = out.join("got.jpg");
        std::fs::write(&file, &first.body).unwrap();
        assert_eq!(size_of(&file), size, "{query}");
        let (d_right, d_wrong) =
            (diff(&grey(&file, None), &grey(&clip.src, Some(at))), diff(&grey(&file, None), &grey(&clip.src, Some(wrong))));
        assert!(d_right < 8.0 && d_right < d_wrong, "{query}: the frame at {at} s ({d_right:.1}), not at {wrong} s ({d_wrong:.1})");

        let second = get(&thumb(query)).await;
        assert_eq!((second.status, second.cache.as_str()), (200, "hit"), "{query}: the second request is served from storage");
        assert_eq!(second.body, first.body, "{query}");
    }
    let settings: vid_playback::Settings = vid_testkit::settings(&[("database.url", w.db.as_str())]);
    let s3 = vid_infra::storage::client(&settings.s3);
    let stored = s3.head_object().bucket(&w.bucket).key(format!("{}thumbnails/3960_320.jpg", w.prefix)).send().await.unwrap();
    assert_eq!(stored.content_type(), Some("image/jpeg"));

    // Once made, this replica answers from memory (thumbnails are
    // immutable): with the stored object gone it is still a hit, with the
    // same bytes and ETag and a 304 for that ETag; a fresh replica has to
    // resize it again.
    let before = get(&thumb("time=600&width=320")).await;
    s3.delete_object().bucket(&w.bucket).key(format!("{}thumbnails/3960_320.jpg", w.prefix)).send().await.unwrap();
    let after = get(&thumb("time=600&width=320")).await;
    assert_eq!((after.status, after.cache.as_str(), &after.etag), (200, "hit", &before.etag));
    assert_eq!(after.body, before.body);
    assert!(!after.etag.is_empty());
    let revalidated = http().get(thumb("time=600&width=320")).header("If-None-Match", &after.etag).send().await.unwrap();
    assert_eq!(revalidated.status().as_u16(), 304);
    let fresh = Playback::start(&w.db, &[]).await;
    let other = get(&fresh.at(&format!("/play/{}/thumbnail.jpg?time=600&width=320", w.public))).await;
    assert_eq!((other.status, other.cache.as_str()), (200, "miss"), "another replica's memory is its own");

    // Width 1, and above the source: clamped to the frame, served as stored.
    let one = get(&thumb("time=1&width=1")).await;
    assert_eq!(one.status, 200);
    std::fs::write(out.join("one.jpg"), &one.body).unwrap();
    assert_eq!(size_of(&out.join("one.jpg")), (1, 1));
    let big = get(&thumb("time=1&width=5000")).await;
    assert_eq!((big.status, big.cache.as_str()), (200, "source"));
    assert_eq!(big.body, std::fs::read(out.join("frames/1000.jpg")).unwrap(), "the kept frame itself");
    let default = get(&pb.at(&format!("/play/{}/thumbnail.jpg", w.public))).await;
    assert_eq!(default.body, std::fs::read(out.join("frames/2000.jpg")).unwrap(), "no parameters: the middle, full width");
}

#[tokio::test]
async fn bad_thumbnail_parameters_are_problems_and_the_other_images_are_served_as_stored() {
    let (w, clip) = (seed().await, clip());
    with_images(&w, &clip).await;
    let pb = Playback::start(&w.db, &[]).await;
    let thumb = |query: &str| pb.at(&format!("/play/{}/thumbnail.jpg?{query}", w.public));
    for bad in ["width=0", "width=-5", "width=abc", "time=-1", "time=abc", "time=1e3", "time=inf", "time=", "width=1.5"] {
        let g = get(&thumb(bad)).await;
        assert_eq!((g.status, g.content_type.as_str()), (400, "application/problem+json"), "{bad}");
        let p: serde_json::Value = serde_json::from_slice(&g.body).unwrap();
        assert_eq!(p["code"], "invalid_parameter", "{bad}");
        assert_eq!(g.cache_control, "no-store");
    }
    for outside in ["width=10&width=20", "time=1&time=2", "height=10", "time=1&x=1"] {
        let g = get(&thumb(outside)).await;
        assert_eq!(g.status, 404, "{outside}");
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&g.body).unwrap()["code"], "not_found");
    }

    let out = clip.dir.path();
    for (file, ct, body) in [
        ("storyboard.vtt", "text/vtt; charset=utf-8", VTT.as_bytes().to_vec()),
        ("storyboard.json", "application/json", JSON.as_bytes().to_vec()),
        ("storyboard.jpg", "image/jpeg", std::fs::read(out.join("frames/1000.jpg")).unwrap()),
        ("poster.jpg", "image/jpeg", std::fs::read(out.join("frames/2000.jpg")).unwrap()),
    ] {
        let g = get(&pb.at(&format!("/play/{}/{file}", w.public))).await;
        assert_eq!((g.status, g.content_type.as_str()), (200, ct), "{file}");
        assert_eq!(g.body, body, "{file}");
        assert!(g.cache_control.contains("immutable"), "{file}: {}", g.cache_control);
        assert_eq!(get(&pb.at(&format!("/play/{}/{file}?x=1", w.public))).await.status, 404, "{file}: no query");
        let signed = get(&pb.at(&format!("/play/{}/{file}", w.signed))).await;
        assert_eq!(signed.status, 403, "{file} of a signed ID without a token");
        assert_eq!(get(&pb.at(&format!("/play/{}/{file}", w.no_stream))).await.status, 404, "{file} of a video without a stream");
    }
    // The storyboard indexes and the manifests carry the stored ETag and honour the preconditions.
    let settings: vid_playback::Settings = vid_testkit::settings(&[("database.url", w.db.as_str())]);
    let s3 = vid_infra::storage::client(&settings.s3);
    let stored = s3.head_object().bucket(&w.bucket).key(format!("{}storyboard.vtt", w.prefix)).send().await.unwrap();
    let vtt = pb.at(&format!("/play/{}/storyboard.vtt", w.public));
    assert_eq!(get(&vtt).await.etag, stored.e_tag().unwrap(), "storyboard.vtt");
    let with = |url: &str, name: &'static str, value: &str| http().get(url).header(name, value).send();
    assert_eq!(with(&vtt, "if-none-match", stored.e_tag().unwrap()).await.unwrap().status(), 304);
    assert_eq!(with(&vtt, "if-match", "\"nope\"").await.unwrap().status(), 412);
    let master = pb.at(&format!("/play/{}.m3u8", w.public));
    let tag = get(&master).await.etag;
    assert!(!tag.is_empty());
    assert_eq!(with(&master, "if-match", &tag).await.unwrap().status(), 200, "the manifest's own ETag");
    assert_eq!(with(&master, "if-match", "\"nope\"").await.unwrap().status(), 412, "a manifest honours If-Match");
    for bad in ["Poster.jpg", "thumbnail.webp", "frames", "storyboard.jpeg"] {
        assert_eq!(get(&pb.at(&format!("/play/{}/{bad}", w.public))).await.status, 404, "{bad}");
    }
}

/// Concurrent cold requests (issue 20 review): 6 each of 3 widths of one
/// frame at once. Each (frame, width) is resized once (single flight:
/// exactly one `miss` per width, the others `hit`, served from what it
/// stored), and the per-video bound of one resize queues the widths instead
/// of refusing them (all `200`, no `503`).
#[tokio::test]
async fn concurrent_cold_thumbnails_are_resized_once_per_width() {
    let (w, clip) = (seed().await, clip());
    with_images(&w, &clip).await;
    let pb = Playback::start(&w.db, &[]).await;
    let widths = [300u32, 301, 302];
    let urls: Vec<(u32, String)> =
        (0..6).flat_map(|_| widths.iter().map(|&wd| (wd, pb.at(&format!("/play/{}/thumbnail.jpg?time=1&width={wd}", w.public))))).collect();
    let got = futures::future::join_all(urls.iter().map(|(wd, url)| async move { (*wd, get(url).await) })).await;
    for wd in widths {
        let of: Vec<&Got> = got.iter().filter(|(x, _)| *x == wd).map(|(_, g)| g).collect();
        let statuses: Vec<u16> = of.iter().map(|g| g.status).collect();
        assert!(statuses.iter().all(|s| *s == 200), "width {wd}: {statuses:?}");
        let caches: Vec<&str> = of.iter().map(|g| g.cache.as_str()).collect();
        assert_eq!(caches.iter().filter(|c| **c == "miss").count(), 1, "width {wd}: one resize, {caches:?}");
        assert_eq!(caches.iter().filter(|c| **c == "hit").count(), 5, "width {wd}: {caches:?}");
        assert!(of.iter().all(|g| g.body == of[0].body), "width {wd}: one picture");
    }
    // The cold answer and the hits carry the stored object's ETag.
    let settings: vid_playback::Settings = vid_testkit::settings(&[("database.url", w.db.as_str())]);
    let s3 = vid_infra::storage::client(&settings.s3);
    let stored = s3.head_object().bucket(&w.bucket).key(format!("{}thumbnails/1000_300.jpg", w.prefix)).send().await.unwrap();
    let etags: Vec<&str> = got.iter().filter(|(x, _)| *x == 300).map(|(_, g)| g.etag.as_str()).collect();
    assert!(stored.e_tag().is_some_and(|e| etags.iter().all(|g| *g == e)), "{etags:?} vs {:?}", stored.e_tag());
}
