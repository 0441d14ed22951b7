//! The storyboard, thumbnail frames and poster (issue 20) on real media.
//!
//! The fixture opens on 2 s of black, then `testsrc2` (which moves every
//! frame), 6 s at 25 fps, so the instants (every 1 s) are distinct pictures
//! after the black and the default poster must skip the black opening.
//! The VTT is read with `webvtt-py` (PyPI; `make test`'s media venv, python
//! from `VID_TEST_PYTHON`); each tile is compared with the frame the ffmpeg
//! CLI decodes at its cue's start, scaled to the tile size.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;
use vid_transcoder::media::{self, Limits, MediaJob, MediaOutcome, Packaging};

/// 2 s black then `testsrc2`, 320×240, 25 fps, 6 s, no audio.
fn black_then_pattern(dir: &Path) -> PathBuf {
    let p = dir.join("black-then-pattern.mp4");
    let lavfi = "color=black:size=320x240:rate=25:duration=2[a];testsrc2=size=320x240:rate=25:duration=4[b];[a][b]concat=n=2:v=1:a=0";
    ffmpeg_parts(&[&["-f", "lavfi", "-i", lavfi], &X264_FAST, &[p.to_str().unwrap()]]);
    p
}

fn package(input: &Path, out: &Path, poster_time: Option<f64>) -> MediaOutcome {
    let limits = Limits { max_duration_seconds: 14400.0, max_width: 4096, max_height: 4096 };
    let packaging = Packaging { segment_seconds: 2.0, mp4: false, poster_time, storyboard: true };
    let job = MediaJob { input: input.into(), out_dir: out.into(), limits, ladder: vec![1080, 720, 480, 360], packaging };
    media::run(&job, &mut |_| {}).unwrap_or_else(|(e, _)| panic!("{}: {e}", input.display()))
}

