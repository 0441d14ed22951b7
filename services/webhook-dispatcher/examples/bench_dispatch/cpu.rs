//! Where a phase's CPU time went, from `/proc` (Linux; without it nothing
//! is read and the lines say so): PostgreSQL's processes (owned by the
//! `postgres` user in `/etc/passwd`), RabbitMQ's (owned by `rabbitmq`),
//! this process (the in-process dispatchers, the receiver and the
//! publisher), and the whole machine (`/proc/stat`'s first line: busy,
//! idle, steal). Read before and after a phase, divided by what the phase
//! did (deliveries, messages, requests), so a run shows how much CPU a
//! delivery costs each part, on the machine it ran on, and how many
//! deliveries/s the cores could carry at that cost.
//!
//! Limits of the figures:
//! - Times in `/proc/<pid>/stat` and `/proc/stat` are in `USER_HZ` ticks,
//!   100 per second on every Linux architecture the project builds for
//!   (proc(5)), each process's rounded down: a part is good to about one
//!   10 ms tick per process, i.e. 10 ms divided by the items of the phase
//!   ([`resolution`]; 0.0025 ms at 4,000 deliveries, 0.025 ms at 400).
//! - A process's time includes its exited, waited-for children's
//!   (`cutime`, `cstime`): a PostgreSQL backend that exits in the phase
//!   moves its time to the postmaster, in the same group. One that exits
//!   while `/proc` is being read may be missed by that snapshot.
//! - Everything a group's user runs counts (a `psql` of `postgres`, a
//!   second cluster), and so does its idle background (an idle RabbitMQ
//!   here: ~4 % of a core), charged to the phase's items. A user that does
//!   not exist (e.g. a container's mapped uid) reads 0 and its processes'
//!   time falls into "rest"; the report says so ([`missing_users`]).
//! - The windows close at the last receipt: the recording of the last
//!   attempts falls after them.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::sync::LazyLock;
use std::time::Instant;

/// `USER_HZ`: ticks per second in `/proc` (proc(5)).
const TICKS_PER_S: f64 = 100.0;

/// CPU ticks at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Snapshot {
    postgres: u64,
    rabbitmq: u64,
    this: u64,
    /// Machine-wide: user, nice, system, irq, softirq (all cores).
    busy: u64,
    /// Machine-wide: idle and iowait.
    idle: u64,
    /// Machine-wide: time a hypervisor gave this machine's vCPUs to others.
    steal: u64,
    at: Option<Instant>,
}

/// Seconds of CPU each part used between two snapshots, and the wall time.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Use {
    pub(crate) postgres: f64,
    pub(crate) rabbitmq: f64,
    pub(crate) this: f64,
    pub(crate) busy: f64,
    pub(crate) idle: f64,
    pub(crate) steal: f64,
    pub(crate) wall: f64,
}

/// The uids of `postgres` and `rabbitmq`, read once.
static GROUP_UIDS: LazyLock<(Option<u32>, Option<u32>)> = LazyLock::new(|| (uid_of("postgres"), uid_of("rabbitmq")));

/// The uid of `user` in `/etc/passwd`, if any (not NSS).
fn uid_of(user: &str) -> Option<u32> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == user).then_some(())?;
        f.nth(1)?.parse().ok()
    })
}

/// utime + stime (+ cutime + cstime with `children`) of `/proc/<pid>/stat`, in ticks.
fn ticks(stat: &str, children: bool) -> u64 {
    // The command name is in parentheses and may hold spaces: fields count from the last ')'.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return 0 };
    let f: Vec<u64> = rest.split_whitespace().skip(11).take(4).map(|v| v.parse().unwrap_or(0)).collect();
    let own = f.first().copied().unwrap_or(0) + f.get(1).copied().unwrap_or(0);
    if children {
        own + f.get(2).copied().unwrap_or(0) + f.get(3).copied().unwrap_or(0)
    } else {
        own
    }
}

impl Snapshot {
    /// Reads `/proc` now.
    pub(crate) fn take() -> Snapshot {
        let (pg, mq) = *GROUP_UIDS;
        let me = std::process::id();
        let mut s = Snapshot { at: Some(Instant::now()), ..Snapshot::default() };
        let mut by_uid: HashMap<u32, u64> = HashMap::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            if pid == me {
                s.this = ticks(&stat, false);
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            *by_uid.entry(meta.uid()).or_default() += ticks(&stat, true);
        }
        s.postgres = pg.and_then(|u| by_uid.get(&u).copied()).unwrap_or(0);
        s.rabbitmq = mq.and_then(|u| by_uid.get(&u).copied()).unwrap_or(0);
        if let Some(cpu) = std::fs::read_to_string("/proc/stat").ok().and_then(|t| t.lines().next().map(str::to_owned)) {
            (s.busy, s.idle, s.steal) = machine_ticks(&cpu);
        }
        s
    }

