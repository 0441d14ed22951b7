//! The report: one line per check, and what the run did (uploads, faults,
//! deliveries, duplicates).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::faults::FaultRecord;
use crate::profile::Profile;
use crate::util::fmt_t;

/// One check's verdict.
pub(crate) struct Check {
    pub(crate) name: String,
    pub(crate) ok: bool,
    pub(crate) detail: String,
}

/// The checks and the figures the report prints.
#[derive(Default)]
pub(crate) struct Report {
    pub(crate) checks: Vec<Check>,
    pub(crate) uploads: usize,
    pub(crate) accepted: usize,
    pub(crate) succeeded: usize,
    pub(crate) sdk_retries: u32,
    pub(crate) events: usize,
    pub(crate) deliveries: i64,
    pub(crate) attempts: i64,
    pub(crate) attempt_classes: BTreeMap<String, i64>,
    pub(crate) dup_received: BTreeMap<&'static str, (usize, usize)>,
    pub(crate) dup_effects: i64,
    pub(crate) lost: i64,
    pub(crate) max_delivery_secs: f64,
    pub(crate) requests: BTreeMap<&'static str, usize>,
    /// What PostgreSQL healed (issue 24): jobs re-driven, events reconciled.
    pub(crate) healed: String,
}

impl Report {
    /// Records a check: `ok` and, for the report, what was found.
    pub(crate) fn check(&mut self, name: &str, ok: bool, detail: impl Into<String>) {
        self.checks.push(Check { name: name.to_owned(), ok, detail: detail.into() });
    }

    /// Prints the report; answers whether every check passed.
    pub(crate) fn print(&self, p: &Profile, seed: u64, faults: &[FaultRecord], wall: Duration, run_dir: &Path, settled: Duration) -> bool {
        let ok = self.checks.iter().all(|c| c.ok);
        println!();
        println!("=================== chaos report ({} run) ===================", p.name);
        println!("seed            {seed}   (repeat: scripts/chaos.sh{} --seed {seed})", if p.name == "small" { " --small" } else { "" });
        println!(
            "uploads         {} started, {} accepted, {} succeeded ({} SDK calls retried)",
            self.uploads, self.accepted, self.succeeded, self.sdk_retries
        );
        println!("faults injected (time from the start of the load):");
        for f in faults {
            let what = if let Some(s) = &f.skipped {
                format!("SKIPPED: {s}")
            } else if let Some(e) = &f.error {
                format!("ERROR: {e}")
            } else {
                f.detail.clone()
            };
            println!("  {} – {}  {:<40} {what}", fmt_t(f.at), fmt_t(f.ended), f.kind.label());
        }
        println!("events          {} recorded by the api, delivered to 2 endpoints", self.events);
        println!(
            "deliveries      {} ({} attempts, {} retries; attempts by outcome: {})",
            self.deliveries,
            self.attempts,
            self.attempts - self.deliveries,
            self.attempt_classes.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
        );
        println!("requests seen   {}", self.requests.iter().map(|(k, v)| format!("endpoint {k}: {v}")).collect::<Vec<_>>().join(", "));
        println!(
            "duplicates rcvd {}   (requests for an event the receiver had already accepted; harmless)",
            self.dup_received
                .iter()
                .map(|(k, (d, a))| format!("receiver {k}: {d} ({a} answered already_processed)"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!("dup. effects    {}   (must be 0)", self.dup_effects);
        println!("lost events     {}   (must be 0)", self.lost);
        println!("healed          {}", self.healed);
        println!("slowest delivery {:.1} s from event to receipt; settled at {}", self.max_delivery_secs, fmt_t(settled));
        println!("wall time       {:.1} s ({:.1} min)", wall.as_secs_f64(), wall.as_secs_f64() / 60.0);
        println!("checks:");
        for c in &self.checks {
            println!(
                "  [{}] {}{}",
                if c.ok { "PASS" } else { "FAIL" },
                c.name,
                if c.detail.is_empty() { String::new() } else { format!(" — {}", c.detail) }
            );
        }
        println!("logs            {}", run_dir.join("logs").display());
        println!("result          {}", if ok { "PASSED" } else { "FAILED" });
        println!("===============================================================");
        ok
    }
}
