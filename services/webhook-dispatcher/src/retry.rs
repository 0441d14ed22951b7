//! When to try again: the retry schedule, its jitter, and `Retry-After`.
//!
//! Pure functions, no I/O, so every rule is unit-tested here.
//!
//! - After failed attempt `n` (1-based) the delivery waits
//!   `retry_schedule_seconds[n-1]`, multiplied by a uniformly random factor in
//!   `[0.8, 1.2]` (±20 % jitter, so endpoints that failed together do not all
//!   come back at the same second). When the schedule is used up the delivery
//!   is `failed`.
//! - A `Retry-After` answer header (RFC 9110 §10.2.3: `delay-seconds` or an
//!   `HTTP-date`) replaces the jittered value, clamped to
//!   `[schedule value, max(schedule value, 1 h)]`: a receiver may slow us
//!   down by up to an hour per attempt, never speed us up.

use std::time::{Duration, SystemTime};

/// The longest delay a `Retry-After` header can impose on one retry.
pub const RETRY_AFTER_CAP: Duration = Duration::from_secs(3600);

/// Jitter as a fraction of the scheduled delay (±20 %).
pub const JITTER: f64 = 0.2;

/// Parses a `Retry-After` value (RFC 9110 §10.2.3) into a delay from `now`.
///
/// Accepts `delay-seconds` (`1*DIGIT`, e.g. `120`) or an `HTTP-date`
/// (`Sun, 06 Nov 1994 08:49:37 GMT`, and the obsolete RFC 850 and asctime
/// forms, via `httpdate`). A date in the past is a zero delay. Anything else
/// (negative or fractional numbers, garbage) is `None`: ignored.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Saturate absurdly long values instead of refusing them; they are clamped anyway.
        return Some(Duration::from_secs(value.parse::<u64>().unwrap_or(u64::MAX)));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The scheduled (un-jittered) delay after failed attempt `attempt_number`
/// (1-based); `None` when the schedule is exhausted.
pub fn scheduled_delay(schedule_seconds: &[u64], attempt_number: u32) -> Option<Duration> {
    let index = usize::try_from(attempt_number).ok()?.checked_sub(1)?;
    schedule_seconds.get(index).map(|&s| Duration::from_secs(s))
}

/// `base` scaled by `1 - JITTER + 2·JITTER·unit`, where `unit` is a uniform
/// random number in `[0, 1)` (clamped into that range).
pub fn jittered(base: Duration, unit: f64) -> Duration {
    let unit = unit.clamp(0.0, 1.0);
    base.mul_f64(1.0 - JITTER + 2.0 * JITTER * unit)
}

/// The delay before the next attempt after failed attempt `attempt_number`,
/// or `None` when no retry is left.
///
/// `retry_after` is the parsed `Retry-After` of the answer, if any; `unit`
/// the random number for the jitter (see [`jittered`]).
pub fn next_delay(schedule_seconds: &[u64], attempt_number: u32, retry_after: Option<Duration>, unit: f64) -> Option<Duration> {
    let base = scheduled_delay(schedule_seconds, attempt_number)?;
    Some(match retry_after {
        Some(asked) => asked.clamp(base, base.max(RETRY_AFTER_CAP)),
        None => jittered(base, unit),
    })
}

