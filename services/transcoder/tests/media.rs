//! The media pipeline on real files: generated clips and the shared samples.

mod common;

use std::path::Path;

use common::*;
use vid_transcoder::media::{self, Limits, MediaError, MediaOutcome};

const LADDER: [u32; 4] = [1080, 720, 480, 360];

fn limits() -> Limits {
    Limits { max_duration_seconds: 14400.0, max_width: 4096, max_height: 4096 }
}

fn run(input: &Path, out: &Path) -> Result<MediaOutcome, String> {
    media::run_quiet(input, out, limits(), &LADDER).map_err(|(e, _)| match e {
        MediaError::Permanent(p) => p.code,
        MediaError::Internal(m) => format!("internal: {m}"),
    })
}

/// Asserts every rendition: H.264 (+AAC iff `audio`), the planned even size, faststart.
fn check_outputs(o: &MediaOutcome, expect: &[(&str, u32, u32)], audio: bool) {
    let got: Vec<(String, u32, u32)> = o.transcoded.renditions.iter().map(|r| (r.name.clone(), r.width, r.height)).collect();
    let want: Vec<(String, u32, u32)> = expect.iter().map(|(n, w, h)| (n.to_string(), *w, *h)).collect();
    assert_eq!(got, want);
    for r in &o.transcoded.renditions {
        let p = ffprobe(&r.path);
        let streams = p["streams"].as_array().unwrap();
        let v: Vec<_> = streams.iter().filter(|s| s["codec_type"] == "video").collect();
        let a: Vec<_> = streams.iter().filter(|s| s["codec_type"] == "audio").collect();
        assert_eq!(v.len(), 1, "{}", r.name);
        assert_eq!(v[0]["codec_name"], "h264");
        assert_eq!(v[0]["pix_fmt"], "yuv420p");
        assert_eq!(v[0]["width"].as_u64().unwrap() as u32, r.width);
        assert_eq!(v[0]["height"].as_u64().unwrap() as u32, r.height);
        assert!(r.width % 2 == 0 && r.height % 2 == 0);
        assert!(v[0].get("side_data_list").is_none(), "no rotation left in the output");
        if audio {
            assert_eq!(a.len(), 1, "{}", r.name);
            assert_eq!(a[0]["codec_name"], "aac");
        } else {
            assert!(a.is_empty(), "{} has audio", r.name);
        }
        let atoms = top_level_atoms(&r.path);
        let moov = atoms.iter().position(|a| a == "moov").expect("moov");
        let mdat = atoms.iter().position(|a| a == "mdat").expect("mdat");
        assert!(moov < mdat, "faststart: moov before mdat, got {atoms:?}");
        assert!(r.size_bytes > 0 && r.bitrate > 0);
    }
    let poster = o.transcoded.poster.as_ref().expect("a poster");
    let p = ffprobe(&poster.path);
    assert_eq!(p["streams"][0]["codec_name"], "mjpeg");
    assert_eq!(
        (p["streams"][0]["width"].as_u64().unwrap() as u32, p["streams"][0]["height"].as_u64().unwrap() as u32),
        (poster.width, poster.height)
    );
    assert_eq!((poster.width, poster.height), (expect[0].1, expect[0].2));
}

fn fails_with(input: &Path, code: &str) {
    let out = tempfile::tempdir().unwrap();
    match run(input, out.path()) {
        Ok(o) => panic!("{} should fail with {code}, got {:?}", input.display(), o.transcoded.renditions),
        Err(c) => assert_eq!(c, code, "{}", input.display()),
    }
}

