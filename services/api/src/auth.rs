//! API keys: `Authorization: Bearer vidk_…`.
//!
//! A key is `vidk_` + 43 characters of base64url (32 random bytes). Only its
//! SHA-256 is stored; the first 12 characters are kept to help people tell keys
//! apart. Keys are high-entropy, so a fast hash is enough (no password KDF).

use std::future::Future;
use std::pin::Pin;

use actix_web::{web, FromRequest, HttpRequest};
use base64::Engine;
use ring::rand::SecureRandom;
use vid_core::TenantId;

use crate::error::ApiError;
use crate::state::AppState;
use crate::store;

/// The authenticated caller. Every handler that takes it is tenant-scoped.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// Whose resources this request may see.
    pub id: TenantId,
    /// Optional cap on uploads in `created` state.
    pub max_uploads_in_flight: Option<i32>,
}

/// The SHA-256 of a key, hex-encoded, as stored in `api_keys.key_hash`.
pub fn hash_key(key: &str) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, key.as_bytes()))
}

/// Creates a tenant and its first API key; returns the tenant id and the key (shown once).
pub async fn create_tenant(db: &vid_db::Pool, name: &str) -> anyhow::Result<(TenantId, String)> {
    let mut conn = db.get().await?;
    let tenant_id = TenantId::generate();
    store::tenants::insert(&mut conn, &tenant_id, name).await?;
    let key = issue_key(&mut conn, &tenant_id).await?;
    Ok((tenant_id, key))
}

/// Issues a new API key for `tenant_id`; returns the key text (shown once).
pub async fn issue_key(conn: &mut vid_db::PooledConn, tenant_id: &TenantId) -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut bytes).map_err(|_| anyhow::anyhow!("system RNG failed"))?;
    let key = format!("vidk_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes));
    store::tenants::insert_key(conn, tenant_id, &hash_key(&key), &key[..12]).await?;
    Ok(key)
}

impl FromRequest for Tenant {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let state = req.app_data::<web::Data<AppState>>().cloned();
        let token = req
            .headers()
            .get(actix_web::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(|t| t.trim().to_owned());
        Box::pin(async move {
            let state = state.ok_or_else(|| ApiError::Internal(anyhow::anyhow!("AppState missing")))?;
            let token = token.filter(|t| t.starts_with("vidk_")).ok_or(ApiError::Unauthorized)?;
            let mut conn = state.db.get().await?;
            let row = store::tenants::by_key_hash(&mut conn, &hash_key(&token)).await?;
            let (id, max_uploads_in_flight) = row.ok_or(ApiError::Unauthorized)?;
            Ok(Tenant { id, max_uploads_in_flight })
        })
    }
}

// ------------------------------------------------------------ client tokens --
//
// Issue 21: a browser uploads without the API key. `POST /uploads` (API key)
// hands out a client token `vidu_` + 43 characters of base64url (32 random
// bytes), stored only as its SHA-256 in `upload_client_tokens`. The token is a
// second principal, good for exactly one upload and the operation it becomes:
//
// - `GET|DELETE /uploads/{id}`, `POST /uploads/{id}/parts:sign`,
//   `POST /uploads/{id}/complete` take an [`UploadCaller`];
// - `GET /operations/{id}`, `POST /operations/{id}:wait`,
//   `GET /operations/{id}/events` take an [`OperationCaller`].
//
// Both extractors check the token against the path's id themselves, so no
// handler can forget the scope: another upload's or operation's id answers
// `404` with the body of an unknown id. Every other route takes [`Tenant`],
// which accepts only API keys (`vidk_…`): a client token there is `401`.
//
// Lifetime: until the upload's `expires_at`; once the upload is completed,
// for as long as its operation is not terminal, then
// `uploads.client_token_grace_seconds` (10 min by default) after the
// operation's last change. Past that: `401`, as for an unknown token.

/// The prefix of client tokens; the JavaScript library refuses `vidk_` keys.
pub const CLIENT_TOKEN_PREFIX: &str = "vidu_";

/// Issues a client token for `upload` (one row of `upload_client_tokens`);
/// returns the token text, which is never stored.
pub async fn issue_client_token(conn: &mut vid_db::PooledConn, upload: &vid_core::UploadId) -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut bytes).map_err(|_| anyhow::anyhow!("system RNG failed"))?;
    let token = format!("{CLIENT_TOKEN_PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes));
    store::uploads::insert_client_token(conn, upload, &hash_key(&token)).await?;
    Ok(token)
}

/// How a caller of a token route proved itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The tenant's API key: the route works as for any tenant route.
    ApiKey,
    /// A client token bound to this upload (and its operation).
    ClientToken(vid_core::UploadId),
}

/// The caller of an upload route (`GET|DELETE /uploads/{id}`, `parts:sign`,
/// `complete`): the tenant's API key, or the client token of the upload the
/// path names. Errors: `401` (no key or token, an unknown, revoked or expired
/// one); `404` (a token of another upload, same body as an unknown id).
#[derive(Debug, Clone)]
pub struct UploadCaller {
    /// Whose resources the request may see.
    pub tenant: Tenant,
    /// How the caller proved itself.
    pub principal: Principal,
}

