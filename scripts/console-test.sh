#!/usr/bin/env bash
# The web console (issue 9) in a real browser: Debian's headless Chromium
# driven by playwright-core (tests/console/console.test.mjs) against the real
# api, transcoder, webhook-dispatcher and playback service (issue 19: the
# video page plays the stream with hls.js).
#
#   scripts/console-test.sh        (make test runs it once the stack is up)
#
# Installs what is missing: Debian's `chromium` (apt-get) when /usr/bin/chromium
# is absent, and `npm ci` in tests/console (playwright-core only; no browser is
# downloaded: the test uses /usr/bin/chromium). Builds the five binaries it
# runs if target/debug lacks them.
#
# First checks the vendored hls.js: `npm ci` of services/api/console/vendor's
# package.json and package-lock.json into a temporary directory (the registry
# tarball, checked against the lock's integrity hash), then the committed
# hls.min.mjs and LICENSE.hls.js must be byte-identical to the package's
# dist/hls.min.mjs and LICENSE.
#
# Starts the four services the way the e2e harness (tests/e2e `Stack`) does:
# a fresh database `vidtest_console_*` (scripts/test.sh drops those), a unique
# RabbitMQ prefix `t<26 chars>` (expired by test.sh's queue policy), free
# loopback ports, VID_PROFILE=test (loopback allow-listed for webhooks, short
# retry schedule); the playback service on its own free port, which the api's
# `api.playback_base_url` (VID__API__PLAYBACK_BASE_URL) names, so hls_url and
# dash_url and the console's CSP point at it; a tenant from `api
# create-tenant`. The test runs its own
# loopback webhook receiver. Everything it started is stopped on exit, and
# the database dropped.
#
# Output: .local/test-logs/console/ — screenshots (*.png), the services' logs.
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="$ROOT/.local/test-logs/console"
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
VIDEO="${CONSOLE_VIDEO:-$ROOT/fixtures/media/bigbuckbunny.mp4}"
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug"
die() { printf 'console-test: %s\n' "$*" >&2; exit 1; }
log() { printf 'console-test: %s\n' "$*"; }

[ -f .local/stack.env ] || die "no .local/stack.env: start the stack first (scripts/stack.sh infra-up, or make up)"
# shellcheck disable=SC1091
source .local/stack.env

