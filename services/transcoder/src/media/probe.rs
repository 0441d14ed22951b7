//! Probing: magic bytes, then libavformat, into [`Probe`] / [`SourceMetadata`].

use std::io::Read;
use std::path::Path;

use ffmpeg::{codec, format, media};
use ffmpeg_next as ffmpeg;
use vid_core::video::SourceMetadata;
use vid_core::Problem;

use crate::problems::{self, problem};

/// Container family recognised from the first bytes of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// ISO base media / QuickTime: `ftyp`, `moov`, `mdat`, `wide`, `free`, `skip` or `pnot` at offset 4.
    IsoBmff,
    /// EBML header `1A 45 DF A3` (Matroska, WebM).
    Matroska,
}

/// Sniffs the container family from the first bytes of a file; `None` for
/// anything we do not accept (PNG, JPEG, AVI, MPEG-TS, FLV, Ogg, text, …).
///
/// Only MP4/MOV/M4V and Matroska/WebM are accepted, the same set as the api's
/// `uploads.allowed_content_types`; other video containers (AVI, MPEG-TS, FLV,
/// 3GP-in-other-wrappers) are refused on purpose: fewer demuxers, less attack surface.
pub fn sniff(head: &[u8]) -> Option<Family> {
    if head.len() >= 4 && head[..4] == [0x1A, 0x45, 0xDF, 0xA3] {
        return Some(Family::Matroska);
    }
    if head.len() >= 8 {
        let tag = &head[4..8];
        if [b"ftyp", b"moov", b"mdat", b"wide", b"free", b"skip", b"pnot"].iter().any(|t| tag == *t) {
            return Some(Family::IsoBmff);
        }
    }
    None
}

/// The demuxer name libavformat must report for each accepted family.
fn demuxer_matches(family: Family, name: &str) -> bool {
    match family {
        Family::IsoBmff => name == "mov,mp4,m4a,3gp,3g2,mj2",
        Family::Matroska => name == "matroska,webm",
    }
}

/// What the probe learnt, plus what the transcode needs to find the streams again.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The metadata reported to the api.
    pub source: SourceMetadata,
    /// Index of the chosen video stream.
    pub video_stream: usize,
    /// Index of the chosen audio stream, if any.
    pub audio_stream: Option<usize>,
    /// Upright display width in pixels: coded width × sample aspect ratio, swapped for 90/270° rotation.
    pub display_width: u32,
    /// Upright display height in pixels (see `display_width`).
    pub display_height: u32,
    /// The libavfilter chain that makes the picture upright (`""` when none is needed),
    /// e.g. `transpose=clock` — the same choice as the ffmpeg CLI's autorotate.
    pub rotation_filter: String,
}

/// Probes `path`: size, magic bytes, demuxer, streams.
///
/// Errors (as 422 problems): `empty_file`, `unsupported_container` (magic bytes
/// unknown, or the demuxer disagrees with them), `corrupt_media` (an accepted
/// container libavformat cannot open), `no_video_stream`, `unsupported_codec`.
/// I/O errors on the local file are reported as `corrupt_media` too — the
/// caller wrote the file itself, so they only arise from unreadable content.
pub fn probe(path: &Path) -> Result<Probe, Problem> {
    let (size, family) = read_head(path)?;
    super::libav::init();
    let ictx =
        format::input(&path).map_err(|e| problem(problems::CORRUPT_MEDIA, format!("the {family:?} container cannot be opened: {e}")))?;
    let container = ictx.format().name().to_owned();
    if !demuxer_matches(family, &container) {
        return Err(problem(
            problems::UNSUPPORTED_CONTAINER,
            format!("the demuxer reads the file as `{container}`, which does not match its {family:?} magic bytes"),
        ));
    }

    let video = video_stream(&ictx)?;
    let vpar = unsafe { &*video.parameters().as_ptr() };
    let (width, height) = (vpar.width.max(0) as u32, vpar.height.max(0) as u32);
    let video_id = video.parameters().id();
    if width == 0 || height == 0 {
        return Err(problem(problems::CORRUPT_MEDIA, "the video stream has no dimensions"));
    }
    if ffmpeg::decoder::find(video_id).is_none() {
        return Err(problem(problems::UNSUPPORTED_CODEC, format!("no decoder for video codec {video_id:?}")));
    }
    let video_codec = codec_name(video_id);

    let audio = ictx.streams().best(media::Type::Audio);
    let audio_codec = audio.as_ref().map(|a| codec_name(a.parameters().id()));
    let audio_stream = audio.as_ref().map(|a| a.index());

    let fr = video.avg_frame_rate();
    let frame_rate = (fr.numerator() > 0 && fr.denominator() > 0).then(|| f64::from(fr)).filter(|f| f.is_finite());
    let (rotation, rotation_filter) = rotation_of(display_matrix(&video).as_ref());
    let sar = vpar.sample_aspect_ratio;
    let sar = if sar.num > 0 && sar.den > 0 { sar.num as f64 / sar.den as f64 } else { 1.0 };
    let (dw, dh) = super::ladder::display_size(width, height, sar, rotation);

    Ok(Probe {
        source: SourceMetadata {
            container,
            duration_seconds: duration_of(&ictx, &video),
            width,
            height,
            rotation,
            video_codec,
            audio_codec,
            frame_rate,
            size_bytes: size,
        },
        video_stream: video.index(),
        audio_stream,
        display_width: dw,
        display_height: dh,
        rotation_filter,
    })
}

