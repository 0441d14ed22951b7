//! The single-decode ladder transcoder.
//!
//! One demuxer, one video decoder and (optionally) one audio decoder feed:
//!
//! ```text
//! video: buffer → [transpose | hflip,vflip] → split=N → scale → [pad] → setsar=1 → format=yuv420p → buffersink  (× N rungs)
//!                                                          each sink → libx264 encoder → its own MP4 muxer
//! audio: abuffer → aresample → aformat=fltp:<rate>:<mono|stereo> → abuffersink(1024 samples)
//!                                                          → ONE AAC encoder → the same packets muxed into every MP4
//! ```
//!
//! Audio is encoded once and shared: every rendition carries the identical
//! AAC track (128 kb/s stereo or 96 kb/s mono), which costs one encode instead
//! of N and keeps the renditions switchable. The poster is taken from the
//! tallest rung's filtered frames (so it is upright and square-pixelled) at
//! `min(1 s, duration / 2)` and encoded as a single MJPEG frame.
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

use std::path::{Path, PathBuf};

use ffmpeg::{codec, encoder, filter, format, frame, Dictionary, Packet, Rational};
use ffmpeg_next as ffmpeg;
use serde::{Deserialize, Serialize};

use super::ladder::Rung;
use super::probe::Probe;
use super::validate::{Limits, MIN_DURATION_SECONDS};
use super::MediaError;
use crate::problems::{self, problem};

/// One rendition written to the local work directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RenditionFile {
    /// Rung name, e.g. `720p`.
    pub name: String,
    /// Width in pixels (even).
    pub width: u32,
    /// Height in pixels (even).
    pub height: u32,
    /// The MP4 file.
    pub path: PathBuf,
    /// File size in bytes.
    pub size_bytes: u64,
    /// Average total bitrate in bits per second (size × 8 / duration).
    pub bitrate: u64,
}

/// The poster written to the local work directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PosterFile {
    /// The JPEG file.
    pub path: PathBuf,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

/// What [`transcode`] produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transcoded {
    /// Renditions, in the order of the plan (tallest first).
    pub renditions: Vec<RenditionFile>,
    /// The poster, unless no frame could be taken.
    pub poster: Option<PosterFile>,
    /// Seconds of video decoded (last minus first timestamp plus one frame).
    pub decoded_seconds: f64,
}

const X264_PRESET: &str = "veryfast";

fn internal(what: &str) -> impl Fn(ffmpeg::Error) -> MediaError + '_ {
    move |e| MediaError::Internal(format!("{what}: {e}"))
}

fn is_again(e: &ffmpeg::Error) -> bool {
    matches!(e, ffmpeg::Error::Other { errno } if *errno == libc::EAGAIN)
}

struct Output {
    rung: Rung,
    path: PathBuf,
    octx: format::context::Output,
    enc: encoder::Video,
    enc_tb: Rational,
    v_ost: usize,
    v_ost_tb: Rational,
    a_ost: Option<(usize, Rational)>,
}

struct AudioPipe {
    stream: usize,
    dec: ffmpeg::decoder::Audio,
    enc: encoder::Audio,
    graph: Option<filter::Graph>,
    rate: u32,
    layout: ffmpeg::ChannelLayout,
    next_pts: i64,
}

