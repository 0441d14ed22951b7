//! Typed calls for the webhook endpoint routes beyond create/list/get/delete:
//! `PATCH`, `:rotate-secret`, `:enable`, `/deliveries` and `:retry`.
//!
//! Request and answer types come from `vid-core` where it defines them
//! ([`Endpoint`], [`EventType`], [`SignatureFormat`], the ids). The answers of
//! `:rotate-secret` has no `vid-core` type yet. `/deliveries` and `:retry`
//! answer `vid_core::delivery::DeliveryView`s, which this SDK still returns as
//! JSON (as `vidctl` prints them); never as structs copied from the api.

use reqwest::Method;
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use vid_core::endpoint::{Endpoint, SignatureFormat};
use vid_core::event::EventType;
use vid_core::{DeliveryId, EndpointId};

use crate::client::{query, Client, ClientError, Page};

/// What `PATCH /webhook-endpoints/{id}` changes; `None` (and `false`) keeps
/// the current value.
///
/// Only the fields that are set are sent. `clear_description` and
/// `all_event_types` send an explicit `null`, which the api reads as "remove":
/// no description, or no filter (every event type is sent). A clear flag wins
/// over the matching value (`description`, `event_types`), which is then not sent.
#[derive(Debug, Clone, Default)]
pub struct EndpointChanges<'a> {
    /// New URL (checked by the SSRF policy like at creation).
    pub url: Option<&'a str>,
    /// New description (at most 1024 bytes, no control characters).
    pub description: Option<&'a str>,
    /// New event filter (non-empty; duplicates are stored once).
    pub event_types: Option<&'a [EventType]>,
    /// New signature format.
    pub signature_format: Option<SignatureFormat>,
    /// Remove the description (`"description": null`).
    pub clear_description: bool,
    /// Remove the filter so that every event type is sent (`"event_types": null`).
    pub all_event_types: bool,
}

impl Serialize for EndpointChanges<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        if let Some(url) = self.url {
            map.serialize_entry("url", url)?;
        }
        if self.clear_description {
            map.serialize_entry("description", &())?;
        } else if let Some(d) = self.description {
            map.serialize_entry("description", d)?;
        }
        if self.all_event_types {
            map.serialize_entry("event_types", &())?;
        } else if let Some(ts) = self.event_types {
            map.serialize_entry("event_types", ts)?;
        }
        if let Some(f) = self.signature_format {
            map.serialize_entry("signature_format", &f)?;
        }
        map.end()
    }
}

/// Filters of `GET /webhook-endpoints/{id}/deliveries`.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeliveryFilter<'a> {
    /// `pending`, `succeeded`, `failed` or `paused`.
    pub status: Option<&'a str>,
    /// An event type, e.g. `video.ready`.
    pub event_type: Option<&'a str>,
    /// Page size, 1–100 (server default 20).
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<&'a str>,
}

impl Client {
    /// `PATCH /webhook-endpoints/{id}`.
    pub async fn update_endpoint(&self, id: &EndpointId, changes: &EndpointChanges<'_>) -> Result<Endpoint, ClientError> {
        Ok(self.call(Method::PATCH, &format!("/webhook-endpoints/{id}"), Some(changes), &[]).await?.0)
    }

    /// `POST /webhook-endpoints/{id}:rotate-secret` → `{id, secret, previous_secret_expires_at}`
    /// (the new secret is shown this once; the old one keeps signing until then).
    pub async fn rotate_endpoint_secret(&self, id: &EndpointId) -> Result<serde_json::Value, ClientError> {
        Ok(self.call::<(), _>(Method::POST, &format!("/webhook-endpoints/{id}:rotate-secret"), None, &[]).await?.0)
    }

    /// `POST /webhook-endpoints/{id}:enable`: re-enables it; the paused backlog is delivered.
    pub async fn enable_endpoint(&self, id: &EndpointId) -> Result<Endpoint, ClientError> {
        Ok(self.call::<(), _>(Method::POST, &format!("/webhook-endpoints/{id}:enable"), None, &[]).await?.0)
    }

    /// `GET /webhook-endpoints/{id}/deliveries`: newest first, each with its `attempts`.
    pub async fn list_deliveries(&self, id: &EndpointId, filter: &DeliveryFilter<'_>) -> Result<Page<serde_json::Value>, ClientError> {
        let limit = filter.limit.map(|l| l.to_string());
        let q =
            query(&[("status", filter.status), ("event_type", filter.event_type), ("limit", limit.as_deref()), ("cursor", filter.cursor)]);
        self.get(&format!("/webhook-endpoints/{id}/deliveries?{q}")).await
    }

    /// `POST /webhook-endpoints/{id}/deliveries/{delivery_id}:retry` → `202` with the delivery.
    pub async fn retry_delivery(&self, id: &EndpointId, delivery: &DeliveryId) -> Result<serde_json::Value, ClientError> {
        Ok(self.call::<(), _>(Method::POST, &format!("/webhook-endpoints/{id}/deliveries/{delivery}:retry"), None, &[]).await?.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_changes_send_only_what_is_set_and_null_to_clear() {
        let json = |c: &EndpointChanges<'_>| serde_json::to_value(c).unwrap();
        assert_eq!(json(&EndpointChanges::default()), serde_json::json!({}));
        let types = [EventType::VideoReady];
        let set = EndpointChanges {
            url: Some("https://a.example/h"),
            description: Some("d"),
            event_types: Some(&types),
            signature_format: Some(SignatureFormat::StandardWebhooks),
            ..Default::default()
        };
        assert_eq!(
            json(&set),
            serde_json::json!({"url": "https://a.example/h", "description": "d", "event_types": ["video.ready"], "signature_format": "standard-webhooks"})
        );
        let clear = EndpointChanges { clear_description: true, all_event_types: true, ..set };
        assert_eq!(
            json(&clear),
            serde_json::json!({"url": "https://a.example/h", "description": null, "event_types": null, "signature_format": "standard-webhooks"})
        );
    }
}
