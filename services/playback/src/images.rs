//! The images of a playback ID (issue 20): storyboard, thumbnails, poster.
//!
//! ```text
//! GET|HEAD /play/{pb}/storyboard.jpg                  sprite sheet            image/jpeg        audience s
//! GET|HEAD /play/{pb}/storyboard.vtt                  WebVTT index            text/vtt          audience s
//! GET|HEAD /play/{pb}/storyboard.json                 JSON index (Mux shape)  application/json  audience s
//! GET|HEAD /play/{pb}/thumbnail.jpg?time=<s>&width=<px>  a frame              image/jpeg        audience t
//! GET|HEAD /play/{pb}/poster.jpg                      the poster              image/jpeg        audience g
//! ```
//!
//! The transcoder made everything ahead of time in its one decode pass
//! ([`vid_core::messages::StreamImages`]): the sheet and its indexes, the
//! poster, and the tallest rung's frame at every storyboard instant plus the
//! last frame (`frames/<ms>.jpg`). No libav here.
//!
//! **Thumbnails.** `time` (seconds: ASCII digits with an optional
//! fraction, no sign or exponent; absent: the middle of the video) picks the
//! NEAREST kept frame, so the frame shown is at most half the storyboard
//! interval from `time` (interval: `max(1 s, duration / 100)` rounded up to
//! 0.5 s); a time past the end gives the last frame. `width` (an integer
//! ≥ 1, no leading zero; absent: the frame's width) above the frame's width
//! is clamped to it (the frames are the tallest rung's, i.e. the source's
//! display size capped by the ladder); the height keeps the aspect
//! (rounded, ≥ 1). A bad value is `400 invalid_parameter`; an unknown
//! parameter or a repeated one is `404` like any path outside the grammar
//! ([`crate::token::check_query`]); `token` is the signed-playback one.
//!
//! At the frame's own width the frame object is served as stored. Any
//! other width is resized here with the pure-Rust `image` crate (triangle
//! filter, JPEG quality [`JPEG_QUALITY`]) and written ONCE to storage under
//! `<stream prefix>thumbnails/<ms>_<width>.jpg` (the only key space this
//! service writes); later requests (any replica) are served from that
//! object, and once a replica has read or made it, from that replica's
//! memory (`AppState::images`, [`crate::cache`], `image_cache_bytes`: kept
//! frames and thumbnails never change, like manifests; a keep-alive
//! `GetObject` of a few-kB object from Garage stalls ~40 ms on delayed
//! ACK, see BENCHMARKS.md). Single flight is per process: two replicas
//! missing at once may both resize and PUT the same key (the same bytes
//! from the same build). `X-Thumbnail-Cache: hit | miss` says which (`source`:
//! the kept frame itself, at its own width). The work is bounded:
//! concurrent misses of one stored key are one flight (the first resizes,
//! the others wait for it and are served from what it stored: `hit`), one
//! video (stream prefix) has at most one resize at once per process (other
//! widths or times of it wait at most [`QUEUE_TIMEOUT`], else `503`), so one
//! viewer cannot take every slot from other videos, and
//! at most [`MAX_CONCURRENT_RESIZES`] resizes at once per process (a request
//! waits at most [`QUEUE_TIMEOUT`] for a slot, else `503`), a source frame of
//! at most [`MAX_SOURCE_PIXELS`] pixels and [`MAX_SOURCE_BYTES`] bytes, and
//! [`RESIZE_TIMEOUT`] per resize (`503` past it; the slot stays taken until
//! the resize really ends, so a slow one cannot pile up more).
//!
//! **Storyboard indexes.** The stored VTT and JSON name the sheet relatively
//! (`storyboard.jpg#xywh=…`, `"url": "storyboard.jpg"`), so it resolves
//! under `/play/{pb}/` next to them. A signed ID's verified token is
//! appended (`storyboard.jpg?token=<JWT>#xywh=…`) so the player needs one
//! token URL, as for manifests ([`crate::token::forward_query`]).
//!
//! Caching: every answer is `Cache-Control` [`crate::token::cache_control`]
//! of the media setting (public, long, immutable; private and cut to the
//! token's `exp` for a token): the objects never change, and a thumbnail's
//! URL (its query included) names one picture.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::{web, HttpRequest, HttpResponse};
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use tokio::sync::Semaphore;
use vid_core::messages::{StreamImages, StreamOutputs};
use vid_core::playback::Audience;

