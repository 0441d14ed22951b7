//! CORS for browser uploads (issue 21; Fetch Standard §3.2 "CORS protocol").
//!
//! Only the client-token routes speak CORS: `GET|DELETE /uploads/{id}`,
//! `POST /uploads/{id}/parts:sign`, `POST /uploads/{id}/complete`,
//! `GET /operations/{id}`, `POST /operations/{id}:wait` and
//! `GET /operations/{id}/events`. The one origin they allow is the upload's
//! `cors_origin` (given to `POST /uploads`, stored on the row); an operation's
//! is its upload's.
//!
//! - A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`)
//!   on one of those paths answers `204`; only when `Origin` is the upload's
//!   `cors_origin` does it carry `Access-Control-Allow-Origin` and the allowed
//!   methods and headers (`Authorization, Content-Type, Idempotency-Key,
//!   Last-Event-ID`), cached for [`PREFLIGHT_MAX_AGE_SECONDS`]. Another origin,
//!   an unknown id or an upload without `cors_origin` get the same `204`
//!   without them (the browser then blocks the request), so a preflight tells
//!   nobody whether an id exists. Any other `OPTIONS` is the usual `405`.
//! - An actual answer of those routes carries `Access-Control-Allow-Origin:
//!   <origin>` (with `Vary: Origin` and the exposed `Location`, `Retry-After`,
//!   `Idempotent-Replayed`) when the caller's extractor
//!   ([`crate::auth::UploadCaller`], [`crate::auth::OperationCaller`]) found
//!   the request's `Origin` equal to the upload's `cors_origin`. A refusal
//!   (`401` for an expired or unknown token, `404` for another upload's id,
//!   any non-2xx answer) the extractor did not vouch for looks the path's
//!   upload or operation up by id, whatever the token, and carries the same
//!   headers only when `Origin` equals its `cors_origin`, so a page reads the
//!   typed problem instead of a CORS network error.
//! - Every answer of those routes carries `Vary: Origin`, whether an origin
//!   was allowed or not (Fetch Standard §3.2.5, CORS protocol and HTTP caches).
//!
//! No credentials mode: the token travels in `Authorization`, never in cookies,
//! so `Access-Control-Allow-Credentials` is never sent.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage, HttpResponse};
use vid_core::{OperationId, UploadId};

use crate::error::{codes, ApiError, ApiResult};
use crate::state::AppState;
use crate::store;

/// How long a browser may cache a preflight answer (`Access-Control-Max-Age`), seconds.
pub const PREFLIGHT_MAX_AGE_SECONDS: u32 = 600;

/// The request headers a page may send on the token routes.
pub const ALLOWED_HEADERS: &str = "Authorization, Content-Type, Idempotency-Key, Last-Event-ID";

/// The response headers a page's script may read besides the CORS-safelisted ones.
pub const EXPOSED_HEADERS: &str = "Location, Retry-After, Idempotent-Replayed";

/// The origin an actual answer may name in `Access-Control-Allow-Origin`,
/// put in the request's extensions by the caller extractors.
#[derive(Debug, Clone)]
pub struct AllowedOrigin(pub String);

/// A client-token route named by a path, with the id it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenRoute {
    /// `/uploads/{id}`, `/uploads/{id}/parts:sign`, `/uploads/{id}/complete`.
    Upload {
        /// The path's id (not parsed yet).
        id: String,
        /// The methods the path serves, as `Access-Control-Allow-Methods`.
        methods: &'static str,
    },
    /// `/operations/{id}`, `/operations/{id}:wait`, `/operations/{id}/events`.
    Operation {
        /// The path's id (not parsed yet).
        id: String,
        /// The methods the path serves.
        methods: &'static str,
    },
}

/// Which client-token route `path` is, if any.
pub fn token_route(path: &str) -> Option<TokenRoute> {
    let segment_ok = |s: &str| !s.is_empty() && !s.contains(['/', ':']);
    if let Some(rest) = path.strip_prefix("/uploads/") {
        let (id, methods) = match rest.split_once('/') {
            None => (rest, "GET, DELETE"),
            Some((id, "parts:sign" | "complete")) => (id, "POST"),
            Some(_) => return None,
        };
        return segment_ok(id).then(|| TokenRoute::Upload { id: id.to_owned(), methods });
    }
    if let Some(rest) = path.strip_prefix("/operations/") {
        let (id, methods) = if let Some(id) = rest.strip_suffix(":wait") {
            (id, "POST")
        } else if let Some(id) = rest.strip_suffix("/events") {
            (id, "GET")
        } else {
            (rest, "GET")
        };
        return segment_ok(id).then(|| TokenRoute::Operation { id: id.to_owned(), methods });
    }
    None
}

