#!/usr/bin/env bash
# `make demo` (after `make up`): one real video through the whole system.
#   1. start the reference webhook receiver on 127.0.0.1:9000 and register it as an endpoint;
#   2. upload a real video with vidctl, in parallel parts straight to storage;
#   3. wait for the transcode; then wait until the receiver has verified and
#      applied the `video.ready` webhook for THIS video; print it and where the
#      renditions are;
#   4. print the video's stable playback URLs (`hls_url`, `dash_url` of its
#      public playback ID, from GET /videos/{id}) and check that the playback
#      service answers the master playlist with 200 and no API key.
# Usage: scripts/demo.sh [VIDEO]     (default: Big Buck Bunny, looped 8× and re-encoded
#                                     at ~4.4 Mbit/s: ~23 MB in 42 s, so 2 parts of the
#                                     api's 16 MiB part size)
#        scripts/demo.sh check [VIDEO]     only the checks `make demo` runs before building:
#                                          the file exists and port 9000 is free
#        scripts/demo.sh status-receiver   one line: is the demo receiver running
#        scripts/demo.sh stop-receiver
# Knobs: DEMO_WEBHOOK_TIMEOUT (seconds to wait for the video.ready webhook, default 60).
set -Eeuo pipefail
trap 'rc=$?; echo "demo: failed (exit $rc) at scripts/demo.sh line $LINENO: $BASH_COMMAND" >&2' ERR
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL=.local
RECEIVER_PID=$LOCAL/pids/webhook-receiver.pid
RECEIVER_LOG=$LOCAL/logs/webhook-receiver.log
RECEIVER_PORT=9000
WEBHOOK_TIMEOUT="${DEMO_WEBHOOK_TIMEOUT:-60}"
VIDCTL=target/debug/vidctl
DEFAULT_VIDEO=$LOCAL/demo/bigbuckbunny-x8-4mbit.mp4
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
die() { echo "demo: $*" >&2; exit 1; }
log_tail() {   # the receiver's error (its one-line chain, or a panic), then the log's tail
    local err
    err="$(grep -m1 -A4 -E '^webhook-receiver: |^Error:|panicked at' "$RECEIVER_LOG" 2>/dev/null || true)"
    if [ -n "$err" ]; then
        echo "---- the error in $RECEIVER_LOG ----" >&2
        echo "$err" >&2
    fi
    echo "---- last 20 lines of $RECEIVER_LOG ----" >&2
    tail -n 20 "$RECEIVER_LOG" >&2 2>/dev/null || true
    echo "----" >&2
}

