//! Plumbing shared by the three services, so each thing is done one way:
//!
//! - [`settings`]: one loader (the `config` crate) for `config/default.toml`,
//!   `config/<profile>.toml` and `VID__…` environment variables;
//! - [`amqp`]: the one place that declares the RabbitMQ topology, plus a
//!   confirmed publisher;
//! - [`storage`]: the aws-sdk-s3 client, configured for self-hosted S3 stores;
//! - [`telemetry`]: tracing set-up (pretty in development, JSON in production);
//! - [`metrics`]: the Prometheus recorder behind the `metrics` facade;
//! - [`exit`]: how a service's `main` ends (an error as one line, no backtrace).
//! - [`startup`]: bounded waits for a dependency at start-up.
//! - [`readiness`]: the `/readyz` check (database and bucket, each bounded).

pub mod amqp;
pub mod exit;
pub mod metrics;
pub mod readiness;
pub mod settings;
pub mod startup;
pub mod storage;
pub mod telemetry;

pub use secrecy::{ExposeSecret, SecretString};
