//! The transcoder service: consumes transcode jobs from RabbitMQ, runs the
//! libav work in a supervised child process, uploads the outputs to S3 and
//! reports over RabbitMQ.
//!
//! - [`media`]: probe, validate, ladder planning, the single-decode transcoder, poster;
//! - [`child`]: the child-process protocol (`transcoder work --spec …`) and its supervision;
//! - [`worker`]: the queue loop (jobs, cancel, reports, acks, shutdown);
//! - [`workdir`]: the locked per-job directories and the start-up sweep of a killed process's leftovers;
//! - [`scan`]: the clamd `INSTREAM` client and the scan metrics (the scanning phase runs in [`worker`]);
//! - [`settings`]: the `[transcoder]` and `[scanner]` settings;
//! - [`health`]: `/healthz`, `/readyz` and `/metrics`.

// `Problem` (RFC 9457, ~150 bytes) is the error type on purpose; the paths are cold.
#![allow(clippy::result_large_err)]

pub mod child;
pub mod health;
pub mod media;
pub mod problems;
pub mod scan;
pub mod settings;
pub mod workdir;
pub mod worker;
