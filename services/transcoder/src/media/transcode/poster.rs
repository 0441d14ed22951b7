//! JPEG writing (one MJPEG frame, quality `qscale` 3) for the poster, the
//! storyboard sheet and the thumbnail source frames; which frame is the
//! poster is [`super::storyboard`]'s rule.

use std::path::Path;

use ffmpeg::{codec, encoder, format, frame, Packet, Rational};
use ffmpeg_next as ffmpeg;

use crate::media::error::MediaError;
use crate::media::libav::internal;

/// Writes `f` (any pixel format swscale reads) to `path` as a JPEG of its
/// own size. Errors: internal only.
pub(super) fn write_jpeg(f: &frame::Video, path: &Path) -> Result<(), MediaError> {
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
