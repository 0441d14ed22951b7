//! Conditional requests on media objects, evaluated as RFC 9110 §13.2.2
//! orders them, against the object's `ETag` and `Last-Modified` (one
//! `HeadObject`; only a request carrying a precondition pays it):
//!
//! 1. `If-Match` (strong comparison, a list or `*`), else
//!    `If-Unmodified-Since`: false → `412 Precondition Failed`;
//! 2. `If-None-Match` (weak comparison, a list or `*`), else
//!    `If-Modified-Since`: false → `304 Not Modified` with the `ETag`;
//! 3. `If-Range` (a strong entity tag, or a date equal to `Last-Modified`):
//!    false → the `Range` is ignored and the whole object is sent (`200`).
//!
//! A date that does not parse as an HTTP-date makes its header ignored
//! (§13.1.3, §13.1.4), as does `If-Range` without `Range`.

use std::str::FromStr;
use std::time::SystemTime;

use actix_web::http::header::{self, HeaderMap, HeaderValue, HttpDate};
use actix_web::{HttpRequest, HttpResponse};

use crate::error::PlaybackError;

/// The preconditions of one request (raw header values).
#[derive(Debug, Default, Clone)]
pub struct Conditions {
    /// `If-Match`.
    pub if_match: Option<String>,
    /// `If-None-Match`.
    pub if_none_match: Option<String>,
    /// `If-Modified-Since`, parsed.
    pub if_modified_since: Option<SystemTime>,
    /// `If-Unmodified-Since`, parsed.
    pub if_unmodified_since: Option<SystemTime>,
    /// `If-Range`.
    pub if_range: Option<String>,
}

/// What the preconditions decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// `412`.
    PreconditionFailed,
    /// `304`.
    NotModified,
    /// Serve; `range_allowed` is false when `If-Range` did not match.
    Proceed {
        /// Whether a `Range` may be applied.
        range_allowed: bool,
    },
}

fn text(headers: &HeaderMap, name: header::HeaderName) -> Option<String> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

fn date(headers: &HeaderMap, name: header::HeaderName) -> Option<SystemTime> {
    text(headers, name).and_then(|v| HttpDate::from_str(&v).ok()).map(SystemTime::from)
}

/// Whether an entity-tag list (`*`, or `"a", W/"b"`) matches `etag`;
/// `strong`: weak tags never match (RFC 9110 §8.8.3.2).
pub fn list_matches(list: &str, etag: Option<&str>, strong: bool) -> bool {
    let Some(etag) = etag else { return false };
    if list.trim() == "*" {
        return true;
    }
    if strong && etag.starts_with("W/") {
        return false;
    }
    let opaque = |t: &str| t.trim().trim_start_matches("W/").to_owned();
    let want = opaque(etag);
    list.split(',').map(str::trim).filter(|t| !(strong && t.starts_with("W/"))).any(|t| opaque(t) == want)
}

/// HTTP-dates have one-second resolution.
fn seconds(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl Conditions {
    /// Reads the five precondition headers.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        Self {
            if_match: text(headers, header::IF_MATCH),
            if_none_match: text(headers, header::IF_NONE_MATCH),
            if_modified_since: date(headers, header::IF_MODIFIED_SINCE),
            if_unmodified_since: date(headers, header::IF_UNMODIFIED_SINCE),
            if_range: text(headers, header::IF_RANGE),
        }
    }

    /// Whether any precondition is present (else no `HeadObject` is needed).
    pub fn any(&self) -> bool {
        self.if_match.is_some()
            || self.if_none_match.is_some()
            || self.if_modified_since.is_some()
            || self.if_unmodified_since.is_some()
            || self.if_range.is_some()
    }

    /// Evaluates them against the object's `etag` and `last_modified`
    /// (see the module docs for the order).
    pub fn evaluate(&self, etag: Option<&str>, last_modified: Option<SystemTime>) -> Verdict {
        if let Some(list) = &self.if_match {
            if !list_matches(list, etag, true) {
                return Verdict::PreconditionFailed;
            }
        } else if let (Some(since), Some(modified)) = (self.if_unmodified_since, last_modified) {
            if seconds(modified) > seconds(since) {
                return Verdict::PreconditionFailed;
            }
        }
        if let Some(list) = &self.if_none_match {
            if list_matches(list, etag, false) {
                return Verdict::NotModified;
            }
        } else if let (Some(since), Some(modified)) = (self.if_modified_since, last_modified) {
            if seconds(modified) <= seconds(since) {
                return Verdict::NotModified;
            }
        }
        let range_allowed = match &self.if_range {
            None => true,
            Some(v) if v.starts_with('"') || v.starts_with("W/") => !v.starts_with("W/") && list_matches(v, etag, true) && !v.contains(','),
            Some(v) => match (HttpDate::from_str(v).ok().map(SystemTime::from), last_modified) {
                (Some(d), Some(m)) => seconds(d) == seconds(m),
                _ => false,
            },
        };
        Verdict::Proceed { range_allowed }
    }
}

