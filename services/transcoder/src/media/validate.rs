//! Limits checked after the probe and before any encoding.

use serde::{Deserialize, Serialize};
use vid_core::Problem;

use super::probe::Probe;
use super::problems::{self, problem};

/// Sources shorter than or equal to this (seconds) are refused.
pub const MIN_DURATION_SECONDS: f64 = 0.1;

/// Configured limits (from `[transcoder]`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Longest accepted duration in seconds.
    pub max_duration_seconds: f64,
    /// Largest accepted coded width in pixels.
    pub max_width: u32,
    /// Largest accepted coded height in pixels.
    pub max_height: u32,
}

/// Checks a probe against `limits`.
///
/// Errors: `dimensions_too_large` (coded width or height over the limit, checked
/// before rotation), `duration_too_short` (≤ 0.1 s), `duration_too_long`. An
/// unknown duration passes here; the transcode enforces both bounds on the
/// decoded timestamps instead.
pub fn validate(probe: &Probe, limits: &Limits) -> Result<(), Problem> {
    let s = &probe.source;
    if s.width > limits.max_width || s.height > limits.max_height {
        return Err(problem(
            problems::DIMENSIONS_TOO_LARGE,
            format!("{}×{} exceeds the limit of {}×{}", s.width, s.height, limits.max_width, limits.max_height),
        ));
    }
    if let Some(d) = s.duration_seconds {
        if d <= MIN_DURATION_SECONDS {
            return Err(problem(
                problems::DURATION_TOO_SHORT,
                format!("the duration is {d:.3} s; more than {MIN_DURATION_SECONDS} s is required"),
            ));
        }
        if d > limits.max_duration_seconds {
            return Err(problem(
                problems::DURATION_TOO_LONG,
                format!("the duration is {d:.1} s; at most {} s is accepted", limits.max_duration_seconds),
            ));
        }
    }
    Ok(())
}
