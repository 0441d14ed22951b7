//! Storyboard, thumbnail source frames and the poster, all from the tallest
//! rung's filtered frames of the one decode (no second decode, no second
//! graph branch: those frames are already upright, square-pixelled and
//! yuv420p, and scaling 160 px tiles from them costs less than from the source).
//!
//! Instants: `k × interval` seconds from the first frame, `k = 0, 1, …`,
//! each taking the first frame at or after it. The interval
//! ([`interval_ms`]) is `max(1 s, duration / 100)` rounded UP to a half
//! second, so a video has at most 100 instants (a 2 min video: 1.5 s; 1 h:
//! 36 s). When the duration is unknown the interval starts at 1 s and is
//! doubled (every other instant dropped) whenever the count would pass
//! [`MAX_TILES`] = 200.
//!
//! Per instant, kept: one tile ([`TILE_WIDTH`] = 160 px wide, height keeping
//! the aspect, even) in the sprite sheet, and the rung's frame as a JPEG
//! (`frames/<ms>.jpg`, `<ms>` the instant in milliseconds): the sources the
//! playback service resizes thumbnails from. The last frame is kept too (its
//! own `<ms>`), so a time past the end gives the last frame.
//!
//! Written under the stream directory at the end:
//!
//! - `storyboard.jpg`: the tiles in a grid of up to [`MAX_COLUMNS`] = 10
//!   columns, row-major, black where the last row is short;
//! - `storyboard.vtt` (WebVTT): one cue per tile, `start --> end` (the next
//!   instant, the video's end for the last) pointing at
//!   `storyboard.jpg#xywh=x,y,w,h` (W3C Media Fragments §4.2.2; relative, so
//!   it resolves next to the VTT);
//! - `storyboard.json` (Mux's shape): `{"url": "storyboard.jpg", "tile_width",
//!   "tile_height", "duration" (s), "tiles": [{"start" (s), "x", "y"}]}`;
//! - `poster.jpg`: the frame at the job's `poster_time` (the first frame at
//!   or after it; past the end the last frame) or, without one, the instant
//!   in the first third of the video whose tile has the highest luma variance
//!   (a flat black or single-colour opening has variance ~0, so it loses to
//!   any picture with content; ties go to the earlier instant).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use ffmpeg::{format, frame, Rational};
use ffmpeg_next as ffmpeg;

use super::poster::write_jpeg;
use super::types::{PosterFile, StoryboardFiles};
use crate::media::error::MediaError;
use crate::media::libav::internal;

/// Tile width in pixels.
pub const TILE_WIDTH: u32 = 160;
/// Columns of the sprite sheet at most.
pub const MAX_COLUMNS: u32 = 10;
/// Instants at most (the unknown-duration case doubles the interval past it).
pub const MAX_TILES: usize = 200;
/// Directory (under the stream directory) of the per-instant frames.
pub const FRAMES_DIR: &str = "frames";

/// The storyboard interval in milliseconds for a video of `duration`
/// seconds: `max(1 s, duration / 100)` rounded up to a multiple of 500 ms.
/// Unknown (or non-positive) duration: 1000.
pub fn interval_ms(duration: Option<f64>) -> u64 {
    let d = duration.filter(|d| d.is_finite() && *d > 0.0).unwrap_or(0.0);
    let raw = (d * 1000.0 / 100.0).max(1000.0);
    ((raw / 500.0).ceil() as u64) * 500
}

struct Tile {
    ms: u64,
    /// YUV420P planes, packed: Y (w×h), U, V (w/2 × h/2 each).
    yuv: Vec<u8>,
    luma_variance: f64,
}

/// Collects the instants as frames go by.
pub(super) struct Storyboard {
    dir: PathBuf,
    interval_ms: u64,
    origin: Option<i64>,
    tiles: Vec<Tile>,
    next_ms: u64,
    scaler: Option<ffmpeg::software::scaling::Context>,
    tile_size: Option<(u32, u32)>,
    frame_size: (u32, u32),
    /// A reference to the latest frame and its time (ms).
    last: Option<(frame::Video, u64)>,
    /// The poster picker when the job chose a time: (ms, picked reference).
    poster_at: Option<(u64, Option<frame::Video>)>,
    /// False: every frame is ignored and [`Storyboard::finish`] writes nothing.
    enabled: bool,
}

