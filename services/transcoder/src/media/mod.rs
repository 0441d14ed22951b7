//! The media work, all of it libav (ffmpeg-next) and all of it synchronous:
//! [`probe`] → [`validate`] → [`ladder::plan`] → [`transcode`] (one decode
//! feeding every rung's CMAF track, the static MP4s and the poster) →
//! [`manifest`] (the HLS playlists and the DASH MPD over those tracks).
//!
//! In production this runs inside the supervised child process (see
//! [`crate::child`]), never in the service process: a crash in libav must only
//! fail the one job.

mod error;
pub mod ladder;
mod libav;
pub mod manifest;
pub mod probe;
pub mod transcode;
pub mod validate;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vid_core::video::SourceMetadata;

pub use error::MediaError;
pub use ladder::{plan, Rung};
pub use libav::init;
pub use probe::{probe, Probe};
pub use transcode::{transcode, Packaging, PosterFile, RenditionFile, StreamFiles, TrackFiles, Transcoded, VideoTrack};
pub use validate::{validate, Limits};

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
