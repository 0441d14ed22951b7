//! Where a phase's CPU time went, from `/proc` (Linux; elsewhere every
//! figure reads 0): PostgreSQL's processes (owned by the `postgres` user),
//! RabbitMQ's (owned by `rabbitmq`), this process (the in-process
//! dispatchers, the receiver and the publisher), and the whole machine
//! (`/proc/stat`'s first line: busy, idle, steal). Read before and after a
//! phase, divided by what the phase did (deliveries, messages, requests),
//! so a run shows how much CPU a delivery costs each part, on the machine
//! it ran on, and how many deliveries/s the cores could carry at that cost.
//!
//! Times in `/proc/<pid>/stat` and `/proc/stat` are in `USER_HZ` ticks,
//! 100 per second on every Linux architecture the project builds for
//! (proc(5)). A process's time includes its exited, waited-for children's
//! (`cutime`, `cstime`): a PostgreSQL backend that exits in the phase moves
//! its time to the postmaster, in the same group.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
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

/// The uid of `user` in `/etc/passwd`, if any.
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
        let (pg, mq) = (uid_of("postgres"), uid_of("rabbitmq"));
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
            // cpu user nice system idle iowait irq softirq steal guest guest_nice
            let v: Vec<u64> = cpu.split_whitespace().skip(1).map(|x| x.parse().unwrap_or(0)).collect();
            let at = |i: usize| v.get(i).copied().unwrap_or(0);
            s.busy = at(0) + at(1) + at(2) + at(5) + at(6);
            s.idle = at(3) + at(4);
            s.steal = at(7);
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

/// Milliseconds of CPU per item: `seconds / n`.
pub(crate) fn per(seconds: f64, n: usize) -> f64 {
    1e3 * seconds / n.max(1) as f64
}

impl Use {
    /// CPU the machine's busy time left to everything but PostgreSQL,
    /// RabbitMQ and this process (e.g. wrk, the kernel's own threads), seconds.
    pub(crate) fn rest(&self) -> f64 {
        (self.busy - self.postgres - self.rabbitmq - self.this).max(0.0)
    }

    /// `busy 93 %, idle 4 %, steal 3 % of the machine's time`: shares of all cores' time.
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
    /// ms, and the rate the machine's cores would carry at that busy time per
    /// delivery (`cores` from [`cores`]).
    pub(crate) fn per_delivery(&self, n: usize, cores: usize) -> String {
        let busy = per(self.busy, n);
        format!(
            "PostgreSQL {:.3} ms, RabbitMQ {:.3} ms, this process (dispatcher, receiver, publisher) {:.3} ms, rest {:.3} ms = {busy:.3} ms busy a delivery ({}); {cores} cores at that cost: {:.0} deliveries/s",
            per(self.postgres, n),
            per(self.rabbitmq, n),
            per(self.this, n),
            per(self.rest(), n),
            self.machine(),
            cores as f64 * 1e3 / busy.max(1e-9)
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
        // pid (comm with ") x" inside) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime …
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 10 0 0 0 7 5 3 2 20 0 1 0";
        assert_eq!(ticks(stat, false), 12);
        assert_eq!(ticks(stat, true), 17);
        assert_eq!(ticks("garbage", true), 0);
    }
}