/// Transcodes `input` (already probed and validated) into one MP4 per rung in
/// `out_dir` (`<name>.mp4`) plus `poster.jpg`, decoding the source once.
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
    progress: &mut dyn FnMut(f64),
) -> Result<Transcoded, MediaError> {
    super::init();
    assert!(!rungs.is_empty(), "the ladder plan is never empty");
    let mut ictx = format::input(&input).map_err(|e| problem(problems::CORRUPT_MEDIA, format!("cannot open the source: {e}")))?;
    let ist = ictx.stream(probe.video_stream).ok_or_else(|| MediaError::Internal("video stream vanished".into()))?;
    let v_tb = ist.time_base();
    let v_start = if ist.start_time() == ffmpeg::ffi::AV_NOPTS_VALUE { 0 } else { ist.start_time() };
    let v_stream_duration = (ist.duration() > 0).then(|| ist.duration() as f64 * f64::from(v_tb));
    let frame_rate = ist.avg_frame_rate();
    let mut vctx = codec::context::Context::from_parameters(ist.parameters()).map_err(internal("video decoder parameters"))?;
    vctx.set_threading(codec::threading::Config { kind: codec::threading::Type::Frame, count: 0, ..Default::default() });
    let mut vdec = open_video_decoder(vctx, v_tb, limits)?;
    let sar = {
        let r = vdec.aspect_ratio();
        if r.numerator() > 0 && r.denominator() > 0 {
            r
        } else {
            Rational(1, 1)
        }
    };

    let mut audio = match probe.audio_stream {
        Some(i) => open_audio(&ictx, i)?,
        None => None,
    };

    std::fs::create_dir_all(out_dir).map_err(|e| MediaError::Internal(format!("creating {}: {e}", out_dir.display())))?;
    let mut outputs = Vec::with_capacity(rungs.len());
    for rung in rungs {
        outputs.push(open_output(out_dir, rung, v_tb, frame_rate, audio.as_ref().map(|a| &a.enc))?);
    }

    let duration = probe.source.duration_seconds.filter(|d| *d > 0.0);
    let size = probe.source.size_bytes.max(1) as f64;
    let poster_at = duration.map(|d| (d / 2.0).min(1.0)).unwrap_or(1.0);
    let mut poster_frame: Option<frame::Video> = None;
    let mut poster_done = false;

    let mut graph: Option<filter::Graph> = None;
    // The (width, height, pixel format) the current graph was built for.
    let mut graph_input: Option<(u32, u32, format::Pixel)> = None;
    let mut decoded = frame::Video::empty();
    let mut filtered = frame::Video::empty();
    let mut frames = 0u64;
    let mut decode_errors = 0u64;
    let mut packets = 0u64;
    let mut last_pts: Option<i64> = None;
    let mut first_pts: Option<i64> = None;
    // Where the last decoded frame ends (its pts plus its own duration, when
    // the container gives one): a variable-frame-rate source may hold its
    // last frame for seconds, which one frame at the average rate misses.
    let mut last_end: Option<i64> = None;
    // The frame before the last one's pts, and a reference (not a copy) to
    // the last decoded frame: see "A held last frame" below.
    let mut prev_pts: Option<i64> = None;
    let mut held = frame::Video::empty();
    let mut best_fraction = 0.0f64;

    // Pushes the decoded frames out of the decoder, through the graph, into the encoders.
    macro_rules! pump_video {
        () => {{
            loop {
                match vdec.receive_frame(&mut decoded) {
                    Ok(()) => {}
                    Err(e) if is_again(&e) || e == ffmpeg::Error::Eof => break,
                    Err(_) => {
                        decode_errors += 1;
                        if let Some(p) = refused_size(&vdec, limits) {
                            return Err(p.into());
                        }
                        continue;
                    }
                }
                let mut pts = decoded.timestamp().unwrap_or_else(|| last_pts.map_or(0, |p| p + 1));
                if let Some(l) = last_pts {
                    if pts <= l {
                        pts = l + 1;
                    }
                }
                prev_pts = last_pts;
                last_pts = Some(pts);
                last_end = Some(pts + decoded.packet().duration.max(0));
                first_pts.get_or_insert(pts);
                decoded.set_pts(Some(pts));
                // SAFETY: both are valid AVFrames owned by this function;
                // av_frame_ref only adds a reference to the decoded buffers.
                unsafe {
                    ffmpeg::ffi::av_frame_unref(held.as_mut_ptr());
                    if ffmpeg::ffi::av_frame_ref(held.as_mut_ptr(), decoded.as_ptr()) < 0 {
                        return Err(MediaError::Internal("av_frame_ref failed (out of memory)".into()));
                    }
                }
                frames += 1;
                let secs = (pts - v_start) as f64 * f64::from(v_tb);
                let (w, h) = (decoded.width(), decoded.height());
                if limits.exceeded_by(w, h) {
                    return Err(problem(
                        problems::DIMENSIONS_TOO_LARGE,
                        format!(
                            "a decoded frame at {secs:.2} s is {w}×{h}, which exceeds the limit of {}×{}",
                            limits.max_width, limits.max_height
                        ),
                    )
                    .into());
                }
                let input = (w, h, decoded.format());
                if graph_input != Some(input) {
                    if let (Some(g), Some((pw, ph, _))) = (graph.as_mut(), graph_input) {
                        // Everything of the old size goes out before the new graph takes over.
                        tracing::info!(from = %format!("{pw}x{ph}"), to = %format!("{w}x{h}"), at_seconds = secs, "the video changes size or format mid-stream; rebuilding the filter graph");
                        g.get("in").unwrap().source().flush().map_err(internal("flushing the video graph"))?;
                        drain_sinks(g, &mut outputs, &mut filtered, v_tb, poster_at, &mut poster_frame, &mut poster_done)?;
                    }
                    let boxes = placements(w, h, sar, probe, rungs);
                    graph = Some(
                        build_video_graph(&decoded, v_tb, sar, &probe.rotation_filter, &boxes).map_err(internal("video filter graph"))?,
                    );
                    graph_input = Some(input);
                }
                let g = graph.as_mut().unwrap();
                g.get("in")
                    .unwrap()
                    .source()
                    .add(&decoded)
                    .map_err(|e| problem(problems::CORRUPT_MEDIA, format!("the video changes format mid-stream: {e}")))?;
                drain_sinks(g, &mut outputs, &mut filtered, v_tb, poster_at, &mut poster_frame, &mut poster_done)?;

                if secs > limits.max_duration_seconds + 1.0 {
                    return Err(problem(
                        problems::DURATION_TOO_LONG,
                        format!("the decoded video exceeds {} s", limits.max_duration_seconds),
                    )
                    .into());
                }
                let fraction = match duration {
                    Some(d) => secs / d,
                    None => avio_pos(&ictx) as f64 / size,
                };
                if fraction.is_finite() && fraction > best_fraction {
                    best_fraction = fraction.min(1.0);
                }
                progress(best_fraction);
            }
        }};
    }

    loop {
        let mut packet = Packet::empty();
        match packet.read(&mut ictx) {
            Ok(()) => {}
            Err(ffmpeg::Error::Eof) => break,
            Err(e) if is_again(&e) => continue,
            Err(e) => {
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
            packets += 1;
            if vdec.send_packet(&packet).is_err() {
                decode_errors += 1;
                if let Some(p) = refused_size(&vdec, limits) {
                    return Err(p.into());
                }
            }
            pump_video!();
        } else if let Some(a) = audio.as_mut().filter(|a| a.stream == packet.stream()) {
            if a.dec.send_packet(&packet).is_ok() {
                pump_audio(a, &mut outputs, false)?;
            }
        }
    }
    let _ = vdec.send_eof();
    pump_video!();

    if frames == 0 {
        return Err(problem(problems::CORRUPT_MEDIA, format!("no video frame could be decoded ({decode_errors} decode errors)")).into());
    }
    if decode_errors > 3 && decode_errors * 20 > packets {
        return Err(problem(problems::CORRUPT_MEDIA, format!("{decode_errors} of {packets} video packets failed to decode")).into());
    }
    let frame_secs = if frame_rate.numerator() > 0 && frame_rate.denominator() > 0 { 1.0 / f64::from(frame_rate) } else { 0.0 };
    let first = first_pts.unwrap();
    let decoded_seconds =
        ((last_pts.unwrap() - first) as f64 * f64::from(v_tb) + frame_secs).max((last_end.unwrap() - first) as f64 * f64::from(v_tb));
    if duration.is_none() && decoded_seconds <= MIN_DURATION_SECONDS {
        return Err(problem(problems::DURATION_TOO_SHORT, format!("{decoded_seconds:.3} s of video decoded")).into());
    }
    if let Some(expected) = v_stream_duration {
        if decoded_seconds < expected * 0.9 - 0.05 {
            return Err(problem(
                problems::CORRUPT_MEDIA,
                format!("only {decoded_seconds:.2} s of the {expected:.2} s video stream could be decoded"),
            )
            .into());
        }
    }

    // A held last frame: a variable-frame-rate source (a screen recording, a
    // slideshow ending on a still) may show its last frame for seconds. The
    // encoders and the MP4 muxer only see frame start times, so the outputs
    // would end when that frame starts. Sending the same picture again one
    // frame gap before the end keeps it on screen until the source's end.
    if let (Some(g), Some(last), Some(end)) = (graph.as_mut(), last_pts, last_end) {
        let gap = prev_pts.map_or(1, |p| (last - p).max(1));
        if end - last > 2 * gap {
            held.set_pts(Some(end - gap));
            g.get("in").unwrap().source().add(&held).map_err(internal("repeating the held last frame"))?;
            drain_sinks(g, &mut outputs, &mut filtered, v_tb, poster_at, &mut poster_frame, &mut poster_done)?;
        }
    }
    drop(held);

    // Flush the graph and the encoders.
    if let Some(g) = graph.as_mut() {
        g.get("in").unwrap().source().flush().map_err(internal("flushing the video graph"))?;
        drain_sinks(g, &mut outputs, &mut filtered, v_tb, poster_at, &mut poster_frame, &mut poster_done)?;
    }
    for out in outputs.iter_mut() {
        out.enc.send_eof().map_err(internal("flushing x264"))?;
        drain_video(out)?;
    }
    if let Some(a) = audio.as_mut() {
        let _ = a.dec.send_eof();
        pump_audio(a, &mut outputs, true)?;
    }

    let mut renditions = Vec::new();
    let seconds = duration.unwrap_or(decoded_seconds).max(decoded_seconds.min(duration.unwrap_or(f64::MAX))).max(0.001);
    for mut out in outputs {
        out.octx.write_trailer().map_err(internal("writing the MP4 trailer"))?;
        drop(out.octx);
        let size_bytes = std::fs::metadata(&out.path).map_err(|e| MediaError::Internal(format!("stat {}: {e}", out.path.display())))?.len();
        renditions.push(RenditionFile {
            name: out.rung.name.clone(),
            width: out.rung.width,
            height: out.rung.height,
            path: out.path,
            size_bytes,
            bitrate: (size_bytes as f64 * 8.0 / seconds).round() as u64,
        });
    }

    let poster = match poster_frame {
        Some(f) => {
            let path = out_dir.join("poster.jpg");
            write_jpeg(&f, &path)?;
            Some(PosterFile { path, width: f.width(), height: f.height() })
        }
        None => None,
    };
    progress(1.0);
    Ok(Transcoded { renditions, poster, decoded_seconds })
}

fn avio_pos(ictx: &format::context::Input) -> i64 {
    unsafe {
        let pb = (*ictx.as_ptr()).pb;
        if pb.is_null() {
            0
        } else {
            ffmpeg::ffi::avio_seek(pb, 0, libc::SEEK_CUR).max(0)
        }
    }
}

fn open_audio(ictx: &format::context::Input, index: usize) -> Result<Option<AudioPipe>, MediaError> {
    let ist = ictx.stream(index).unwrap();
    let Ok(ctx) = codec::context::Context::from_parameters(ist.parameters()) else { return Ok(None) };
    let mut dec = ctx.decoder();
    dec.set_packet_time_base(ist.time_base());
    let dec = match dec.audio() {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "the audio stream cannot be decoded; the renditions will have no audio");
            return Ok(None);
        }
    };
    let src_rate = dec.rate();
    const AAC_RATES: [u32; 9] = [96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000];
    let rate = if AAC_RATES.contains(&src_rate) { src_rate } else { 48000 };
    let mono = dec.channels() == 1;
    let layout = if mono { ffmpeg::ChannelLayout::MONO } else { ffmpeg::ChannelLayout::STEREO };
    let aac = encoder::find(codec::Id::AAC).ok_or_else(|| MediaError::Internal("no AAC encoder in this FFmpeg".into()))?;
    let mut enc = codec::context::Context::new_with_codec(aac).encoder().audio().map_err(internal("AAC encoder"))?;
    enc.set_rate(rate as i32);
    enc.set_channel_layout(layout);
    enc.set_channels(layout.channels());
    enc.set_format(format::Sample::F32(format::sample::Type::Planar));
    enc.set_bit_rate(if mono { 96_000 } else { 128_000 });
    enc.set_time_base(Rational(1, rate as i32));
    enc.set_flags(codec::Flags::GLOBAL_HEADER);
    let enc = enc.open_as(aac).map_err(internal("opening the AAC encoder"))?;
    Ok(Some(AudioPipe { stream: index, dec, enc, graph: None, rate, layout, next_pts: 0 }))
}

