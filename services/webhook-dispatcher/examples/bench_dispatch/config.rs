//! The bench's knobs, from the environment (the crate docs give the
//! variables and their defaults), and the dispatcher settings they make.

use vid_webhook_dispatcher::Settings;

/// `name`'s value parsed, or `default` when unset or unparseable.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The knobs, from the environment (see the module docs for the defaults).
pub(crate) struct Config {
    pub(crate) events: usize,
    pub(crate) endpoints: usize,
    pub(crate) per_endpoint: u32,
    pub(crate) batch: u32,
    pub(crate) max_in_flight: u32,
    pub(crate) prefetch: u16,
    pub(crate) pool: u32,
    pub(crate) publish_concurrency: usize,
    pub(crate) plan_cache_mode: Option<String>,
    pub(crate) lease_at_fanin: bool,
    pub(crate) lease_ahead: u32,
    pub(crate) replicas: usize,
}

impl Config {
    pub(crate) fn from_env() -> Self {
        Config {
            events: env_or("EVENTS", 4000),
            endpoints: env_or("ENDPOINTS", 1),
            per_endpoint: env_or("PER_ENDPOINT_CONCURRENCY", 64),
            batch: env_or("BATCH_SIZE", 64),
            max_in_flight: env_or("MAX_IN_FLIGHT", 256),
            prefetch: env_or("PREFETCH", 256),
            pool: env_or("POOL_SIZE", 16),
            publish_concurrency: env_or("PUBLISH_CONCURRENCY", 256),
            plan_cache_mode: std::env::var("PLAN_CACHE_MODE").ok().filter(|m| !m.is_empty()),
            lease_at_fanin: env_or("LEASE_AT_FANIN", 1u8) != 0,
            lease_ahead: env_or("LEASE_AHEAD", 4096),
            replicas: env_or("REPLICAS", 1usize).max(1),
        }
    }

    /// The dispatcher's settings (test profile) for this run's database and amqp prefix.
    pub(crate) fn settings(&self, db_url: &str, prefix: &str) -> Settings {
        let Config { per_endpoint, batch, max_in_flight, prefetch, pool, .. } = *self;
        let lease_at_fanin = if self.lease_at_fanin { "true" } else { "false" };
        let (per_endpoint_s, batch_s, max_in_flight_s, prefetch_s, pool_s, ahead_s) = (
            per_endpoint.to_string(),
            batch.to_string(),
            max_in_flight.to_string(),
            prefetch.to_string(),
            pool.to_string(),
            self.lease_ahead.to_string(),
        );
        let overrides: Vec<(&str, &str)> = vec![
            ("database.url", db_url),
            ("amqp.prefix", prefix),
            ("dispatcher.health_listen", "127.0.0.1:0"),
            ("database.pool_size", &pool_s),
            ("dispatcher.per_endpoint_concurrency", &per_endpoint_s),
            ("dispatcher.batch_size", &batch_s),
            ("dispatcher.max_in_flight", &max_in_flight_s),
            ("dispatcher.prefetch", &prefetch_s),
            ("dispatcher.lease_at_fanin", lease_at_fanin),
            ("dispatcher.lease_ahead", &ahead_s),
        ];
        vid_testkit::settings(&overrides)
    }
}
