//! Bounded waits for a dependency at start-up.
//!
//! A container often starts before its database: rather than exiting at the
//! first refused connection (and crash-looping under its orchestrator), a
//! service retries for a bounded time, saying at each try what it waits for
//! and why, then gives up with the last error.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

/// First pause between tries; it doubles up to [`MAX_PAUSE`].
pub const FIRST_PAUSE: Duration = Duration::from_millis(500);
/// Longest pause between tries.
pub const MAX_PAUSE: Duration = Duration::from_secs(5);

/// Runs `attempt` until it succeeds or `limit` has passed since the first try.
///
/// - `what`: the dependency, for the log lines (e.g. `"PostgreSQL"`).
/// - `limit`: total time allowed; `Duration::ZERO` means a single try.
///
/// Each failure logs a warning with the error and the seconds left; pauses
/// start at [`FIRST_PAUSE`] and double up to [`MAX_PAUSE`] (never past the
/// limit). Returns the first success, or the last error once the limit is
/// reached.
pub async fn wait_for<T, E, F, Fut>(what: &str, limit: Duration, attempt: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Display,
{
    wait_with_pauses(what, limit, (FIRST_PAUSE, MAX_PAUSE), attempt).await
}

async fn wait_with_pauses<T, E, F, Fut>(what: &str, limit: Duration, (first, max): (Duration, Duration), mut attempt: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Display,
{
    let deadline = tokio::time::Instant::now() + limit;
    let mut pause = first;
    let mut tries = 0u32;
    loop {
        tries += 1;
        match attempt().await {
            Ok(value) => {
                if tries > 1 {
                    tracing::info!(dependency = what, tries, "{what} reachable, starting");
                }
                return Ok(value);
            }
            Err(e) => {
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    tracing::error!(dependency = what, tries, error = %e, "{what} still unreachable after {} s; giving up", limit.as_secs());
                    return Err(e);
                }
                let left = deadline - now;
                tracing::warn!(dependency = what, tries, error = %e, seconds_left = left.as_secs(), "waiting for {what}");
                tokio::time::sleep(pause.min(left)).await;
                pause = (pause * 2).min(max);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    const MS: Duration = Duration::from_millis(1);
    const PAUSES: (Duration, Duration) = (Duration::from_millis(20), Duration::from_millis(80));

    #[tokio::test]
    async fn retries_until_success() {
        let calls = AtomicU32::new(0);
        let got = wait_with_pauses("thing", 2000 * MS, PAUSES, || async {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            if n < 3 {
                Err(format!("refused {n}"))
            } else {
                Ok(n)
            }
        })
        .await;
        assert_eq!(got, Ok(3));
    }

    #[tokio::test]
    async fn gives_up_with_the_last_error_at_the_limit() {
        let calls = AtomicU32::new(0);
        let start = std::time::Instant::now();
        let got: Result<(), String> = wait_with_pauses("thing", 300 * MS, PAUSES, || async {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            Err(format!("refused {n}"))
        })
        .await;
        let n = calls.load(Ordering::SeqCst);
        assert_eq!(got, Err(format!("refused {n}")));
        // Pauses 20 + 40 + 80 + 80 + 80 = 300 ms: six tries, fewer when a
        // loaded machine oversleeps, never more.
        assert!((2..=6).contains(&n), "{n} tries");
        let took = start.elapsed();
        assert!(took >= 300 * MS && took < 2000 * MS, "took {took:?}");
    }

    #[tokio::test]
    async fn zero_limit_tries_once() {
        let calls = AtomicU32::new(0);
        let got: Result<(), &str> = wait_with_pauses("thing", Duration::ZERO, PAUSES, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err("refused")
        })
        .await;
        assert_eq!((got, calls.load(Ordering::SeqCst)), (Err("refused"), 1));
    }
}
