//! `/healthz` (liveness: the process answers), `/readyz` (dependencies
//! reachable) and `/metrics` (Prometheus text format, see [`crate::metrics`]).
//!
//! All three need no API key; they are documented in the OpenAPI document
//! under the `meta` tag, `/metrics` with its `text/plain` body.

use actix_web::{web, HttpResponse};
use vid_db::RunQueryDsl;

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

/// How long each readiness check (database, bucket) may take before it counts as failed.
pub const READINESS_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Readiness: the database and the media bucket answer, each within
/// [`READINESS_CHECK_TIMEOUT`]. RabbitMQ is deliberately not checked: the
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
    // Each check answers within READINESS_CHECK_TIMEOUT: a dependency that
    // accepts connections but never answers makes the api unready, not stuck.
    let db = async {
        match state.db.get().await {
            Ok(mut conn) => diesel::select(diesel::dsl::sql::<diesel::sql_types::Integer>("1")).get_result::<i32>(&mut conn).await.is_ok(),
            Err(_) => false,
        }
    };
    let storage = async { state.s3.head_bucket().bucket(&state.settings.s3.bucket).send().await.is_ok() };
    let (db_ok, storage_ok) = futures::join!(async { tokio::time::timeout(READINESS_CHECK_TIMEOUT, db).await.unwrap_or(false) }, async {
        tokio::time::timeout(READINESS_CHECK_TIMEOUT, storage).await.unwrap_or(false)
    },);
    let body = serde_json::json!({"database": db_ok, "storage": storage_ok});
    if db_ok && storage_ok {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
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