fn open_output(
    out_dir: &Path,
    rung: &Rung,
    v_tb: Rational,
    frame_rate: Rational,
    audio: Option<&encoder::Audio>,
) -> Result<Output, MediaError> {
    let path = out_dir.join(format!("{}.mp4", rung.name));
    let mut octx = format::output_as(&path, "mp4").map_err(internal("creating the MP4 muxer"))?;
    let x264 = encoder::find_by_name("libx264").ok_or_else(|| MediaError::Internal("no libx264 encoder in this FFmpeg".into()))?;
    let mut enc = codec::context::Context::new_with_codec(x264).encoder().video().map_err(internal("x264 context"))?;
    enc.set_width(rung.width);
    enc.set_height(rung.height);
    enc.set_format(format::Pixel::YUV420P);
    enc.set_time_base(v_tb);
    if frame_rate.numerator() > 0 && frame_rate.denominator() > 0 {
        enc.set_frame_rate(Some(frame_rate));
    }
    enc.set_aspect_ratio(Rational(1, 1));
    enc.set_flags(codec::Flags::GLOBAL_HEADER);
    let mut opts = Dictionary::new();
    opts.set("preset", X264_PRESET);
    opts.set("crf", &rung.crf.to_string());
    opts.set("maxrate", &rung.maxrate.to_string());
    opts.set("bufsize", &rung.bufsize.to_string());
    opts.set("profile", "high");
    let enc = enc.open_as_with(x264, opts).map_err(internal("opening libx264"))?;
    let v_ost = {
        let mut ost = octx.add_stream(x264).map_err(internal("adding the video stream"))?;
        ost.set_parameters(&enc);
        ost.set_time_base(v_tb);
        unsafe { (*(*ost.as_mut_ptr()).codecpar).codec_tag = 0 };
        ost.index()
    };
    let a_ost = match audio {
        Some(a) => {
            let mut ost = octx.add_stream(encoder::find(codec::Id::AAC)).map_err(internal("adding the audio stream"))?;
            ost.set_parameters(a);
            ost.set_time_base(a.time_base());
            unsafe { (*(*ost.as_mut_ptr()).codecpar).codec_tag = 0 };
            Some(ost.index())
        }
        None => None,
    };
    let mut hopts = Dictionary::new();
    hopts.set("movflags", "+faststart");
    octx.write_header_with(hopts).map_err(internal("writing the MP4 header"))?;
    let v_ost_tb = octx.stream(v_ost).unwrap().time_base();
    let a_ost = a_ost.map(|i| (i, octx.stream(i).unwrap().time_base()));
    Ok(Output { rung: rung.clone(), path, octx, enc, enc_tb: v_tb, v_ost, v_ost_tb, a_ost })
}

