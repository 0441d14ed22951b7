//! The video side of the decode loop: the decoder (with its pixel budget),
//! timestamps made strictly increasing, the size check on every decoded
//! frame, the filter graph (rebuilt when the frame size or format changes),
//! progress, and the checks on what was decoded once the source is read.
//!
//! Invariants: no frame over `max_width` × `max_height` reaches the graph; the
//! pts given to the graph strictly increase; `progress` never goes down.

use ffmpeg::{codec, filter, format, frame, Dictionary, Packet, Rational};
use ffmpeg_next as ffmpeg;

use super::graph::{build_video_graph, placements};
use super::output::Output;
use super::storyboard::Storyboard;
use crate::media::error::MediaError;
use crate::media::ladder::Rung;
use crate::media::libav::{internal, is_again, is_positive};
use crate::media::probe::Probe;
use crate::media::validate::{Limits, MIN_DURATION_SECONDS};
use crate::problems::{self, problem};

/// The decoder, the current filter graph and what has been decoded so far.
pub(super) struct VideoPath<'a> {
    probe: &'a Probe,
    rungs: &'a [Rung],
    limits: &'a Limits,
    dec: ffmpeg::decoder::Video,
    /// The stream's time base, also the encoders'.
    tb: Rational,
    /// The stream's start time (`tb` units; 0 when unknown).
    start: i64,
    /// The stream's own duration in seconds, when the container gives one.
    stream_duration: Option<f64>,
    frame_rate: Rational,
    /// Sample aspect ratio (1:1 when unknown).
    sar: Rational,
    graph: Option<filter::Graph>,
    /// The (width, height, pixel format) the current graph was built for.
    graph_input: Option<(u32, u32, format::Pixel)>,
    decoded: frame::Video,
    filtered: frame::Video,
    frames: u64,
    decode_errors: u64,
    packets: u64,
    first_pts: Option<i64>,
    last_pts: Option<i64>,
    /// The frame before the last one's pts (see [`VideoPath::repeat_held_frame`]).
    prev_pts: Option<i64>,
    /// Where the last decoded frame ends (its pts plus its own duration, when
    /// the container gives one): a variable-frame-rate source may hold its
    /// last frame for seconds, which one frame at the average rate misses.
    last_end: Option<i64>,
    /// A reference (not a copy) to the last decoded frame.
    held: frame::Video,
    best_fraction: f64,
    /// Probed duration (seconds, > 0) or file size (bytes) for progress.
    duration: Option<f64>,
    size: f64,
    /// The storyboard, thumbnail frames and poster, fed the tallest rung's frames.
    storyboard: Storyboard,
}

impl<'a> VideoPath<'a> {
    /// Opens the decoder of `probe.video_stream` in `ictx`; the tallest
    /// rung's frames go to `storyboard`. Errors: `unsupported_codec`,
    /// `corrupt_media` (the decoder does not open), internal.
    pub(super) fn open(
        ictx: &format::context::Input,
        probe: &'a Probe,
        rungs: &'a [Rung],
        limits: &'a Limits,
        storyboard: Storyboard,
    ) -> Result<Self, MediaError> {
        let ist = ictx.stream(probe.video_stream).ok_or_else(|| MediaError::Internal("video stream vanished".into()))?;
        let tb = ist.time_base();
        let start = if ist.start_time() == ffmpeg::ffi::AV_NOPTS_VALUE { 0 } else { ist.start_time() };
        let stream_duration = (ist.duration() > 0).then(|| ist.duration() as f64 * f64::from(tb));
        let frame_rate = ist.avg_frame_rate();
        let mut ctx = codec::context::Context::from_parameters(ist.parameters()).map_err(internal("video decoder parameters"))?;
        ctx.set_threading(codec::threading::Config { kind: codec::threading::Type::Frame, count: 0, ..Default::default() });
        let dec = open_video_decoder(ctx, tb, limits)?;
        let sar = if is_positive(dec.aspect_ratio()) { dec.aspect_ratio() } else { Rational(1, 1) };
        let duration = probe.source.duration_seconds.filter(|d| *d > 0.0);
        Ok(Self {
            probe,
            rungs,
            limits,
            dec,
            tb,
            start,
            stream_duration,
            frame_rate,
            sar,
            graph: None,
            graph_input: None,
            decoded: frame::Video::empty(),
            filtered: frame::Video::empty(),
            frames: 0,
            decode_errors: 0,
            packets: 0,
            first_pts: None,
            last_pts: None,
            prev_pts: None,
            last_end: None,
            held: frame::Video::empty(),
            best_fraction: 0.0,
            duration,
            size: probe.source.size_bytes.max(1) as f64,
            storyboard,
        })
    }

