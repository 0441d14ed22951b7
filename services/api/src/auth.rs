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