use crate::cache::Manifest;
use crate::conditional::Conditions;
use crate::error::PlaybackError;
use crate::paths::{self, ImageFile};
use crate::state::AppState;
use crate::storage::{self, MediaRequest};

/// Resizes running at once in one process.
pub const MAX_CONCURRENT_RESIZES: usize = 2;
/// How long a request waits for a resize slot before `503`.
pub const QUEUE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one resize (decode, scale, encode) may take before `503`.
pub const RESIZE_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest source frame decoded, in pixels (4096 × 2304; the frames
/// are the tallest rung's, 1080p by default).
pub const MAX_SOURCE_PIXELS: u64 = 4096 * 2304;
/// The largest source frame read, in bytes.
pub const MAX_SOURCE_BYTES: usize = 16 * 1024 * 1024;
/// JPEG quality of resized thumbnails (1–100).
pub const JPEG_QUALITY: u8 = 85;
/// The response header saying where a thumbnail came from: `hit` (stored
/// before: this replica's memory or storage), `miss` (resized by this
/// request), `source` (the kept frame itself).
pub const CACHE_HEADER: &str = "x-thumbnail-cache";

/// At most this many distinct keys wait in one [`KeyedLocks`] (more: `503`).
pub const MAX_PENDING_KEYS: usize = 1024;

static RESIZES: Semaphore = Semaphore::const_new(MAX_CONCURRENT_RESIZES);
/// Misses in flight by stored thumbnail key (single flight).
static IN_FLIGHT: KeyedLocks = KeyedLocks::new("thumbnail");
/// Misses in flight by stream prefix (one video: one resize at a time).
static PER_VIDEO: KeyedLocks = KeyedLocks::new("video");

/// One async lock per key, made on first use and dropped when its last
/// holder or waiter leaves (so the map holds only keys in flight, at most
/// [`MAX_PENDING_KEYS`]). Work run under a key runs alone for that key.
struct KeyedLocks {
    what: &'static str,
    map: std::sync::Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A claim on one key's lock; leaving it removes the key when no one else waits.
struct Ticket<'a> {
    locks: &'a KeyedLocks,
    key: String,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut map = self.locks.map.lock().unwrap_or_else(|e| e.into_inner());
        // Clones are only taken under the map lock: 2 = the map's and ours.
        if Arc::strong_count(&self.lock) == 2 && map.get(&self.key).is_some_and(|l| Arc::ptr_eq(l, &self.lock)) {
            map.remove(&self.key);
        }
    }
}

impl KeyedLocks {
    const fn new(what: &'static str) -> Self {
        Self { what, map: std::sync::Mutex::new(BTreeMap::new()) }
    }

    /// Runs `work` once no other work holds `key`, waiting at most `wait`.
    /// Errors: `Unavailable` past `wait` or with [`MAX_PENDING_KEYS`] other
    /// keys in flight; else `work`'s.
    async fn run<T, F: std::future::Future<Output = Result<T, PlaybackError>>>(
        &self,
        key: &str,
        wait: Duration,
        work: impl FnOnce() -> F,
    ) -> Result<T, PlaybackError> {
        let ticket = {
            let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            if !map.contains_key(key) && map.len() >= MAX_PENDING_KEYS {
                return Err(PlaybackError::Unavailable(format!("{MAX_PENDING_KEYS} thumbnail {}s are in flight", self.what)));
            }
            let lock = map.entry(key.to_owned()).or_default().clone();
            Ticket { locks: self, key: key.to_owned(), lock }
        };
        let _held = tokio::time::timeout(wait, ticket.lock.lock())
            .await
            .map_err(|_| PlaybackError::Unavailable(format!("another thumbnail resize of this {} is still running", self.what)))?;
        work().await
    }
}

