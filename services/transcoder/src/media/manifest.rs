//! The stream's manifests, written beside its CMAF tracks (every URI in them
//! is RELATIVE, so the stream can be served under any stable URL):
//!
//! ```text
//! <stream>/master.m3u8          HLS master playlist (RFC 8216 §4.3.4)
//! <stream>/manifest.mpd         DASH MPD, static (ISO/IEC 23009-1)
//! <stream>/<rung>/index.m3u8    HLS media playlist of one rung (video only)
//! <stream>/<rung>/init.mp4      its CMAF header; <stream>/<rung>/seg-00001.m4s … its segments
//! <stream>/audio/…              the same for the one audio track (absent without audio)
//! ```
//!
//! HLS: `EXT-X-VERSION:7` (fMP4 segments need 6+, `EXT-X-MAP` in a playlist
//! without I-frames-only 5+), `EXT-X-INDEPENDENT-SEGMENTS` (every segment
//! starts with an IDR frame). `BANDWIDTH` is the peak segment bit rate of the
//! rung plus the audio's, `AVERAGE-BANDWIDTH` the average of both (§4.3.4.2);
//! `CODECS` is the rung's exact `avc1.PPCCLL` (RFC 6381, from its SPS) and
//! `mp4a.40.2` (AAC-LC); `RESOLUTION` the upright output size. A media
//! playlist's `EXT-X-TARGETDURATION` is the longest segment rounded up.
//!
//! DASH: one video AdaptationSet with a Representation per rung and one audio
//! AdaptationSet, `SegmentTemplate` + `SegmentTimeline` with the exact
//! segment durations and the segments' media times (`presentationTimeOffset`
//! takes the tracks' common lead-in off), over the same objects.
//!
//! The text is produced here rather than by a library: no playlist writer is
//! among the workspace's dependencies, and the output is checked by
//! independent parsers in the tests (`m3u8`, `mpegdash`, ffprobe).

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::MediaError;
use super::transcode::cmaf::{segment_name, INIT_NAME};
use super::transcode::{StreamFiles, TrackFiles, VideoTrack};

/// File name of the HLS master playlist in the stream directory.
pub const HLS_MASTER: &str = "master.m3u8";
/// File name of the DASH MPD in the stream directory.
pub const DASH_MPD: &str = "manifest.mpd";
/// File name of each track's HLS media playlist.
pub const MEDIA_PLAYLIST: &str = "index.m3u8";
/// Directory (and DASH Representation id) of the audio track.
pub const AUDIO_DIR: &str = "audio";

/// The written manifests and every object of the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifests {
    /// Every object: (path relative to the stream directory, `/`-separated;
    /// its content type), in upload order: segments before the playlists
    /// that name them, the storyboard objects, the master playlist and the MPD last.
    pub objects: Vec<(String, String)>,
}

/// Writes the manifests of `stream` into `stream.dir`. Errors: internal (I/O).
pub fn write(stream: &StreamFiles) -> Result<Manifests, MediaError> {
    let dir = &stream.dir;
    let mut objects = Vec::new();
    let mut add_track = |name: &str, t: &TrackFiles, content_type: &str| -> Result<(), MediaError> {
        objects.push((format!("{name}/{INIT_NAME}"), content_type.to_owned()));
        objects.extend((1..=t.segments.len()).map(|n| (format!("{name}/{}", segment_name(n)), content_type.to_owned())));
        put(&dir.join(name).join(MEDIA_PLAYLIST), &media_playlist(t))?;
        objects.push((format!("{name}/{MEDIA_PLAYLIST}"), HLS_TYPE.to_owned()));
        Ok(())
    };
    for v in &stream.video {
        add_track(&v.name, &v.track, "video/mp4")?;
    }
    if let Some(a) = &stream.audio {
        add_track(AUDIO_DIR, a, "audio/mp4")?;
    }
    // The storyboard, thumbnail frames and poster (issue 20): before the manifests too.
    objects.extend(stream.storyboard.iter().flat_map(|s| s.objects.iter().cloned()));
    put(&dir.join(DASH_MPD), &dash_mpd(stream))?;
    objects.push((DASH_MPD.to_owned(), "application/dash+xml".to_owned()));
    put(&dir.join(HLS_MASTER), &master_playlist(stream))?;
    objects.push((HLS_MASTER.to_owned(), HLS_TYPE.to_owned()));
    Ok(Manifests { objects })
}

