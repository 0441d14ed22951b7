//! Signed playback (issue 20): the `?token=<JWT>` of a `signed` playback ID.
//!
//! A token is a JWS (RFC 7515) compact JWT (RFC 7519) that the customer's
//! server signs with one of the tenant's signing keys. It opens resources of
//! one audience ([`Audience`]) of one playback ID until `exp`:
//!
//! - **where**: the one `token` query parameter (`?token=<JWT>`). A token in
//!   an `Authorization` header or a second `token` parameter is refused
//!   (`token_misplaced`); any other parameter is outside the grammar of the
//!   route (`404`, [`check_query`]), and so is a token in the path (no path
//!   of the grammar has room for one). A `public` playback ID takes no query
//!   at all: `?token=` on it is a `404` like any query, so its URLs keep one
//!   spelling and a CDN one copy;
//! - **header**: `alg` is `RS256`, checked first on the raw header, so
//!   `none`, `HS256` with the public key as the secret (algorithm confusion)
//!   and every other algorithm are `token_algorithm_not_allowed` before any
//!   key is touched; `kid` is a signing key id (`sk_…`) of the SAME tenant
//!   as the playback ID, read from PostgreSQL on every request (one indexed
//!   join, [`crate::store::signing_key`]), so a deleted key fails from the
//!   next request on. Only the parsed public key is cached, by key id and
//!   key text ([`crate::cache::KeyCache`]): never whether a key exists;
//! - **claims**, by `jsonwebtoken` with an explicit [`Validation`]:
//!   algorithms `[RS256]`; `exp`, `sub` and `aud` required; `sub` = the
//!   playback ID; `aud` = the route's audience; `nbf` honoured when present;
//!   [`LEEWAY_SECONDS`] (30 s) of clock skew on `exp` and `nbf`.
//!
//! Each refusal is a `403` problem with its own code ([`TokenRefusal`]) and
//! `Cache-Control: no-store`, naming no tenant, key or claim value.
//!
//! A verified token is carried on: manifests of a signed ID get the SAME
//! `token=<JWT>` appended to every URI they contain ([`forward_query`] for
//! [`crate::rewrite::UriMapper::with_query`]), so one token URL is enough
//! for a player, and every URL it derives expires with the token. The
//! manifest cache keeps the unrewritten stored object, so nothing
//! token-specific is kept server-side. Answers to a token are
//! `Cache-Control: private, max-age=<min(configured, exp - now)>`
//! ([`cache_control`]): a shared cache keeps none, and a browser keeps none
//! past the token's `exp`.

use std::borrow::Cow;

use actix_web::http::header;
use actix_web::{HttpMessage, HttpRequest};
use base64::Engine as _;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use vid_core::playback::Audience;
use vid_core::signing::{ALGORITHM, LEEWAY_SECONDS, TOKEN_PARAMETER};
use vid_core::{PlaybackId, SigningKeyId};

use crate::error::{PlaybackError, TokenRefusal};
use crate::state::AppState;

/// The longest token accepted, in bytes: far above an RS256 JWT with these
/// claims (~600 bytes with a 2048-bit key; ~1.1 KB with 4096), far below
/// what would make a header-parse cost anything.
pub const MAX_TOKEN_BYTES: usize = 4096;

/// How the query string names a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryToken<'a> {
    /// No `token` parameter.
    Absent,
    /// Exactly one `token=<value>`.
    One(&'a str),
    /// `token` more than once.
    Repeated,
}

/// The `token` parameters of `query` (RFC 3986 §3.4; `&`-separated
/// `name=value` pairs; names compared exactly).
pub fn query_token(query: Option<&str>) -> QueryToken<'_> {
    let mut found = QueryToken::Absent;
    for pair in query.unwrap_or("").split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name == TOKEN_PARAMETER {
            found = match found {
                QueryToken::Absent => QueryToken::One(value),
                _ => QueryToken::Repeated,
            };
        }
    }
    found
}

