"""Independent parsers of what the playback service serves (issue 19 tests).

`check.py hls <master url>`: loads the master playlist and every media
playlist it names over HTTP with `m3u8` (PyPI), resolving each URI against the
URL it came from, and prints JSON: variants (uri, codecs, resolution), audio
media URIs, and per media playlist its init and segment URIs.
`check.py dash <mpd url>`: parses the MPD with `mpegdash` and prints each
Representation's initialization and media templates (as written).
"""
import json
import sys
import urllib.request

mode, url = sys.argv[1], sys.argv[2]
if mode == "hls":
    import m3u8

    master = m3u8.load(url)
    out = {"variants": [], "media": [], "tracks": []}
    for p in master.playlists:
        out["variants"].append(
            {"uri": p.absolute_uri, "codecs": p.stream_info.codecs, "resolution": list(p.stream_info.resolution or [])}
        )
    for m in master.media:
        if m.uri:
            out["media"].append(m.absolute_uri)
    for u in [v["uri"] for v in out["variants"]] + out["media"]:
        pl = m3u8.load(u)
        maps = pl.segment_map if isinstance(pl.segment_map, list) else [pl.segment_map]
        out["tracks"].append(
            {
                "playlist": u,
                "init": [s.absolute_uri for s in maps if s],
                "segments": [s.absolute_uri for s in pl.segments],
                "endlist": pl.is_endlist,
            }
        )
    print(json.dumps(out))
elif mode == "dash":
    from mpegdash.parser import MPEGDASHParser

    text = urllib.request.urlopen(url).read().decode()
    mpd = MPEGDASHParser.parse(text)
    reps = []
    for period in mpd.periods:
        for aset in period.adaptation_sets:
            for rep in aset.representations:
                tpl = (rep.segment_templates or aset.segment_templates)[0]
                reps.append({"id": rep.id, "initialization": tpl.initialization, "media": tpl.media})
    print(json.dumps({"representations": reps}))
else:
    sys.exit(f"unknown mode {mode}")
