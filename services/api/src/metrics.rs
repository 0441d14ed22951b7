//! Request telemetry: one middleware that gives every HTTP request a request
//! id, a tracing span, one log line, and its Prometheus samples.
//!
//! - **Request id.** An incoming `X-Request-Id` of 1–128 characters from
//!   `[A-Za-z0-9._:-]` is kept; anything else (or none) is replaced by a new
//!   `req_<32 hex>` (128 random bits). The id is returned in the response's
//!   `X-Request-Id` header, stored in the request's extensions as
//!   [`RequestId`], and recorded on the `request` span, so every log line a
//!   handler writes carries it.
//! - **Log.** One `info` line per request (`request finished`) with
//!   `request_id`, `method`, `route`, `path`, `status`, `duration_ms` and,
//!   when the response has one, `location` (e.g. `/operations/op_…` after a
//!   `202`: the operation id that travels on in the AMQP `x-correlation-id`
//!   header, which ties this request to the other services' logs).
//! - **Metrics** (names listed in `vid_infra::metrics`):
//!   `http_requests_total{method,route,status}` and
//!   `http_request_duration_seconds{method,route}` (seconds until the response
//!   head is ready; a streamed body such as Server-Sent Events is not
//!   included). `route` is the matched route PATTERN with parameter regexes
//!   removed (`/operations/{id}:wait`), never the raw path; a request no route
//!   matches is `route="unmatched"`; an unusual method is `method="OTHER"`. So
//!   the label sets stay bounded whatever clients send.

use std::time::Instant;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue, LOCATION};
use actix_web::middleware::Next;
use actix_web::{HttpMessage, HttpResponse};
use tracing::Instrument;

/// The request id header, read from requests and set on every response.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The request id of the current request (in the request's extensions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

/// The actix middleware (`App::wrap(actix_web::middleware::from_fn(observe))`):
/// request id, span, log line and metrics, as described in the module docs.
/// Errors: none of its own; an error of the inner service (rare: handlers'
/// errors are responses by then) is counted with its status and passed on.
pub async fn observe(req: ServiceRequest, next: Next<impl MessageBody + 'static>) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let started = Instant::now();
    let request_id = req
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| valid_request_id(v))
        .map(str::to_owned)
        .unwrap_or_else(new_request_id);
    let method = method_label(req.method().as_str());
    // Before routing the pattern comes from the resource map by path; after
    // routing, from the resource that answered (exact). Both are patterns.
    let pre_route = req.match_pattern();
    let path = req.path().to_owned();
    req.extensions_mut().insert(RequestId(request_id.clone()));

    let span = tracing::info_span!("request", request_id = %request_id, method, route = tracing::field::Empty);
    let result = next.call(req).instrument(span.clone()).await;
    let elapsed = started.elapsed();
    let (status, pattern) = match &result {
        Ok(res) => (res.status().as_u16(), res.request().match_pattern().or(pre_route)),
        // An error no inner layer turned into a response: actix renders it after us.
        Err(e) => (e.as_response_error().status_code().as_u16(), pre_route),
    };
    let route = pattern.map(|p| normalise_pattern(&p)).unwrap_or_else(|| "unmatched".to_owned());
    span.record("route", route.as_str());
    vid_infra::metrics::counter!("http_requests_total", "method" => method, "route" => route.clone(), "status" => status.to_string())
        .increment(1);
    vid_infra::metrics::histogram!("http_request_duration_seconds", "method" => method, "route" => route).record(elapsed.as_secs_f64());
    let mut res = match result {
        Ok(res) => res.map_into_boxed_body(),
        Err(e) => {
            span.in_scope(
                || tracing::info!(path = %path, status, duration_ms = elapsed.as_secs_f64() * 1000.0, error = %e, "request finished"),
            );
            return Err(e);
        }
    };
    let location = res.headers().get(LOCATION).and_then(|v| v.to_str().ok()).map(str::to_owned);
    span.in_scope(|| {
        tracing::info!(
            path = %path,
            status,
            duration_ms = elapsed.as_secs_f64() * 1000.0,
            location = location.as_deref(),
            "request finished"
        )
    });
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        res.headers_mut().insert(HeaderName::from_static(REQUEST_ID_HEADER), value);
    }
    Ok(res)
}

/// `GET /metrics`: every metric of this process in the Prometheus text
/// exposition format (`text/plain; version=0.0.4`), from `vid_infra::metrics`.
pub async fn metrics() -> HttpResponse {
    HttpResponse::Ok().content_type(vid_infra::metrics::CONTENT_TYPE).body(vid_infra::metrics::render())
}

