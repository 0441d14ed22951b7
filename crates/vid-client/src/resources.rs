//! Typed calls for the webhook endpoint routes beyond create/list/get/delete:
//! `PATCH`, `:rotate-secret`, `:enable`, `/deliveries` and `:retry`.
//!
//! Request and answer types come from `vid-core` where it defines them
//! ([`Endpoint`], [`EventType`], [`SignatureFormat`], the ids). The answers of
//! `:rotate-secret`, `/deliveries` and `:retry` have no `vid-core` type yet, so
//! they are returned as JSON rather than as structs copied from the api.

use reqwest::Method;
use serde::Serialize;
use vid_core::endpoint::{Endpoint, SignatureFormat};
use vid_core::event::EventType;
use vid_core::{DeliveryId, EndpointId};

use crate::{query, Client, ClientError, Page};

/// What `PATCH /webhook-endpoints/{id}` changes; `None` keeps the current value.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EndpointChanges<'a> {
    /// New URL (checked by the SSRF policy like at creation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<&'a str>,
    /// New description.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<&'a str>,
    /// New event filter (non-empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_types: Option<&'a [EventType]>,
    /// New signature format.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature_format: Option<SignatureFormat>,
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