/// The caller of an operation route that follows an operation (`GET
/// /operations/{id}`, `:wait`, `/events`): the tenant's API key, or the client
/// token of the upload that became this operation. Errors as [`UploadCaller`].
#[derive(Debug, Clone)]
pub struct OperationCaller {
    /// Whose resources the request may see.
    pub tenant: Tenant,
    /// How the caller proved itself.
    pub principal: Principal,
}

/// What a token route's path names.
#[derive(Debug, Clone, Copy)]
enum Scope {
    Upload,
    Operation,
}

/// The bearer credential of a request, trimmed.
fn bearer(req: &HttpRequest) -> Option<String> {
    req.headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(|t| t.trim().to_owned())
}

/// Resolves a token route's caller (see [`UploadCaller`]).
async fn scoped_caller(
    state: Option<web::Data<AppState>>,
    token: Option<String>,
    path_id: Option<String>,
    origin: Option<String>,
    scope: Scope,
    extensions: HttpRequest,
) -> Result<(Tenant, Principal), ApiError> {
    use actix_web::HttpMessage;
    use chrono::Utc;
    use vid_core::upload::UploadStatus;
    let state = state.ok_or_else(|| ApiError::Internal(anyhow::anyhow!("AppState missing")))?;
    let token = token.ok_or(ApiError::Unauthorized)?;
    if token.starts_with("vidk_") {
        let mut conn = state.db.get().await?;
        let (id, max_uploads_in_flight) = store::tenants::by_key_hash(&mut conn, &hash_key(&token)).await?.ok_or(ApiError::Unauthorized)?;
        return Ok((Tenant { id, max_uploads_in_flight }, Principal::ApiKey));
    }
    if !token.starts_with(CLIENT_TOKEN_PREFIX) {
        return Err(ApiError::Unauthorized);
    }
    let mut conn = state.db.get().await?;
    let (row, operation) = store::uploads::by_client_token(&mut conn, &hash_key(&token)).await?.ok_or(ApiError::Unauthorized)?;
    drop(conn);
    let now = Utc::now();
    let grace = chrono::Duration::seconds(state.settings.uploads.client_token_grace_seconds as i64);
    let alive = match (row.status, operation) {
        (UploadStatus::Completed, Some((status, changed_at))) => !status.is_terminal() || now < changed_at + grace,
        (UploadStatus::Completed, None) => false,
        _ => now < row.expires_at,
    };
    if !alive {
        return Err(ApiError::Unauthorized);
    }
    // The path's id must be the token's own; anything else answers as the
    // handler would for an id the tenant does not have.
    let path_id = path_id.unwrap_or_default();
    let in_scope = match scope {
        // Parsed ids compare, not strings: the handlers accept any case after the prefix.
        Scope::Upload => {
            let id = path_id.parse::<vid_core::UploadId>().map_err(|_| ApiError::NotFound("resource"))?;
            id == row.id
        }
        Scope::Operation => {
            let id = path_id.parse::<vid_core::OperationId>().map_err(|_| ApiError::NotFound("resource"))?;
            row.operation_id.as_ref() == Some(&id)
        }
    };
    if !in_scope {
        return Err(ApiError::NotFound(match scope {
            Scope::Upload => "upload",
            Scope::Operation => "operation",
        }));
    }
    if let (Some(origin), Some(allowed)) = (origin, &row.cors_origin) {
        if &origin == allowed {
            extensions.extensions_mut().insert(crate::cors::AllowedOrigin(origin));
        }
    }
    let principal = Principal::ClientToken(row.id.clone());
    Ok((Tenant { id: row.tenant_id, max_uploads_in_flight: None }, principal))
}

/// What a scoped extractor resolves to: the tenant and who called.
type ScopedFuture = Pin<Box<dyn Future<Output = Result<(Tenant, Principal), ApiError>>>>;

/// The arguments of [`scoped_caller`] read from the request (before the future runs).
fn scoped_future(req: &HttpRequest, scope: Scope) -> ScopedFuture {
    let state = req.app_data::<web::Data<AppState>>().cloned();
    let origin = req.headers().get(actix_web::http::header::ORIGIN).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let path_id = req.match_info().get("id").map(str::to_owned);
    Box::pin(scoped_caller(state, bearer(req), path_id, origin, scope, req.clone()))
}

impl FromRequest for UploadCaller {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let fut = scoped_future(req, Scope::Upload);
        Box::pin(async move { fut.await.map(|(tenant, principal)| UploadCaller { tenant, principal }) })
    }
}

impl FromRequest for OperationCaller {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let fut = scoped_future(req, Scope::Operation);
        Box::pin(async move { fut.await.map(|(tenant, principal)| OperationCaller { tenant, principal }) })
    }
}