/// `GET|HEAD /play/{pb}/{file}` for the five image files (see the module docs).
/// Errors: `NotFound` (outside the grammar, an unknown or unready ID, a
/// stream without images), the token refusals of [`crate::lookup::resolve`],
/// `InvalidParameter`, `Unavailable`, `Internal`.
pub async fn image(req: HttpRequest, state: web::Data<AppState>, path: web::Path<(String, String)>) -> Result<HttpResponse, PlaybackError> {
    let (pb, file) = path.into_inner();
    let id = paths::playback_id(&pb).ok_or(PlaybackError::NotFound)?;
    let file = paths::image_file(&file).ok_or(PlaybackError::NotFound)?;
    let (allowed, audience): (&[&str], Audience) = match file {
        ImageFile::Thumbnail => (&["time", "width"], Audience::Thumbnail),
        ImageFile::Poster => (&[], Audience::Poster),
        _ => (&[], Audience::Storyboard),
    };
    crate::token::check_query(&req, allowed)?;
    let query = if file == ImageFile::Thumbnail { Some(ThumbnailQuery::parse(req.uri().query())?) } else { None };
    let entry = crate::lookup::resolve(&state, &req, &id, audience).await?;
    let stream = entry.stream.as_ref().ok_or(PlaybackError::NotFound)?;
    let images = stream.images.as_ref().ok_or(PlaybackError::NotFound)?;
    let cache_control = crate::token::cache_control(&req, &state.media_cache_control).into_owned();
    let serve = |key: String, content_type: &'static str| {
        let conditions = Conditions::from_headers(req.headers());
        let head = req.method() == actix_web::http::Method::HEAD;
        let (state, cache_control) = (state.clone(), cache_control.clone());
        async move {
            let request =
                MediaRequest { key: &key, range: None, head, conditions: &conditions, content_type, cache_control: &cache_control };
            storage::media(&state.s3, &state.settings.s3.bucket, request).await
        }
    };
    match file {
        ImageFile::StoryboardImage => serve(format!("{}storyboard.jpg", stream.prefix), "image/jpeg").await,
        ImageFile::Poster => {
            // One frame-sized JPEG, immutable, the first image a player
            // loads: from the image cache like kept frames (no cache header).
            let poster = stored_image(&state, &format!("{}poster.jpg", stream.prefix)).await?.ok_or(PlaybackError::NotFound)?;
            crate::conditional::conditional_body(&req, cache_control, poster.etag.as_deref(), "image/jpeg", poster.body.clone())
        }
        ImageFile::StoryboardVtt | ImageFile::StoryboardJson => {
            let vtt = file == ImageFile::StoryboardVtt;
            let key = format!("{}storyboard.{}", stream.prefix, if vtt { "vtt" } else { "json" });
            let object = crate::known::stored_manifest(&state, &key).await?;
            let forward = crate::token::forward_query(&req);
            let body = match forward.as_deref() {
                None => object.body.clone(),
                Some(q) if vtt => Bytes::from(with_token_vtt(&object.body, q)),
                Some(q) => Bytes::from(with_token_json(&object.body, q)?),
            };
            // The stored object's ETag; `-m` when the token was written in (as manifests).
            let etag = match forward {
                None => object.etag.clone(),
                Some(_) => object.etag.as_deref().map(|t| format!("\"{}-m\"", t.trim_start_matches("W/").trim_matches('"'))),
            };
            let content_type = if vtt { "text/vtt; charset=utf-8" } else { "application/json" };
            crate::conditional::conditional_body(&req, cache_control, etag.as_deref(), content_type, body)
        }
        ImageFile::Thumbnail => {
            let q = query.expect("parsed above");
            let (ms, width) = q.pick(images);
            let frame_key = frame_key(stream, ms);
            // Kept frames and stored thumbnails are immutable: served from
            // the replica's image cache once read or made.
            let answer = |image: Arc<Manifest>, cache: &'static str| {
                let mut res = crate::conditional::conditional_body(
                    &req,
                    cache_control.clone(),
                    image.etag.as_deref(),
                    "image/jpeg",
                    image.body.clone(),
                )?;
                res.headers_mut().insert(HeaderName::from_static(CACHE_HEADER), HeaderValue::from_static(cache));
                Ok::<_, PlaybackError>(res)
            };
            if width >= images.frame_width {
                let frame = stored_image(&state, &frame_key).await?.ok_or(PlaybackError::NotFound)?;
                return answer(frame, "source");
            }
            let cached_key = thumbnail_key(stream, ms, width);
            if let Some(image) = stored_image(&state, &cached_key).await? {
                crate::metrics::cache_lookup("thumbnail", true);
                return answer(image, "hit");
            }
            crate::metrics::cache_lookup("thumbnail", false);
            // Single flight: one miss per stored key resizes; those that
            // waited for it are served from what it stored.
            let wait = QUEUE_TIMEOUT * 2 + RESIZE_TIMEOUT;
            IN_FLIGHT
                .run(&cached_key, wait, || async {
                    if let Some(image) = stored_image(&state, &cached_key).await? {
                        return answer(image, "hit");
                    }
                    let (jpeg, etag) =
                        PER_VIDEO.run(&stream.prefix, QUEUE_TIMEOUT, || make_thumbnail(&state, &frame_key, &cached_key, width)).await?;
                    if etag.is_some() {
                        // Stored: later requests on this replica are served
                        // from memory (an exact-size copy: the encoder's
                        // buffer may be larger than the picture).
                        let kept = Manifest { body: Bytes::copy_from_slice(&jpeg), etag: etag.clone() };
                        state.images.put(&cached_key, Arc::new(kept));
                    }
                    let mut res = HttpResponse::Ok();
                    res.insert_header((header::CACHE_CONTROL, cache_control.clone())).insert_header((CACHE_HEADER, "miss"));
                    if let Some(etag) = etag {
                        res.insert_header((header::ETAG, etag));
                    }
                    Ok(res.content_type("image/jpeg").body(jpeg))
                })
                .await
        }
    }
}

