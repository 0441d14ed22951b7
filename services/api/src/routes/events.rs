//! `/events`: every event recorded for the tenant, so receivers can catch up.
//!
//! An event's stored payload is the exact JSON body its webhooks carry; both
//! routes return it byte for byte, never re-serialised.

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use vid_core::event::{Event, EventType};
use vid_core::EventId;

use crate::auth::Tenant;
use crate::error::{codes, ApiError, ApiResult};
use crate::routes::common::{page, parse_id};
use crate::state::AppState;
use crate::store;

/// Routes of this module.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/events").route(web::get().to(list_events)))
        .service(web::resource("/events/{id}").route(web::get().to(get_event)));
}

/// The query of `GET /events`. Any other parameter is refused (`400
/// invalid_query`, naming it) rather than silently ignored.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Page size, 1–100 (default 20).
    pub limit: Option<i64>,
    /// Return events older than this id (the `next_cursor` of the previous page).
    pub cursor: Option<String>,
    /// Only events of this type, e.g. `video.ready`.
    #[serde(rename = "type")]
    pub type_: Option<String>,
    /// Only events recorded strictly after this instant (RFC 3339 or Unix seconds).
    pub created_after: Option<String>,
    /// Only events recorded strictly before this instant (RFC 3339 or Unix seconds).
    pub created_before: Option<String>,
}

impl EventsQuery {
    /// The page size, clamped to 1–100.
    pub fn limit(&self) -> i64 {
        crate::routes::common::page_size(self.limit)
    }
}

/// Parses a time parameter: an RFC 3339 date-time with an offset
/// (`2026-01-02T03:04:05Z`, `2026-01-02T04:04:05.250+01:00`) or whole Unix
/// seconds (`1767323045`). A `+` left unencoded in the query string arrives as
/// a space; one in the offset position is read as the `+` it was.
/// Anything else is `400 invalid_query` naming the parameter.
pub fn parse_time(param: &str, raw: &str) -> ApiResult<DateTime<Utc>> {
    let invalid = || {
        let shown: String = raw.chars().take(64).collect();
        ApiError::new(
            codes::INVALID_QUERY,
            format!("`{param}` must be an RFC 3339 date-time such as `2026-01-02T03:04:05Z`, or whole Unix seconds; got `{shown}`"),
        )
    };
    if !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) {
        let secs: i64 = raw.parse().map_err(|_| invalid())?;
        return DateTime::from_timestamp(secs, 0).ok_or_else(invalid);
    }
    let fixed;
    let text = match raw.len().checked_sub(6) {
        // `…T03:04:05 01:00`: the offset's `+` was decoded as a space.
        Some(i) if raw.as_bytes()[i] == b' ' => {
            fixed = format!("{}+{}", &raw[..i], &raw[i + 1..]);
            fixed.as_str()
        }
        _ => raw,
    };
    DateTime::parse_from_rfc3339(text).map(|t| t.with_timezone(&Utc)).map_err(|_| invalid())
}

/// `GET /events/{id}`: the event exactly as it was sent.
///
/// The body is the stored payload byte for byte: the same bytes as the
/// webhook body of every delivery of this event.
#[utoipa::path(
    get,
    path = "/events/{id}",
    tag = "events",
    security(("api_key" = [])),
    params(("id" = EventId, Path, description = "The event.")),
    responses(
        (status = 200, description = "The event exactly as it was sent.", body = Event),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 404, response = crate::error::responses::NotFound),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn get_event(state: web::Data<AppState>, tenant: Tenant, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id: EventId = parse_id(&path)?;
    let mut conn = state.db.get().await?;
    let payload = store::events::payload(&mut conn, &tenant.id, &id).await?.ok_or(ApiError::NotFound("event"))?;
    Ok(HttpResponse::Ok().content_type("application/json").body(payload))
}

