//! HTTP routes, one module per resource.

pub mod deliveries;
pub mod endpoints;
pub mod events;
pub mod health;
pub mod operations;
pub mod uploads;
pub mod videos;

use std::str::FromStr;

use actix_web::web;
use vid_core::ids::IdError;

use crate::error::ApiError;

/// Parses a path id; a malformed id is `404 not_found` (it cannot name anything),
/// so ids of other kinds and of other tenants look alike.
pub fn parse_id<T: FromStr<Err = IdError>>(raw: &str) -> Result<T, ApiError> {
    raw.parse().map_err(|_| ApiError::NotFound("resource"))
}

/// Every route of the api.
pub fn configure(cfg: &mut web::ServiceConfig) {
    health::configure(cfg);
    uploads::configure(cfg);
    operations::configure(cfg);
    videos::configure(cfg);
    endpoints::configure(cfg);
    deliveries::configure(cfg);
    events::configure(cfg);
}

/// Opaque list cursor: the last id of the previous page.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// Page size, 1–100 (default 20).
    pub limit: Option<i64>,
    /// Return items older than this id (the `next_cursor` of the previous page).
    pub cursor: Option<String>,
    /// Filter by status (operations) or type (events).
    pub status: Option<String>,
    /// Filter events by type.
    #[serde(rename = "type")]
    pub type_: Option<String>,
}

impl PageQuery {
    /// The page size, clamped to 1–100.
    pub fn limit(&self) -> i64 {
        self.limit.unwrap_or(20).clamp(1, 100)
    }
}

/// A page of a list endpoint: `{data: [...], next_cursor}`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Page<T> {
    /// Items, newest first.
    pub data: Vec<T>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}
