//! The routes. No API key anywhere: a public playback ID is the capability.
//!
//! ```text
//! GET|HEAD /play/{pb}.m3u8                  master playlist, URIs mapped under {pb}/
//! GET|HEAD /play/{pb}.mpd                   MPD, segment templates mapped under {pb}/
//! GET|HEAD /play/{pb}/{track}/{file}        index.m3u8 | init.mp4 | seg-NNNNN.m4s
//! GET|HEAD /play/{pb}/{file}                storyboard.jpg|.vtt|.json, thumbnail.jpg, poster.jpg ([`crate::images`])
//! OPTIONS  /play/…                          CORS preflight (GET, HEAD; Range allowed)
//! GET      /healthz, /readyz, /metrics
//! ```
//!
//! Every request for a playback resource: strict path grammar ([`crate::paths`])
//! → the playback ID looked up ([`crate::lookup::resolve`]: row + video `ready` + a stream;
//! cached for `lookup_cache_ms`) → a `signed` ID's `?token=` verified
//! ([`crate::token`]; `403` otherwise) → the object, manifests with the same
//! token appended to every URI.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use vid_core::messages::StreamOutputs;
use vid_core::playback::Audience;

use crate::error::PlaybackError;
use crate::paths::{self, RootFile, TrackFile};
use crate::rewrite::{self, UriMapper};
use crate::state::AppState;
use crate::storage::{self, MediaRequest, RangeAsk};
use crate::store::Entry;

/// HLS playlists' media type (RFC 8216 §4).
pub const HLS_TYPE: &str = "application/vnd.apple.mpegurl";
/// DASH MPD media type (ISO/IEC 23009-1 Annex C).
pub const DASH_TYPE: &str = "application/dash+xml";
/// Headers a cross-origin player may send (the preflight's answer).
pub const ALLOWED_REQUEST_HEADERS: &str = "Range, If-None-Match, If-Modified-Since, If-Range";
/// Headers a cross-origin player may read.
pub const EXPOSED_HEADERS: &str = "Content-Length, Content-Range, Accept-Ranges, ETag";

/// Registers every route.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(playback_resource("/play/{pb}.m3u8", root_m3u8))
        .service(playback_resource("/play/{pb}.mpd", root_mpd))
        .service(playback_resource("/play/{pb}/{track}/{file}", track_file))
        .service(playback_resource("/play/{pb}/{file}", crate::images::image))
        .service(web::resource("/healthz").route(web::get().to(healthz)))
        .service(web::resource("/readyz").route(web::get().to(readyz)))
        .service(web::resource("/metrics").route(web::get().to(crate::metrics::metrics)));
}

fn playback_resource<F, Args>(path: &str, handler: F) -> actix_web::Resource
where
    F: actix_web::Handler<Args> + Clone,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    web::resource(path)
        .route(web::get().to(handler.clone()))
        .route(web::head().to(handler))
        .route(web::route().method(actix_web::http::Method::OPTIONS).to(preflight))
        .default_service(web::to(|| async { PlaybackError::MethodNotAllowed.error_response() }))
}

/// The answer to a path no route matches.
pub async fn not_found() -> HttpResponse {
    PlaybackError::NotFound.error_response()
}

/// CORS preflight: any origin may GET/HEAD with `Range` and conditionals.
async fn preflight() -> HttpResponse {
    HttpResponse::NoContent()
        .insert_header((header::ACCESS_CONTROL_ALLOW_METHODS, "GET, HEAD, OPTIONS"))
        .insert_header((header::ACCESS_CONTROL_ALLOW_HEADERS, ALLOWED_REQUEST_HEADERS))
        .insert_header((header::ACCESS_CONTROL_MAX_AGE, "86400"))
        .insert_header((header::CACHE_CONTROL, "public, max-age=86400"))
        .finish()
}

async fn root_m3u8(req: HttpRequest, state: web::Data<AppState>, pb: web::Path<String>) -> Result<HttpResponse, PlaybackError> {
    root(&req, &state, &format!("{pb}.m3u8")).await
}

async fn root_mpd(req: HttpRequest, state: web::Data<AppState>, pb: web::Path<String>) -> Result<HttpResponse, PlaybackError> {
    root(&req, &state, &format!("{pb}.mpd")).await
}

/// Refuses a query string (`404`) other than a signed ID's `?token=`:
/// every playback resource has exactly one spelling, so a CDN keyed on the
/// whole URL caches one copy, and a made-up `?x=…` cannot walk around the
/// CDN to the origin and storage. (Whether a `token` may be there is
/// [`crate::token::authorize`]'s call: a public ID takes none.)
fn no_query(req: &HttpRequest) -> Result<(), PlaybackError> {
    crate::token::check_query(req, &[])
}

async fn root(req: &HttpRequest, state: &AppState, file: &str) -> Result<HttpResponse, PlaybackError> {
    no_query(req)?;
    let (id, kind) = paths::root(file).ok_or(PlaybackError::NotFound)?;
    let entry = crate::lookup::resolve(state, req, &id, Audience::Video).await?;
    let stream = playable(&entry)?;
    let prefix = format!("{id}/");
    // A signed ID's token goes on every URI: one token URL plays it all.
    let forward = crate::token::forward_query(req);
    let mapper = with_token(UriMapper::under(&prefix), forward.as_deref());
    match kind {
        RootFile::HlsMaster => manifest(req, state, &stream.hls_master_key, ManifestKind::Hls, HLS_TYPE, mapper).await,
        RootFile::DashMpd => manifest(req, state, &stream.dash_manifest_key, ManifestKind::Dash, DASH_TYPE, mapper).await,
    }
}