#[test]
fn odd_size_gets_even_renditions_never_upscaled() {
    let dir = tempfile::tempdir().unwrap();
    let clips = Clips::new(dir.path());
    let src = clips.path("odd.mp4");
    // 4:4:4 because x264 refuses odd sizes in 4:2:0.
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc=size=641x481:rate=25:duration=1.5",
        "-f",
        "lavfi",
        "-i",
        "sine=duration=1.5",
        "-c:v",
        "libx264",
        "-preset",
        "ultrafast",
        "-pix_fmt",
        "yuv444p",
        "-c:a",
        "aac",
        "-shortest",
        src.to_str().unwrap(),
    ]);
    let o = run(&src, &dir.path().join("out")).unwrap();
    assert_eq!((o.source.width, o.source.height, o.source.rotation), (641, 481, 0));
    assert_eq!(o.source.video_codec, "h264");
    assert_eq!(o.source.audio_codec.as_deref(), Some("aac"));
    check_outputs(&o, &[("480p", 640, 480), ("360p", 480, 360)], true);
}

#[test]
fn rotation_metadata_is_applied_so_outputs_are_upright() {
    let dir = tempfile::tempdir().unwrap();
    let clips = Clips::new(dir.path());
    let base = clips.av("base.mp4", "640x360", "1");
    let rotated = clips.path("rot.mp4");
    ffmpeg(&["-i", base.to_str().unwrap(), "-c", "copy", "-metadata:s:v", "rotate=90", rotated.to_str().unwrap()]);
    let side = &ffprobe(&rotated)["streams"][0]["side_data_list"][0];
    assert_eq!(side["side_data_type"], "Display Matrix", "the clip really carries a display matrix");

    let o = run(&rotated, &dir.path().join("out")).unwrap();
    assert_eq!((o.source.width, o.source.height), (640, 360));
    assert_eq!(o.source.rotation, 270, "ffmpeg 5.1 writes rotate=90 as a matrix the CLI turns counter-clockwise");
    check_outputs(&o, &[("360p", 360, 640)], true);

    // Upright: our output's first frame looks like what the ffmpeg CLI (autorotate) shows,
    // and not like the coded, unrotated picture.
    let ours = thumb(&o.transcoded.renditions[0].path);
    let cli = thumb(&rotated);
    let unrotated = thumb(&base);
    let (d_cli, d_raw) = (diff(&ours, &cli), diff(&ours, &unrotated));
    assert!(d_cli < 12.0 && d_raw > 2.0 * d_cli, "diff to the CLI's upright view {d_cli:.1}, to the unrotated picture {d_raw:.1}");
    let poster = thumb(&o.transcoded.poster.as_ref().unwrap().path);
    assert!(diff(&poster, &cli) < diff(&poster, &unrotated));
}

#[test]
fn video_without_audio_gives_outputs_without_audio() {
    let dir = tempfile::tempdir().unwrap();
    let src = Clips::new(dir.path()).video_only("silent.mp4", "320x240", "1");
    let o = run(&src, &dir.path().join("out")).unwrap();
    assert_eq!(o.source.audio_codec, None);
    check_outputs(&o, &[("240p", 320, 240)], false);
}

#[test]
fn webm_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("clip.webm");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc=size=320x180:rate=25:duration=1",
        "-f",
        "lavfi",
        "-i",
        "sine=duration=1",
        "-c:v",
        "libvpx",
        "-deadline",
        "realtime",
        "-b:v",
        "300k",
        "-c:a",
        "libopus",
        "-shortest",
        p.to_str().unwrap(),
    ]);
    let o = run(&p, &dir.path().join("out")).unwrap();
    assert_eq!(o.source.container, "matroska,webm");
    check_outputs(&o, &[("180p", 320, 180)], true);
}

#[test]
fn audio_only_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("audio.mp4");
    ffmpeg(&["-f", "lavfi", "-i", "sine=duration=1", "-c:a", "aac", p.to_str().unwrap()]);
    fails_with(&p, "no_video_stream");
}

#[test]
fn png_renamed_mp4_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("image.mp4");
    ffmpeg(&["-f", "lavfi", "-i", "testsrc=size=64x64", "-frames:v", "1", "-f", "image2", "-c:v", "png", p.to_str().unwrap()]);
    assert_eq!(&std::fs::read(&p).unwrap()[..4], b"\x89PNG");
    fails_with(&p, "unsupported_container");
    let j = dir.path().join("photo.mp4");
    ffmpeg(&["-f", "lavfi", "-i", "testsrc=size=64x64", "-frames:v", "1", "-f", "image2", "-c:v", "mjpeg", j.to_str().unwrap()]);
    fails_with(&j, "unsupported_container");
}

