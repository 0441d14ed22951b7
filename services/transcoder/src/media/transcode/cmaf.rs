//! One CMAF track (ISO/IEC 23000-19: fragmented MP4, one track per file set):
//! an initialization segment `init.mp4` (`ftyp` + `moov` without samples) and
//! one media segment `seg-NNNNN.m4s` (`moof` + `mdat`) per segment, all in one
//! directory.
//!
//! libavformat's MP4 muxer writes the fragmented file (`movflags` `frag_custom`,
//! `empty_moov`, `default_base_moof`, `negative_cts_offsets`, `skip_trailer`,
//! `frag_discont`: a fragment is cut only when this module asks, every `moof`
//! carries its `tfdt`, video sample times need no edit list, no `mfra` index
//! follows the last fragment (nothing after it is used), timestamps as given). Its output is cut into the objects as it
//! is written: after the header the bytes so far are the init segment, after
//! each fragment flush the new bytes are one media segment. So a segment's
//! file exists as soon as its last packet was encoded (what publishing while
//! the ladder still encodes needs).
//!
//! Segments are cut before a video keyframe (the encoders only make IDR
//! frames at segment boundaries, see [`super::output::KeyframeClock`]), or,
//! for audio, before the first packet at or past the next multiple of the
//! segment duration.
//!
//! Timestamps: every track's timestamps are moved [`LEAD_IN_SECONDS`] later
//! before muxing, and `frag_discont` + `use_editlist=0` make the muxer write
//! them as they are (absolute `tfdt`). Otherwise it rebases each track on its
//! own first decode time (x264's B-frame delay for video, the AAC priming
//! for audio), and the separate tracks would be out of sync by the
//! difference. With `negative_cts_offsets` the muxer writes each fragment's
//! first sample (the IDR frame) with composition offset 0 and its `tfdt` at
//! that frame's presentation time, B-frames with negative offsets (`trun`
//! version 1). So the composition times an ISO/IEC 14496-12 §8.6.1.1 reader
//! (a browser's MSE) computes are the source's presentation times plus the
//! lead-in, in every track (checked from the boxes by `vid_testkit::iso` in
//! `tests/stream.rs`). ffmpeg's own mov demuxer presents such a track later
//! by its largest negative offset (`dts_shift`); nothing here compensates
//! for that reader, because players follow the standard. The
//! DASH MPD takes the lead-in off again (`presentationTimeOffset`), HLS
//! players start at the first segment's time.
//!
//! Invariants: every packet is written one packet late, with its duration set
//! to the gap to the next one (the last one's to the track's end), so the last
//! sample of every fragment has its true duration and the segments tile the
//! timeline without gaps; segment `n`'s start is segment `n-1`'s end.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use ffmpeg::{codec, format, Dictionary, Packet, Rational};
use ffmpeg_next as ffmpeg;
use serde::{Deserialize, Serialize};

use crate::media::error::MediaError;
use crate::media::libav::internal;

/// Seconds added to every timestamp of every track (see the module docs):
/// more than any B-frame delay or audio priming of a sane source.
pub const LEAD_IN_SECONDS: i64 = 10;

/// The file name of every track's initialization segment.
pub const INIT_NAME: &str = "init.mp4";

/// The file name of media segment `number` (1-based): `seg-00001.m4s`.
pub fn segment_name(number: usize) -> String {
    format!("seg-{number:05}.m4s")
}

/// One media segment of a track, as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// Start, in the track's time base (`timescale` units), from the track's first sample.
    pub start: i64,
    /// Duration in `timescale` units (> 0).
    pub duration: i64,
    /// Size of the `.m4s` file in bytes.
    pub size_bytes: u64,
}

/// A finished CMAF track.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrackFiles {
    /// Directory holding `init.mp4` and the segments.
    pub dir: PathBuf,
    /// Units per second of [`Segment::start`] and [`Segment::duration`].
    pub timescale: u32,
    /// Presentation time of the first segment's start in the track (the
    /// first sample's composition time, `timescale` units), the lead-in included.
    pub first_time: i64,
    /// The lead-in in `timescale` units ([`LEAD_IN_SECONDS`]).
    pub lead_in: i64,
    /// The segments, in order.
    pub segments: Vec<Segment>,
    /// Size of `init.mp4` in bytes.
    pub init_bytes: u64,
    /// The codec's extradata (avcC for H.264, the AudioSpecificConfig for AAC).
    pub extradata: Vec<u8>,
}

impl TrackFiles {
    /// Seconds of media in the track (the sum of its segment durations).
    pub fn seconds(&self) -> f64 {
        self.segments.iter().map(|s| s.duration).sum::<i64>() as f64 / f64::from(self.timescale)
    }

