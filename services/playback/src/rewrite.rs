//! Rewriting the URIs inside manifests, through ONE function:
//! [`UriMapper::map`]. Every URI a served manifest contains passes through it,
//! so signed playback (issue 20) only has to give the mapper a query
//! ([`UriMapper::with_query`], e.g. `token=…`) to put it on every URI.
//!
//! The transcoder writes every URI relative to the manifest's own object
//! (`720p/index.m3u8` in the master playlist, `seg-00001.m4s` in a media
//! playlist, `720p/seg-$Number%05d$.m4s` in the MPD's `SegmentTemplate`).
//! The master playlist and the MPD are served at `/play/{pb}.m3u8` and
//! `/play/{pb}.mpd`, one level above the tracks, so their URIs get the
//! prefix `{pb}/` and resolve under `/play/{pb}/…`; a media playlist is served
//! from its track's directory, so its URIs keep their path.
//!
//! What is rewritten: in HLS playlists every URI line and every `URI="…"`
//! attribute (`EXT-X-MEDIA`, `EXT-X-MAP`, `EXT-X-I-FRAME-STREAM-INF`, …); in
//! the MPD the `initialization`, `media`, `index` and `sourceURL` attributes.
//! (The transcoder writes no `<BaseURL>`; one would be resolved against by
//! players before these attributes and is left as it is.)

/// Maps each URI of a manifest to the URI a viewer requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UriMapper<'a> {
    /// Put before every relative URI (`pb_…/` or nothing).
    prefix: &'a str,
    /// Appended to every URI as a query (`token=…`), if any.
    query: Option<&'a str>,
}

impl<'a> UriMapper<'a> {
    /// For a manifest served one level above its tracks (master playlist,
    /// MPD): `prefix` is `"{pb}/"`.
    pub fn under(prefix: &'a str) -> Self {
        Self { prefix, query: None }
    }

    /// For a manifest served from the directory its URIs are relative to (a
    /// media playlist): paths unchanged.
    pub fn same_directory() -> Self {
        Self { prefix: "", query: None }
    }

    /// The same mapping, also appending `query` (without `?`) to every URI.
    pub fn with_query(self, query: &'a str) -> Self {
        Self { query: Some(query), ..self }
    }

    /// Whether [`UriMapper::map`] returns every URI unchanged (the manifest
    /// can be served byte for byte).
    pub fn is_identity(&self) -> bool {
        self.prefix.is_empty() && self.query.is_none()
    }

    /// THE mapping: a relative URI gets the prefix, every URI the query.
    /// Absolute URIs (a scheme, or a leading `/`) keep their path; the
    /// transcoder writes none.
    pub fn map(&self, uri: &str) -> String {
        let mut out = String::with_capacity(self.prefix.len() + uri.len() + self.query.map_or(0, |q| q.len() + 1));
        if !is_absolute(uri) {
            out.push_str(self.prefix);
        }
        out.push_str(uri);
        if let Some(q) = self.query {
            out.push(if uri.contains('?') { '&' } else { '?' });
            out.push_str(q);
        }
        out
    }
}

/// `scheme:` before any `/`, `?` or `#`, or a leading `/` (RFC 3986 §4.2).
fn is_absolute(uri: &str) -> bool {
    if uri.starts_with('/') {
        return true;
    }
    match uri.find(':') {
        Some(i) => !uri[..i].contains(['/', '?', '#']) && uri[..i].bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b)),
        None => false,
    }
}

/// An HLS playlist (master or media, RFC 8216) with every URI mapped: URI
/// lines (not blank, not starting with `#`) and `URI="…"` attributes of tags.
pub fn hls(text: &str, mapper: &UriMapper<'_>) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    for line in text.split_inclusive('\n') {
        let (body, end) = split_line_end(line);
        if body.trim().is_empty() {
            out.push_str(line);
        } else if body.starts_with('#') {
            out.push_str(&map_quoted_attributes(body, &["URI"], mapper, ','));
            out.push_str(end);
        } else {
            out.push_str(&mapper.map(body.trim()));
            out.push_str(end);
        }
    }
    out
}

/// A DASH MPD with every segment URL template mapped (`initialization`,
/// `media`, `index`, `sourceURL` attributes).
pub fn mpd(text: &str, mapper: &UriMapper<'_>) -> String {
    map_quoted_attributes(text, &["initialization", "media", "index", "sourceURL"], mapper, ' ')
}

fn split_line_end(line: &str) -> (&str, &str) {
    let body = line.trim_end_matches(['\n', '\r']);
    (body, &line[body.len()..])
}

