//! `Idempotency-Key` for unsafe requests (the IETF httpapi
//! "The Idempotency-Key HTTP Header Field" draft, as popularised by Stripe).
//!
//! The first request with a key runs and its answer (status, body, `Location`)
//! is stored per tenant, route and key. A retry with the same key and the same
//! body replays that answer (with `Idempotent-Replayed: true`); the same key
//! with another body is `422 idempotency_key_reused`; a retry while the first
//! is still running is `409 idempotency_key_in_use`. Answers with a 5xx status
//! are not stored, so the client can retry. Keys are kept 24 h.

use std::future::Future;

use actix_web::body::MessageBody;
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use chrono::Utc;
use diesel::prelude::*;
use vid_db::schema::idempotency_keys as ik;
use vid_db::RunQueryDsl;

use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// How long a key is remembered.
pub const KEY_TTL_HOURS: i64 = 24;

/// Runs `handler` at most once per (tenant, `route`, `Idempotency-Key`).
/// `request` is the parsed body; its canonical JSON is what "the same body" means.
pub async fn once<F, Fut>(
    state: &AppState,
    tenant: &Tenant,
    req: &HttpRequest,
    route: &str,
    request: &impl serde::Serialize,
    handler: F,
) -> ApiResult<HttpResponse>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ApiResult<HttpResponse>>,
{
    let Some(key) = req.headers().get("idempotency-key") else { return handler().await };
    let key = key
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= 255)
        .ok_or_else(|| ApiError::bad_request("invalid_idempotency_key", "Idempotency-Key must be 1–255 visible ASCII characters"))?;
    let hash = hex::encode(ring::digest::digest(&ring::digest::SHA256, &serde_json::to_vec(request).unwrap_or_default()));
    let mut conn = state.db.get().await?;
    let cutoff = Utc::now() - chrono::Duration::hours(KEY_TTL_HOURS);
    diesel::delete(
        ik::table
            .filter(ik::tenant_id.eq(&tenant.id))
            .filter(ik::route.eq(route))
            .filter(ik::idempotency_key.eq(key))
            .filter(ik::created_at.lt(cutoff)),
    )
    .execute(&mut conn)
    .await?;
    let inserted = diesel::insert_into(ik::table)
        .values((ik::tenant_id.eq(&tenant.id), ik::route.eq(route), ik::idempotency_key.eq(key), ik::request_hash.eq(&hash)))
        .on_conflict_do_nothing()
        .execute(&mut conn)
        .await?;
    let target = ik::table.filter(ik::tenant_id.eq(&tenant.id)).filter(ik::route.eq(route)).filter(ik::idempotency_key.eq(key));
    if inserted == 0 {
        let (stored_hash, status, body, location): (String, Option<i32>, Option<String>, Option<String>) =
            target.select((ik::request_hash, ik::response_status, ik::response_body, ik::response_location)).first(&mut conn).await?;
        if stored_hash != hash {
            return Err(ApiError::unprocessable("idempotency_key_reused", "this Idempotency-Key was used with a different request body"));
        }
        let Some(status) = status else {
            return Err(ApiError::conflict("idempotency_key_in_use", "a request with this Idempotency-Key is still running"));
        };
        let mut resp = HttpResponse::build(StatusCode::from_u16(status as u16).unwrap_or(StatusCode::OK));
        resp.insert_header(("Idempotent-Replayed", "true"));
        if let Some(loc) = location {
            resp.insert_header(("Location", loc));
        }
        let ct = if status >= 400 { vid_core::problem::PROBLEM_JSON } else { "application/json" };
        return Ok(resp.content_type(ct).body(body.unwrap_or_default()));
    }
    drop(conn);

    let outcome = handler().await;
    let resp = match outcome {
        Ok(resp) => resp,
        Err(e) => actix_web::ResponseError::error_response(&e),
    };
    let status = resp.status();
    let mut conn = state.db.get().await?;
    if status.is_server_error() {
        diesel::delete(target).execute(&mut conn).await?;
        return Ok(resp);
    }
    let location = resp.headers().get("location").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let (head, body) = resp.into_parts();
    let bytes = body.try_into_bytes().unwrap_or_default();
    diesel::update(target)
        .set((
            ik::response_status.eq(status.as_u16() as i32),
            ik::response_body.eq(String::from_utf8_lossy(&bytes).into_owned()),
            ik::response_location.eq(location),
        ))
        .execute(&mut conn)
        .await?;
    Ok(head.set_body(actix_web::body::BoxBody::new(bytes)))
}