/// A kept frame or a stored thumbnail, from the replica's image cache or
/// storage (then cached); `None` when storage has no such object.
async fn stored_image(state: &AppState, key: &str) -> Result<Option<Arc<Manifest>>, PlaybackError> {
    if let Some(m) = state.images.get(key) {
        return Ok(Some(m));
    }
    let Some(m) = storage::small_object(&state.s3, &state.settings.s3.bucket, key).await? else { return Ok(None) };
    let m = Arc::new(m);
    state.images.put(key, m.clone());
    Ok(Some(m))
}

/// The storage key of the kept frame at `ms`.
pub fn frame_key(stream: &StreamOutputs, ms: u64) -> String {
    format!("{}frames/{ms}.jpg", stream.prefix)
}

/// The storage key of the resized thumbnail of the frame at `ms`, `width` px wide.
pub fn thumbnail_key(stream: &StreamOutputs, ms: u64, width: u32) -> String {
    format!("{}thumbnails/{ms}_{width}.jpg", stream.prefix)
}

/// The VTT with `?<query>` on every reference to the sheet.
pub fn with_token_vtt(body: &[u8], query: &str) -> String {
    String::from_utf8_lossy(body).replace("storyboard.jpg#", &format!("storyboard.jpg?{query}#"))
}

/// The JSON with `?<query>` on its `url`. Errors: `Internal` (not the JSON the transcoder writes).
pub fn with_token_json(body: &[u8], query: &str) -> Result<Vec<u8>, PlaybackError> {
    let mut v: serde_json::Value = serde_json::from_slice(body).map_err(|e| PlaybackError::Internal(format!("storyboard.json: {e}")))?;
    let url = v["url"].as_str().unwrap_or("storyboard.jpg").to_owned();
    v["url"] = serde_json::Value::String(format!("{url}?{query}"));
    serde_json::to_vec(&v).map_err(|e| PlaybackError::Internal(e.to_string()))
}

/// A thumbnail's parameters, parsed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThumbnailQuery {
    /// `time` in seconds (finite, ≥ 0), if given.
    pub time: Option<f64>,
    /// `width` in pixels (≥ 1), if given.
    pub width: Option<u32>,
}

