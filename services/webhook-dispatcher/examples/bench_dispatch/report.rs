//! The bench's report (the crate docs say what it measures). The lease
//! counters read from this process's metrics page, the ceilings with the
//! CPU they used, and the lines `scripts/bench-dispatch.sh` passes through,
//! the CPU lines among them ([`crate::cpu`]).

use std::time::Duration;

use crate::config::Config;
use crate::cpu::{self, per, Use};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// wrk's figures: requests/s (its own), and the requests the receiver
/// logged with the CPU used meanwhile (from the URL printed to wrk's
/// figure read back: wrk's start and end included).
pub(crate) struct Wrk {
    pub(crate) rps: Option<f64>,
    pub(crate) requests: usize,
    pub(crate) cpu: Use,
}

/// Step 4's figures: sorted publish → receipt latencies, first publish → last
/// receipt (`span`) and → last confirm (`published_in`), deliveries/s over `span`.
pub(crate) struct Burst {
    pub(crate) lat: Vec<Duration>,
    pub(crate) span: Duration,
    pub(crate) published_in: Duration,
    pub(crate) deliveries: usize,
    pub(crate) rate: f64,
    pub(crate) dups: usize,
    /// From the first publish to the last delivery received.
    pub(crate) cpu: Use,
}

/// Step 5's figures: the pace in events/s, events, time to publish them, sorted latencies.
pub(crate) struct Paced {
    pub(crate) rate: f64,
    pub(crate) n: usize,
    pub(crate) elapsed: Duration,
    pub(crate) lat: Vec<Duration>,
    pub(crate) dups: usize,
    /// From the first publish to the last delivery received.
    pub(crate) cpu: Use,
}

/// The dispatcher's lease counters on this process's metrics page
/// (`webhook_deliveries_leased_total{by}`, `webhook_claims_total{result}`;
/// every replica of the run together).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LeaseCounts {
    /// Deliveries the fan-in's insert leased.
    at_fanin: f64,
    /// Deliveries claims leased.
    by_claims: f64,
    /// Claim statements.
    claims: f64,
    /// Claim statements that leased nothing.
    empty_claims: f64,
}