    /// The stream's time base (also the encoders').
    pub(super) fn time_base(&self) -> Rational {
        self.tb
    }

    /// The stream's average frame rate (may be 0/0).
    pub(super) fn frame_rate(&self) -> Rational {
        self.frame_rate
    }

    /// Where the video ends, in the stream's time base: the first frame's
    /// pts plus `decoded_seconds` (from [`Self::check_decoded`]).
    pub(super) fn end_pts(&self, decoded_seconds: f64) -> Option<i64> {
        self.first_pts.map(|f| f + (decoded_seconds / f64::from(self.tb)).round() as i64)
    }

    /// Frames decoded so far.
    pub(super) fn frames(&self) -> u64 {
        self.frames
    }

    /// Sends one packet of the video stream to the decoder. A refusal counts as
    /// a decode error, or fails `dimensions_too_large` when it was about the size.
    pub(super) fn send_packet(&mut self, packet: &Packet) -> Result<(), MediaError> {
        self.packets += 1;
        if self.dec.send_packet(packet).is_err() {
            self.decode_errors += 1;
            if let Some(p) = refused_size(&self.dec, self.limits) {
                return Err(p.into());
            }
        }
        Ok(())
    }

    /// Tells the decoder the input ended (then [`pump`](Self::pump) drains it).
    pub(super) fn send_eof(&mut self) {
        let _ = self.dec.send_eof();
    }

    /// Pushes the decoded frames out of the decoder, through the graph, into the encoders.
    pub(super) fn pump(
        &mut self,
        ictx: &format::context::Input,
        outputs: &mut [Output],
        progress: &mut dyn FnMut(f64),
    ) -> Result<(), MediaError> {
        loop {
            match self.dec.receive_frame(&mut self.decoded) {
                Ok(()) => {}
                Err(e) if is_again(&e) || e == ffmpeg::Error::Eof => return Ok(()),
                Err(_) => {
                    self.decode_errors += 1;
                    if let Some(p) = refused_size(&self.dec, self.limits) {
                        return Err(p.into());
                    }
                    continue;
                }
            }
            let secs = self.stamp()?;
            self.filter(outputs, secs)?;
            if secs > self.limits.max_duration_seconds + 1.0 {
                let max = self.limits.max_duration_seconds;
                return Err(problem(problems::DURATION_TOO_LONG, format!("the decoded video exceeds {max} s")).into());
            }
            let fraction = match self.duration {
                Some(d) => secs / d,
                None => avio_pos(ictx) as f64 / self.size,
            };
            if fraction.is_finite() && fraction > self.best_fraction {
                self.best_fraction = fraction.min(1.0);
            }
            progress(self.best_fraction);
        }
    }