/// The shortest and longest total time from the first attempt to the last
/// one, given the jitter, without `Retry-After` (which can only lengthen
/// each step up to [`RETRY_AFTER_CAP`]).
pub fn horizon(schedule_seconds: &[u64]) -> (Duration, Duration) {
    let total = Duration::from_secs(schedule_seconds.iter().sum());
    (total.mul_f64(1.0 - JITTER), total.mul_f64(1.0 + JITTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    // An example schedule (the production one is read from config/ by
    // `retry_window_of_the_production_schedule`).
    const SCHEDULE: [u64; 12] = [5, 30, 120, 600, 1800, 3600, 7200, 14400, 28800, 43200, 43200, 43200];

    #[test]
    fn schedule_steps_and_exhaustion() {
        assert_eq!(scheduled_delay(&SCHEDULE, 1), Some(Duration::from_secs(5)));
        assert_eq!(scheduled_delay(&SCHEDULE, 12), Some(Duration::from_secs(43200)));
        assert_eq!(scheduled_delay(&SCHEDULE, 13), None);
        assert_eq!(scheduled_delay(&SCHEDULE, 0), None);
        assert_eq!(next_delay(&[1, 1, 2], 4, None, 0.5), None);
        assert_eq!(next_delay(&[1, 1, 2], 4, Some(Duration::from_secs(1)), 0.5), None);
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        let base = Duration::from_secs(100);
        assert_eq!(jittered(base, 0.0), Duration::from_secs(80));
        assert_eq!(jittered(base, 0.5), Duration::from_secs(100));
        assert_eq!(jittered(base, 1.0), Duration::from_secs(120));
        assert_eq!(jittered(base, 7.0), Duration::from_secs(120));
        for i in 0..100 {
            let d = next_delay(&SCHEDULE, 3, None, f64::from(i) / 100.0).unwrap();
            assert!(d >= Duration::from_secs(96) && d <= Duration::from_secs(144), "{d:?}");
        }
    }

    #[test]
    fn retry_after_is_clamped_to_schedule_and_one_hour() {
        let s = [30, 7200];
        // Shorter than the schedule: the schedule wins (no jitter below it).
        assert_eq!(next_delay(&s, 1, Some(Duration::from_secs(2)), 0.0), Some(Duration::from_secs(30)));
        // Within bounds: honoured exactly.
        assert_eq!(next_delay(&s, 1, Some(Duration::from_secs(600)), 0.0), Some(Duration::from_secs(600)));
        // Longer than an hour: capped.
        assert_eq!(next_delay(&s, 1, Some(Duration::from_secs(86_400)), 0.0), Some(RETRY_AFTER_CAP));
        // A step longer than the cap is never shortened.
        assert_eq!(next_delay(&s, 2, Some(Duration::from_secs(60)), 0.0), Some(Duration::from_secs(7200)));
        assert_eq!(next_delay(&s, 2, Some(Duration::from_secs(86_400)), 0.0), Some(Duration::from_secs(7200)));
    }

    #[test]
    fn retry_after_parses_seconds_and_http_dates() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:51:37 GMT", now), Some(Duration::from_secs(120)));
        // RFC 850 and asctime forms (RFC 9110 §5.6.7 obsolete formats).
        assert_eq!(parse_retry_after("Sunday, 06-Nov-94 08:50:37 GMT", now), Some(Duration::from_secs(60)));
        assert_eq!(parse_retry_after("Sun Nov  6 08:50:37 1994", now), Some(Duration::from_secs(60)));
        // In the past: no wait.
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now), Some(Duration::ZERO));
        for bad in ["", "-5", "1.5", "soon", "120s"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
        assert!(parse_retry_after("99999999999999999999999", now).is_some());
    }

    #[test]
    fn horizon_adds_up_the_schedule() {
        let (lo, hi) = horizon(&[100, 200]);
        assert_eq!(lo, Duration::from_secs(240));
        assert_eq!(hi, Duration::from_secs(360));
    }

    /// Issue 5: retries continue for at least 24 h and at most 48 h. Checks
    /// the schedule in `config/default.toml` with its ±20 % jitter, and
    /// bounds it even when every step takes the longest of its jittered
    /// value and a maximal `Retry-After`.
    #[test]
    fn retry_window_of_the_production_schedule() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config");
        let settings: crate::Settings = vid_infra::settings::load_from(dir, "production").unwrap();
        let schedule = &settings.dispatcher.retry_schedule_seconds;
        let (lo, hi) = horizon(schedule);
        assert!(lo >= Duration::from_secs(24 * 3600), "shortest retry window {lo:?} is under 24 h");
        assert!(hi <= Duration::from_secs(48 * 3600), "longest retry window {hi:?} is over 48 h");
        let worst: Duration = (1..=schedule.len())
            .map(|n| {
                let step = Duration::from_secs(schedule[n - 1]);
                let n = u32::try_from(n).unwrap();
                jittered(step, 1.0).max(next_delay(schedule, n, Some(Duration::MAX), 0.0).unwrap())
            })
            .sum();
        assert!(worst <= Duration::from_secs(48 * 3600), "longest retry window with maximal Retry-After {worst:?} is over 48 h");
    }
}
