"""Reads a packaged stream with independent parsers and prints what they saw as JSON.

Usage: python3 stream_check.py <stream dir>
HLS: the `m3u8` package (PyPI); DASH: the `mpegdash` package (PyPI). Used by
vid_testkit::stream (the transcoder's packaging tests and the end-to-end
playback tests); needs `pip install m3u8 mpegdash`.
"""
import json
import os
import sys

import m3u8
from mpegdash.parser import MPEGDASHParser


def media(path):
    p = m3u8.load(path)
    return {
        "version": p.version,
        "target_duration": p.target_duration,
        "playlist_type": p.playlist_type,
        "endlist": p.is_endlist,
        "independent": p.is_independent_segments,
        "map": [s.init_section.uri if s.init_section else None for s in p.segments][:1],
        "segments": [{"uri": s.uri, "duration": s.duration} for s in p.segments],
    }


def main(d):
    master = m3u8.load(os.path.join(d, "master.m3u8"))
    out = {
        "version": master.version,
        "independent": master.is_independent_segments,
        "media": [{"type": m.type, "group_id": m.group_id, "uri": m.uri, "channels": m.channels} for m in master.media],
        "variants": [],
    }
    for v in master.playlists:
        si = v.stream_info
        out["variants"].append({
            "uri": v.uri,
            "bandwidth": si.bandwidth,
            "average_bandwidth": si.average_bandwidth,
            "codecs": si.codecs,
            "resolution": list(si.resolution) if si.resolution else None,
            "frame_rate": si.frame_rate,
            "audio": si.audio,
            "playlist": media(os.path.join(d, v.uri)),
        })
    out["audio_playlists"] = [media(os.path.join(d, m.uri)) for m in master.media if m.type == "AUDIO"]
    mpd = MPEGDASHParser.parse(os.path.join(d, "manifest.mpd"))
    sets = []
    for a in mpd.periods[0].adaptation_sets:
        reps = []
        for r in a.representations:
            t = r.segment_templates[0]
            durations = []
            for s in t.segment_timelines[0].Ss:
                durations += [s.d] * (1 + (s.r or 0))
            reps.append({"id": r.id, "codecs": r.codecs, "bandwidth": r.bandwidth, "width": r.width, "height": r.height,
                         "timescale": t.timescale, "start": t.segment_timelines[0].Ss[0].t or 0,
                         "pto": t.presentation_time_offset or 0, "initialization": t.initialization, "media": t.media, "durations": durations})
        sets.append({"content_type": a.content_type, "mime_type": a.mime_type, "representations": reps})
    out["dash"] = {"type": mpd.type, "duration": mpd.media_presentation_duration, "adaptation_sets": sets}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
