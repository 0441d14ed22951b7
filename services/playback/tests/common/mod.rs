//! Test support: a real stream (made once per test binary with the ffmpeg
//! CLI, in the transcoder's object layout), seeded into a fresh database and
//! the local Garage, and the playback service spawned in-process.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use diesel_async::RunQueryDsl;
use vid_core::messages::StreamOutputs;
use vid_core::{OperationId, PlaybackId, TenantId, UploadId, VideoId};
use vid_playback::{Application, Settings};

/// Rungs of the test stream: (name, width, height).
pub const RUNGS: [(&str, u32, u32); 2] = [("360p", 640, 360), ("180p", 320, 180)];
/// Segments per track (1 s each).
pub const SEGMENTS: usize = 3;

/// The stream directory: `master.m3u8`, `manifest.mpd`, and per track
/// (`360p`, `180p`, `audio`) `index.m3u8`, `init.mp4`, `seg-0000N.m4s`.
pub fn stream_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("vid-playback-stream-{}", vid_testkit::unique_prefix()));
        for (name, w, h) in RUNGS {
            std::fs::create_dir_all(dir.join(name)).unwrap();
            ffmpeg(
                &dir,
                &[
                    "-f",
                    "lavfi",
                    "-i",
                    &format!("testsrc2=size={w}x{h}:rate=25"),
                    "-t",
                    "3",
                    "-an",
                    "-c:v",
                    "libx264",
                    "-profile:v",
                    "main",
                    "-pix_fmt",
                    "yuv420p",
                    "-g",
                    "25",
                    "-keyint_min",
                    "25",
                    "-sc_threshold",
                    "0",
                    "-b:v",
                    "200k",
                ],
                name,
            );
        }
        std::fs::create_dir_all(dir.join("audio")).unwrap();
        ffmpeg(&dir, &["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000", "-t", "3", "-c:a", "aac", "-b:a", "64k"], "audio");
        std::fs::write(dir.join("master.m3u8"), MASTER).unwrap();
        std::fs::write(dir.join("manifest.mpd"), MPD).unwrap();
        dir
    })
}

