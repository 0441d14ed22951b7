#!/usr/bin/env bash
# Benchmark of issue 4: our single-decode ladder against the ffmpeg CLI.
#
#   (a) ours: `transcoder work --spec` (the supervised child the service runs),
#       release build, one decode feeding 1080p/720p/480p/360p + poster;
#   (b) the ffmpeg CLI once per rendition (4 processes, one after the other),
#       each decoding the source itself;
#   (c) one ffmpeg CLI process with a `split` filter feeding the same 4 encoders;
#   (s) ours with the static MP4s off (`mp4_support: none`): the adaptive
#       stream only (CMAF segments of every rung + one audio track, HLS + DASH);
#   (p) ours with the static MP4s and the images off (`"storyboard": false`
#       in the spec; the service never sets it): the packaging alone, the
#       same work as (d);
#   (d) one ffmpeg CLI process with `split` and the `hls` muxer (fMP4/CMAF
#       segments, 4 s, keyframes forced at every segment boundary, no scene
#       cuts), one output per rung plus the audio once: the same HLS ladder.
#
# Issue 19's bar: packaging costs no second pass, so (p) / (d) <= 1.0; (s) / (d)
# adds what (d) does not make (storyboard, thumbnail frames, poster), and the
# default (a: stream + static MP4s from the same packets) stays near (c).
#
# Same settings as services/transcoder/src/media/{ladder,transcode}.rs: libx264
# preset veryfast, CRF 23, profile high, maxrate = w*h*5/2 b/s, bufsize = 2*maxrate,
# bicubic scale, setsar=1, yuv420p; AAC 128 kb/s stereo at the source rate;
# +faststart. (Differences: ours encodes the audio once and shares it, and also
# writes a JPEG poster; the CLI in (c) encodes the audio once per output.)
#
# Each variant runs RUNS times (default 3), interleaved; medians are reported.
#   BENCH_SECONDS=20 BENCH_SIZE=1920x1080 RUNS=3 scripts/bench-transcode.sh [input.mp4]
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS="${RUNS:-3}"
SECONDS_="${BENCH_SECONDS:-20}"
SIZE="${BENCH_SIZE:-1920x1080}"
WORK="${BENCH_DIR:-$(mktemp -d /tmp/vid-bench-XXXXXX)}"
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT

# TRANSCODER_BIN: a release transcoder built elsewhere (e.g. copied out of the
# image, `podman cp`); otherwise this builds one.
if [[ -n "${TRANSCODER_BIN:-}" ]]; then
    BIN="$TRANSCODER_BIN"
else
    echo "building the transcoder (release)…" >&2
    cargo build --release -q -p vid-transcoder
    BIN="${CARGO_TARGET_DIR:-target}/release/transcoder"
fi

INPUT="${1:-}"
if [[ -z "$INPUT" ]]; then
    INPUT="$WORK/input.mp4"
    echo "generating a ${SIZE} ${SECONDS_} s testsrc2 + sine H.264/AAC input…" >&2
    ffmpeg -hide_banner -loglevel error -y \
        -f lavfi -i "testsrc2=size=${SIZE}:rate=25:duration=${SECONDS_}" \
        -f lavfi -i "sine=frequency=440:sample_rate=48000:duration=${SECONDS_}" \
        -c:v libx264 -preset veryfast -crf 18 -pix_fmt yuv420p -c:a aac -ac 2 -b:a 192k -shortest "$INPUT"
fi

now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$1" "$2"; }

# run_ours [MP4 [STORYBOARD]]: MP4 is true (default: stream + static MP4s) or false
# (stream only); STORYBOARD false also skips the storyboard, frames and poster.
run_ours() {
    local mp4="${1:-true}" board="${2:-true}" out="$WORK/ours"; rm -rf "$out"; mkdir -p "$out"
    cat > "$WORK/spec.json" <<JSON
{"input": "$INPUT", "out_dir": "$out", "limits": {"max_duration_seconds": 14400, "max_width": 4096, "max_height": 4096}, "ladder": [1080, 720, 480, 360], "packaging": {"segment_seconds": 4.0, "mp4": $mp4, "storyboard": $board}}
JSON
    "$BIN" work --spec "$WORK/spec.json" > "$WORK/ours.jsonl"
    tail -n1 "$WORK/ours.jsonl" | grep -q '"event":"succeeded"' || { echo "our ladder failed: $(tail -n1 "$WORK/ours.jsonl")" >&2; exit 1; }
}

