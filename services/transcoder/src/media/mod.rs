//! The media work, all of it libav (ffmpeg-next) and all of it synchronous:
//! [`probe`] → [`validate`] → [`ladder::plan`] → [`transcode`] (one decode
//! feeding every rendition and the poster).
//!
//! In production this runs inside the supervised child process (see
//! [`crate::child`]), never in the service process: a crash in libav must only
//! fail the one job.

pub mod ladder;
pub mod manifest;
pub mod probe;
pub mod transcode;
pub mod validate;

use std::path::{Path, PathBuf};
use std::sync::Once;

use serde::{Deserialize, Serialize};
use vid_core::video::SourceMetadata;
use vid_core::Problem;

pub use ladder::{plan, Rung};
pub use probe::{probe, Probe};
pub use transcode::{transcode, PosterFile, RenditionFile, StreamFiles, TrackFiles, Transcoded, VideoTrack};
pub use validate::{validate, Limits};

/// Initialises libav once per process and quietens its logging to errors (on stderr).
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        ffmpeg_next::init().expect("libav initialises");
        ffmpeg_next::log::set_level(ffmpeg_next::log::Level::Error);
    });
}

/// Why the media work failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MediaError {
    /// The source is bad: fail the job with this problem, do not retry.
    #[error("{0}")]
    Permanent(Problem),
    /// Our side failed (encoder/muxer/file system): worth a retry on another attempt.
    #[error("internal media error: {0}")]
    Internal(String),
}

impl From<Problem> for MediaError {
    fn from(p: Problem) -> Self {
        Self::Permanent(p)
    }
}

/// Everything one media job needs; the child process reads it from a JSON file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MediaJob {
    /// The downloaded source.
    pub input: PathBuf,
    /// Directory for the outputs (created if missing).
    pub out_dir: PathBuf,
    /// Limits to validate against.
    pub limits: Limits,
    /// Ladder rung values (short side in pixels), e.g. `[1080, 720, 480, 360]`.
    pub ladder: Vec<u32>,
    /// What to package besides the stream. Absent: [`Packaging::default`].
    #[serde(default)]
    pub packaging: Packaging,
}

/// How the encoded packets are packaged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Packaging {
    /// Target segment duration of the CMAF tracks, seconds (also the GOP:
    /// one IDR frame per segment). Default 4.
    pub segment_seconds: f64,
    /// Also write the static MP4 renditions (`mp4_support` `standard`). Default true.
    pub mp4: bool,
}

impl Default for Packaging {
    fn default() -> Self {
        Self { segment_seconds: 4.0, mp4: true }
    }
}

/// What [`run`] reports while it works.
#[derive(Debug, Clone, PartialEq)]
pub enum MediaEvent {
    /// The probe succeeded (validation follows).
    Probed(SourceMetadata),
    /// Transcode progress, 0.0–1.0.
    Progress(f64),
}

/// The result of a successful [`run`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MediaOutcome {
    /// Probe results.
    pub source: SourceMetadata,
    /// Files produced.
    pub transcoded: Transcoded,
    /// The stream's manifests and every object of the stream.
    pub manifests: manifest::Manifests,
}

/// Probe, validate, plan and transcode `job`, calling `events` along the way.
///
/// Errors: see [`probe()`], [`validate()`], [`transcode()`]. A permanent failure
/// after the probe carries the probe in `Err((_, Some(source)))`.
pub fn run(job: &MediaJob, events: &mut dyn FnMut(MediaEvent)) -> Result<MediaOutcome, (MediaError, Option<SourceMetadata>)> {
    let probe = probe::probe(&job.input).map_err(|p| (MediaError::Permanent(p), None))?;
    let source = probe.source.clone();
    events(MediaEvent::Probed(source.clone()));
    validate::validate(&probe, &job.limits).map_err(|p| (MediaError::Permanent(p), Some(source.clone())))?;
    let rungs = ladder::plan(probe.display_width, probe.display_height, &job.ladder);
    tracing::debug!(?rungs, rotation = probe.source.rotation, "ladder planned");
    let transcoded = transcode::transcode(&job.input, &job.out_dir, &probe, &rungs, &job.limits, &job.packaging, &mut |f| {
        events(MediaEvent::Progress(f))
    })
    .map_err(|e| (e, Some(source.clone())))?;
    let manifests = manifest::write(&transcoded.stream).map_err(|e| (e, Some(source.clone())))?;
    Ok(MediaOutcome { source, transcoded, manifests })
}

/// Convenience for tests and tools: [`run`] with no event sink.
pub fn run_quiet(
    input: &Path,
    out_dir: &Path,
    limits: Limits,
    ladder: &[u32],
) -> Result<MediaOutcome, (MediaError, Option<SourceMetadata>)> {
    let job = MediaJob { input: input.into(), out_dir: out_dir.into(), limits, ladder: ladder.to_vec(), packaging: Packaging::default() };
    run(&job, &mut |_| {})
}
