//! The seeded schedule: which fault happens when, and when each upload
//! starts. Everything random about a run comes from the seed alone.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::profile::{Args, Profile};
use crate::util::fmt_t;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum FaultKind {
    KillApi,
    KillTranscoder,
    KillDispatcher,
    RestartRabbitmq,
    /// The platform's RabbitMQ node loses its state (stop_app, reset, start_app).
    ResetRabbitmq,
    RestartPostgres,
    ReceiverDown,
    Receiver500,
}

impl FaultKind {
    /// Every kind of fault.
    pub(crate) const ALL: [FaultKind; 8] = [
        FaultKind::KillApi,
        FaultKind::KillTranscoder,
        FaultKind::KillDispatcher,
        FaultKind::RestartRabbitmq,
        FaultKind::ResetRabbitmq,
        FaultKind::RestartPostgres,
        FaultKind::ReceiverDown,
        FaultKind::Receiver500,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            FaultKind::KillApi => "SIGKILL api, restart",
            FaultKind::KillTranscoder => "SIGKILL transcoder mid-job, restart",
            FaultKind::KillDispatcher => "SIGKILL dispatcher mid-attempt, restart",
            FaultKind::RestartRabbitmq => "restart RabbitMQ",
            FaultKind::ResetRabbitmq => "RabbitMQ loses its state (reset)",
            FaultKind::RestartPostgres => "restart PostgreSQL",
            FaultKind::ReceiverDown => "receiver A down",
            FaultKind::Receiver500 => "receiver B answers 500",
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Planned {
    pub(crate) kind: FaultKind,
    /// Since the start of the load.
    pub(crate) at: Duration,
    /// Kills: how long the service stays down. Windows: how long they last.
    pub(crate) length: Duration,
}

#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    pub(crate) uploads: Vec<PlannedUpload>,
    pub(crate) faults: Vec<Planned>,
}

#[derive(Debug, Clone)]
pub(crate) struct PlannedUpload {
    /// Since the start of the load.
    pub(crate) at: Duration,
    /// Pinned to a fault: starts this long after that fault actually began
    /// (and not before `at`), so the fault meets its work even if it slipped.
    pub(crate) after: Option<(FaultKind, Duration)>,
}

/// Everything random about a run, from the seed alone.
pub(crate) fn schedule(seed: u64, p: &Profile) -> Schedule {
    let mut rng = StdRng::seed_from_u64(seed);
    let load = p.load.as_secs_f64();
    let mut uploads: Vec<PlannedUpload> =
        (0..p.uploads).map(|_| PlannedUpload { at: Duration::from_secs_f64(rng.random_range(0.0..load * 0.8)), after: None }).collect();
    // Point faults: a random order, one in each of six equal slots of [10 %, 95 %]
    // of the load window, at a random moment of its slot; so they never overlap.
    let mut kinds = [
        FaultKind::KillApi,
        FaultKind::KillTranscoder,
        FaultKind::KillDispatcher,
        FaultKind::RestartRabbitmq,
        FaultKind::ResetRabbitmq,
        FaultKind::RestartPostgres,
    ];
    kinds.shuffle(&mut rng);
    let (start, end) = (load * 0.10, load * 0.95);
    let slot = (end - start) / kinds.len() as f64;
    let mut faults: Vec<Planned> = kinds
        .iter()
        .enumerate()
        .map(|(i, &kind)| {
            let at = start + slot * i as f64 + rng.random_range(0.0..slot * 0.5);
            // Kills: the service stays down this long. Restarts: the broker or
            // database stays stopped this long before it starts again.
            let length = match kind {
                FaultKind::RestartPostgres | FaultKind::RestartRabbitmq | FaultKind::ResetRabbitmq => {
                    Duration::from_secs_f64(rng.random_range(1.0..5.0))
                }
                _ => Duration::from_secs_f64(rng.random_range(0.5..3.0)),
            };
            Planned { kind, at: Duration::from_secs_f64(at), length }
        })
        .collect();
    // Windows: anywhere in the load window, so they overlap the point faults at random.
    let down = p.receiver_down.as_secs_f64();
    let five = p.receiver_500.as_secs_f64();
    faults.push(Planned {
        kind: FaultKind::ReceiverDown,
        at: Duration::from_secs_f64(rng.random_range(load * 0.05..(load - down).max(load * 0.05 + 1.0))),
        length: p.receiver_down,
    });
    faults.push(Planned {
        kind: FaultKind::Receiver500,
        at: Duration::from_secs_f64(rng.random_range(load * 0.05..(load - five).max(load * 0.05 + 1.0))),
        length: p.receiver_500,
    });
    // Work in flight for the faults that need it, even in a small run: one upload
    // 0.5–2 s after the start of each kill that waits for a job or an attempt
    // and of the reset, which waits for messages in flight (the fault is then
    // already watching for it; a job lasts about a second), and one 1–2 s
    // after the start of each receiver window.
    let pins: Vec<PlannedUpload> = faults
        .iter()
        .filter(|f| !matches!(f.kind, FaultKind::KillApi | FaultKind::RestartRabbitmq | FaultKind::RestartPostgres))
        .map(|f| {
            let delay = Duration::from_secs_f64(rng.random_range(0.5..2.0));
            PlannedUpload { at: f.at + delay, after: Some((f.kind, delay)) }
        })
        .collect();
    // The reset's second upload: its job must wait in the queue once the
    // transcoder is frozen (after the first upload's job is done).
    let mut pins = pins;
    if let Some(reset) = faults.iter().find(|f| f.kind == FaultKind::ResetRabbitmq) {
        let delay = Duration::from_secs_f64(rng.random_range(6.0..9.0));
        pins.push(PlannedUpload { at: reset.at + delay, after: Some((FaultKind::ResetRabbitmq, delay)) });
    }
    for (k, pin) in pins.into_iter().enumerate() {
        if let Some(u) = uploads.get_mut(k) {
            *u = pin;
        }
    }
    uploads.sort_by_key(|u| u.at);
    faults.sort_by_key(|f| f.at);
    Schedule { uploads, faults }
}

pub(crate) fn print_schedule(s: &Schedule, args: &Args) {
    println!("chaos: schedule (times from the start of the load):");
    for f in &s.faults {
        let mut line = format!("  {}  {}", fmt_t(f.at), f.kind.label());
        match f.kind {
            FaultKind::ReceiverDown | FaultKind::Receiver500 => line.push_str(&format!(" for {:.0} s", f.length.as_secs_f64())),
            FaultKind::RestartPostgres if args.skip_postgres_restart.is_some() => line.push_str(" (will be skipped)"),
            FaultKind::RestartRabbitmq if args.skip_rabbitmq_restart.is_some() => line.push_str(" (will be skipped)"),
            FaultKind::ResetRabbitmq if args.skip_rabbitmq_reset.is_some() => line.push_str(" (will be skipped)"),
            FaultKind::RestartPostgres | FaultKind::RestartRabbitmq | FaultKind::ResetRabbitmq => {
                line.push_str(&format!(" (stopped {:.1} s)", f.length.as_secs_f64()))
            }
            _ => line.push_str(&format!(" (down {:.1} s)", f.length.as_secs_f64())),
        }
        println!("{line}");
    }
    if let (Some(first), Some(last)) = (s.uploads.first(), s.uploads.last()) {
        let pinned = s.uploads.iter().filter(|u| u.after.is_some()).count();
        println!(
            "  uploads start between {} and {} ({pinned} of them just after a fault that needs work in flight begins)",
            fmt_t(first.at),
            fmt_t(last.at)
        );
    }
}