/// The query grammar of a playback route: every parameter is `token` or
/// one of `allowed` (each of those at most once); anything else — an
/// unknown name, a repeated allowed name, an empty pair — is `404`, so each
/// resource keeps one spelling. (A repeated `token` passes here and is
/// refused with its own code by [`authorize`] on a signed ID.)
pub fn check_query(req: &HttpRequest, allowed: &[&str]) -> Result<(), PlaybackError> {
    let Some(query) = req.uri().query() else { return Ok(()) };
    let mut seen: Vec<&str> = Vec::new();
    for pair in query.split('&') {
        let name = pair.split_once('=').map_or(pair, |(n, _)| n);
        if name == TOKEN_PARAMETER {
            continue;
        }
        if !allowed.contains(&name) || seen.contains(&name) {
            return Err(PlaybackError::NotFound);
        }
        seen.push(name);
    }
    Ok(())
}

/// What a verified token granted, kept in the request's extensions by
/// [`authorize`] for the rest of the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The token, exactly as received (base64url and `.`: nothing to escape).
    pub token: String,
    /// Its `exp`, seconds since the Unix epoch.
    pub exp: u64,
}

/// Lets `req` through a playback ID of `policy` for `audience`, or says why not.
///
/// - public: any `token` parameter is a `404` (a public ID takes no query);
/// - signed: see the module docs; on success the [`Grant`] is kept in the
///   request's extensions.
///
/// Errors: `NotFound`, `TokenRequired`, `TokenRefused(_)`, `Unavailable`
/// (PostgreSQL), `Internal` (a stored key that does not parse).
pub async fn authorize(
    state: &AppState,
    req: &HttpRequest,
    id: &PlaybackId,
    signed: bool,
    audience: Audience,
) -> Result<(), PlaybackError> {
    let asked = query_token(req.uri().query());
    if !signed {
        return match asked {
            QueryToken::Absent => Ok(()),
            _ => Err(PlaybackError::NotFound),
        };
    }
    if req.headers().contains_key(header::AUTHORIZATION) || asked == QueryToken::Repeated {
        return Err(PlaybackError::TokenRefused(TokenRefusal::Misplaced));
    }
    let QueryToken::One(token) = asked else { return Err(PlaybackError::TokenRequired) };
    let exp = verify(state, token, id, audience).await?;
    req.extensions_mut().insert(Grant { token: token.to_owned(), exp });
    Ok(())
}

/// Verifies `token` for `audience` of playback ID `id`; its `exp`.
pub async fn verify(state: &AppState, token: &str, id: &PlaybackId, audience: Audience) -> Result<u64, PlaybackError> {
    let refused = PlaybackError::TokenRefused;
    let kid = signing_key_id(token)?;
    let Some(pem) = crate::store::signing_key(&state.db, id, &kid).await? else { return Err(refused(TokenRefusal::UnknownKey)) };
    let key = state.signing_keys.decoding_key(&kid, &pem)?;
    // Claims as JSON, so a missing claim reaches the Validation (typed
    // claims would fail to deserialize first, as a malformed token).
    let data = match jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation(id, audience)) {
        Ok(data) => data,
        // jsonwebtoken reports a present but unparsable `exp` as missing
        // (and checks claims only after the signature): tell them apart.
        Err(e) if matches!(e.kind(), ErrorKind::MissingRequiredClaim(_)) && payload(token).is_some_and(|c| bad_time_claim(&c)) => {
            return Err(refused(TokenRefusal::Malformed))
        }
        Err(e) => return Err(refusal(e.kind())),
    };
    // An unparsable `nbf` is skipped by jsonwebtoken: refuse it like `exp`.
    if bad_time_claim(&data.claims) {
        return Err(refused(TokenRefusal::Malformed));
    }
    data.claims.get("exp").and_then(|v| v.as_u64()).ok_or(refused(TokenRefusal::Malformed))
}

/// Whether `claims` has an `exp` or `nbf` that is not a NumericDate this
/// service reads (RFC 7519 §2, §4.1.4–5): a JSON integer in `0..=u64::MAX`.
/// A negative, fractional, too large (`1e308`, `2^64 + 5`) or non-number
/// value is malformed, not missing.
pub fn bad_time_claim(claims: &serde_json::Value) -> bool {
    ["exp", "nbf"].iter().any(|c| claims.get(c).is_some_and(|v| !v.is_u64()))
}

/// The JSON payload of a JWS compact `token` (RFC 7515 §7.1), unverified.
fn payload(token: &str) -> Option<serde_json::Value> {
    let part = token.split('.').nth(1)?;
    serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(part).ok()?).ok()
}

