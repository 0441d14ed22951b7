//! Presentation times read straight from the boxes of a CMAF track, as an
//! ISO/IEC 14496-12 reader (a browser's Media Source Extensions) computes
//! them, for tests. ffmpeg's mov demuxer is no judge here: with negative
//! composition offsets and no edit list it presents a track later by its
//! largest negative offset (its `dts_shift`), where the standard does not.
//!
//! The rules used (ISO/IEC 14496-12:2022):
//! - §8.4.2 `mdhd`: the track's timescale (units per second).
//! - §8.8.3 `trex`: the default sample duration of a fragmented track.
//! - §8.8.7 `tfhd`: per-fragment defaults (flag `0x08`: default duration).
//! - §8.8.12 `tfdt`: the decode time of a fragment's first sample.
//! - §8.8.8 `trun`: each sample's duration (flag `0x100`) and composition
//!   offset (flag `0x800`; unsigned in version 0, signed in version 1).
//! - §8.6.1.1: a sample's composition (presentation) time is its decode time
//!   (the fragment's `tfdt` plus the durations of the samples before it)
//!   plus its composition offset. No edit list is applied (the tracks this
//!   project writes have none; [`timescale`] panics on one it cannot read).

/// One box: its four-character type and its payload (after the header).
fn boxes(mut buf: &[u8]) -> Vec<([u8; 4], &[u8])> {
    let mut out = Vec::new();
    while buf.len() >= 8 {
        let size32 = u32::from_be_bytes(buf[0..4].try_into().unwrap()) as usize;
        let kind: [u8; 4] = buf[4..8].try_into().unwrap();
        let (header, size) = match size32 {
            0 => (8, buf.len()),
            1 => (16, u64::from_be_bytes(buf[8..16].try_into().unwrap()) as usize),
            n => (8, n),
        };
        assert!(size >= header && size <= buf.len(), "box {:?} of {size} bytes in {} bytes", String::from_utf8_lossy(&kind), buf.len());
        out.push((kind, &buf[header..size]));
        buf = &buf[size..];
    }
    out
}

/// The payload of the first child of type `kind` (a path of types walks down).
fn find<'a>(buf: &'a [u8], path: &[&[u8; 4]]) -> Option<&'a [u8]> {
    let (first, rest) = path.split_first()?;
    let payload = boxes(buf).into_iter().find(|(k, _)| k == *first)?.1;
    if rest.is_empty() {
        Some(payload)
    } else {
        find(payload, rest)
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// The track's timescale (`moov/trak/mdia/mdhd`, §8.4.2) from an
/// initialization segment. Panics on a track with an edit list (`edts`),
/// whose presentation this reader does not model.
pub fn timescale(init: &[u8]) -> u32 {
    assert!(find(init, &[b"moov", b"trak", b"edts"]).is_none(), "the track has an edit list");
    let mdhd = find(init, &[b"moov", b"trak", b"mdia", b"mdhd"]).expect("init segment without moov/trak/mdia/mdhd");
    match mdhd[0] {
        0 => u32_at(mdhd, 12),
        _ => u32_at(mdhd, 20),
    }
}

/// `trex.default_sample_duration` (§8.8.3), 0 when absent.
fn trex_duration(init: &[u8]) -> u32 {
    find(init, &[b"moov", b"mvex", b"trex"]).map(|t| u32_at(t, 12)).unwrap_or(0)
}

/// Every sample of a media segment (`moof` + `mdat`, one track) in decode
/// order: (composition time, duration), in the track's timescale units,
/// given its initialization segment. Panics on a segment without `tfdt`.
pub fn samples(init: &[u8], segment: &[u8]) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for (kind, moof) in boxes(segment) {
        if &kind != b"moof" {
            continue;
        }
        for (kind, traf) in boxes(moof) {
            if &kind != b"traf" {
                continue;
            }
            let tfhd = find(traf, &[b"tfhd"]).expect("traf without tfhd");
            let flags = u32_at(tfhd, 0) & 0xff_ffff;
            let mut at = 8; // version/flags, track_ID
            at += if flags & 0x01 != 0 { 8 } else { 0 };
            at += if flags & 0x02 != 0 { 4 } else { 0 };
            let default_duration = if flags & 0x08 != 0 { u32_at(tfhd, at) } else { trex_duration(init) };
            let tfdt = find(traf, &[b"tfdt"]).expect("traf without tfdt (CMAF requires it)");
            let mut decode = if tfdt[0] == 1 { u64_at(tfdt, 4) as i64 } else { i64::from(u32_at(tfdt, 4)) };
            for (kind, trun) in boxes(traf) {
                if &kind != b"trun" {
                    continue;
                }
                let (version, flags) = (trun[0], u32_at(trun, 0) & 0xff_ffff);
                let count = u32_at(trun, 4);
                let mut at = 8;
                at += if flags & 0x01 != 0 { 4 } else { 0 };
                at += if flags & 0x04 != 0 { 4 } else { 0 };
                for _ in 0..count {
                    let mut duration = i64::from(default_duration);
                    let mut offset = 0i64;
                    if flags & 0x100 != 0 {
                        duration = i64::from(u32_at(trun, at));
                        at += 4;
                    }
                    at += if flags & 0x200 != 0 { 4 } else { 0 };
                    at += if flags & 0x400 != 0 { 4 } else { 0 };
                    if flags & 0x800 != 0 {
                        let raw = u32_at(trun, at);
                        offset = if version == 0 { i64::from(raw) } else { i64::from(raw as i32) };
                        at += 4;
                    }
                    out.push((decode + offset, duration));
                    decode += duration;
                }
            }
        }
    }
    out
}

