//! Reading the stream's objects from the media bucket: whole manifests (to
//! rewrite and cache them) and media bytes, proxied.
//!
//! Media bytes are PROXIED, streamed chunk by chunk as the store sends them
//! (never a whole segment buffered), rather than answered with a redirect to
//! a presigned URL: a redirect's `Location` would show viewers the bucket
//! and the key layout (tenant id included), and every segment would cost
//! the player a second round trip. The figures are in ARCHITECTURE.md.
//!
//! `Range` (one `bytes=` range; anything else is ignored, RFC 9110 §14.2)
//! is passed to the store, whose `206`/`Content-Range` and `ETag` come back
//! unchanged; preconditions (`If-Match`, `If-None-Match`, `If-Range`, the
//! dates) are evaluated here as RFC 9110 §13.2.2 orders them
//! ([`crate::conditional`], one `HeadObject`); a range past the end is `416` with
//! `Content-Range: bytes */<size>` (one `HeadObject` to learn the size), and
//! so is a first position too large for any object ([`range_ask`]). `HEAD`
//! is one `HeadObject` (no body is read from the store).

use actix_web::http::header;
use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use aws_sdk_s3::config::http::HttpResponse as StoreResponse;
use aws_sdk_s3::error::{DisplayErrorContext, SdkError};
use bytes::Bytes;

use crate::cache::Manifest;
use crate::conditional::{Conditions, Verdict};
use crate::error::PlaybackError;

/// Largest manifest read into memory (a 4 h video's media playlist at 4 s
/// segments is ~120 KiB).
pub const MAX_MANIFEST_BYTES: i64 = 16 * 1024 * 1024;

/// What went wrong with a storage call, as the answer needs it.
enum Failure {
    NotFound,
    NotModified,
    RangeNotSatisfiable,
    Unavailable(String),
}

fn classify<E>(e: SdkError<E, StoreResponse>) -> Failure
where
    E: std::error::Error + Send + Sync + 'static,
{
    match e.raw_response().map(|r| r.status().as_u16()) {
        Some(404) => Failure::NotFound,
        Some(304) => Failure::NotModified,
        Some(416) => Failure::RangeNotSatisfiable,
        _ => Failure::Unavailable(DisplayErrorContext(&e).to_string()),
    }
}

