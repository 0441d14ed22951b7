//! Per rung: the libx264 encoder, and the muxers its packets go to: the
//! static MP4 rendition ([`Mp4Muxer`], with the shared AAC packets; skipped
//! when the job asks for no MP4) and the rung's video-only CMAF track
//! ([`CmafTrack`]).
//!
//! The encoder and the containers are separate on purpose: both muxers are
//! written from the same packets, never a second encode.
//!
//! Keyframes: x264 runs with `keyint=infinite`, `scenecut=0` and closed GOPs,
//! so it makes no keyframe of its own after the first; [`KeyframeClock`]
//! forces an IDR on the first frame at or past each multiple of the segment
//! duration from the first frame. Every rung sees the same frames (one
//! decode, `split`), so every rung has its IDRs at the same instants, and
//! every segment starts with one.
//!
//! Invariants: a muxer's header is written before its first packet and its
//! trailer after the encoder was flushed; packets are rescaled from the
//! encoder's time base to the stream's.

use std::path::{Path, PathBuf};

use ffmpeg::{codec, encoder, format, frame, Dictionary, Packet, Rational};
use ffmpeg_next as ffmpeg;

use super::cmaf::{CmafTrack, Cut, TrackFiles};
use super::types::RenditionFile;
use crate::media::error::MediaError;
use crate::media::ladder::Rung;
use crate::media::libav::{internal, is_again, is_positive};

const X264_PRESET: &str = "veryfast";

/// Decides which frames are IDR frames: the first frame, and the first frame
/// at or past each multiple of the segment duration after it.
pub(super) struct KeyframeClock {
    /// Segment duration in time-base units (≥ 1).
    every: i64,
    origin: Option<i64>,
    /// Index of the segment the last keyframe opened.
    last: i64,
}

impl KeyframeClock {
    /// A clock for frames in time base `tb`, segments of `seconds`.
    pub(super) fn new(tb: Rational, seconds: f64) -> Self {
        let every = (seconds / f64::from(tb)).round().max(1.0) as i64;
        Self { every, origin: None, last: 0 }
    }

    /// Whether the frame at `pts` (non-decreasing from call to call) must be an IDR frame.
    pub(super) fn is_key(&mut self, pts: i64) -> bool {
        let Some(origin) = self.origin else {
            self.origin = Some(pts);
            return true;
        };
        let index = (pts - origin).div_euclid(self.every);
        if index > self.last {
            self.last = index;
            return true;
        }
        false
    }
}

/// One rung: its encoder and its muxers.
pub(super) struct Output {
    rung: Rung,
    enc: encoder::Video,
    /// The encoder's time base (the source stream's).
    enc_tb: Rational,
    clock: KeyframeClock,
    mp4: Option<Mp4Muxer>,
    cmaf: CmafTrack,
}

