//! Request metrics (names listed in `vid_infra::metrics`):
//! `http_requests_total{method,route,status}` and
//! `http_request_duration_seconds{method,route}` (until the response head is
//! ready; a streamed segment body is not included), the same names and
//! labels as the api's, so one dashboard query covers both. `route` is the
//! matched route pattern (`/play/{pb}/{track}/{file}`), never the raw path:
//! the label set stays bounded whatever clients send; no route is `unmatched`.
//! Plus `playback_cache_lookups_total{cache,outcome}` (`cache`: `id` or
//! `manifest`; `outcome`: `hit` or `miss`).
//!
//! One `debug` log line per request (this is the highest-volume path; the
//! CDN in front keeps access logs); `warn`/`error` lines for 503/500.

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::HttpResponse;

/// The actix middleware recording the request metrics (module docs).
/// Errors: none of its own; an inner error is counted with its status and passed on.
pub async fn observe<B: MessageBody>(req: ServiceRequest, next: Next<B>) -> Result<ServiceResponse<B>, actix_web::Error> {
    let started = Instant::now();
    let method = method_label(req.method().as_str());
    let result = next.call(req).await;
    let (status, route) = match &result {
        Ok(res) => (res.status().as_u16(), res.request().match_pattern()),
        Err(e) => (e.as_response_error().status_code().as_u16(), None),
    };
    let route = route.unwrap_or_else(|| "unmatched".to_owned());
    let elapsed = started.elapsed().as_secs_f64();
    tracing::debug!(method, route = %route, status, duration_ms = elapsed * 1000.0, "request finished");
    vid_infra::metrics::counter!("http_requests_total", "method" => method, "route" => route.clone(), "status" => status.to_string())
        .increment(1);
    vid_infra::metrics::histogram!("http_request_duration_seconds", "method" => method, "route" => route).record(elapsed);
    result
}

/// Counts one cache lookup (`cache`: `id` or `manifest`).
pub fn cache_lookup(cache: &'static str, hit: bool) {
    vid_infra::metrics::counter!("playback_cache_lookups_total", "cache" => cache, "outcome" => if hit { "hit" } else { "miss" })
        .increment(1);
}

/// `GET /metrics`: this process's metrics, Prometheus text format 0.0.4.
pub async fn metrics() -> HttpResponse {
    HttpResponse::Ok().content_type(vid_infra::metrics::CONTENT_TYPE).body(vid_infra::metrics::render())
}

fn method_label(m: &str) -> &'static str {
    match m {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        _ => "OTHER",
    }
}
