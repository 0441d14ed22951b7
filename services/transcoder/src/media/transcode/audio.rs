//! The audio side: one decoder, one filter graph (built from the first
//! decoded frame), ONE AAC encoder whose packets go to every rung's MP4
//! muxer and to the one audio CMAF track of the stream (`<stream_dir>/audio/`).
//!
//! Invariants: audio never fails a job (an undecodable stream means
//! renditions without audio, a frame the graph refuses is dropped); the
//! encoder's pts (1/rate) strictly increase.

use ffmpeg::{codec, encoder, filter, format, frame, Packet, Rational};
use ffmpeg_next as ffmpeg;

use super::cmaf::{CmafTrack, Cut, TrackFiles};
use super::graph::build_audio_graph;
use super::output::Output;
use crate::media::error::MediaError;
use crate::media::libav::{internal, is_again};

/// Sample rates the AAC encoder takes as they are; others are resampled to 48 kHz.
const AAC_RATES: [u32; 9] = [96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000];

/// The decoder, graph and encoder of the chosen audio stream.
pub(super) struct AudioPipe {
    stream: usize,
    dec: ffmpeg::decoder::Audio,
    enc: encoder::Audio,
    graph: Option<filter::Graph>,
    /// Output sample rate (Hz), also the encoder's time base 1/rate.
    rate: u32,
    layout: ffmpeg::ChannelLayout,
    /// The smallest pts the next encoded frame may have (1/rate units).
    next_pts: i64,
    /// The stream's audio track, once [`AudioPipe::package`] opened it.
    track: Option<CmafTrack>,
}

impl AudioPipe {
    /// Opens stream `index` of `ictx`: `None` (with a warning) when it cannot
    /// be decoded. The encoder is AAC-LC at the source rate when AAC allows it
    /// (else 48 kHz), mono at 96 kb/s or stereo at 128 kb/s. Errors: internal
    /// (no AAC encoder in this FFmpeg, or it does not open).
    pub(super) fn open(ictx: &format::context::Input, index: usize) -> Result<Option<Self>, MediaError> {
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
        Ok(Some(Self { stream: index, dec, enc, graph: None, rate, layout, next_pts: 0, track: None }))
    }

    /// Opens the audio CMAF track in `dir`, cut into segments of `segment_seconds`.
    /// Errors: internal only.
    pub(super) fn package(&mut self, dir: &std::path::Path, segment_seconds: f64) -> Result<(), MediaError> {
        let aac = encoder::find(codec::Id::AAC).ok_or_else(|| MediaError::Internal("no AAC encoder in this FFmpeg".into()))?;
        let every = (segment_seconds * f64::from(self.rate)).round().max(1.0) as i64;
        let params = codec::Parameters::from(&self.enc);
        self.track = Some(CmafTrack::create(dir, aac, params, Rational(1, self.rate as i32), Cut::Every(every))?);
        Ok(())
    }

    /// Finishes the audio CMAF track (after [`AudioPipe::finish`]), if one was opened.
    pub(super) fn finish_track(&mut self) -> Result<Option<TrackFiles>, MediaError> {
        self.track.take().map(|t| t.finish(None)).transpose()
    }

    /// The input stream index this pipe decodes.
    pub(super) fn stream(&self) -> usize {
        self.stream
    }

    /// The AAC encoder (muxers copy its parameters).
    pub(super) fn encoder(&self) -> &encoder::Audio {
        &self.enc
    }

    /// Decodes `packet` and moves what comes out to the muxers of `outputs`.
    /// A packet the decoder refuses is skipped.
    pub(super) fn send_packet(&mut self, packet: &Packet, outputs: &mut [Output]) -> Result<(), MediaError> {
        if self.dec.send_packet(packet).is_ok() {
            self.pump(outputs, false)?;
        }
        Ok(())
    }

    /// End of input: drains the decoder, the graph and the encoder.
    pub(super) fn finish(&mut self, outputs: &mut [Output]) -> Result<(), MediaError> {
        let _ = self.dec.send_eof();
        self.pump(outputs, true)
    }

    fn pump(&mut self, outputs: &mut [Output], eof: bool) -> Result<(), MediaError> {
        let mut decoded = frame::Audio::empty();
        loop {
            match self.dec.receive_frame(&mut decoded) {
                Ok(()) => {}
                Err(e) if is_again(&e) || e == ffmpeg::Error::Eof => break,
                Err(_) => continue,
            }
            if self.graph.is_none() {
                let g = build_audio_graph(&decoded, self.time_base(), self.rate, self.layout, self.enc.frame_size())
                    .map_err(internal("audio filter graph"))?;
                self.graph = Some(g);
            }
            let ts = decoded.timestamp();
            decoded.set_pts(ts);
            let g = self.graph.as_mut().unwrap();
            if g.get("ain").unwrap().source().add(&decoded).is_err() {
                continue; // a format change mid-stream: drop the frame rather than the job
            }
            self.drain_sink(outputs)?;
        }
        if eof {
            if let Some(g) = self.graph.as_mut() {
                let _ = g.get("ain").unwrap().source().flush();
                self.drain_sink(outputs)?;
            }
            self.enc.send_eof().map_err(internal("flushing AAC"))?;
            self.drain_encoder(outputs)?;
        }
        Ok(())
    }

    /// The decoder's packet time base, or 1/rate when it has none.
    fn time_base(&self) -> Rational {
        let tb = self.dec.packet_time_base();
        if tb.numerator() > 0 && tb.denominator() > 0 {
            tb
        } else {
            Rational(1, self.dec.rate().max(1) as i32)
        }
    }

    fn drain_sink(&mut self, outputs: &mut [Output]) -> Result<(), MediaError> {
        let mut f = frame::Audio::empty();
        loop {
            let g = self.graph.as_mut().unwrap();
            let mut sink = g.get("aout").unwrap();
            match sink.sink().frame(&mut f) {
                Ok(()) => {}
                Err(e) if is_again(&e) || e == ffmpeg::Error::Eof => return Ok(()),
                Err(e) => return Err(MediaError::Internal(format!("audio filter graph: {e}"))),
            }
            let sink_tb = sink.sink().time_base();
            // Timestamps in the encoder's 1/rate time base, strictly increasing.
            let mut pts = f.pts().map(|p| ffmpeg::Rescale::rescale(&p, sink_tb, Rational(1, self.rate as i32))).unwrap_or(self.next_pts);
            if pts < self.next_pts {
                pts = self.next_pts;
            }
            self.next_pts = pts + f.samples() as i64;
            f.set_pts(Some(pts));
            self.enc.send_frame(&f).map_err(internal("AAC send_frame"))?;
            self.drain_encoder(outputs)?;
        }
    }

    /// Hands every packet the AAC encoder has to every rung's muxer.
    fn drain_encoder(&mut self, outputs: &mut [Output]) -> Result<(), MediaError> {
        let mut pkt = Packet::empty();
        let enc_tb = Rational(1, self.rate as i32);
        loop {
            match self.enc.receive_packet(&mut pkt) {
                Ok(()) => {}
                Err(e) if is_again(&e) || e == ffmpeg::Error::Eof => return Ok(()),
                Err(e) => return Err(MediaError::Internal(format!("AAC: {e}"))),
            }
            if let Some(t) = self.track.as_mut() {
                t.write(&pkt)?;
            }
            for out in outputs.iter_mut() {
                out.write_audio(&pkt, enc_tb)?;
            }
        }
    }
}