/// The file's size in bytes and the container family its first bytes name.
/// Errors: `empty_file`, `unsupported_container`, `corrupt_media` (I/O).
fn read_head(path: &Path) -> Result<(u64, Family), Problem> {
    let size = std::fs::metadata(path).map_err(|e| problem(problems::CORRUPT_MEDIA, format!("cannot stat the source: {e}")))?.len();
    if size == 0 {
        return Err(problem(problems::EMPTY_FILE, "the source is 0 bytes long"));
    }
    let mut head = [0u8; 16];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|e| problem(problems::CORRUPT_MEDIA, format!("cannot read the source: {e}")))?;
    let family = sniff(&head[..n]).ok_or_else(|| {
        problem(
            problems::UNSUPPORTED_CONTAINER,
            format!("the file does not start like an MP4/MOV or Matroska/WebM container (first bytes {})", hex(&head[..n.min(8)])),
        )
    })?;
    Ok((size, family))
}

/// The largest video stream that is not cover art. Errors: `no_video_stream`.
fn video_stream(ictx: &format::context::Input) -> Result<format::stream::Stream<'_>, Problem> {
    ictx.streams()
        .filter(|s| s.parameters().medium() == media::Type::Video)
        .filter(|s| !s.disposition().contains(format::stream::Disposition::ATTACHED_PIC))
        .max_by_key(|s| {
            let p = unsafe { &*s.parameters().as_ptr() };
            (p.width as i64) * (p.height as i64)
        })
        .ok_or_else(|| problem(problems::NO_VIDEO_STREAM, "the file has no video stream"))
}

/// Duration in seconds: the container's, else the video stream's; `None`
/// when neither is known (or it is not a finite, non-negative number).
fn duration_of(ictx: &format::context::Input, video: &format::stream::Stream) -> Option<f64> {
    let duration = if ictx.duration() > 0 {
        Some(ictx.duration() as f64 / f64::from(ffmpeg::ffi::AV_TIME_BASE))
    } else if video.duration() > 0 {
        Some(video.duration() as f64 * f64::from(video.time_base()))
    } else {
        None
    };
    duration.filter(|d| d.is_finite() && *d >= 0.0)
}

/// The stream's display matrix side data (9 × i32, ISO/IEC 14496-12 §8.2.2.3), if any.
fn display_matrix(video: &format::stream::Stream) -> Option<[i32; 9]> {
    video.side_data().find(|sd| sd.kind() == codec::packet::side_data::Type::DisplayMatrix).and_then(|sd| {
        let d = sd.data();
        (d.len() >= 36).then(|| {
            let mut m = [0i32; 9];
            for (i, v) in m.iter_mut().enumerate() {
                *v = i32::from_ne_bytes(d[i * 4..i * 4 + 4].try_into().unwrap());
            }
            m
        })
    })
}

/// Clockwise display rotation (0/90/180/270) and the filter chain that applies
/// it, from a display matrix — the ffmpeg CLI's autorotate logic
/// (`theta = -av_display_rotation_get(m)`, flips honoured).
pub fn rotation_of(matrix: Option<&[i32; 9]>) -> (i32, String) {
    let Some(m) = matrix else { return (0, String::new()) };
    let ccw = unsafe { ffmpeg::ffi::av_display_rotation_get(m.as_ptr()) };
    if !ccw.is_finite() {
        return (0, String::new());
    }
    let mut theta = -ccw.round();
    theta -= 360.0 * (theta / 360.0 + 0.9 / 360.0).floor();
    let near = |a: f64| (theta - a).abs() < 1.0;
    if near(90.0) {
        (90, if m[3] > 0 { "transpose=cclock_flip" } else { "transpose=clock" }.to_owned())
    } else if near(180.0) {
        let mut f = Vec::new();
        if m[0] < 0 {
            f.push("hflip");
        }
        if m[4] < 0 {
            f.push("vflip");
        }
        (180, f.join(","))
    } else if near(270.0) {
        (270, if m[3] < 0 { "transpose=clock_flip" } else { "transpose=cclock" }.to_owned())
    } else {
        (0, String::new())
    }
}

fn codec_name(id: codec::Id) -> String {
    id.name().to_owned()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_accepted_containers_and_refuses_images() {
        assert_eq!(sniff(b"\0\0\0\x20ftypisom\0\0"), Some(Family::IsoBmff));
        assert_eq!(sniff(&[0x1A, 0x45, 0xDF, 0xA3, 1, 2]), Some(Family::Matroska));
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"), None);
        assert_eq!(sniff(&[0xFF, 0xD8, 0xFF, 0xE0, 0, 0x10, b'J', b'F']), None);
        assert_eq!(sniff(b"RIFF\0\0\0\0AVI "), None);
        assert_eq!(sniff(b""), None);
    }

    #[test]
    fn rotation_follows_the_cli() {
        // The matrix ffmpeg 5.1 writes for `-metadata:s:v rotate=90`.
        let m = [0, -65536, 0, 65536, 0, 0, 0, 0, 1 << 30];
        assert_eq!(rotation_of(Some(&m)), (270, "transpose=cclock".to_owned()));
        let m = [0, 65536, 0, -65536, 0, 0, 0, 0, 1 << 30];
        assert_eq!(rotation_of(Some(&m)), (90, "transpose=clock".to_owned()));
        let m = [-65536, 0, 0, 0, -65536, 0, 0, 0, 1 << 30];
        assert_eq!(rotation_of(Some(&m)), (180, "hflip,vflip".to_owned()));
        assert_eq!(rotation_of(None), (0, String::new()));
    }
}