/// Reads the manifest object `key` whole. Errors: `NotFound` (no such
/// object, logged: a ready video's manifest should exist), `Unavailable`
/// (the store did not answer), `Internal` (over [`MAX_MANIFEST_BYTES`]).
pub async fn manifest(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<Manifest, PlaybackError> {
    match small_object(s3, bucket, key).await? {
        Some(m) => Ok(m),
        None => {
            tracing::warn!(key, "a ready video's manifest is missing from storage");
            Err(PlaybackError::NotFound)
        }
    }
}

/// Reads the object `key` whole (S3 `GetObject`), at most
/// [`MAX_MANIFEST_BYTES`]; `None` when there is no such object (not
/// logged: a thumbnail not yet resized is such a case). Errors:
/// `Unavailable` (the store did not answer), `Internal` (too large).
pub async fn small_object(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<Option<Manifest>, PlaybackError> {
    let out = match s3.get_object().bucket(bucket).key(key).send().await {
        Ok(out) => out,
        Err(e) => {
            return match classify(e) {
                Failure::NotFound => Ok(None),
                Failure::Unavailable(m) => Err(PlaybackError::Unavailable(format!("reading {key}: {m}"))),
                _ => Err(PlaybackError::Unavailable(format!("reading {key}: unexpected answer"))),
            }
        }
    };
    if out.content_length().unwrap_or(0) > MAX_MANIFEST_BYTES {
        return Err(PlaybackError::Internal(format!("object {key} is over {MAX_MANIFEST_BYTES} bytes")));
    }
    let etag = out.e_tag().map(str::to_owned);
    let body = out.body.collect().await.map_err(|e| PlaybackError::Unavailable(format!("reading {key}'s body: {e}")))?.into_bytes();
    // An exact-size copy: the collected bytes may be a slice of the HTTP
    // client's read buffer (up to ~400 KiB), which a cache entry would keep
    // alive whole, past what the caches' byte budgets count.
    Ok(Some(Manifest { body: Bytes::copy_from_slice(&body), etag }))
}

/// A media object request.
pub struct MediaRequest<'a> {
    /// Storage key.
    pub key: &'a str,
    /// The client's `Range`, if it is one valid `bytes=` range
    /// ([`range_ask`]'s `Pass`); ignored for `HEAD`.
    pub range: Option<&'a str>,
    /// A `HEAD` request: the headers of a `GetObject` from one `HeadObject`,
    /// no body read from the store.
    pub head: bool,
    /// The client's preconditions ([`crate::conditional`]).
    pub conditions: &'a Conditions,
    /// `video/mp4` or `audio/mp4`.
    pub content_type: &'static str,
    /// The answer's `Cache-Control`.
    pub cache_control: &'a str,
}

/// Proxies a media object: `200`, `206` (with `Content-Range`), `304` or
/// `412`, the body streamed from the store as it arrives.
///
/// Errors: `NotFound` (no such object: a made-up segment number),
/// `RangeNotSatisfiable`, `PreconditionFailed`, `Unavailable`.
pub async fn media(s3: &aws_sdk_s3::Client, bucket: &str, req: MediaRequest<'_>) -> Result<HttpResponse, PlaybackError> {
    let mut range = req.range.map(str::to_owned);
    if req.head || req.conditions.any() {
        let head = match s3.head_object().bucket(bucket).key(req.key).send().await {
            Ok(head) => head,
            Err(e) => return media_failure(s3, bucket, &req, classify(e)).await,
        };
        let modified = head.last_modified().and_then(|t| std::time::SystemTime::try_from(*t).ok());
        match req.conditions.evaluate(head.e_tag(), modified) {
            Verdict::PreconditionFailed => return Err(PlaybackError::PreconditionFailed),
            Verdict::NotModified => {
                let mut res = HttpResponse::NotModified();
                res.insert_header((header::CACHE_CONTROL, req.cache_control.to_owned()));
                if let Some(etag) = head.e_tag() {
                    res.insert_header((header::ETAG, etag.to_owned()));
                }
                return Ok(res.finish());
            }
            Verdict::Proceed { range_allowed } => range = range.filter(|_| range_allowed),
        }
        if req.head {
            return Ok(head_response(&req, &head));
        }
    }
    let sent = s3.get_object().bucket(bucket).key(req.key).set_range(range).send().await;
    let out = match sent {
        Ok(out) => out,
        Err(e) => return media_failure(s3, bucket, &req, classify(e)).await,
    };
    let status = if out.content_range().is_some() { StatusCode::PARTIAL_CONTENT } else { StatusCode::OK };
    let mut res = HttpResponse::build(status);
    res.insert_header((header::CONTENT_TYPE, req.content_type))
        .insert_header((header::CACHE_CONTROL, req.cache_control.to_owned()))
        .insert_header((header::ACCEPT_RANGES, "bytes"));
    if let Some(range) = out.content_range() {
        res.insert_header((header::CONTENT_RANGE, range.to_owned()));
    }
    if let Some(etag) = out.e_tag() {
        res.insert_header((header::ETAG, etag.to_owned()));
    }
    if let Some(modified) = out.last_modified().and_then(|t| t.fmt(aws_sdk_s3::primitives::DateTimeFormat::HttpDate).ok()) {
        res.insert_header((header::LAST_MODIFIED, modified));
    }
    let length = out.content_length().and_then(|n| u64::try_from(n).ok());
    let body = futures::stream::try_unfold(out.body, |mut body| async move {
        match body.try_next().await {
            Ok(Some(chunk)) => Ok(Some((chunk, body))),
            Ok(None) => Ok(None),
            Err(e) => {
                tracing::warn!(error = %e, "storage body ended early; the viewer's request is cut");
                Err(std::io::Error::other(e))
            }
        }
    });
    if let Some(n) = length {
        res.no_chunking(n);
    }
    Ok(res.streaming::<_, std::io::Error>(futures::StreamExt::map(body, |r: Result<Bytes, std::io::Error>| r)))
}

/// `HEAD` of a media object: the headers `GET` would send for the whole
/// object (a `HEAD` ignores `Range`), from its `HeadObject`.
fn head_response(req: &MediaRequest<'_>, out: &aws_sdk_s3::operation::head_object::HeadObjectOutput) -> HttpResponse {
    let mut res = HttpResponse::Ok();
    res.insert_header((header::CONTENT_TYPE, req.content_type))
        .insert_header((header::CACHE_CONTROL, req.cache_control.to_owned()))
        .insert_header((header::ACCEPT_RANGES, "bytes"));
    if let Some(etag) = out.e_tag() {
        res.insert_header((header::ETAG, etag.to_owned()));
    }
    if let Some(modified) = out.last_modified().and_then(|t| t.fmt(aws_sdk_s3::primitives::DateTimeFormat::HttpDate).ok()) {
        res.insert_header((header::LAST_MODIFIED, modified));
    }
    if let Some(n) = out.content_length().and_then(|n| u64::try_from(n).ok()) {
        res.no_chunking(n);
    }
    res.streaming::<_, std::io::Error>(futures::stream::empty::<Result<Bytes, std::io::Error>>())
}

/// The answer to a failed media read: `404`, `416` (with the size, one
/// `HeadObject`), `503`. (Preconditions are evaluated here, never by the store.)
async fn media_failure(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    req: &MediaRequest<'_>,
    failure: Failure,
) -> Result<HttpResponse, PlaybackError> {
    match failure {
        Failure::NotFound => Err(PlaybackError::NotFound),
        Failure::NotModified => Err(PlaybackError::Unavailable("the store answered 304 to an unconditional read".into())),
        Failure::RangeNotSatisfiable => Err(PlaybackError::RangeNotSatisfiable(object_size(s3, bucket, req.key).await.ok().flatten())),
        Failure::Unavailable(m) => Err(PlaybackError::Unavailable(format!("reading a media object: {m}"))),
    }
}

/// What to do with a client's `Range` (RFC 9110 §14.1.2, §14.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeAsk {
    /// Not one valid `bytes=` range (a list, another unit, `9-5`, junk):
    /// ignored, a full `200` (RFC 9110 §14.2 lets a server ignore it).
    Ignore,
    /// One range, passed to the store in this spelling.
    Pass(String),
    /// A first position past any object's end (more than 19 digits, so
    /// beyond `u64`): `416` without asking the store for the bytes.
    Unsatisfiable,
}

