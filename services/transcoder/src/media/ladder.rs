//! Rendition ladder planning (a pure function of the upright source size) and
//! the picture geometry the transcode shares with the probe.

use serde::{Deserialize, Serialize};

/// One planned output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rung {
    /// Name, e.g. `720p` (the rung's short side followed by `p`).
    pub name: String,
    /// Output width in pixels, even.
    pub width: u32,
    /// Output height in pixels, even.
    pub height: u32,
    /// x264 constant rate factor.
    pub crf: u8,
    /// VBV maximum video bitrate in bits per second.
    pub maxrate: u64,
    /// VBV buffer size in bits.
    pub bufsize: u64,
}

/// Rounds to the nearest even number, at least 2.
pub fn even(x: f64) -> u32 {
    (((x / 2.0).round() as i64).max(1) * 2) as u32
}

/// Rounds down to an even number, at least 2.
pub fn even_down(x: u32) -> u32 {
    (x & !1).max(2)
}

/// Plans the ladder for an upright `width`×`height` source.
///
/// A rung value applies to the short side of the picture, so a portrait
/// 1080×1920 phone video gets a `1080p` of 1080×1920 (YouTube's convention).
/// Only rungs whose value is ≤ the source's short side are produced (never
/// upscaled); the long side keeps the aspect ratio, rounded to even and capped
/// at the source's even-rounded long side. A source whose short side is below
/// every rung gets one rendition at its own size rounded down to even.
/// Result: tallest first, no duplicate names. `ladder` is in any order.
pub fn plan(width: u32, height: u32, ladder: &[u32]) -> Vec<Rung> {
    let (w, h) = (width.max(2), height.max(2));
    let landscape = w >= h;
    let (short, long) = if landscape { (h, w) } else { (w, h) };
    let mut values: Vec<u32> = ladder.iter().copied().filter(|r| *r >= 2 && *r <= short).collect();
    values.sort_unstable_by(|a, b| b.cmp(a));
    values.dedup();
    let mut out = Vec::new();
    for r in values {
        let s = even_down(r);
        let l = even(f64::from(r) * f64::from(long) / f64::from(short)).min(even_down(long));
        let (rw, rh) = if landscape { (l, s) } else { (s, l) };
        out.push(rung(format!("{r}p"), rw, rh));
    }
    if out.is_empty() {
        let (rw, rh) = (even_down(w), even_down(h));
        out.push(rung(format!("{}p", rw.min(rh)), rw, rh));
    }
    out
}

/// The upright display size, in pixels, of a `width`×`height` coded picture
/// whose pixels are `sar` wide per unit of height (sample aspect ratio;
/// non-finite or ≤ 0 counts as 1), rotated clockwise by `rotation` degrees:
/// `(round(width × sar), height)`, each at least 1, swapped for 90 and 270.
pub fn display_size(width: u32, height: u32, sar: f64, rotation: i32) -> (u32, u32) {
    let sar = if sar.is_finite() && sar > 0.0 { sar } else { 1.0 };
    let dw = (f64::from(width) * sar).round().clamp(1.0, f64::from(u32::MAX)) as u32;
    let dh = height.max(1);
    if rotation == 90 || rotation == 270 {
        (dh, dw)
    } else {
        (dw, dh)
    }
}

/// The largest even size, in pixels, with the aspect ratio of `width`×`height`
/// that fits inside an even `box_width`×`box_height` box (up- or downscaled);
/// the rest of the box is left for letterbox/pillarbox bars. Each side is
/// even, at least 2 and at most the box's side.
pub fn fit(width: u32, height: u32, box_width: u32, box_height: u32) -> (u32, u32) {
    let (w, h) = (f64::from(width.max(1)), f64::from(height.max(1)));
    let s = (f64::from(box_width) / w).min(f64::from(box_height) / h);
    (even_down(even(w * s).min(box_width)), even_down(even(h * s).min(box_height)))
}

fn rung(name: String, width: u32, height: u32) -> Rung {
    // About 2.5 bits per pixel per second at the cap (1080p ≈ 5.2 Mb/s,
    // 720p ≈ 2.3 Mb/s, 360p ≈ 0.6 Mb/s), never below 200 kb/s.
    let maxrate = ((u64::from(width) * u64::from(height) * 5) / 2).max(200_000);
    Rung { name, width, height, crf: 23, maxrate, bufsize: maxrate * 2 }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LADDER: [u32; 4] = [1080, 720, 480, 360];

    fn dims(r: &[Rung]) -> Vec<(String, u32, u32)> {
        r.iter().map(|r| (r.name.clone(), r.width, r.height)).collect()
    }

    #[test]
    fn full_hd_gets_the_whole_ladder() {
        assert_eq!(
            dims(&plan(1920, 1080, &LADDER)),
            vec![("1080p".into(), 1920, 1080), ("720p".into(), 1280, 720), ("480p".into(), 854, 480), ("360p".into(), 640, 360)]
        );
    }

    #[test]
    fn never_upscales_and_keeps_even_sizes() {
        assert_eq!(dims(&plan(641, 481, &LADDER)), vec![("480p".into(), 640, 480), ("360p".into(), 480, 360)]);
        assert_eq!(dims(&plan(1280, 720, &LADDER))[0], ("720p".into(), 1280, 720));
        for r in plan(1279, 719, &LADDER) {
            assert!(r.width % 2 == 0 && r.height % 2 == 0 && r.width <= 1279 && r.height <= 719, "{r:?}");
        }
    }

    #[test]
    fn portrait_uses_the_short_side() {
        assert_eq!(dims(&plan(1080, 1920, &LADDER))[0], ("1080p".into(), 1080, 1920));
        assert_eq!(dims(&plan(240, 320, &LADDER)), vec![("240p".into(), 240, 320)]);
    }

    #[test]
    fn display_size_applies_sar_and_rotation() {
        assert_eq!(display_size(176, 144, 128.0 / 117.0, 0), (193, 144));
        assert_eq!(display_size(640, 360, 1.0, 90), (360, 640));
        assert_eq!(display_size(640, 360, 1.0, 270), (360, 640));
        assert_eq!(display_size(640, 360, 0.0, 180), (640, 360));
        assert_eq!(display_size(640, 360, f64::NAN, 0), (640, 360));
    }

    #[test]
    fn fit_keeps_the_aspect_inside_the_box() {
        // Wider than the box: full width, bars above and below.
        assert_eq!(fit(480, 120, 320, 240), (320, 80));
        // Taller: full height, bars left and right.
        assert_eq!(fit(120, 480, 320, 240), (60, 240));
        // Same aspect: the whole box, whatever the scale.
        assert_eq!(fit(1280, 720, 640, 360), (640, 360));
        assert_eq!(fit(160, 90, 640, 360), (640, 360));
        // Extreme shapes stay even and at least 2.
        assert_eq!(fit(4100, 2, 320, 240), (320, 2));
    }

    #[test]
    fn tiny_sources_get_one_rendition_at_their_own_even_size() {
        assert_eq!(dims(&plan(176, 144, &LADDER)), vec![("144p".into(), 176, 144)]);
        assert_eq!(dims(&plan(175, 143, &LADDER)), vec![("142p".into(), 174, 142)]);
        assert_eq!(dims(&plan(1, 1, &LADDER)), vec![("2p".into(), 2, 2)]);
    }
}
