//! Settings: command-line flags, each with an environment-variable fallback.

use std::net::SocketAddr;
use std::time::Duration;

use vid_webhooks::{Secret, Verifier};

/// Everything the receiver needs to run. Every field is a flag with an
/// environment-variable fallback (`RECEIVER_…`); tests build it directly.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// Address the HTTP server binds; port 0 picks a free one.
    #[arg(long, env = "RECEIVER_LISTEN", default_value = "127.0.0.1:9000", global = true)]
    pub listen: SocketAddr,

    /// The receiver's own PostgreSQL database; created at start-up when missing.
    #[arg(long, env = "RECEIVER_DATABASE_URL", default_value = crate::db::DEFAULT_DATABASE_URL, global = true)]
    pub database_url: String,

    /// RabbitMQ server the handler enqueues to and the consumer reads from.
    #[arg(long, env = "RECEIVER_AMQP_URL", default_value = "amqp://guest:guest@127.0.0.1:5672/%2f", global = true)]
    pub amqp_url: String,

    /// Name of the durable (quorum) queue holding verified, not yet processed
    /// events; events that can never be stored go to `<queue>.dead`.
    #[arg(long, env = "RECEIVER_QUEUE", default_value = "webhook-receiver.events.v2", global = true)]
    pub queue: String,

    /// A `whsec_…` endpoint secret. Repeat the flag (or separate with commas in
    /// `RECEIVER_SECRETS`) to accept old and new secrets during a rotation.
    #[arg(
        long = "secret",
        value_name = "WHSEC",
        env = "RECEIVER_SECRETS",
        value_delimiter = ',',
        value_parser = parse_secret,
        hide_env_values = true,
        global = true
    )]
    pub secrets: Vec<Secret>,

    /// Largest accepted distance, in seconds, between a delivery's signed
    /// timestamp and this machine's clock (replay protection). `0` does **not**
    /// disable the check (unlike `vidctl verify --tolerance 0`): it accepts
    /// only a timestamp equal to this clock's current second.
    #[arg(long, env = "RECEIVER_TOLERANCE_SECONDS", default_value_t = 300, global = true)]
    pub tolerance_seconds: u64,

    /// How long the handler waits, in milliseconds, to connect to RabbitMQ and
    /// for the broker's publisher confirm before answering `503`.
    #[arg(long, env = "RECEIVER_PUBLISH_TIMEOUT_MS", default_value_t = 5000, global = true)]
    pub publish_timeout_ms: u64,

    /// How many unacknowledged messages RabbitMQ hands the consumer at once.
    #[arg(long, env = "RECEIVER_PREFETCH", default_value_t = 10, global = true)]
    pub prefetch: u16,

    /// Size of the PostgreSQL connection pool.
    #[arg(long, env = "RECEIVER_DB_POOL_SIZE", default_value_t = 8, global = true)]
    pub db_pool_size: usize,
}

impl Config {
    /// The signature verifier these settings describe (format auto-detected).
    pub fn verifier(&self) -> Verifier {
        Verifier::new().with_tolerance(Duration::from_secs(self.tolerance_seconds))
    }

    /// [`publish_timeout_ms`](Config::publish_timeout_ms) as a [`Duration`].
    pub fn publish_timeout(&self) -> Duration {
        Duration::from_millis(self.publish_timeout_ms)
    }
}

fn parse_secret(text: &str) -> Result<Secret, vid_webhooks::SecretError> {
    Secret::parse(text)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        config: Config,
    }

    #[test]
    fn defaults_and_repeated_secrets() {
        let a = Secret::generate();
        let b = Secret::generate();
        let cli = Cli::try_parse_from(["x", "--secret", a.as_str(), "--secret", b.as_str()]).unwrap();
        let c = cli.config;
        assert_eq!(c.listen, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(c.tolerance_seconds, 300);
        assert_eq!(c.secrets.iter().map(Secret::as_str).collect::<Vec<_>>(), [a.as_str(), b.as_str()]);

        let joined = format!("{},{}", a.as_str(), b.as_str());
        let cli = Cli::try_parse_from(["x", "--secret", &joined]).unwrap();
        assert_eq!(cli.config.secrets.len(), 2);

        assert!(Cli::try_parse_from(["x", "--secret", "not-a-secret"]).is_err());
    }
}
