//! The dispatcher's settings (`config/default.toml`, `config/<profile>.toml`,
//! `VID__…` variables; see `vid_infra::settings`).
//!
//! Settings added by the dispatcher after the skeleton have serde defaults in
//! code (listed on each field), so older configuration files keep working.

use std::time::Duration;

use serde::Deserialize;
use vid_infra::settings::{AmqpSettings, DatabaseSettings, TelemetrySettings};
use vid_infra::SecretString;

/// Milliseconds a lease should have beyond `request_timeout_ms` (which
/// bounds a whole attempt, connect included) for the time from the claim's
/// commit to the attempt's start (slots are taken before claiming, so this is
/// short) and from its end to the recorded outcome (a pooled connection and
/// one statement under normal load; a database slower than that may still
/// outlast it, and a lost lease then means a duplicate, never a loss). A
/// shorter lease is allowed and logged as a warning.
pub const LEASE_MARGIN_MS: u128 = 5_000;

/// Everything the dispatcher reads.
#[derive(Debug, Clone, Deserialize)]
pub struct Settings {
    /// Logs.
    pub telemetry: TelemetrySettings,
    /// PostgreSQL (deliveries, attempts, endpoints).
    pub database: DatabaseSettings,
    /// RabbitMQ (the `P.webhook.events` queue).
    pub amqp: AmqpSettings,
    /// The SSRF policy and the key that opens endpoint secrets.
    pub webhooks: WebhookSettings,
    /// Delivery tuning.
    pub dispatcher: DispatcherSettings,
}

/// `[webhooks]`: shared with the api, which applies the same policy at registration.
#[derive(Debug, Clone, Deserialize)]
pub struct WebhookSettings {
    /// CIDRs endpoint URLs may resolve to although not globally routable.
    pub allow_cidrs: Vec<ipnet::IpNet>,
    /// Refuse `http://` endpoint URLs.
    pub require_https: bool,
    /// The ports endpoint URLs may use (empty: any); see `vid_netguard::UrlPolicy::allowed_ports`.
    #[serde(default)]
    pub allowed_ports: Vec<u16>,
    /// 64 hex characters: the AES-256-GCM key that sealed the endpoint secrets.
    pub secret_key: SecretString,
}