/// Parses a `cors_origin` as given to `POST /uploads`: an absolute `http` or
/// `https` URL with a host and nothing after it (no path other than none or
/// `/`, no query, fragment or user info). Returns its ASCII serialization (the
/// form browsers send in `Origin`, WHATWG URL Standard §4.5 "origin": lower-case
/// host, IDNA-encoded, default port dropped), e.g. `https://app.example.com`.
///
/// Errors: `422 invalid_cors_origin`.
pub fn parse_cors_origin(raw: &str) -> ApiResult<String> {
    let refuse = |why: &str| {
        ApiError::new(
            codes::INVALID_CORS_ORIGIN,
            format!("cors_origin must be an origin like https://app.example.com or http://localhost:3000 ({why}; got `{raw}`)"),
        )
    };
    if raw.len() > 2048 || raw.trim() != raw {
        return Err(refuse("too long or padded with spaces"));
    }
    let url = url::Url::parse(raw).map_err(|_| refuse("not an absolute URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(refuse("the scheme must be http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(refuse("no host"));
    }
    if url.host_str().is_some_and(|h| h.contains('*')) {
        return Err(refuse("wildcards are not allowed: name one origin"));
    }
    if url.port() == Some(0) {
        return Err(refuse("port 0 is not a port a page is served from"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(refuse("user info is not part of an origin"));
    }
    if url.query().is_some() || url.fragment().is_some() || url.path() != "/" || raw.ends_with('/') {
        return Err(refuse("an origin has no path, query or fragment"));
    }
    Ok(url.origin().ascii_serialization())
}

/// The middleware: answers preflights of the token routes and adds the CORS
/// headers to their actual answers (see the module docs). Installed once for
/// the whole app (`lib.rs`).
pub async fn cors(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> actix_web::Result<ServiceResponse<EitherBody<impl MessageBody>>> {
    let is_preflight = req.method() == actix_web::http::Method::OPTIONS
        && req.headers().contains_key(header::ORIGIN)
        && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if is_preflight {
        if let Some(route) = token_route(req.path()) {
            let state = req.app_data::<web::Data<AppState>>().cloned();
            let origin = req.headers().get(header::ORIGIN).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let answer = match (state, origin) {
                (Some(state), Some(origin)) => preflight(&state, &route, &origin).await,
                _ => preflight_refused(),
            };
            let (http, _) = req.into_parts();
            return Ok(ServiceResponse::new(http, answer).map_into_right_body());
        }
    }
    let route = token_route(req.path());
    let mut res = next.call(req).await?;
    let Some(route) = route else { return Ok(res.map_into_left_body()) };
    let mut allowed = res.request().extensions().get::<AllowedOrigin>().map(|a| a.0.clone());
    if allowed.is_none() && !res.status().is_success() {
        // A refusal: the extractor vouched for nothing (expired token, other
        // id, …). Allow the origin the path's upload names, if it is this one.
        let origin = res.request().headers().get(header::ORIGIN).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let state = res.request().app_data::<web::Data<AppState>>().cloned();
        if let (Some(origin), Some(state)) = (origin, state) {
            if stored_origin(&state, &route).await.as_deref() == Some(origin.as_str()) {
                allowed = Some(origin);
            }
        }
    }
    let headers = res.headers_mut();
    if let Some(value) = allowed.and_then(|o| HeaderValue::from_str(&o).ok()) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static(EXPOSED_HEADERS));
    }
    headers.append(header::VARY, HeaderValue::from_static("Origin"));
    Ok(res.map_into_left_body())
}

/// The `204` to a preflight that allows nothing.
fn preflight_refused() -> HttpResponse {
    HttpResponse::NoContent().insert_header((header::VARY, "Origin")).finish()
}

/// The `cors_origin` of the upload `route` names (of its upload, for an
/// operation); `None` for an unparsable or unknown id, an upload without one,
/// or a database error (logged: the browser's request is then blocked).
async fn stored_origin(state: &AppState, route: &TokenRoute) -> Option<String> {
    let stored = async {
        let mut conn = state.db.get().await?;
        Ok::<_, ApiError>(match route {
            TokenRoute::Upload { id, .. } => match id.parse::<UploadId>() {
                Ok(id) => store::uploads::cors_origin_of_upload(&mut conn, &id).await?,
                Err(_) => None,
            },
            TokenRoute::Operation { id, .. } => match id.parse::<OperationId>() {
                Ok(id) => store::uploads::cors_origin_of_operation(&mut conn, &id).await?,
                Err(_) => None,
            },
        })
    };
    match stored.await {
        Ok(stored) => stored,
        Err(e) => {
            tracing::warn!(error = %e, "could not look up the CORS origin of a token route");
            None
        }
    }
}

/// Answers a preflight of `route` from `origin`. A database error is a
/// refusal (the browser's request is blocked; it may retry).
async fn preflight(state: &AppState, route: &TokenRoute, origin: &str) -> HttpResponse {
    let stored = stored_origin(state, route).await;
    let methods = match route {
        TokenRoute::Upload { methods, .. } | TokenRoute::Operation { methods, .. } => *methods,
    };
    match stored {
        Some(allowed) if allowed == origin => HttpResponse::NoContent()
            .insert_header((header::ACCESS_CONTROL_ALLOW_ORIGIN, allowed))
            .insert_header((header::ACCESS_CONTROL_ALLOW_METHODS, methods))
            .insert_header((header::ACCESS_CONTROL_ALLOW_HEADERS, ALLOWED_HEADERS))
            .insert_header((header::ACCESS_CONTROL_MAX_AGE, PREFLIGHT_MAX_AGE_SECONDS.to_string()))
            .insert_header((header::VARY, "Origin"))
            .finish(),
        _ => preflight_refused(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_scheme_host_and_port_only() {
        for (raw, want) in [
            ("https://app.example.com", "https://app.example.com"),
            ("http://localhost:3000", "http://localhost:3000"),
            ("https://APP.Example.com", "https://app.example.com"),
            ("https://app.example.com:443", "https://app.example.com"),
            ("http://[::1]:8080", "http://[::1]:8080"),
        ] {
            assert_eq!(parse_cors_origin(raw).unwrap(), want, "{raw}");
        }
        for bad in [
            "",
            "app.example.com",
            "https://app.example.com/",
            "https://app.example.com/path",
            "https://app.example.com?x=1",
            "https://app.example.com#x",
            "https://user:pw@app.example.com",
            "ftp://app.example.com",
            "javascript:alert(1)",
            "null",
            "*",
            " https://app.example.com",
            "https://*.example.com",
            "https://*",
            "http://localhost:0",
            "https://app.example.com:0",
        ] {
            let e = parse_cors_origin(bad).unwrap_err();
            assert_eq!(e.code(), codes::INVALID_CORS_ORIGIN, "{bad}");
        }
    }

    #[test]
    fn token_routes_are_exactly_the_six_paths() {
        assert_eq!(token_route("/uploads/upl_1"), Some(TokenRoute::Upload { id: "upl_1".into(), methods: "GET, DELETE" }));
        assert_eq!(token_route("/uploads/upl_1/complete"), Some(TokenRoute::Upload { id: "upl_1".into(), methods: "POST" }));
        assert_eq!(token_route("/uploads/upl_1/parts:sign"), Some(TokenRoute::Upload { id: "upl_1".into(), methods: "POST" }));
        assert_eq!(token_route("/operations/op_1"), Some(TokenRoute::Operation { id: "op_1".into(), methods: "GET" }));
        assert_eq!(token_route("/operations/op_1:wait"), Some(TokenRoute::Operation { id: "op_1".into(), methods: "POST" }));
        assert_eq!(token_route("/operations/op_1/events"), Some(TokenRoute::Operation { id: "op_1".into(), methods: "GET" }));
        for other in ["/uploads", "/uploads/", "/operations/op_1:cancel", "/videos/v", "/uploads/u/x", "/operations"] {
            assert_eq!(token_route(other), None, "{other}");
        }
    }
}