/// Opens the video decoder with `max_pixels` = [`Limits::decoder_max_pixels`],
/// and makes sure libavcodec took it (an option it ignored would silently
/// leave the default budget of `i32::MAX` pixels).
fn open_video_decoder(ctx: codec::context::Context, tb: Rational, limits: &Limits) -> Result<ffmpeg::decoder::Video, MediaError> {
    let mut dec = ctx.decoder();
    dec.set_packet_time_base(tb);
    let Some(codec) = dec.codec().or_else(|| ffmpeg::decoder::find(dec.id())) else {
        return Err(problem(problems::UNSUPPORTED_CODEC, format!("no decoder for video codec {:?}", dec.id())).into());
    };
    let budget = limits.decoder_max_pixels();
    let mut opts = Dictionary::new();
    opts.set("max_pixels", &budget.to_string());
    // The header was validated, so it is within the budget: an open failure here is not about the size.
    let vdec = dec
        .open_as_with(codec, opts)
        .and_then(|o| o.video())
        .map_err(|e| problem(problems::CORRUPT_MEDIA, format!("cannot open the video decoder: {e}")))?;
    let set = unsafe { (*vdec.as_ptr()).max_pixels };
    if set != budget {
        return Err(MediaError::Internal(format!("the video decoder's max_pixels is {set}, not {budget}")));
    }
    Ok(vdec)
}

