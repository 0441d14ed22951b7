//! `chaos`: the chaos run of issue 11. Driven by `scripts/chaos.sh`, which
//! builds the binaries and starts a private PostgreSQL and RabbitMQ for it.
//!
//! It runs the three real services ([`vid_e2e::Stack`]) on the private
//! instances, two reference receivers (`examples/webhook-receiver`), each
//! behind a recording proxy registered as one of the tenant's two webhook
//! endpoints, and uploads N small real videos through the SDK while a seeded
//! schedule of faults runs:
//!
//! * SIGKILL of the api; of the transcoder while it holds a job; of the
//!   dispatcher while one of its requests is held open at a proxy (so it dies
//!   mid-attempt) — each restarted;
//! * a restart of RabbitMQ and of PostgreSQL (the private ones);
//! * the platform's RabbitMQ node losing its state (stop_app, reset,
//!   start_app) while jobs and events are in flight: PostgreSQL heals it (the
//!   api re-drives `pending` jobs, the dispatcher reconciles events into
//!   deliveries, issue 24). The receivers' queues are on a node of their
//!   own (they stand for customers), so the reset touches only ours;
//! * receiver A down (process killed, port closed) for a while;
//! * receiver B answering `500` (at its proxy) for a while.
//!
//! Then, with a bounded wait, it checks that every operation succeeded, that
//! every event the api recorded reached both endpoints, that each receiver
//! applied each effect exactly once, that no delivery is left pending, and
//! that the database, the receivers' records, the proxies' records and the
//! API's answers agree; prints a report; exits 1 if any check failed.
//!
//! The same `--seed` gives the same schedule (fault order, times, upload
//! times, restart delays); what the system does in between is of course not
//! deterministic.//!
//! Modules: [`profile`] arguments and sizes; [`schedule`] the seeded plan;
//! [`proxy`] and [`receiver`] the two webhook targets; [`shared`] what the
//! tasks share; [`faults`] injecting them; [`run`] the run; [`checks`] the
//! verification, one check per function; [`report`] what is printed.

mod checks;
mod faults;
mod profile;
mod proxy;
mod receiver;
mod report;
mod run;
mod schedule;
mod shared;
mod util;

use std::time::Instant;

use anyhow::anyhow;
use clap::Parser;

use crate::profile::Args;

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let started = Instant::now();
    let result = tokio::select! {
        r = run::run(args, started) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
        _ = sigterm() => Err(anyhow!("terminated")),
    };
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("chaos: run aborted: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// Resolves on SIGTERM (never, if the handler cannot be installed).
async fn sigterm() {
    if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        s.recv().await;
    } else {
        std::future::pending::<()>().await
    }
}
