#!/usr/bin/env bash
# `make demo` (after `make up`): one real video through the whole system.
#   1. start the reference webhook receiver on 127.0.0.1:9000 and register it as an endpoint;
#   2. upload a real video with vidctl, in parallel parts straight to storage;
#   3. wait for the transcode; print the operation, the verified webhook the
#      receiver applied, and where the renditions are.
# Usage: scripts/demo.sh [VIDEO]     (default: Big Buck Bunny, looped to ~10 MB so it needs 2 parts)
#        scripts/demo.sh stop-receiver
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
LOCAL=.local
RECEIVER_PID=$LOCAL/pids/webhook-receiver.pid
RECEIVER_LOG=$LOCAL/logs/webhook-receiver.log
RECEIVER_PORT=9000
VIDCTL=target/debug/vidctl
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
die() { echo "demo: $*" >&2; exit 1; }

stop_receiver() {
    if [ -f "$RECEIVER_PID" ] && kill -0 "$(cat "$RECEIVER_PID")" 2>/dev/null; then
        kill "$(cat "$RECEIVER_PID")" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$(cat "$RECEIVER_PID")" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$RECEIVER_PID"
}
if [ "${1:-}" = "stop-receiver" ]; then stop_receiver; exit 0; fi

[ -s $LOCAL/api-key ] || die "no .local/api-key: run 'make up' first"
export VIDCTL_API_KEY="$(cat $LOCAL/api-key)"
json_field() { sed -n "s/^ *\"$1\": *\"\([^\"]*\)\".*/\1/p" | head -1; }

VIDEO="${1:-}"
if [ -z "$VIDEO" ]; then
    mkdir -p $LOCAL/demo
    VIDEO=$LOCAL/demo/bigbuckbunny-x8.mp4
    if [ ! -s "$VIDEO" ]; then
        ffmpeg -hide_banner -loglevel error -y -stream_loop 7 -i fixtures/media/bigbuckbunny.mp4 -c copy -movflags +faststart "$VIDEO"
    fi
fi
[ -f "$VIDEO" ] || die "no such file: $VIDEO"

step "1. reference webhook receiver on 127.0.0.1:$RECEIVER_PORT"
stop_receiver
if [ -s $LOCAL/demo-endpoint ]; then
    $VIDCTL endpoints delete "$(cat $LOCAL/demo-endpoint)" >/dev/null 2>&1 || true
fi
created=$($VIDCTL --json endpoints create "http://127.0.0.1:$RECEIVER_PORT/webhooks" --description "make demo receiver")
endpoint_id=$(echo "$created" | json_field id)
secret=$(echo "$created" | json_field secret)
[ -n "$endpoint_id" ] && [ -n "$secret" ] || die "endpoint registration failed: $created"
echo "$endpoint_id" > $LOCAL/demo-endpoint
echo "registered endpoint $endpoint_id (secret whsec_… shown once, handed to the receiver)"
mkdir -p $LOCAL/pids $LOCAL/logs
RECEIVER_SECRETS="$secret" nohup target/debug/webhook-receiver --listen "127.0.0.1:$RECEIVER_PORT" >"$RECEIVER_LOG" 2>&1 &
echo $! > "$RECEIVER_PID"
for _ in $(seq 100); do curl -fsS -o /dev/null "http://127.0.0.1:$RECEIVER_PORT/healthz" 2>/dev/null && break; sleep 0.2; done
curl -fsS -o /dev/null "http://127.0.0.1:$RECEIVER_PORT/healthz" || { tail -20 "$RECEIVER_LOG"; die "receiver did not start"; }

step "2. upload $VIDEO ($(stat -c %s "$VIDEO") bytes) in parallel parts, then wait for the transcode"
op_json=$($VIDCTL --json upload "$VIDEO" --parallel 4 --wait) || { echo "$op_json"; die "upload or transcode failed"; }
echo "$op_json"
status=$(echo "$op_json" | json_field status)
video_id=$(echo "$op_json" | json_field video_id)
[ "$status" = "succeeded" ] || die "operation ended $status"

step "3. the webhook the receiver verified and applied"
for _ in $(seq 150); do
    state=$(curl -fsS "http://127.0.0.1:$RECEIVER_PORT/events")
    if echo "$state" | grep -q "\"$video_id\"" && echo "$state" | grep -q '"ready"'; then break; fi
    sleep 0.2
done
echo "$state" | grep -q '"ready"' || { echo "$state"; die "no video.ready webhook applied within 30 s"; }
echo "receiver effects for $video_id (each event applied once, newer versions only):"
echo "$state" | grep -o "{[^{}]*\"$video_id\"[^{}]*}" | grep '"applied_at"' || true
ready_event=$(echo "$state" | grep -o "{[^{}]*\"$video_id\"[^{}]*}" | grep '"video.ready"' | grep -o 'evt_[0-9a-z]*' | head -1)
if [ -n "$ready_event" ]; then
    echo "the video.ready event as the API recorded and signed it:"
    $VIDCTL --json events get "$ready_event"
fi

step "4. renditions (storage keys and time-limited download URLs)"
$VIDCTL --json videos get "$video_id" | grep -E '"(name|width|height|storage_key|url)"'
echo
echo "demo OK: video $video_id is ready; receiver log: $RECEIVER_LOG; stop everything with 'make down'"
