//! `events`: the tenant's event log. Writer: the api, only through
//! [`super::outbox::Staged::record_event`], in the transaction of the change
//! the event announces. The stored payload is the exact webhook body.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use vid_core::event::EventType;
use vid_core::{EventId, TenantId};
use vid_db::schema::events;
use vid_db::RunQueryDsl;

use super::Conn;

/// Inserts one event row (`payload` is the serialised event).
pub async fn insert(
    conn: &mut Conn,
    id: &EventId,
    tenant: &TenantId,
    type_: EventType,
    resource_id: &str,
    payload: &str,
) -> QueryResult<()> {
    diesel::insert_into(events::table)
        .values((
            events::id.eq(id),
            events::tenant_id.eq(tenant),
            events::event_type.eq(type_.as_str()),
            events::resource_id.eq(resource_id),
            events::payload.eq(payload),
        ))
        .execute(conn)
        .await
        .map(|_| ())
}

/// A tenant's event payload, byte for byte; `None` for anyone else's.
pub async fn payload(conn: &mut Conn, tenant: &TenantId, id: &EventId) -> QueryResult<Option<String>> {
    events::table.filter(events::id.eq(id)).filter(events::tenant_id.eq(tenant)).select(events::payload).first(conn).await.optional()
}

/// The filters of `GET /events`; all exclusive bounds.
#[derive(Debug, Default)]
pub struct Filter {
    /// Only this type.
    pub type_: Option<EventType>,
    /// Recorded strictly after.
    pub created_after: Option<DateTime<Utc>>,
    /// Recorded strictly before.
    pub created_before: Option<DateTime<Utc>>,
    /// Ids strictly below (older than) this one.
    pub cursor: Option<EventId>,
}

/// Up to `limit` (id, payload) of a tenant's events matching `filter`, newest first.
pub async fn list(conn: &mut Conn, tenant: &TenantId, filter: &Filter, limit: i64) -> QueryResult<Vec<(EventId, String)>> {
    let mut q = events::table.filter(events::tenant_id.eq(tenant)).into_boxed();
    if let Some(t) = filter.type_ {
        q = q.filter(events::event_type.eq(t.as_str()));
    }
    if let Some(t) = filter.created_after {
        q = q.filter(events::created_at.gt(t));
    }
    if let Some(t) = filter.created_before {
        q = q.filter(events::created_at.lt(t));
    }
    if let Some(cursor) = &filter.cursor {
        q = q.filter(events::id.lt(cursor));
    }
    q.order(events::id.desc()).limit(limit).select((events::id, events::payload)).load(conn).await
}