    /// Where the track ends on the presentation's time line, in seconds:
    /// its first segment's start less the lead-in (what the DASH MPD's
    /// `S@t` − `presentationTimeOffset` gives, > 0 for a track the source
    /// starts late) plus [`TrackFiles::seconds`].
    pub fn end_seconds(&self) -> f64 {
        let start = self.first_time + self.segments.first().map_or(0, |s| s.start) - self.lead_in;
        start as f64 / f64::from(self.timescale) + self.seconds()
    }
}

/// How a track decides where its segments start.
pub(super) enum Cut {
    /// Before every keyframe but the first (video).
    AtKeyframes,
    /// Before the first packet at or past each multiple of this many time-base units (audio).
    Every(i64),
}

/// A CMAF track being written.
pub(super) struct CmafTrack {
    dir: PathBuf,
    /// The muxer's whole output; cut into the objects as it grows.
    raw: PathBuf,
    octx: format::context::Output,
    /// The stream's time base in the muxer (the encoder's, see `create`).
    tb: Rational,
    enc_tb: Rational,
    cut: Cut,
    /// Bytes of `raw` already cut into objects.
    taken: u64,
    /// The packet waiting for its successor (its duration is the gap to it).
    pending: Option<Packet>,
    /// Start of the first sample (stream time base), and of the open segment.
    origin: Option<i64>,
    seg_start: i64,
    /// Packets in the open segment.
    open_packets: usize,
    /// The latest presentation time written (stream time base).
    max_pts: i64,
    segments: Vec<Segment>,
    init_bytes: u64,
    extradata: Vec<u8>,
}

impl CmafTrack {
    /// Creates `dir` and a track of `codec` with `params` (an opened
    /// encoder's parameters, time base `enc_tb`), and writes `init.mp4`.
    /// Errors: internal only.
    pub(super) fn create(
        dir: &Path,
        codec: ffmpeg::Codec,
        params: codec::Parameters,
        enc_tb: Rational,
        cut: Cut,
    ) -> Result<Self, MediaError> {
        std::fs::create_dir_all(dir).map_err(|e| MediaError::Internal(format!("creating {}: {e}", dir.display())))?;
        let raw = dir.join("track.cmaf.part");
        let mut octx = format::output_as(&raw, "mp4").map_err(internal("creating the CMAF muxer"))?;
        let extradata = {
            let mut ost = octx.add_stream(codec).map_err(internal("adding the CMAF stream"))?;
            ost.set_parameters(params);
            ost.set_time_base(enc_tb);
            // SAFETY: codecpar is the stream's own, allocated by add_stream.
            unsafe {
                let par = (*ost.as_mut_ptr()).codecpar;
                (*par).codec_tag = 0;
                let (p, n) = ((*par).extradata, (*par).extradata_size.max(0) as usize);
                if p.is_null() {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(p, n).to_vec()
                }
            }
        };
        let mut opts = Dictionary::new();
        opts.set("movflags", "+frag_custom+empty_moov+default_base_moof+negative_cts_offsets+skip_trailer+frag_discont");
        opts.set("use_editlist", "0");
        octx.write_header_with(opts).map_err(internal("writing the CMAF header"))?;
        let tb = octx.stream(0).unwrap().time_base();
        let mut t = Self {
            dir: dir.into(),
            raw,
            octx,
            tb,
            enc_tb,
            cut,
            taken: 0,
            pending: None,
            origin: None,
            seg_start: 0,
            open_packets: 0,
            max_pts: 0,
            segments: Vec::new(),
            init_bytes: 0,
            extradata,
        };
        t.init_bytes = t.take(INIT_NAME)?;
        Ok(t)
    }

    /// Writes one packet (timestamps in the encoder's time base), cutting a
    /// segment before it when it starts one.
    pub(super) fn write(&mut self, pkt: &Packet) -> Result<(), MediaError> {
        let mut p = pkt.clone();
        p.set_stream(0);
        p.rescale_ts(self.enc_tb, self.tb);
        p.set_position(-1);
        let shift = self.lead_in();
        p.set_pts(p.pts().map(|t| t + shift));
        p.set_dts(p.dts().map(|t| t + shift));
        let pts = p.pts().or(p.dts()).unwrap_or(0);
        if self.origin.is_none() {
            (self.origin, self.seg_start, self.max_pts) = (Some(pts), pts, pts);
        }
        let origin = self.origin.unwrap_or(pts);
        let starts_segment = self.open_packets > 0
            && match self.cut {
                Cut::AtKeyframes => p.is_key(),
                Cut::Every(units) => {
                    let units = ffmpeg::Rescale::rescale(&units, self.enc_tb, self.tb).max(1);
                    (pts - origin) / units > (self.seg_start - origin) / units
                }
            };
        if let Some(mut prev) = self.pending.take() {
            let gap = p.dts().unwrap_or(pts) - prev.dts().unwrap_or(0);
            if gap > 0 {
                prev.set_duration(gap);
            }
            self.mux(prev)?;
        }
        if starts_segment {
            self.cut_segment(pts)?;
        }
        self.open_packets += 1;
        self.max_pts = self.max_pts.max(pts);
        self.pending = Some(p);
        Ok(())
    }

