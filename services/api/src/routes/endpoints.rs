//! `/webhook-endpoints`: where a tenant's events are delivered.
//!
//! URLs are customer input, so every URL passes the SSRF guard
//! (`vid-netguard`) here and again at every delivery in the dispatcher.

use actix_web::{web, HttpResponse};
use chrono::Utc;
use vid_core::endpoint::{CreateEndpoint, CreatedEndpoint, Endpoint, SignatureFormat};
use vid_core::event::EventType;
use vid_core::EndpointId;
use vid_webhooks::Secret;

use crate::auth::Tenant;
use crate::error::{codes, ApiError, ApiResult};
use crate::routes::common::parse_id;
use crate::state::AppState;
use crate::store::endpoints::{self as store, health_of, EndpointChangeset, EndpointRow, NewEndpoint};

/// Routes of this module.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/webhook-endpoints").route(web::post().to(create_endpoint)).route(web::get().to(list_endpoints))).service(
        web::resource("/webhook-endpoints/{id:[^/:]+}")
            .route(web::get().to(get_endpoint))
            .route(web::patch().to(update_endpoint))
            .route(web::delete().to(delete_endpoint)),
    );
}

/// Checks a customer URL against the SSRF policy (parse, resolve, check every address).
async fn check_url(state: &AppState, url: &str) -> ApiResult<String> {
    let checked = vid_netguard::check_registration(url, &state.url_policy, &*state.resolver)
        .await
        .map_err(|e| ApiError::unprocessable(e.code(), e.to_string()))?;
    Ok(checked.as_str().to_owned())
}

/// The longest `description` accepted, in bytes (UTF-8).
pub const MAX_DESCRIPTION_BYTES: usize = 1024;

/// A description is free text of at most [`MAX_DESCRIPTION_BYTES`] without
/// characters unsafe to display ([`crate::routes::common::unsafe_to_display`]:
/// controls, so also no tab or line break; bidi overrides such as U+202E and
/// zero-width characters; line/paragraph separators). Refused: 422
/// `invalid_description`. Checked here
/// rather than left to PostgreSQL, which refuses U+0000 in `text` (a 500).
fn check_description(d: &str) -> ApiResult<()> {
    if d.len() > MAX_DESCRIPTION_BYTES {
        return Err(ApiError::new(codes::INVALID_DESCRIPTION, format!("description is limited to {MAX_DESCRIPTION_BYTES} bytes")));
    }
    if let Some(c) = d.chars().find(|c| crate::routes::common::unsafe_to_display(*c)) {
        return Err(ApiError::new(
            codes::INVALID_DESCRIPTION,
            format!("description may not contain control, format or line/paragraph separator characters (found U+{:04X})", u32::from(c)),
        ));
    }
    Ok(())
}

/// An event filter as stored: at least one type (`[]` would match nothing,
/// silently: 422 `invalid_event_types`), each type once, in the order given.
fn event_filter(types: &[EventType]) -> ApiResult<Vec<String>> {
    if types.is_empty() {
        return Err(ApiError::new(
            codes::INVALID_EVENT_TYPES,
            "event_types may not be empty; omit it (or, when updating, send null) to receive every type",
        ));
    }
    let mut out: Vec<String> = Vec::with_capacity(types.len());
    for t in types {
        if !out.iter().any(|s| s == t.as_str()) {
            out.push(t.as_str().to_owned());
        }
    }
    Ok(out)
}

