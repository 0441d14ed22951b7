# Shared by the container tests (container-test.sh, kube-test.sh, compose-demo.sh):
# a private namespace on the shared `make up` stack, TCP proxies the test can cut,
# the walking-skeleton path (upload, 202, transcode, signed webhook verified by
# the reference receiver), and clean-up.
#
# Isolation from other tests running at the same time on the same stack:
# - its own PostgreSQL databases (vidtest_ctr_<id>, receivertest_ctr_<id>: the
#   names `make test` drops leftovers of), its own AMQP prefix (t<26 chars>, which
#   the queue-expiry policy of scripts/test.sh covers) and receiver queue;
# - its own ports (below); the shared bucket, under the test's own tenant.
# The services reach PostgreSQL and RabbitMQ through socat proxies on their own
# ports, so the test can take "the database" or "the broker" away from the
# containers without touching the shared servers.
# shellcheck shell=bash

: "${CT_API_PORT:=18080}" "${CT_TRANSCODER_PORT:=19101}" "${CT_DISPATCHER_PORT:=19102}"
: "${CT_RECEIVER_PORT:=19000}" "${CT_PG_PROXY_PORT:=15433}" "${CT_AMQP_PROXY_PORT:=15673}"
CT_ID="$(date +%s)$$"
CT_PREFIX="t$(printf '%s' "$CT_ID" | sha256sum | tr -dc 'a-z0-9' | head -c 26)"
CT_DB="vidtest_ctr_$CT_ID"
CT_RECEIVER_DB="receivertest_ctr_$CT_ID"
CT_RECEIVER_QUEUE="receivertest.ctr$CT_ID.events"
CT_LOGS="$ROOT/.local/container-test"
CT_API="http://127.0.0.1:$CT_API_PORT"
CT_FIXTURE="$ROOT/fixtures/media/carphone_pristine.mp4"
CT_PIDS=()
mkdir -p "$CT_LOGS"

ct_log() { printf '%s %s\n' "$(date +%T)" "$*"; }
ct_fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
ct_psql() { psql -h 127.0.0.1 -U postgres -v ON_ERROR_STOP=1 -qAt "$@"; }
# status URL: the HTTP status code (000 when nothing answers).
ct_status() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$1" 2>/dev/null || true; }
# wait_status URL WANT SECONDS: poll until URL answers WANT.
ct_wait_status() {
    local deadline=$((SECONDS + $3)) got
    while :; do
        got="$(ct_status "$1")"
        [ "$got" = "$2" ] && return 0
        (( SECONDS < deadline )) || { echo "wanted $2 from $1 within $3 s, last got $got" >&2; return 1; }
        sleep 0.5
    done
}

ct_databases() {
    ct_psql -d postgres -c "CREATE DATABASE \"$CT_DB\""
    ct_psql -d postgres -c "CREATE DATABASE \"$CT_RECEIVER_DB\""
}

# proxy NAME LISTEN_PORT TARGET_PORT: a socat in its own process group, so
# ct_cut can end the listener and every connection it forwards at once.
ct_proxy() {
    setsid socat "TCP-LISTEN:$2,bind=127.0.0.1,reuseaddr,fork" "TCP:127.0.0.1:$3" \
        >>"$CT_LOGS/proxy-$1.log" 2>&1 &
    echo $! >"$CT_LOGS/proxy-$1.pid"
    CT_PIDS+=($!)
    local n=0
    until timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$2" 2>/dev/null; do
        n=$((n + 1)); [ "$n" -lt 50 ] || ct_fail "proxy $1 on :$2 did not start"; sleep 0.1
    done
}
ct_cut() {
    local pid; pid="$(cat "$CT_LOGS/proxy-$1.pid")"
    kill -TERM -- "-$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
}