# Rungs as "name w h", from our own output (so (b) and (c) encode exactly the same sizes).
run_ours
mapfile -t RUNGS < <(tail -n1 "$WORK/ours.jsonl" | python3 -c '
import json, sys
m = json.load(sys.stdin)
for r in m["outcome"]["transcoded"]["renditions"]:
    print(r["name"], r["width"], r["height"])')
[[ ${#RUNGS[@]} -gt 0 ]] || { echo "no renditions" >&2; exit 1; }

venc() { # w h → x264 options of that rung
    local w=$1 h=$2 maxrate=$(( $1 * $2 * 5 / 2 )); (( maxrate < 200000 )) && maxrate=200000
    echo "-c:v libx264 -preset veryfast -crf 23 -maxrate $maxrate -bufsize $(( maxrate * 2 )) -profile:v high -pix_fmt yuv420p"
}
AENC="-c:a aac -b:a 128k -ac 2"

run_per_rendition() {
    local r name w h
    for r in "${RUNGS[@]}"; do
        read -r name w h <<<"$r"
        # shellcheck disable=SC2046
        ffmpeg -hide_banner -loglevel error -y -i "$INPUT" -vf "scale=w=$w:h=$h:flags=bicubic,setsar=1,format=yuv420p" \
            $(venc "$w" "$h") $AENC -movflags +faststart "$WORK/cli_$name.mp4"
    done
}

run_split() {
    local n=${#RUNGS[@]} i=0 graph labels="" r name w h
    local -a outs=()
    for ((i = 0; i < n; i++)); do labels+="[s$i]"; done
    graph="[0:v]split=$n$labels"
    i=0
    for r in "${RUNGS[@]}"; do
        read -r name w h <<<"$r"
        graph+=";[s$i]scale=w=$w:h=$h:flags=bicubic,setsar=1,format=yuv420p[o$i]"
        # shellcheck disable=SC2207
        outs+=(-map "[o$i]" -map 0:a? $(venc "$w" "$h") $AENC -movflags +faststart "$WORK/split_$name.mp4")
        i=$((i + 1))
    done
    ffmpeg -hide_banner -loglevel error -y -i "$INPUT" -filter_complex "$graph" "${outs[@]}"
}

# (d): the same ladder as HLS with fMP4 segments from one ffmpeg process.
run_split_hls() {
    local n=${#RUNGS[@]} i=0 graph labels="" r name w h out="$WORK/cli_hls"
    local -a outs=()
    rm -rf "$out"
    for ((i = 0; i < n; i++)); do labels+="[s$i]"; done
    graph="[0:v]split=$n$labels"
    local hls=(-f hls -hls_time 4 -hls_playlist_type vod -hls_segment_type fmp4 -hls_fmp4_init_filename init.mp4)
    local keys=(-force_key_frames "expr:gte(t,n_forced*4)" -x264-params "scenecut=0:open-gop=0")
    i=0
    for r in "${RUNGS[@]}"; do
        read -r name w h <<<"$r"
        mkdir -p "$out/$name"
        graph+=";[s$i]scale=w=$w:h=$h:flags=bicubic,setsar=1,format=yuv420p[o$i]"
        # shellcheck disable=SC2207
        outs+=(-map "[o$i]" $(venc "$w" "$h") "${keys[@]}" "${hls[@]}" -hls_segment_filename "$out/$name/seg-%05d.m4s" "$out/$name/index.m3u8")
        i=$((i + 1))
    done
    mkdir -p "$out/audio"
    # shellcheck disable=SC2206
    outs+=(-map 0:a $AENC "${hls[@]}" -hls_segment_filename "$out/audio/seg-%05d.m4s" "$out/audio/index.m3u8")
    ffmpeg -hide_banner -loglevel error -y -i "$INPUT" -filter_complex "$graph" "${outs[@]}"
    ls "$out/${RUNGS[0]%% *}"/seg-*.m4s >/dev/null || { echo "the CLI wrote no HLS segments" >&2; exit 1; }
}

declare -a T_OURS=() T_PER=() T_SPLIT=() T_STREAM=() T_PACK=() T_HLS=()
for ((run = 1; run <= RUNS; run++)); do
    t0=$(now); run_ours; t1=$(now); T_OURS+=("$(elapsed "$t0" "$t1")")
    t0=$(now); run_per_rendition; t1=$(now); T_PER+=("$(elapsed "$t0" "$t1")")
    t0=$(now); run_split; t1=$(now); T_SPLIT+=("$(elapsed "$t0" "$t1")")
    t0=$(now); run_ours false; t1=$(now); T_STREAM+=("$(elapsed "$t0" "$t1")")
    t0=$(now); run_ours false false; t1=$(now); T_PACK+=("$(elapsed "$t0" "$t1")")
    t0=$(now); run_split_hls; t1=$(now); T_HLS+=("$(elapsed "$t0" "$t1")")
    echo "run $run/$RUNS: ours ${T_OURS[-1]} s, per-rendition ${T_PER[-1]} s, split ${T_SPLIT[-1]} s, ours stream-only ${T_STREAM[-1]} s, packaging only ${T_PACK[-1]} s, split+hls ${T_HLS[-1]} s" >&2
done

python3 - "$INPUT" "$(nproc)" "${T_OURS[*]}" "${T_PER[*]}" "${T_SPLIT[*]}" "${T_STREAM[*]}" "${T_PACK[*]}" "${T_HLS[*]}" "${RUNGS[*]}" <<'PY'
import statistics, sys
inp, cores, ours, per, split, stream, pack, hls, rungs = sys.argv[1:]
ours, per, split, stream, pack, hls = ([float(x) for x in s.split()] for s in (ours, per, split, stream, pack, hls))
mo, mp, ms, mst, mpk, mh = (statistics.median(x) for x in (ours, per, split, stream, pack, hls))
runs = lambda xs: ' '.join(f'{x:.2f}' for x in xs)
print()
print(f"input: {inp}; rungs: {rungs}; {len(ours)} runs each; {cores} cores")
print(f"{'variant':<52} {'median s':>9}   runs")
print(f"{'(a) ours: stream + static MP4s (one decode)':<52} {mo:>9.2f}   {runs(ours)}")
print(f"{'(b) ffmpeg CLI, one process per rendition':<52} {mp:>9.2f}   {runs(per)}")
print(f"{'(c) ffmpeg CLI, one process with split (MP4s)':<52} {ms:>9.2f}   {runs(split)}")
print(f"{'(s) ours: stream only (mp4_support none)':<52} {mst:>9.2f}   {runs(stream)}")
print(f"{'(p) ours: packaging only (no MP4s, no images)':<52} {mpk:>9.2f}   {runs(pack)}")
print(f"{'(d) ffmpeg CLI, split + hls muxer (fMP4 ladder)':<52} {mh:>9.2f}   {runs(hls)}")
print()
print(f"ours / per-rendition         = {mo / mp:.3f}   (goal <= 0.70)")
print(f"ours / split                 = {mo / ms:.3f}   (goal <= 1.05)")
print(f"ours packaging / split+hls   = {mpk / mh:.3f}   (goal <= 1.00: packaging costs no second pass)")
print(f"ours stream-only / split+hls = {mst / mh:.3f}   (+ storyboard, frames, poster: what (d) does not make)")
print(f"ours default / split+hls     = {mo / mh:.3f}   (the static MP4s' extra muxing)")
PY
