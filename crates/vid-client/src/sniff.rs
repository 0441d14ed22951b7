//! Guessing a file's media type from its first bytes (container magic numbers).

/// The media type the first bytes suggest, or `None` if they match no video container we accept.
///
/// - ISO BMFF (`ftyp` box at offset 4): `video/quicktime` for the `qt  ` brand, else `video/mp4`;
/// - EBML (`1A 45 DF A3`): `video/webm` when the doc type says `webm`, else `video/x-matroska`.
pub fn sniff_content_type(head: &[u8]) -> Option<&'static str> {
    if head.len() >= 12 && &head[4..8] == b"ftyp" {
        return Some(if &head[8..12] == b"qt  " { "video/quicktime" } else { "video/mp4" });
    }
    if head.starts_with(&[0x1A, 0x45, 0xDF, 0xA3]) {
        let is_webm = head.windows(4).take(64).any(|w| w == b"webm");
        return Some(if is_webm { "video/webm" } else { "video/x-matroska" });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_containers() {
        assert_eq!(sniff_content_type(b"\0\0\0\x20ftypisom\0\0\x02\0"), Some("video/mp4"));
        assert_eq!(sniff_content_type(b"\0\0\0\x14ftypqt  \0\0\x02\0"), Some("video/quicktime"));
        assert_eq!(sniff_content_type(b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01\x42\x82\x84webm"), Some("video/webm"));
        assert_eq!(sniff_content_type(b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01\x42\x82\x88matroska"), Some("video/x-matroska"));
        assert_eq!(sniff_content_type(b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR"), None);
        assert_eq!(sniff_content_type(b""), None);
    }
}
