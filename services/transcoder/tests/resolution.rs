//! Frame sizes that change mid-stream, on real files made with the ffmpeg CLI.
//!
//! The stream header (what the probe validates) shows the first size only, so
//! these clips are built like the reviewer's repro: raw H.264 parts with
//! `repeat-headers=1`, concatenated and remuxed into MP4 without re-encoding
//! (or WebM parts joined by the concat demuxer for VP9). Over the limits the
//! job must fail `dimensions_too_large` — refused by the decoder's pixel
//! budget (`max_pixels`) or by the per-frame check; within the limits the new
//! size is fitted, letterboxed, into the renditions planned from the header.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use tokio::sync::watch;
use vid_transcoder::child::{self, ChildOutcome};
use vid_transcoder::media::{self, Limits, MediaError, MediaJob, MediaOutcome};

const LADDER: [u32; 4] = [1080, 720, 480, 360];

fn limits(max_width: u32, max_height: u32) -> Limits {
    Limits { max_duration_seconds: 14400.0, max_width, max_height }
}

/// A clip whose H.264 stream is `parts` one after the other: each part is
/// `frames` frames of the lavfi video source `src` (e.g.
/// `testsrc=size=320x240:rate=25`), encoded on its own with in-band SPS/PPS;
/// the concatenated Annex B stream is remuxed (`-c copy`) into `name` (MP4,
/// 25 fps). The MP4 header carries the first part's size.
fn switching_h264(dir: &Path, name: &str, parts: &[(&str, u32)]) -> PathBuf {
    let mut annex_b = Vec::new();
    for (i, (src, frames)) in parts.iter().enumerate() {
        let part = dir.join(format!("{name}.part{i}.h264"));
        ffmpeg_parts(&[
            &["-f", "lavfi", "-i", src, "-frames:v", &frames.to_string()],
            &X264_FAST,
            &["-x264-params", "repeat-headers=1:log-level=error", "-f", "h264", part.to_str().unwrap()],
        ]);
        annex_b.extend(std::fs::read(&part).unwrap());
    }
    let raw = dir.join(format!("{name}.h264"));
    std::fs::write(&raw, annex_b).unwrap();
    let out = dir.join(name);
    ffmpeg(&["-f", "h264", "-framerate", "25", "-i", raw.to_str().unwrap(), "-c", "copy", out.to_str().unwrap()]);
    out
}

/// Frame sizes of `path` as ffprobe decodes them, in order, consecutive
/// duplicates merged: the proof that a clip really switches.
fn frame_sizes(path: &Path) -> Vec<(u32, u32)> {
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-select_streams", "v:0", "-show_entries", "frame=width,height", "-of", "csv=p=0"])
        .arg(path)
        .output()
        .expect("ffprobe runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut sizes: Vec<(u32, u32)> = Vec::new();
    // One `width,height` line per frame; side-data sections add lines without them.
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut it = line.split(',').map(|v| v.trim().parse::<u32>());
        let (Some(Ok(w)), Some(Ok(h))) = (it.next(), it.next()) else { continue };
        let s = (w, h);
        if sizes.last() != Some(&s) {
            sizes.push(s);
        }
    }
    sizes
}

/// Mean luma of thumbnail row `row` (0–15).
fn row(t: &[u8], row: usize) -> f64 {
    t[row * 16..row * 16 + 16].iter().map(|v| f64::from(*v)).sum::<f64>() / 16.0
}

/// A permanent failure's stable code and its detail.
#[derive(Debug)]
struct Failure {
    code: String,
    detail: String,
}

fn run(input: &Path, out: &Path, limits: Limits) -> Result<MediaOutcome, Failure> {
    media::run_quiet(input, out, limits, &LADDER).map_err(|(e, _)| match e {
        MediaError::Permanent(p) => Failure { code: p.code, detail: p.detail.unwrap_or_default() },
        MediaError::Internal(m) => panic!("internal error: {m}"),
    })
}

/// Runs `input` through the real `transcoder work` child, as the worker does for a job.
async fn run_child(input: &Path, dir: &Path, limits: Limits) -> ChildOutcome {
    let job = MediaJob { input: input.into(), out_dir: dir.join("out"), limits, ladder: LADDER.to_vec(), packaging: Default::default() };
    let spec = child::write_spec(dir, &job).unwrap();
    let cmd = child::worker_command(Path::new(env!("CARGO_BIN_EXE_transcoder")), &spec);
    let (_tx, rx) = watch::channel(None);
    let supervision = child::Limits {
        stall_timeout: Duration::from_secs(30),
        base_budget: Duration::from_secs(120),
        budget_per_media_second: 20.0,
        assumed_duration_seconds: 60.0,
    };
    child::supervise(cmd, supervision, rx, |_| {}).await
}

