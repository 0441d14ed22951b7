//! The transcoder service: consumes transcode jobs from RabbitMQ, runs the
//! libav work in a supervised child process, uploads the outputs to S3 and
//! reports over RabbitMQ.
//!
//! The module map (what each owns; its invariants):
//!
//! - [`worker`]: the queue loop (sessions, jobs, cancels, reports, acks, shutdown); a delivery is acked only after its terminal report is confirmed, and a shutdown hands jobs back without spending a delivery;
//!   - `worker::session`: one broker session and the graceful drain; a failed session aborts its jobs (the broker redelivers them);
//!   - `worker::delivery`: one delivery from receipt to ack/nack/hand-back; the work dir is removed whatever the end;
//!   - `worker::steps`: download → scan → child → upload, each stoppable; nothing reaches libav before a clean verdict;
//!   - `worker::scanning`: the scanning phase and the quarantine; fail closed;
//!   - `worker::storage`: S3 download, uploads (multipart above 64 MiB), deletes after a cancel; S3 errors are transient;
//!   - `worker::reports`: reports and the progress reporter; progress never goes back, at most one a second, ≤ 99 %;
//!   - `worker::metrics`: the worker's counters and histograms;
//! - [`child`]: the child-process protocol (`transcoder work --spec …`) and its supervision; every way a child ends becomes one [`child::ChildOutcome`], and a child never outlives its parent;
//! - [`media`]: probe → validate → ladder plan → the single-decode transcoder and poster; synchronous libav, run only inside the child;
//!   - `media::transcode`: graph building, the decode loop, per-rung encoder and muxer (`output`), audio, poster; one decode, one encode per rung, audio encoded once;
//! - [`problems`]: the registry of the transcoder's stable error codes (code, status, title, meaning); no code is written anywhere else;
//! - [`workdir`]: the locked per-job directories and the start-up sweep of a killed process's leftovers; a live job's directory is never swept;
//! - [`scan`]: the clamd `INSTREAM` client and the scan metrics (the scanning phase runs in `worker::scanning`);
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
