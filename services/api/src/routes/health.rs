//! `/healthz` (liveness: the process answers), `/readyz` (dependencies
//! reachable) and `/metrics` (Prometheus text format, see [`crate::metrics`]).
//!
//! All three need no API key; they are documented in the OpenAPI document
//! under the `meta` tag, `/metrics` with its `text/plain` body.

use actix_web::{web, HttpResponse};

use crate::state::AppState;

/// Routes of this module.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/healthz").route(web::get().to(healthz)))
        .service(web::resource("/readyz").route(web::get().to(readyz)))
        .service(web::resource("/metrics").route(web::get().to(metrics)));
}

/// `GET /healthz`.
#[derive(utoipa::ToSchema)]
pub struct Liveness {
    /// Always `ok`.
    #[schema(example = "ok")]
    pub status: String,
}

/// `GET /readyz`: whether each dependency answered.
#[derive(utoipa::ToSchema)]
pub struct Readiness {
    /// PostgreSQL answered `SELECT 1`.
    pub database: bool,
    /// The media bucket answered `HeadBucket`.
    pub storage: bool,
}

/// Liveness: the process answers. Cheap; touches no dependency.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "meta",
    responses((status = 200, description = "The process is alive.", body = Liveness)),
)]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

/// Readiness: the database and the media bucket answer, each within
/// [`vid_infra::readiness::CHECK_TIMEOUT`]. RabbitMQ is deliberately not checked: the
/// api writes jobs and events to its transactional outbox and keeps serving
/// while the broker is away (the relay publishes once it is back).
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "meta",
    responses(
        (status = 200, description = "Every dependency answered.", body = Readiness),
        (status = 503, description = "A dependency did not answer; the body says which.", body = Readiness),
    ),
)]
async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let ready =
        vid_infra::readiness::check(vid_db::ping(&state.db), vid_infra::readiness::bucket_answers(&state.s3, &state.settings.s3.bucket))
            .await;
    if ready.is_ready() {
        HttpResponse::Ok().json(ready)
    } else {
        HttpResponse::ServiceUnavailable().json(ready)
    }
}

/// Prometheus scrape target: every metric of this process in the text
/// exposition format 0.0.4 (names listed in `vid_infra::metrics`). No API key:
/// it carries no tenant data, only route patterns, status codes, counts and
/// latencies.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "meta",
    responses((status = 200, description = "Prometheus text exposition format 0.0.4.", body = String, content_type = "text/plain; version=0.0.4")),
)]
async fn metrics() -> HttpResponse {
    crate::metrics::metrics().await
}
