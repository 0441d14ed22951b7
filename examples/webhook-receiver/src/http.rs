//! The HTTP side: `POST /webhooks`, `GET /events`, `GET /healthz`.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::http::header::HeaderMap;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;
use vid_webhooks::{Headers, Secret, Verifier};

use crate::consumer::ConsumerStats;
use crate::db::{self, Pool};
use crate::event::Envelope;
use crate::queue::EventPublisher;

/// Shared by every request.
pub struct AppState {
    /// The receiver's database.
    pub pool: Pool,
    /// Publishes verified events to the queue.
    pub publisher: EventPublisher,
    /// Every secret currently accepted.
    pub secrets: Vec<Secret>,
    /// Tolerance and format options.
    pub verifier: Verifier,
    /// What the consumer(s) in this process did.
    pub stats: Arc<ConsumerStats>,
}

/// The most time `POST /webhooks` spends on its optional "already seen?"
/// check; past it the event is enqueued anyway (the consumer dedupes).
pub const SEEN_CHECK_BUDGET: Duration = Duration::from_millis(1500);

/// Registers the routes.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/webhooks")
            .route(web::post().to(receive))
            .default_service(web::to(|| async { HttpResponse::MethodNotAllowed().insert_header(("Allow", "POST")).finish() })),
    )
    .route("/events", web::get().to(events))
    .route("/healthz", web::get().to(healthz));
}

/// actix-web's `HeaderMap` (from `http` 0.2) seen through `vid_webhooks::Headers`.
struct ActixHeaders<'a>(&'a HeaderMap);

impl Headers for ActixHeaders<'_> {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.0.get(name).map(|value| value.as_bytes())
    }
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// `POST /webhooks`: verify → already seen? `200` → enqueue → `200`.
///
/// The body is taken as raw bytes and verified exactly as received. The id is
/// **not** recorded here: if enqueueing fails the answer is `503`, the sender
/// retries, and nothing claims the event was handled.
async fn receive(req: HttpRequest, body: web::Bytes, state: web::Data<AppState>) -> HttpResponse {
    if let Err(error) = state.verifier.verify(&state.secrets, &ActixHeaders(req.headers()), &body, unix_now()) {
        tracing::info!(code = error.code(), %error, "rejected a delivery");
        return HttpResponse::BadRequest().json(json!({ "error": error.code(), "detail": error.to_string() }));
    }
    let Some(event) = Envelope::parse(&body) else {
        return HttpResponse::BadRequest().json(json!({ "error": "invalid_event", "detail": "body is not an event with `id` and `type`" }));
    };

    // A cheap check that saves a trip through the queue; the consumer is what
    // makes duplicates harmless, so a database hiccup here is not fatal.
    // Bounded by SEEN_CHECK_BUDGET so a hung database cannot hold the
    // answer past the sender's timeout.
    match tokio::time::timeout(SEEN_CHECK_BUDGET, db::is_seen(&state.pool, &event.id)).await {
        Ok(Ok(true)) => return HttpResponse::Ok().json(json!({ "status": "already_processed", "id": event.id })),
        Ok(Ok(false)) => {}
        Ok(Err(error)) => tracing::warn!(error = format!("{error:#}"), event_id = event.id, "seen check failed; enqueueing anyway"),
        Err(_) => {
            tracing::warn!(budget_ms = SEEN_CHECK_BUDGET.as_millis() as u64, event_id = event.id, "seen check too slow; enqueueing anyway")
        }
    }

    match state.publisher.enqueue(&event.id, &body).await {
        Ok(()) => HttpResponse::Ok().json(json!({ "status": "queued", "id": event.id })),
        Err(error) => {
            tracing::warn!(%error, event_id = event.id, "could not enqueue; answering 503 so the sender retries");
            HttpResponse::ServiceUnavailable()
                .insert_header(("Retry-After", "5"))
                .json(json!({ "error": "queue_unavailable", "detail": error.to_string() }))
        }
    }
}

/// `GET /events`: recent processed events, applied effects, local videos, and
/// the consumer's counters.
async fn events(state: web::Data<AppState>) -> HttpResponse {
    match db::state_view(&state.pool, 100).await {
        Ok(view) => HttpResponse::Ok().json(json!({
            "events": view.events,
            "effects": view.effects,
            "videos": view.videos,
            "consumer": state.stats.snapshot(),
        })),
        Err(error) => HttpResponse::ServiceUnavailable().json(json!({ "error": "database_unavailable", "detail": format!("{error:#}") })),
    }
}

/// `GET /healthz`: the process is up.
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}
