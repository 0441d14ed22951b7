//! Events announced to webhook endpoints.
//!
//! Events are thin: they carry ids and the video `version`, never the video
//! itself, so no sensitive data travels in a webhook and receivers re-fetch
//! the truth (`GET /videos/{id}`) when they need it. Delivery is at least once
//! and unordered; receivers dedupe by `id` and drop events whose `version` is
//! not newer than what they hold.

use serde::{Deserialize, Serialize};

use crate::{EndpointId, EventId, OperationId, VideoId};

/// The kinds of event we send. The wire name is the dotted form, e.g. `video.ready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum EventType {
    /// A worker started the transcode.
    #[serde(rename = "video.processing")]
    VideoProcessing,
    /// Renditions are available.
    #[serde(rename = "video.ready")]
    VideoReady,
    /// The transcode failed.
    #[serde(rename = "video.failed")]
    VideoFailed,
    /// The transcode was cancelled.
    #[serde(rename = "video.cancelled")]
    VideoCancelled,
    /// One of the tenant's endpoints was disabled after repeated failures.
    #[serde(rename = "webhook_endpoint.disabled")]
    WebhookEndpointDisabled,
}

impl EventType {
    /// Every event type, for validating endpoint filters.
    pub const ALL: [EventType; 5] =
        [Self::VideoProcessing, Self::VideoReady, Self::VideoFailed, Self::VideoCancelled, Self::WebhookEndpointDisabled];

    /// The wire name, e.g. `video.ready`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::VideoProcessing => "video.processing",
            Self::VideoReady => "video.ready",
            Self::VideoFailed => "video.failed",
            Self::VideoCancelled => "video.cancelled",
            Self::WebhookEndpointDisabled => "webhook_endpoint.disabled",
        }
    }

    /// Parses the wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// `data` of a `video.*` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VideoEventData {
    /// The video that changed.
    pub video_id: VideoId,
    /// The operation that changed it.
    pub operation_id: OperationId,
    /// The video's `version` after the change.
    pub version: i64,
}

/// `data` of a `webhook_endpoint.disabled` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EndpointEventData {
    /// The endpoint that was disabled.
    pub endpoint_id: EndpointId,
    /// Why, in words.
    pub reason: String,
}

/// The `data` member; its shape depends on the event type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum EventData {
    /// For `video.*`.
    Video(VideoEventData),
    /// For `webhook_endpoint.*`.
    Endpoint(EndpointEventData),
}

/// An event as sent in a webhook body and served by `GET /events/{id}`:
/// `{"id":"evt_…","type":"video.ready","created":1792055521,"data":{…}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Event {
    /// `evt_…`; also the `Webhook-Id` header. Stable across retries.
    pub id: EventId,
    /// See [`EventType`].
    #[serde(rename = "type")]
    pub type_: EventType,
    /// When the change happened, in Unix seconds.
    pub created: i64,
    /// Ids of what changed.
    pub data: EventData,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_has_the_documented_wire_shape() {
        let e = Event {
            id: EventId::generate(),
            type_: EventType::VideoReady,
            created: 1_792_055_521,
            data: EventData::Video(VideoEventData { video_id: VideoId::generate(), operation_id: OperationId::generate(), version: 2 }),
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], "video.ready");
        assert_eq!(v["created"], 1_792_055_521);
        assert_eq!(v["data"]["version"], 2);
        assert!(v["data"]["video_id"].as_str().unwrap().starts_with("vid_"));
        assert_eq!(serde_json::from_value::<Event>(v).unwrap(), e);
    }

    #[test]
    fn endpoint_event_round_trips_and_types_parse() {
        let e = Event {
            id: EventId::generate(),
            type_: EventType::WebhookEndpointDisabled,
            created: 1,
            data: EventData::Endpoint(EndpointEventData { endpoint_id: EndpointId::generate(), reason: "410 Gone".into() }),
        };
        let back: Event = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
        assert_eq!(back, e);
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(t));
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
        }
        assert_eq!(EventType::parse("video.deleted"), None);
    }
}
