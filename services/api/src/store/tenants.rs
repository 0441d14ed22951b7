//! `tenants` and `api_keys`. Writers: the api's `create-tenant` command and
//! tests (tenants, keys); nothing else writes them at run time.

use diesel::prelude::*;
use vid_core::{ApiKeyId, TenantId};
use vid_db::schema::{api_keys, tenants};
use vid_db::RunQueryDsl;

use super::Conn;

/// Inserts a tenant.
pub async fn insert(conn: &mut Conn, id: &TenantId, name: &str) -> QueryResult<()> {
    diesel::insert_into(tenants::table).values((tenants::id.eq(id), tenants::name.eq(name))).execute(conn).await.map(|_| ())
}

/// Inserts an API key by its SHA-256 (hex) and its first 12 characters.
pub async fn insert_key(conn: &mut Conn, tenant: &TenantId, key_hash: &str, key_prefix: &str) -> QueryResult<()> {
    diesel::insert_into(api_keys::table)
        .values((
            api_keys::id.eq(ApiKeyId::generate()),
            api_keys::tenant_id.eq(tenant),
            api_keys::key_hash.eq(key_hash),
            api_keys::key_prefix.eq(key_prefix),
        ))
        .execute(conn)
        .await
        .map(|_| ())
}

/// The tenant of an unrevoked key, by the key's hash, with its cap on uploads in flight.
pub async fn by_key_hash(conn: &mut Conn, key_hash: &str) -> QueryResult<Option<(TenantId, Option<i32>)>> {
    api_keys::table
        .inner_join(tenants::table)
        .filter(api_keys::key_hash.eq(key_hash))
        .filter(api_keys::revoked_at.is_null())
        .select((tenants::id, tenants::max_uploads_in_flight))
        .first(conn)
        .await
        .optional()
}