impl ThumbnailQuery {
    /// Reads `time` and `width` from `query` (other names were checked by
    /// [`crate::token::check_query`]; `token` is skipped). Errors:
    /// `InvalidParameter` (see the module docs for the grammar).
    pub fn parse(query: Option<&str>) -> Result<Self, PlaybackError> {
        let mut q = Self { time: None, width: None };
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "time" => q.time = Some(parse_time(value)?),
                "width" => q.width = Some(parse_width(value)?),
                _ => {}
            }
        }
        Ok(q)
    }

    /// The kept frame (its time, ms) nearest to `time` (absent: the middle;
    /// ties: the earlier) and the width served (clamped to the frame's).
    pub fn pick(&self, images: &StreamImages) -> (u64, u32) {
        let want = match self.time {
            Some(t) => (t * 1000.0).round().min(u64::MAX as f64) as u64,
            None => images.duration_ms / 2,
        };
        let ms = images.frames_ms.iter().copied().min_by_key(|&f| (f.abs_diff(want), f)).unwrap_or(0);
        (ms, self.width.unwrap_or(images.frame_width).min(images.frame_width).max(1))
    }
}

fn parse_time(v: &str) -> Result<f64, PlaybackError> {
    const RULE: &str = "`time` must be a number of seconds ≥ 0: digits with an optional fraction, e.g. 12.5";
    let (whole, frac) = v.split_once('.').unwrap_or((v, "0"));
    let digits = |s: &str, max: usize| !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole, 9) || !digits(frac, 6) {
        return Err(PlaybackError::InvalidParameter(RULE));
    }
    v.parse::<f64>().ok().filter(|t| t.is_finite() && *t >= 0.0).ok_or(PlaybackError::InvalidParameter(RULE))
}

fn parse_width(v: &str) -> Result<u32, PlaybackError> {
    const RULE: &str = "`width` must be a whole number of pixels ≥ 1 (no sign, no leading zero)";
    let ok = (1..=6).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_digit()) && !v.starts_with('0');
    ok.then(|| v.parse::<u32>().ok()).flatten().ok_or(PlaybackError::InvalidParameter(RULE))
}

/// Reads the frame `frame_key`, resizes it to `width` (bounded: see the
/// module docs), stores the result at `cached_key` and returns it with the
/// stored object's ETag. A failed store write is logged, not answered: the
/// thumbnail is still right (then no ETag).
async fn make_thumbnail(state: &AppState, frame_key: &str, cached_key: &str, width: u32) -> Result<(Bytes, Option<String>), PlaybackError> {
    let source = stored_image(state, frame_key).await?.ok_or(PlaybackError::NotFound)?;
    if source.body.len() > MAX_SOURCE_BYTES {
        return Err(PlaybackError::Internal(format!("frame {frame_key} is over {MAX_SOURCE_BYTES} bytes")));
    }
    let permit = tokio::time::timeout(QUEUE_TIMEOUT, RESIZES.acquire())
        .await
        .map_err(|_| PlaybackError::Unavailable("every thumbnail resize slot is busy".into()))?
        .map_err(|e| PlaybackError::Internal(e.to_string()))?;
    let work = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        resize(&source.body, width)
    });
    let jpeg = match tokio::time::timeout(RESIZE_TIMEOUT, work).await {
        Err(_) => return Err(PlaybackError::Unavailable(format!("resizing {frame_key} took over {RESIZE_TIMEOUT:?}"))),
        Ok(Err(e)) => return Err(PlaybackError::Internal(format!("resize task: {e}"))),
        Ok(Ok(r)) => Bytes::from(r.map_err(|e| PlaybackError::Internal(format!("resizing {frame_key}: {e}")))?),
    };
    let put = state
        .s3
        .put_object()
        .bucket(&state.settings.s3.bucket)
        .key(cached_key)
        .content_type("image/jpeg")
        .body(ByteStream::from(jpeg.clone()))
        .send()
        .await;
    match put {
        Ok(out) => Ok((jpeg, out.e_tag().map(str::to_owned))),
        Err(e) => {
            tracing::warn!(key = cached_key, error = %aws_sdk_s3::error::DisplayErrorContext(&e), "could not store a resized thumbnail");
            Ok((jpeg, None))
        }
    }
}