# ---------------------------------------------------------------- tools --
mkdir -p "$OUT" "$ROOT/.local/logs"
rm -f "$OUT"/*.png "$OUT"/*.log
if [ ! -x "$CHROMIUM" ]; then
    log "installing Debian's chromium (apt-get)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
        >>"$ROOT/.local/logs/console-install.log" 2>&1 || die "apt-get install chromium failed (see .local/logs/console-install.log)"
fi
command -v node >/dev/null && command -v npm >/dev/null || {
    log "installing node and npm (apt-get)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; } \
        >>"$ROOT/.local/logs/console-install.log" 2>&1 || die "apt-get install nodejs npm failed"
}
LOCK="tests/console/package-lock.json"
STAMP="tests/console/node_modules/.vid-lock-sha"
if [ ! -d tests/console/node_modules/playwright-core ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$(sha256sum "$LOCK" | cut -d' ' -f1)" ]; then
    log "npm ci in tests/console"
    (cd tests/console && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error) \
        || die "npm ci failed in tests/console"
    sha256sum "$LOCK" | cut -d' ' -f1 >"$STAMP"
fi

# ------------------------------------------------------ vendored hls.js --
VENDOR="services/api/console/vendor"
CHECK="$(mktemp -d /tmp/vid-console-vendor-XXXXXX)"
trap 'rm -rf "$CHECK"' EXIT
cp "$VENDOR/package.json" "$VENDOR/package-lock.json" "$CHECK/"
(cd "$CHECK" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null) \
    || die "npm ci of $VENDOR/package-lock.json failed"
PKG="$CHECK/node_modules/hls.js"
HLS_VERSION="$(node -p 'require(process.argv[1]).version' "$PKG/package.json")"
LOCKED="$(node -p 'require(process.argv[1]).packages["node_modules/hls.js"].version' "$ROOT/$VENDOR/package-lock.json")"
[ "$HLS_VERSION" = "$LOCKED" ] || die "npm installed hls.js $HLS_VERSION, the lock pins $LOCKED"
cmp -s "$VENDOR/hls.min.mjs" "$PKG/dist/hls.min.mjs" \
    || die "$VENDOR/hls.min.mjs is not hls.js@$HLS_VERSION's dist/hls.min.mjs (copy it from the package: README, Console)"
cmp -s "$VENDOR/LICENSE.hls.js" "$PKG/LICENSE" \
    || die "$VENDOR/LICENSE.hls.js is not hls.js@$HLS_VERSION's LICENSE"
log "vendored hls.js $HLS_VERSION: hls.min.mjs ($(sha256sum "$VENDOR/hls.min.mjs" | cut -c1-16)…) and LICENSE.hls.js match the npm package"
rm -rf "$CHECK"
trap - EXIT

missing=()
for b in api transcoder webhook-dispatcher playback vidctl; do [ -x "$BIN/$b" ] || missing+=("$b"); done
if [ "${#missing[@]}" -gt 0 ]; then
    log "building ${missing[*]}"
    cargo build -q -p vid-api -p vid-transcoder -p vid-webhook-dispatcher -p vid-playback -p vid-client --bins
fi

# ---------------------------------------------------------------- stack --
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
SUFFIX="$(python3 -c 'import secrets,string; print("".join(secrets.choice(string.digits + string.ascii_lowercase) for _ in range(26)))')"
PREFIX="t$SUFFIX"
SERVER="${VID__DATABASE__URL%/*}"
DB="vidtest_console_${SUFFIX:0:12}"
WORK="$(mktemp -d /tmp/vid-console-XXXXXX)"
API_PORT="$(free_port)"
PLAYBACK_PORT="$(free_port)"
PIDS=()

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    for _ in $(seq 1 50); do
        local alive=0
        for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.2
    done
    for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    psql -q "$SERVER/postgres" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

export VID_PROFILE=test
export VID_CONFIG_DIR="$ROOT/config"
export VID__DATABASE__URL="$SERVER/$DB"
export VID__AMQP__PREFIX="$PREFIX"
export VID__API__LISTEN="127.0.0.1:$API_PORT"
export VID__TRANSCODER__HEALTH_LISTEN="127.0.0.1:$(free_port)"
export VID__TRANSCODER__WORK_DIR="$WORK/transcoder"
export VID__DISPATCHER__HEALTH_LISTEN="127.0.0.1:$(free_port)"
export VID__PLAYBACK__LISTEN="127.0.0.1:$PLAYBACK_PORT"
PLAYBACK_URL="http://127.0.0.1:$PLAYBACK_PORT"
export VID__API__PLAYBACK_BASE_URL="$PLAYBACK_URL"
# 5 MiB parts (the S3 minimum), so the browser-upload tests send several parts.
export VID__UPLOADS__TARGET_PART_SIZE_BYTES=5242880

psql -q "$SERVER/postgres" -c "CREATE DATABASE $DB" >/dev/null
"$BIN/api" migrate >>"$OUT/api.log" 2>&1 || die "api migrate failed (see $OUT/api.log)"
API_KEY="$("$BIN/api" create-tenant --name console-test 2>>"$OUT/api.log")"
[ -n "$API_KEY" ] || die "api create-tenant printed no key"

for name in api transcoder webhook-dispatcher playback; do
    setsid "$BIN/$name" >>"$OUT/$name.log" 2>&1 </dev/null &
    PIDS+=("$!")
done
API_URL="http://127.0.0.1:$API_PORT"
for _ in $(seq 1 150); do
    curl -fsS -o /dev/null --max-time 2 "$API_URL/healthz" 2>/dev/null && break
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null || die "a service exited at start (logs in $OUT)"; done
    sleep 0.2
done
curl -fsS -o /dev/null --max-time 2 "$API_URL/healthz" || die "api not healthy (see $OUT/api.log)"
for _ in $(seq 1 150); do
    curl -fsS -o /dev/null --max-time 2 "$PLAYBACK_URL/healthz" 2>/dev/null && break
    sleep 0.2
done
curl -fsS -o /dev/null --max-time 2 "$PLAYBACK_URL/healthz" || die "playback service not healthy (see $OUT/playback.log)"
for _ in $(seq 1 150); do
    curl -fsS -o /dev/null --max-time 2 "http://$VID__TRANSCODER__HEALTH_LISTEN/readyz" 2>/dev/null && break
    sleep 0.2
done
log "stack up: api $API_URL, playback $PLAYBACK_URL, database $DB, prefix $PREFIX"

# ----------------------------------------------------------------- test --
start=$SECONDS
CONSOLE_API_URL="$API_URL" CONSOLE_PLAYBACK_URL="$PLAYBACK_URL" CONSOLE_API_KEY="$API_KEY" CONSOLE_VIDCTL="$BIN/vidctl" CONSOLE_VIDEO="$VIDEO" \
CONSOLE_OUT="$OUT" CHROMIUM="$CHROMIUM" \
    node tests/console/console.test.mjs
log "passed in $((SECONDS - start)) s; screenshots in ${OUT#"$ROOT/"}/"

# ----------------------------------------- browser uploads (issue 21) --
# A real video of three 5 MiB parts (x264 of ffmpeg's testsrc2 with noise: it
# does not compress, so 2.4 s make ~13 MiB), then the library under node's
# test runner and the console's upload page in Chromium.
UPLOAD_VIDEO="$WORK/upload-clip.mp4"
ffmpeg -v error -y -f lavfi -i testsrc2=size=640x360:rate=25 -t 2.4 -vf noise=alls=30:allf=t \
    -c:v libx264 -preset ultrafast -qp 16 -pix_fmt yuv420p -movflags +faststart "$UPLOAD_VIDEO" \
    || die "ffmpeg could not make the upload clip"
(cd clients/js && npm ci --no-audit --no-fund --loglevel=error >/dev/null && npx --no-install tsc -p tsconfig.json) \
    || die "clients/js: npm ci or the type check failed"
start=$SECONDS
CLIENTJS_API_URL="$API_URL" CLIENTJS_API_KEY="$API_KEY" CLIENTJS_VIDEO="$UPLOAD_VIDEO" node --test clients/js/test/
CONSOLE_API_URL="$API_URL" CONSOLE_API_KEY="$API_KEY" CONSOLE_UPLOAD_VIDEO="$UPLOAD_VIDEO" CONSOLE_OUT="$OUT" CHROMIUM="$CHROMIUM" \
    node tests/console/upload.test.mjs
log "browser uploads passed in $((SECONDS - start)) s"
