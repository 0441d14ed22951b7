//! `webhook_endpoints`: the configuration the api owns (URL, description,
//! filter, signature format, sealed secrets, deletion), and the delivery
//! health read from the dispatcher's log.
//!
//! Every query filters on the tenant; a deleted endpoint (`deleted_at` set)
//! is never found. The health columns are written by `vid_deliveries` only
//! (see [`crate::store::deliveries`] for `:enable`).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text, Timestamptz};
use vid_core::endpoint::{Endpoint, EndpointHealth, EndpointStatus, SignatureFormat};
use vid_core::event::EventType;
use vid_core::{EndpointId, TenantId};
use vid_db::schema::webhook_endpoints as ep;
use vid_db::{PooledConn, RunQueryDsl};

/// A row of `webhook_endpoints` without its sealed secrets.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = ep)]
pub struct EndpointRow {
    /// `ep_…`
    pub id: EndpointId,
    /// The checked URL.
    pub url: String,
    /// Free text.
    pub description: Option<String>,
    /// Event filter; `None`: every type.
    pub event_types: Option<Vec<String>>,
    /// `webhook-signature` or `standard-webhooks`.
    pub signature_format: String,
    /// Enabled or disabled (an unknown value fails the read).
    pub status: EndpointStatus,
    /// Why it was disabled.
    pub disabled_reason: Option<String>,
    /// When it was disabled.
    pub disabled_at: Option<DateTime<Utc>>,
    /// No attempt before this time (429/503 slow-down).
    pub throttled_until: Option<DateTime<Utc>>,
    /// Slowed-down concurrency; `None`: the configured one.
    pub concurrency_limit: Option<i32>,
    /// Creation time.
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
            status: self.status,
            disabled_reason: self.disabled_reason,
            disabled_at: self.disabled_at,
            // A past throttle is over: show it only while it holds.
            throttled_until: self.throttled_until.filter(|t| *t > Utc::now()),
            concurrency_limit: self.concurrency_limit,
            created_at: self.created_at,
        }
    }
}

/// A new endpoint, as `POST /webhook-endpoints` stores it (enabled).
#[derive(Debug)]
pub struct NewEndpoint<'a> {
    /// Its id (the secret is sealed with it as context).
    pub id: &'a EndpointId,
    /// Owner.
    pub tenant: &'a TenantId,
    /// The checked URL.
    pub url: &'a str,
    /// Free text.
    pub description: Option<&'a str>,
    /// Filter as stored.
    pub event_types: Option<&'a [String]>,
    /// Signature scheme.
    pub signature_format: SignatureFormat,
    /// The secret, sealed.
    pub secret_sealed: &'a [u8],
}

/// Inserts an enabled endpoint; returns its row.
pub async fn insert(conn: &mut PooledConn, e: &NewEndpoint<'_>) -> QueryResult<EndpointRow> {
    diesel::insert_into(ep::table)
        .values((
            ep::id.eq(e.id),
            ep::tenant_id.eq(e.tenant),
            ep::url.eq(e.url),
            ep::description.eq(e.description),
            ep::event_types.eq(e.event_types),
            ep::signature_format.eq(e.signature_format.as_str()),
            ep::status.eq(EndpointStatus::Enabled),
            ep::secret_sealed.eq(e.secret_sealed),
        ))
        .returning(EndpointRow::as_returning())
        .get_result(conn)
        .await
}

/// The tenant's endpoint, unless deleted.
pub async fn find(conn: &mut PooledConn, tenant: &TenantId, id: &EndpointId) -> QueryResult<Option<EndpointRow>> {
    ep::table
        .filter(ep::id.eq(id))
        .filter(ep::tenant_id.eq(tenant))
        .filter(ep::deleted_at.is_null())
        .select(EndpointRow::as_select())
        .first(conn)
        .await
        .optional()
}

/// Every endpoint of the tenant that is not deleted, newest first.
pub async fn list(conn: &mut PooledConn, tenant: &TenantId) -> QueryResult<Vec<EndpointRow>> {
    ep::table
        .filter(ep::tenant_id.eq(tenant))
        .filter(ep::deleted_at.is_null())
        .order(ep::id.desc())
        .select(EndpointRow::as_select())
        .load(conn)
        .await
}

/// The columns one PATCH writes, in one `UPDATE`; `None` leaves a column as it
/// is, `Some(None)` sets it to `NULL`.
#[derive(Debug, AsChangeset)]
#[diesel(table_name = ep)]
pub struct EndpointChangeset {
    /// New checked URL.
    pub url: Option<String>,
    /// New description, or `Some(None)` to remove it.
    pub description: Option<Option<String>>,
    /// New filter, or `Some(None)` for every type.
    pub event_types: Option<Option<Vec<String>>>,
    /// New signature format.
    pub signature_format: Option<&'static str>,
    /// Now.
    pub updated_at: DateTime<Utc>,
}