/// The reviewer's bug, kept small: 1 s at 320×240, then 5 frames at 4100×64 —
/// over the 4096 width cap but only 262 400 pixels, so within the decoder's
/// pixel budget: the per-frame check must catch it. Through the real worker
/// child, so this is the code the job reports.
#[tokio::test]
async fn a_frame_wider_than_the_cap_mid_stream_fails_the_job_dimensions_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let src = switching_h264(dir.path(), "wide.mp4", &[("testsrc=size=320x240:rate=25", 25), ("testsrc=size=4100x64:rate=25", 5)]);
    assert_eq!(frame_sizes(&src), vec![(320, 240), (4100, 64)], "the clip switches size");
    let header = &ffprobe(&src)["streams"][0];
    assert_eq!((header["width"].as_u64(), header["height"].as_u64()), (Some(320), Some(240)), "the header shows the small size only");

    match run_child(&src, dir.path(), limits(4096, 4096)).await {
        ChildOutcome::Failed { error, source } => {
            assert_eq!(error.code, "dimensions_too_large", "{error:?}");
            assert_eq!(error.status, 422);
            let detail = error.detail.unwrap_or_default();
            assert!(detail.contains("a decoded frame at") && detail.contains("is 4100×64"), "caught by the per-frame check: {detail}");
            let source = source.expect("the failure carries the probe");
            assert_eq!((source.width, source.height), (320, 240));
        }
        other => panic!("the job must fail dimensions_too_large, got {other:?}"),
    }
}

/// The decoder itself refuses a frame over its `max_pixels` budget before
/// allocating it (H.264: the refused size stays in the decoder context).
/// Limits 320×240 give a budget of 448 × 280 = 125 440 pixels; the switch goes
/// to 1280×720 = 921 600 pixels.
#[test]
fn h264_frames_over_the_pixel_budget_are_refused_by_the_decoder() {
    let dir = tempfile::tempdir().unwrap();
    let src = switching_h264(dir.path(), "big.mp4", &[("testsrc=size=320x240:rate=25", 25), ("testsrc=size=1280x720:rate=25", 5)]);
    assert_eq!(frame_sizes(&src), vec![(320, 240), (1280, 720)]);
    let e = run(&src, &dir.path().join("out"), limits(320, 240)).expect_err("over the limits");
    assert_eq!(e.code, "dimensions_too_large", "{e:?}");
    let detail = e.detail;
    assert!(detail.contains("the decoder refused a 1280×720 frame"), "refused by libavcodec, not after decoding: {detail}");
}

/// The same for VP9 in WebM, whose decoder resets its size to 0×0 when
/// `max_pixels` refuses a keyframe of a new size.
#[test]
fn vp9_frames_over_the_pixel_budget_are_refused_by_the_decoder() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (name, size, frames) in [("a.webm", "320x240", "25"), ("b.webm", "1280x720", "5")] {
        ffmpeg(&[
            "-f",
            "lavfi",
            "-i",
            &format!("testsrc=size={size}:rate=25"),
            "-frames:v",
            frames,
            "-c:v",
            "libvpx-vp9",
            "-deadline",
            "realtime",
            "-b:v",
            "300k",
            d.join(name).to_str().unwrap(),
        ]);
    }
    std::fs::write(d.join("list.txt"), "file a.webm\nfile b.webm\n").unwrap();
    let src = d.join("switch.webm");
    ffmpeg(&["-f", "concat", "-i", d.join("list.txt").to_str().unwrap(), "-c", "copy", src.to_str().unwrap()]);
    assert_eq!(frame_sizes(&src), vec![(320, 240), (1280, 720)]);
    let e = run(&src, &d.join("out"), limits(320, 240)).expect_err("over the limits");
    assert_eq!(e.code, "dimensions_too_large", "{e:?}");
    let detail = e.detail;
    assert!(detail.contains("the decoder refused a change of frame size"), "refused by libavcodec, not after decoding: {detail}");
}