/// Raw grey pixels (`w`×`h`) of the ffmpeg CLI's output for `args` (input side) + `vf`.
fn grey(input_args: &[&str], vf: &str, (w, h): (u32, u32)) -> Vec<u8> {
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-nostdin"])
        .args(input_args)
        .args(["-frames:v", "1", "-vf", &format!("{vf},format=gray"), "-f", "rawvideo", "-"])
        .output()
        .expect("ffmpeg runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout.len(), (w * h) as usize, "{input_args:?} {vf}");
    out.stdout
}

/// The source's frame at `t` s scaled to `size`, as the CLI decodes it.
fn source_frame(src: &Path, t: f64, size: (u32, u32)) -> Vec<u8> {
    grey(&["-ss", &format!("{t:.3}"), "-i", src.to_str().unwrap()], &format!("scale={}:{}:flags=area", size.0, size.1), size)
}

/// The cues as webvtt-py reads them: (start s, end s, text).
fn cues(vtt: &Path) -> Vec<(f64, f64, String)> {
    let python = std::env::var("VID_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = "import json,sys,webvtt\nprint(json.dumps([[c.start_in_seconds + int(c.start.split('.')[-1]) / 1000, \
                  c.end_in_seconds + int(c.end.split('.')[-1]) / 1000, c.text] for c in webvtt.read(sys.argv[1])]))";
    let out = Command::new(&python).args(["-c", script]).arg(vtt).output().expect("python runs");
    assert!(out.status.success(), "webvtt-py refused the VTT (pip install webvtt-py?): {}", String::from_utf8_lossy(&out.stderr));
    let v: Vec<(f64, f64, String)> = serde_json::from_slice(&out.stdout).unwrap();
    v
}

#[test]
fn the_storyboard_cues_point_at_their_tiles_and_the_tiles_are_the_right_frames() {
    let dir = tempfile::tempdir().unwrap();
    let src = black_then_pattern(dir.path());
    let o = package(&src, &dir.path().join("out"), None);
    let sb = o.transcoded.stream.storyboard.as_ref().expect("a storyboard");
    let sdir = &o.transcoded.stream.dir;
    assert_eq!(sb.interval_ms, 1000, "6 s: the 1 s floor");
    assert_eq!(sb.tiles_ms, vec![0, 1000, 2000, 3000, 4000, 5000]);
    let (tw, th) = (sb.tile_width, sb.tile_height);
    assert_eq!((tw, th), (160, 120), "160 px wide, 4:3 kept");
    let sheet = ffprobe(sdir.join("storyboard.jpg"));
    let (sw, sh) = (sheet["streams"][0]["width"].as_u64().unwrap() as u32, sheet["streams"][0]["height"].as_u64().unwrap() as u32);
    assert_eq!((sw, sh), (6 * tw, th), "one row of six tiles");

    // The VTT, read by webvtt-py: one cue per tile, back to back from 0 to the end.
    let cues = cues(&sdir.join("storyboard.vtt"));
    assert_eq!(cues.len(), sb.tiles_ms.len());
    let json: Value = serde_json::from_slice(&std::fs::read(sdir.join("storyboard.json")).unwrap()).unwrap();
    assert_eq!(
        (json["url"].as_str(), json["tile_width"].as_u64(), json["tile_height"].as_u64()),
        (Some("storyboard.jpg"), Some(160), Some(120))
    );
    let duration = json["duration"].as_f64().unwrap();
    assert!((duration - 6.0).abs() <= 0.04 + 1e-9, "the video's duration: {duration}");
    assert!(cues[0].0.abs() < 1e-9, "the first cue starts at 0: {cues:?}");
    assert!((cues.last().unwrap().1 - duration).abs() < 1e-6, "the last cue ends at the end: {cues:?}");
    for (i, (start, end, text)) in cues.iter().enumerate() {
        assert!((start - sb.tiles_ms[i] as f64 / 1000.0).abs() < 1e-6, "cue {i}: {start}");
        if let Some(next) = cues.get(i + 1) {
            assert!((end - next.0).abs() < 1e-6, "cue {i} ends where {} starts: {cues:?}", i + 1);
        }
        let (x, y) = (i as u32 * tw, 0);
        assert_eq!(text, &format!("storyboard.jpg#xywh={x},{y},{tw},{th}"), "cue {i}");
        let tile = &json["tiles"][i];
        assert_eq!(
            (tile["start"].as_f64(), tile["x"].as_u64(), tile["y"].as_u64()),
            (Some(*start), Some(x as u64), Some(0)),
            "json tile {i}"
        );
    }

    // Each tile is the frame at its start: closer to it than to the neighbouring instants' frames.
    let tiles: Vec<Vec<u8>> = (0..cues.len())
        .map(|i| grey(&["-i", sdir.join("storyboard.jpg").to_str().unwrap()], &format!("crop={tw}:{th}:{}:0", i as u32 * tw), (tw, th)))
        .collect();
    for (i, tile) in tiles.iter().enumerate() {
        let t = sb.tiles_ms[i] as f64 / 1000.0;
        let right = source_frame(&src, t, (tw, th));
        let d_right = diff(tile, &right);
        assert!(d_right < 6.0, "tile {i} vs the frame at {t} s: {d_right:.2}");
        for wrong_t in [t - 1.0, t + 1.0, t + 0.5].into_iter().filter(|w| (0.0..6.0).contains(w)) {
            let wrong = source_frame(&src, wrong_t, (tw, th));
            if diff(&right, &wrong) > 3.0 {
                let d_wrong = diff(tile, &wrong);
                assert!(d_right < d_wrong, "tile {i} ({t} s): right frame {d_right:.2}, the frame at {wrong_t} s {d_wrong:.2}");
            }
        }
    }

    // The thumbnail frames: every instant plus the last frame (5.96 s), at the tallest rung's size.
    assert_eq!(sb.frames_ms, vec![0, 1000, 2000, 3000, 4000, 5000, 5960]);
    assert_eq!((sb.frame_width, sb.frame_height), (320, 240));
    let last = grey(&["-i", sdir.join("frames/5960.jpg").to_str().unwrap()], "scale=16:16:flags=area", (16, 16));
    assert!(diff(&last, &thumb_at(&src, 5.96)) < diff(&last, &thumb_at(&src, 5.0)), "frames/5960.jpg is the last frame");
    for (path, _) in &sb.objects {
        assert!(sdir.join(path).is_file(), "{path} listed and written");
    }
    assert!(o.manifests.objects.iter().any(|(p, t)| p == "storyboard.vtt" && t == "text/vtt"), "uploaded with the stream");

    // The default poster skips the black opening: the instant of the first third with the most detail.
    let poster = thumb(&o.transcoded.poster.as_ref().unwrap().path);
    let mean = poster.iter().map(|&v| v as f64).sum::<f64>() / poster.len() as f64;
    assert!(mean > 40.0, "the default poster is not the black opening (mean luma {mean:.1})");
    assert!(diff(&poster, &thumb_at(&src, 2.0)) < 6.0, "the frame at 2 s, the first non-black instant");
    assert_eq!(std::fs::read(sdir.join("poster.jpg")).unwrap(), std::fs::read(&o.transcoded.poster.as_ref().unwrap().path).unwrap());
}

#[test]
fn poster_time_chooses_the_poster_and_past_the_end_gives_the_last_frame() {
    let dir = tempfile::tempdir().unwrap();
    let src = black_then_pattern(dir.path());
    let o = package(&src, &dir.path().join("at"), Some(3.32));
    let poster = thumb(&o.transcoded.poster.as_ref().unwrap().path);
    let (right, early, late) = (thumb_at(&src, 3.32), thumb_at(&src, 3.0), thumb_at(&src, 3.8));
    let d = diff(&poster, &right);
    assert!(d < 4.0 && d < diff(&poster, &early) && d < diff(&poster, &late), "the frame at 3.32 s: {d:.2}");

    let o = package(&src, &dir.path().join("past"), Some(600.0));
    let poster = thumb(&o.transcoded.poster.as_ref().unwrap().path);
    let d = diff(&poster, &thumb_at(&src, 5.96));
    assert!(d < 4.0 && d < diff(&poster, &thumb_at(&src, 5.0)), "past the end: the last frame ({d:.2})");
}
