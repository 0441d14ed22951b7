//! What the receiver understands of an event, and the effect each one has.
//!
//! Parsing is deliberately lenient: unknown event types and extra fields are
//! accepted (recorded as seen, no effect), so a platform that adds event types
//! never breaks the receiver.

use serde::Deserialize;

/// The part of an event body every event has: `{"id":"evt_…","type":"…",…}`.
#[derive(Debug, Clone, Deserialize)]
pub struct Envelope {
    /// `evt_…`: stable across retries; the de-duplication key.
    pub id: String,
    /// e.g. `video.ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Type-specific ids; see [`VideoData`].
    #[serde(default)]
    pub data: serde_json::Value,
}

/// `data` of `video.*` events.
#[derive(Debug, Clone, Deserialize)]
pub struct VideoData {
    /// `vid_…`.
    pub video_id: String,
    /// `op_…`.
    pub operation_id: String,
    /// The video's version after the change; larger is newer.
    pub version: i64,
}

/// The local status a `video.*` event moves a video to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VideoStatus {
    /// `video.processing`.
    Processing,
    /// `video.ready`.
    Ready,
    /// `video.failed`.
    Failed,
    /// `video.cancelled`.
    Cancelled,
}

impl VideoStatus {
    /// The status for an event type, or `None` when the type has no effect here.
    pub fn for_event_type(type_: &str) -> Option<Self> {
        match type_ {
            "video.processing" => Some(Self::Processing),
            "video.ready" => Some(Self::Ready),
            "video.failed" => Some(Self::Failed),
            "video.cancelled" => Some(Self::Cancelled),
            _ => None,
        }
    }

    /// The value stored in `videos.status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "processing",
            Self::Ready => "ready",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// What processing an event should do, decided before touching the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Set the video's state, if `version` is newer than the stored one.
    SetVideo {
        /// The video.
        video_id: String,
        /// The operation named by the event.
        operation_id: String,
        /// New status.
        status: VideoStatus,
        /// The event's version.
        version: i64,
    },
    /// Record the id only; the outcome says why there is no effect.
    None(Outcome),
}

impl Envelope {
    /// Parses an event body; `None` when it is not JSON or has no `id`/`type`.
    pub fn parse(body: &[u8]) -> Option<Self> {
        serde_json::from_slice(body).ok()
    }

    /// The effect of this event. A `video.*` event whose `data` lacks the ids
    /// or the version is [`Outcome::Invalid`]: recorded, never retried.
    pub fn effect(&self) -> Effect {
        let Some(status) = VideoStatus::for_event_type(&self.type_) else {
            return Effect::None(Outcome::Ignored);
        };
        match VideoData::deserialize(&self.data) {
            Ok(VideoData { video_id, operation_id, version }) => Effect::SetVideo { video_id, operation_id, status, version },
            Err(_) => Effect::None(Outcome::Invalid),
        }
    }
}

/// What the consumer did with one queued message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The effect was applied (the video row changed).
    Applied,
    /// A `video.*` event not newer than the stored state: recorded, no change.
    Stale,
    /// An event type with no local effect: recorded only.
    Ignored,
    /// A `video.*` event without usable `data`: recorded only.
    Invalid,
    /// The id was already recorded: nothing was done.
    Duplicate,
}

impl Outcome {
    /// The value stored in `seen_events.outcome`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Stale => "stale",
            Self::Ignored => "ignored",
            Self::Invalid => "invalid",
            Self::Duplicate => "duplicate",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effects_by_type() {
        let e = Envelope::parse(
            br#"{"id":"evt_1","type":"video.ready","created":1,"data":{"video_id":"vid_1","operation_id":"op_1","version":2}}"#,
        )
        .unwrap();
        assert_eq!(
            e.effect(),
            Effect::SetVideo { video_id: "vid_1".into(), operation_id: "op_1".into(), status: VideoStatus::Ready, version: 2 }
        );
        let other = Envelope::parse(br#"{"id":"evt_2","type":"webhook_endpoint.disabled","data":{"endpoint_id":"ep_1"}}"#).unwrap();
        assert_eq!(other.effect(), Effect::None(Outcome::Ignored));
        let bad = Envelope::parse(br#"{"id":"evt_3","type":"video.failed","data":{}}"#).unwrap();
        assert_eq!(bad.effect(), Effect::None(Outcome::Invalid));
        assert!(Envelope::parse(b"{\"type\":\"video.ready\"}").is_none());
        assert!(Envelope::parse(b"not json").is_none());
    }
}