/// After a decode error: the `dimensions_too_large` problem if the decoder
/// refused a frame size, else `None` (an ordinary decode error).
///
/// libavcodec reports a `max_pixels` refusal with a generic error code
/// (`AVERROR_INVALIDDATA`, `EINVAL` or `ENOMEM`, depending on the codec), but
/// it leaves the refused size in the context (H.264, HEVC: width/height over
/// the limits) or, where `ff_set_dimensions` refused it (VP8, VP9), resets
/// the size to 0×0 — which a decoder opened with the validated, non-zero
/// header size reports for no other reason. libdav1d (AV1) refuses such
/// frames too (its frame size limit is `max_pixels`) but leaves no trace in
/// the context: those count as ordinary decode errors (`corrupt_media` when
/// there are many).
fn refused_size(dec: &ffmpeg::decoder::Video, limits: &Limits) -> Option<vid_core::Problem> {
    let (w, h) = (dec.width(), dec.height());
    let (mw, mh) = (limits.max_width, limits.max_height);
    if limits.exceeded_by(w, h) {
        Some(problem(problems::DIMENSIONS_TOO_LARGE, format!("the decoder refused a {w}×{h} frame, which exceeds the limit of {mw}×{mh}")))
    } else if w == 0 && h == 0 {
        Some(problem(
            problems::DIMENSIONS_TOO_LARGE,
            format!(
                "the decoder refused a change of frame size mid-stream: more than the {} pixels allowed for {mw}×{mh}",
                limits.decoder_max_pixels()
            ),
        ))
    } else {
        None
    }
}

