//! Settings: defaults in files, overridden by environment variables.
//!
//! Sources, later ones win:
//! 1. `<dir>/default.toml` (required),
//! 2. `<dir>/<profile>.toml` where the profile is `VID_PROFILE` (optional file),
//! 3. environment variables `VID__SECTION__KEY` (e.g. `VID__DATABASE__URL`).
//!
//! `<dir>` is `VID_CONFIG_DIR`, or `config` relative to the working directory.
//! Secret values are [`SecretString`]s: their `Debug` output is redacted, so a
//! service may log its whole settings at start-up.

use secrecy::SecretString;
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// The profile name in effect: `VID_PROFILE`, or `production` when unset.
/// Production is the default so that a forgotten variable fails safe.
pub fn profile() -> String {
    std::env::var("VID_PROFILE").unwrap_or_else(|_| "production".to_owned())
}

/// Loads settings of type `T` from files and the environment (see module docs).
///
/// Errors: a missing `default.toml`, a malformed file, or a value of the wrong type,
/// each naming the key.
pub fn load<T: DeserializeOwned>() -> anyhow::Result<T> {
    let dir = std::env::var("VID_CONFIG_DIR").unwrap_or_else(|_| "config".to_owned());
    load_from(&dir, &profile())
}

/// [`load`] with an explicit directory and profile (used by tests).
pub fn load_from<T: DeserializeOwned>(dir: &str, profile: &str) -> anyhow::Result<T> {
    let mut builder = config::Config::builder()
        .add_source(config::File::with_name(&format!("{dir}/default")).required(true))
        .add_source(config::File::with_name(&format!("{dir}/{profile}")).required(false))
        // Values stay strings (no guessing): an all-digit secret such as
        // "0123" must not become the number 123. Typed fields still parse.
        .add_source(config::Environment::with_prefix("VID").prefix_separator("__").separator("__"));
    for key in LIST_KEYS {
        let var = format!("VID__{}", key.to_ascii_uppercase().replace('.', "__"));
        if let Ok(value) = std::env::var(&var) {
            let items: Vec<String> = value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect();
            builder = builder.set_override(*key, items)?;
        }
    }
    Ok(builder.build()?.try_deserialize()?)
}

/// Settings that are lists; their environment variables are comma-separated
/// (`VID__UPLOADS__ALLOWED_CONTENT_TYPES=video/mp4,video/webm`).
pub const LIST_KEYS: &[&str] = &[
    "webhooks.allow_cidrs",
    "webhooks.allowed_ports",
    "ingest.allow_cidrs",
    "ingest.allowed_ports",
    "uploads.allowed_content_types",
    "dispatcher.retry_schedule_seconds",
    "transcoder.ladder",
];

/// `[database]`: PostgreSQL.
#[derive(Debug, Clone, Deserialize)]
pub struct DatabaseSettings {
    /// `postgres://user:pass@host:port/db`; secret because it may carry a password.
    pub url: SecretString,
    /// Maximum pooled connections per process.
    pub pool_size: usize,
    /// Seconds a service keeps retrying at start-up while PostgreSQL is
    /// unreachable (see [`crate::startup::wait_for`]) before it exits with the
    /// error; 0 tries once.
    #[serde(default = "default_startup_wait_seconds")]
    pub startup_wait_seconds: u64,
}

fn default_startup_wait_seconds() -> u64 {
    60
}

/// `[amqp]`: RabbitMQ.
#[derive(Debug, Clone, Deserialize)]
pub struct AmqpSettings {
    /// `amqp://user:pass@host:port/vhost`.
    pub url: SecretString,
    /// Prefix of every exchange and queue name (`vid` → `vid.transcode.jobs`);
    /// tests use a unique prefix each so they never see each other's messages.
    pub prefix: String,
}

/// `[s3]`: the media bucket.
#[derive(Debug, Clone, Deserialize)]
pub struct S3Settings {
    /// Endpoint URL, e.g. `http://127.0.0.1:3900` for the local Garage.
    pub endpoint: String,
    /// Endpoint URL put into presigned URLs handed to clients; defaults to `endpoint`.
    #[serde(default)]
    pub public_endpoint: Option<String>,
    /// Signing region (Garage's `s3_region`).
    pub region: String,
    /// Bucket holding sources, renditions and posters.
    pub bucket: String,
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: SecretString,
}

impl AmqpSettings {
    /// Checks `url` is an AMQP URI, so a typo fails at start-up with this
    /// message instead of an endless reconnect loop.
    /// Errors: the parser's reason.
    pub fn check(&self) -> anyhow::Result<()> {
        use secrecy::ExposeSecret;
        self.url
            .expose_secret()
            .parse::<lapin::uri::AMQPUri>()
            .map(|_| ())
            .map_err(|e| anyhow::anyhow!("amqp.url is not a valid AMQP URI (amqp://user:pass@host:port/vhost): {e}"))
    }
}

impl S3Settings {
    /// Checks `endpoint` (and `public_endpoint`) are absolute `http`/`https`
    /// URLs with a host, so a typo fails at start-up instead of every storage call.
    /// Errors: which setting and why.
    pub fn check(&self) -> anyhow::Result<()> {
        let check = |name: &str, value: &str| -> anyhow::Result<()> {
            let u = url::Url::parse(value).map_err(|e| anyhow::anyhow!("{name} {value:?} is not a URL: {e}"))?;
            anyhow::ensure!(matches!(u.scheme(), "http" | "https"), "{name} {value:?} must be an http or https URL");
            anyhow::ensure!(u.host_str().is_some_and(|h| !h.is_empty()), "{name} {value:?} has no host");
            Ok(())
        };
        check("s3.endpoint", &self.endpoint)?;
        if let Some(p) = &self.public_endpoint {
            check("s3.public_endpoint", p)?;
        }
        Ok(())
    }
}

/// `[telemetry]`: logs.
#[derive(Debug, Clone, Deserialize)]
pub struct TelemetrySettings {
    /// `pretty` (development) or `json` (production).
    pub format: LogFormat,
    /// An `EnvFilter` directive, e.g. `info,vid_api=debug`; `RUST_LOG` overrides it.
    pub level: String,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable, coloured.
    Pretty,
    /// One JSON object per line.
    Json,
}

#[cfg(test)]
mod endpoint_checks {
    use super::*;

    fn s3(endpoint: &str) -> S3Settings {
        S3Settings {
            endpoint: endpoint.into(),
            public_endpoint: None,
            region: "garage".into(),
            bucket: "b".into(),
            access_key_id: "k".into(),
            secret_access_key: "s".to_owned().into(),
        }
    }

    #[test]
    fn malformed_endpoints_are_refused_with_the_setting_named() {
        assert!(s3("http://127.0.0.1:3900").check().is_ok());
        assert!(s3("https://s3.example.com").check().is_ok());
        for bad in ["notaurl", "::::", "ftp://host", "http://"] {
            let e = s3(bad).check().expect_err(bad).to_string();
            assert!(e.contains("s3.endpoint"), "{bad}: {e}");
        }
        let amqp = |u: &str| AmqpSettings { url: u.to_owned().into(), prefix: "p".into() };
        assert!(amqp("amqp://guest:guest@127.0.0.1:5672/%2f").check().is_ok());
        assert!(amqp("notaurl").check().unwrap_err().to_string().contains("amqp.url"));
    }
}
