//! `/webhook-endpoints`: where a tenant's events are delivered.
//!
//! URLs are customer input, so every URL passes the SSRF guard
//! (`vid-netguard`) here and again at every delivery in the dispatcher.

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use vid_core::endpoint::{CreateEndpoint, CreatedEndpoint, Endpoint, EndpointStatus, SignatureFormat};
use vid_core::event::EventType;
use vid_core::EndpointId;
use vid_db::schema::webhook_endpoints as ep;
use vid_db::RunQueryDsl;
use vid_webhooks::Secret;

use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::routes::parse_id;
use crate::state::AppState;

/// Routes of this module.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/webhook-endpoints").route(web::post().to(create_endpoint)).route(web::get().to(list_endpoints))).service(
        web::resource("/webhook-endpoints/{id:[^/:]+}")
            .route(web::get().to(get_endpoint))
            .route(web::patch().to(update_endpoint))
            .route(web::delete().to(delete_endpoint)),
    );
}

/// A row of `webhook_endpoints` without its sealed secrets.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = ep)]
pub struct EndpointRow {
    pub id: EndpointId,
    pub url: String,
    pub description: Option<String>,
    pub event_types: Option<Vec<String>>,
    pub signature_format: String,
    pub status: String,
    pub disabled_reason: Option<String>,
    pub disabled_at: Option<DateTime<Utc>>,
    pub throttled_until: Option<DateTime<Utc>>,
    pub concurrency_limit: Option<i32>,
    pub created_at: DateTime<Utc>,
}