    /// What was used from `self` until `later`.
    pub(crate) fn until(&self, later: &Snapshot) -> Use {
        let d = |a: u64, b: u64| b.saturating_sub(a) as f64 / TICKS_PER_S;
        Use {
            postgres: d(self.postgres, later.postgres),
            rabbitmq: d(self.rabbitmq, later.rabbitmq),
            this: d(self.this, later.this),
            busy: d(self.busy, later.busy),
            idle: d(self.idle, later.idle),
            steal: d(self.steal, later.steal),
            wall: match (self.at, later.at) {
                (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
                _ => 0.0,
            },
        }
    }
}

/// `/proc/stat`'s first line (`cpu user nice system idle iowait irq
/// softirq steal guest guest_nice`, all cores, in ticks) as (busy: user +
/// nice + system + irq + softirq, guest time being inside user; idle: idle
/// + iowait; steal).
fn machine_ticks(line: &str) -> (u64, u64, u64) {
    let v: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap_or(0)).collect();
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    (at(0) + at(1) + at(2) + at(5) + at(6), at(3) + at(4), at(7))
}

/// Milliseconds of CPU per item: `seconds / n` (NaN for no items, printed as such).
pub(crate) fn per(seconds: f64, n: usize) -> f64 {
    if n == 0 {
        return f64::NAN;
    }
    1e3 * seconds / n as f64
}

/// What one 10 ms tick is per item over `n` items, in ms: the grain of a
/// part's figure.
pub(crate) fn resolution(n: usize) -> f64 {
    per(1.0 / TICKS_PER_S, n)
}

/// The groups' users missing from `/etc/passwd` (their figures read 0).
pub(crate) fn missing_users() -> Vec<&'static str> {
    let (pg, mq) = *GROUP_UIDS;
    [("postgres", pg), ("rabbitmq", mq)].into_iter().filter(|(_, uid)| uid.is_none()).map(|(u, _)| u).collect()
}

impl Use {
    /// CPU the machine's busy time left to everything but PostgreSQL,
    /// RabbitMQ and this process (e.g. wrk, the kernel's own threads),
    /// seconds; signed: the tick rounding can make it slightly negative.
    pub(crate) fn rest(&self) -> f64 {
        self.busy - self.postgres - self.rabbitmq - self.this
    }

    /// `busy 93 %, idle 4 %, steal 3 % of the machine's CPU time`: shares of all cores' time.
    pub(crate) fn machine(&self) -> String {
        let all = (self.busy + self.idle + self.steal).max(1e-9);
        format!(
            "busy {:.0} %, idle {:.0} %, steal {:.0} % of the machine's CPU time",
            100.0 * self.busy / all,
            100.0 * self.idle / all,
            100.0 * self.steal / all
        )
    }

    /// Per-delivery line of a dispatcher phase of `n` deliveries: each part in
    /// ms (± [`resolution`]), and the rate the machine's cores would carry at
    /// that busy time per delivery (`cores` from [`cores`]). Says so instead
    /// when no CPU time was read (no `/proc`, or a window under one tick).
    pub(crate) fn per_delivery(&self, n: usize, cores: usize) -> String {
        if self.busy <= 0.0 || n == 0 {
            return format!("no CPU time read ({n} deliveries; /proc missing or the phase under one tick)");
        }
        let busy = per(self.busy, n);
        format!(
            "PostgreSQL {:.3} ms, RabbitMQ {:.3} ms, this process (dispatcher, receiver, publisher) {:.3} ms, rest {:.3} ms = {busy:.3} ms busy a delivery (each ± {:.4} ms a process; {}); {cores} cores at that cost: {:.0} deliveries/s",
            per(self.postgres, n),
            per(self.rabbitmq, n),
            per(self.this, n),
            per(self.rest(), n),
            resolution(n),
            self.machine(),
            cores as f64 * 1e3 / busy
        )
    }
}

/// Logical CPUs the machine schedules on (`/proc/stat`'s `cpuN` lines; 1 if unreadable).
pub(crate) fn cores() -> usize {
    std::fs::read_to_string("/proc/stat")
        .map(|t| t.lines().filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit)).count())
        .unwrap_or(1)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_count_from_the_last_parenthesis() {
        // pid (comm, here "a) b (c", with parentheses and spaces) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime …
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 10 0 0 0 7 5 3 2 20 0 1 0";
        assert_eq!(ticks(stat, false), 12);
        assert_eq!(ticks(stat, true), 17);
        assert_eq!(ticks("garbage", true), 0);
    }

    #[test]
    fn the_machine_line_splits_into_busy_idle_steal() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        assert_eq!(machine_ticks("cpu  100 2 30 400 5 6 7 8 9 10"), (100 + 2 + 30 + 6 + 7, 400 + 5, 8));
        assert_eq!(machine_ticks("cpu 1 2"), (3, 0, 0), "missing fields read 0");
    }

    #[test]
    fn per_item_figures() {
        assert_eq!(per(2.0, 4_000), 0.5);
        assert!(per(1.0, 0).is_nan(), "no items: no figure");
        assert_eq!(resolution(4_000), 0.0025);
        let u = Use { postgres: 1.0, rabbitmq: 0.5, this: 0.75, busy: 2.0, ..Use::default() };
        assert_eq!(u.rest(), -0.25, "signed: the parts' ticks can exceed the machine's");
        assert!(Use::default().per_delivery(100, 2).starts_with("no CPU time read"));
    }
}