async fn track_file(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
) -> Result<HttpResponse, PlaybackError> {
    no_query(&req)?;
    let (pb, track, file) = path.into_inner();
    let id = paths::playback_id(&pb).ok_or(PlaybackError::NotFound)?;
    let track = paths::track(&track).ok_or(PlaybackError::NotFound)?;
    let file = paths::track_file(&file).ok_or(PlaybackError::NotFound)?;
    let entry = crate::lookup::resolve(&state, &req, &id, Audience::Video).await?;
    let stream = playable(&entry)?;
    let key = object_key(stream, track, file);
    crate::known::check(&state, &stream.hls_master_key, &object_key(stream, track, TrackFile::MediaPlaylist), track, file).await?;
    match file {
        TrackFile::MediaPlaylist => {
            let forward = crate::token::forward_query(&req);
            let mapper = with_token(UriMapper::same_directory(), forward.as_deref());
            manifest(&req, &state, &key, ManifestKind::Hls, HLS_TYPE, mapper).await
        }
        TrackFile::Init | TrackFile::Segment(_) => {
            let headers = req.headers();
            let head = req.method() == actix_web::http::Method::HEAD;
            let range = match headers.get(header::RANGE).and_then(|v| v.to_str().ok()).map(storage::range_ask) {
                Some(RangeAsk::Unsatisfiable) if !head => {
                    return Err(PlaybackError::RangeNotSatisfiable(storage::object_size(&state.s3, &state.settings.s3.bucket, &key).await?))
                }
                Some(RangeAsk::Pass(r)) if !head => Some(r),
                _ => None,
            };
            let conditions = crate::conditional::Conditions::from_headers(headers);
            let content_type = if track == paths::AUDIO_TRACK { "audio/mp4" } else { "video/mp4" };
            let request = MediaRequest {
                key: &key,
                range: range.as_deref(),
                conditions: &conditions,
                content_type,
                cache_control: &crate::token::cache_control(&req, &state.media_cache_control),
                head,
            };
            storage::media(&state.s3, &state.settings.s3.bucket, request).await
        }
    }
}

/// The storage key of `file` of `track` in `stream` (the transcoder's layout:
/// `<prefix><track>/<file>`).
pub fn object_key(stream: &StreamOutputs, track: &str, file: TrackFile) -> String {
    format!("{}{track}/{}", stream.prefix, file.file_name())
}

/// `mapper`, also appending `query` (a verified token's `token=…`) when there is one.
fn with_token<'a>(mapper: UriMapper<'a>, query: Option<&'a str>) -> UriMapper<'a> {
    match query {
        Some(q) => mapper.with_query(q),
        None => mapper,
    }
}

fn playable(entry: &Entry) -> Result<&StreamOutputs, PlaybackError> {
    entry.stream.as_ref().ok_or(PlaybackError::NotFound)
}

#[derive(Clone, Copy)]
enum ManifestKind {
    Hls,
    Dash,
}

/// Serves manifest `key` with its URIs mapped by `mapper`; the object comes
/// from the manifest cache or storage. `ETag`: the stored object's, plus
/// `-m` when the body was rewritten (the rewrite depends on the URL only,
/// so every replica derives the same tag); `If-None-Match` → `304`,
/// `If-Match` not matching → `412` ([`crate::conditional::conditional_body`]).
async fn manifest(
    req: &HttpRequest,
    state: &AppState,
    key: &str,
    kind: ManifestKind,
    content_type: &'static str,
    mapper: UriMapper<'_>,
) -> Result<HttpResponse, PlaybackError> {
    let object = crate::known::stored_manifest(state, key).await?;
    let (body, etag) = if mapper.is_identity() {
        (object.body.clone(), object.etag.clone())
    } else {
        let text = std::str::from_utf8(&object.body).map_err(|_| PlaybackError::Internal(format!("manifest {key} is not UTF-8")))?;
        let mapped = match kind {
            ManifestKind::Hls => rewrite::hls(text, &mapper),
            ManifestKind::Dash => rewrite::mpd(text, &mapper),
        };
        let etag = object.etag.as_deref().map(|t| format!("\"{}-m\"", t.trim_start_matches("W/").trim_matches('"')));
        (bytes::Bytes::from(mapped), etag)
    };
    let cache_control = crate::token::cache_control(req, &state.manifest_cache_control).into_owned();
    crate::conditional::conditional_body(req, cache_control, etag.as_deref(), content_type, body)
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().insert_header((header::CACHE_CONTROL, "no-store")).json(serde_json::json!({"status": "ok"}))
}

/// `/readyz`: PostgreSQL and the bucket answered, each within
/// [`vid_infra::readiness::CHECK_TIMEOUT`] (the api's check, shared); `503`
/// with the same body otherwise.
async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let ready =
        vid_infra::readiness::check(vid_db::ping(&state.db), vid_infra::readiness::bucket_answers(&state.s3, &state.settings.s3.bucket))
            .await;
    let mut res = if ready.is_ready() { HttpResponse::Ok() } else { HttpResponse::ServiceUnavailable() };
    res.insert_header((header::CACHE_CONTROL, "no-store")).json(ready)
}
