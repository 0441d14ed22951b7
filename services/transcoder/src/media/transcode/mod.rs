//! The single-decode ladder transcoder.
//!
//! One demuxer, one video decoder and (optionally) one audio decoder feed:
//!
//! ```text
//! video: buffer → [transpose | hflip,vflip] → split=N → scale → [pad] → setsar=1 → format=yuv420p → buffersink  (× N rungs)
//!                                each sink → libx264 encoder → its CMAF track (stream/<rung>/) + its MP4 muxer (unless mp4 is off)
//! audio: abuffer → aresample → aformat=fltp:<rate>:<mono|stereo> → abuffersink(1024 samples)
//!                                → ONE AAC encoder → the audio CMAF track (stream/audio/) + the same packets in every MP4
//! ```
//!
//! Streaming packaging (issue 19) comes from the same packets: every rung is
//! also a CMAF track of one object per segment ([`cmaf`]), with IDR frames at
//! the same instants in every rung (every `segment_seconds`, see
//! [`output::KeyframeClock`]); the audio is its own CMAF track. The
//! playlists are written by [`crate::media::manifest`].
//!
//! Audio is encoded once and shared: every rendition carries the identical
//! AAC track (128 kb/s stereo or 96 kb/s mono), which costs one encode instead
//! of N and keeps the renditions switchable. The storyboard, the thumbnail
//! source frames and the poster are taken from the tallest rung's filtered
//! frames (so upright and square-pixelled) as they go by ([`storyboard`]:
//! the instants, the poster rule), each encoded as a single MJPEG frame.
//!
//! Frame sizes. The probe only saw the stream header, and a stream may change
//! its size mid-stream (a new SPS in H.264, a keyframe of another size in
//! VP8/VP9). So:
//!
//! - the decoder is opened with `max_pixels` = [`Limits::decoder_max_pixels`]:
//!   libavcodec refuses to allocate a bigger frame, and such a refusal (the
//!   decoder's size is then over the limits, or reset to 0×0) fails the job
//!   `dimensions_too_large`;
//! - every decoded frame is checked against `max_width` × `max_height`
//!   (`dimensions_too_large` too), before it reaches the filter graph;
//! - a size (or pixel format) change within the limits rebuilds the video
//!   filter graph for the new frames; they are scaled into the SAME renditions
//!   (the ladder is planned once, from the header): a picture of the probed
//!   display size fills them, any other is fitted inside with its aspect kept
//!   and centred on black bars (letterbox/pillarbox), never stretched.
//!
//! The parts, one file each:
//!
//! - [`graph`]: builds the video and audio filter graphs (pure set-up, no state);
//! - [`decode`]: the video side of the decode loop (timestamps, size checks,
//!   graph rebuilds, progress) and the checks on what was decoded;
//! - [`audio`]: the audio decoder, its graph and the one AAC encoder;
//! - [`output`]: per rung, the x264 encoder and the muxer its packets go to.
//!   The encoder knows nothing of the container: every encoded packet (video,
//!   and the shared audio) goes through [`output::Mp4Muxer`], so a second
//!   packaging of the same packets is one more muxer beside it, never a
//!   second encode;
//! - [`poster`]: writes a frame as a JPEG;
//! - [`storyboard`]: the storyboard sheet, VTT and JSON, the per-instant
//!   frames (`stream/frames/<ms>.jpg`) and the poster;
//! - [`cmaf`]: one CMAF track cut into `init.mp4` + `seg-NNNNN.m4s` objects.

mod audio;
pub mod cmaf;
mod decode;
mod graph;
mod output;
mod poster;
pub mod storyboard;
mod types;

use std::path::Path;

use ffmpeg::{format, Packet};
use ffmpeg_next as ffmpeg;

pub use self::cmaf::{Segment, TrackFiles};
pub use self::types::{Packaging, PosterFile, RenditionFile, StoryboardFiles, StreamFiles, Transcoded, VideoTrack};
use super::error::MediaError;
use super::ladder::Rung;
use super::libav::{is_again, is_positive};
use super::probe::Probe;
use super::validate::Limits;
use crate::problems::{self, problem};

