//! Supervision of the worker child: the real `transcoder work` binary on real
//! files, and crash / stall / cancel paths with stand-in children.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use tokio::process::Command;
use tokio::sync::watch;
use vid_transcoder::child::{self, CancelScope, ChildMessage, ChildOutcome, Limits, Stop};
use vid_transcoder::media::{self, MediaJob};

fn limits(stall: Duration) -> Limits {
    Limits { stall_timeout: stall, base_budget: Duration::from_secs(120), budget_per_media_second: 20.0, assumed_duration_seconds: 60.0 }
}

fn job(input: &Path, out: &Path) -> MediaJob {
    MediaJob {
        input: input.into(),
        out_dir: out.into(),
        limits: media::Limits { max_duration_seconds: 14400.0, max_width: 4096, max_height: 4096 },
        ladder: vec![1080, 720, 480, 360],
        packaging: Default::default(),
    }
}

async fn run_real(job: &MediaJob, dir: &Path) -> (ChildOutcome, Vec<ChildMessage>) {
    let spec = child::write_spec(dir, job).unwrap();
    let cmd = child::worker_command(Path::new(env!("CARGO_BIN_EXE_transcoder")), &spec);
    let (_tx, rx) = watch::channel(None);
    let mut seen = Vec::new();
    let out = child::supervise(cmd, limits(Duration::from_secs(30)), rx, |m| seen.push(m.clone())).await;
    (out, seen)
}

#[tokio::test]
async fn real_child_transcodes_and_reports_progress() {
    let Some(src) = sample("bigbuckbunny.mp4") else { panic!("sample missing") };
    let dir = tempfile::tempdir().unwrap();
    let (out, seen) = run_real(&job(&src, &dir.path().join("out")), dir.path()).await;
    let ChildOutcome::Succeeded(o) = out else { panic!("{out:?}") };
    assert_eq!(o.transcoded.renditions.len(), 3);
    assert!(matches!(seen.first(), Some(ChildMessage::Probed { .. })), "{seen:?}");
    let fractions: Vec<f64> =
        seen.iter().filter_map(|m| if let ChildMessage::Progress { fraction } = m { Some(*fraction) } else { None }).collect();
    assert!(!fractions.is_empty(), "progress lines arrive");
    assert!(
        fractions.windows(2).all(|w| w[0] <= w[1]) && fractions.iter().all(|f| f.is_finite() && (0.0..=1.0).contains(f)),
        "{fractions:?}"
    );
    for r in &o.transcoded.renditions {
        assert_eq!(ffprobe(&r.path)["streams"][0]["codec_name"], "h264");
    }
}

#[tokio::test]
async fn real_child_reports_bad_media_as_permanent() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("x.mp4");
    ffmpeg(&["-f", "lavfi", "-i", "testsrc=size=32x32", "-frames:v", "1", "-f", "image2", "-c:v", "png", png.to_str().unwrap()]);
    let (out, _) = run_real(&job(&png, &dir.path().join("out")), dir.path()).await;
    assert!(matches!(&out, ChildOutcome::Failed { error, source: None } if error.code == "unsupported_container"), "{out:?}");
}

#[tokio::test]
async fn death_by_signal_is_a_crash() {
    for (script, sig) in [("kill -SEGV $$", "11"), ("kill -ABRT $$", "6"), ("kill -KILL $$", "9")] {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        let (_tx, rx) = watch::channel(None);
        let out = child::supervise(cmd, limits(Duration::from_secs(10)), rx, |_| {}).await;
        match out {
            ChildOutcome::Failed { error, .. } => {
                assert_eq!(error.code, "transcode_crashed");
                assert!(error.detail.unwrap().contains(&format!("signal {sig}")));
            }
            other => panic!("{script}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_child_without_progress_is_stalled() {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", r#"echo '{"event":"progress","fraction":0.1}'; exec sleep 30"#]);
    let (_tx, rx) = watch::channel(None);
    let t = Instant::now();
    let mut n = 0;
    let out = child::supervise(cmd, limits(Duration::from_secs(1)), rx, |_| n += 1).await;
    assert!(matches!(&out, ChildOutcome::Failed { error, .. } if error.code == "transcode_stalled"), "{out:?}");
    assert_eq!(n, 1);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[tokio::test]
async fn a_child_over_its_budget_is_stopped() {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", r#"while true; do echo '{"event":"progress","fraction":0.1}'; sleep 0.2; done"#]);
    let (_tx, rx) = watch::channel(None);
    let l = Limits { base_budget: Duration::from_secs(1), budget_per_media_second: 0.0, ..limits(Duration::from_secs(10)) };
    let out = child::supervise(cmd, l, rx, |_| {}).await;
    assert!(
        matches!(&out, ChildOutcome::Failed { error, .. } if error.code == "transcode_stalled" && error.detail.as_deref().unwrap().contains("budget")),
        "{out:?}"
    );
}

#[tokio::test]
async fn stop_kills_the_child_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &format!("echo $$ > {}; exec sleep 30", pidfile.display())]);
    let (tx, rx) = watch::channel(None);
    let started = pidfile.clone();
    tokio::spawn(async move {
        // Cancel once the child is really running (it wrote its pid).
        while std::fs::read_to_string(&started).map_or(true, |s| !s.ends_with('\n')) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tx.send(Some(Stop::Cancel(CancelScope::Operation))).unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await; // keep the sender alive
    });
    let t = Instant::now();
    let out = child::supervise(cmd, limits(Duration::from_secs(60)), rx, |_| {}).await;
    assert_eq!(out, ChildOutcome::Stopped(Stop::Cancel(CancelScope::Operation)));
    // `sleep 30` would take 30 s: anything well below proves the kill.
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    assert_ne!(unsafe { libc::kill(pid, 0) }, 0, "the child is gone");
}

#[tokio::test]
async fn a_panicking_or_silent_child_is_handled() {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "exit 101"]);
    let (_tx, rx) = watch::channel(None);
    let out = child::supervise(cmd, limits(Duration::from_secs(10)), rx.clone(), |_| {}).await;
    assert!(matches!(&out, ChildOutcome::Failed { error, .. } if error.code == "transcode_crashed"), "{out:?}");
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "exit 0"]);
    let out = child::supervise(cmd, limits(Duration::from_secs(10)), rx, |_| {}).await;
    assert!(matches!(out, ChildOutcome::Internal(_)), "{out:?}");
}