/// `POST /webhook-endpoints` → `201` with the secret, shown this once.
///
/// `description`: at most 1024 bytes, no control characters. `event_types`:
/// at least one type when present (absent or `null`: every type); duplicates
/// are stored once, in the order given.
///
/// Errors (422): the SSRF guard's codes (`blocked_address`, `https_required`, `port_not_allowed`,
/// `userinfo_not_allowed`, `invalid_url` (also for whitespace or control
/// characters), `dns_failed`, …), `invalid_description`, `invalid_event_types`.
/// Malformed JSON, unknown fields or unknown event types: 400 `invalid_json`.
#[utoipa::path(
    post,
    path = "/webhook-endpoints",
    tag = "webhook-endpoints",
    security(("api_key" = [])),
    request_body = CreateEndpoint,
    responses(
        (status = 201, description = "Created; the signing `secret` is shown this once.", body = CreatedEndpoint, headers(("Location" = String, description = "`/webhook-endpoints/{id}`")),
            links(("GetEndpoint" = (operation_id = "get_endpoint", parameters(("id" = "$response.body#/id")))), ("UpdateEndpoint" = (operation_id = "update_endpoint", parameters(("id" = "$response.body#/id")))), ("DeleteEndpoint" = (operation_id = "delete_endpoint", parameters(("id" = "$response.body#/id")))), ("RotateSecret" = (operation_id = "rotate_secret", parameters(("id" = "$response.body#/id")))), ("EnableEndpoint" = (operation_id = "enable_endpoint", parameters(("id" = "$response.body#/id")))), ("ListDeliveries" = (operation_id = "list_deliveries", parameters(("id" = "$response.body#/id")))))),
        (status = 400, response = crate::error::responses::BadRequest),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 413, response = crate::error::responses::PayloadTooLarge),
        (status = 415, response = crate::error::responses::UnsupportedMediaType),
        (status = 422, response = crate::error::responses::Unprocessable),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn create_endpoint(
    state: web::Data<AppState>,
    tenant: Tenant,
    body: crate::routes::common::Json<CreateEndpoint>,
) -> ApiResult<HttpResponse> {
    let req = body.into_inner();
    if let Some(d) = &req.description {
        check_description(d)?;
    }
    let event_types: Option<Vec<String>> = req.event_types.as_deref().map(event_filter).transpose()?;
    let url = check_url(&state, &req.url).await?;
    let id = EndpointId::generate();
    let secret = Secret::generate();
    let sealed = state.sealing_key.seal(id.as_str(), secret.as_str().as_bytes()).map_err(|e| ApiError::Internal(e.into()))?;
    let format = req.signature_format.unwrap_or_default();
    let mut conn = state.db.get().await?;
    let new = NewEndpoint {
        id: &id,
        tenant: &tenant.id,
        url: &url,
        description: req.description.as_deref(),
        event_types: event_types.as_deref(),
        signature_format: format,
        secret_sealed: &sealed,
    };
    let row = store::insert(&mut conn, &new).await?;
    let created = CreatedEndpoint { endpoint: row.into_endpoint(), secret: secret.as_str().to_owned() };
    // A one-time secret: no cache may keep it (RFC 9111 §5.2.2.5).
    Ok(HttpResponse::Created()
        .insert_header(("Location", format!("/webhook-endpoints/{id}")))
        .insert_header(("Cache-Control", "no-store"))
        .json(created))
}

/// The tenant's endpoint, unless deleted; else 404 `not_found`.
async fn load(state: &AppState, tenant: &Tenant, id: &EndpointId) -> ApiResult<EndpointRow> {
    let mut conn = state.db.get().await?;
    store::find(&mut conn, &tenant.id, id).await?.ok_or(ApiError::NotFound("webhook endpoint"))
}