    /// Gives the frame just decoded a strictly increasing pts, keeps a
    /// reference to it (the held frame) and checks its size. Returns its time
    /// in seconds from the stream's start.
    fn stamp(&mut self) -> Result<f64, MediaError> {
        let d = &mut self.decoded;
        let mut pts = d.timestamp().unwrap_or_else(|| self.last_pts.map_or(0, |p| p + 1));
        if let Some(l) = self.last_pts {
            if pts <= l {
                pts = l + 1;
            }
        }
        self.prev_pts = self.last_pts;
        self.last_pts = Some(pts);
        self.last_end = Some(pts + d.packet().duration.max(0));
        self.first_pts.get_or_insert(pts);
        d.set_pts(Some(pts));
        // SAFETY: both are valid AVFrames owned by this struct;
        // av_frame_ref only adds a reference to the decoded buffers.
        unsafe {
            ffmpeg::ffi::av_frame_unref(self.held.as_mut_ptr());
            if ffmpeg::ffi::av_frame_ref(self.held.as_mut_ptr(), d.as_ptr()) < 0 {
                return Err(MediaError::Internal("av_frame_ref failed (out of memory)".into()));
            }
        }
        self.frames += 1;
        let secs = (pts - self.start) as f64 * f64::from(self.tb);
        let (w, h) = (d.width(), d.height());
        if self.limits.exceeded_by(w, h) {
            let (mw, mh) = (self.limits.max_width, self.limits.max_height);
            let detail = format!("a decoded frame at {secs:.2} s is {w}×{h}, which exceeds the limit of {mw}×{mh}");
            return Err(problem(problems::DIMENSIONS_TOO_LARGE, detail).into());
        }
        Ok(secs)
    }

    /// Sends the decoded frame through the graph (rebuilt first if its size or
    /// pixel format changed) and the filtered frames on to the encoders.
    fn filter(&mut self, outputs: &mut [Output], secs: f64) -> Result<(), MediaError> {
        let (w, h) = (self.decoded.width(), self.decoded.height());
        let input = (w, h, self.decoded.format());
        if self.graph_input != Some(input) {
            if let (Some(g), Some((pw, ph, _))) = (self.graph.as_mut(), self.graph_input) {
                // Everything of the old size goes out before the new graph takes over.
                tracing::info!(from = %format!("{pw}x{ph}"), to = %format!("{w}x{h}"), at_seconds = secs, "the video changes size or format mid-stream; rebuilding the filter graph");
                g.get("in").unwrap().source().flush().map_err(internal("flushing the video graph"))?;
                drain_sinks(g, outputs, &mut self.filtered, self.tb, &mut self.storyboard)?;
            }
            let boxes = placements(w, h, self.sar, self.probe, self.rungs);
            let g = build_video_graph(&self.decoded, self.tb, self.sar, &self.probe.rotation_filter, &boxes)
                .map_err(internal("video filter graph"))?;
            self.graph = Some(g);
            self.graph_input = Some(input);
        }
        let g = self.graph.as_mut().unwrap();
        g.get("in")
            .unwrap()
            .source()
            .add(&self.decoded)
            .map_err(|e| problem(problems::CORRUPT_MEDIA, format!("the video changes format mid-stream: {e}")))?;
        drain_sinks(g, outputs, &mut self.filtered, self.tb, &mut self.storyboard)
    }

    /// Once the source is read: fails a decode that produced nothing, mostly
    /// errors, or much less than the stream claims (`corrupt_media`), or too
    /// little when the probe knew no duration (`duration_too_short`). Returns
    /// the seconds decoded: last minus first pts plus one frame, or to the end
    /// of the last frame when that is later.
    pub(super) fn check_decoded(&self, duration: Option<f64>) -> Result<f64, MediaError> {
        let (frames, errors, packets) = (self.frames, self.decode_errors, self.packets);
        if frames == 0 {
            return Err(problem(problems::CORRUPT_MEDIA, format!("no video frame could be decoded ({errors} decode errors)")).into());
        }
        if errors > 3 && errors * 20 > packets {
            return Err(problem(problems::CORRUPT_MEDIA, format!("{errors} of {packets} video packets failed to decode")).into());
        }
        let frame_secs = if is_positive(self.frame_rate) { 1.0 / f64::from(self.frame_rate) } else { 0.0 };
        let first = self.first_pts.unwrap();
        let tb = f64::from(self.tb);
        let decoded_seconds = ((self.last_pts.unwrap() - first) as f64 * tb + frame_secs).max((self.last_end.unwrap() - first) as f64 * tb);
        if duration.is_none() && decoded_seconds <= MIN_DURATION_SECONDS {
            return Err(problem(problems::DURATION_TOO_SHORT, format!("{decoded_seconds:.3} s of video decoded")).into());
        }
        if let Some(expected) = self.stream_duration {
            if decoded_seconds < expected * 0.9 - 0.05 {
                let detail = format!("only {decoded_seconds:.2} s of the {expected:.2} s video stream could be decoded");
                return Err(problem(problems::CORRUPT_MEDIA, detail).into());
            }
        }
        Ok(decoded_seconds)
    }