/// The explicit validation of a token for `audience` of `id` (see the module docs).
pub fn validation(id: &PlaybackId, audience: Audience) -> Validation {
    let mut v = Validation::new(Algorithm::RS256);
    v.algorithms = vec![Algorithm::RS256];
    v.set_required_spec_claims(&["exp", "sub", "aud"]);
    v.validate_exp = true;
    v.validate_nbf = true;
    v.leeway = LEEWAY_SECONDS;
    v.sub = Some(id.to_string());
    v.set_audience(&[audience.claim()]);
    v
}

/// The `kid` of `token`'s header, once the token has the JWS compact shape
/// (three base64url parts, RFC 7515 §7.1), its header is a JSON object and
/// its `alg` is `RS256`. Reads nothing else: the signature is checked later,
/// with the key `kid` names.
pub fn signing_key_id(token: &str) -> Result<SigningKeyId, PlaybackError> {
    let refused = PlaybackError::TokenRefused;
    if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
        return Err(refused(TokenRefusal::Malformed));
    }
    let parts: Vec<&str> = token.split('.').collect();
    let base64url = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if parts.len() != 3 || !parts.iter().all(|p| base64url(p)) || parts[0].is_empty() || parts[1].is_empty() {
        return Err(refused(TokenRefusal::Malformed));
    }
    let header = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(parts[0]).map_err(|_| refused(TokenRefusal::Malformed))?;
    let header: serde_json::Value = serde_json::from_slice(&header).map_err(|_| refused(TokenRefusal::Malformed))?;
    let header = header.as_object().ok_or(refused(TokenRefusal::Malformed))?;
    if header.get("alg").and_then(|a| a.as_str()) != Some(ALGORITHM) {
        return Err(refused(TokenRefusal::AlgorithmNotAllowed));
    }
    if parts[2].is_empty() {
        return Err(refused(TokenRefusal::BadSignature));
    }
    let kid = header.get("kid").and_then(|k| k.as_str()).ok_or(refused(TokenRefusal::UnknownKey))?;
    // Canonical spelling only, like playback IDs in paths.
    kid.parse::<SigningKeyId>().ok().filter(|k| k.as_str() == kid).ok_or(refused(TokenRefusal::UnknownKey))
}

/// The refusal for a `jsonwebtoken` error of a token whose key was found.
fn refusal(kind: &ErrorKind) -> PlaybackError {
    let r = match kind {
        ErrorKind::InvalidSignature => TokenRefusal::BadSignature,
        ErrorKind::ExpiredSignature => TokenRefusal::Expired,
        ErrorKind::ImmatureSignature => TokenRefusal::NotYetValid,
        ErrorKind::InvalidAudience => TokenRefusal::WrongAudience,
        ErrorKind::InvalidSubject => TokenRefusal::WrongSubject,
        ErrorKind::MissingRequiredClaim(_) => TokenRefusal::MissingClaim,
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm | ErrorKind::InvalidAlgorithmName | ErrorKind::UnsupportedAlgorithm => {
            TokenRefusal::AlgorithmNotAllowed
        }
        ErrorKind::InvalidRsaKey(m) => return PlaybackError::Internal(format!("a stored signing key does not verify: {m}")),
        _ => TokenRefusal::Malformed,
    };
    PlaybackError::TokenRefused(r)
}

/// The query to append to every URI of a manifest answered to `req`:
/// `token=<JWT>` when a token was verified, else `None`.
pub fn forward_query(req: &HttpRequest) -> Option<String> {
    req.extensions().get::<Grant>().map(|g| format!("{TOKEN_PARAMETER}={}", g.token))
}

