//! API keys: `Authorization: Bearer vidk_…`.
//!
//! A key is `vidk_` + 43 characters of base64url (32 random bytes). Only its
//! SHA-256 is stored; the first 12 characters are kept to help people tell keys
//! apart. Keys are high-entropy, so a fast hash is enough (no password KDF).

use std::future::Future;
use std::pin::Pin;

use actix_web::{web, FromRequest, HttpRequest};
use base64::Engine;
use diesel::prelude::*;
use ring::rand::SecureRandom;
use vid_core::{ApiKeyId, TenantId};
use vid_db::schema::{api_keys, tenants};
use vid_db::RunQueryDsl;

use crate::error::ApiError;
use crate::state::AppState;

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
    diesel::insert_into(tenants::table).values((tenants::id.eq(&tenant_id), tenants::name.eq(name))).execute(&mut conn).await?;
    let key = issue_key(&mut conn, &tenant_id).await?;
    Ok((tenant_id, key))
}

/// Issues a new API key for `tenant_id`; returns the key text (shown once).
pub async fn issue_key(conn: &mut vid_db::PooledConn, tenant_id: &TenantId) -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut bytes).map_err(|_| anyhow::anyhow!("system RNG failed"))?;
    let key = format!("vidk_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes));
    diesel::insert_into(api_keys::table)
        .values((
            api_keys::id.eq(ApiKeyId::generate()),
            api_keys::tenant_id.eq(tenant_id),
            api_keys::key_hash.eq(hash_key(&key)),
            api_keys::key_prefix.eq(&key[..12]),
        ))
        .execute(conn)
        .await?;
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
            let row: Option<(TenantId, Option<i32>)> = api_keys::table
                .inner_join(tenants::table)
                .filter(api_keys::key_hash.eq(hash_key(&token)))
                .filter(api_keys::revoked_at.is_null())
                .select((tenants::id, tenants::max_uploads_in_flight))
                .first(&mut conn)
                .await
                .optional()?;
            let (id, max_uploads_in_flight) = row.ok_or(ApiError::Unauthorized)?;
            Ok(Tenant { id, max_uploads_in_flight })
        })
    }
}
