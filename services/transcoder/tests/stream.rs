//! The streaming packaging (issue 19) on real media: every rung as CMAF with
//! aligned IDR frames, one audio track, the HLS and DASH manifests.
//!
//! The manifests are read back with independent parsers (`m3u8` and
//! `mpegdash` from PyPI, through `tests/support/stream_check.py`; needs
//! `pip install m3u8 mpegdash`) and with ffprobe; the segments' frames are
//! read with ffprobe. Checked for every clip: every segment of every rung
//! starts with a keyframe and holds no other, segment boundaries are the
//! same instants in every rung, and the summed segment durations match the
//! source within one frame.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;
use vid_transcoder::media::{self, Limits, MediaJob, MediaOutcome, Packaging};

const LADDER: [u32; 4] = [1080, 720, 480, 360];

fn package(input: &Path, out: &Path, packaging: Packaging) -> MediaOutcome {
    let limits = Limits { max_duration_seconds: 14400.0, max_width: 4096, max_height: 4096 };
    let job = MediaJob { input: input.into(), out_dir: out.into(), limits, ladder: LADDER.to_vec(), packaging };
    media::run(&job, &mut |_| {}).unwrap_or_else(|(e, _)| panic!("{}: {e}", input.display()))
}

/// What the independent parsers read from the stream directory.
fn parsed(dir: &Path) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/stream_check.py");
    // `make test` points VID_TEST_PYTHON at a venv holding the pinned parsers
    // (scripts/test.sh); by hand: `pip install m3u8==6.0.0 mpegdash==0.4.1`.
    let python = std::env::var("VID_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python).arg(&script).arg(dir).output().expect("python runs");
    assert!(out.status.success(), "the parsers refused the stream (pip install m3u8 mpegdash?): {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `ffprobe -show_frames` of the video in `path`: (presentation time in seconds, key frame) per frame.
fn frames(path: &Path) -> Vec<(f64, bool)> {
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-select_streams", "v:0", "-show_entries", "frame=best_effort_timestamp_time,key_frame,pict_type"])
        .args(["-of", "json"])
        .arg(path)
        .output()
        .expect("ffprobe runs");
    assert!(out.status.success(), "ffprobe {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let frames = v["frames"].as_array().cloned().unwrap_or_default();
    frames.iter().map(|f| (f["best_effort_timestamp_time"].as_str().unwrap().parse().unwrap(), f["key_frame"] == 1)).collect()
}

/// The streams ffprobe finds behind a manifest: codec names.
fn probe_codecs(manifest: &Path) -> Vec<String> {
    let p = ffprobe(manifest);
    p["streams"].as_array().unwrap().iter().map(|s| s["codec_name"].as_str().unwrap_or("").to_owned()).collect()
}

/// Seconds of video in `source` and one frame's duration at its average rate.
fn source_video(source: &Path) -> (f64, f64) {
    let p = ffprobe(source);
    let v = p["streams"].as_array().unwrap().iter().find(|s| s["codec_type"] == "video").unwrap().clone();
    let secs: f64 = v["duration"].as_str().or(p["format"]["duration"].as_str()).unwrap().parse().unwrap();
    let (n, d) = v["avg_frame_rate"].as_str().unwrap().split_once('/').unwrap();
    (secs, d.parse::<f64>().unwrap() / n.parse::<f64>().unwrap())
}

/// Everything issue 19 asks of a packaged stream; `expect`: (name, width, height) per rung.
fn check_stream(o: &MediaOutcome, source: &Path, expect: &[(&str, u32, u32)], audio: bool) -> Value {
    let stream = &o.transcoded.stream;
    let got: Vec<(String, u32, u32)> = stream.video.iter().map(|v| (v.name.clone(), v.width, v.height)).collect();
    assert_eq!(got, expect.iter().map(|(n, w, h)| (n.to_string(), *w, *h)).collect::<Vec<_>>());
    assert_eq!(stream.audio.is_some(), audio);
    let j = parsed(&stream.dir);
    check_master(&j, expect, audio);
    check_dash(&j, expect, audio);
    for (manifest, want) in [("master.m3u8", audio), ("manifest.mpd", audio)] {
        let codecs = probe_codecs(&stream.dir.join(manifest));
        assert!(codecs.iter().any(|c| c == "h264"), "{manifest}: {codecs:?}");
        assert_eq!(codecs.iter().any(|c| c == "aac"), want, "{manifest}: {codecs:?}");
    }
    if audio {
        // A/V sync: audio and video start together, as in the source (within one AAC frame, ≤ 64 ms).
        let p = ffprobe(&stream.dir.join("master.m3u8"));
        let start = |codec: &str| -> f64 {
            let s = p["streams"].as_array().unwrap().iter().find(|s| s["codec_name"] == codec).unwrap();
            s["start_time"].as_str().unwrap().parse().unwrap()
        };
        let src = ffprobe(source);
        let src_start = |kind: &str| -> f64 {
            let s = src["streams"].as_array().unwrap().iter().find(|s| s["codec_type"] == kind).unwrap();
            s["start_time"].as_str().unwrap().parse().unwrap()
        };
        let (ours, theirs) = (start("h264") - start("aac"), src_start("video") - src_start("audio"));
        assert!((ours - theirs).abs() <= 0.064, "video − audio start: {ours:.3} s in the stream, {theirs:.3} s in the source");
    }

    // Keyframes and boundaries, read from the segments themselves.
    let (source_secs, frame) = source_video(source);
    let mut boundaries: Option<Vec<f64>> = None;
    for v in &j["variants"].as_array().unwrap().clone() {
        let dir = stream.dir.join(v["uri"].as_str().unwrap()).parent().unwrap().to_owned();
        let starts = check_segments(&dir, &v["playlist"]);
        match &boundaries {
            None => boundaries = Some(starts),
            Some(b) => assert_eq!(b, &starts, "segment boundaries differ between rungs ({})", v["uri"]),
        }
        let total: f64 = v["playlist"]["segments"].as_array().unwrap().iter().map(|s| s["duration"].as_f64().unwrap()).sum();
        assert!((total - source_secs).abs() <= frame + 1e-6, "{}: segments sum to {total} s, the source has {source_secs} s", v["uri"]);
    }
    j
}

/// Every segment of the media playlist `playlist` (in `dir`) decodes on its
/// own (after `init.mp4`) from a key frame and holds no other; in the whole
/// track the key frames are exactly at the segment starts the playlist's
/// durations give. Returns the key frames' times.
fn check_segments(dir: &Path, playlist: &Value) -> Vec<f64> {
    let init = std::fs::read(dir.join("init.mp4")).unwrap();
    let mut whole = init.clone();
    let mut durations = Vec::new();
    for s in playlist["segments"].as_array().unwrap() {
        let seg = dir.join(s["uri"].as_str().unwrap());
        let bytes = std::fs::read(&seg).unwrap();
        let alone: PathBuf = seg.with_extension("probe.mp4");
        std::fs::write(&alone, [init.clone(), bytes.clone()].concat()).unwrap();
        let f = frames(&alone);
        std::fs::remove_file(&alone).unwrap();
        assert!(!f.is_empty(), "{} has no frame", seg.display());
        let first = f.iter().map(|x| x.0).fold(f64::MAX, f64::min);
        let keys: Vec<f64> = f.iter().filter(|x| x.1).map(|x| x.0).collect();
        assert_eq!(keys, vec![first], "{}: exactly one key frame, the first: {f:?}", seg.display());
        whole.extend(bytes);
        durations.push(s["duration"].as_f64().unwrap());
    }
    let track = dir.join("whole.probe.mp4");
    std::fs::write(&track, whole).unwrap();
    let f = frames(&track);
    std::fs::remove_file(&track).unwrap();
    let keys: Vec<f64> = f.iter().filter(|x| x.1).map(|x| x.0).collect();
    let mut at = f.iter().map(|x| x.0).fold(f64::MAX, f64::min);
    let mut starts = Vec::new();
    for d in durations {
        starts.push(at);
        at += d;
    }
    assert_eq!(keys.len(), starts.len(), "one key frame per segment in {}: {keys:?} vs {starts:?}", dir.display());
    assert!(keys.iter().zip(&starts).all(|(k, s)| (k - s).abs() < 1e-3), "key frames at the segment starts: {keys:?} vs {starts:?}");
    keys
}

fn check_master(j: &Value, expect: &[(&str, u32, u32)], audio: bool) {
    assert_eq!((j["version"].as_i64(), j["independent"].as_bool()), (Some(7), Some(true)), "{j}");
    let variants = j["variants"].as_array().unwrap();
    assert_eq!(variants.len(), expect.len(), "{j}");
    for (v, (name, w, h)) in variants.iter().zip(expect) {
        assert_eq!(v["uri"], format!("{name}/index.m3u8"), "relative URIs");
        assert_eq!(v["resolution"], serde_json::json!([w, h]));
        let codecs = v["codecs"].as_str().unwrap();
        let avc = codecs.split(',').next().unwrap();
        assert!(avc.len() == 11 && avc.starts_with("avc1.") && u32::from_str_radix(&avc[5..], 16).is_ok(), "{codecs}");
        assert_eq!(codecs.ends_with(",mp4a.40.2"), audio, "{codecs}");
        assert_eq!(v["audio"].as_str() == Some("audio"), audio);
        let (peak, avg) = (v["bandwidth"].as_u64().unwrap(), v["average_bandwidth"].as_u64().unwrap());
        assert!(peak >= avg && avg > 0, "{v}");
        assert!(v["frame_rate"].as_f64().unwrap() > 0.0, "{v}");
        check_media(&v["playlist"]);
    }
    let groups: Vec<&Value> = j["media"].as_array().unwrap().iter().filter(|m| m["type"] == "AUDIO").collect();
    assert_eq!(groups.len(), usize::from(audio), "an audio group iff there is audio: {j}");
    for p in j["audio_playlists"].as_array().unwrap() {
        check_media(p);
    }
}

fn check_media(p: &Value) {
    assert_eq!((p["version"].as_i64(), p["playlist_type"].as_str()), (Some(7), Some("vod")), "{p}");
    assert_eq!((p["endlist"].as_bool(), p["independent"].as_bool()), (Some(true), Some(true)), "{p}");
    assert_eq!(p["map"][0], "init.mp4");
    let target = p["target_duration"].as_f64().unwrap();
    let segs = p["segments"].as_array().unwrap();
    assert!(!segs.is_empty());
    assert!(segs.iter().all(|s| s["duration"].as_f64().unwrap() <= target && !s["uri"].as_str().unwrap().contains('/')), "{p}");
}

fn check_dash(j: &Value, expect: &[(&str, u32, u32)], audio: bool) {
    let d = &j["dash"];
    assert_eq!(d["type"], "static");
    let sets = d["adaptation_sets"].as_array().unwrap();
    assert_eq!(sets.len(), 1 + usize::from(audio), "{d}");
    assert_eq!(sets[0]["content_type"], "video");
    let reps = sets[0]["representations"].as_array().unwrap();
    assert_eq!(reps.len(), expect.len());
    let hls = j["variants"].as_array().unwrap();
    for ((r, (name, w, h)), v) in reps.iter().zip(expect).zip(hls) {
        assert_eq!((r["id"].as_str(), r["width"].as_u64(), r["height"].as_u64()), (Some(*name), Some(u64::from(*w)), Some(u64::from(*h))));
        assert_eq!(r["codecs"].as_str(), v["codecs"].as_str().unwrap().split(',').next());
        // The same segments as HLS.
        let ts = r["timescale"].as_f64().unwrap();
        let dash: Vec<f64> = r["durations"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() / ts).collect();
        let m3u: Vec<f64> = v["playlist"]["segments"].as_array().unwrap().iter().map(|s| s["duration"].as_f64().unwrap()).collect();
        assert_eq!(dash.len(), m3u.len());
        assert!(dash.iter().zip(&m3u).all(|(a, b)| (a - b).abs() < 1e-5), "{dash:?} vs {m3u:?}");
    }
    if audio {
        assert_eq!(
            (sets[1]["content_type"].as_str(), sets[1]["representations"][0]["codecs"].as_str()),
            (Some("audio"), Some("mp4a.40.2"))
        );
    }
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
    let o = package(&src, &out, Packaging { segment_seconds: 2.0, mp4: false });
    assert!(o.transcoded.renditions.is_empty());
    assert!(!out.join("360p.mp4").exists());
    let j = check_stream(&o, &src, &[("360p", 640, 360)], true);
    assert_eq!(j["variants"][0]["playlist"]["segments"].as_array().unwrap().len(), 3, "5 s in 2 s segments (the setting): {j}");
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
