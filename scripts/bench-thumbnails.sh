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
die() { echo "bench-thumbnails: $*" >&2; exit 1; }
for tool in wrk nginx; do
    command -v "$tool" >/dev/null || command -v "/usr/sbin/$tool" >/dev/null || {
        echo "bench-thumbnails: installing $tool (apt)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$([ "$tool" = nginx ] && echo nginx-light || echo wrk)" >/dev/null
    }
done
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
API_BIN="${API_BIN:-$BIN_DIR/api}"
[ -x "$BIN_DIR/playback" ] || die "$BIN_DIR/playback missing (cargo build --release --bins)"
[ -x "$API_BIN" ] || die "$API_BIN missing (cargo build --release --bins)"

WORK="$(mktemp -d /tmp/vid-bench-thumbnails.XXXXXX)"
chmod 755 "$WORK"
PIDS=()
cleanup() {
    local p; for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    [ -n "${DB:-}" ] && psql -q "$SERVER/postgres" -c "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { local i; for i in $(seq 1 300); do curl -fs -o /dev/null "$1" && return 0; sleep 0.1; done; die "$1 never answered"; }

# 1. One kept frame as the transcoder writes it (720p JPEG, q 3), in Garage.
SRC="fixtures/media/bigbuckbunny.mp4"
mkdir -p "$WORK/frames" "$WORK/static"
if [ -f "$SRC" ]; then ffmpeg -v error -y -ss 2 -i "$SRC" -frames:v 1 -q:v 3 "$WORK/frames/0.jpg"
else ffmpeg -v error -y -f lavfi -i testsrc2=size=1280x720 -frames:v 1 -q:v 3 "$WORK/frames/0.jpg"; fi
SERVER="${VID__DATABASE__URL%/*}"
DB="vidbench_thumbs_$$"
psql -q "$SERVER/postgres" -c "CREATE DATABASE $DB" >/dev/null
export VID__DATABASE__URL="$SERVER/$DB" VID_PROFILE=development
"$API_BIN" migrate >/dev/null
TENANT="ten_bench$(date +%s)"
VIDEO="vid_01jbench0000000000000000$((RANDOM % 10))"
PREFIX="bench/thumbnails-$$/stream/"
PB="pb_01jd8x4m3v0k2q6s7t9w1y5zab"
S3="$VID__S3__ENDPOINT/$VID__S3__BUCKET"
s3curl() { curl -fsS --aws-sigv4 "aws:amz:$VID__S3__REGION:s3" --user "$VID__S3__ACCESS_KEY_ID:$VID__S3__SECRET_ACCESS_KEY" "$@"; }
s3curl -o /dev/null -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -T "$WORK/frames/0.jpg" "$S3/${PREFIX}frames/0.jpg" || die "PUT to Garage failed"
IMAGES='{"interval_ms": 1000, "tile_width": 160, "tile_height": 90, "frames_ms": [0], "frame_width": 1280, "frame_height": 720, "duration_ms": 1000}'
psql -q "$VID__DATABASE__URL" >/dev/null <<SQL
INSERT INTO tenants (id, name) VALUES ('$TENANT', 'bench');
INSERT INTO uploads (id, tenant_id, status, size_bytes, content_type, part_size, part_count, storage_key, s3_upload_id, video_id, expires_at)
  VALUES ('upl_bench', '$TENANT', 'completed', 1, 'video/mp4', 1, 1, 'k', 'x', '$VIDEO', now() + interval '1 day');
INSERT INTO videos (id, tenant_id, upload_id, operation_id, status, content_type, source_key, stream)
  VALUES ('$VIDEO', '$TENANT', 'upl_bench', 'op_bench', 'ready', 'video/mp4', 'k',
          '{"prefix": "$PREFIX", "hls_master_key": "${PREFIX}master.m3u8", "dash_manifest_key": "${PREFIX}manifest.mpd", "segment_duration_ms": 4000, "objects": 0, "size_bytes": 0, "images": $IMAGES}');
INSERT INTO playback_ids (id, tenant_id, video_id, policy) VALUES ('$PB', '$TENANT', '$VIDEO', 'public');
SQL

# 2. playback and nginx on loopback.
PB_PORT="$(free_port)"; NGINX_PORT="$(free_port)"
VID__PLAYBACK__LISTEN="127.0.0.1:$PB_PORT" VID__TELEMETRY__LEVEL=warn "$BIN_DIR/playback" >"$WORK/playback.log" 2>&1 &
PIDS+=($!)
PLAY="http://127.0.0.1:$PB_PORT/play/$PB/thumbnail.jpg"
wait_http "http://127.0.0.1:$PB_PORT/healthz"
curl -fsS -o "$WORK/static/thumb.jpg" "$PLAY?time=0&width=320" || die "the first thumbnail failed"
mkdir -p "$WORK/nginx"
cat >"$WORK/nginx/nginx.conf" <<NGINX
worker_processes $(nproc);
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $WORK/nginx/body;
    proxy_temp_path $WORK/nginx/proxy;
    fastcgi_temp_path $WORK/nginx/fastcgi;
    uwsgi_temp_path $WORK/nginx/uwsgi;
    scgi_temp_path $WORK/nginx/scgi;
    types { image/jpeg jpg; }
    server { listen 127.0.0.1:$NGINX_PORT; root $WORK/static; }
}
NGINX
"$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -g 'daemon off;' &
PIDS+=($!)
STATIC="http://127.0.0.1:$NGINX_PORT/thumb.jpg"
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
wrk_run() {
    local out rps p99
    out="$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" --latency "$1")"
    grep -q "Non-2xx" <<<"$out" && die "wrk got non-2xx answers from $1: $out"
    rps="$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")"
    p99="$(awk '$1 == "99%" {v=$2; if (v ~ /us$/) {sub(/us$/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms$/,"",v)} else if (v ~ /s$/) {sub(/s$/,"",v); v*=1000}; printf "%.2f", v}' <<<"$out")"
    echo "$rps $p99"
}
read -r w_rps w_p99 <<<"$(wrk_run "$PLAY?time=0&width=320")"
read -r s_rps s_p99 <<<"$(wrk_run "$STATIC")"
printf '\n%-22s %10s %9s\n' "wrk" "req/s" "p99 ms"
printf '%-22s %10.0f %9s\n' "warm thumbnail" "$w_rps" "$w_p99"
printf '%-22s %10.0f %9s\n' "nginx static" "$s_rps" "$s_p99"
printf 'ratio warm/nginx: %s %%\n' "$(awk -v a="$w_rps" -v b="$s_rps" 'BEGIN {printf "%.2f", 100 * a / b}')"
