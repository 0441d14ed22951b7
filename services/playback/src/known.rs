//! Which tracks and segments a stream has, read from its own manifests, so a
//! made-up track or segment number under a real playback ID is a `404`
//! without a storage read per guess.
//!
//! The master playlist lists every track's media playlist
//! (`<track>/index.m3u8`, as the transcoder writes it: a variant's URI line,
//! or an `EXT-X-MEDIA` `URI="…"` attribute, RFC 8216 §4.3.4.1–2), and a
//! media playlist lists its segments (one URI line each, §4.3.2). Both come
//! through the manifest cache, so after the first request of a stream a
//! guess costs a scan of cached text and no storage request.

use std::sync::Arc;

use crate::cache::Manifest;
use crate::error::PlaybackError;
use crate::paths::TrackFile;
use crate::state::AppState;
use crate::storage;

/// Manifest object `key`, from the manifest cache or storage (then cached).
/// Errors: as [`storage::manifest`].
pub async fn stored_manifest(state: &AppState, key: &str) -> Result<Arc<Manifest>, PlaybackError> {
    let cached = state.manifests.get(key);
    crate::metrics::cache_lookup("manifest", cached.is_some());
    if let Some(m) = cached {
        return Ok(m);
    }
    let m = Arc::new(storage::manifest(&state.s3, &state.settings.s3.bucket, key).await?);
    state.manifests.put(key, m.clone());
    Ok(m)
}

/// Whether master playlist `master` lists track `track`'s media playlist.
pub fn lists_track(master: &str, track: &str) -> bool {
    let uri = format!("{track}/index.m3u8");
    master.lines().map(str::trim).any(|line| {
        if line.starts_with('#') {
            line.starts_with("#EXT-X-MEDIA:") && line.contains(&format!("URI=\"{uri}\""))
        } else {
            line == uri
        }
    })
}

/// The number of media segments (URI lines) in media playlist `playlist`.
pub fn segment_count(playlist: &str) -> usize {
    playlist.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).count()
}

/// `Ok(())` when `file` of `track` exists in the stream whose master
/// playlist is at `master_key` and whose track playlists are at
/// `<track>/index.m3u8` beside it (`track_playlist_key`); `NotFound` when
/// not. A media playlist itself is not checked here (its read is the check).
pub async fn check(
    state: &AppState,
    master_key: &str,
    track_playlist_key: &str,
    track: &str,
    file: TrackFile,
) -> Result<(), PlaybackError> {
    if matches!(file, TrackFile::MediaPlaylist) {
        return Ok(());
    }
    let master = stored_manifest(state, master_key).await?;
    if !lists_track(&String::from_utf8_lossy(&master.body), track) {
        return Err(PlaybackError::NotFound);
    }
    if let TrackFile::Segment(n) = file {
        let playlist = stored_manifest(state, track_playlist_key).await?;
        if n as usize > segment_count(&String::from_utf8_lossy(&playlist.body)) {
            return Err(PlaybackError::NotFound);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MASTER: &str = "#EXTM3U\n#EXT-X-VERSION:7\n#EXT-X-INDEPENDENT-SEGMENTS\n\
#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"audio\",NAME=\"Audio\",DEFAULT=YES,AUTOSELECT=YES,URI=\"audio/index.m3u8\"\n\
#EXT-X-STREAM-INF:BANDWIDTH=1,AVERAGE-BANDWIDTH=1,CODECS=\"avc1.64001f,mp4a.40.2\",RESOLUTION=1280x720,AUDIO=\"audio\"\n720p/index.m3u8\n\
#EXT-X-STREAM-INF:BANDWIDTH=1,AVERAGE-BANDWIDTH=1,CODECS=\"avc1.64001e,mp4a.40.2\",RESOLUTION=640x360,AUDIO=\"audio\"\n360p/index.m3u8\n";

    #[test]
    fn the_master_lists_its_rungs_and_audio_and_nothing_else() {
        for t in ["720p", "360p", "audio"] {
            assert!(lists_track(MASTER, t), "{t}");
        }
        for t in ["1080p", "72p", "20p", "audi"] {
            assert!(!lists_track(MASTER, t), "{t}");
        }
    }

    #[test]
    fn segments_are_the_uri_lines() {
        let p = "#EXTM3U\n#EXT-X-MAP:URI=\"init.mp4\"\n#EXTINF:4.000000,\nseg-00001.m4s\n#EXTINF:1.5,\nseg-00002.m4s\n#EXT-X-ENDLIST\n";
        assert_eq!(segment_count(p), 2);
        assert_eq!(segment_count("#EXTM3U\n#EXT-X-ENDLIST\n"), 0);
    }
}
