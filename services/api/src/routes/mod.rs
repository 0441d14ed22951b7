//! HTTP routes, one module per resource.

pub mod common;
pub mod deliveries;
pub mod endpoints;
pub mod events;
pub mod health;
pub mod ingests;
pub mod operations;
pub mod playback_ids;
pub mod signing_keys;
pub mod uploads;
pub mod videos;

use actix_web::web;

pub use common::{object_from_str, page, page_size, parse_id, read_body, unsafe_to_display, Json, Page, MAX_JSON_BODY_BYTES};

/// Every route of the api.
///
/// Each path is registered once, as a `web::resource(path)` holding one
/// `.route(web::METHOD().to(handler))` per method it supports, and never with
/// `ServiceConfig::route(path, …)`: that makes one resource per method, each
/// guarded by its method, so a request with another method matches no
/// resource and falls through to the `404` of the app. With one resource per
/// path, a known path asked with a method it does not support is answered by
/// the resource itself: `405 Method Not Allowed` with an `Allow` header
/// listing its methods (RFC 9110 §15.5.6), which [`crate::error::methods::method_not_allowed`]
/// turns into a `method_not_allowed` problem. `tests/methods.rs` holds every
/// path of the OpenAPI document to this, and `tests/openapi.rs` reads these
/// registrations to check that each route is documented.
pub fn configure(cfg: &mut web::ServiceConfig) {
    health::configure(cfg);
    uploads::configure(cfg);
    ingests::configure(cfg);
    operations::configure(cfg);
    videos::configure(cfg);
    playback_ids::configure(cfg);
    signing_keys::configure(cfg);
    endpoints::configure(cfg);
    deliveries::configure(cfg);
    events::configure(cfg);
}
