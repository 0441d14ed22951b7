//! The run's arguments and sizes (`--small` or full), and the dispatcher
//! settings the run widens.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// Retry schedule the dispatcher uses in the chaos run: the test profile's
/// `[1, 1, 2]` gives up after ~4 s, far shorter than a receiver outage, so the
/// run widens it. 240 s nominal, at least 192 s with −20 % jitter: longer than
/// the longest outage (120 s), so no delivery may end `failed`.
pub(crate) const RETRY_SCHEDULE: &[u64] = &[1, 2, 4, 8, 15, 30, 30, 30, 30, 30, 30, 30];
/// The dispatcher's claim lease in the run (default: connect + request timeout + 15 s).
pub(crate) const LEASE_MS: u64 = 35_000;

/// Healing from PostgreSQL (issue 24) at the run's pace, as `VID__…` settings:
/// the api's janitor passes every 2 s and re-drives a job still `pending`
/// 10 s after it was published (a job takes about a second here; the
/// transcoder is down at most a few seconds), up to 30 times, and fails it as
/// `job_lost` only past 600 s (longer than the run: a lost job must heal, not
/// fail). The dispatcher reconciles events older than 10 s every 2 s (the
/// default 300 s / 60 s would outlast the run's bounded waits).
pub(crate) const HEALING: &[(&str, &str)] = &[
    ("VID__OPERATIONS__JANITOR_INTERVAL_SECONDS", "2"),
    ("VID__OPERATIONS__REDRIVE_AFTER_SECONDS", "10"),
    ("VID__OPERATIONS__MAX_REDRIVES", "30"),
    ("VID__OPERATIONS__JOB_LOST_AFTER_SECONDS", "600"),
    ("VID__DISPATCHER__RECONCILE_GRACE_SECONDS", "10"),
    ("VID__DISPATCHER__RECONCILE_INTERVAL_SECONDS", "2"),
];

#[derive(Parser, Debug)]
#[command(name = "chaos", about = "The chaos run (issue 11); use scripts/chaos.sh, which prepares its private PostgreSQL and RabbitMQ")]
pub(crate) struct Args {
    /// Seed of the fault schedule (random when absent; always printed).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// The short version `make test` runs (6 uploads, shorter outages).
    #[arg(long)]
    pub(crate) small: bool,
    /// Number of uploads (default 50, or 6 with --small: one pinned to each
    /// fault that needs work in flight, two to the reset).
    #[arg(long)]
    pub(crate) uploads: Option<usize>,
    /// The platform's (migrated) database.
    #[arg(long)]
    pub(crate) database_url: String,
    /// The platform's RabbitMQ.
    #[arg(long)]
    pub(crate) amqp_url: String,
    /// PostgreSQL server URL (no database) for the receivers' own databases.
    #[arg(long)]
    pub(crate) receiver_db_server: String,
    /// Directory of this run (logs go to `<run-dir>/logs`).
    #[arg(long)]
    pub(crate) run_dir: PathBuf,
    /// Shell command restarting the platform's PostgreSQL.
    #[arg(long)]
    pub(crate) postgres_restart_cmd: Option<String>,
    /// Why the PostgreSQL restart is skipped.
    #[arg(long)]
    pub(crate) skip_postgres_restart: Option<String>,
    /// Shell command restarting the platform's RabbitMQ.
    #[arg(long)]
    pub(crate) rabbitmq_restart_cmd: Option<String>,
    /// Why the RabbitMQ restart is skipped.
    #[arg(long)]
    pub(crate) skip_rabbitmq_restart: Option<String>,
    /// Shell command wiping the platform's RabbitMQ node (stop_app, reset,
    /// start_app): the "broker loses its state" fault.
    #[arg(long)]
    pub(crate) rabbitmq_reset_cmd: Option<String>,
    /// Why the RabbitMQ reset is skipped.
    #[arg(long)]
    pub(crate) skip_rabbitmq_reset: Option<String>,
    /// The receivers' own RabbitMQ (they stand for customers: the platform's
    /// broker faults must not touch their queues); default `--amqp-url`.
    #[arg(long)]
    pub(crate) receiver_amqp_url: Option<String>,
}

/// Sizes of a run.
#[derive(Debug, Clone)]
pub(crate) struct Profile {
    pub(crate) name: &'static str,
    pub(crate) uploads: usize,
    /// Uploads start within the first 80 % of it; point faults happen within it.
    pub(crate) load: Duration,
    pub(crate) receiver_down: Duration,
    pub(crate) receiver_500: Duration,
    /// Bounded wait for the uploads' operations after the load window.
    pub(crate) ops_timeout: Duration,
    /// Bounded wait for the deliveries once load and faults are over.
    pub(crate) drain_timeout: Duration,
}

impl Profile {
    pub(crate) fn new(args: &Args) -> Profile {
        let mut p = if args.small {
            Profile {
                name: "small",
                uploads: 6,
                load: Duration::from_secs(70),
                receiver_down: Duration::from_secs(25),
                receiver_500: Duration::from_secs(15),
                ops_timeout: Duration::from_secs(120),
                drain_timeout: Duration::from_secs(120),
            }
        } else {
            Profile {
                name: "full",
                uploads: 50,
                load: Duration::from_secs(240),
                receiver_down: Duration::from_secs(120),
                receiver_500: Duration::from_secs(60),
                ops_timeout: Duration::from_secs(300),
                drain_timeout: Duration::from_secs(240),
            }
        };
        if let Some(n) = args.uploads {
            p.uploads = n;
        }
        p
    }
}