/// A segment's earliest presentation time (the smallest composition time of
/// its samples, ISO/IEC 23009-1 §5.3.9.6 and ISO/IEC 23000-19 §7.3.2.2
/// compare it with the manifest's segment start), in timescale units.
pub fn earliest_presentation(init: &[u8], segment: &[u8]) -> i64 {
    samples(init, segment).iter().map(|s| s.0).min().expect("a segment without samples")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bx(kind: &[u8; 4], payload: &[u8]) -> Vec<u8> {
        [&((payload.len() + 8) as u32).to_be_bytes()[..], kind, payload].concat()
    }

    fn init(timescale: u32) -> Vec<u8> {
        let mut mdhd = vec![0u8; 24];
        mdhd[12..16].copy_from_slice(&timescale.to_be_bytes());
        let trex = [0u32, 1, 1, 512, 0, 0].iter().flat_map(|x| x.to_be_bytes()).collect::<Vec<_>>();
        bx(b"moov", &[bx(b"trak", &bx(b"mdia", &bx(b"mdhd", &mdhd))), bx(b"mvex", &bx(b"trex", &trex))].concat())
    }

    /// A fragment at decode time `tfdt` (version 1), its trun version 1 with
    /// per-sample composition offsets and the trex default duration.
    fn segment(tfdt: u64, offsets: &[i32]) -> Vec<u8> {
        let tfhd = [0u32, 1].iter().flat_map(|x| x.to_be_bytes()).collect::<Vec<_>>();
        let tfdt = [&[1u8, 0, 0, 0][..], &tfdt.to_be_bytes()].concat();
        let mut trun = vec![1u8, 0x00, 0x08, 0x00];
        trun.extend((offsets.len() as u32).to_be_bytes());
        for o in offsets {
            trun.extend(o.to_be_bytes());
        }
        let traf = [bx(b"tfhd", &tfhd), bx(b"tfdt", &tfdt), bx(b"trun", &trun)].concat();
        [bx(b"moof", &bx(b"traf", &traf)), bx(b"mdat", b"")].concat()
    }

    #[test]
    fn composition_time_is_decode_time_plus_the_signed_offset() {
        // I P B B in decode order; presented I B B P.
        let (i, s) = (init(12800), segment(128_000, &[0, 1536, -512, -512]));
        assert_eq!(timescale(&i), 12800);
        assert_eq!(
            samples(&i, &s),
            vec![(128_000, 512), (128_000 + 512 + 1536, 512), (128_000 + 1024 - 512, 512), (128_000 + 1536 - 512, 512)]
        );
        assert_eq!(earliest_presentation(&i, &s), 128_000);
        // The same frames with the decode times one frame earlier present one frame earlier.
        assert_eq!(earliest_presentation(&i, &segment(127_488, &[0, 1536, -512, -512])), 127_488);
    }

    #[test]
    #[should_panic(expected = "edit list")]
    fn an_edit_list_is_refused() {
        let i = bx(b"moov", &bx(b"trak", &bx(b"edts", b"")));
        timescale(&i);
    }
}