fn referenced(f: &frame::Video) -> Result<frame::Video, MediaError> {
    let mut r = frame::Video::empty();
    // SAFETY: both are valid AVFrames; av_frame_ref adds a reference to f's buffers.
    if unsafe { ffmpeg::ffi::av_frame_ref(r.as_mut_ptr(), f.as_ptr()) } < 0 {
        return Err(MediaError::Internal("av_frame_ref failed (out of memory)".into()));
    }
    Ok(r)
}

impl Storyboard {
    /// A storyboard written under `stream_dir`, instants every
    /// [`interval_ms`]`(duration)`; `poster_time` (seconds, finite, ≥ 0) chooses the poster.
    /// `enabled` false: a storyboard that takes no frame and writes nothing
    /// (the packaging benchmark's control, [`super::Packaging::storyboard`]).
    pub(super) fn new(stream_dir: &Path, duration: Option<f64>, poster_time: Option<f64>, enabled: bool) -> Self {
        let poster_at = poster_time.filter(|t| t.is_finite() && *t >= 0.0).map(|t| ((t * 1000.0).round() as u64, None));
        Self {
            dir: stream_dir.to_owned(),
            interval_ms: interval_ms(duration),
            origin: None,
            tiles: Vec::new(),
            next_ms: 0,
            scaler: None,
            tile_size: None,
            frame_size: (0, 0),
            last: None,
            poster_at,
            enabled,
        }
    }

    /// Offers a filtered frame of the tallest rung (yuv420p, pts in `tb`,
    /// increasing). Errors: internal (scaling, JPEG, file system).
    pub(super) fn offer(&mut self, f: &frame::Video, tb: Rational) -> Result<(), MediaError> {
        if !self.enabled {
            return Ok(());
        }
        let pts = f.pts().unwrap_or(0);
        let origin = *self.origin.get_or_insert(pts);
        let ms = (((pts - origin) as f64 * f64::from(tb)) * 1000.0).round().max(0.0) as u64;
        self.frame_size = (f.width(), f.height());
        if let Some((at, picked)) = self.poster_at.as_mut() {
            if picked.is_none() && ms + 1 >= *at {
                *picked = Some(referenced(f)?);
            }
        }
        // +1 ms: a frame at 1.9999 s is the frame of the 2 s instant.
        if ms + 1 >= self.next_ms {
            let instant = self.next_ms;
            let tile = self.tile(f, instant)?;
            self.tiles.push(tile);
            write_jpeg(f, &self.frame_path(instant))?;
            self.next_ms = instant + self.interval_ms;
            while ms + 1 >= self.next_ms {
                // A gap in the source (VFR): the same frame opens the instants it spans.
                let instant = self.next_ms;
                let tile = self.tile(f, instant)?;
                self.tiles.push(tile);
                write_jpeg(f, &self.frame_path(instant))?;
                self.next_ms += self.interval_ms;
            }
            if self.tiles.len() > MAX_TILES {
                self.double_interval()?;
            }
        }
        self.last = Some((referenced(f)?, ms));
        Ok(())
    }

    fn frame_path(&self, ms: u64) -> PathBuf {
        self.dir.join(FRAMES_DIR).join(format!("{ms}.jpg"))
    }

    /// Drops every other instant (and its frame file), doubling the interval.
    fn double_interval(&mut self) -> Result<(), MediaError> {
        let doubled = self.interval_ms * 2;
        for t in self.tiles.iter().filter(|t| t.ms % doubled != 0) {
            let p = self.frame_path(t.ms);
            std::fs::remove_file(&p).map_err(|e| MediaError::Internal(format!("removing {}: {e}", p.display())))?;
        }
        self.tiles.retain(|t| t.ms % doubled == 0);
        self.interval_ms = doubled;
        self.next_ms = self.tiles.last().map_or(0, |t| t.ms) + doubled;
        Ok(())
    }

