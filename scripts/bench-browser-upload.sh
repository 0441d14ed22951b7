#!/usr/bin/env bash
# Issue 21 performance: upload the same file (random bytes sent as video/mp4,
# default 192 MiB, under the default 200 MiB upload limit) to the local
# Garage with the JavaScript upload library in headless Chromium
# (tests/console/bench-browser-upload.mjs: 4 parts at once, XHR PUTs to the
# presigned part URLs, then `complete`) and with `vidctl upload` (4 parts at
# once), both through the same api with 16 MiB parts, and report each
# throughput and the ratio library / vidctl. Figures only, no assertions.
#
#   scripts/bench-browser-upload.sh [size_mib=192] [runs=1]
#
# Starts its own api (release build when present, else debug) on a free
# loopback port with a fresh database `vidtest_bench_*` and RabbitMQ prefix,
# and no transcoder (the operations stay pending; nothing reads the sources);
# removes both sources, the database and the api at the end. Needs the local
# stack (scripts/stack.sh infra-up), /usr/bin/chromium and tests/console's
# playwright-core (scripts/console-test.sh installs both).
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SIZE_MIB="${1:-192}"
RUNS="${2:-1}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
BIN="$TARGET/release"
[ -x "$BIN/api" ] && [ -x "$BIN/vidctl" ] || BIN="$TARGET/debug"
[ -x "$BIN/api" ] && [ -x "$BIN/vidctl" ] || { echo "bench-browser-upload: build api and vidctl first (make build)" >&2; exit 1; }
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] && [ -d tests/console/node_modules/playwright-core ] \
    || { echo "bench-browser-upload: needs chromium and tests/console/node_modules (run scripts/console-test.sh once); skipped" >&2; exit 0; }
# shellcheck disable=SC1091
source .local/stack.env

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
SUFFIX="$(python3 -c 'import secrets,string; print("".join(secrets.choice(string.digits + string.ascii_lowercase) for _ in range(26)))')"
SERVER="${VID__DATABASE__URL%/*}"
DB="vidtest_bench_${SUFFIX:0:12}"
WORK="$(mktemp -d /tmp/bench-browser-upload.XXXXXX)"
API_PID=""
cleanup() {
    set +e
    delete_sources
    [ -n "$API_PID" ] && kill -TERM -- "-$API_PID" 2>/dev/null && sleep 0.5
    psql -q "$SERVER/postgres" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT
export VID_PROFILE=test VID_CONFIG_DIR="$ROOT/config" VID__DATABASE__URL="$SERVER/$DB" VID__AMQP__PREFIX="t$SUFFIX"
export VID__API__LISTEN="127.0.0.1:$(free_port)"
API_URL="http://$VID__API__LISTEN"
psql -q "$SERVER/postgres" -c "CREATE DATABASE $DB" >/dev/null
"$BIN/api" migrate >>"$WORK/api.log" 2>&1
KEY="$("$BIN/api" create-tenant --name bench 2>>"$WORK/api.log")"
setsid "$BIN/api" >>"$WORK/api.log" 2>&1 </dev/null &
API_PID=$!
for _ in $(seq 1 100); do curl -fsS -o /dev/null "$API_URL/healthz" 2>/dev/null && break; sleep 0.2; done

FILE="$WORK/upload.bin"
head -c "$((SIZE_MIB * 1024 * 1024))" /dev/urandom >"$FILE"
BYTES="$(stat -c %s "$FILE")"
export XDG_CACHE_HOME="$WORK/cache"
now() { date +%s.%N; }
mibps() { python3 -c "import sys; print(f'{$BYTES / 1048576 / float(sys.argv[1]):.1f}')" "$1"; }
UPLOADS=()
# Removes the assembled sources (awscli from .local/venv, as bench-upload.sh installs it).
delete_sources() {
    local aws="$ROOT/.local/venv/bin/aws" upl key
    for upl in "${UPLOADS[@]}"; do
        key="$(psql "$VID__DATABASE__URL" -Atc "SELECT storage_key FROM uploads WHERE id = '$upl'" 2>/dev/null)"
        [ -n "$key" ] || continue
        if [ -x "$aws" ]; then
            AWS_ACCESS_KEY_ID="$VID__S3__ACCESS_KEY_ID" AWS_SECRET_ACCESS_KEY="$VID__S3__SECRET_ACCESS_KEY" AWS_DEFAULT_REGION="$VID__S3__REGION" \
                "$aws" --endpoint-url "$VID__S3__ENDPOINT" s3 rm --only-show-errors "s3://$VID__S3__BUCKET/$key" || true
        else
            echo "no awscli in .local/venv: s3://$VID__S3__BUCKET/$key is left in the bucket" >&2
        fi
    done
}
best_js=""; best_vid=""
for run in $(seq 1 "$RUNS"); do
    out="$(BENCH_API_URL="$API_URL" BENCH_API_KEY="$KEY" BENCH_FILE="$FILE" node tests/console/bench-browser-upload.mjs)"
    js_s="$(jq -r .seconds <<<"$out")"
    UPLOADS+=("$(jq -r .upload_id <<<"$out")")
    t0="$(now)"
    vid_out="$("$BIN/vidctl" --api-url "$API_URL" --api-key "$KEY" --json upload --parallel 4 --content-type video/mp4 "$FILE")"
    t1="$(now)"
    vid_s="$(python3 -c "print($t1 - $t0)")"
    UPLOADS+=("$(jq -r .upload_id <<<"$vid_out")")
    printf 'run %d: library in Chromium %.2f s (%s MiB/s, %s parts), vidctl %.2f s (%s MiB/s)\n' \
        "$run" "$js_s" "$(mibps "$js_s")" "$(jq -r .parts <<<"$out")" "$vid_s" "$(mibps "$vid_s")"
    if [ -z "$best_js" ] || python3 -c "import sys; sys.exit(0 if $js_s < $best_js else 1)"; then best_js="$js_s"; fi
    if [ -z "$best_vid" ] || python3 -c "import sys; sys.exit(0 if $vid_s < $best_vid else 1)"; then best_vid="$vid_s"; fi
done
echo "best of $RUNS, ${SIZE_MIB} MiB ($( [ "$BIN" = "$TARGET/release" ] && echo release || echo debug ) api):"
printf '  library in Chromium: %6.2f s  %8s MiB/s  (parts + complete)\n' "$best_js" "$(mibps "$best_js")"
printf '  vidctl upload      : %6.2f s  %8s MiB/s  (create + parts + complete)\n' "$best_vid" "$(mibps "$best_vid")"
python3 -c "print(f'  throughput ratio library/vidctl: {$best_vid / $best_js:.2f}')"
