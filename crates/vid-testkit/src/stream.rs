//! Checks of a packaged adaptive stream (issue 19) against independent tools,
//! shared by the transcoder's packaging tests and the end-to-end playback
//! tests: the manifests are read with `m3u8` and `mpegdash` from PyPI (through
//! `support/stream_check.py`), the segments' frames with ffprobe.
//!
//! A stream directory holds `master.m3u8`, `manifest.mpd` and the tracks that
//! their URIs name, relative to the directory (as the transcoder writes it, or
//! as a test downloaded it from the playback service). What is checked, for
//! every rung: `CODECS`, `RESOLUTION`, VOD media playlists with `EXT-X-MAP`;
//! every segment decodes on its own from a keyframe and holds no other; the
//! segment boundaries are the same instants in every rung; the summed segment
//! durations match the source within one frame; the DASH timeline is the HLS
//! one over the same objects, and its segment times are the ones in the
//! segments' boxes; audio and video start as in the source, as an ISO
//! reader presents them ([`crate::iso`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// `ffprobe -show_streams -show_format` of `path` (a file or a URL) as JSON.
/// Panics with ffprobe's message when it fails.
pub fn ffprobe(path: impl AsRef<std::ffi::OsStr>) -> Value {
    let path = path.as_ref();
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-print_format", "json", "-show_streams", "-show_format"])
        .arg(path)
        .output()
        .expect("ffprobe runs");
    assert!(out.status.success(), "ffprobe {} failed: {}", path.to_string_lossy(), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What the independent parsers read from the stream directory `dir`: the
/// JSON printed by `support/stream_check.py` (variants with their media
/// playlists, the audio playlists, the MPD's adaptation sets).
pub fn parsed(dir: &Path) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("support/stream_check.py");
    // `make test` points VID_TEST_PYTHON at a venv holding the pinned parsers
    // (scripts/test.sh); by hand: `pip install m3u8==6.0.0 mpegdash==0.4.1`.
    let python = std::env::var("VID_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python).arg(&script).arg(dir).output().expect("python runs");
    assert!(out.status.success(), "the parsers refused the stream (pip install m3u8 mpegdash?): {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `ffprobe -show_frames` of the video in `path`: (presentation time in seconds, key frame) per frame.
pub fn frames(path: &Path) -> Vec<(f64, bool)> {
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

/// The codec names ffprobe finds behind a manifest (a file or a URL).
pub fn probe_codecs(manifest: impl AsRef<std::ffi::OsStr>) -> Vec<String> {
    let p = ffprobe(manifest);
    p["streams"].as_array().unwrap().iter().map(|s| s["codec_name"].as_str().unwrap_or("").to_owned()).collect()
}

/// (seconds of video, one frame's duration at the average rate) of `source`.
pub fn source_video(source: &Path) -> (f64, f64) {
    let p = ffprobe(source);
    let v = p["streams"].as_array().unwrap().iter().find(|s| s["codec_type"] == "video").unwrap().clone();
    let secs: f64 = v["duration"].as_str().or(p["format"]["duration"].as_str()).unwrap().parse().unwrap();
    let (n, d) = v["avg_frame_rate"].as_str().unwrap().split_once('/').unwrap();
    (secs, d.parse::<f64>().unwrap() / n.parse::<f64>().unwrap())
}

/// Everything issue 19 asks of the stream in `dir`, made from `source`.
/// `expect`: (rung name, width, height) per rung, tallest first; `audio`:
/// whether the source has audio; `uri_prefix`: what stands before
/// `<rung>/index.m3u8` in the master playlist's URIs (`""` as the transcoder
/// writes it, `"pb_…/"` as the playback service serves it). Returns the
/// parsers' JSON. Panics on the first check that fails.
pub fn check_stream_dir(dir: &Path, source: &Path, expect: &[(&str, u32, u32)], audio: bool, uri_prefix: &str) -> Value {
    let j = parsed(dir);
    check_master(&j, expect, audio, uri_prefix);
    check_dash(&j, expect, audio);
    for manifest in ["master.m3u8", "manifest.mpd"] {
        let codecs = probe_codecs(dir.join(manifest));
        assert!(codecs.iter().any(|c| c == "h264"), "{manifest}: {codecs:?}");
        assert_eq!(codecs.iter().any(|c| c == "aac"), audio, "{manifest}: {codecs:?}");
    }
    check_dash_times(dir, &j);
    if audio {
        check_av_sync(dir, &j, source);
    }

    // Keyframes and boundaries, read from the segments themselves.
    let (source_secs, frame) = source_video(source);
    let mut boundaries: Option<Vec<f64>> = None;
    for v in &j["variants"].as_array().unwrap().clone() {
        let track = dir.join(v["uri"].as_str().unwrap()).parent().unwrap().to_owned();
        let starts = check_segments(&track, &v["playlist"]);
        match &boundaries {
            None => boundaries = Some(starts),
            Some(b) => assert_eq!(b, &starts, "segment boundaries differ between rungs ({})", v["uri"]),
        }
        let total: f64 = v["playlist"]["segments"].as_array().unwrap().iter().map(|s| s["duration"].as_f64().unwrap()).sum();
        assert!((total - source_secs).abs() <= frame + 1e-6, "{}: segments sum to {total} s, the source has {source_secs} s", v["uri"]);
    }
    j
}

/// AAC-LC's encoder delay (priming) in samples, as FFmpeg's `aac` encoder
/// writes it (`initial_padding`): the first 1024 decoded samples come
/// before the source's first sample. With no edit list to trim them, a
/// reader presents the source's first sample 1024 samples after the track's
/// first composition time.
pub const AAC_PRIMING_SAMPLES: i64 = 1024;

/// The MPD's segment timelines agree with the segments' own boxes: in every
/// Representation, segment `n`'s earliest presentation time (read by
/// [`crate::iso`]) is `S@t` plus the durations before it, exactly, in the
/// `mdhd` timescale the `SegmentTemplate` names (ISO/IEC 23009-1
/// §5.3.9.6, ISO/IEC 23000-19 §7.3.2.2). A player trusting the MPD and a
/// player reading the boxes then show the same frame at the same time.
pub fn check_dash_times(dir: &Path, j: &Value) {
    for set in j["dash"]["adaptation_sets"].as_array().unwrap() {
        for r in set["representations"].as_array().unwrap() {
            let init_path = dir.join(r["initialization"].as_str().unwrap());
            let init = std::fs::read(&init_path).unwrap_or_else(|e| panic!("{}: {e}", init_path.display()));
            let ts = r["timescale"].as_i64().unwrap();
            assert_eq!(i64::from(crate::iso::timescale(&init)), ts, "{}: the template's timescale is the track's", init_path.display());
            let mut at = r["start"].as_i64().unwrap();
            for (n, d) in r["durations"].as_array().unwrap().iter().enumerate() {
                let name = r["media"].as_str().unwrap().replace("$Number%05d$", &format!("{:05}", n + 1));
                let seg = std::fs::read(dir.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
                let ept = crate::iso::earliest_presentation(&init, &seg);
                assert_eq!(ept, at, "{name}: earliest presentation time {ept} in its boxes, {at} in the MPD (timescale {ts})");
                at += d.as_i64().unwrap();
            }
        }
    }
    // The presentation lasts until its last track ends (S@t − PTO + Σd),
    // rounded up to the millisecond: a player stops there.
    let end = j["dash"]["adaptation_sets"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|set| set["representations"].as_array().unwrap().iter())
        .map(|r| {
            period_start(r)
                + r["durations"].as_array().unwrap().iter().map(|d| d.as_f64().unwrap()).sum::<f64>() / r["timescale"].as_f64().unwrap()
        })
        .fold(0.0, f64::max);
    let stated = j["dash"]["duration"].as_str().unwrap();
    let stated: f64 =
        stated.strip_prefix("PT").and_then(|x| x.strip_suffix('S')).unwrap_or_else(|| panic!("duration {stated}")).parse().unwrap();
    assert!(stated >= end - 1e-9 && stated <= end + 0.001 + 1e-9, "mediaPresentationDuration {stated} s, the tracks end at {end} s");
}

/// Where a Representation's first segment starts on the period's time line,
/// in seconds: (`S@t` − `presentationTimeOffset`) / `timescale`
/// (ISO/IEC 23009-1 §5.3.9.6).
fn period_start(r: &Value) -> f64 {
    (r["start"].as_i64().unwrap() - r["pto"].as_i64().unwrap()) as f64 / r["timescale"].as_f64().unwrap()
}

/// A/V sync as a standard reader sees it: the time between the first video
/// frame and the audio's first source sample (its first composition time
/// plus [`AAC_PRIMING_SAMPLES`]), both read from the first segments' boxes,
/// is the source's (ffprobe's stream start times) within half a frame (at
/// most half an AAC frame); and the same on the MPD's time line.
pub fn check_av_sync(dir: &Path, j: &Value, source: &Path) {
    let first = |track: &Path, playlist: &Value| -> (Vec<u8>, Vec<u8>) {
        let seg = playlist["segments"][0]["uri"].as_str().unwrap();
        (std::fs::read(track.join("init.mp4")).unwrap(), std::fs::read(track.join(seg)).unwrap())
    };
    let variant = &j["variants"][0];
    let video_dir = dir.join(variant["uri"].as_str().unwrap()).parent().unwrap().to_owned();
    let (vi, vs) = first(&video_dir, &variant["playlist"]);
    let video = crate::iso::earliest_presentation(&vi, &vs) as f64 / f64::from(crate::iso::timescale(&vi));
    let media = j["media"].as_array().unwrap().iter().find(|m| m["type"] == "AUDIO").expect("an audio rendition");
    let audio_dir = dir.join(media["uri"].as_str().unwrap()).parent().unwrap().to_owned();
    let (ai, aseg) = first(&audio_dir, &j["audio_playlists"][0]);
    let rate: f64 = ffprobe(audio_dir.join("init.mp4"))["streams"][0]["sample_rate"].as_str().unwrap().parse().unwrap();
    let audio =
        crate::iso::earliest_presentation(&ai, &aseg) as f64 / f64::from(crate::iso::timescale(&ai)) + AAC_PRIMING_SAMPLES as f64 / rate;
    let src = ffprobe(source);
    let src_start = |kind: &str| -> f64 {
        let s = src["streams"].as_array().unwrap().iter().find(|s| s["codec_type"] == kind).unwrap();
        s["start_time"].as_str().unwrap().parse().unwrap()
    };
    let theirs = src_start("video") - src_start("audio");
    // Half a frame, and never as much as half an AAC frame, so that a
    // priming mistake (1024 samples) fails at any frame rate.
    let (_, frame) = source_video(source);
    let tolerance = (frame / 2.0).min(AAC_PRIMING_SAMPLES as f64 / 2.0 / rate);
    let ours = video - audio;
    assert!(
        (ours - theirs).abs() <= tolerance,
        "video − audio start: {ours:.4} s in the stream's boxes, {theirs:.4} s in the source (tolerance {tolerance:.4} s)"
    );
    // The same on the MPD's time line (S@t − presentationTimeOffset), which
    // a DASH player uses: every rung starts at one instant, and the audio
    // as the boxes say.
    let sets = j["dash"]["adaptation_sets"].as_array().unwrap();
    let starts: Vec<f64> = sets[0]["representations"].as_array().unwrap().iter().map(period_start).collect();
    assert!(starts.iter().all(|s| (s - starts[0]).abs() < 1e-6), "rungs start at different period times: {starts:?}");
    let audio_rep = &sets.iter().find(|s| s["content_type"] == "audio").expect("an audio AdaptationSet")["representations"][0];
    let dash = starts[0] - (period_start(audio_rep) + AAC_PRIMING_SAMPLES as f64 / rate);
    assert!(
        (dash - theirs).abs() <= tolerance,
        "video − audio start: {dash:.4} s on the MPD's time line, {theirs:.4} s in the source (tolerance {tolerance:.4} s)"
    );
}

/// Every segment of the media playlist `playlist` (in `dir`) decodes on its
/// own (after `init.mp4`) from a key frame and holds no other; in the whole
/// track the key frames are exactly at the segment starts the playlist's
/// durations give. Returns the key frames' times.
pub fn check_segments(dir: &Path, playlist: &Value) -> Vec<f64> {
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

/// The master playlist as parsed: version 7, independent segments, one
/// variant per expected rung at `<uri_prefix><rung>/index.m3u8` with its
/// `RESOLUTION`, exact `CODECS`, bandwidths and frame rate, and an audio
/// group exactly when there is audio.
pub fn check_master(j: &Value, expect: &[(&str, u32, u32)], audio: bool, uri_prefix: &str) {
    assert_eq!((j["version"].as_i64(), j["independent"].as_bool()), (Some(7), Some(true)), "{j}");
    let variants = j["variants"].as_array().unwrap();
    assert_eq!(variants.len(), expect.len(), "{j}");
    for (v, (name, w, h)) in variants.iter().zip(expect) {
        assert_eq!(v["uri"], format!("{uri_prefix}{name}/index.m3u8"), "relative URIs");
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

/// A media playlist as parsed: version 7, VOD, `EXT-X-ENDLIST`, independent
/// segments, `EXT-X-MAP` naming `init.mp4`, every segment within
/// `EXT-X-TARGETDURATION` and named relative to the playlist.
pub fn check_media(p: &Value) {
    assert_eq!((p["version"].as_i64(), p["playlist_type"].as_str()), (Some(7), Some("vod")), "{p}");
    assert_eq!((p["endlist"].as_bool(), p["independent"].as_bool()), (Some(true), Some(true)), "{p}");
    assert_eq!(p["map"][0], "init.mp4");
    let target = p["target_duration"].as_f64().unwrap();
    let segs = p["segments"].as_array().unwrap();
    assert!(!segs.is_empty());
    assert!(segs.iter().all(|s| s["duration"].as_f64().unwrap() <= target && !s["uri"].as_str().unwrap().contains('/')), "{p}");
}

/// The MPD as parsed: static, one video AdaptationSet with a Representation
/// per rung (id, size and codec as HLS says) whose timeline is the HLS
/// playlist's durations, and one AAC audio AdaptationSet when there is audio.
pub fn check_dash(j: &Value, expect: &[(&str, u32, u32)], audio: bool) {
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