impl EndpointChangeset {
    /// True when no column but `updated_at` would change.
    pub fn changes_nothing(&self) -> bool {
        self.url.is_none() && self.description.is_none() && self.event_types.is_none() && self.signature_format.is_none()
    }
}

/// Applies a PATCH in one statement; `None` if the endpoint is gone (deleted meanwhile).
pub async fn update(
    conn: &mut PooledConn,
    tenant: &TenantId,
    id: &EndpointId,
    changes: &EndpointChangeset,
) -> QueryResult<Option<EndpointRow>> {
    diesel::update(ep::table.filter(ep::id.eq(id)).filter(ep::tenant_id.eq(tenant)).filter(ep::deleted_at.is_null()))
        .set(changes)
        .returning(EndpointRow::as_returning())
        .get_result(conn)
        .await
        .optional()
}

/// Soft delete: `deleted_at`, and `status = disabled` with reason `deleted`
/// (the dispatcher settles its claimed deliveries as `failed`).
pub async fn delete(conn: &mut PooledConn, tenant: &TenantId, id: &EndpointId) -> QueryResult<usize> {
    diesel::update(ep::table.filter(ep::id.eq(id)).filter(ep::tenant_id.eq(tenant)))
        .set((ep::deleted_at.eq(Utc::now()), ep::status.eq(EndpointStatus::Disabled), ep::disabled_reason.eq("deleted")))
        .execute(conn)
        .await
}

/// `:rotate-secret`: the current sealed secret becomes the previous one
/// (valid until `previous_expires`) and `sealed` the current one, in one
/// statement. Returns 0 if the endpoint is gone.
pub async fn rotate_secret(
    conn: &mut PooledConn,
    tenant: &TenantId,
    id: &EndpointId,
    sealed: &[u8],
    previous_expires: DateTime<Utc>,
) -> QueryResult<usize> {
    // Both columns in one statement: the old value moves as it was (sealed under the same id).
    diesel::update(ep::table.filter(ep::id.eq(id)).filter(ep::tenant_id.eq(tenant)).filter(ep::deleted_at.is_null()))
        .set((
            ep::previous_secret_sealed.eq(ep::secret_sealed.nullable()),
            ep::previous_secret_expires_at.eq(previous_expires),
            ep::secret_sealed.eq(sealed),
            ep::updated_at.eq(Utc::now()),
        ))
        .execute(conn)
        .await
}

/// How many of an endpoint's latest deliveries [`EndpointHealth`] looks at.
pub const HEALTH_WINDOW: i64 = 100;

#[derive(QueryableByName)]
struct HealthRow {
    #[diesel(sql_type = Text)]
    endpoint_id: String,
    #[diesel(sql_type = BigInt)]
    recent: i64,
    #[diesel(sql_type = BigInt)]
    succeeded: i64,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    last_attempt_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Integer>)]
    last_attempt_status: Option<i32>,
    #[diesel(sql_type = Nullable<Text>)]
    last_attempt_error_class: Option<String>,
}

/// The [`EndpointHealth`] of each endpoint in `ids`, keyed by id (one query
/// over the latest [`HEALTH_WINDOW`] deliveries of each; endpoints without
/// deliveries get zero counts and `null`s).
pub async fn health_of(conn: &mut PooledConn, ids: &[String]) -> QueryResult<HashMap<String, EndpointHealth>> {
    let rows: Vec<HealthRow> = diesel::sql_query(
        "SELECT e.id AS endpoint_id, r.recent, r.succeeded, la.started_at AS last_attempt_at, \
                la.response_status AS last_attempt_status, la.error_class AS last_attempt_error_class \
         FROM unnest($1::text[]) AS e(id) \
         CROSS JOIN LATERAL ( \
             SELECT count(*) FILTER (WHERE d.attempt_count > 0) AS recent, \
                    count(*) FILTER (WHERE d.attempt_count > 0 AND d.status = $3) AS succeeded, \
                    (array_agg(d.id ORDER BY d.last_attempt_at DESC) FILTER (WHERE d.last_attempt_at IS NOT NULL))[1] AS last_delivery \
             FROM (SELECT id, status, attempt_count, last_attempt_at FROM webhook_deliveries \
                   WHERE endpoint_id = e.id ORDER BY id DESC LIMIT $2) d \
         ) r \
         LEFT JOIN LATERAL ( \
             SELECT a.started_at, a.response_status, a.error_class FROM webhook_attempts a \
             WHERE a.delivery_id = r.last_delivery ORDER BY a.attempt_number DESC LIMIT 1 \
         ) la ON true",
    )
    .bind::<Array<Text>, _>(ids)
    .bind::<BigInt, _>(HEALTH_WINDOW)
    .bind::<Text, _>(vid_deliveries::DeliveryStatus::Succeeded)
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
