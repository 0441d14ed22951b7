//! The stable `error.code`s of permanent media failures, and their problem details.
//!
//! Every permanent failure is an RFC 9457 [`Problem`] with status 422 and one of
//! the codes below. Once published a code never changes meaning: the api and
//! its clients branch on it.

use vid_core::Problem;

/// The source object is 0 bytes long.
pub const EMPTY_FILE: &str = "empty_file";
/// Neither the magic bytes nor the demuxer name a container we accept
/// (MP4/MOV/M4V family or Matroska/WebM), or they disagree.
pub const UNSUPPORTED_CONTAINER: &str = "unsupported_container";
/// The container has a video stream whose codec this build cannot decode.
pub const UNSUPPORTED_CODEC: &str = "unsupported_codec";
/// The container has no video stream (audio-only files included; cover art does not count).
pub const NO_VIDEO_STREAM: &str = "no_video_stream";
/// The duration is at most 0.1 s.
pub const DURATION_TOO_SHORT: &str = "duration_too_short";
/// The duration exceeds `transcoder.max_duration_seconds`.
pub const DURATION_TOO_LONG: &str = "duration_too_long";
/// Width or height exceeds `transcoder.max_width` / `max_height`: in the
/// stream header (probe), in any decoded frame (a mid-stream size change), or
/// in a frame the decoder refused to allocate because it was over its pixel
/// budget (`max_pixels`, see `Limits::decoder_max_pixels`).
pub const DIMENSIONS_TOO_LARGE: &str = "dimensions_too_large";
/// The container is one we accept but it is truncated or undecodable.
pub const CORRUPT_MEDIA: &str = "corrupt_media";
/// The worker child process died by a signal (segfault, abort, OOM kill) or panicked.
pub const TRANSCODE_CRASHED: &str = "transcode_crashed";
/// The worker child made no progress for `transcoder.stall_timeout_seconds`, or overran its time budget.
pub const TRANSCODE_STALLED: &str = "transcode_stalled";

/// The human title of `code` (the same for every occurrence).
pub fn title(code: &str) -> &'static str {
    match code {
        EMPTY_FILE => "The uploaded file is empty",
        UNSUPPORTED_CONTAINER => "Unsupported container format",
        UNSUPPORTED_CODEC => "Unsupported video codec",
        NO_VIDEO_STREAM => "No video stream",
        DURATION_TOO_SHORT => "Video too short",
        DURATION_TOO_LONG => "Video too long",
        DIMENSIONS_TOO_LARGE => "Video dimensions too large",
        CORRUPT_MEDIA => "Corrupt or truncated media",
        TRANSCODE_CRASHED => "The transcoder crashed on this file",
        TRANSCODE_STALLED => "The transcode stalled",
        _ => "Transcode failed",
    }
}

/// A 422 problem with `code`, its [`title`], and `detail`.
pub fn problem(code: &str, detail: impl Into<String>) -> Problem {
    Problem::new(422, code, title(code)).with_detail(detail)
}
