#!/usr/bin/env bash
# Thumbnails (issue 20): /play/{pb}/thumbnail.jpg on a COLD cache (every
# request a new (frame, width): one GET of the kept 1280x720 frame, a resize
# with the `image` crate, one PUT) and on a WARM one (the stored thumbnail
# proxied), against nginx serving a static file of the same size as the warm
# thumbnail, in the same run. Sequential curl means for cold/warm/nginx (one
# viewer), and wrk req/s + p99 for warm vs nginx; ratios printed. No time is
# asserted.
#
#   scripts/bench-thumbnails.sh          (make bench runs it; needs .local/stack.env)
# Knobs: DURATION (wrk seconds, 10), CONNECTIONS (32), THREADS (2),
#        BIN_DIR (target/release), API_BIN ($BIN_DIR/api), COLD (cold requests, 60).
# Needs: wrk, nginx (installed with apt if missing), ffmpeg, psql, curl >= 7.75.
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
source .local/stack.env
DURATION="${DURATION:-10}"
CONNECTIONS="${CONNECTIONS:-32}"
THREADS="${THREADS:-2}"
BIN_DIR="${BIN_DIR:-target/release}"
COLD="${COLD:-60}"
API_BIN="${API_BIN:-$BIN_DIR/api}"
# shellcheck source=scripts/lib/bench-http.sh
source scripts/lib/bench-http.sh
bench_init bench-thumbnails

# 1. One kept frame as the transcoder writes it (720p JPEG, q 3), in Garage.
SRC="fixtures/media/bigbuckbunny.mp4"
mkdir -p "$WORK/frames" "$WORK/static"
if [ -f "$SRC" ]; then ffmpeg -v error -y -ss 2 -i "$SRC" -frames:v 1 -q:v 3 "$WORK/frames/0.jpg"
else ffmpeg -v error -y -f lavfi -i testsrc2=size=1280x720 -frames:v 1 -q:v 3 "$WORK/frames/0.jpg"; fi
bench_db thumbs
TENANT="ten_bench$(date +%s)"
VIDEO="vid_01jbench0000000000000000$((RANDOM % 10))"
PREFIX="bench/thumbnails-$$/stream/"
PB="pb_01jd8x4m3v0k2q6s7t9w1y5zab"
s3_put "$WORK/frames/0.jpg" "${PREFIX}frames/0.jpg"
IMAGES='{"interval_ms": 1000, "tile_width": 160, "tile_height": 90, "frames_ms": [0], "frame_width": 1280, "frame_height": 720, "duration_ms": 1000}'
seed_ready_video "$TENANT" "$VIDEO" "$PREFIX" "$PB" \
    "{\"prefix\": \"$PREFIX\", \"hls_master_key\": \"${PREFIX}master.m3u8\", \"dash_manifest_key\": \"${PREFIX}manifest.mpd\", \"segment_duration_ms\": 4000, \"objects\": 0, \"size_bytes\": 0, \"images\": $IMAGES}"

# 2. playback and nginx on loopback.
start_playback
PLAY="$PLAY_ORIGIN/play/$PB/thumbnail.jpg"
curl -fsS -o "$WORK/static/thumb.jpg" "$PLAY?time=0&width=320" || die "the first thumbnail failed"
start_nginx "$WORK/static" "image/jpeg jpg;"
STATIC="$STATIC_ORIGIN/thumb.jpg"
wait_http "$STATIC"
echo "frame $(wc -c <"$WORK/frames/0.jpg") B (1280x720); thumbnail 320 px: $(wc -c <"$WORK/static/thumb.jpg") B"

# 3. Sequential means: cold (a new width each time: 200..200+COLD px), warm, nginx.
mean_ms() {   # mean_ms N URL_PREFIX [vary]: mean time_total of N fetches
    local i total=0 t url
    for i in $(seq 1 "$1"); do
        url="$2"; [ "${3:-}" = vary ] && url="$2$((199 + i))"
        t="$(curl -fsS -o /dev/null -w '%{time_total}' "$url")"
        total="$(awk -v a="$total" -v b="$t" 'BEGIN {print a + b}')"
    done
    awk -v t="$total" -v n="$1" 'BEGIN {printf "%.2f", 1000 * t / n}'
}
cold="$(mean_ms "$COLD" "$PLAY?time=0&width=" vary)"
warm="$(mean_ms "$COLD" "$PLAY?time=0&width=320")"
static="$(mean_ms "$COLD" "$STATIC")"
printf '\none at a time, mean of %s:\n' "$COLD"
printf '  cold (GET frame + resize + PUT)  %8s ms  (%s x nginx)\n' "$cold" "$(awk -v a="$cold" -v b="$static" 'BEGIN {printf "%.1f", a / b}')"
printf '  warm (stored thumbnail)          %8s ms  (%s x nginx)\n' "$warm" "$(awk -v a="$warm" -v b="$static" 'BEGIN {printf "%.1f", a / b}')"
printf '  nginx, static file, same size    %8s ms\n' "$static"

# 4. wrk: warm thumbnail vs nginx.
read -r w_rps _ w_p99 <<<"$(wrk_stats "$PLAY?time=0&width=320")"
read -r s_rps _ s_p99 <<<"$(wrk_stats "$STATIC")"
printf '\n%-22s %10s %9s\n' "wrk" "req/s" "p99 ms"
printf '%-22s %10.0f %9s\n' "warm thumbnail" "$w_rps" "$w_p99"
printf '%-22s %10.0f %9s\n' "nginx static" "$s_rps" "$s_p99"
printf 'ratio warm/nginx: %s %%\n' "$(awk -v a="$w_rps" -v b="$s_rps" 'BEGIN {printf "%.2f", 100 * a / b}')"
