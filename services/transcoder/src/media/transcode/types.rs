//! What a transcode produces and how it packages it: plain data shared by
//! the transcode modules and the child protocol. A leaf below `transcode/`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::cmaf::TrackFiles;

/// One rendition written to the local work directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RenditionFile {
    /// Rung name, e.g. `720p`.
    pub name: String,
    /// Width in pixels (even).
    pub width: u32,
    /// Height in pixels (even).
    pub height: u32,
    /// The MP4 file.
    pub path: PathBuf,
    /// File size in bytes.
    pub size_bytes: u64,
    /// Average total bitrate in bits per second (size × 8 / duration).
    pub bitrate: u64,
}

/// The poster written to the local work directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PosterFile {
    /// The JPEG file.
    pub path: PathBuf,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

/// One rung's video CMAF track.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VideoTrack {
    /// Rung name, e.g. `720p` (also its directory under the stream directory).
    pub name: String,
    /// Width in pixels (upright, even).
    pub width: u32,
    /// Height in pixels (upright, even).
    pub height: u32,
    /// The source's average frame rate as (numerator, denominator) frames per second, when known.
    pub frame_rate: Option<(i32, i32)>,
    /// The track's objects.
    pub track: TrackFiles,
}

/// The streaming packaging: CMAF tracks under `dir` (`<out_dir>/stream/`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamFiles {
    /// The stream directory; every track is a subdirectory, the manifests sit at the top.
    pub dir: PathBuf,
    /// The target segment duration in seconds.
    pub segment_seconds: f64,
    /// One video track per rung, tallest first.
    pub video: Vec<VideoTrack>,
    /// The one audio track (`audio/`), unless the source has no decodable audio.
    pub audio: Option<TrackFiles>,
    /// The storyboard, thumbnail frames and poster written under `dir`
    /// (issue 20), unless no frame reached the tallest rung.
    #[serde(default)]
    pub storyboard: Option<StoryboardFiles>,
}

/// What [`transcode`] produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transcoded {
    /// Static MP4 renditions, in the order of the plan (tallest first); empty
    /// when the job asked for none.
    pub renditions: Vec<RenditionFile>,
    /// The streaming packaging (manifests added by [`crate::media::run`]).
    pub stream: StreamFiles,
    /// The poster, unless no frame could be taken.
    pub poster: Option<PosterFile>,
    /// Seconds of video decoded (last minus first timestamp plus one frame).
    pub decoded_seconds: f64,
}

/// How the encoded packets are packaged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Packaging {
    /// Target segment duration of the CMAF tracks, seconds (also the GOP:
    /// one IDR frame per segment). Default 4.
    pub segment_seconds: f64,
    /// Also write the static MP4 renditions (`mp4_support` `standard`). Default true.
    pub mp4: bool,
    /// The poster's time in seconds (the job's `poster_time`; finite, ≥ 0;
    /// past the end: the last frame). `None`: the representative-frame rule
    /// of [`super::storyboard`].
    #[serde(default)]
    pub poster_time: Option<f64>,
    /// Write the storyboard (tiles, sheet, WebVTT), the full-size thumbnail
    /// frames and the poster (issue 20). Default true; the service always
    /// sets it. `false` exists so `scripts/bench-transcode.sh` can measure
    /// the packaging alone against the ffmpeg CLI's HLS ladder, which writes
    /// no images; the outcome then has no storyboard and no poster.
    #[serde(default = "yes")]
    pub storyboard: bool,
}

fn yes() -> bool {
    true
}

impl Default for Packaging {
    fn default() -> Self {
        Self { segment_seconds: 4.0, mp4: true, poster_time: None, storyboard: true }
    }
}

/// What the storyboard step wrote (paths under the stream directory).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoryboardFiles {
    /// Interval between instants, milliseconds.
    pub interval_ms: u64,
    /// Tile size in pixels.
    pub tile_width: u32,
    /// Tile height in pixels (even).
    pub tile_height: u32,
    /// Sprite sheet columns.
    pub columns: u32,
    /// Sprite sheet rows.
    pub rows: u32,
    /// The instants' times in milliseconds, ascending (one tile each).
    pub tiles_ms: Vec<u64>,
    /// Times (ms, ascending) that have a frame JPEG `frames/<ms>.jpg`: every
    /// instant plus the last frame.
    pub frames_ms: Vec<u64>,
    /// Size of the frame JPEGs (the tallest rung's).
    pub frame_width: u32,
    /// Height of the frame JPEGs.
    pub frame_height: u32,
    /// The video's duration used for the last cue's end, milliseconds.
    pub duration_ms: u64,
    /// The stream-relative paths written, with their content types, in upload order.
    pub objects: Vec<(String, String)>,
}
