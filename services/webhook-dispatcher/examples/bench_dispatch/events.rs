//! The bench's events: made up ([`bench_event`], one `video.ready` each)
//! and recorded as the api would ([`record_events`]). A leaf, used by the
//! run and by the ceilings.

use chrono::Utc;
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use vid_core::event::{Event, EventData, EventType, VideoEventData};
use vid_core::messages::EventPublished;
use vid_core::{EventId, OperationId, TenantId, VideoId};

/// Inserts the events' rows as the api does (the fan-in reads the event from `events`).
pub(crate) async fn record_events(conn: &mut AsyncPgConnection, messages: &[EventPublished]) {
    use vid_db::schema::events;
    for chunk in messages.chunks(1000) {
        let rows: Vec<_> = chunk
            .iter()
            .map(|m| {
                (
                    events::id.eq(m.event.id.clone()),
                    events::tenant_id.eq(m.tenant_id.clone()),
                    events::event_type.eq(m.event.type_.as_str()),
                    events::resource_id.eq("vid_bench"),
                    events::payload.eq(m.payload.clone()),
                )
            })
            .collect();
        diesel::insert_into(events::table).values(rows).execute(conn).await.unwrap();
    }
}

pub(crate) fn bench_event(tenant: &TenantId) -> EventPublished {
    let event = Event {
        id: EventId::generate(),
        type_: EventType::VideoReady,
        created: Utc::now().timestamp(),
        data: EventData::Video(VideoEventData { video_id: VideoId::generate(), operation_id: OperationId::generate(), version: 2 }),
    };
    let payload = serde_json::to_string(&event).unwrap();
    EventPublished { tenant_id: tenant.clone(), event, payload }
}