/// Classifies `value` (see [`RangeAsk`]). A last position or suffix too
/// long for `u64` is longer than any object, so it is cut to "to the end"
/// / "the whole object" (RFC 9110 §14.1.2: such ranges are satisfiable).
pub fn range_ask(value: &str) -> RangeAsk {
    let Some(spec) = value.trim().strip_prefix("bytes=") else { return RangeAsk::Ignore };
    let Some((first, last)) = spec.trim().split_once('-') else { return RangeAsk::Ignore };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let number = |s: &str| s.parse::<u64>().ok();
    match (first, last) {
        ("", n) if digits(n) && n.bytes().any(|b| b != b'0') => match number(n) {
            Some(_) => RangeAsk::Pass(format!("bytes=-{n}")),
            None => RangeAsk::Pass("bytes=0-".into()),
        },
        (a, b) if digits(a) && (b.is_empty() || digits(b)) => match (number(a), number(b)) {
            (None, _) => RangeAsk::Unsatisfiable,
            (Some(a), _) if b.is_empty() => RangeAsk::Pass(format!("bytes={a}-")),
            (Some(a), Some(b)) if a <= b => RangeAsk::Pass(format!("bytes={a}-{b}")),
            (Some(a), None) => RangeAsk::Pass(format!("bytes={a}-")),
            (Some(_), Some(_)) => RangeAsk::Ignore,
        },
        _ => RangeAsk::Ignore,
    }
}

/// The size of object `key` (S3 API action HeadObject), for a `416`'s
/// `Content-Range: bytes */<size>`. Errors: `NotFound`, `Unavailable`.
pub async fn object_size(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<Option<u64>, PlaybackError> {
    match s3.head_object().bucket(bucket).key(key).send().await {
        Ok(h) => Ok(h.content_length().and_then(|n| u64::try_from(n).ok())),
        Err(e) => Err(match classify(e) {
            Failure::NotFound => PlaybackError::NotFound,
            Failure::Unavailable(m) => PlaybackError::Unavailable(format!("reading a media object's size: {m}")),
            _ => PlaybackError::Unavailable("reading a media object's size: unexpected answer".into()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_valid_byte_range_is_passed_on() {
        let pass = |s: &str| RangeAsk::Pass(s.to_owned());
        for (asked, passed) in [
            ("bytes=0-99", "bytes=0-99"),
            ("bytes=100-", "bytes=100-"),
            ("bytes=-500", "bytes=-500"),
            ("bytes=5-5", "bytes=5-5"),
            (" bytes=0-0", "bytes=0-0"),
        ] {
            assert_eq!(range_ask(asked), pass(passed), "{asked}");
        }
        for bad in ["bytes=0-1,5-9", "bytes=9-5", "bytes=-0", "bytes=-", "bytes=a-b", "items=0-1", "bytes 0-1", "bytes=0--1", ""] {
            assert_eq!(range_ask(bad), RangeAsk::Ignore, "{bad}");
        }
    }

    #[test]
    fn numbers_past_u64_are_unsatisfiable_starts_or_open_ends() {
        let huge = "123456789012345678901234";
        assert_eq!(range_ask(&format!("bytes={huge}-")), RangeAsk::Unsatisfiable);
        assert_eq!(range_ask(&format!("bytes={huge}-{huge}9")), RangeAsk::Unsatisfiable);
        assert_eq!(range_ask(&format!("bytes=10-{huge}")), RangeAsk::Pass("bytes=10-".into()));
        assert_eq!(range_ask(&format!("bytes=-{huge}")), RangeAsk::Pass("bytes=0-".into()));
    }
}