#[test]
fn truncated_mp4_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let clips = Clips::new(dir.path());
    // moov at the end (the usual encoder output): the cut loses the index.
    let full = clips.av("full.mp4", "320x240", "2");
    let data = std::fs::read(&full).unwrap();
    let cut = dir.path().join("cut.mp4");
    std::fs::write(&cut, &data[..data.len() * 6 / 10]).unwrap();
    fails_with(&cut, "corrupt_media");
    // moov first (faststart): the index survives, the samples do not.
    let fs = dir.path().join("fs.mp4");
    ffmpeg(&["-i", full.to_str().unwrap(), "-c", "copy", "-movflags", "+faststart", fs.to_str().unwrap()]);
    let data = std::fs::read(&fs).unwrap();
    let cut = dir.path().join("cut_fs.mp4");
    std::fs::write(&cut, &data[..data.len() * 6 / 10]).unwrap();
    fails_with(&cut, "corrupt_media");
}

#[test]
fn zero_byte_file_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("empty.mp4");
    std::fs::write(&p, b"").unwrap();
    fails_with(&p, "empty_file");
}

#[test]
fn one_frame_video_is_too_short() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("one.mp4");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc=size=320x240:rate=25",
        "-frames:v",
        "1",
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv420p",
        p.to_str().unwrap(),
    ]);
    fails_with(&p, "duration_too_short");
}

#[test]
fn limits_are_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let src = Clips::new(dir.path()).video_only("v.mp4", "320x240", "1");
    let small = Limits { max_duration_seconds: 0.5, ..limits() };
    let e = media::run_quiet(&src, &dir.path().join("o1"), small, &LADDER).unwrap_err();
    assert!(matches!(&e.0, MediaError::Permanent(p) if p.code == "duration_too_long"), "{e:?}");
    assert_eq!(e.1.unwrap().width, 320, "the failure carries the probe");
    let narrow = Limits { max_width: 300, ..limits() };
    let e = media::run_quiet(&src, &dir.path().join("o2"), narrow, &LADDER).unwrap_err();
    assert!(matches!(&e.0, MediaError::Permanent(p) if p.code == "dimensions_too_large"), "{e:?}");
}

#[test]
fn bigbuckbunny_gets_720p_480p_360p() {
    let Some(src) = sample("bigbuckbunny.mp4") else { panic!("fixtures/media/bigbuckbunny.mp4 is missing") };
    let dir = tempfile::tempdir().unwrap();
    let o = run(&src, dir.path()).unwrap();
    assert_eq!((o.source.width, o.source.height), (1280, 720));
    assert!((o.source.duration_seconds.unwrap() - 5.31).abs() < 0.1);
    check_outputs(&o, &[("720p", 1280, 720), ("480p", 854, 480), ("360p", 640, 360)], true);
    // Every rendition is as long as the source.
    for r in &o.transcoded.renditions {
        let d: f64 = ffprobe(&r.path)["format"]["duration"].as_str().unwrap().parse().unwrap();
        assert!((d - 5.31).abs() < 0.2, "{} lasts {d}", r.name);
    }
}

#[test]
fn carphone_smaller_than_360p_gets_one_rendition_at_its_size() {
    let Some(src) = sample("carphone_pristine.mp4") else { panic!("fixtures/media/carphone_pristine.mp4 is missing") };
    let dir = tempfile::tempdir().unwrap();
    let o = run(&src, dir.path()).unwrap();
    assert_eq!(o.source.audio_codec, None);
    // 176×144 coded with a 128:117 sample aspect ratio: 192×144 square pixels on display.
    assert_eq!((o.source.width, o.source.height), (176, 144));
    check_outputs(&o, &[("144p", 192, 144)], false);
}