/// 1–128 characters from `[A-Za-z0-9._:-]`: safe in a header, a log line and a label.
fn valid_request_id(v: &str) -> bool {
    (1..=128).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

/// `req_` and 128 random bits in hex.
fn new_request_id() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
        // The system RNG failing is not worth failing a request over: fall back to time and a counter.
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
        bytes[..8].copy_from_slice(&t.to_be_bytes());
        bytes[8..].copy_from_slice(&n.to_be_bytes());
    }
    format!("req_{}", hex::encode(bytes))
}

fn method_label(m: &str) -> &'static str {
    match m {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        _ => "OTHER",
    }
}

/// `/operations/{id:[^/:]+}:wait` → `/operations/{id}:wait` (regexes may
/// contain braces, e.g. `{n:\d{2}}`, so braces are counted).
fn normalise_pattern(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    let mut depth = 0usize;
    let mut in_name = false;
    for c in p.chars() {
        match c {
            '{' => {
                if depth == 0 {
                    out.push('{');
                    in_name = true;
                }
                depth += 1;
            }
            '}' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    out.push('}');
                    in_name = false;
                }
            }
            ':' if depth == 1 => in_name = false,
            _ if depth == 0 => out.push(c),
            _ if in_name => out.push(c),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use actix_web::{test, web, App, HttpResponse};

    use super::*;

    #[::core::prelude::v1::test]
    fn patterns_lose_their_regexes() {
        assert_eq!(normalise_pattern("/operations/{id:[^/:]+}:wait"), "/operations/{id}:wait");
        assert_eq!(normalise_pattern("/x/{n:\\d{2}}/{y}"), "/x/{n}/{y}");
        assert_eq!(normalise_pattern("/healthz"), "/healthz");
    }

    #[::core::prelude::v1::test]
    fn request_ids_are_kept_when_sane_and_made_otherwise() {
        assert!(valid_request_id("abc-123_x.y:z"));
        assert!(!valid_request_id(""));
        assert!(!valid_request_id("a b"));
        assert!(!valid_request_id(&"a".repeat(129)));
        let id = new_request_id();
        assert!(id.starts_with("req_") && id.len() == 36 && valid_request_id(&id), "{id}");
        assert_ne!(id, new_request_id());
    }

    /// Through a real actix service: the route label is the pattern, the
    /// request id comes back, and the counter moves.
    #[actix_web::test]
    async fn requests_are_counted_by_route_pattern_and_carry_a_request_id() {
        vid_infra::metrics::install();
        let app = test::init_service(
            App::new()
                .wrap(actix_web::middleware::from_fn(observe))
                // tests/openapi.rs scans the source for served routes, up to
                // `#[cfg(test)]`; these exist only in this test.
                .service(web::resource("/mwtest/{id:[a-z0-9]+}:poke").post(|| async { HttpResponse::Accepted().finish() }))
                .service(web::resource("/metrics").get(metrics)),
        )
        .await;
        let res = test::call_service(
            &app,
            test::TestRequest::post().uri("/mwtest/abc123:poke").insert_header(("X-Request-Id", "given-1")).to_request(),
        )
        .await;
        assert_eq!(res.status(), 202);
        assert_eq!(res.headers().get("x-request-id").unwrap(), "given-1");
        let res = test::call_service(
            &app,
            test::TestRequest::post().uri("/mwtest/zz9:poke").insert_header(("X-Request-Id", "bad id")).to_request(),
        )
        .await;
        let made = res.headers().get("x-request-id").unwrap().to_str().unwrap().to_owned();
        assert!(made.starts_with("req_"), "{made}");
        let res = test::call_service(&app, test::TestRequest::get().uri("/mwtest-nothing-here").to_request()).await;
        assert_eq!(res.status(), 404);

        let res = test::call_service(&app, test::TestRequest::get().uri("/metrics").to_request()).await;
        assert_eq!(res.headers().get("content-type").unwrap(), vid_infra::metrics::CONTENT_TYPE);
        let text = String::from_utf8(test::read_body(res).await.to_vec()).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("http_requests_total") && l.contains(r#"route="/mwtest/{id}:poke""#) && l.contains(r#"status="202""#))
            .unwrap_or_else(|| panic!("no counter for the pattern in:\n{text}"));
        assert!(line.contains(r#"method="POST""#) && line.ends_with(" 2"), "{line}");
        assert!(!text.contains("abc123") && !text.contains("zz9"), "raw paths leaked into labels:\n{text}");
        assert!(text.contains(r#"route="unmatched""#), "{text}");
        assert!(text.contains(r#"http_request_duration_seconds_count{method="POST",route="/mwtest/{id}:poke"} 2"#), "{text}");
    }
}
