//! The webhook endpoint resource: `/webhook-endpoints`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::event::EventType;
use crate::EndpointId;

/// How deliveries to an endpoint are signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum SignatureFormat {
    /// `Webhook-Id` + `Webhook-Signature: t=<unix s>,v1=<hex HMAC-SHA256 of "t.body">`.
    #[default]
    WebhookSignature,
    /// Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64>`.
    StandardWebhooks,
}

impl SignatureFormat {
    /// The wire and database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WebhookSignature => "webhook-signature",
            Self::StandardWebhooks => "standard-webhooks",
        }
    }

    /// Parses the wire spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "webhook-signature" => Some(Self::WebhookSignature),
            "standard-webhooks" => Some(Self::StandardWebhooks),
            _ => None,
        }
    }
}

/// `POST /webhook-endpoints` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateEndpoint {
    /// Where to POST events. Must pass the SSRF policy (no private addresses unless allow-listed).
    #[cfg_attr(feature = "openapi", schema(example = "https://hooks.example.com/video"))]
    pub url: String,
    /// Free text for the customer: at most 1024 bytes (UTF-8), no control
    /// characters (no tab or line break either); else 422 `invalid_description`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 1024, pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$"))]
    pub description: Option<String>,
    /// Only these event types are sent; all when absent or `null`. At least
    /// one when present (`[]` is refused: 422 `invalid_event_types`);
    /// duplicates are stored once, in the order given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_items = 1))]
    pub event_types: Option<Vec<EventType>>,
    /// Defaults to `webhook-signature`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature_format: Option<SignatureFormat>,
}

text_state! {
    /// Whether deliveries are attempted.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    #[serde(rename_all = "snake_case")]
    pub enum EndpointStatus {
        /// Deliveries are attempted.
        Enabled = "enabled",
        /// Deliveries are kept as `paused` until the endpoint is enabled again.
        Disabled = "disabled",
    }
}

/// A webhook endpoint as the API shows it (never with its secret, except once at creation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Endpoint {
    /// `ep_…`
    pub id: EndpointId,
    /// Target URL.
    pub url: String,
    /// Free text.
    pub description: Option<String>,
    /// Filter; `None` means every type.
    pub event_types: Option<Vec<EventType>>,
    /// Signature scheme.
    pub signature_format: SignatureFormat,
    /// See [`EndpointStatus`].
    pub status: EndpointStatus,
    /// Why it was disabled, if it is.
    pub disabled_reason: Option<String>,
    /// When it was disabled (RFC 3339).
    pub disabled_at: Option<DateTime<Utc>>,
    /// While set and in the future, no attempt starts before this time
    /// (RFC 3339): the endpoint answered `429` or `503`, and its `Retry-After`
    /// (or the retry schedule) is honoured for the whole endpoint; due
    /// deliveries wait, whatever their `next_attempt_at` says. `null` otherwise.
    #[serde(default)]
    pub throttled_until: Option<DateTime<Utc>>,
    /// While set, at most this many attempts to the endpoint run at once,
    /// below the platform's configured per-endpoint concurrency: a `429` or
    /// `503` halved it (at least 1) and each success adds one back until the
    /// configured value is reached, when it returns to `null` (AIMD slow-down).
    /// `null`: the configured concurrency applies.
    #[serde(default)]
    pub concurrency_limit: Option<i32>,
    /// RFC 3339.
    pub created_at: DateTime<Utc>,
}

/// Delivery health of one endpoint over its latest 100 deliveries, as
/// `GET /webhook-endpoints` and `GET /webhook-endpoints/{id}` show it (the
/// api computes it from the dispatcher's delivery log).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EndpointHealth {
    /// How many of the latest 100 deliveries have had at least one attempt.
    pub recent_deliveries: i64,
    /// How many of those are `succeeded`.
    pub recent_succeeded: i64,
    /// `recent_succeeded / recent_deliveries`, from 0 to 1; `null` when nothing was attempted yet.
    /// A delivery still retrying counts as not (yet) succeeded.
    pub success_rate: Option<f64>,
    /// When the latest attempt among those deliveries ran (RFC 3339); `null` if none.
    pub last_attempt_at: Option<DateTime<Utc>>,
    /// The HTTP status that attempt got, if the endpoint answered.
    pub last_attempt_status: Option<i32>,
    /// That attempt's error class (`dns`, `connect`, `timeout`, `tls`, `blocked_address`,
    /// `redirect`, `http`); `null` if it succeeded or there is none.
    pub last_attempt_error_class: Option<String>,
}

/// An endpoint with its delivery health: the fields of [`Endpoint`] plus `health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EndpointSummary {
    /// The endpoint's fields.
    #[serde(flatten)]
    pub endpoint: Endpoint,
    /// Success rate and last attempt over the latest deliveries.
    pub health: EndpointHealth,
}

/// `201` answer to `POST /webhook-endpoints`: the endpoint plus its signing
/// secret, shown this once. The secret is `whsec_` + base64 of ≥ 24 random
/// bytes; the HMAC key is the decoded bytes (Standard Webhooks convention).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedEndpoint {
    /// The endpoint.
    #[serde(flatten)]
    pub endpoint: Endpoint,
    /// `whsec_…`
    pub secret: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_endpoint_is_flat_and_round_trips() {
        let c = CreatedEndpoint {
            endpoint: Endpoint {
                id: EndpointId::generate(),
                url: "https://example.com/hook".into(),
                description: None,
                event_types: Some(vec![EventType::VideoReady]),
                signature_format: SignatureFormat::default(),
                status: EndpointStatus::Enabled,
                disabled_reason: None,
                disabled_at: None,
                throttled_until: None,
                concurrency_limit: None,
                created_at: Utc::now(),
            },
            secret: "whsec_abc".into(),
        };
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["secret"], "whsec_abc");
        assert_eq!(v["signature_format"], "webhook-signature");
        assert_eq!(v["event_types"][0], "video.ready");
        assert!(v["id"].as_str().unwrap().starts_with("ep_"));
        assert_eq!(serde_json::from_value::<CreatedEndpoint>(v).unwrap(), c);
    }

    #[test]
    fn create_endpoint_parses_formats_and_refuses_unknown_fields() {
        let c: CreateEndpoint = serde_json::from_str(r#"{"url":"https://a","signature_format":"standard-webhooks"}"#).unwrap();
        assert_eq!(c.signature_format, Some(SignatureFormat::StandardWebhooks));
        assert!(serde_json::from_str::<CreateEndpoint>(r#"{"url":"https://a","secret":"x"}"#).is_err());
        assert!(serde_json::from_str::<CreateEndpoint>(r#"{"url":"https://a","event_types":["video.nope"]}"#).is_err());
        assert_eq!(SignatureFormat::parse("webhook-signature"), Some(SignatureFormat::WebhookSignature));
    }
}