/// Where the frames of one input size go in each rung: `(rung width, rung
/// height, picture width, picture height)` in pixels. A picture of the probed
/// display size fills its rung (the plan was made for it); any other size is
/// fitted inside with its aspect kept ([`super::ladder::fit`]), the rest being
/// black bars.
fn placements(width: u32, height: u32, sar: Rational, probe: &Probe, rungs: &[Rung]) -> Vec<(u32, u32, u32, u32)> {
    let (dw, dh) = super::ladder::display_size(width, height, f64::from(sar), probe.source.rotation);
    let native = (dw, dh) == (probe.display_width, probe.display_height);
    rungs
        .iter()
        .map(|r| {
            let (pw, ph) = if native { (r.width, r.height) } else { super::ladder::fit(dw, dh, r.width, r.height) };
            (r.width, r.height, pw, ph)
        })
        .collect()
}

/// The video filter graph for frames like `first`: `boxes` holds, per rung
/// (in order), `(rung width, rung height, picture width, picture height)`
/// from [`placements`]; a picture smaller than its rung is padded, centred,
/// with black.
fn build_video_graph(
    first: &frame::Video,
    tb: Rational,
    sar: Rational,
    rotation: &str,
    boxes: &[(u32, u32, u32, u32)],
) -> Result<filter::Graph, ffmpeg::Error> {
    let mut g = filter::Graph::new();
    let pix: ffmpeg::ffi::AVPixelFormat = first.format().into();
    let args = format!(
        "video_size={}x{}:pix_fmt={}:time_base={}/{}:pixel_aspect={}/{}",
        first.width(),
        first.height(),
        pix as i32,
        tb.numerator(),
        tb.denominator(),
        sar.numerator(),
        sar.denominator()
    );
    let find = |name: &str| filter::find(name).ok_or(ffmpeg::Error::FilterNotFound);
    g.add(&find("buffer")?, "in", &args)?;
    let mut last = "in".to_owned();
    let link = |g: &mut filter::Graph, a: &str, pa: u32, b: &str| {
        let mut src = g.get(a).expect("filter added above");
        let mut dst = g.get(b).expect("filter added above");
        src.link(pa, &mut dst, 0);
    };
    for (i, f) in rotation.split(',').filter(|s| !s.is_empty()).enumerate() {
        let (name, fargs) = f.split_once('=').unwrap_or((f, ""));
        let id = format!("rot{i}");
        g.add(&find(name)?, &id, fargs)?;
        link(&mut g, &last, 0, &id);
        last = id;
    }
    g.add(&find("split")?, "split", &boxes.len().to_string())?;
    link(&mut g, &last, 0, "split");
    for (i, &(rw, rh, pw, ph)) in boxes.iter().enumerate() {
        let (scale, setsar, fmt, out) = (format!("scale{i}"), format!("setsar{i}"), format!("fmt{i}"), format!("out{i}"));
        g.add(&find("scale")?, &scale, &format!("w={pw}:h={ph}:flags=bicubic"))?;
        g.add(&find("setsar")?, &setsar, "sar=1")?;
        g.add(&find("format")?, &fmt, "pix_fmts=yuv420p")?;
        g.add(&find("buffersink")?, &out, "")?;
        link(&mut g, "split", i as u32, &scale);
        if (pw, ph) == (rw, rh) {
            link(&mut g, &scale, 0, &setsar);
        } else {
            let pad = format!("pad{i}");
            // Even offsets keep the 4:2:0 chroma aligned.
            let (x, y) = (((rw - pw) / 2) & !1, ((rh - ph) / 2) & !1);
            g.add(&find("pad")?, &pad, &format!("w={rw}:h={rh}:x={x}:y={y}:color=black"))?;
            link(&mut g, &scale, 0, &pad);
            link(&mut g, &pad, 0, &setsar);
        }
        link(&mut g, &setsar, 0, &fmt);
        link(&mut g, &fmt, 0, &out);
    }
    g.validate()?;
    Ok(g)
}

