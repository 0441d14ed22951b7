//! Reading the stream's objects from the media bucket: whole manifests (to
//! rewrite and cache them) and media bytes, proxied.
//!
//! Media bytes are PROXIED, streamed chunk by chunk as the store sends them
//! (never a whole segment buffered), rather than answered with a redirect to
//! a presigned URL: a redirect's `Location` would show viewers the bucket
//! and the key layout (tenant id included), and every segment would cost
//! the player a second round trip. The figures are in ARCHITECTURE.md.
//!
//! `Range` (one `bytes=` range; anything else is ignored, RFC 9110 §14.2) and
//! `If-None-Match` are passed to the store, whose `206`/`Content-Range`,
//! `304` and `ETag` come back unchanged; a range past the end is `416` with
//! `Content-Range: bytes */<size>` (one `HeadObject` to learn the size).

use actix_web::http::header;
use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use aws_sdk_s3::config::http::HttpResponse as StoreResponse;
use aws_sdk_s3::error::{DisplayErrorContext, SdkError};
use bytes::Bytes;

use crate::cache::Manifest;
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
/// object), `Unavailable` (the store did not answer), `Internal` (too large).
pub async fn manifest(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<Manifest, PlaybackError> {
    let out = match s3.get_object().bucket(bucket).key(key).send().await {
        Ok(out) => out,
        Err(e) => {
            return Err(match classify(e) {
                Failure::NotFound => {
                    tracing::warn!(key, "a ready video's manifest is missing from storage");
                    PlaybackError::NotFound
                }
                Failure::Unavailable(m) => PlaybackError::Unavailable(format!("reading a manifest: {m}")),
                _ => PlaybackError::Unavailable("reading a manifest: unexpected answer".into()),
            })
        }
    };
    if out.content_length().unwrap_or(0) > MAX_MANIFEST_BYTES {
        return Err(PlaybackError::Internal(format!("manifest {key} is over {MAX_MANIFEST_BYTES} bytes")));
    }
    let etag = out.e_tag().map(str::to_owned);
    let body = out.body.collect().await.map_err(|e| PlaybackError::Unavailable(format!("reading a manifest's body: {e}")))?.into_bytes();
    Ok(Manifest { body, etag })
}

/// A media object request.
pub struct MediaRequest<'a> {
    /// Storage key.
    pub key: &'a str,
    /// The client's `Range`, if it is one valid `bytes=` range.
    pub range: Option<&'a str>,
    /// The client's `If-None-Match`.
    pub if_none_match: Option<&'a str>,
    /// `video/mp4` or `audio/mp4`.
    pub content_type: &'static str,
    /// The answer's `Cache-Control`.
    pub cache_control: &'a str,
}

/// Proxies a media object: `200`, `206` (with `Content-Range`) or `304`,
/// the body streamed from the store as it arrives.
///
/// Errors: `NotFound` (no such object: a made-up segment number),
/// `RangeNotSatisfiable`, `Unavailable`.
pub async fn media(s3: &aws_sdk_s3::Client, bucket: &str, req: MediaRequest<'_>) -> Result<HttpResponse, PlaybackError> {
    let sent = s3
        .get_object()
        .bucket(bucket)
        .key(req.key)
        .set_range(req.range.map(str::to_owned))
        .set_if_none_match(req.if_none_match.map(str::to_owned))
        .send()
        .await;
    let out = match sent {
        Ok(out) => out,
        Err(e) => {
            return match classify(e) {
                Failure::NotFound => Err(PlaybackError::NotFound),
                Failure::NotModified => {
                    let mut res = HttpResponse::NotModified();
                    res.insert_header((header::CACHE_CONTROL, req.cache_control.to_owned()));
                    if let Some(inm) = req.if_none_match.filter(|v| !v.contains(',') && *v != "*") {
                        res.insert_header((header::ETAG, inm.to_owned()));
                    }
                    Ok(res.finish())
                }
                Failure::RangeNotSatisfiable => {
                    let size =
                        s3.head_object().bucket(bucket).key(req.key).send().await.ok().and_then(|h| h.content_length()).map(|n| n as u64);
                    Err(PlaybackError::RangeNotSatisfiable(size))
                }
                Failure::Unavailable(m) => Err(PlaybackError::Unavailable(format!("reading a media object: {m}"))),
            }
        }
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

/// Whether `value` is ONE `bytes=` range (`a-b`, `a-`, `-n`), the only kind
/// passed to the store; any other `Range` is ignored (a full `200`).
pub fn single_byte_range(value: &str) -> bool {
    let Some(spec) = value.trim().strip_prefix("bytes=") else { return false };
    let Some((first, last)) = spec.trim().split_once('-') else { return false };
    let digits = |s: &str| !s.is_empty() && s.len() <= 19 && s.bytes().all(|b| b.is_ascii_digit());
    match (first, last) {
        ("", n) => digits(n) && n.bytes().any(|b| b != b'0'),
        (a, "") => digits(a),
        (a, b) => digits(a) && digits(b) && a.parse::<u64>().ok() <= b.parse::<u64>().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_valid_byte_range_is_passed_on() {
        for good in ["bytes=0-99", "bytes=100-", "bytes=-500", "bytes=5-5", " bytes=0-0"] {
            assert!(single_byte_range(good), "{good}");
        }
        for bad in ["bytes=0-1,5-9", "bytes=9-5", "bytes=-0", "bytes=-", "bytes=a-b", "items=0-1", "bytes 0-1", "bytes=0--1", ""] {
            assert!(!single_byte_range(bad), "{bad}");
        }
    }
}
