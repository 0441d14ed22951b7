//! The strict grammar of playback paths. Anything it does not accept is a
//! `404 not_found` before PostgreSQL or storage is asked anything.
//!
//! ```text
//! /play/{pb}.m3u8                      pb: a canonical (lower-case) `pb_` + 26 Crockford base-32
//! /play/{pb}.mpd
//! /play/{pb}/{track}/index.m3u8        track: `audio`, or a rung `<short side>p` (1–5 digits, no leading 0;
//!                                      a portrait rung 270×480 is `270p`)
//! /play/{pb}/{track}/init.mp4
//! /play/{pb}/{track}/seg-NNNNN.m4s     N: the segment number, 1-based, zero-padded to
//!                                      (at least) five digits, as the transcoder names them
//! /play/{pb}/storyboard.jpg            issue 20 (crate::images): the sprite sheet,
//! /play/{pb}/storyboard.vtt            its WebVTT index,
//! /play/{pb}/storyboard.json           its JSON index (Mux's shape),
//! /play/{pb}/thumbnail.jpg             a thumbnail (`?time=<s>&width=<px>`),
//! /play/{pb}/poster.jpg                the poster
//! ```
//!
//! Only one spelling of each resource is accepted (no upper-case id, no
//! `seg-000001.m4s` for `seg-00001.m4s`, no query string: `routes`), so a
//! CDN caches one copy of each.
//! `..`, `.`, empty segments, `%2F` and any other character fall outside the
//! grammar by construction.

use std::str::FromStr;

use vid_core::PlaybackId;

/// A manifest at the root of a playback ID (`/play/{pb}.{ext}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootFile {
    /// `.m3u8`: the HLS master playlist.
    HlsMaster,
    /// `.mpd`: the DASH MPD.
    DashMpd,
}

/// A file of one track (`/play/{pb}/{track}/{file}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrackFile {
    /// `index.m3u8`: the track's HLS media playlist.
    MediaPlaylist,
    /// `init.mp4`: its CMAF header.
    Init,
    /// `seg-NNNNN.m4s`: media segment `N` (1-based).
    Segment(u32),
}

/// Name of the audio track's directory (and DASH Representation id).
pub const AUDIO_TRACK: &str = "audio";

impl TrackFile {
    /// The file name under the track's directory, as stored.
    pub fn file_name(self) -> String {
        match self {
            Self::MediaPlaylist => "index.m3u8".to_owned(),
            Self::Init => "init.mp4".to_owned(),
            Self::Segment(n) => format!("seg-{n:05}.m4s"),
        }
    }
}

/// An image of a playback ID (`/play/{pb}/{file}`, issue 20).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFile {
    /// `storyboard.jpg`: the sprite sheet (audience `s`).
    StoryboardImage,
    /// `storyboard.vtt`: WebVTT cues pointing at its tiles (audience `s`).
    StoryboardVtt,
    /// `storyboard.json`: the same index as JSON (audience `s`).
    StoryboardJson,
    /// `thumbnail.jpg`: a frame at `?time=` of `?width=` (audience `t`).
    Thumbnail,
    /// `poster.jpg`: the poster (audience `g`).
    Poster,
}

/// Parses the file of `/play/{pb}/{file}` (exact names only).
pub fn image_file(name: &str) -> Option<ImageFile> {
    Some(match name {
        "storyboard.jpg" => ImageFile::StoryboardImage,
        "storyboard.vtt" => ImageFile::StoryboardVtt,
        "storyboard.json" => ImageFile::StoryboardJson,
        "thumbnail.jpg" => ImageFile::Thumbnail,
        "poster.jpg" => ImageFile::Poster,
        _ => return None,
    })
}

/// Parses the canonical spelling of a playback ID.
pub fn playback_id(s: &str) -> Option<PlaybackId> {
    PlaybackId::from_str(s).ok().filter(|id| id.as_str() == s)
}

/// Parses `pb_….m3u8` / `pb_….mpd` (the last path segment under `/play/`).
pub fn root(file: &str) -> Option<(PlaybackId, RootFile)> {
    if let Some(id) = file.strip_suffix(".m3u8") {
        return playback_id(id).map(|id| (id, RootFile::HlsMaster));
    }
    file.strip_suffix(".mpd").and_then(playback_id).map(|id| (id, RootFile::DashMpd))
}

