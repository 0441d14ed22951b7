//! The streaming packaging (issue 19) on real media: every rung as CMAF with
//! aligned IDR frames, one audio track, the HLS and DASH manifests.
//!
//! The manifests are read back with independent parsers (`m3u8` and
//! `mpegdash` from PyPI; needs `pip install m3u8 mpegdash`) and with ffprobe;
//! the segments' frames are read with ffprobe (all in `vid_testkit::stream`,
//! which the end-to-end playback tests share). Checked for every clip: every
//! segment of every rung starts with a keyframe and holds no other, segment
//! boundaries are the same instants in every rung, and the summed segment
//! durations match the source within one frame.

mod common;

use std::path::Path;

use common::*;
use serde_json::Value;
use vid_testkit::stream::check_stream_dir;
use vid_transcoder::media::{self, Limits, MediaJob, MediaOutcome, Packaging};

const LADDER: [u32; 4] = [1080, 720, 480, 360];

fn package(input: &Path, out: &Path, packaging: Packaging) -> MediaOutcome {
    let limits = Limits { max_duration_seconds: 14400.0, max_width: 4096, max_height: 4096 };
    let job = MediaJob { input: input.into(), out_dir: out.into(), limits, ladder: LADDER.to_vec(), packaging };
    media::run(&job, &mut |_| {}).unwrap_or_else(|(e, _)| panic!("{}: {e}", input.display()))
}

/// Everything issue 19 asks of a packaged stream; `expect`: (name, width, height) per rung.
fn check_stream(o: &MediaOutcome, source: &Path, expect: &[(&str, u32, u32)], audio: bool) -> Value {
    let stream = &o.transcoded.stream;
    let got: Vec<(String, u32, u32)> = stream.video.iter().map(|v| (v.name.clone(), v.width, v.height)).collect();
    assert_eq!(got, expect.iter().map(|(n, w, h)| (n.to_string(), *w, *h)).collect::<Vec<_>>());
    assert_eq!(stream.audio.is_some(), audio);
    check_stream_dir(&stream.dir, source, expect, audio, "")
}

#[test]
fn a_clip_with_audio_is_packaged_with_aligned_segments_and_both_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let src = Clips::new(dir.path()).av("av.mp4", "1280x720", "10");
    let o = package(&src, &dir.path().join("out"), Packaging::default());
    let j = check_stream(&o, &src, &[("720p", 1280, 720), ("480p", 854, 480), ("360p", 640, 360)], true);
    let segs = j["variants"][0]["playlist"]["segments"].as_array().unwrap().len();
    assert_eq!(segs, 3, "10 s in 4 s segments: {j}");
    assert_eq!(o.transcoded.renditions.len(), 3, "the static MP4s stay by default");
}

#[test]
fn without_mp4_support_only_the_stream_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let src = Clips::new(dir.path()).av("av.mp4", "640x360", "5");
    let out = dir.path().join("out");
    let o = package(&src, &out, Packaging { segment_seconds: 2.0, mp4: false, ..Packaging::default() });
    assert!(o.transcoded.renditions.is_empty());
    assert!(!out.join("360p.mp4").exists());
    let j = check_stream(&o, &src, &[("360p", 640, 360)], true);
    assert_eq!(j["variants"][0]["playlist"]["segments"].as_array().unwrap().len(), 3, "5 s in 2 s segments (the setting): {j}");
}

/// The benchmark's control (`"storyboard": false`): the same stream, and no
/// image at all (no storyboard, thumbnail frame or poster), so the packaging
/// alone can be measured against ffmpeg's HLS ladder.
#[test]
fn without_the_storyboard_the_stream_is_the_same_and_no_image_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let src = Clips::new(dir.path()).av("av.mp4", "640x360", "5");
    let out = dir.path().join("out");
    let o = package(&src, &out, Packaging { segment_seconds: 2.0, mp4: false, storyboard: false, ..Packaging::default() });
    assert!(o.transcoded.stream.storyboard.is_none());
    assert!(o.transcoded.poster.is_none());
    let images: Vec<_> = walkdir(&out).into_iter().filter(|p| p.extension().is_some_and(|e| e == "jpg" || e == "vtt")).collect();
    assert!(images.is_empty(), "no image without the storyboard: {images:?}");
    let j = check_stream(&o, &src, &[("360p", 640, 360)], true);
    assert_eq!(j["variants"][0]["playlist"]["segments"].as_array().unwrap().len(), 3, "{j}");

    // The default writes them (so the filter above can find some).
    let out2 = dir.path().join("out2");
    let o = package(&src, &out2, Packaging { segment_seconds: 2.0, mp4: false, ..Packaging::default() });
    assert!(o.transcoded.stream.storyboard.is_some() && o.transcoded.poster.is_some());
    assert!(walkdir(&out2).iter().any(|p| p.extension().is_some_and(|e| e == "jpg")));
}

/// Every file under `dir`, recursively.
fn walkdir(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walkdir(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn an_odd_sized_source_without_audio_has_no_audio_group() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("odd.mp4");
    let lavfi = "testsrc=size=641x481:rate=25:duration=6";
    ffmpeg(&["-f", "lavfi", "-i", lavfi, "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv444p", src.to_str().unwrap()]);
    let o = package(&src, &dir.path().join("out"), Packaging::default());
    check_stream(&o, &src, &[("480p", 640, 480), ("360p", 480, 360)], false);
}

#[test]
fn a_rotated_source_lists_its_upright_resolution() {
    let dir = tempfile::tempdir().unwrap();
    let clips = Clips::new(dir.path());
    let base = clips.av("base.mp4", "640x360", "5");
    let rotated = clips.path("rot.mp4");
    ffmpeg(&["-i", base.to_str().unwrap(), "-c", "copy", "-metadata:s:v", "rotate=90", rotated.to_str().unwrap()]);
    let o = package(&rotated, &dir.path().join("out"), Packaging::default());
    check_stream(&o, &rotated, &[("360p", 360, 640)], true);
}

#[test]
fn a_variable_frame_rate_source_keeps_aligned_segments() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("vfr.mp4");
    // 60 frames at 25 fps (2.4 s), then 10 fps for 10 s: IDRs cannot come every n frames.
    let setpts = "setpts='if(lt(N,60),N*0.04,2.4+(N-60)*0.1)/TB'";
    let lavfi = "testsrc=size=854x480:rate=25:duration=6.4";
    ffmpeg_parts(&[&["-f", "lavfi", "-i", lavfi, "-vf", setpts], &X264_FAST, &["-fps_mode", "vfr", src.to_str().unwrap()]]);
    let o = package(&src, &dir.path().join("out"), Packaging::default());
    check_stream(&o, &src, &[("480p", 854, 480), ("360p", 640, 360)], false);
}

#[test]
fn the_shared_samples_are_packaged() {
    for (name, expect, audio) in [
        ("bigbuckbunny.mp4", &[("720p", 1280, 720), ("480p", 854, 480), ("360p", 640, 360)][..], true),
        ("carphone_pristine.mp4", &[("144p", 192, 144)][..], false),
    ] {
        let Some(src) = sample(name) else { panic!("fixtures/media/{name} is missing") };
        let dir = tempfile::tempdir().unwrap();
        let o = package(&src, &dir.path().join("out"), Packaging::default());
        check_stream(&o, &src, expect, audio);
    }
}