/// A variable-frame-rate clip that holds its last frame (a screen recording
/// or slideshow ending on a still): five frames of 40 ms, then one of 5 s.
/// Every frame decodes, so it is not truncated: the decoded length counts the
/// last frame's own duration, not one frame at the average rate (1.07 s); and
/// the renditions show the still until the end.
#[test]
fn a_vfr_clip_holding_its_last_frame_is_not_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_owned();
    ffmpeg(&["-f", "lavfi", "-i", "testsrc=size=320x240", "-frames:v", "1", &p("b.png")]);
    ffmpeg(&["-f", "lavfi", "-i", "smptebars=size=320x240", "-frames:v", "1", &p("c.png")]);
    let mut list = String::new();
    for _ in 0..5 {
        list.push_str(&format!("file '{}'\nduration 0.04\n", p("b.png")));
    }
    list.push_str(&format!("file '{}'\nduration 5\n", p("c.png")));
    std::fs::write(p("list.txt"), list).unwrap();
    let (list, held0) = (p("list.txt"), p("held0.mp4"));
    ffmpeg_parts(&[&["-f", "concat", "-safe", "0", "-i", &list], &X264_FAST, &["-fps_mode", "vfr", &held0]]);
    // The concat demuxer drops the last entry's duration: set it on the packet.
    ffmpeg(&["-i", &p("held0.mp4"), "-c", "copy", "-bsf:v", "setts=duration=if(eq(N\\,5)\\,5/TB\\,DURATION)", &p("held.mp4")]);
    let probe = ffprobe(Path::new(&p("held.mp4")));
    let stream_secs: f64 = probe["streams"][0]["duration"].as_str().unwrap().parse().unwrap();
    assert!((stream_secs - 5.2).abs() < 0.05, "the clip is as meant: {probe}");

    let o = run(Path::new(&p("held.mp4")), &dir.path().join("out")).expect("every frame decodes: not truncated");
    assert!((o.transcoded.decoded_seconds - 5.2).abs() < 0.05, "{}", o.transcoded.decoded_seconds);
    // The outputs keep the still on screen to the end, not 0.2 s long.
    for r in &o.transcoded.renditions {
        let out = ffprobe(&r.path);
        let secs: f64 = out["format"]["duration"].as_str().unwrap().parse().unwrap();
        assert!(secs > 5.0 && secs < 5.3, "{}: {secs} s", r.name);
    }
}

/// The renditions are planned from the displayed size (coded × sample aspect
/// ratio), so that size is held to the limits too: 320×240 at SAR 20:1 shows
/// as 6400×240 and is refused, while an ordinary anamorphic SAR (PAL 16:15,
/// 720×576 shown as 768×576) still goes through.
#[test]
fn a_sample_aspect_ratio_stretching_past_the_limits_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let clip = |name: &str, size: &str, sar: &str| {
        let path = dir.path().join(name);
        let (video, filter) = (format!("testsrc=size={size}:rate=25"), format!("setsar={sar}"));
        ffmpeg_parts(&[&["-f", "lavfi", "-i", &video, "-t", "1", "-vf", &filter], &X264_FAST, &[path.to_str().unwrap()]]);
        path
    };
    let stretched = clip("stretched.mp4", "320x240", "20/1");
    let e = media::run_quiet(&stretched, &dir.path().join("o1"), limits(), &LADDER).unwrap_err();
    assert!(
        matches!(&e.0, MediaError::Permanent(p) if p.code == "dimensions_too_large" && p.detail.as_deref().unwrap_or("").contains("6400×240")),
        "{e:?}"
    );

    let pal = clip("pal.mp4", "720x576", "16/15");
    let o = run(&pal, &dir.path().join("o2")).expect("an ordinary SAR is accepted");
    let first = &o.transcoded.renditions[0];
    assert_eq!((first.name.as_str(), first.width, first.height), ("480p", 640, 480), "planned from 768×576");
}