    fn tile(&mut self, f: &frame::Video, ms: u64) -> Result<Tile, MediaError> {
        let (tw, th) = *self.tile_size.get_or_insert_with(|| {
            let h = (f64::from(TILE_WIDTH) * f64::from(f.height()) / f64::from(f.width().max(1))).round() as u32;
            (TILE_WIDTH, (h & !1).max(2))
        });
        if self.scaler.is_none() {
            let s = ffmpeg::software::scaling::Context::get(
                f.format(),
                f.width(),
                f.height(),
                format::Pixel::YUV420P,
                tw,
                th,
                ffmpeg::software::scaling::Flags::AREA,
            )
            .map_err(internal("storyboard scaler"))?;
            self.scaler = Some(s);
        }
        let mut small = frame::Video::empty();
        self.scaler.as_mut().unwrap().run(f, &mut small).map_err(internal("storyboard scaling"))?;
        let mut yuv = Vec::with_capacity((tw * th * 3 / 2) as usize);
        for (plane, (w, h)) in [(0, (tw, th)), (1, (tw / 2, th / 2)), (2, (tw / 2, th / 2))] {
            let stride = small.stride(plane);
            let data = small.data(plane);
            for row in 0..h as usize {
                yuv.extend_from_slice(&data[row * stride..row * stride + w as usize]);
            }
        }
        let luma = &yuv[..(tw * th) as usize];
        let mean = luma.iter().map(|&v| f64::from(v)).sum::<f64>() / luma.len() as f64;
        let luma_variance = luma.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / luma.len() as f64;
        Ok(Tile { ms, yuv, luma_variance })
    }