/// Transcodes `input` (already probed and validated) into one CMAF track per
/// rung under `<out_dir>/stream/<name>/` (plus `stream/audio/`), one MP4 per
/// rung in `out_dir` (`<name>.mp4`, unless `packaging.mp4` is false) and
/// `poster.jpg` (also `stream/poster.jpg`), plus the storyboard and the
/// thumbnail frames under `stream/` ([`storyboard`]), decoding the source once.
///
/// `progress` is called with the fraction done (0.0–1.0, finite, non-decreasing)
/// after decoded video frames: decoded timestamp over the probed duration, or
/// bytes read over the file size when the duration is unknown.
///
/// A change of frame size mid-stream within `limits` rebuilds the filter graph
/// and fits the new frames into the same renditions (see the module docs).
///
/// Errors: `dimensions_too_large` (a decoded frame over `limits.max_width` ×
/// `max_height`, or the decoder refused a frame over its pixel budget
/// [`Limits::decoder_max_pixels`]), `corrupt_media` (read errors, i.e.
/// truncation; no decodable frame; many decode errors; decoded video much
/// shorter than the container claims), `duration_too_long` /
/// `duration_too_short` (when the probe did not know the duration), and
/// [`MediaError::Internal`] for encoder/muxer/file-system errors.
pub fn transcode(
    input: &Path,
    out_dir: &Path,
    probe: &Probe,
    rungs: &[Rung],
    limits: &Limits,
    packaging: &Packaging,
    progress: &mut dyn FnMut(f64),
) -> Result<Transcoded, MediaError> {
    super::libav::init();
    assert!(!rungs.is_empty(), "the ladder plan is never empty");
    let mut ictx = format::input(&input).map_err(|e| problem(problems::CORRUPT_MEDIA, format!("cannot open the source: {e}")))?;
    let duration = probe.source.duration_seconds.filter(|d| *d > 0.0);
    let stream_dir = out_dir.join("stream");
    std::fs::create_dir_all(stream_dir.join(storyboard::FRAMES_DIR))
        .map_err(|e| MediaError::Internal(format!("creating {}: {e}", stream_dir.display())))?;
    let board = storyboard::Storyboard::new(&stream_dir, duration, packaging.poster_time, packaging.storyboard);
    let mut video = decode::VideoPath::open(&ictx, probe, rungs, limits, board)?;
    let mut audio = match probe.audio_stream {
        Some(i) => audio::AudioPipe::open(&ictx, i)?,
        None => None,
    };

    let seg = packaging.segment_seconds;
    let mut outputs = Vec::with_capacity(rungs.len());
    for rung in rungs {
        let (timing, a) = ((video.time_base(), video.frame_rate()), audio.as_ref().map(|a| a.encoder()));
        outputs.push(output::Output::open(out_dir, &stream_dir, rung, timing, seg, packaging.mp4, a)?);
    }
    if let Some(a) = audio.as_mut() {
        a.package(&stream_dir.join("audio"), seg)?;
    }

    read_packets(&mut ictx, probe, &mut video, audio.as_mut(), &mut outputs, progress)?;
    video.send_eof();
    video.pump(&ictx, &mut outputs, progress)?;
    let decoded_seconds = video.check_decoded(duration)?;
    video.repeat_held_frame(&mut outputs)?;
    video.flush(&mut outputs)?;
    for out in outputs.iter_mut() {
        out.flush()?;
    }
    if let Some(a) = audio.as_mut() {
        a.finish(&mut outputs)?;
    }

    let audio_track = match audio.as_mut() {
        Some(a) => a.finish_track()?,
        None => None,
    };

    let seconds = duration.unwrap_or(decoded_seconds).max(decoded_seconds.min(duration.unwrap_or(f64::MAX))).max(0.001);
    let end = video.end_pts(decoded_seconds);
    let fps = is_positive(video.frame_rate()).then(|| (video.frame_rate().numerator(), video.frame_rate().denominator()));
    let mut renditions = Vec::with_capacity(outputs.len());
    let mut tracks = Vec::with_capacity(outputs.len());
    for out in outputs {
        let (rung, file, track) = out.finish(seconds, end)?;
        renditions.extend(file);
        tracks.push(VideoTrack { name: rung.name, width: rung.width, height: rung.height, frame_rate: fps, track });
    }
    let stream_poster = stream_dir.join("poster.jpg");
    let (storyboard, poster) = match video.into_storyboard().finish(seconds, &stream_poster)? {
        Some((files, mut poster)) => {
            let path = out_dir.join("poster.jpg");
            std::fs::copy(&stream_poster, &path).map_err(|e| MediaError::Internal(format!("copying the poster: {e}")))?;
            poster.path = path;
            (Some(files), Some(poster))
        }
        None => (None, None),
    };
    let stream = StreamFiles { dir: stream_dir, segment_seconds: seg, video: tracks, audio: audio_track, storyboard };
    progress(1.0);
    Ok(Transcoded { renditions, stream, poster, decoded_seconds })
}

/// The demux loop: reads every packet of `ictx` and hands it to the video
/// path or the audio pipe (other streams are skipped). Errors: read errors
/// and packets cut short are `corrupt_media` (truncation), plus whatever the
/// decode paths return.
fn read_packets(
    ictx: &mut format::context::Input,
    probe: &Probe,
    video: &mut decode::VideoPath,
    mut audio: Option<&mut audio::AudioPipe>,
    outputs: &mut [output::Output],
    progress: &mut dyn FnMut(f64),
) -> Result<(), MediaError> {
    loop {
        let mut packet = Packet::empty();
        match packet.read(ictx) {
            Ok(()) => {}
            Err(ffmpeg::Error::Eof) => return Ok(()),
            Err(e) if is_again(&e) => continue,
            Err(e) => {
                let frames = video.frames();
                return Err(problem(
                    problems::CORRUPT_MEDIA,
                    format!("the source is truncated or damaged: read error after {frames} frames: {e}"),
                )
                .into());
            }
        }
        if packet.is_corrupt() {
            // Only the MP4 and Matroska demuxers get here: a packet cut short means truncation.
            return Err(problem(
                problems::CORRUPT_MEDIA,
                format!("the source is truncated: a packet of stream {} is incomplete", packet.stream()),
            )
            .into());
        }
        if packet.stream() == probe.video_stream {
            video.send_packet(&packet)?;
            video.pump(ictx, outputs, progress)?;
        } else if let Some(a) = audio.as_deref_mut().filter(|a| a.stream() == packet.stream()) {
            a.send_packet(&packet, outputs)?;
        }
    }
}