/// `GET /webhook-endpoints/{id}`: the endpoint with its delivery `health`
/// (as in the list: success rate and last attempt over its latest 100 deliveries).
#[utoipa::path(
    get,
    path = "/webhook-endpoints/{id}",
    tag = "webhook-endpoints",
    security(("api_key" = [])),
    params(("id" = EndpointId, Path, description = "The webhook endpoint.")),
    responses(
        (status = 200, description = "The endpoint with its delivery health.", body = EndpointSummary),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn get_endpoint(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: EndpointId = parse_id(&path)?;
    let endpoint = load(&state, &tenant, &id).await?.into_endpoint();
    let mut conn = state.db.get().await?;
    let health = health_of(&mut conn, &[id.to_string()]).await?.remove(id.as_str()).unwrap_or_default();
    Ok(HttpResponse::Ok().json(EndpointSummary { endpoint, health }))
}

pub use vid_core::endpoint::{EndpointHealth, EndpointSummary};

/// `GET /webhook-endpoints`: every endpoint of the tenant (not paged), each with its delivery health.
#[derive(utoipa::ToSchema)]
pub struct EndpointList {
    /// Newest first.
    pub data: Vec<EndpointSummary>,
}

/// `GET /webhook-endpoints`: every endpoint of the tenant, newest first, each
/// with its delivery `health` (success rate and last attempt over its latest
/// 100 deliveries).
#[utoipa::path(
    get,
    path = "/webhook-endpoints",
    tag = "webhook-endpoints",
    security(("api_key" = [])),
    responses(
        (status = 200, description = "Every endpoint of the tenant, newest first, with its delivery health.", body = EndpointList),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn list_endpoints(state: web::Data<AppState>, tenant: Tenant) -> ApiResult<HttpResponse> {
    let mut conn = state.db.get().await?;
    let rows = store::list(&mut conn, &tenant.id).await?;
    let ids: Vec<String> = rows.iter().map(|r| r.id.to_string()).collect();
    let mut health = health_of(&mut conn, &ids).await?;
    let data: Vec<EndpointSummary> = rows
        .into_iter()
        .map(|r| {
            let health = health.remove(r.id.as_str()).unwrap_or_default();
            EndpointSummary { endpoint: r.into_endpoint(), health }
        })
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({ "data": data })))
}

/// `deserialize_with` for a PATCH field where `null` means something else than
/// absent. With `#[serde(default)]`: absent → `None` (keep), `null` →
/// `Some(None)` (clear), a value → `Some(Some(value))` (set).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    <Option<T> as serde::Deserialize>::deserialize(d).map(Some)
}

/// `PATCH /webhook-endpoints/{id}` body: any subset of the fields. An absent
/// field keeps its current value; `null` clears `description` and
/// `event_types` (and keeps `url` and `signature_format`, which cannot be cleared).
#[derive(Debug, Default, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateEndpoint {
    /// New URL (checked like at creation). Absent or `null`: kept.
    #[schema(example = "https://hooks.example.com/video")]
    pub url: Option<String>,
    /// New description: at most 1024 bytes, no control characters.
    /// `null` removes it; absent keeps it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, nullable, max_length = 1024, pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$")]
    pub description: Option<Option<String>>,
    /// New filter, replacing the current one: at least one type (`[]` is
    /// refused; use DELETE to stop deliveries), each stored once in the order
    /// given. `null` removes the filter (every type is sent); absent keeps it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<EventType>>, nullable, min_items = 1)]
    pub event_types: Option<Option<Vec<EventType>>>,
    /// New signature format. Absent or `null`: kept.
    pub signature_format: Option<SignatureFormat>,
}