/// A `200` of an in-memory `body` tagged `etag`, after the request's
/// preconditions (RFC 9110 §13.2.2, [`Conditions`]):
/// `If-Match` not matching → `412` (`PreconditionFailed`), `If-None-Match`
/// matching → `304` (with the `ETag` and `Cache-Control`).
pub fn conditional_body(
    req: &HttpRequest,
    cache_control: String,
    etag: Option<&str>,
    content_type: &'static str,
    body: bytes::Bytes,
) -> Result<HttpResponse, PlaybackError> {
    let verdict = Conditions::from_headers(req.headers()).evaluate(etag, None);
    if verdict == Verdict::PreconditionFailed {
        return Err(PlaybackError::PreconditionFailed);
    }
    let not_modified = verdict == Verdict::NotModified;
    let mut res = if not_modified { HttpResponse::NotModified() } else { HttpResponse::Ok() };
    res.insert_header((header::CACHE_CONTROL, cache_control));
    if let Some(tag) = etag.and_then(|t| HeaderValue::from_str(t).ok()) {
        res.insert_header((header::ETAG, tag));
    }
    if not_modified {
        return Ok(res.finish());
    }
    Ok(res.content_type(content_type).body(body))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const TAG: Option<&str> = Some("\"abc\"");

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn cond(f: impl FnOnce(&mut Conditions)) -> Conditions {
        let mut c = Conditions::default();
        f(&mut c);
        c
    }

    #[test]
    fn if_none_match_compares_weakly_and_wins_over_if_modified_since() {
        let m = Some(at(1_000));
        for list in ["\"abc\"", "W/\"abc\"", "\"x\", W/\"abc\"", "*"] {
            assert_eq!(cond(|c| c.if_none_match = Some(list.into())).evaluate(TAG, m), Verdict::NotModified, "{list}");
        }
        assert_eq!(cond(|c| c.if_none_match = Some("\"x\"".into())).evaluate(TAG, m), Verdict::Proceed { range_allowed: true });
        // If-None-Match present: If-Modified-Since is not evaluated (§13.1.3).
        let c = cond(|c| {
            c.if_none_match = Some("\"x\"".into());
            c.if_modified_since = Some(at(2_000));
        });
        assert_eq!(c.evaluate(TAG, m), Verdict::Proceed { range_allowed: true });
        assert_eq!(cond(|c| c.if_modified_since = Some(at(1_000))).evaluate(TAG, m), Verdict::NotModified);
        assert_eq!(cond(|c| c.if_modified_since = Some(at(999))).evaluate(TAG, m), Verdict::Proceed { range_allowed: true });
    }

    #[test]
    fn if_match_is_strong_and_comes_first() {
        let m = Some(at(1_000));
        assert_eq!(cond(|c| c.if_match = Some("\"abc\"".into())).evaluate(TAG, m), Verdict::Proceed { range_allowed: true });
        assert_eq!(cond(|c| c.if_match = Some("*".into())).evaluate(TAG, m), Verdict::Proceed { range_allowed: true });
        assert_eq!(cond(|c| c.if_match = Some("W/\"abc\"".into())).evaluate(TAG, m), Verdict::PreconditionFailed);
        assert_eq!(cond(|c| c.if_match = Some("\"x\"".into())).evaluate(TAG, m), Verdict::PreconditionFailed);
        assert_eq!(cond(|c| c.if_unmodified_since = Some(at(999))).evaluate(TAG, m), Verdict::PreconditionFailed);
        assert_eq!(cond(|c| c.if_unmodified_since = Some(at(1_000))).evaluate(TAG, m), Verdict::Proceed { range_allowed: true });
        let both = cond(|c| {
            c.if_match = Some("\"x\"".into());
            c.if_none_match = Some("\"abc\"".into());
        });
        assert_eq!(both.evaluate(TAG, m), Verdict::PreconditionFailed, "412 before 304");
    }

    #[test]
    fn if_range_needs_a_strong_tag_or_the_exact_date() {
        let m = Some(at(1_000));
        let range = |v: &str| cond(|c| c.if_range = Some(v.into())).evaluate(TAG, m);
        assert_eq!(range("\"abc\""), Verdict::Proceed { range_allowed: true });
        assert_eq!(range("\"x\""), Verdict::Proceed { range_allowed: false });
        assert_eq!(range("W/\"abc\""), Verdict::Proceed { range_allowed: false });
        let date = HttpDate::from(at(1_000)).to_string();
        assert_eq!(range(&date), Verdict::Proceed { range_allowed: true });
        assert_eq!(range(&HttpDate::from(at(999)).to_string()), Verdict::Proceed { range_allowed: false });
        assert_eq!(range("yesterday"), Verdict::Proceed { range_allowed: false });
    }

    #[test]
    fn headers_are_read_and_bad_dates_ignored() {
        let mut h = HeaderMap::new();
        h.insert(header::IF_MODIFIED_SINCE, "not a date".parse().unwrap());
        assert!(!Conditions::from_headers(&h).any());
        h.insert(header::IF_MODIFIED_SINCE, HttpDate::from(at(5)).to_string().parse().unwrap());
        let c = Conditions::from_headers(&h);
        assert_eq!(c.if_modified_since, Some(at(5)));
    }
}