impl EndpointRow {
    /// The public resource.
    pub fn into_endpoint(self) -> Endpoint {
        Endpoint {
            id: self.id,
            url: self.url,
            description: self.description,
            event_types: self.event_types.map(|ts| ts.iter().filter_map(|t| EventType::parse(t)).collect()),
            signature_format: SignatureFormat::parse(&self.signature_format).unwrap_or_default(),
            status: if self.status == "enabled" { EndpointStatus::Enabled } else { EndpointStatus::Disabled },
            disabled_reason: self.disabled_reason,
            disabled_at: self.disabled_at,
            // A past throttle is over: show it only while it holds.
            throttled_until: self.throttled_until.filter(|t| *t > Utc::now()),
            concurrency_limit: self.concurrency_limit,
            created_at: self.created_at,
        }
    }
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
/// characters unsafe to display ([`crate::routes::unsafe_to_display`]:
/// controls, so also no tab or line break; bidi overrides such as U+202E and
/// zero-width characters; line/paragraph separators). Refused: 422
/// `invalid_description`. Checked here
/// rather than left to PostgreSQL, which refuses U+0000 in `text` (a 500).
fn check_description(d: &str) -> ApiResult<()> {
    if d.len() > MAX_DESCRIPTION_BYTES {
        return Err(ApiError::unprocessable("invalid_description", format!("description is limited to {MAX_DESCRIPTION_BYTES} bytes")));
    }
    if let Some(c) = d.chars().find(|c| crate::routes::unsafe_to_display(*c)) {
        return Err(ApiError::unprocessable(
            "invalid_description",
            format!("description may not contain control, format or line/paragraph separator characters (found U+{:04X})", u32::from(c)),
        ));
    }
    Ok(())
}

/// An event filter as stored: at least one type (`[]` would match nothing,
/// silently: 422 `invalid_event_types`), each type once, in the order given.
fn event_filter(types: &[EventType]) -> ApiResult<Vec<String>> {
    if types.is_empty() {
        return Err(ApiError::unprocessable(
            "invalid_event_types",
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
        (status = 400, response = crate::openapi::BadRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 413, response = crate::openapi::PayloadTooLarge),
        (status = 415, response = crate::openapi::UnsupportedMediaType),
        (status = 422, response = crate::openapi::Unprocessable),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn create_endpoint(state: web::Data<AppState>, tenant: Tenant, body: web::Json<CreateEndpoint>) -> ApiResult<HttpResponse> {
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
    let row: EndpointRow = diesel::insert_into(ep::table)
        .values((
            ep::id.eq(&id),
            ep::tenant_id.eq(&tenant.id),
            ep::url.eq(&url),
            ep::description.eq(&req.description),
            ep::event_types.eq(&event_types),
            ep::signature_format.eq(format.as_str()),
            ep::status.eq("enabled"),
            ep::secret_sealed.eq(&sealed),
        ))
        .returning(EndpointRow::as_returning())
        .get_result(&mut conn)
        .await?;
    let created = CreatedEndpoint { endpoint: row.into_endpoint(), secret: secret.as_str().to_owned() };
    Ok(HttpResponse::Created().insert_header(("Location", format!("/webhook-endpoints/{id}"))).json(created))
}

async fn load(state: &AppState, tenant: &Tenant, id: &EndpointId) -> ApiResult<EndpointRow> {
    let mut conn = state.db.get().await?;
    ep::table
        .filter(ep::id.eq(id))
        .filter(ep::tenant_id.eq(&tenant.id))
        .filter(ep::deleted_at.is_null())
        .select(EndpointRow::as_select())
        .first(&mut conn)
        .await
        .optional()?
        .ok_or(ApiError::NotFound("webhook endpoint"))
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
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn get_endpoint(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: EndpointId = parse_id(&path)?;
    let endpoint = load(&state, &tenant, &id).await?.into_endpoint();
    let mut conn = state.db.get().await?;
    let health = health_of(&mut conn, &[id.to_string()]).await?.remove(id.as_str()).unwrap_or_default();
    Ok(HttpResponse::Ok().json(EndpointSummary { endpoint, health }))
}

/// How many of an endpoint's latest deliveries [`EndpointHealth`] looks at.
pub const HEALTH_WINDOW: i64 = 100;

pub use vid_core::endpoint::{EndpointHealth, EndpointSummary};

#[derive(QueryableByName)]
struct HealthRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    endpoint_id: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    recent: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    succeeded: i64,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Timestamptz>)]
    last_attempt_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Integer>)]
    last_attempt_status: Option<i32>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    last_attempt_error_class: Option<String>,
}

/// The [`EndpointHealth`] of each endpoint in `ids` (one query; endpoints
/// without deliveries get zero counts and `null`s).
pub async fn health_of(conn: &mut vid_db::PooledConn, ids: &[String]) -> ApiResult<std::collections::HashMap<String, EndpointHealth>> {
    let rows: Vec<HealthRow> = diesel::sql_query(
        "SELECT e.id AS endpoint_id, r.recent, r.succeeded, la.started_at AS last_attempt_at, \
                la.response_status AS last_attempt_status, la.error_class AS last_attempt_error_class \
         FROM unnest($1::text[]) AS e(id) \
         CROSS JOIN LATERAL ( \
             SELECT count(*) FILTER (WHERE d.attempt_count > 0) AS recent, \
                    count(*) FILTER (WHERE d.attempt_count > 0 AND d.status = 'succeeded') AS succeeded, \
                    (array_agg(d.id ORDER BY d.last_attempt_at DESC) FILTER (WHERE d.last_attempt_at IS NOT NULL))[1] AS last_delivery \
             FROM (SELECT id, status, attempt_count, last_attempt_at FROM webhook_deliveries \
                   WHERE endpoint_id = e.id ORDER BY id DESC LIMIT $2) d \
         ) r \
         LEFT JOIN LATERAL ( \
             SELECT a.started_at, a.response_status, a.error_class FROM webhook_attempts a \
             WHERE a.delivery_id = r.last_delivery ORDER BY a.attempt_number DESC LIMIT 1 \
         ) la ON true",
    )
    .bind::<diesel::sql_types::Array<diesel::sql_types::Text>, _>(ids)
    .bind::<diesel::sql_types::BigInt, _>(HEALTH_WINDOW)
    .load(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let health = EndpointHealth {
                recent_deliveries: r.recent,
                recent_succeeded: r.succeeded,
                success_rate: (r.recent > 0).then(|| r.succeeded as f64 / r.recent as f64),
                last_attempt_at: r.last_attempt_at,
                last_attempt_status: r.last_attempt_status,
                last_attempt_error_class: r.last_attempt_error_class,
            };
            (r.endpoint_id, health)
        })
        .collect())
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
        (status = 200, description = "Every endpoint of the tenant, newest first, with its delivery health.", body = crate::openapi::EndpointList),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn list_endpoints(state: web::Data<AppState>, tenant: Tenant) -> ApiResult<HttpResponse> {
    let mut conn = state.db.get().await?;
    let rows: Vec<EndpointRow> = ep::table
        .filter(ep::tenant_id.eq(&tenant.id))
        .filter(ep::deleted_at.is_null())
        .order(ep::id.desc())
        .select(EndpointRow::as_select())
        .load(&mut conn)
        .await?;
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

/// The columns one PATCH writes, in one `UPDATE`; `None` leaves a column as it
/// is, `Some(None)` sets it to `NULL`.
#[derive(AsChangeset)]
#[diesel(table_name = ep)]
struct EndpointChangeset {
    url: Option<String>,
    description: Option<Option<String>>,
    event_types: Option<Option<Vec<String>>>,
    signature_format: Option<&'static str>,
    updated_at: DateTime<Utc>,
}

impl EndpointChangeset {
    fn changes_nothing(&self) -> bool {
        self.url.is_none() && self.description.is_none() && self.event_types.is_none() && self.signature_format.is_none()
    }
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
        (status = 400, response = crate::openapi::BadRequest),
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 413, response = crate::openapi::PayloadTooLarge),
        (status = 415, response = crate::openapi::UnsupportedMediaType),
        (status = 422, response = crate::openapi::Unprocessable),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn update_endpoint(
    state: web::Data<AppState>,
    tenant: Tenant,
    path: web::Path<String>,
    body: web::Json<UpdateEndpoint>,
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
    let row: EndpointRow =
        diesel::update(ep::table.filter(ep::id.eq(&id)).filter(ep::tenant_id.eq(&tenant.id)).filter(ep::deleted_at.is_null()))
            .set(&changes)
            .returning(EndpointRow::as_returning())
            .get_result(&mut conn)
            .await
            .optional()?
            .ok_or(ApiError::NotFound("webhook endpoint"))?;
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
        (status = 401, response = crate::openapi::Unauthorized),
        (status = 404, response = crate::openapi::NotFound),
        (status = 503, response = crate::openapi::Unavailable),
    ),
)]
async fn delete_endpoint(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: EndpointId = parse_id(&path)?;
    load(&state, &tenant, &id).await?;
    let mut conn = state.db.get().await?;
    diesel::update(ep::table.filter(ep::id.eq(&id)).filter(ep::tenant_id.eq(&tenant.id)))
        .set((ep::deleted_at.eq(Utc::now()), ep::status.eq("disabled"), ep::disabled_reason.eq("deleted")))
        .execute(&mut conn)
        .await?;
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