/// `PATCH /webhook-endpoints/{id}`: changes the fields present in the body.
///
/// Every field is validated before anything is written, and the changes are
/// applied in one statement: a refused request changes nothing.
///
/// Absent field: kept. `description: null`: removed. `event_types: null`:
/// every type is sent. `url` and `signature_format` cannot be cleared
/// (`null` keeps them). An empty body changes nothing and answers the endpoint.
///
/// Errors: 404 `not_found` (unknown, deleted or another tenant's endpoint);
/// 422 the SSRF guard's codes for `url` (as at creation), `invalid_description`
/// (over 1024 bytes or a control character), `invalid_event_types` (`[]`);
/// 400 `invalid_json` (malformed JSON, unknown fields or event types).
#[utoipa::path(
    patch,
    path = "/webhook-endpoints/{id}",
    tag = "webhook-endpoints",
    security(("api_key" = [])),
    params(("id" = EndpointId, Path, description = "The webhook endpoint.")),
    request_body(content = UpdateEndpoint, description = "Fields to change. Absent: kept; `null`: clears `description` (none) or `event_types` (every type)."),
    responses(
        (status = 200, description = "The updated endpoint.", body = Endpoint),
        (status = 400, response = crate::error::responses::BadRequest),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 413, response = crate::error::responses::PayloadTooLarge),
        (status = 415, response = crate::error::responses::UnsupportedMediaType),
        (status = 422, response = crate::error::responses::Unprocessable),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn update_endpoint(
    state: web::Data<AppState>,
    tenant: Tenant,
    path: web::Path<String>,
    body: crate::routes::common::Json<UpdateEndpoint>,
) -> ApiResult<HttpResponse> {
    let id: EndpointId = parse_id(&path)?;
    let current = load(&state, &tenant, &id).await?;
    let req = body.into_inner();
    // Validate everything first (the cheap checks before the URL's DNS lookup).
    if let Some(Some(d)) = &req.description {
        check_description(d)?;
    }
    let event_types = match &req.event_types {
        None => None,
        Some(None) => Some(None),
        Some(Some(ts)) => Some(Some(event_filter(ts)?)),
    };
    let url = match &req.url {
        Some(u) => Some(check_url(&state, u).await?),
        None => None,
    };
    let changes = EndpointChangeset {
        url,
        description: req.description,
        event_types,
        signature_format: req.signature_format.map(SignatureFormat::as_str),
        updated_at: Utc::now(),
    };
    if changes.changes_nothing() {
        return Ok(HttpResponse::Ok().json(current.into_endpoint()));
    }
    // Then write it all at once; the row may have been deleted since `load`.
    let mut conn = state.db.get().await?;
    let row = store::update(&mut conn, &tenant.id, &id, &changes).await?.ok_or(ApiError::NotFound("webhook endpoint"))?;
    Ok(HttpResponse::Ok().json(row.into_endpoint()))
}

/// `DELETE /webhook-endpoints/{id}` → `204`. Pending deliveries to it are not attempted.
#[utoipa::path(
    delete,
    path = "/webhook-endpoints/{id}",
    tag = "webhook-endpoints",
    security(("api_key" = [])),
    params(("id" = EndpointId, Path, description = "The webhook endpoint.")),
    responses(
        (status = 204, description = "Deleted; pending deliveries to it are not attempted."),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn delete_endpoint(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: EndpointId = parse_id(&path)?;
    load(&state, &tenant, &id).await?;
    let mut conn = state.db.get().await?;
    store::delete(&mut conn, &tenant.id, &id).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<UpdateEndpoint, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn update_tells_absent_from_null_and_refuses_unknown_fields() {
        let absent = parse("{}").unwrap();
        assert_eq!((absent.description, absent.event_types), (None, None));
        let null = parse(r#"{"description":null,"event_types":null}"#).unwrap();
        assert_eq!((null.description, null.event_types), (Some(None), Some(None)));
        let set = parse(r#"{"description":"d","event_types":["video.ready"]}"#).unwrap();
        assert_eq!((set.description, set.event_types), (Some(Some("d".into())), Some(Some(vec![EventType::VideoReady]))));
        let kept = parse(r#"{"url":null,"signature_format":null}"#).unwrap();
        assert_eq!((kept.url, kept.signature_format), (None, None));
        assert!(parse(r#"{"secret":"x"}"#).is_err());
        assert!(parse(r#"{"event_types":["video.nope"]}"#).is_err());
        assert!(parse(r#"{"description":5}"#).is_err());
    }

    #[test]
    fn descriptions_and_filters_are_checked() {
        assert!(check_description("ünïcode — fine").is_ok());
        assert!(check_description(&"x".repeat(MAX_DESCRIPTION_BYTES)).is_ok());
        for bad in ["a\0b".to_owned(), "a\nb".into(), "\u{9f}".into(), "x".repeat(MAX_DESCRIPTION_BYTES + 1)] {
            let err = check_description(&bad).unwrap_err();
            assert_eq!(err.problem().code, "invalid_description", "{bad:?}");
        }
        assert_eq!(event_filter(&[]).unwrap_err().problem().code, "invalid_event_types");
        let ts = [EventType::VideoFailed, EventType::VideoReady, EventType::VideoFailed];
        assert_eq!(event_filter(&ts).unwrap(), vec!["video.failed", "video.ready"]);
    }
}