# The env every service container gets: the stack's S3, the proxied database
# and broker, this run's prefix, loopback webhooks allowed (the receiver is on
# loopback; production refuses private addresses), this run's ports.
ct_env_file() {
    cat >"$CT_LOGS/services.env" <<EOF
VID__DATABASE__URL=postgres://postgres@127.0.0.1:$CT_PG_PROXY_PORT/$CT_DB
VID__DATABASE__STARTUP_WAIT_SECONDS=90
VID__AMQP__URL=amqp://guest:guest@127.0.0.1:$CT_AMQP_PROXY_PORT/%2f
VID__AMQP__PREFIX=$CT_PREFIX
VID__S3__ENDPOINT=$VID__S3__ENDPOINT
VID__S3__PUBLIC_ENDPOINT=$VID__S3__ENDPOINT
VID__S3__REGION=$VID__S3__REGION
VID__S3__BUCKET=$VID__S3__BUCKET
VID__S3__ACCESS_KEY_ID=$VID__S3__ACCESS_KEY_ID
VID__S3__SECRET_ACCESS_KEY=$VID__S3__SECRET_ACCESS_KEY
VID__WEBHOOKS__SECRET_KEY=$(printf 'container-test-%s' "$CT_ID" | sha256sum | cut -c1-64)
VID__WEBHOOKS__REQUIRE_HTTPS=false
VID__WEBHOOKS__ALLOW_CIDRS=127.0.0.0/8
VID__SCANNER__ADDRESS=127.0.0.1:3310
VID__TRANSCODER__SHUTDOWN_GRACE_SECONDS=60
VID__API__LISTEN=127.0.0.1:$CT_API_PORT
VID__TRANSCODER__HEALTH_LISTEN=127.0.0.1:$CT_TRANSCODER_PORT
VID__DISPATCHER__HEALTH_LISTEN=127.0.0.1:$CT_DISPATCHER_PORT
EOF
    echo "$CT_LOGS/services.env"
}

# The reference receiver (examples/webhook-receiver, a host process: the test's
# side): verifies each delivery's signature with the endpoint's secret and
# records what it applied; GET /events lists it.
ct_receiver_start() {
    RECEIVER_SECRETS="$1" RECEIVER_DATABASE_URL="postgres://postgres@127.0.0.1:5432/$CT_RECEIVER_DB" \
    RECEIVER_QUEUE="$CT_RECEIVER_QUEUE" RUST_LOG=warn \
        "$ROOT/target/debug/webhook-receiver" --listen "127.0.0.1:$CT_RECEIVER_PORT" \
        >"$CT_LOGS/receiver.log" 2>&1 &
    CT_RECEIVER_PID=$!
    CT_PIDS+=("$CT_RECEIVER_PID")
    ct_wait_status "http://127.0.0.1:$CT_RECEIVER_PORT/healthz" 200 30 || ct_fail "receiver did not start (see $CT_LOGS/receiver.log)"
}

# api METHOD PATH [JSON]: a call with this run's API key; prints the body, then
# "HTTP <status>" on the last line.
ct_api() {
    curl -sS --max-time 60 -X "$1" -H "Authorization: Bearer $CT_KEY" -H 'Content-Type: application/json' \
        ${3:+--data "$3"} -w '\nHTTP %{http_code}\n' "$CT_API$2"
}
ct_body() { sed '$d'; }
ct_code() { tail -n1 | cut -d' ' -f2; }

# Registers the receiver as a webhook endpoint and starts it with the secret.
ct_endpoint_and_receiver() {
    local out
    out="$(ct_api POST /webhook-endpoints "{\"url\":\"http://127.0.0.1:$CT_RECEIVER_PORT/webhooks\",\"description\":\"container test\"}")"
    [ "$(ct_code <<<"$out")" = 201 ] || ct_fail "endpoint registration: $out"
    ct_receiver_start "$(ct_body <<<"$out" | jq -er .secret)"
}