    /// Writes the sheet, the VTT, the JSON, the last frame and the poster
    /// (to `poster_path`, its own size). `duration` (s) ends the last cue.
    /// `None` when no frame was offered. Errors: internal only.
    pub(super) fn finish(mut self, duration: f64, poster_path: &Path) -> Result<Option<(StoryboardFiles, PosterFile)>, MediaError> {
        let Some((last, last_ms)) = self.last.take() else { return Ok(None) };
        let (tw, th) = self.tile_size.expect("a tile was made with the first frame");
        let n = self.tiles.len() as u32;
        let columns = n.min(MAX_COLUMNS);
        let rows = n.div_ceil(columns);
        let duration_ms = ((duration * 1000.0).round() as u64).max(last_ms + 1);

        // The sheet.
        let mut sheet = frame::Video::new(format::Pixel::YUV420P, columns * tw, rows * th);
        for (plane, fill) in [(0, 16u8), (1, 128), (2, 128)] {
            sheet.data_mut(plane).fill(fill);
        }
        for (i, tile) in self.tiles.iter().enumerate() {
            let (cx, cy) = (i as u32 % columns, i as u32 / columns);
            let mut offset = 0usize;
            for (plane, (w, h, div)) in [(0, (tw, th, 1)), (1, (tw / 2, th / 2, 2)), (2, (tw / 2, th / 2, 2))] {
                let stride = sheet.stride(plane);
                let (x0, y0) = ((cx * tw / div) as usize, (cy * th / div) as usize);
                let data = sheet.data_mut(plane);
                for row in 0..h as usize {
                    let at = (y0 + row) * stride + x0;
                    data[at..at + w as usize].copy_from_slice(&tile.yuv[offset..offset + w as usize]);
                    offset += w as usize;
                }
            }
        }
        write_jpeg(&sheet, &self.dir.join("storyboard.jpg"))?;

        // The VTT and the JSON.
        let mut vtt = String::from("WEBVTT\n\n");
        let mut tiles_json = Vec::with_capacity(self.tiles.len());
        for (i, tile) in self.tiles.iter().enumerate() {
            let (x, y) = ((i as u32 % columns) * tw, (i as u32 / columns) * th);
            let end = self.tiles.get(i + 1).map_or(duration_ms, |t| t.ms).max(tile.ms + 1);
            let _ = write!(vtt, "{} --> {}\nstoryboard.jpg#xywh={x},{y},{tw},{th}\n\n", vtt_time(tile.ms), vtt_time(end));
            tiles_json.push(serde_json::json!({"start": tile.ms as f64 / 1000.0, "x": x, "y": y}));
        }
        let json = serde_json::json!({
            "url": "storyboard.jpg",
            "tile_width": tw,
            "tile_height": th,
            "duration": duration_ms as f64 / 1000.0,
            "tiles": tiles_json,
        });
        let write = |name: &str, body: &[u8]| {
            let p = self.dir.join(name);
            std::fs::write(&p, body).map_err(|e| MediaError::Internal(format!("writing {}: {e}", p.display())))
        };
        write("storyboard.vtt", vtt.as_bytes())?;
        write("storyboard.json", &serde_json::to_vec(&json).unwrap_or_default())?;

        // The last frame, unless it is an instant's.
        let mut frames_ms: Vec<u64> = self.tiles.iter().map(|t| t.ms).collect();
        if frames_ms.last() != Some(&last_ms) {
            write_jpeg(&last, &self.frame_path(last_ms))?;
            frames_ms.push(last_ms);
        }

        // The poster.
        let poster_frame = match self.poster_at.take() {
            Some((_, Some(picked))) => Some(picked),
            Some((_, None)) => Some(last),
            None => None,
        };
        match poster_frame {
            Some(f) => write_jpeg(&f, poster_path)?,
            None => {
                let third = duration_ms / 3;
                let best = self
                    .tiles
                    .iter()
                    .enumerate()
                    .filter(|(i, t)| *i == 0 || t.ms <= third)
                    .fold(None::<&Tile>, |best, (_, t)| match best {
                        Some(b) if b.luma_variance >= t.luma_variance => Some(b),
                        _ => Some(t),
                    })
                    .expect("at least one tile");
                let from = self.frame_path(best.ms);
                std::fs::copy(&from, poster_path).map_err(|e| MediaError::Internal(format!("copying {}: {e}", from.display())))?;
            }
        }
        let (frame_width, frame_height) = self.frame_size;
        let poster = PosterFile { path: poster_path.to_owned(), width: frame_width, height: frame_height };

        let mut objects: Vec<(String, String)> =
            frames_ms.iter().map(|ms| (format!("{FRAMES_DIR}/{ms}.jpg"), "image/jpeg".to_owned())).collect();
        objects.push(("storyboard.jpg".into(), "image/jpeg".into()));
        objects.push(("storyboard.vtt".into(), "text/vtt".into()));
        objects.push(("storyboard.json".into(), "application/json".into()));
        objects.push(("poster.jpg".into(), "image/jpeg".into()));
        let files = StoryboardFiles {
            interval_ms: self.interval_ms,
            tile_width: tw,
            tile_height: th,
            columns,
            rows,
            tiles_ms: self.tiles.iter().map(|t| t.ms).collect(),
            frames_ms,
            frame_width,
            frame_height,
            duration_ms,
            objects,
        };
        Ok(Some((files, poster)))
    }
}

/// `HH:MM:SS.mmm` (WebVTT §6.1 timestamps).
fn vtt_time(ms: u64) -> String {
    format!("{:02}:{:02}:{:02}.{:03}", ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_keeps_a_video_under_a_hundred_instants() {
        assert_eq!(interval_ms(None), 1000);
        assert_eq!(interval_ms(Some(10.0)), 1000);
        assert_eq!(interval_ms(Some(120.0)), 1500);
        assert_eq!(interval_ms(Some(3600.0)), 36000);
        assert_eq!(interval_ms(Some(101.0)), 1500);
        for d in [1.0, 99.0, 150.5, 1234.5, 14400.0] {
            let n = (d * 1000.0 / interval_ms(Some(d)) as f64).ceil();
            assert!(n <= 100.0, "{d} s: {n} instants");
        }
        assert_eq!(vtt_time(3_723_004), "01:02:03.004");
    }
}