    /// Ends the track at `end` (encoder time base; `None`: one packet
    /// duration after the latest presentation time), cuts the last segment
    /// and returns what was written. Errors: internal only.
    pub(super) fn finish(mut self, end: Option<i64>) -> Result<TrackFiles, MediaError> {
        if let Some(mut last) = self.pending.take() {
            let fallback = self.max_pts + last.duration().max(1);
            let shift = self.lead_in();
            let end = end.map(|e| ffmpeg::Rescale::rescale(&e, self.enc_tb, self.tb) + shift).unwrap_or(fallback).max(self.max_pts + 1);
            last.set_duration(end - self.max_pts);
            self.mux(last)?;
            self.cut_segment(end)?;
        }
        self.octx.write_trailer().map_err(|e| MediaError::Internal(format!("writing the CMAF trailer of {}: {e}", self.dir.display())))?;
        let _ = std::fs::remove_file(&self.raw);
        let timescale = self.tb.denominator().max(1) as u32;
        debug_assert_eq!(self.tb.numerator(), 1, "the MP4 muxer's time bases are 1/timescale");
        // The first packet in decode order is the first presented (an IDR
        // frame opening a closed GOP, or an audio frame).
        let first_time = self.origin.unwrap_or(0);
        let lead_in = self.lead_in();
        Ok(TrackFiles {
            dir: self.dir,
            timescale,
            first_time,
            lead_in,
            segments: self.segments,
            init_bytes: self.init_bytes,
            extradata: self.extradata,
        })
    }

    /// [`LEAD_IN_SECONDS`] in the stream's time base.
    fn lead_in(&self) -> i64 {
        ffmpeg::Rescale::rescale(&LEAD_IN_SECONDS, Rational(1, 1), self.tb)
    }

    fn mux(&mut self, p: Packet) -> Result<(), MediaError> {
        p.write(&mut self.octx).map(|_| ()).map_err(internal("muxing CMAF"))
    }

    /// Flushes the open fragment into the next segment file; it ends at `end` (stream time base).
    fn cut_segment(&mut self, end: i64) -> Result<(), MediaError> {
        // SAFETY: a NULL packet asks the MP4 muxer (frag_custom) to flush the fragment.
        let r = unsafe { ffmpeg::ffi::av_write_frame(self.octx.as_mut_ptr(), std::ptr::null_mut()) };
        if r < 0 {
            return Err(MediaError::Internal(format!("flushing a CMAF fragment: {}", ffmpeg::Error::from(r))));
        }
        let size_bytes = self.take(&segment_name(self.segments.len() + 1))?;
        let start = self.seg_start - self.origin.unwrap_or(self.seg_start);
        self.segments.push(Segment { start, duration: (end - self.seg_start).max(1), size_bytes });
        self.seg_start = end;
        self.open_packets = 0;
        Ok(())
    }

    /// Moves the muxer's output written since the last cut into `dir/name`; returns its size.
    fn take(&mut self, name: &str) -> Result<u64, MediaError> {
        let io = |e: std::io::Error| MediaError::Internal(format!("cutting {name}: {e}"));
        // SAFETY: pb is the open output's AVIOContext; avio_flush writes its buffer to the file.
        let end = unsafe {
            let pb = (*self.octx.as_mut_ptr()).pb;
            ffmpeg::ffi::avio_flush(pb);
            ffmpeg::ffi::avio_seek(pb, 0, libc::SEEK_CUR)
        };
        let end = u64::try_from(end).map_err(|_| MediaError::Internal(format!("cutting {name}: no output position")))?;
        let mut f = File::open(&self.raw).map_err(io)?;
        f.seek(SeekFrom::Start(self.taken)).map_err(io)?;
        let mut bytes = Vec::with_capacity((end - self.taken) as usize);
        f.take(end - self.taken).read_to_end(&mut bytes).map_err(io)?;
        std::fs::write(self.dir.join(name), &bytes).map_err(io)?;
        self.taken = end;
        Ok(bytes.len() as u64)
    }
}