# The VIDEO argument is relative to the caller's directory: resolve it before cd.
VIDEO_ARG="${2:-}"
case "${1:-}" in check | status-receiver | stop-receiver) ;; *) VIDEO_ARG="${1:-}" ;; esac
if [ -n "$VIDEO_ARG" ] && [[ "$VIDEO_ARG" != /* ]]; then VIDEO_ARG="$PWD/$VIDEO_ARG"; fi
cd "$ROOT"

# receiver_pid: the pid of the receiver this script started, if it is still
# alive and still a webhook-receiver (guards against recycled pids).
receiver_pid() {
    local pid
    [ -f "$RECEIVER_PID" ] && pid="$(<"$RECEIVER_PID")" && [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -Eq '(^|/)webhook-receiver$' || return 1
    echo "$pid"
}
port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }
# listener_pids PORT: pids listening on 127.0.0.1:PORT (needs ss; empty if unknown).
listener_pids() {
    command -v ss >/dev/null || return 0
    ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u || true
}
describe_listener() {
    command -v ss >/dev/null && ss -Hltnp "sport = :$1" 2>/dev/null | sed 's/^/    /' >&2 || true
}
# check_port: fail unless 127.0.0.1:9000 is free (or held by our own receiver).
check_port() {
    receiver_pid >/dev/null && return 0
    if port_open "$RECEIVER_PORT"; then
        echo "demo: 127.0.0.1:$RECEIVER_PORT is already in use by another process:" >&2
        describe_listener "$RECEIVER_PORT"
        die "the demo's webhook receiver needs port $RECEIVER_PORT; stop that process and run 'make demo' again"
    fi
}
check_video() {   # check_video PATH ('' = the default video)
    [ -n "$1" ] || return 0
    [ -e "$1" ] || die "no such file: $1"
    [ -f "$1" ] || die "not a regular file: $1"
    [ -r "$1" ] || die "cannot read: $1"
    [ -s "$1" ] || die "empty file: $1"
}

stop_receiver() {
    local pid
    if pid="$(receiver_pid)"; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
        echo "webhook-receiver    stopped (pid $pid)"
    fi
    rm -f "$RECEIVER_PID"
}
case "${1:-}" in
    stop-receiver) stop_receiver; exit 0 ;;
    status-receiver)
        if pid="$(receiver_pid)"; then
            printf '%-19s %s\n' webhook-receiver "running (pid $pid, http://127.0.0.1:$RECEIVER_PORT, started by make demo; log $RECEIVER_LOG)"
        else
            printf '%-19s %s\n' webhook-receiver "not running (the demo receiver; make demo starts it)"
        fi
        exit 0 ;;
    check) check_video "$VIDEO_ARG"; check_port; exit 0 ;;
esac

check_video "$VIDEO_ARG"
check_port
[ -s $LOCAL/api-key ] || die "no .local/api-key: run 'make up' first"
[ -x $VIDCTL ] && [ -x target/debug/webhook-receiver ] || die "$VIDCTL or target/debug/webhook-receiver missing: run 'make up' first"
command -v python3 >/dev/null || die "needs python3 to read the receiver's state and print the renditions"
VIDCTL_API_KEY="$(cat $LOCAL/api-key)"
export VIDCTL_API_KEY
json_field() { sed -n "s/^ *\"$1\": *\"\([^\"]*\)\".*/\1/p" | head -1; }

# effects_for VIDEO_ID [EVENT_TYPE]: reads the receiver's GET /events on stdin
# and prints (one JSON object a line) the effects applied for that video, only
# those of EVENT_TYPE when given; nothing if none.
effects_for() {
    if command -v jq >/dev/null; then
        jq -c --arg v "$1" --arg t "${2:-}" '.effects[]? | select(.video_id == $v and ($t == "" or .event_type == $t))'
    else
        python3 -c '
import json, sys
for e in json.load(sys.stdin).get("effects", []):
    if e.get("video_id") == sys.argv[1] and sys.argv[2] in ("", e.get("event_type")):
        print(json.dumps(e))' "$1" "${2:-}"
    fi
}

# renditions_table JSON: from `vidctl --json videos get`, prints the source,
# the renditions and the poster as a small labelled table, then each download
# URL under its name. Fails when the video has no renditions.
renditions_table() {
    python3 - "$1" <<'PY'
import json, sys
v = json.loads(sys.argv[1])

def size(n):
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"

rows = [("FILE", "SIZE", "FORMAT", "BITRATE", "BYTES", "STORAGE KEY")]
s = v.get("source")
if s:
    fmt = f'{s["video_codec"]}/{s.get("audio_codec") or "no audio"} in {s["container"]}'
    if s.get("duration_seconds"):
        fmt += f', {s["duration_seconds"]:.1f} s'
    rows.append(("source", f'{s["width"]}x{s["height"]}', fmt, "", size(s["size_bytes"]), "(the upload)"))
for r in v.get("renditions", []):
    rows.append((r["name"], f'{r["width"]}x{r["height"]}', r.get("content_type", ""), f'{r["bitrate"] // 1000} kb/s',
                 size(r["size_bytes"]), r["storage_key"]))
p = v.get("poster")
if p:
    rows.append(("poster", f'{p["width"]}x{p["height"]}', "image", "", "", p["storage_key"]))
widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
for row in rows:
    print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
urls = [(r["name"], r.get("url")) for r in v.get("renditions", [])] + ([("poster", p.get("url"))] if p else [])
urls = [(n, u) for n, u in urls if u]
if urls:
    print("\ndownload URLs (presigned, valid for a limited time):")
    w = max(len(n) for n, _ in urls)
    for n, u in urls:
        print(f"  {n.ljust(w)}  {u}")
sys.exit(0 if v.get("renditions") else 1)
PY
}

VIDEO="$VIDEO_ARG"
if [ -z "$VIDEO" ]; then
    mkdir -p $LOCAL/demo
    VIDEO=$DEFAULT_VIDEO
    if [ ! -s "$VIDEO" ]; then
        # 8 loops of the 5.3 s fixture, re-encoded at ~4 Mbit/s: ~23 MB, so more than
        # one 16 MiB part, while the transcode stays as short as 42 s of video allows.
        echo "demo: making $VIDEO (Big Buck Bunny looped 8×, ~4 Mbit/s, ~23 MB; once)"
        ffmpeg -hide_banner -loglevel error -y -stream_loop 7 -i fixtures/media/bigbuckbunny.mp4 \
            -c:v libx264 -preset ultrafast -b:v 4000k -maxrate 4000k -bufsize 8000k -pix_fmt yuv420p \
            -c:a copy -movflags +faststart "$VIDEO.tmp.mp4" || die "ffmpeg could not make $VIDEO"
        mv "$VIDEO.tmp.mp4" "$VIDEO"
    fi
fi

step "1. reference webhook receiver on 127.0.0.1:$RECEIVER_PORT"
stop_receiver
check_port
if [ -s $LOCAL/demo-endpoint ]; then
    $VIDCTL endpoints delete "$(cat $LOCAL/demo-endpoint)" >/dev/null 2>&1 || true
fi
created=$($VIDCTL --json endpoints create "http://127.0.0.1:$RECEIVER_PORT/webhooks" --description "make demo receiver") ||
    die "could not register the endpoint (is the api up? 'make status'): $created"
endpoint_id=$(echo "$created" | json_field id)
secret=$(echo "$created" | json_field secret)
[ -n "$endpoint_id" ] && [ -n "$secret" ] || die "endpoint registration failed: $created"
echo "$endpoint_id" > $LOCAL/demo-endpoint
echo "registered endpoint $endpoint_id (secret whsec_… shown once, handed to the receiver)"
mkdir -p $LOCAL/pids $LOCAL/logs
RECEIVER_SECRETS="$secret" nohup target/debug/webhook-receiver --listen "127.0.0.1:$RECEIVER_PORT" >"$RECEIVER_LOG" 2>&1 &
rpid=$!
echo "$rpid" > "$RECEIVER_PID"
healthy=
for _ in $(seq 100); do
    kill -0 "$rpid" 2>/dev/null || { log_tail; die "the webhook receiver (pid $rpid) exited during start-up (log above: $RECEIVER_LOG)"; }
    if curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$RECEIVER_PORT/healthz" 2>/dev/null; then healthy=1; break; fi
    sleep 0.2
done
[ -n "$healthy" ] || { log_tail; die "the webhook receiver did not answer http://127.0.0.1:$RECEIVER_PORT/healthz within 20 s"; }
# The answer must come from our process, not from something that took the port meanwhile.
sleep 0.3
kill -0 "$rpid" 2>/dev/null || { log_tail; die "the webhook receiver (pid $rpid) exited right after start-up (log above: $RECEIVER_LOG)"; }
listeners="$(listener_pids "$RECEIVER_PORT")"
if [ -n "$listeners" ] && ! grep -qx "$rpid" <<<"$listeners"; then
    describe_listener "$RECEIVER_PORT"; log_tail
    die "port $RECEIVER_PORT is answered by pid(s) $(echo "$listeners" | tr '\n' ' ')not by our receiver (pid $rpid)"
fi
echo "receiver running (pid $rpid, log $RECEIVER_LOG)"

step "2. upload $VIDEO ($(stat -c %s "$VIDEO") bytes) in parallel parts, then wait for the transcode"
op_json=$($VIDCTL --json upload "$VIDEO" --parallel 4 --wait) || { echo "$op_json"; die "upload or transcode failed (vidctl output above; logs in .local/logs/)"; }
echo "$op_json"
status=$(echo "$op_json" | json_field status)
video_id=$(echo "$op_json" | json_field video_id)
[ -n "$video_id" ] || die "no video_id in vidctl's output (above)"
[ "$status" = "succeeded" ] || die "operation for $video_id ended '$status', not 'succeeded'"
if command -v jq >/dev/null; then
    echo "sent in $(echo "$op_json" | jq '.parts_sent | length') part(s), up to 4 at once"
fi

step "3. the video.ready webhook for $video_id the receiver verified and applied"
deadline=$((SECONDS + WEBHOOK_TIMEOUT))
ready=
state=
while :; do
    receiver_pid >/dev/null || { log_tail; die "the webhook receiver (pid $rpid) died while waiting for the video.ready webhook for $video_id"; }
    if state=$(curl -fsS --max-time 5 "http://127.0.0.1:$RECEIVER_PORT/events" 2>/dev/null); then
        ready=$(effects_for "$video_id" video.ready <<<"$state" || true)
        [ -n "$ready" ] && break
    fi
    if (( SECONDS >= deadline )); then
        echo "demo: effects the receiver applied for $video_id so far:" >&2
        effects_for "$video_id" <<<"$state" >&2 || true
        die "no video.ready webhook for $video_id applied within $WEBHOOK_TIMEOUT s; see $RECEIVER_LOG and .local/logs/webhook-dispatcher.log ('$VIDCTL endpoints list' shows the endpoint)"
    fi
    sleep 0.5
done
echo "receiver effects for $video_id (each event applied once, newer versions only):"
effects_for "$video_id" <<<"$state"
ready_event=$(echo "$ready" | grep -o '"event_id": *"evt_[0-9a-z]*"' | grep -o 'evt_[0-9a-z]*' | head -1 || true)
[ -n "$ready_event" ] || die "the video.ready effect for $video_id has no event_id: $ready"
echo "the video.ready event $ready_event as the API recorded and signed it:"
$VIDCTL --json events get "$ready_event" || die "vidctl events get $ready_event failed"

step "4. renditions (storage keys and time-limited download URLs)"
video_json=$($VIDCTL --json videos get "$video_id") || die "vidctl videos get $video_id failed"
renditions_table "$video_json" || die "video $video_id shows no renditions: $video_json"

step "4. stable playback URLs (no API key needed)"
# playback_urls JSON: "<hls_url> <dash_url>" of the first public playback ID.
playback_urls() {
    python3 -c '
import json, sys
v = json.loads(sys.argv[1])
ids = [p for p in v.get("playback_ids") or [] if p.get("policy") == "public"]
if ids:
    print(ids[0]["hls_url"], ids[0]["dash_url"])' "$1"
}
read -r hls_url dash_url <<<"$(playback_urls "$video_json")" || true
[ -n "${hls_url:-}" ] || die "video $video_id lists no public playback ID with an hls_url: $video_json"
echo "hls_url   $hls_url"
echo "dash_url  $dash_url"
master=$(curl -sS --max-time 10 -w '\n%{http_code}' "$hls_url") || die "GET $hls_url failed (is the playback service up? make status; log .local/logs/playback.log)"
code=${master##*$'\n'}
[ "$code" = 200 ] || die "GET $hls_url (no API key) answered $code, not 200: ${master%$'\n'*}"
case "$master" in '#EXTM3U'*) ;; *) die "GET $hls_url did not answer an HLS playlist: ${master%$'\n'*}" ;; esac
variants=$(grep -c '^#EXT-X-STREAM-INF' <<<"$master" || true)
echo "GET $hls_url without a key: 200, a master playlist with $variants rung(s)"
dash_code=$(curl -sS --max-time 10 -o /dev/null -w '%{http_code}' "$dash_url") || die "GET $dash_url failed"
[ "$dash_code" = 200 ] || die "GET $dash_url (no API key) answered $dash_code, not 200"
echo "GET $dash_url without a key: 200"
echo
echo "demo OK: video $video_id is ready, plays at $hls_url, and its video.ready webhook ($ready_event) was applied; receiver log: $RECEIVER_LOG; stop everything with 'make down'"
