//! The poster: the tallest rung's filtered frame at `min(1 s, duration / 2)`
//! (so upright and square-pixelled), encoded as one MJPEG frame.

use std::path::Path;

use ffmpeg::{codec, encoder, format, frame, Packet, Rational};
use ffmpeg_next as ffmpeg;

use super::types::PosterFile;
use crate::media::error::MediaError;
use crate::media::libav::internal;

/// Keeps the latest frame offered until one at or after `at` seconds arrives.
pub(super) struct PosterPicker {
    at: f64,
    frame: Option<frame::Video>,
    done: bool,
}

impl PosterPicker {
    /// A picker for the frame at `at` seconds (stream time).
    pub(super) fn new(at: f64) -> Self {
        Self { at, frame: None, done: false }
    }

    /// Offers a filtered frame of the tallest rung (pts in `tb`).
    pub(super) fn offer(&mut self, f: &frame::Video, tb: Rational) {
        if self.done {
            return;
        }
        let t = f.pts().unwrap_or(0) as f64 * f64::from(tb);
        self.frame = Some(f.clone());
        if t >= self.at {
            self.done = true;
        }
    }

    /// The frame picked, if any was offered.
    pub(super) fn into_frame(self) -> Option<frame::Video> {
        self.frame
    }
}

/// Writes `f` to `path` as a JPEG of its own size. Errors: internal only.
pub(super) fn write(f: &frame::Video, path: &Path) -> Result<PosterFile, MediaError> {
    write_jpeg(f, path)?;
    Ok(PosterFile { path: path.to_owned(), width: f.width(), height: f.height() })
}

fn write_jpeg(f: &frame::Video, path: &Path) -> Result<(), MediaError> {
    let mut scaler = ffmpeg::software::scaling::Context::get(
        f.format(),
        f.width(),
        f.height(),
        format::Pixel::YUVJ420P,
        f.width(),
        f.height(),
        ffmpeg::software::scaling::Flags::BICUBIC,
    )
    .map_err(internal("poster scaler"))?;
    let mut out = frame::Video::empty();
    scaler.run(f, &mut out).map_err(internal("poster scaling"))?;
    let mjpeg = encoder::find(codec::Id::MJPEG).ok_or_else(|| MediaError::Internal("no MJPEG encoder".into()))?;
    let mut enc = codec::context::Context::new_with_codec(mjpeg).encoder().video().map_err(internal("MJPEG context"))?;
    enc.set_width(f.width());
    enc.set_height(f.height());
    enc.set_format(format::Pixel::YUVJ420P);
    enc.set_time_base(Rational(1, 25));
    enc.set_flags(codec::Flags::QSCALE);
    let lambda = 3 * ffmpeg::ffi::FF_QP2LAMBDA;
    enc.set_global_quality(lambda);
    let mut enc = enc.open_as(mjpeg).map_err(internal("opening MJPEG"))?;
    out.set_pts(Some(0));
    // SAFETY: `out` is a valid AVFrame owned here.
    unsafe { (*out.as_mut_ptr()).quality = lambda };
    enc.send_frame(&out).map_err(internal("MJPEG send_frame"))?;
    enc.send_eof().map_err(internal("MJPEG flush"))?;
    let mut pkt = Packet::empty();
    enc.receive_packet(&mut pkt).map_err(internal("MJPEG receive_packet"))?;
    let data = pkt.data().ok_or_else(|| MediaError::Internal("empty JPEG".into()))?;
    std::fs::write(path, data).map_err(|e| MediaError::Internal(format!("writing {}: {e}", path.display())))?;
    Ok(())
}
