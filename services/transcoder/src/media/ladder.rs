//! Rendition ladder planning: a pure function of the upright source size.

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
    fn tiny_sources_get_one_rendition_at_their_own_even_size() {
        assert_eq!(dims(&plan(176, 144, &LADDER)), vec![("144p".into(), 176, 144)]);
        assert_eq!(dims(&plan(175, 143, &LADDER)), vec![("142p".into(), 174, 142)]);
        assert_eq!(dims(&plan(1, 1, &LADDER)), vec![("2p".into(), 2, 2)]);
    }
}
