//! `signing_keys`: the row type and every query on it (issue 20).
//!
//! Writer: the api only (`POST` and `DELETE /signing-keys`). Reader besides
//! the api: the playback service, which reads one key's public half per
//! request of a signed playback ID (joined to `playback_ids` by tenant) and
//! never writes. Only public keys are stored; the private half is answered
//! once by the route and never reaches this module. Every query is filtered
//! by tenant, so another tenant's keys read as absent.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use vid_core::signing::SigningKey;
use vid_core::{SigningKeyId, TenantId};
use vid_db::schema::signing_keys;
use vid_db::RunQueryDsl;

use super::Conn;

/// A row of `signing_keys` as listed (without the public key).
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = signing_keys)]
pub struct SigningKeyRow {
    /// `sk_…`
    pub id: SigningKeyId,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

impl SigningKeyRow {
    /// The public view.
    pub fn into_view(self) -> SigningKey {
        SigningKey { id: self.id, created_at: self.created_at }
    }
}

/// Inserts `tenant`'s key `id` with its public half (`public_key_pem`:
/// PEM SubjectPublicKeyInfo); returns the row. Durable once this returns
/// outside a transaction.
pub async fn insert(conn: &mut Conn, tenant: &TenantId, id: &SigningKeyId, public_key_pem: &str) -> QueryResult<SigningKeyRow> {
    diesel::insert_into(signing_keys::table)
        .values((signing_keys::id.eq(id), signing_keys::tenant_id.eq(tenant), signing_keys::public_key.eq(public_key_pem)))
        .returning(SigningKeyRow::as_returning())
        .get_result(conn)
        .await
}

/// Up to `limit` of `tenant`'s keys older than `cursor`, newest first.
pub async fn list(conn: &mut Conn, tenant: &TenantId, cursor: Option<&SigningKeyId>, limit: i64) -> QueryResult<Vec<SigningKeyRow>> {
    let mut q = signing_keys::table.filter(signing_keys::tenant_id.eq(tenant)).into_boxed();
    if let Some(cursor) = cursor {
        q = q.filter(signing_keys::id.lt(cursor));
    }
    q.order(signing_keys::id.desc()).limit(limit).select(SigningKeyRow::as_select()).load(conn).await
}

/// `tenant`'s key `id`, if it exists.
pub async fn find(conn: &mut Conn, tenant: &TenantId, id: &SigningKeyId) -> QueryResult<Option<SigningKeyRow>> {
    signing_keys::table
        .filter(signing_keys::id.eq(id))
        .filter(signing_keys::tenant_id.eq(tenant))
        .select(SigningKeyRow::as_select())
        .first(conn)
        .await
        .optional()
}

/// Deletes `tenant`'s key `id`; whether it existed (`false` too for another
/// tenant's). Tokens signed with it fail from the playback service's next
/// request on.
pub async fn delete(conn: &mut Conn, tenant: &TenantId, id: &SigningKeyId) -> QueryResult<bool> {
    let n = diesel::delete(signing_keys::table.filter(signing_keys::id.eq(id)).filter(signing_keys::tenant_id.eq(tenant)))
        .execute(conn)
        .await?;
    Ok(n == 1)
}