fn ffmpeg(dir: &Path, input: &[&str], track: &str) {
    let out = Command::new("ffmpeg")
        .current_dir(dir)
        .args(["-hide_banner", "-loglevel", "error", "-y"])
        .args(input)
        .args(["-f", "hls", "-hls_time", "1", "-hls_playlist_type", "vod", "-hls_segment_type", "fmp4"])
        .args(["-hls_fmp4_init_filename", "init.mp4", "-start_number", "1"])
        .arg("-hls_segment_filename")
        .arg(format!("{track}/seg-%05d.m4s"))
        .arg(format!("{track}/index.m3u8"))
        .output()
        .expect("ffmpeg runs");
    assert!(out.status.success(), "ffmpeg {track}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The master playlist, in the transcoder's format (relative URIs).
const MASTER: &str = "#EXTM3U\n#EXT-X-VERSION:7\n#EXT-X-INDEPENDENT-SEGMENTS\n\
#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"audio\",NAME=\"Audio\",DEFAULT=YES,AUTOSELECT=YES,CHANNELS=\"1\",URI=\"audio/index.m3u8\"\n\
#EXT-X-STREAM-INF:BANDWIDTH=300000,AVERAGE-BANDWIDTH=250000,CODECS=\"avc1.4d401e,mp4a.40.2\",RESOLUTION=640x360,FRAME-RATE=25.000,AUDIO=\"audio\"\n\
360p/index.m3u8\n\
#EXT-X-STREAM-INF:BANDWIDTH=150000,AVERAGE-BANDWIDTH=120000,CODECS=\"avc1.4d400d,mp4a.40.2\",RESOLUTION=320x180,FRAME-RATE=25.000,AUDIO=\"audio\"\n\
180p/index.m3u8\n";

/// The MPD, in the transcoder's format (relative templates).
const MPD: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" profiles=\"urn:mpeg:dash:profile:isoff-live:2011\" type=\"static\" mediaPresentationDuration=\"PT3.000S\" minBufferTime=\"PT1.0S\">\n\
<Period id=\"0\" start=\"PT0S\">\n\
<AdaptationSet id=\"0\" contentType=\"video\" mimeType=\"video/mp4\" segmentAlignment=\"true\" startWithSAP=\"1\">\n\
<Representation id=\"360p\" codecs=\"avc1.4d401e\" bandwidth=\"300000\" width=\"640\" height=\"360\" sar=\"1:1\" frameRate=\"25\"><SegmentTemplate timescale=\"1000\" duration=\"1000\" initialization=\"360p/init.mp4\" media=\"360p/seg-$Number%05d$.m4s\" startNumber=\"1\"/></Representation>\n\
<Representation id=\"180p\" codecs=\"avc1.4d400d\" bandwidth=\"150000\" width=\"320\" height=\"180\" sar=\"1:1\" frameRate=\"25\"><SegmentTemplate timescale=\"1000\" duration=\"1000\" initialization=\"180p/init.mp4\" media=\"180p/seg-$Number%05d$.m4s\" startNumber=\"1\"/></Representation>\n\
</AdaptationSet>\n\
<AdaptationSet id=\"1\" contentType=\"audio\" mimeType=\"audio/mp4\" segmentAlignment=\"true\" startWithSAP=\"1\" lang=\"und\">\n\
<Representation id=\"audio\" codecs=\"mp4a.40.2\" bandwidth=\"64000\" audioSamplingRate=\"48000\"><SegmentTemplate timescale=\"1000\" duration=\"1000\" initialization=\"audio/init.mp4\" media=\"audio/seg-$Number%05d$.m4s\" startNumber=\"1\"/></Representation>\n\
</AdaptationSet>\n</Period>\n</MPD>\n";

/// Every file of the stream: (path relative to the stream dir, content type).
pub fn stream_files() -> Vec<(String, &'static str)> {
    let dir = stream_dir();
    let mut files = vec![("master.m3u8".to_owned(), "application/vnd.apple.mpegurl"), ("manifest.mpd".to_owned(), "application/dash+xml")];
    for track in RUNGS.iter().map(|r| r.0).chain(["audio"]) {
        let ct = if track == "audio" { "audio/mp4" } else { "video/mp4" };
        for entry in std::fs::read_dir(dir.join(track)).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            let t = if name.ends_with(".m3u8") { "application/vnd.apple.mpegurl" } else { ct };
            files.push((format!("{track}/{name}"), t));
        }
    }
    files.sort();
    files
}

/// The bytes of stream file `rel`.
pub fn stream_bytes(rel: &str) -> Vec<u8> {
    std::fs::read(stream_dir().join(rel)).unwrap()
}

/// A seeded world: one tenant, a ready video with its stream in Garage, and
/// playback IDs of every kind.
pub struct World {
    /// Database URL.
    pub db: String,
    /// The tenant id (must appear in no answer).
    pub tenant: String,
    /// The stream's storage prefix (must appear in no answer).
    pub prefix: String,
    /// The bucket name (must appear in no answer).
    pub bucket: String,
    /// A public id of the ready video.
    pub public: PlaybackId,
    /// A signed id of the ready video.
    pub signed: PlaybackId,
    /// A public id of a video still processing.
    pub processing: PlaybackId,
    /// A public id of a ready video made before streaming (no `stream`).
    pub no_stream: PlaybackId,
}

/// Seeds a fresh database and uploads the stream's objects.
pub async fn seed() -> World {
    let db = vid_testkit::fresh_database().await;
    let settings: Settings = vid_testkit::settings(&[("database.url", db.as_str())]);
    let s3 = vid_infra::storage::client(&settings.s3);
    let bucket = settings.s3.bucket.clone();
    let tenant = TenantId::generate().to_string();
    let ready = VideoId::generate().to_string();
    let prefix = format!("tenants/{tenant}/videos/{ready}/stream/");
    for (rel, content_type) in stream_files() {
        s3.put_object()
            .bucket(&bucket)
            .key(format!("{prefix}{rel}"))
            .content_type(content_type)
            .body(stream_bytes(&rel).into())
            .send()
            .await
            .unwrap_or_else(|e| panic!("put {rel}: {}", aws_sdk_s3::error::DisplayErrorContext(e)));
    }
    let stream = StreamOutputs {
        prefix: prefix.clone(),
        hls_master_key: format!("{prefix}master.m3u8"),
        dash_manifest_key: format!("{prefix}manifest.mpd"),
        segment_duration_ms: 1000,
        objects: stream_files().len() as u32,
        size_bytes: 0,
        images: None,
    };
    let mut conn = diesel_async::AsyncPgConnection::establish_url(&db).await;
    diesel::sql_query(format!("INSERT INTO tenants (id, name) VALUES ('{tenant}', 'playback test')")).execute(&mut conn).await.unwrap();
    let w = World {
        db: db.clone(),
        tenant: tenant.clone(),
        prefix,
        bucket,
        public: PlaybackId::generate(),
        signed: PlaybackId::generate(),
        processing: PlaybackId::generate(),
        no_stream: PlaybackId::generate(),
    };
    let stream_json = serde_json::to_string(&stream).unwrap();
    for (video, status, stream, ids) in [
        (ready.clone(), "ready", Some(stream_json), vec![(&w.public, "public"), (&w.signed, "signed")]),
        (VideoId::generate().to_string(), "processing", None, vec![(&w.processing, "public")]),
        (VideoId::generate().to_string(), "ready", None, vec![(&w.no_stream, "public")]),
    ] {
        let upload = UploadId::generate();
        diesel::sql_query(format!(
            "INSERT INTO uploads (id, tenant_id, status, size_bytes, content_type, part_size, part_count, storage_key, s3_upload_id, video_id, expires_at) \
             VALUES ('{upload}', '{tenant}', 'completed', 1, 'video/mp4', 1, 1, 'k', 'x', '{video}', now() + interval '1 day')"
        ))
        .execute(&mut conn)
        .await
        .unwrap();
        let stream_sql = stream.map(|s| format!("'{}'::jsonb", s.replace('\'', "''"))).unwrap_or_else(|| "NULL".into());
        diesel::sql_query(format!(
            "INSERT INTO videos (id, tenant_id, upload_id, operation_id, status, content_type, source_key, stream) \
             VALUES ('{video}', '{tenant}', '{upload}', '{}', '{status}', 'video/mp4', 'k', {stream_sql})",
            OperationId::generate()
        ))
        .execute(&mut conn)
        .await
        .unwrap();
        for (id, policy) in ids {
            diesel::sql_query(format!(
                "INSERT INTO playback_ids (id, tenant_id, video_id, policy) VALUES ('{id}', '{tenant}', '{video}', '{policy}')"
            ))
            .execute(&mut conn)
            .await
            .unwrap();
        }
    }
    w
}

/// Deletes playback ID `id` (as the api's `DELETE /videos/{id}/playback-ids/{pb}` does).
pub async fn delete_playback_id(db: &str, id: &PlaybackId) {
    let mut conn = diesel_async::AsyncPgConnection::establish_url(db).await;
    let n = diesel::sql_query(format!("DELETE FROM playback_ids WHERE id = '{id}'")).execute(&mut conn).await.unwrap();
    assert_eq!(n, 1);
}

trait Establish {
    async fn establish_url(url: &str) -> Self;
}

impl Establish for diesel_async::AsyncPgConnection {
    async fn establish_url(url: &str) -> Self {
        <Self as diesel_async::AsyncConnection>::establish(url).await.expect("connect to the test database")
    }
}

/// A running playback service.
pub struct Playback {
    /// `http://127.0.0.1:<port>`
    pub url: String,
    /// `127.0.0.1:<port>`
    pub addr: String,
}

impl Playback {
    /// Spawns the service on `db` with `overrides` (dotted setting keys).
    pub async fn start(db: &str, overrides: &[(&str, &str)]) -> Playback {
        let mut all = vec![("database.url", db), ("playback.listen", "127.0.0.1:0"), ("playback.workers", "2")];
        all.extend_from_slice(overrides);
        let settings: Settings = vid_testkit::settings(&all);
        let app = Application::build(settings).expect("playback builds");
        let addr = format!("127.0.0.1:{}", app.port());
        tokio::spawn(app.run());
        Playback { url: format!("http://{addr}"), addr }
    }

    /// `url` + `path`.
    pub fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }
}

/// A client that follows no redirect and sends no key.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// Sends `GET <path>` byte for byte (no client-side normalisation of `..`
/// or percent-escapes); returns the status and the body.
pub async fn raw_get(addr: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// Runs `tests/support/check.py <mode> <url>` with the pinned parsers
/// (`VID_TEST_PYTHON`, set by `make test`; else `.local/media-venv`, else python3).
pub fn parsers(mode: &str, url: &str) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/check.py");
    let out = Command::new(python()).arg(&script).arg(mode).arg(url).output().expect("python runs");
    assert!(out.status.success(), "the parsers refused {url}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The Python with the pinned test packages (m3u8, mpegdash, PyJWT):
/// `VID_TEST_PYTHON` (set by `make test`), else `.local/media-venv`, else python3.
pub fn python() -> String {
    let venv = vid_testkit::repo_root().join(".local/media-venv/bin/python");
    std::env::var("VID_TEST_PYTHON").unwrap_or_else(|_| if venv.exists() { venv.display().to_string() } else { "python3".into() })
}