# ct_upload [FILE]: uploads FILE (default: the carphone fixture) through its
# presigned part URLs; asserts 202 + Location on complete; prints the operation id.
ct_upload() {
    local file="${1:-$CT_FIXTURE}" size out upload code
    size="$(stat -c %s "$file")"
    out="$(ct_api POST /uploads "{\"size_bytes\":$size,\"content_type\":\"video/mp4\",\"filename\":\"carphone.mp4\"}")"
    [ "$(ct_code <<<"$out")" = 201 ] || ct_fail "POST /uploads: $out"
    upload="$(ct_body <<<"$out")"
    local part chunk="$CT_LOGS/part.bin"
    while read -r part; do
        tail -c "+$(( $(jq .offset <<<"$part") + 1 ))" "$file" | head -c "$(jq .length <<<"$part")" >"$chunk"
        curl -fsS --max-time 120 -o /dev/null --upload-file "$chunk" "$(jq -r .url <<<"$part")" ||
            ct_fail "PUT of part $(jq .part_number <<<"$part") to its presigned URL failed"
    done < <(jq -c '.parts[]' <<<"$upload")
    out="$(curl -sS --max-time 60 -X POST -H "Authorization: Bearer $CT_KEY" -H 'Content-Type: application/json' --data '{}' \
        -D "$CT_LOGS/complete.headers" -w '\nHTTP %{http_code}\n' "$CT_API/uploads/$(jq -r .id <<<"$upload")/complete")"
    code="$(ct_code <<<"$out")"
    [ "$code" = 202 ] || ct_fail "POST /uploads/{id}/complete answered $code, want 202: $out"
    grep -qi '^location: /operations/op_' "$CT_LOGS/complete.headers" || ct_fail "202 without Location: $(cat "$CT_LOGS/complete.headers")"
    ct_body <<<"$out" | jq -er .id
}

# op_status OP: the operation's status.
ct_op_status() { ct_api GET "/operations/$1" | ct_body | jq -r .status; }
ct_wait_op() {   # ct_wait_op OP STATUS SECONDS
    local deadline=$((SECONDS + $3)) got
    while got="$(ct_op_status "$1")"; [ "$got" != "$2" ]; do
        case "$got" in succeeded | failed | cancelled) [ "$got" = "$2" ] || ct_fail "operation $1 ended $got, want $2: $(ct_api GET "/operations/$1")" ;; esac
        (( SECONDS < deadline )) || ct_fail "operation $1 still $got after $3 s, want $2"
        sleep 0.5
    done
}
ct_video_of() { ct_api GET "/operations/$1" | ct_body | jq -er '.result.video_id // .metadata.video_id'; }

# ready_webhook VIDEO SECONDS: wait until the receiver verified and applied
# the video.ready event for VIDEO; then check the platform recorded exactly one.
ct_ready_webhook() {
    local deadline=$((SECONDS + $2)) n
    until curl -fsS --max-time 5 "http://127.0.0.1:$CT_RECEIVER_PORT/events" 2>/dev/null |
            jq -e --arg v "$1" '[.effects[]? | select(.video_id == $v and .event_type == "video.ready")] | length == 1' >/dev/null; do
        (( SECONDS < deadline )) || ct_fail "no verified video.ready webhook for $1 within $2 s (receiver log $CT_LOGS/receiver.log)"
        sleep 0.5
    done
    n="$(ct_psql -d "$CT_DB" -c "SELECT count(*) FROM events WHERE event_type = 'video.ready' AND resource_id = '$1'")"
    [ "$n" = 1 ] || ct_fail "$n video.ready events recorded for $1, want exactly 1"
}

# rabbitmqctl reads stdin: without </dev/null it swallows the rest of the list.
ct_cleanup_shared() {
    local pid
    for pid in "${CT_PIDS[@]}"; do
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    ct_psql -d postgres -c "DROP DATABASE IF EXISTS \"$CT_DB\" WITH (FORCE)" 2>/dev/null || true
    ct_psql -d postgres -c "DROP DATABASE IF EXISTS \"$CT_RECEIVER_DB\" WITH (FORCE)" 2>/dev/null || true
    timeout 60 rabbitmqctl -q list_queues name 2>/dev/null | grep -E "^($CT_PREFIX\.|$CT_RECEIVER_QUEUE)" |
        while read -r q; do timeout 20 rabbitmqctl -q delete_queue "$q" </dev/null >/dev/null 2>&1 || true; done || true
}
