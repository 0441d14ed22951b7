//! libav plumbing every media module shares: process-wide initialisation and
//! the mapping of libav errors. A leaf below `media/`.

use std::sync::Once;

use ffmpeg::Rational;
use ffmpeg_next as ffmpeg;

use super::error::MediaError;

/// Initialises libav once per process and quietens its logging to errors (on stderr).
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        ffmpeg_next::init().expect("libav initialises");
        ffmpeg_next::log::set_level(ffmpeg_next::log::Level::Error);
    });
}

/// An internal error from a libav call: `<what>: <error>`.
pub(crate) fn internal(what: &str) -> impl Fn(ffmpeg::Error) -> MediaError + '_ {
    move |e| MediaError::Internal(format!("{what}: {e}"))
}

/// Whether `e` is `EAGAIN` (libav: "feed more input first").
pub(crate) fn is_again(e: &ffmpeg::Error) -> bool {
    matches!(e, ffmpeg::Error::Other { errno } if *errno == libc::EAGAIN)
}

/// A `Rational` that is usable as a rate or time base (both sides positive).
pub(crate) fn is_positive(r: Rational) -> bool {
    r.numerator() > 0 && r.denominator() > 0
}