#[allow(clippy::too_many_arguments)]
fn drain_sinks(
    g: &mut filter::Graph,
    outputs: &mut [Output],
    filtered: &mut frame::Video,
    tb: Rational,
    poster_at: f64,
    poster: &mut Option<frame::Video>,
    poster_done: &mut bool,
) -> Result<(), MediaError> {
    for (i, out) in outputs.iter_mut().enumerate() {
        let mut sink = g.get(&format!("out{i}")).unwrap();
        loop {
            match sink.sink().frame(filtered) {
                Ok(()) => {}
                Err(e) if is_again(&e) || e == ffmpeg::Error::Eof => break,
                Err(e) => return Err(MediaError::Internal(format!("video filter graph: {e}"))),
            }
            if i == 0 && !*poster_done {
                // Keep the latest frame until one at or after `poster_at` arrives.
                let t = filtered.pts().unwrap_or(0) as f64 * f64::from(tb);
                *poster = Some(filtered.clone());
                if t >= poster_at {
                    *poster_done = true;
                }
            }
            filtered.set_kind(ffmpeg::picture::Type::None);
            out.enc.send_frame(filtered).map_err(internal("x264 send_frame"))?;
            drain_video(out)?;
        }
    }
    Ok(())
}

fn drain_video(out: &mut Output) -> Result<(), MediaError> {
    let mut pkt = Packet::empty();
    loop {
        match out.enc.receive_packet(&mut pkt) {
            Ok(()) => {}
            Err(e) if is_again(&e) || e == ffmpeg::Error::Eof => return Ok(()),
            Err(e) => return Err(MediaError::Internal(format!("x264: {e}"))),
        }
        pkt.set_stream(out.v_ost);
        pkt.rescale_ts(out.enc_tb, out.v_ost_tb);
        pkt.set_position(-1);
        pkt.write_interleaved(&mut out.octx).map_err(internal("muxing video"))?;
    }
}

fn pump_audio(a: &mut AudioPipe, outputs: &mut [Output], eof: bool) -> Result<(), MediaError> {
    let mut decoded = frame::Audio::empty();
    loop {
        match a.dec.receive_frame(&mut decoded) {
            Ok(()) => {}
            Err(e) if is_again(&e) || e == ffmpeg::Error::Eof => break,
            Err(_) => continue,
        }
        if a.graph.is_none() {
            a.graph = Some(
                build_audio_graph(&decoded, a.dec.time_base_or_default(), a.rate, a.layout, a.enc.frame_size())
                    .map_err(internal("audio filter graph"))?,
            );
        }
        let ts = decoded.timestamp();
        decoded.set_pts(ts);
        let g = a.graph.as_mut().unwrap();
        if g.get("ain").unwrap().source().add(&decoded).is_err() {
            continue; // a format change mid-stream: drop the frame rather than the job
        }
        drain_audio_sink(a, outputs)?;
    }
    if eof {
        if let Some(g) = a.graph.as_mut() {
            let _ = g.get("ain").unwrap().source().flush();
            drain_audio_sink(a, outputs)?;
        }
        a.enc.send_eof().map_err(internal("flushing AAC"))?;
        drain_aac(a, outputs)?;
    }
    Ok(())
}

trait TimeBaseOrDefault {
    fn time_base_or_default(&self) -> Rational;
}
impl TimeBaseOrDefault for ffmpeg::decoder::Audio {
    fn time_base_or_default(&self) -> Rational {
        let tb = self.packet_time_base();
        if tb.numerator() > 0 && tb.denominator() > 0 {
            tb
        } else {
            Rational(1, self.rate().max(1) as i32)
        }
    }
}

