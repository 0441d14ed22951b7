//! The transcoder's stable `error.code`s: every code its `Failed` reports can
//! carry is registered here, once, with its HTTP status, its title and one line
//! of meaning. Nothing else in the crate writes a code as a string.
//!
//! Every failure is an RFC 9457 [`Problem`] built by [`problem`] from a [`Code`].
//! Once published a code never changes meaning: the api and its clients branch
//! on it. (The api's own codes, e.g. `transcode_retries_exhausted`, live in the api.)

use vid_core::Problem;

/// One stable error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Code {
    /// The problem's `code` member, snake_case, e.g. `corrupt_media`.
    pub code: &'static str,
    /// The problem's `status` (an HTTP status code, RFC 9110 §15).
    pub status: u16,
    /// The problem's `title` (RFC 9457 §3.1.3: the same for every occurrence).
    pub title: &'static str,
    /// One line: when the transcoder fails a job with it.
    pub meaning: &'static str,
}

const fn code(code: &'static str, status: u16, title: &'static str, meaning: &'static str) -> Code {
    Code { code, status, title, meaning }
}

/// The source object is 0 bytes long.
pub const EMPTY_FILE: Code = code("empty_file", 422, "The uploaded file is empty", "the source object is 0 bytes long");
/// Neither the magic bytes nor the demuxer name a container we accept, or they disagree.
pub const UNSUPPORTED_CONTAINER: Code = code(
    "unsupported_container",
    422,
    "Unsupported container format",
    "the magic bytes or the demuxer name no container we accept (MP4/MOV/M4V, Matroska/WebM), or they disagree",
);
/// The video stream's codec cannot be decoded by this build.
pub const UNSUPPORTED_CODEC: Code =
    code("unsupported_codec", 422, "Unsupported video codec", "the container has a video stream whose codec this build cannot decode");
/// No video stream (audio-only files included; cover art does not count).
pub const NO_VIDEO_STREAM: Code =
    code("no_video_stream", 422, "No video stream", "the container has no video stream (audio-only included; cover art does not count)");
/// The duration is at most 0.1 s.
pub const DURATION_TOO_SHORT: Code = code("duration_too_short", 422, "Video too short", "the duration is at most 0.1 s");
/// The duration exceeds `transcoder.max_duration_seconds`.
pub const DURATION_TOO_LONG: Code =
    code("duration_too_long", 422, "Video too long", "the probed or decoded duration exceeds transcoder.max_duration_seconds");
/// Width or height over `transcoder.max_width` / `max_height`: in the stream
/// header (probe), in any decoded frame (a mid-stream size change), or in a
/// frame the decoder refused to allocate because it was over its pixel budget
/// (`max_pixels`, see `Limits::decoder_max_pixels`).
pub const DIMENSIONS_TOO_LARGE: Code = code(
    "dimensions_too_large",
    422,
    "Video dimensions too large",
    "width or height over transcoder.max_width/max_height: in the header, in a decoded frame, or refused by the decoder's pixel budget",
);
/// The container is one we accept but it is truncated or undecodable.
pub const CORRUPT_MEDIA: Code =
    code("corrupt_media", 422, "Corrupt or truncated media", "the container is one we accept but it is truncated or undecodable");
/// The worker child process died by a signal (segfault, abort, OOM kill) or panicked.
pub const TRANSCODE_CRASHED: Code = code(
    "transcode_crashed",
    422,
    "The transcoder crashed on this file",
    "the worker child died by a signal (segfault, abort, OOM kill) or panicked",
);
/// The worker child made no progress for `transcoder.stall_timeout_seconds`, or overran its time budget.
pub const TRANSCODE_STALLED: Code = code(
    "transcode_stalled",
    422,
    "The transcode stalled",
    "the worker child made no progress for transcoder.stall_timeout_seconds, or overran its time budget",
);
/// clamd found malware: the source is quarantined and never decoded.
pub const MALWARE_DETECTED: Code =
    code("malware_detected", 422, "Malware detected", "clamd found malware; the source was quarantined and never decoded");
/// The source is over what the scanner accepts (`scanner.stream_max_length_bytes`): fail closed.
pub const FILE_TOO_LARGE_TO_SCAN: Code = code(
    "file_too_large_to_scan",
    413,
    "File too large to scan",
    "the source is larger than scanner.stream_max_length_bytes (clamd's StreamMaxLength); unscanned files are not processed",
);
/// clamd stayed unavailable through every retry of the job.
pub const SCAN_UNAVAILABLE: Code = code(
    "scan_unavailable",
    503,
    "Malware scanner unavailable",
    "clamd stayed unavailable through scanner.retry_attempts retries; the source was not processed",
);

/// Every code, in the order above.
pub const ALL: [Code; 13] = [
    EMPTY_FILE,
    UNSUPPORTED_CONTAINER,
    UNSUPPORTED_CODEC,
    NO_VIDEO_STREAM,
    DURATION_TOO_SHORT,
    DURATION_TOO_LONG,
    DIMENSIONS_TOO_LARGE,
    CORRUPT_MEDIA,
    TRANSCODE_CRASHED,
    TRANSCODE_STALLED,
    MALWARE_DETECTED,
    FILE_TOO_LARGE_TO_SCAN,
    SCAN_UNAVAILABLE,
];

/// The registered code named `code`, if any.
pub fn lookup(code: &str) -> Option<Code> {
    ALL.into_iter().find(|c| c.code == code)
}

/// The problem for `code`: its status, code and title, with `detail`.
pub fn problem(code: Code, detail: impl Into<String>) -> Problem {
    Problem::new(code.status, code.code, code.title).with_detail(detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_snake_case_with_an_error_status() {
        for (i, c) in ALL.iter().enumerate() {
            assert!(c.code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{c:?}");
            assert!((400..600).contains(&c.status), "{c:?}");
            assert!(!c.title.is_empty() && !c.meaning.is_empty(), "{c:?}");
            assert!(ALL[..i].iter().all(|o| o.code != c.code), "duplicate {c:?}");
            assert_eq!(lookup(c.code), Some(*c));
        }
        let p = problem(FILE_TOO_LARGE_TO_SCAN, "d");
        assert_eq!(
            (p.status, p.code.as_str(), p.title.as_str(), p.detail.as_deref()),
            (413, "file_too_large_to_scan", "File too large to scan", Some("d"))
        );
    }
}