/// `[dispatcher]`.
#[derive(Debug, Clone, Deserialize)]
pub struct DispatcherSettings {
    /// `host:port` of the `/healthz` + `/readyz` server; port 0 picks a free one (tests).
    pub health_listen: String,
    /// TCP connect timeout per attempt, in ms (all of an endpoint's addresses together).
    pub connect_timeout_ms: u64,
    /// Whole-attempt timeout (resolve, connect, TLS, request, response head), in ms.
    pub request_timeout_ms: u64,
    /// How much of a response body is read and kept, in bytes.
    pub max_response_body_bytes: usize,
    /// At most this many attempts to one endpoint run at once, across every replica.
    pub per_endpoint_concurrency: u32,
    /// At most this many deliveries are claimed per scheduler round (and
    /// leased per fan-in), 1 to 512 (`app::MAX_BATCH_SIZE`: each claim holds
    /// up to this many endpoint locks in PostgreSQL).
    pub batch_size: u32,
    /// How often the scheduler looks for due deliveries when nothing woke it, in ms.
    pub idle_poll_ms: u64,
    /// Delay before retry `n` (seconds after attempt `n` failed); ±20 % jitter
    /// is added. Its length is the number of retries: a delivery gets
    /// `len + 1` attempts.
    pub retry_schedule_seconds: Vec<u64>,
    /// At most this many attempts run at once in this process. Default 256.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: u32,
    /// How long a claim is held, in ms, 1 to 86,400,000 (`app::MAX_LEASE_MS`;
    /// refused at start-up otherwise). Should exceed `request_timeout_ms`,
    /// which bounds a whole attempt (a warning at start-up otherwise: a lease
    /// that expires while its attempt runs lets another claim send it
    /// again); a crashed
    /// replica's deliveries are retried after it. Default:
    /// `connect_timeout_ms + request_timeout_ms + 15000`.
    #[serde(default)]
    pub lease_ms: Option<u64>,
    /// After SIGTERM, how long in-flight attempts may take to finish, in seconds. Default 20.
    #[serde(default = "default_shutdown_grace")]
    pub shutdown_grace_seconds: u64,
    /// Disable an endpoint after this many deliveries in a row ended `failed`. Default 5.
    #[serde(default = "default_disable_after_failed_deliveries")]
    pub disable_after_failed_deliveries: i32,
    /// Disable an endpoint whose attempts have all failed for this long, in seconds. Default 86400.
    #[serde(default = "default_disable_after_failing_seconds")]
    pub disable_after_failing_seconds: u64,
    /// RabbitMQ prefetch of the fan-in consumer, also the most messages
    /// fanned in per transaction. Default 64.
    #[serde(default = "default_prefetch")]
    pub prefetch: u16,
    /// Idle keep-alive connections kept per scheme/host/port (closed after
    /// 60 s unused). Default 64.
    #[serde(default = "default_pool_max_idle_per_host")]
    pub pool_max_idle_per_host: usize,
    /// How often the `webhook_retry_backlog` gauge is refreshed (one count
    /// on a partial index), in ms. Default 15000.
    #[serde(default = "default_backlog_interval_ms")]
    pub retry_backlog_interval_ms: u64,
    /// Events younger than this are left to the message fan-in; older ones
    /// without their deliveries are reconciled from `events`, in seconds.
    /// Default 300: far beyond a healthy fan-in's lag (seconds), so a healthy
    /// system reconciles nothing, and beyond any event-recording transaction
    /// (the mark never passes an event not yet committed).
    #[serde(default = "default_reconcile_grace")]
    pub reconcile_grace_seconds: f64,
    /// Time between reconciliation passes (one also runs at start-up), in
    /// seconds. Default 60: a lost event is delivered within grace + 60 s.
    #[serde(default = "default_reconcile_interval")]
    pub reconcile_interval_seconds: f64,
    /// The first pass ever (no mark yet) starts this far back, in seconds.
    /// Default 86400: deploying the reconciliation does not replay history.
    #[serde(default = "default_reconcile_lookback")]
    pub reconcile_lookback_seconds: f64,
    /// Events per reconciliation transaction. Default 1000.
    #[serde(default = "default_reconcile_batch")]
    pub reconcile_batch: u32,
    /// The fan-in leases the deliveries it inserts when their endpoint has
    /// free slots and nothing older due, and sends them without a claim
    /// (same bound, lease and order as a claim; issue 22). Default true;
    /// false: every delivery waits for a claim.
    #[serde(default = "default_lease_at_fanin")]
    pub lease_at_fanin: bool,
    /// How many leases the fan-in may hold, 0 to 65,536
    /// (`app::MAX_LEASE_AHEAD`): each waits in this process for its
    /// endpoint's gate (`per_endpoint_concurrency` requests open at once from
    /// this process) and then for a slot of `max_in_flight`, and keeps its
    /// place until its outcome is recorded. With these places the fan-in
    /// also leases beyond the per-endpoint bound, for an endpoint no other
    /// replica holds a lease of, unthrottled and at its full concurrency, so
    /// a burst that outruns a receiver is inserted leased rather than
    /// unleased and leased again by a claim (issue 22); other replicas lease
    /// nothing there until this one holds fewer leases than the bound. A
    /// crash leaves these deliveries to wait out their lease (`lease_ms`)
    /// before another replica sends them. 0: the fan-in leases within the
    /// bound only, into `max_in_flight`'s slots. Only with `lease_at_fanin`.
    /// Default 4096.
    #[serde(default = "default_lease_ahead")]
    pub lease_ahead: u32,
}

fn default_lease_ahead() -> u32 {
    4096
}

fn default_lease_at_fanin() -> bool {
    true
}

fn default_reconcile_grace() -> f64 {
    300.0
}
fn default_reconcile_interval() -> f64 {
    60.0
}
fn default_reconcile_lookback() -> f64 {
    86_400.0
}
fn default_reconcile_batch() -> u32 {
    1000
}

fn default_pool_max_idle_per_host() -> usize {
    64
}
fn default_backlog_interval_ms() -> u64 {
    15_000
}

fn default_max_in_flight() -> u32 {
    256
}
fn default_shutdown_grace() -> u64 {
    20
}
fn default_disable_after_failed_deliveries() -> i32 {
    5
}
fn default_disable_after_failing_seconds() -> u64 {
    86_400
}
fn default_prefetch() -> u16 {
    64
}

impl DispatcherSettings {
    /// Connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
    /// Whole-attempt timeout.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
    /// Claim lease (see [`DispatcherSettings::lease_ms`]).
    pub fn lease(&self) -> Duration {
        Duration::from_millis(
            self.lease_ms.unwrap_or(self.connect_timeout_ms.saturating_add(self.request_timeout_ms).saturating_add(15_000)),
        )
    }
    /// The reconciliation window ([`vid_deliveries::reconcile::Window`]).
    /// Negative or non-finite seconds count as 0.
    pub fn reconcile_window(&self) -> vid_deliveries::reconcile::Window {
        vid_deliveries::reconcile::Window {
            grace: secs(self.reconcile_grace_seconds),
            lookback: secs(self.reconcile_lookback_seconds),
            batch: i64::from(self.reconcile_batch.max(1)),
        }
    }
    /// Time between reconciliation passes (at least 10 ms).
    pub fn reconcile_interval(&self) -> Duration {
        secs(self.reconcile_interval_seconds).max(Duration::from_millis(10))
    }
    /// Idle poll interval.
    pub fn idle_poll(&self) -> Duration {
        Duration::from_millis(self.idle_poll_ms.max(1))
    }
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::ZERO)
}