fn build_audio_graph(
    first: &frame::Audio,
    tb: Rational,
    rate: u32,
    layout: ffmpeg::ChannelLayout,
    frame_size: u32,
) -> Result<filter::Graph, ffmpeg::Error> {
    let mut g = filter::Graph::new();
    let in_layout =
        if first.channel_layout().bits() != 0 { first.channel_layout() } else { ffmpeg::ChannelLayout::default(first.channels() as i32) };
    let args = format!(
        "time_base={}/{}:sample_rate={}:sample_fmt={}:channel_layout=0x{:x}",
        tb.numerator(),
        tb.denominator(),
        first.rate(),
        first.format().name(),
        in_layout.bits()
    );
    let find = |name: &str| filter::find(name).ok_or(ffmpeg::Error::FilterNotFound);
    g.add(&find("abuffer")?, "ain", &args)?;
    g.add(&find("aresample")?, "ares", "")?;
    let lname = if layout == ffmpeg::ChannelLayout::MONO { "mono" } else { "stereo" };
    g.add(&find("aformat")?, "afmt", &format!("sample_fmts=fltp:sample_rates={rate}:channel_layouts={lname}"))?;
    g.add(&find("abuffersink")?, "aout", "")?;
    for (a, b) in [("ain", "ares"), ("ares", "afmt"), ("afmt", "aout")] {
        let mut src = g.get(a).unwrap();
        let mut dst = g.get(b).unwrap();
        src.link(0, &mut dst, 0);
    }
    g.validate()?;
    if frame_size > 0 {
        g.get("aout").unwrap().sink().set_frame_size(frame_size);
    }
    Ok(g)
}

fn drain_audio_sink(a: &mut AudioPipe, outputs: &mut [Output]) -> Result<(), MediaError> {
    let mut f = frame::Audio::empty();
    loop {
        let g = a.graph.as_mut().unwrap();
        let mut sink = g.get("aout").unwrap();
        match sink.sink().frame(&mut f) {
            Ok(()) => {}
            Err(e) if is_again(&e) || e == ffmpeg::Error::Eof => return Ok(()),
            Err(e) => return Err(MediaError::Internal(format!("audio filter graph: {e}"))),
        }
        let sink_tb = sink.sink().time_base();
        // Timestamps in the encoder's 1/rate time base, strictly increasing.
        let mut pts = f.pts().map(|p| ffmpeg::Rescale::rescale(&p, sink_tb, Rational(1, a.rate as i32))).unwrap_or(a.next_pts);
        if pts < a.next_pts {
            pts = a.next_pts;
        }
        a.next_pts = pts + f.samples() as i64;
        f.set_pts(Some(pts));
        a.enc.send_frame(&f).map_err(internal("AAC send_frame"))?;
        drain_aac(a, outputs)?;
    }
}

fn drain_aac(a: &mut AudioPipe, outputs: &mut [Output]) -> Result<(), MediaError> {
    let mut pkt = Packet::empty();
    let enc_tb = Rational(1, a.rate as i32);
    loop {
        match a.enc.receive_packet(&mut pkt) {
            Ok(()) => {}
            Err(e) if is_again(&e) || e == ffmpeg::Error::Eof => return Ok(()),
            Err(e) => return Err(MediaError::Internal(format!("AAC: {e}"))),
        }
        for out in outputs.iter_mut() {
            let Some((idx, tb)) = out.a_ost else { continue };
            let mut p = pkt.clone();
            p.set_stream(idx);
            p.rescale_ts(enc_tb, tb);
            p.set_position(-1);
            p.write_interleaved(&mut out.octx).map_err(internal("muxing audio"))?;
        }
    }
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
    unsafe { (*out.as_mut_ptr()).quality = lambda };
    enc.send_frame(&out).map_err(internal("MJPEG send_frame"))?;
    enc.send_eof().map_err(internal("MJPEG flush"))?;
    let mut pkt = Packet::empty();
    enc.receive_packet(&mut pkt).map_err(internal("MJPEG receive_packet"))?;
    let data = pkt.data().ok_or_else(|| MediaError::Internal("empty JPEG".into()))?;
    std::fs::write(path, data).map_err(|e| MediaError::Internal(format!("writing {}: {e}", path.display())))?;
    Ok(())
}
