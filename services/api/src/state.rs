//! Shared state handed to every handler and background task.

use std::sync::Arc;

use tokio::sync::Notify;
use vid_db::seal::SealingKey;
use vid_db::Pool;
use vid_infra::amqp::Topology;
use vid_netguard::{Resolve, UrlPolicy};

use crate::settings::Settings;

/// Cheap to clone: everything inside is shared.
#[derive(Clone)]
pub struct AppState {
    /// Settings as loaded at start-up.
    pub settings: Arc<Settings>,
    /// PostgreSQL pool.
    pub db: Pool,
    /// S3 client for calls from the api.
    pub s3: aws_sdk_s3::Client,
    /// S3 client that only presigns, with the public endpoint in its URLs.
    pub presigner: aws_sdk_s3::Client,
    /// Queue names.
    pub topology: Topology,
    /// Woken whenever this process writes to the outbox, so the relay publishes at once.
    pub outbox_notify: Arc<Notify>,
    /// Seals endpoint secrets at rest.
    pub sealing_key: Arc<SealingKey>,
    /// Which endpoint URLs are acceptable.
    pub url_policy: Arc<UrlPolicy>,
    /// Resolves endpoint host names at registration.
    pub resolver: Arc<dyn Resolve>,
    /// Waiters on operation changes (`:wait`, event streams), fed by the LISTEN connection.
    pub watchers: Arc<crate::watch::Registry>,
}
