#!/usr/bin/env bash
# Issue 21 item 4 performance: ingest the same file from a loopback URL
# (python3 -m http.server) with `POST /ingests` and download it with `curl -o`,
# and report each throughput and the ratio ingest / curl, from the same run.
# Ingest time: from POST /ingests to the source being in storage
# (operations.awaiting_source turns false: the ingest worker's
# CompleteMultipartUpload returned and the api applied its report).
# Figures only, no assertions. Needs the local stack with the services
# (`make up`: VID_PROFILE=development allows loopback sources).
# Usage: scripts/bench-ingest.sh [size_mib=200] [runs=1]
# (VIDCTL_API_URL, VIDCTL_API_KEY and BENCH_DATABASE_URL point it at another stack.)
#
# The file is random bytes: each ingest's operation is cancelled once its
# source is stored, and the objects are deleted at the end.
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SIZE_MIB="${1:-200}"
RUNS="${2:-1}"

# shellcheck disable=SC1091
source .local/stack.env
API_URL="${VIDCTL_API_URL:-http://127.0.0.1:8080}"
KEY="${VIDCTL_API_KEY:-$(cat .local/api-key)}"
# The api's database (to see when the source is stored); another stack: BENCH_DATABASE_URL.
DB="${BENCH_DATABASE_URL:-$VID__DATABASE__URL}"

WORK="$(mktemp -d /tmp/bench-ingest.XXXXXX)"
SERVER_PID=""
OPS=()
cleanup() {
    set +e
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
    for op in "${OPS[@]}"; do
        curl -s -o /dev/null -X POST -H "Authorization: Bearer $KEY" "$API_URL/operations/$op:cancel"
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

echo "generating a ${SIZE_MIB} MiB file in $WORK"
mkdir -p "$WORK/www"
head -c "$((SIZE_MIB * 1024 * 1024))" /dev/urandom >"$WORK/www/source.mp4"
BYTES="$(stat -c %s "$WORK/www/source.mp4")"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
python3 -m http.server "$PORT" --bind 127.0.0.1 --directory "$WORK/www" >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
URL="http://127.0.0.1:$PORT/source.mp4"
for _ in $(seq 50); do curl -fsS -o /dev/null -r 0-0 "$URL" 2>/dev/null && break; sleep 0.1; done

now() { date +%s.%N; }
mibps() { python3 -c "import sys; print(f'{$BYTES / 1048576 / float(sys.argv[1]):.1f}')" "$1"; }

best_ingest=""
best_curl=""
for run in $(seq 1 "$RUNS"); do
    t0="$(now)"
    curl -fsS -o "$WORK/curl.out" "$URL"
    t1="$(now)"
    curl_s="$(python3 -c "print($t1 - $t0)")"
    rm -f "$WORK/curl.out"

    t0="$(now)"
    op="$(curl -fsS -X POST -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
        -d "{\"source_url\":\"$URL\",\"content_type\":\"video/mp4\"}" "$API_URL/ingests" | jq -r .id)"
    OPS+=("$op")
    while :; do
        state="$(psql "$DB" -Atc "SELECT status || ' ' || awaiting_source FROM operations WHERE id = '$op'")"
        case "$state" in
            *" false") break ;;
            failed*|cancelled*) echo "ingest $op ended: $state" >&2; exit 1 ;;
        esac
        sleep 0.02
    done
    t1="$(now)"
    ingest_s="$(python3 -c "print($t1 - $t0)")"
    size="$(psql "$DB" -Atc "SELECT u.size_bytes FROM uploads u JOIN videos v ON v.upload_id = u.id JOIN operations o ON o.video_id = v.id WHERE o.id = '$op'")"
    [ "$size" = "$BYTES" ] || { echo "ingest stored $size bytes, want $BYTES" >&2; exit 1; }
    curl -fsS -o /dev/null -X POST -H "Authorization: Bearer $KEY" "$API_URL/operations/$op:cancel" || true

    printf 'run %d: ingest %.2f s (%s MiB/s), curl %.2f s (%s MiB/s)\n' "$run" "$ingest_s" "$(mibps "$ingest_s")" "$curl_s" "$(mibps "$curl_s")"
    if [ -z "$best_ingest" ] || python3 -c "import sys; sys.exit(0 if $ingest_s < $best_ingest else 1)"; then best_ingest="$ingest_s"; fi
    if [ -z "$best_curl" ] || python3 -c "import sys; sys.exit(0 if $curl_s < $best_curl else 1)"; then best_curl="$curl_s"; fi
done

echo "ingest of ${SIZE_MIB} MiB from a loopback http.server (best of $RUNS):"
printf '  POST /ingests : %6.2f s  %8s MiB/s  (api -> outbox -> ingest worker -> S3 multipart -> report)\n' "$best_ingest" "$(mibps "$best_ingest")"
printf '  curl -o file  : %6.2f s  %8s MiB/s  (%s)\n' "$best_curl" "$(mibps "$best_curl")" "$(curl --version | head -1 | cut -d' ' -f1-2)"
python3 -c "print(f'  throughput ratio ingest/curl: {$best_curl / $best_ingest:.2f}')"
