//! Shared state handed to every handler and background task.

use std::sync::Arc;

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
    /// The outbox: the only way to queue a message; its commit wakes the relay.
    pub outbox: crate::store::outbox::Outbox,
    /// Seals endpoint secrets at rest.
    pub sealing_key: Arc<SealingKey>,
    /// Which endpoint URLs are acceptable.
    pub url_policy: Arc<UrlPolicy>,
    /// Resolves endpoint host names at registration.
    pub resolver: Arc<dyn Resolve>,
    /// Waiters on operation changes (`:wait`, event streams), fed by the LISTEN connection.
    pub watchers: Arc<crate::watch::Registry>,
    /// Turns true at SIGTERM; see [`Draining`].
    pub draining: Draining,
}

/// The api's shutdown as long-lived requests see it: [`Draining::over`]
/// resolves `[api] stream_drain_seconds` after SIGTERM, when open `:wait`
/// calls and event streams end cleanly (before the HTTP server's own limit).
#[derive(Clone)]
pub struct Draining {
    rx: tokio::sync::watch::Receiver<bool>,
    window: std::time::Duration,
}

impl Draining {
    /// A pair: the sender (set to `true` at SIGTERM) and the view handlers use.
    pub fn new(window: std::time::Duration) -> (tokio::sync::watch::Sender<bool>, Self) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        (tx, Self { rx, window })
    }

    /// Resolves `window` after draining began; never, if it never begins.
    pub async fn over(&self) {
        let mut rx = self.rx.clone();
        if rx.wait_for(|d| *d).await.is_err() {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(self.window).await;
    }
}