/// Maps the values of `NAME="…"` for each name in `names`, where `NAME` starts
/// the text or follows `separator` (`,` between HLS attributes; whitespace in
/// XML) or `:` (the first HLS attribute after the tag name).
fn map_quoted_attributes(text: &str, names: &[&str], mapper: &UriMapper<'_>, separator: char) -> String {
    let mut out = String::with_capacity(text.len() + 64);
    let mut rest = text;
    'scan: while !rest.is_empty() {
        let mut best: Option<(usize, usize)> = None; // (start of value, name length)
        for name in names {
            let pattern = format!("{name}=\"");
            let mut from = 0;
            while let Some(i) = rest[from..].find(&pattern) {
                let at = from + i;
                let boundary = rest[..at]
                    .chars()
                    .next_back()
                    .is_none_or(|c| c == ':' || (separator == ' ' && c.is_whitespace()) || (separator != ' ' && c == separator));
                if boundary {
                    let value_start = at + pattern.len();
                    if best.is_none_or(|(b, _)| value_start < b) {
                        best = Some((value_start, name.len()));
                    }
                    break;
                }
                from = at + pattern.len();
            }
        }
        let Some((value_start, _)) = best else {
            out.push_str(rest);
            break 'scan;
        };
        let Some(len) = rest[value_start..].find('"') else {
            out.push_str(rest);
            break 'scan;
        };
        out.push_str(&rest[..value_start]);
        out.push_str(&mapper.map(&rest[value_start..value_start + len]));
        rest = &rest[value_start + len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MASTER: &str = "#EXTM3U\n#EXT-X-VERSION:7\n#EXT-X-INDEPENDENT-SEGMENTS\n\
#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"audio\",NAME=\"Audio\",DEFAULT=YES,AUTOSELECT=YES,CHANNELS=\"2\",URI=\"audio/index.m3u8\"\n\
#EXT-X-STREAM-INF:BANDWIDTH=1200000,AVERAGE-BANDWIDTH=900000,CODECS=\"avc1.64001f,mp4a.40.2\",RESOLUTION=1280x720,FRAME-RATE=25.000,AUDIO=\"audio\"\n\
720p/index.m3u8\n\
#EXT-X-STREAM-INF:BANDWIDTH=600000,AVERAGE-BANDWIDTH=400000,CODECS=\"avc1.64001e,mp4a.40.2\",RESOLUTION=640x360,AUDIO=\"audio\"\n\
360p/index.m3u8\n";

    #[test]
    fn the_master_playlist_points_under_the_playback_id() {
        let out = hls(MASTER, &UriMapper::under("pb_x/"));
        assert!(out.contains(",URI=\"pb_x/audio/index.m3u8\"\n"), "{out}");
        assert!(out.contains("\npb_x/720p/index.m3u8\n"), "{out}");
        assert!(out.contains("\npb_x/360p/index.m3u8\n"), "{out}");
        // Nothing else changed: the same lines once the prefix is taken out.
        assert_eq!(out.replace("pb_x/", ""), MASTER);
        // GROUP-ID="audio" and AUDIO="audio" are not URIs.
        assert!(out.contains("GROUP-ID=\"audio\"") && out.contains("AUDIO=\"audio\"\n"), "{out}");
    }

    #[test]
    fn a_query_reaches_every_uri() {
        let out = hls(MASTER, &UriMapper::under("pb_x/").with_query("token=abc"));
        assert!(out.contains("URI=\"pb_x/audio/index.m3u8?token=abc\""), "{out}");
        assert!(out.contains("\npb_x/720p/index.m3u8?token=abc\n"), "{out}");
        let media = "#EXTM3U\n#EXT-X-MAP:URI=\"init.mp4\"\n#EXTINF:4.000000,\nseg-00001.m4s\n#EXT-X-ENDLIST\n";
        let out = hls(media, &UriMapper::same_directory().with_query("token=abc"));
        assert_eq!(out, "#EXTM3U\n#EXT-X-MAP:URI=\"init.mp4?token=abc\"\n#EXTINF:4.000000,\nseg-00001.m4s?token=abc\n#EXT-X-ENDLIST\n");
        assert_eq!(UriMapper::under("p/").with_query("t=1").map("a?x=2"), "p/a?x=2&t=1");
    }

    #[test]
    fn a_media_playlist_is_unchanged_by_the_identity() {
        let media = "#EXTM3U\r\n#EXT-X-MAP:URI=\"init.mp4\"\r\n#EXTINF:4.000000,\r\nseg-00001.m4s\r\n\r\n#EXT-X-ENDLIST\r\n";
        assert!(UriMapper::same_directory().is_identity());
        assert!(!UriMapper::under("pb/").is_identity());
        assert_eq!(hls(media, &UriMapper::same_directory()), media);
        assert_eq!(hls(media, &UriMapper::under("p/")).matches("p/").count(), 2);
    }

    #[test]
    fn absolute_uris_keep_their_path() {
        let m = UriMapper::under("pb/");
        assert_eq!(m.map("https://cdn.example/x.m3u8"), "https://cdn.example/x.m3u8");
        assert_eq!(m.map("/abs/x.m3u8"), "/abs/x.m3u8");
        assert_eq!(m.map("720p/index.m3u8"), "pb/720p/index.m3u8");
        assert_eq!(m.map("a/b:c"), "pb/a/b:c");
    }

    #[test]
    fn the_mpd_templates_point_under_the_playback_id() {
        let mpd_text = "<?xml version=\"1.0\"?>\n<MPD mediaPresentationDuration=\"PT4.000S\" type=\"static\">\n<Period id=\"0\">\n\
<AdaptationSet id=\"0\" contentType=\"video\" mimeType=\"video/mp4\">\n\
<Representation id=\"720p\" bandwidth=\"1\"><SegmentTemplate timescale=\"12800\" presentationTimeOffset=\"0\" initialization=\"720p/init.mp4\" media=\"720p/seg-$Number%05d$.m4s\" startNumber=\"1\"><SegmentTimeline><S t=\"0\" d=\"51200\"/></SegmentTimeline></SegmentTemplate></Representation>\n\
</AdaptationSet>\n</Period>\n</MPD>\n";
        let out = mpd(mpd_text, &UriMapper::under("pb_x/"));
        assert!(out.contains(" initialization=\"pb_x/720p/init.mp4\" media=\"pb_x/720p/seg-$Number%05d$.m4s\" "), "{out}");
        assert!(out.contains("mediaPresentationDuration=\"PT4.000S\""), "{out}");
        assert!(out.contains("mimeType=\"video/mp4\""), "{out}");
        assert_eq!(out.replace("pb_x/", ""), mpd_text);
    }
}