const HLS_TYPE: &str = "application/vnd.apple.mpegurl";

fn put(path: &Path, text: &str) -> Result<(), MediaError> {
    std::fs::write(path, text).map_err(|e| MediaError::Internal(format!("writing {}: {e}", path.display())))
}

/// The RFC 6381 codec string of an H.264 track from its extradata (avcC, or
/// Annex B with the SPS): `avc1.PPCCLL` (profile, constraint flags, level, hex).
pub fn avc1_codec(extradata: &[u8]) -> String {
    let pcl = if extradata.first() == Some(&1) && extradata.len() >= 4 {
        Some([extradata[1], extradata[2], extradata[3]])
    } else {
        // Annex B: the byte after a start code whose NAL type is 7 (SPS), then profile, flags, level.
        extradata.windows(7).find(|w| w[..3] == [0, 0, 1] && w[3] & 0x1f == 7).map(|w| [w[4], w[5], w[6]])
    };
    match pcl {
        Some([p, c, l]) => format!("avc1.{p:02x}{c:02x}{l:02x}"),
        None => "avc1.640028".to_owned(),
    }
}

/// Channels of an AAC track from its AudioSpecificConfig (ISO/IEC 14496-3 §1.6.2.1).
fn aac_channels(asc: &[u8]) -> Option<u8> {
    let c = (asc.get(1)? >> 3) & 0x0f;
    (c > 0).then_some(c)
}

/// (peak, average) bit rate of a track's segments, bits per second.
pub fn bitrates(t: &TrackFiles) -> (u64, u64) {
    let ts = f64::from(t.timescale);
    let rate = |bytes: u64, units: i64| (bytes as f64 * 8.0 / (units.max(1) as f64 / ts)).ceil() as u64;
    let peak = t.segments.iter().map(|s| rate(s.size_bytes, s.duration)).max().unwrap_or(0);
    let total: u64 = t.segments.iter().map(|s| s.size_bytes).sum();
    (peak, rate(total, t.segments.iter().map(|s| s.duration).sum()))
}

/// A media playlist (VOD) of one track.
fn media_playlist(t: &TrackFiles) -> String {
    let ts = f64::from(t.timescale);
    let longest = t.segments.iter().map(|s| s.duration).max().unwrap_or(1) as f64 / ts;
    let mut m = String::new();
    let _ = write!(
        m,
        "#EXTM3U\n#EXT-X-VERSION:7\n#EXT-X-TARGETDURATION:{}\n#EXT-X-MEDIA-SEQUENCE:1\n#EXT-X-PLAYLIST-TYPE:VOD\n#EXT-X-INDEPENDENT-SEGMENTS\n#EXT-X-MAP:URI=\"{INIT_NAME}\"\n",
        longest.ceil().max(1.0) as u64
    );
    for (i, s) in t.segments.iter().enumerate() {
        let _ = write!(m, "#EXTINF:{:.6},\n{}\n", s.duration as f64 / ts, segment_name(i + 1));
    }
    m.push_str("#EXT-X-ENDLIST\n");
    m
}