/// `Cache-Control` of an answer to `req`: `configured` (the public one) when
/// no token was verified; for a token, `private, max-age=<n>` with `n` the
/// configured max-age cut to the seconds left before the token's `exp`
/// (so neither a shared cache nor a browser serves it to anyone past `exp`).
pub fn cache_control<'a>(req: &HttpRequest, configured: &'a str) -> Cow<'a, str> {
    let Some(exp) = req.extensions().get::<Grant>().map(|g| g.exp) else { return Cow::Borrowed(configured) };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let configured_age =
        configured.split(',').find_map(|d| d.trim().strip_prefix("max-age=").and_then(|n| n.parse::<u64>().ok())).unwrap_or(0);
    Cow::Owned(format!("private, max-age={}", configured_age.min(exp.saturating_sub(now))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
    }

    #[test]
    fn the_query_names_the_token_once() {
        assert_eq!(query_token(None), QueryToken::Absent);
        assert_eq!(query_token(Some("token=a.b.c")), QueryToken::One("a.b.c"));
        assert_eq!(query_token(Some("time=1&token=a")), QueryToken::One("a"));
        assert_eq!(query_token(Some("token=a&token=b")), QueryToken::Repeated);
        assert_eq!(query_token(Some("tokens=a")), QueryToken::Absent);
        assert_eq!(query_token(Some("Token=a")), QueryToken::Absent);
    }

    #[test]
    fn the_header_is_read_before_any_key() {
        let kid = SigningKeyId::generate();
        let token = |header: &str, sig: &str| format!("{}.{}.{sig}", b64(header), b64("{}"));
        let code = |t: &str| match signing_key_id(t) {
            Ok(k) => format!("ok {k}"),
            Err(PlaybackError::TokenRefused(r)) => r.code().to_owned(),
            Err(e) => format!("{e}"),
        };
        assert_eq!(code(&token(&format!(r#"{{"alg":"RS256","kid":"{kid}"}}"#), "c2ln")), format!("ok {kid}"));
        assert_eq!(code(&token(&format!(r#"{{"alg":"none","kid":"{kid}"}}"#), "")), "token_algorithm_not_allowed");
        assert_eq!(code(&token(&format!(r#"{{"alg":"HS256","kid":"{kid}"}}"#), "c2ln")), "token_algorithm_not_allowed");
        assert_eq!(code(&token(r#"{"kid":"x"}"#, "c2ln")), "token_algorithm_not_allowed");
        assert_eq!(code(&token(r#"{"alg":"RS256"}"#, "c2ln")), "token_unknown_key");
        assert_eq!(code(&token(r#"{"alg":"RS256","kid":"pb_01jd8x4m3v0k2q6s7t9w1y5zab"}"#, "c2ln")), "token_unknown_key");
        assert_eq!(code(&token(&format!(r#"{{"alg":"RS256","kid":"{kid}"}}"#), "")), "token_bad_signature");
        for bad in ["", "a.b", "a.b.c.d", "a+b.c.d", "..", "%7B.a.b", &"a".repeat(MAX_TOKEN_BYTES + 1), &token("[1]", "c2ln")] {
            assert_eq!(code(bad), "token_malformed", "{bad}");
        }
    }

    #[test]
    fn the_validation_is_explicit() {
        let id = PlaybackId::generate();
        let v = validation(&id, Audience::Storyboard);
        assert_eq!(v.algorithms, vec![Algorithm::RS256]);
        assert_eq!(v.leeway, 30);
        assert!(v.validate_exp && v.validate_nbf && v.validate_aud);
        assert_eq!(v.sub.as_deref(), Some(id.as_str()));
        assert_eq!(v.aud, Some(["s".to_owned()].into_iter().collect()));
        for claim in ["exp", "sub", "aud"] {
            assert!(v.required_spec_claims.contains(claim), "{claim}");
        }
    }

    #[test]
    fn a_present_but_unreadable_time_claim_is_malformed() {
        use serde_json::json;
        for bad in
            [json!({"exp": -1}), json!({"exp": 1e308}), json!({"exp": 18446744073709551621.0}), json!({"exp": "1"}), json!({"exp": 1.5})]
        {
            assert!(bad_time_claim(&bad), "{bad}");
        }
        assert!(bad_time_claim(&json!({"exp": 1, "nbf": 1e308})));
        assert!(bad_time_claim(&json!({"exp": 1, "nbf": null})));
        for good in [json!({"exp": 1}), json!({"exp": u64::MAX, "nbf": 0}), json!({"sub": "x"})] {
            assert!(!bad_time_claim(&good), "{good}");
        }
        let token = format!("{}.{}.c2ln", b64(r#"{"alg":"RS256"}"#), b64(r#"{"exp":-1}"#));
        assert_eq!(payload(&token), Some(json!({"exp": -1})));
        assert_eq!(payload("a.%%.c"), None);
    }

    #[test]
    fn every_refusal_has_its_own_code() {
        let mut codes: Vec<&str> = TokenRefusal::ALL.iter().map(|r| r.code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), TokenRefusal::ALL.len());
    }
}