impl Output {
    /// Opens rung `rung`'s x264 encoder (time base `v_tb`, `frame_rate` when
    /// known; `preset`, `crf`, `maxrate`, `bufsize` from the rung; High
    /// profile; IDR frames only every `segment_seconds`, see the module docs),
    /// its CMAF track in `<stream_dir>/<name>/` and, when `mp4`, its MP4
    /// muxer `<out_dir>/<name>.mp4` with an audio track copying `audio`'s
    /// parameters when given. Errors: internal only.
    pub(super) fn open(
        out_dir: &Path,
        stream_dir: &Path,
        rung: &Rung,
        (v_tb, frame_rate): (Rational, Rational),
        segment_seconds: f64,
        mp4: bool,
        audio: Option<&encoder::Audio>,
    ) -> Result<Self, MediaError> {
        let path = out_dir.join(format!("{}.mp4", rung.name));
        let x264 = encoder::find_by_name("libx264").ok_or_else(|| MediaError::Internal("no libx264 encoder in this FFmpeg".into()))?;
        let mut enc = codec::context::Context::new_with_codec(x264).encoder().video().map_err(internal("x264 context"))?;
        enc.set_width(rung.width);
        enc.set_height(rung.height);
        enc.set_format(format::Pixel::YUV420P);
        enc.set_time_base(v_tb);
        if is_positive(frame_rate) {
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
        opts.set("forced-idr", "1");
        opts.set("x264-params", "keyint=infinite:scenecut=0:open-gop=0");
        let enc = enc.open_as_with(x264, opts).map_err(internal("opening libx264"))?;
        let mp4 = if mp4 { Some(Mp4Muxer::create(path, x264, &enc, v_tb, audio)?) } else { None };
        let params = codec::Parameters::from(&enc);
        let cmaf = CmafTrack::create(&stream_dir.join(&rung.name), x264, params, v_tb, Cut::AtKeyframes)?;
        let clock = KeyframeClock::new(v_tb, segment_seconds);
        Ok(Self { rung: rung.clone(), enc, enc_tb: v_tb, clock, mp4, cmaf })
    }

    /// Encodes one filtered frame (an IDR when it opens a segment) and muxes
    /// what the encoder hands back.
    pub(super) fn encode(&mut self, frame: &mut frame::Video) -> Result<(), MediaError> {
        let key = frame.pts().is_some_and(|pts| self.clock.is_key(pts));
        frame.set_kind(if key { ffmpeg::picture::Type::I } else { ffmpeg::picture::Type::None });
        self.enc.send_frame(frame).map_err(internal("x264 send_frame"))?;
        self.drain()
    }

    /// End of the video: flushes the encoder into the muxer.
    pub(super) fn flush(&mut self) -> Result<(), MediaError> {
        self.enc.send_eof().map_err(internal("flushing x264"))?;
        self.drain()
    }

    /// Muxes one packet of the shared AAC encoder (time base `enc_tb`).
    pub(super) fn write_audio(&mut self, pkt: &Packet, enc_tb: Rational) -> Result<(), MediaError> {
        match self.mp4.as_mut() {
            Some(m) => m.write_audio(pkt, enc_tb),
            None => Ok(()),
        }
    }

    /// Writes the trailers and describes the files: the MP4 rendition (when
    /// made; `seconds` (> 0) is the duration its average bitrate is computed
    /// over) and the CMAF track, which ends at `end` (encoder time base).
    pub(super) fn finish(self, seconds: f64, end: Option<i64>) -> Result<(Rung, Option<RenditionFile>, TrackFiles), MediaError> {
        let track = self.cmaf.finish(end)?;
        let file = match self.mp4 {
            Some(m) => {
                let (path, size_bytes) = m.finish()?;
                Some(RenditionFile {
                    name: self.rung.name.clone(),
                    width: self.rung.width,
                    height: self.rung.height,
                    path,
                    size_bytes,
                    bitrate: (size_bytes as f64 * 8.0 / seconds).round() as u64,
                })
            }
            None => None,
        };
        Ok((self.rung, file, track))
    }

    fn drain(&mut self) -> Result<(), MediaError> {
        let mut pkt = Packet::empty();
        loop {
            match self.enc.receive_packet(&mut pkt) {
                Ok(()) => {}
                Err(e) if is_again(&e) || e == ffmpeg::Error::Eof => return Ok(()),
                Err(e) => return Err(MediaError::Internal(format!("x264: {e}"))),
            }
            self.cmaf.write(&pkt)?;
            if let Some(m) = self.mp4.as_mut() {
                m.write_video(&mut pkt, self.enc_tb)?;
            }
        }
    }
}

/// A progressive MP4 file (`+faststart`: the `moov` before the `mdat`) with
/// one video track and, optionally, one audio track.
pub(super) struct Mp4Muxer {
    path: PathBuf,
    octx: format::context::Output,
    /// Video stream index and its time base (as the muxer set it in the header).
    video: (usize, Rational),
    /// Audio stream index and time base, when there is audio.
    audio: Option<(usize, Rational)>,
}

impl Mp4Muxer {
    /// Creates `path` with a video track of `codec` copying `enc`'s
    /// parameters (time base `v_tb`) and an audio track copying `audio`'s,
    /// and writes the header. Errors: internal only.
    fn create(
        path: PathBuf,
        codec: ffmpeg::Codec,
        enc: &encoder::Video,
        v_tb: Rational,
        audio: Option<&encoder::Audio>,
    ) -> Result<Self, MediaError> {
        let mut octx = format::output_as(&path, "mp4").map_err(internal("creating the MP4 muxer"))?;
        let v_ost = {
            let mut ost = octx.add_stream(codec).map_err(internal("adding the video stream"))?;
            ost.set_parameters(enc);
            ost.set_time_base(v_tb);
            // SAFETY: codecpar is the stream's own, allocated by add_stream.
            unsafe { (*(*ost.as_mut_ptr()).codecpar).codec_tag = 0 };
            ost.index()
        };
        let a_ost = match audio {
            Some(a) => {
                let mut ost = octx.add_stream(encoder::find(codec::Id::AAC)).map_err(internal("adding the audio stream"))?;
                ost.set_parameters(a);
                ost.set_time_base(a.time_base());
                // SAFETY: as above.
                unsafe { (*(*ost.as_mut_ptr()).codecpar).codec_tag = 0 };
                Some(ost.index())
            }
            None => None,
        };
        let mut hopts = Dictionary::new();
        hopts.set("movflags", "+faststart");
        octx.write_header_with(hopts).map_err(internal("writing the MP4 header"))?;
        let video = (v_ost, octx.stream(v_ost).unwrap().time_base());
        let audio = a_ost.map(|i| (i, octx.stream(i).unwrap().time_base()));
        Ok(Self { path, octx, video, audio })
    }

    /// Writes one video packet (timestamps in `enc_tb`).
    fn write_video(&mut self, pkt: &mut Packet, enc_tb: Rational) -> Result<(), MediaError> {
        let (idx, tb) = self.video;
        pkt.set_stream(idx);
        pkt.rescale_ts(enc_tb, tb);
        pkt.set_position(-1);
        pkt.write_interleaved(&mut self.octx).map_err(internal("muxing video"))
    }

    /// Writes a copy of one audio packet (timestamps in `enc_tb`); nothing without an audio track.
    fn write_audio(&mut self, pkt: &Packet, enc_tb: Rational) -> Result<(), MediaError> {
        let Some((idx, tb)) = self.audio else { return Ok(()) };
        let mut p = pkt.clone();
        p.set_stream(idx);
        p.rescale_ts(enc_tb, tb);
        p.set_position(-1);
        p.write_interleaved(&mut self.octx).map_err(internal("muxing audio"))
    }

    /// Writes the trailer, closes the file and returns its path and size in bytes.
    fn finish(mut self) -> Result<(PathBuf, u64), MediaError> {
        self.octx.write_trailer().map_err(internal("writing the MP4 trailer"))?;
        drop(self.octx);
        let size = std::fs::metadata(&self.path).map_err(|e| MediaError::Internal(format!("stat {}: {e}", self.path.display())))?.len();
        Ok((self.path, size))
    }
}