/// `GET /events`: the tenant's events, newest first, by type and time.
///
/// Query: `type`, `created_after`, `created_before`, `limit`, `cursor`.
/// Order is by id, which sorts by creation time.
///
/// `{"data": [event, …], "next_cursor": "evt_…" | null}`. Each element of
/// `data` is the stored event verbatim, byte for byte the body its webhooks
/// carried (and what `GET /events/{id}` returns), so a receiver can feed it
/// through the same handling (deduplicated by event id) as a delivery. There
/// is no signature here: the answer itself is authenticated by the API key
/// over HTTPS.
///
/// Filters combine (AND) and stay in force while paging: pass the same
/// filters again with `cursor` set to the previous page's `next_cursor`.
/// `created_after` and `created_before` are both exclusive bounds on the
/// instant the event was recorded (the database's clock, to the microsecond;
/// the event's `created` member is the same moment by the api's clock, in
/// whole Unix seconds). Each is an RFC 3339
/// date-time with an offset, e.g. `2026-01-02T03:04:05Z` or
/// `2026-01-02T04:04:05.5+01:00` (percent-encode `+` as `%2B`), or whole Unix
/// seconds, e.g. `1767323045`. An empty window is an empty page.
///
/// Catching up by polling: the recorded instant is when the recording
/// transaction started, and such a transaction may commit a moment after a
/// later-started one. A poller that checkpoints on `created_after` should
/// re-read an overlap window (a minute is ample) and rely on event ids to
/// drop what it has already handled.
///
/// Errors (RFC 9457 problem details, `400`): `invalid_query` for a malformed
/// time, limit, or any parameter not listed here (the detail names it);
/// `invalid_event_type` for an unknown `type`; `invalid_cursor` for a cursor
/// that is not an event id.
#[utoipa::path(
    get,
    path = "/events",
    tag = "events",
    security(("api_key" = [])),
    params(
        ("type" = Option<EventType>, Query, description = "Only events of this type."),
        (
            "created_after" = Option<String>, Query,
            pattern = r"^([0-9]+|[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+ -][0-9]{2}:[0-9]{2}))$",
            description = "Only events recorded strictly after this instant (exclusive): an RFC 3339 date-time with an offset, \
or whole Unix seconds.",
            example = "2026-01-02T03:04:05Z"
        ),
        (
            "created_before" = Option<String>, Query,
            pattern = r"^([0-9]+|[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+ -][0-9]{2}:[0-9]{2}))$",
            description = "Only events recorded strictly before this instant (exclusive): an RFC 3339 date-time with an offset, \
or whole Unix seconds.",
            example = "2026-01-03T00:00:00Z"
        ),
        ("limit" = Option<i64>, Query, description = "Page size; clamped to 1–100 (default 20)."),
        ("cursor" = Option<EventId>, Query, description = "The `next_cursor` of the previous page: events older than this one. \
Send the same filters again."),
    ),
    responses(
        (status = 200, description = "A page of events, newest first; each element of `data` is the stored event verbatim.", body = crate::routes::common::Page<Event>),
        (status = 400, response = crate::error::responses::BadRequest),
        (status = 401, response = crate::error::responses::Unauthorized),
        (status = 503, response = crate::error::responses::Unavailable),
    ),
)]
async fn list_events(state: web::Data<AppState>, tenant: Tenant, query: web::Query<EventsQuery>) -> ApiResult<HttpResponse> {
    let limit = query.limit();
    let mut filter = store::events::Filter::default();
    if let Some(t) = &query.type_ {
        filter.type_ =
            Some(EventType::parse(t).ok_or_else(|| ApiError::new(codes::INVALID_EVENT_TYPE, format!("unknown event type `{t}`")))?);
    }
    if let Some(raw) = &query.created_after {
        filter.created_after = Some(parse_time("created_after", raw)?);
    }
    if let Some(raw) = &query.created_before {
        filter.created_before = Some(parse_time("created_before", raw)?);
    }
    if let Some(cursor) = &query.cursor {
        filter.cursor = Some(cursor.parse().map_err(|_| ApiError::new(codes::INVALID_CURSOR, "cursor is not an event id"))?);
    }
    let mut conn = state.db.get().await?;
    let rows = store::events::list(&mut conn, &tenant.id, &filter, limit + 1).await?;
    let page = page(rows, limit, |r| r.0.to_string(), |r| r.1);
    // Built by hand so each payload goes out exactly as stored; each is
    // checked to be one JSON value so a damaged row cannot break the page.
    let mut body = String::with_capacity(page.data.iter().map(|p| p.len() + 1).sum::<usize>() + 64);
    body.push_str("{\"data\":[");
    for (i, payload) in page.data.iter().enumerate() {
        serde_json::from_str::<serde::de::IgnoredAny>(payload)
            .map_err(|e| ApiError::Internal(anyhow::anyhow!("stored event is not JSON: {e}")))?;
        if i > 0 {
            body.push(',');
        }
        body.push_str(payload);
    }
    body.push_str("],\"next_cursor\":");
    body.push_str(&serde_json::to_string(&page.next_cursor).expect("an optional string serialises"));
    body.push('}');
    Ok(HttpResponse::Ok().content_type("application/json").body(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_rfc3339_or_unix_seconds() {
        let t = |s: &str| parse_time("created_after", s).map(|t| t.timestamp_millis()).map_err(|e| e.to_string());
        assert_eq!(t("2026-01-02T03:04:05Z"), Ok(1_767_323_045_000));
        assert_eq!(t("2026-01-02T04:04:05.250+01:00"), Ok(1_767_323_045_250));
        assert_eq!(t("2026-01-02T04:04:05.250 01:00"), Ok(1_767_323_045_250));
        assert_eq!(t("1767323045"), Ok(1_767_323_045_000));
        assert_eq!(t("0"), Ok(0));
        for bad in [
            "",
            " ",
            "yesterday",
            "2026-01-02",
            "2026-01-02T03:04:05",
            "-1",
            "1.5",
            "1e9",
            "99999999999999999999",
            "2026-13-01T00:00:00Z",
            "ü 01:00",
        ] {
            let err = t(bad).unwrap_err();
            assert!(err.contains("`created_after`"), "{bad}: {err}");
        }
    }
}