    /// A held last frame: a variable-frame-rate source (a screen recording, a
    /// slideshow ending on a still) may show its last frame for seconds. The
    /// encoders and the MP4 muxer only see frame start times, so the outputs
    /// would end when that frame starts. Sending the same picture again one
    /// frame gap before the end keeps it on screen until the source's end.
    /// Releases the held frame either way.
    pub(super) fn repeat_held_frame(&mut self, outputs: &mut [Output]) -> Result<(), MediaError> {
        if let (Some(g), Some(last), Some(end)) = (self.graph.as_mut(), self.last_pts, self.last_end) {
            let gap = self.prev_pts.map_or(1, |p| (last - p).max(1));
            if end - last > 2 * gap {
                self.held.set_pts(Some(end - gap));
                g.get("in").unwrap().source().add(&self.held).map_err(internal("repeating the held last frame"))?;
                drain_sinks(g, outputs, &mut self.filtered, self.tb, &mut self.storyboard)?;
            }
        }
        self.held = frame::Video::empty();
        Ok(())
    }

    /// Flushes the filter graph into the encoders.
    pub(super) fn flush(&mut self, outputs: &mut [Output]) -> Result<(), MediaError> {
        if let Some(g) = self.graph.as_mut() {
            g.get("in").unwrap().source().flush().map_err(internal("flushing the video graph"))?;
            drain_sinks(g, outputs, &mut self.filtered, self.tb, &mut self.storyboard)?;
        }
        Ok(())
    }

    /// The storyboard (to finish), fed every frame of the tallest rung.
    pub(super) fn into_storyboard(self) -> Storyboard {
        self.storyboard
    }
}

/// Moves every filtered frame from the graph's sinks (`out<i>`) to rung `i`'s
/// encoder, offering the tallest rung's frames to the storyboard.
fn drain_sinks(
    g: &mut filter::Graph,
    outputs: &mut [Output],
    filtered: &mut frame::Video,
    tb: Rational,
    storyboard: &mut Storyboard,
) -> Result<(), MediaError> {
    for (i, out) in outputs.iter_mut().enumerate() {
        let mut sink = g.get(&format!("out{i}")).unwrap();
        loop {
            match sink.sink().frame(filtered) {
                Ok(()) => {}
                Err(e) if is_again(&e) || e == ffmpeg::Error::Eof => break,
                Err(e) => return Err(MediaError::Internal(format!("video filter graph: {e}"))),
            }
            if i == 0 {
                storyboard.offer(filtered, tb)?;
            }
            out.encode(filtered)?;
        }
    }
    Ok(())
}

/// The input's byte position (for progress when the duration is unknown).
fn avio_pos(ictx: &format::context::Input) -> i64 {
    // SAFETY: `pb` is the open input's AVIOContext (or null, checked).
    unsafe {
        let pb = (*ictx.as_ptr()).pb;
        if pb.is_null() {
            0
        } else {
            ffmpeg::ffi::avio_seek(pb, 0, libc::SEEK_CUR).max(0)
        }
    }
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