/// Accepts a track name: `audio`, or `<short side>p` with 1–5 digits and no leading zero.
pub fn track(name: &str) -> Option<&str> {
    if name == AUDIO_TRACK {
        return Some(name);
    }
    let digits = name.strip_suffix('p')?;
    let ok = (1..=5).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()) && !digits.starts_with('0');
    ok.then_some(name)
}

/// Parses a track's file name (see the module docs).
pub fn track_file(name: &str) -> Option<TrackFile> {
    match name {
        "index.m3u8" => return Some(TrackFile::MediaPlaylist),
        "init.mp4" => return Some(TrackFile::Init),
        _ => {}
    }
    let digits = name.strip_prefix("seg-")?.strip_suffix(".m4s")?;
    if !(5..=9).contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u32 = digits.parse().ok()?;
    // Canonical only: `seg-000001.m4s` is not `seg-00001.m4s`.
    (n >= 1 && TrackFile::Segment(n).file_name() == name).then_some(TrackFile::Segment(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PB: &str = "pb_01jd8x4m3v0k2q6s7t9w1y5zab";

    #[test]
    fn root_manifests_need_a_canonical_id_and_a_known_extension() {
        assert_eq!(root(&format!("{PB}.m3u8")).map(|(i, f)| (i.to_string(), f)), Some((PB.to_owned(), RootFile::HlsMaster)));
        assert_eq!(root(&format!("{PB}.mpd")).map(|(_, f)| f), Some(RootFile::DashMpd));
        for bad in [
            format!("{PB}.mp4"),
            format!("{PB}.M3U8"),
            format!("{PB}.m3u8.m3u8"),
            PB.to_string(),
            PB.to_uppercase() + ".m3u8",
            "PB_01jd8x4m3v0k2q6s7t9w1y5zab.m3u8".into(),
            "pb_01jd8x4m3v0k2q6s7t9w1y5za.m3u8".into(),
            "vid_01jd8x4m3v0k2q6s7t9w1y5zab.m3u8".into(),
            "..m3u8".into(),
            ".m3u8".into(),
        ] {
            assert_eq!(root(&bad), None, "{bad}");
        }
    }

    #[test]
    fn image_files_are_five_exact_names() {
        assert_eq!(image_file("storyboard.jpg"), Some(ImageFile::StoryboardImage));
        assert_eq!(image_file("storyboard.vtt"), Some(ImageFile::StoryboardVtt));
        assert_eq!(image_file("storyboard.json"), Some(ImageFile::StoryboardJson));
        assert_eq!(image_file("thumbnail.jpg"), Some(ImageFile::Thumbnail));
        assert_eq!(image_file("poster.jpg"), Some(ImageFile::Poster));
        for bad in ["Storyboard.jpg", "storyboard.jpeg", "thumbnail.webp", "poster.jpg ", "frames", "thumbnails", "..", "", "master.m3u8"] {
            assert_eq!(image_file(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn tracks_are_rungs_or_audio() {
        for good in ["audio", "720p", "1080p", "4p", "99999p"] {
            assert_eq!(track(good), Some(good));
        }
        for bad in ["", "..", ".", "p", "0p", "0720p", "720", "720P", "100000p", "Audio", "audio2", "7 20p", "720p/", "%2e%2e"] {
            assert_eq!(track(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn track_files_are_the_three_kinds_in_one_spelling() {
        assert_eq!(track_file("index.m3u8"), Some(TrackFile::MediaPlaylist));
        assert_eq!(track_file("init.mp4"), Some(TrackFile::Init));
        assert_eq!(track_file("seg-00001.m4s"), Some(TrackFile::Segment(1)));
        assert_eq!(track_file("seg-123456.m4s"), Some(TrackFile::Segment(123456)));
        for bad in [
            "seg-00000.m4s",
            "seg-1.m4s",
            "seg-000001.m4s",
            "seg-0001.m4s",
            "seg-00001.mp4",
            "seg-+0001.m4s",
            "seg-0000a.m4s",
            "seg-9999999999.m4s",
            "index.m3u",
            "master.m3u8",
            "manifest.mpd",
            "init.mp4.bak",
            "..",
            "",
        ] {
            assert_eq!(track_file(bad), None, "{bad}");
        }
        for n in [1, 42, 99999, 100000] {
            assert_eq!(track_file(&TrackFile::Segment(n).file_name()), Some(TrackFile::Segment(n)));
        }
    }
}