/// Within the limits a size change is transcoded: the filter graph is rebuilt
/// and the new frames are fitted into the renditions planned from the header,
/// aspect kept, centred on black bars — not stretched. 640×480 (red, 1 s), then
/// 960×240 (white, 1 s, 4:1), then 640×480 again (red, 1 s).
#[test]
fn a_size_change_within_the_limits_is_letterboxed_into_the_same_renditions() {
    let dir = tempfile::tempdir().unwrap();
    let src = switching_h264(
        dir.path(),
        "switch.mp4",
        &[("color=c=red:size=640x480:rate=25", 25), ("color=c=white:size=960x240:rate=25", 25), ("color=c=red:size=640x480:rate=25", 25)],
    );
    assert_eq!(frame_sizes(&src), vec![(640, 480), (960, 240), (640, 480)]);

    let o = run(&src, &dir.path().join("out"), limits(4096, 4096)).expect("a size change within the limits is accepted");
    let got: Vec<(String, u32, u32)> = o.transcoded.renditions.iter().map(|r| (r.name.clone(), r.width, r.height)).collect();
    assert_eq!(got, vec![("480p".to_owned(), 640, 480), ("360p".to_owned(), 480, 360)], "planned from the header");
    assert!((o.transcoded.decoded_seconds - 3.0).abs() < 0.1, "{}", o.transcoded.decoded_seconds);
    for r in &o.transcoded.renditions {
        let p = ffprobe(&r.path);
        assert_eq!(p["streams"][0]["codec_name"], "h264");
        assert_eq!((p["streams"][0]["width"].as_u64(), p["streams"][0]["height"].as_u64()), (Some(r.width.into()), Some(r.height.into())));
        let d: f64 = p["format"]["duration"].as_str().unwrap().parse().unwrap();
        assert!((d - 3.0).abs() < 0.15, "{} lasts {d}", r.name);
        assert_eq!(frame_sizes(&r.path), vec![(r.width, r.height)], "{}: one size throughout", r.name);

        // 1st part: red fills the picture.
        let t = thumb_at(&r.path, 0.5);
        assert!(row(&t, 0) > 60.0 && row(&t, 15) > 60.0, "{}: red to the edges at 0.5 s: {t:?}", r.name);
        // 2nd part: 4:1 in 4:3, scaled to a quarter of the height (rows 6–9 of 16)
        // between black bars (rows 0–4 and 11–15).
        let t = thumb_at(&r.path, 1.5);
        for y in (0..=4).chain(11..=15) {
            assert!(row(&t, y) < 30.0, "{}: row {y} at 1.5 s is a black bar: {t:?}", r.name);
        }
        for y in 6..=9 {
            assert!(row(&t, y) > 200.0, "{}: row {y} at 1.5 s is the white picture: {t:?}", r.name);
        }
        // 3rd part: back to the header's size, red to the edges again.
        let t = thumb_at(&r.path, 2.5);
        assert!(row(&t, 0) > 60.0 && row(&t, 15) > 60.0, "{}: red to the edges at 2.5 s: {t:?}", r.name);
    }
}

/// Guard for the decoder budget's slack: sources exactly at the limits still
/// decode with every decoder family we see in uploads (libavcodec checks a
/// 64-aligned width, and the MPEG decoders a scratch buffer wider than the
/// frame), including a width that is not a multiple of 64.
#[test]
fn sources_exactly_at_the_limits_still_decode() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases: [(&str, &str, &[&str]); 5] = [
        ("h264.mp4", "320x240", &X264_FAST),
        ("h264_300.mp4", "300x232", &X264_FAST),
        ("mpeg4.mp4", "320x240", &["-c:v", "mpeg4"]),
        ("hevc.mp4", "320x240", &["-c:v", "libx265", "-x265-params", "log-level=error", "-tag:v", "hvc1"]),
        ("vp9.webm", "320x240", &["-c:v", "libvpx-vp9", "-deadline", "realtime", "-b:v", "300k"]),
    ];
    for (name, size, codec) in cases {
        let p = d.join(name);
        let input = format!("testsrc=size={size}:rate=25:duration=1");
        let mut args = vec!["-f", "lavfi", "-i", &input];
        args.extend_from_slice(codec);
        args.push(p.to_str().unwrap());
        ffmpeg(&args);
        let (w, h) = size.split_once('x').map(|(w, h)| (w.parse().unwrap(), h.parse().unwrap())).unwrap();
        let o = run(&p, &d.join(format!("out-{name}")), limits(w, h)).unwrap_or_else(|e| panic!("{name} at exactly {size}: {e:?}"));
        assert!(o.transcoded.decoded_seconds > 0.9, "{name}: {}", o.transcoded.decoded_seconds);
    }
}
