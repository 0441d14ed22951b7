//! Limits checked after the probe and before any encoding, and the decoder's
//! pixel budget derived from them (the transcode re-checks every decoded frame).

use serde::{Deserialize, Serialize};
use vid_core::Problem;

use super::probe::Probe;
use crate::problems::{self, problem};

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

impl Limits {
    /// Whether a `width`×`height` picture (pixels, coded size before rotation)
    /// is over the limits: `width > max_width` or `height > max_height`.
    pub fn exceeded_by(&self, width: u32, height: u32) -> bool {
        width > self.max_width || height > self.max_height
    }

    /// The pixel budget handed to the video decoder as its `max_pixels`
    /// AVOption (`AVCodecContext.max_pixels`), so libavcodec itself refuses to
    /// allocate a frame bigger than the limits allow — the memory and CPU
    /// bound does not depend on our per-frame check, which runs only after a
    /// frame was decoded.
    ///
    /// Unit: pixels. Value: `(align128(max_width) + 64) × max(max_height, 280)`,
    /// at most `i32::MAX` (the option's range, and its default). The slack over
    /// `max_width × max_height` is what libavcodec 5.1 itself asks for when a
    /// frame is exactly at the limits: `ff_get_buffer` checks the width rounded
    /// up to its stride alignment (64), and the MPEG-1/2/4 decoders check a
    /// scratch buffer of `align128(width) + 64` by 280 rows. At the default
    /// 4096×4096 that is 4160 × 4096 (1.6 % over); the exact cap is enforced on
    /// every decoded frame in [`crate::media::transcode()`].
    pub fn decoder_max_pixels(&self) -> i64 {
        let w = u64::from(self.max_width).div_ceil(128) * 128 + 64;
        let h = u64::from(self.max_height).max(280);
        w.saturating_mul(h).min(i32::MAX as u64) as i64
    }
}

/// Checks a probe against `limits`.
///
/// Errors: `dimensions_too_large` (coded width or height in the stream header
/// over the limit, checked before rotation, for the coded and the displayed
/// size), `duration_too_short` (≤ 0.1 s),
/// `duration_too_long`. An unknown duration passes here; the transcode enforces
/// both bounds on the decoded timestamps instead. A header within the limits
/// does not vouch for the frames: the size can change mid-stream, so the
/// transcode checks every decoded frame too (and the decoder refuses frames
/// over [`Limits::decoder_max_pixels`]).
pub fn validate(probe: &Probe, limits: &Limits) -> Result<(), Problem> {
    let s = &probe.source;
    if limits.exceeded_by(s.width, s.height) {
        return Err(problem(
            problems::DIMENSIONS_TOO_LARGE,
            format!("{}×{} exceeds the limit of {}×{}", s.width, s.height, limits.max_width, limits.max_height),
        ));
    }
    // The renditions are planned from the display size (coded width × sample
    // aspect ratio): a small picture with an absurd SAR (320×240 at 20:1 shows
    // as 6400×240) would otherwise ask for outputs far over the limits.
    let (dw, dh) = if matches!(s.rotation.rem_euclid(360), 90 | 270) {
        (probe.display_height, probe.display_width)
    } else {
        (probe.display_width, probe.display_height)
    };
    if limits.exceeded_by(dw, dh) {
        return Err(problem(
            problems::DIMENSIONS_TOO_LARGE,
            format!(
                "{}×{} is displayed at {dw}×{dh} (its sample aspect ratio), which exceeds the limit of {}×{}",
                s.width, s.height, limits.max_width, limits.max_height
            ),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(w: u32, h: u32) -> Limits {
        Limits { max_duration_seconds: 60.0, max_width: w, max_height: h }
    }

    #[test]
    fn exceeded_by_checks_each_side() {
        let l = limits(4096, 4096);
        assert!(!l.exceeded_by(4096, 4096));
        assert!(l.exceeded_by(4097, 64));
        assert!(l.exceeded_by(64, 4097));
    }

    #[test]
    fn decoder_budget_covers_libavcodec_padding_and_is_clamped() {
        assert_eq!(limits(4096, 4096).decoder_max_pixels(), 4160 * 4096);
        assert!(limits(4096, 4096).decoder_max_pixels() < 8192 * 8192);
        // Small caps: the MPEG scratch buffer (448 × 280 for 320 wide) dominates.
        assert_eq!(limits(320, 240).decoder_max_pixels(), 448 * 280);
        assert_eq!(limits(300, 240).decoder_max_pixels(), 448 * 280);
        assert_eq!(limits(u32::MAX, u32::MAX).decoder_max_pixels(), i64::from(i32::MAX));
    }
}
