//! Helpers shared by the integration tests: clip generation with the ffmpeg
//! CLI and output inspection with ffprobe.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs the ffmpeg CLI quietly; panics on failure.
/// The encoder arguments every generated H.264 test clip uses: fast, 4:2:0.
pub const X264_FAST: [&str; 6] = ["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p"];

/// [`ffmpeg`] with its arguments given in pieces (e.g. inputs, [`X264_FAST`], output).
pub fn ffmpeg_parts(parts: &[&[&str]]) {
    ffmpeg(&parts.concat());
}

pub fn ffmpeg(args: &[&str]) {
    let out = Command::new("ffmpeg").args(["-v", "error", "-y", "-nostdin"]).args(args).output().expect("ffmpeg runs");
    assert!(out.status.success(), "ffmpeg {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// `ffprobe -show_streams -show_format` as JSON (of a file or a URL).
#[allow(unused_imports)] // not every test file probes
pub use vid_testkit::stream::ffprobe;

/// The top-level MP4 atoms in file order.
pub fn top_level_atoms(path: &Path) -> Vec<String> {
    let data = std::fs::read(path).unwrap();
    let mut atoms = Vec::new();
    let mut pos = 0usize;
    while pos + 8 <= data.len() {
        let mut size = u32::from_be_bytes(data[pos..pos + 4].try_into().unwrap()) as u64;
        let name = String::from_utf8_lossy(&data[pos + 4..pos + 8]).into_owned();
        if size == 1 {
            size = u64::from_be_bytes(data[pos + 8..pos + 16].try_into().unwrap());
        } else if size == 0 {
            size = (data.len() - pos) as u64;
        }
        atoms.push(name);
        if size < 8 {
            break;
        }
        pos += size as usize;
    }
    atoms
}

/// A grey 16×16 thumbnail (256 bytes) of the first frame of `path`, as the
/// ffmpeg CLI shows it (autorotate on), squeezed to 16×16.
pub fn thumb(path: &Path) -> Vec<u8> {
    vid_testkit::frames::grey_thumbnail(path, None)
}

/// A grey 16×16 thumbnail (256 bytes, row-major) of the frame of `path` at
/// `secs` seconds, as the ffmpeg CLI shows it (autorotate on).
pub fn thumb_at(path: &Path, secs: f64) -> Vec<u8> {
    vid_testkit::frames::grey_thumbnail(path, Some(secs))
}

// Not every test binary that includes this module compares frames.
#[allow(unused_imports)]
pub use vid_testkit::frames::diff;

/// The sample media: the repository's `fixtures/media`, else `../shared/media` beside it.
pub fn sample(name: &str) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    [root.join("fixtures/media").join(name), root.join("../shared/media").join(name)].into_iter().find(|p| p.exists())
}

/// Generates the test clips into `dir` and returns their paths by name.
pub struct Clips {
    pub dir: PathBuf,
}

impl Clips {
    pub fn new(dir: &Path) -> Self {
        Self { dir: dir.to_owned() }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// testsrc `size` + 440 Hz sine, `secs` long, H.264/AAC MP4 (moov at the end, like most encoders).
    pub fn av(&self, name: &str, size: &str, secs: &str) -> PathBuf {
        let p = self.path(name);
        let (video, audio) = (format!("testsrc=size={size}:rate=25:duration={secs}"), format!("sine=frequency=440:duration={secs}"));
        ffmpeg_parts(&[
            &["-f", "lavfi", "-i", &video, "-f", "lavfi", "-i", &audio],
            &X264_FAST,
            &["-c:a", "aac", "-shortest", p.to_str().unwrap()],
        ]);
        p
    }

    /// Video only.
    pub fn video_only(&self, name: &str, size: &str, secs: &str) -> PathBuf {
        let p = self.path(name);
        let video = format!("testsrc=size={size}:rate=25:duration={secs}");
        ffmpeg_parts(&[&["-f", "lavfi", "-i", &video], &X264_FAST, &[p.to_str().unwrap()]]);
        p
    }
}

/// The stack's `VID__…` settings: `.local/stack.env` (via `vid_testkit`), with
/// variables already set in the process environment taking precedence.
#[allow(dead_code)]
pub fn stack_env() -> std::collections::HashMap<String, String> {
    let mut env = vid_testkit::stack_env();
    env.extend(std::env::vars().filter(|(k, _)| k.starts_with("VID__")));
    env
}

/// Every `TranscodeReport` received, per operation id, in arrival order.
pub type Reports = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Vec<vid_core::messages::TranscodeReport>>>>;

/// The test's side of the broker for `amqp`: `amqp.prefix`'s topology
/// declared, a confirm-mode publisher, and a task collecting (and acking)
/// every report on `P.transcode.reports`. With `check_correlation`, each
/// report must carry its operation id as `x-correlation-id` (else the
/// collector panics and stops collecting, so the test times out waiting).
pub async fn broker_side(
    amqp: &vid_infra::settings::AmqpSettings,
    check_correlation: bool,
) -> (vid_infra::amqp::Publisher, vid_infra::amqp::Topology, Reports) {
    use futures::StreamExt;
    use lapin::options::{BasicAckOptions, BasicConsumeOptions};
    let conn = vid_infra::amqp::connect(amqp, std::time::Duration::from_secs(10)).await.unwrap();
    let publisher = vid_infra::amqp::Publisher::new(&conn).await.unwrap();
    let topology = vid_infra::amqp::Topology::new(&amqp.prefix);
    topology.declare(publisher.channel()).await.unwrap();
    let channel = conn.create_channel().await.unwrap();
    let mut consumer = channel
        .basic_consume(&topology.transcode_reports(), "test", BasicConsumeOptions::default(), lapin::types::FieldTable::default())
        .await
        .unwrap();
    let reports: Reports = Default::default();
    let sink = reports.clone();
    tokio::spawn(async move {
        let _conn = conn;
        while let Some(Ok(d)) = consumer.next().await {
            let r: vid_core::messages::TranscodeReport = serde_json::from_slice(&d.data).expect("reports are TranscodeReport JSON");
            if check_correlation {
                assert_eq!(vid_infra::amqp::correlation_id(&d.properties).as_deref(), Some(r.operation_id.as_str()));
            }
            sink.lock().unwrap().entry(r.operation_id.to_string()).or_default().push(r);
            d.ack(BasicAckOptions::default()).await.unwrap();
        }
    });
    (publisher, topology, reports)
}

/// Deletes `topology`'s queues and exchanges (a test's private broker names).
pub async fn delete_broker_names(channel: &lapin::Channel, topology: &vid_infra::amqp::Topology) {
    use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
    let t = topology;
    for q in [t.transcode_jobs(), t.transcode_dead(), t.transcode_reports(), t.webhook_events()] {
        let _ = channel.queue_delete(&q, QueueDeleteOptions::default()).await;
    }
    for e in [t.transcode_exchange(), t.dead_letter_exchange(), t.reports_exchange(), t.events_exchange(), t.control_exchange()] {
        let _ = channel.exchange_delete(&e, ExchangeDeleteOptions::default()).await;
    }
}