/// Decodes the JPEG `jpeg` (at most [`MAX_SOURCE_PIXELS`]), scales it to
/// `width` px wide keeping the aspect (height rounded, ≥ 1) and encodes it
/// as JPEG (quality [`JPEG_QUALITY`]). Errors: the decoder's or the limit's message.
pub fn resize(jpeg: &[u8], width: u32) -> Result<Vec<u8>, String> {
    let mut reader = image::ImageReader::with_format(Cursor::new(jpeg), image::ImageFormat::Jpeg);
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(8192);
    limits.max_image_height = Some(8192);
    limits.max_alloc = Some(MAX_SOURCE_PIXELS * 4);
    reader.limits(limits);
    let img = reader.decode().map_err(|e| e.to_string())?;
    let (w, h) = (img.width(), img.height());
    if u64::from(w) * u64::from(h) > MAX_SOURCE_PIXELS || w == 0 {
        return Err(format!("a {w}×{h} frame is over the {MAX_SOURCE_PIXELS} pixel limit"));
    }
    let height = ((f64::from(width) * f64::from(h) / f64::from(w)).round() as u32).max(1);
    let out = img.resize_exact(width.min(w), height, image::imageops::FilterType::Triangle).to_rgb8();
    let mut buf = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut buf, JPEG_QUALITY).encode_image(&out).map_err(|e| e.to_string())?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images() -> StreamImages {
        StreamImages {
            interval_ms: 1000,
            tile_width: 160,
            tile_height: 90,
            frames_ms: vec![0, 1000, 2000, 3000, 3960],
            frame_width: 640,
            frame_height: 360,
            duration_ms: 4000,
        }
    }

    #[test]
    fn the_nearest_frame_is_picked_and_the_width_clamped() {
        let q = |t: Option<f64>, w: Option<u32>| ThumbnailQuery { time: t, width: w }.pick(&images());
        assert_eq!(q(Some(0.0), Some(1)), (0, 1));
        assert_eq!(q(Some(1.49), Some(100)), (1000, 100));
        assert_eq!(q(Some(1.5), None), (1000, 640), "a tie goes to the earlier frame");
        assert_eq!(q(Some(3.7), Some(9999)), (3960, 640));
        assert_eq!(q(Some(1e9), None), (3960, 640), "past the end: the last frame");
        assert_eq!(q(None, None), (2000, 640), "absent: the middle");
    }

    #[test]
    fn parameters_have_one_strict_grammar() {
        let p = |s: &str| ThumbnailQuery::parse(Some(s));
        assert_eq!(p("time=1.5&width=320").unwrap(), ThumbnailQuery { time: Some(1.5), width: Some(320) });
        assert_eq!(p("token=abc&time=0").unwrap(), ThumbnailQuery { time: Some(0.0), width: None });
        for bad in [
            "time=-1",
            "time=abc",
            "time=",
            "time=1e3",
            "time=inf",
            "time=NaN",
            "time=+1",
            "time=1.",
            "width=0",
            "width=-5",
            "width=01",
            "width=1.5",
            "width=",
            "width=9999999",
        ] {
            assert!(matches!(p(bad), Err(PlaybackError::InvalidParameter(_))), "{bad}");
        }
    }

    #[test]
    fn tokens_are_carried_to_the_sheet() {
        let vtt = b"WEBVTT\n\n00:00:00.000 --> 00:00:01.000\nstoryboard.jpg#xywh=0,0,160,90\n";
        assert!(with_token_vtt(vtt, "token=a.b.c").contains("storyboard.jpg?token=a.b.c#xywh=0,0,160,90"));
        let json = with_token_json(br#"{"url":"storyboard.jpg","tiles":[]}"#, "token=a.b.c").unwrap();
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&json).unwrap()["url"], "storyboard.jpg?token=a.b.c");
    }
}