/// The master playlist: one variant per rung, the audio group when there is audio.
fn master_playlist(stream: &StreamFiles) -> String {
    let mut m = String::from("#EXTM3U\n#EXT-X-VERSION:7\n#EXT-X-INDEPENDENT-SEGMENTS\n");
    let audio = stream.audio.as_ref().map(|a| (bitrates(a), aac_channels(&a.extradata)));
    if let Some((_, channels)) = audio {
        let ch = channels.map(|c| format!(",CHANNELS=\"{c}\"")).unwrap_or_default();
        let _ = writeln!(
            m,
            "#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"audio\",NAME=\"Audio\",DEFAULT=YES,AUTOSELECT=YES{ch},URI=\"{AUDIO_DIR}/{MEDIA_PLAYLIST}\""
        );
    }
    for v in &stream.video {
        let (peak, avg) = bitrates(&v.track);
        let (a_peak, a_avg) = audio.map(|(b, _)| b).unwrap_or((0, 0));
        let codecs = match audio {
            Some(_) => format!("{},mp4a.40.2", avc1_codec(&v.track.extradata)),
            None => avc1_codec(&v.track.extradata),
        };
        let _ = write!(
            m,
            "#EXT-X-STREAM-INF:BANDWIDTH={},AVERAGE-BANDWIDTH={},CODECS=\"{codecs}\",RESOLUTION={}x{}",
            peak + a_peak,
            avg + a_avg,
            v.width,
            v.height
        );
        if let Some((n, d)) = v.frame_rate {
            let _ = write!(m, ",FRAME-RATE={:.3}", f64::from(n) / f64::from(d));
        }
        if audio.is_some() {
            m.push_str(",AUDIO=\"audio\"");
        }
        let _ = write!(m, "\n{}/{MEDIA_PLAYLIST}\n", v.name);
    }
    m
}

/// `<SegmentTemplate>` with the exact timeline of `t`, for Representation `id`.
fn segment_template(id: &str, t: &TrackFiles) -> String {
    let mut s = format!(
        "<SegmentTemplate timescale=\"{}\" presentationTimeOffset=\"{}\" initialization=\"{id}/{INIT_NAME}\" media=\"{id}/seg-$Number%05d$.m4s\" startNumber=\"1\"><SegmentTimeline>",
        t.timescale, t.lead_in
    );
    let mut i = 0;
    while i < t.segments.len() {
        let d = t.segments[i].duration;
        let repeat = t.segments[i + 1..].iter().take_while(|x| x.duration == d).count();
        let time = if i == 0 { format!(" t=\"{}\"", t.first_time + t.segments[0].start) } else { String::new() };
        let r = if repeat > 0 { format!(" r=\"{repeat}\"") } else { String::new() };
        let _ = write!(s, "<S{time} d=\"{d}\"{r}/>");
        i += repeat + 1;
    }
    s.push_str("</SegmentTimeline></SegmentTemplate>");
    s
}

/// A rung's `<Representation>`.
fn video_representation(v: &VideoTrack) -> String {
    let fr = v.frame_rate.map(|(n, d)| if d == 1 { format!(" frameRate=\"{n}\"") } else { format!(" frameRate=\"{n}/{d}\"") });
    format!(
        "<Representation id=\"{}\" codecs=\"{}\" bandwidth=\"{}\" width=\"{}\" height=\"{}\" sar=\"1:1\"{}>{}</Representation>",
        v.name,
        avc1_codec(&v.track.extradata),
        bitrates(&v.track).0,
        v.width,
        v.height,
        fr.unwrap_or_default(),
        segment_template(&v.name, &v.track)
    )
}