impl LeaseCounts {
    pub(crate) fn read() -> LeaseCounts {
        let page = vid_infra::metrics::render();
        // The sum of the samples of `name` whose labels contain `label`.
        let sum = |name: &str, label: &str| -> f64 {
            page.lines()
                .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        LeaseCounts {
            at_fanin: sum("webhook_deliveries_leased_total", "by=\"fanin\""),
            by_claims: sum("webhook_deliveries_leased_total", "by=\"claim\""),
            claims: sum("webhook_claims_total", "result="),
            empty_claims: sum("webhook_claims_total", "result=\"empty\""),
        }
    }

    pub(crate) fn since(&self, before: &LeaseCounts) -> LeaseCounts {
        LeaseCounts {
            at_fanin: self.at_fanin - before.at_fanin,
            by_claims: self.by_claims - before.by_claims,
            claims: self.claims - before.claims,
            empty_claims: self.empty_claims - before.empty_claims,
        }
    }

    /// `leased 123 at the fan-in (4.5 %), 2,600 by 90 claims (12 of them empty)`.
    fn describe(&self) -> String {
        let all = (self.at_fanin + self.by_claims).max(1.0);
        format!(
            "leased {:.0} at the fan-in ({:.1} %), {:.0} by {:.0} claims ({:.0} of them empty)",
            self.at_fanin,
            100.0 * self.at_fanin / all,
            self.by_claims,
            self.claims,
            self.empty_claims
        )
    }
}

/// Step 3's figures, each with the CPU used while it ran: broker messages/s,
/// database deliveries/s, write floor deliveries/s.
pub(crate) struct Ceilings {
    pub(crate) broker: (f64, Use),
    pub(crate) database: (f64, Use),
    pub(crate) floor: (f64, Use),
}

/// The CPU lines: each dispatcher phase per delivery, each part alone at
/// its floor, and what the machine could carry with every part at its floor.
fn report_cpu(cfg: &Config, wrk: &Wrk, ceilings: &Ceilings, burst: &Burst, paced: &Paced) {
    let cores = cpu::cores();
    println!("CPU a delivery, burst: {}", burst.cpu.per_delivery(burst.deliveries, cores));
    println!("CPU a delivery, paced: {}", paced.cpu.per_delivery(paced.lat.len(), cores));
    // Items a ceiling handled: its rate over the span its CPU was read in.
    let items = |(rate, cpu): &(f64, Use)| (rate * cpu.wall).round() as usize;
    let request = per(wrk.cpu.busy, wrk.requests);
    let (b, f) = (&ceilings.broker.1, &ceilings.floor.1);
    let message = per(b.rabbitmq + b.this, items(&ceilings.broker));
    let write = per(f.postgres + f.this, items(&ceilings.floor));
    println!(
        "CPU at the floors: wrk {request:.3} ms a request (wrk and the receiver; {}); broker {message:.3} ms a message (RabbitMQ {:.3}, this process {:.3}); write floor {write:.3} ms a delivery (PostgreSQL {:.3}, this process {:.3}); database ceiling: PostgreSQL {:.3} ms a delivery",
        wrk.cpu.machine(),
        per(b.rabbitmq, items(&ceilings.broker)),
        per(b.this, items(&ceilings.broker)),
        per(f.postgres, items(&ceilings.floor)),
        per(f.this, items(&ceilings.floor)),
        per(ceilings.database.1.postgres, items(&ceilings.database)),
    );
    let floor = request + message / cfg.endpoints.max(1) as f64 + write;
    // The coarsest grain of the three: one tick a process over the fewest items.
    let grain = cpu::resolution(wrk.requests.min(items(&ceilings.broker)).min(items(&ceilings.floor)));
    println!(
        "every part at its floor: {floor:.3} ms a delivery (a request, a message per {} endpoint(s), the two writes; each part ± {grain:.4} ms a process): {cores} cores carry at most {:.0} deliveries/s",
        cfg.endpoints,
        cores as f64 * 1e3 / floor
    );
    let missing = cpu::missing_users();
    if !missing.is_empty() {
        println!("CPU: no user {} in /etc/passwd: those parts read 0 and their processes count in \"rest\"", missing.join(" or "));
    }
}

/// Prints the report (the lines `scripts/bench-dispatch.sh` passes through). `counts`: attempts
/// without a 200, deliveries not succeeded (-1 if a count failed); `leases`: the lease
/// counters of the burst and of the paced phase.
pub(crate) fn report(
    cfg: &Config,
    wrk: &Wrk,
    ceilings: &Ceilings,
    burst: &Burst,
    paced: &Paced,
    counts: (i64, i64),
    leases: (LeaseCounts, LeaseCounts),
) {
    let Config {
        events,
        endpoints,
        per_endpoint,
        batch,
        max_in_flight,
        prefetch,
        pool,
        publish_concurrency,
        lease_at_fanin,
        lease_ahead,
        replicas,
        ..
    } = *cfg;
    let plan_cache_mode = cfg.plan_cache_mode.as_deref().unwrap_or("auto (default)");
    let ((broker_rate, database_rate, floor_rate), (non_200, not_succeeded), rate) =
        ((ceilings.broker.0, ceilings.database.0, ceilings.floor.0), counts, burst.rate);
    let wrk_rps = wrk.rps;
    println!("settings: endpoints={endpoints} per_endpoint_concurrency={per_endpoint} batch_size={batch} max_in_flight={max_in_flight} prefetch={prefetch} database.pool_size={pool} publish_concurrency={publish_concurrency} plan_cache_mode={plan_cache_mode} lease_at_fanin={lease_at_fanin} lease_ahead={lease_ahead} replicas={replicas} (test profile otherwise: idle_poll_ms=50)");
    println!(
        "burst: {events} events × {endpoints} endpoint(s) = {} deliveries in {:.2} s (all published in {:.2} s = {:.0} events/s)",
        burst.deliveries,
        burst.span.as_secs_f64(),
        burst.published_in.as_secs_f64(),
        events as f64 / burst.published_in.as_secs_f64()
    );
    println!("dispatcher throughput: {rate:.0} deliveries/s (publish → 2xx received)");
    match wrk_rps {
        Some(w) if w > 0.0 => {
            println!("wrk against the same receiver: {w:.0} requests/s; ratio dispatcher/wrk = {:.4} ({:.2} %)", rate / w, 100.0 * rate / w)
        }
        _ => println!("wrk: no figure given on stdin; no ratio"),
    }
    // One message carries an event to every endpoint: the broker's bound in deliveries/s.
    let broker_deliveries = broker_rate * endpoints as f64;
    let bound = broker_deliveries.min(database_rate);
    println!(
        "ceilings in this run: broker {broker_rate:.0} messages/s = {broker_deliveries:.0} deliveries/s at {endpoints} endpoint(s) per event (publish → consume, quorum queue, confirms); database {database_rate:.0} deliveries/s (fan-in + claim + record, no HTTP); dispatcher = {:.1} % of the lower one",
        100.0 * rate / bound
    );
    if let Some(w) = wrk_rps.filter(|w| *w > 0.0) {
        println!(
            "upper bound on the ratio from those ceilings alone: {:.4} ({:.1} % of wrk), before any HTTP, signing or CPU shared between them",
            bound / w,
            100.0 * bound / w
        );
    }
    println!(
        "write floor in this run: {floor_rate:.0} deliveries/s (the durable writes alone: leased rows inserted, successes recorded; no claim, no advisory locks, no reads beyond their key lookups); database ceiling = {:.1} %, dispatcher = {:.1} % of it",
        100.0 * database_rate / floor_rate,
        100.0 * rate / floor_rate
    );
    let (lat, plat) = (&burst.lat, &paced.lat);
    println!(
        "burst latency publish → receipt: p50 {} p99 {} max {}",
        ms(percentile(lat, 50.0)),
        ms(percentile(lat, 99.0)),
        ms(lat.last().copied().unwrap_or_default())
    );
    println!("burst: {}", leases.0.describe());
    println!(
        "paced at {:.0} deliveries/s (half the burst throughput; {} events in {:.2} s): p50 {} p99 {} max {}",
        paced.rate * endpoints as f64,
        paced.n,
        paced.elapsed.as_secs_f64(),
        ms(percentile(plat, 50.0)),
        ms(percentile(plat, 99.0)),
        ms(plat.last().copied().unwrap_or_default())
    );
    println!("paced: {}", leases.1.describe());
    println!(
        "duplicates received: {} (burst) + {} (paced); attempts without a 200: {non_200}; deliveries not succeeded: {not_succeeded}",
        burst.dups, paced.dups
    );
    report_cpu(cfg, wrk, ceilings, burst, paced);
}
