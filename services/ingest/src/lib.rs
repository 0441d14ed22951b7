//! The ingest worker (issue 21, item 4): downloads the sources of
//! `POST /ingests` from the internet into storage, then reports to the api.
//!
//! Why a service of its own: it is the only one that needs internet egress
//! (80/443, minus private ranges, as the webhook dispatcher); the transcoder
//! keeps its closed NetworkPolicy (RabbitMQ and storage only), so a decoder
//! bug can never be turned into an outbound connection.
//!
//! - [`worker`]: consumes `P.ingest.jobs` (manual acks, prefetch =
//!   `ingest_worker.concurrency`), runs one download per job, publishes
//!   [`vid_core::ingest::IngestReport`]s to `P.ingest.reports` with
//!   publisher confirms, acks after the final report is confirmed; hears
//!   cancels on the control fan-out (`P.control`) and stops the download
//!   (multipart upload aborted, slot freed).
//! - [`fetch`]: the SSRF-guarded HTTP download (checked addresses only,
//!   redirects followed here and re-checked, idle and connect timeouts).
//! - [`multipart`]: the S3 multipart upload the body streams into (at most
//!   two parts in memory).
//! - [`problems`]: the stable failure codes.
//! - [`health`]: `/healthz`, `/readyz`, `/metrics`.
//!
//! Talks to RabbitMQ and storage only: never to PostgreSQL, never to the api.

#![forbid(unsafe_code)]

pub mod fetch;
pub mod health;
pub mod multipart;
pub mod problems;
pub mod worker;

use std::time::Duration;

use serde::Deserialize;
use vid_infra::settings::{AmqpSettings, S3Settings, TelemetrySettings};

/// Everything the ingest worker reads (`config/default.toml`, the profile
/// file, `VID__…` variables).
#[derive(Debug, Clone, Deserialize)]
pub struct Settings {
    /// Logs.
    pub telemetry: TelemetrySettings,
    /// RabbitMQ (`P.ingest.jobs`, `P.ingest.reports`).
    pub amqp: AmqpSettings,
    /// The media bucket.
    pub s3: S3Settings,
    /// `[ingest]`: the SSRF policy, shared with the api (which applies it at
    /// `POST /ingests`). Absent: http(s), global addresses only, any port.
    #[serde(default)]
    pub ingest: vid_netguard::UrlPolicy,
    /// `[ingest_worker]`: tuning.
    pub ingest_worker: WorkerSettings,
}

/// `[ingest_worker]`.
#[derive(Debug, Clone, Deserialize)]
pub struct WorkerSettings {
    /// `host:port` of `/healthz`, `/readyz`, `/metrics`; port 0 picks one (tests).
    pub health_listen: String,
    /// Downloads at once per process (the consumer's prefetch).
    pub concurrency: u16,
    /// TCP connect timeout per hop, ms.
    pub connect_timeout_ms: u64,
    /// The longest wait for an answer's head or the next body bytes, ms.
    pub idle_timeout_ms: u64,
    /// The longest a whole download may take (all hops and the body), seconds.
    pub total_timeout_seconds: u64,
    /// Redirects followed at most.
    pub max_redirects: u32,
    /// Bytes per S3 part (at least 5 MiB); memory per download is about two parts.
    pub part_size_bytes: usize,
    /// At most one progress report per this many ms per download.
    pub progress_interval_ms: u64,
}

impl WorkerSettings {
    /// The fetcher's limits.
    pub fn limits(&self) -> fetch::Limits {
        fetch::Limits {
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            max_redirects: self.max_redirects,
        }
    }
}
