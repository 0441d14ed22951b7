//! Filter graph building: pure set-up from a first frame, no state kept.
//!
//! - video: `buffer → [rotation] → split=N → scale → [pad] → setsar=1 → format=yuv420p → buffersink`
//!   per rung, sinks named `out<i>` in rung order;
//! - audio: `abuffer → aresample → aformat=fltp:<rate>:<mono|stereo> → abuffersink` (`ain` … `aout`),
//!   the sink handing out frames of the AAC encoder's frame size.

use ffmpeg::{filter, frame, Rational};
use ffmpeg_next as ffmpeg;

use crate::media::ladder::Rung;
use crate::media::probe::Probe;

/// Where the frames of one input size go in each rung: `(rung width, rung
/// height, picture width, picture height)` in pixels. A picture of the probed
/// display size fills its rung (the plan was made for it); any other size is
/// fitted inside with its aspect kept ([`crate::media::ladder::fit`]), the rest being
/// black bars.
pub(super) fn placements(width: u32, height: u32, sar: Rational, probe: &Probe, rungs: &[Rung]) -> Vec<(u32, u32, u32, u32)> {
    let (dw, dh) = crate::media::ladder::display_size(width, height, f64::from(sar), probe.source.rotation);
    let native = (dw, dh) == (probe.display_width, probe.display_height);
    rungs
        .iter()
        .map(|r| {
            let (pw, ph) = if native { (r.width, r.height) } else { crate::media::ladder::fit(dw, dh, r.width, r.height) };
            (r.width, r.height, pw, ph)
        })
        .collect()
}

/// The video filter graph for frames like `first`: `boxes` holds, per rung
/// (in order), `(rung width, rung height, picture width, picture height)`
/// from [`placements`]; a picture smaller than its rung is padded, centred,
/// with black.
pub(super) fn build_video_graph(
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

/// The audio filter graph for frames like `first` (in time base `tb`):
/// resampled to `rate`, planar float, mono or stereo as `layout`; the sink
/// hands out frames of `frame_size` samples (when non-zero).
pub(super) fn build_audio_graph(
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