/// The static MPD: one Period, one video AdaptationSet with every rung, one audio AdaptationSet.
fn dash_mpd(stream: &StreamFiles) -> String {
    // The presentation ends where its last track ends on the period's time
    // line (ISO/IEC 23009-1 §5.3.1.2), not after the longest track's
    // length: a track the source starts late ends that much later.
    let longest =
        stream.video.iter().map(|v| v.track.end_seconds()).chain(stream.audio.iter().map(TrackFiles::end_seconds)).fold(0.0, f64::max);
    let mut m = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" profiles=\"urn:mpeg:dash:profile:isoff-live:2011\" type=\"static\" mediaPresentationDuration=\"PT{:.3}S\" minBufferTime=\"PT{:.1}S\">\n<Period id=\"0\" start=\"PT0S\">\n",
        // Rounded up to the millisecond, so no sample falls past the end.
        (longest * 1000.0 - 1e-6).ceil() / 1000.0,
        stream.segment_seconds
    );
    m.push_str("<AdaptationSet id=\"0\" contentType=\"video\" mimeType=\"video/mp4\" segmentAlignment=\"true\" startWithSAP=\"1\">\n");
    for v in &stream.video {
        let _ = writeln!(m, "{}", video_representation(v));
    }
    m.push_str("</AdaptationSet>\n");
    if let Some(a) = &stream.audio {
        m.push_str("<AdaptationSet id=\"1\" contentType=\"audio\" mimeType=\"audio/mp4\" segmentAlignment=\"true\" startWithSAP=\"1\" lang=\"und\">\n");
        let ch = aac_channels(&a.extradata).map(|c| {
            format!("<AudioChannelConfiguration schemeIdUri=\"urn:mpeg:dash:23003:3:audio_channel_configuration:2011\" value=\"{c}\"/>")
        });
        let _ = writeln!(
            m,
            "<Representation id=\"{AUDIO_DIR}\" codecs=\"mp4a.40.2\" bandwidth=\"{}\" audioSamplingRate=\"{}\">{}{}</Representation>",
            bitrates(a).0,
            a.timescale,
            ch.unwrap_or_default(),
            segment_template(AUDIO_DIR, a)
        );
        m.push_str("</AdaptationSet>\n");
    }
    m.push_str("</Period>\n</MPD>\n");
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codec_string_comes_from_the_sps() {
        assert_eq!(avc1_codec(&[1, 0x64, 0x00, 0x1f, 0xff]), "avc1.64001f");
        assert_eq!(avc1_codec(&[0, 0, 0, 1, 0x67, 0x4d, 0x40, 0x1e, 0xaa, 0, 0, 0, 1, 0x68]), "avc1.4d401e");
        assert_eq!(aac_channels(&[0x11, 0x90]), Some(2));
        assert_eq!(aac_channels(&[0x11, 0x88]), Some(1));
    }

    fn track(timescale: u32, starts_late: i64, durations: &[i64]) -> TrackFiles {
        let lead_in = 10 * i64::from(timescale);
        let mut start = 0;
        let segments = durations
            .iter()
            .map(|&duration| {
                let s = crate::media::transcode::Segment { start, duration, size_bytes: 1 };
                start += duration;
                s
            })
            .collect();
        TrackFiles {
            dir: "/nonexistent".into(),
            timescale,
            first_time: lead_in + starts_late,
            lead_in,
            segments,
            init_bytes: 1,
            extradata: vec![1, 0x64, 0x00, 0x1f],
        }
    }

    #[test]
    fn the_presentation_lasts_until_the_last_track_ends_on_the_period_time_line() {
        // Video starts 0.5 s late and runs 9 s (to 9.5 s); audio starts 1024
        // samples early and runs 9.3 s (to ~9.279 s): the MPD says 9.5 s, not 9.3.
        let video = VideoTrack {
            name: "360p".into(),
            width: 640,
            height: 360,
            frame_rate: Some((25, 1)),
            track: track(12800, 6400, &[51200, 51200, 12800]),
        };
        let audio = track(48000, -1024, &[192000, 192000, 62400]);
        let stream =
            StreamFiles { dir: "/nonexistent".into(), segment_seconds: 4.0, video: vec![video], audio: Some(audio), storyboard: None };
        let mpd = dash_mpd(&stream);
        assert!(mpd.contains("mediaPresentationDuration=\"PT9.500S\""), "{mpd}");
        // A track's S@t keeps its own start, against the lead-in as presentationTimeOffset.
        assert!(mpd.contains("presentationTimeOffset=\"128000\"") && mpd.contains("<S t=\"134400\" d=\"51200\" r=\"1\"/>"), "{mpd}");
    }
}
