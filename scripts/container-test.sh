#!/usr/bin/env bash
# The service images, run as Kubernetes runs them (non-root uid 10001, read-only
# root filesystem, no capabilities, no-new-privileges, /tmp the transcoder's only
# writable path), against the shared `make up` stack (PostgreSQL, RabbitMQ,
# Garage, clamd), isolated by scripts/deploy-lib.sh. Part of `make test`.
#
#   1. start-up: `api migrate` (the k8s Job) started before its database is
#      reachable waits and says so, then migrates once it is;
#   2. the walking skeleton through the containers: upload, 202, transcode,
#      signed webhook verified by the reference receiver;
#   3. SIGTERM to each container (podman stop): exit 0 inside the grace period,
#      nothing lost: a transcode in progress finishes and is reported once, an
#      open :wait on the api gets a complete answer, events raised while the
#      dispatcher was stopped are delivered after it restarts, once each;
#   4. the database and the broker taken away (their proxies cut): /healthz
#      stays 200, /readyz fails where the dependency is part of readiness, and
#      everything is ready again once they return.
# Needs: the images (scripts/images.sh), target/debug/webhook-receiver (make build).
set -Eeuo pipefail
shopt -s inherit_errexit
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/podman-env.sh
source scripts/podman-env.sh
# shellcheck disable=SC1091
source .local/stack.env
# shellcheck source=scripts/deploy-lib.sh
source scripts/deploy-lib.sh
TAG="${VID_IMAGE_TAG:-local}"
START=$SECONDS

cleanup() {
    local n
    for n in $(podman ps -a --filter "name=^vidct-$CT_ID-" --format '{{.Names}}'); do
        podman logs "$n" >"$CT_LOGS/$n.log" 2>&1 || true
        podman rm -f -t 0 "$n" >/dev/null 2>&1 || true
    done
    ct_cleanup_shared
}
trap cleanup EXIT

# run NAME IMAGE [podman flags...] -- [args...]: a detached container with the
# k8s securityContext of k8s/base (runAsUser 10001, readOnlyRootFilesystem,
# capabilities drop ALL, allowPrivilegeEscalation false), on the host network.
# --no-healthcheck: the Dockerfile's HEALTHCHECK probes the default ports
# (8080/9101/9102), which this test moves off the `make up` services' ports (on
# the shared loopback it would probe those), and podman schedules healthchecks
# only under systemd; the k8s probes are what kube-test.sh drives.
run() {
    local name="vidct-$CT_ID-$1" image="localhost/vid/$2:$TAG"; shift 2
    local flags=()
    while [ "$#" -gt 0 ] && [ "$1" != -- ]; do flags+=("$1"); shift; done
    [ "$#" -gt 0 ] && shift
    podman run -d --pull=never --name "$name" --network host "${PODMAN_ULIMITS[@]}" \
        --no-healthcheck --user 10001:10001 --read-only --read-only-tmpfs=false --cap-drop ALL \
        --security-opt no-new-privileges --env-file "$ENV_FILE" "${flags[@]}" "$image" "$@" \
        >/dev/null 2>>"$CT_LOGS/podman.log" || ct_fail "podman run $name: $(tail -3 "$CT_LOGS/podman.log")"
    echo "$name"
}
exit_code() { podman inspect -f '{{.State.ExitCode}}' "$1"; }
wait_exit() {   # wait_exit NAME SECONDS: the container's exit code once it stopped
    local deadline=$((SECONDS + $2))
    while [ "$(podman inspect -f '{{.State.Running}}' "$1")" = true ]; do
        (( SECONDS < deadline )) || ct_fail "$1 still running after $2 s"
        sleep 0.5
    done
    exit_code "$1"
}
# sigterm NAME GRACE: podman stop sends SIGTERM, then SIGKILL after GRACE s
# (as the kubelet does after terminationGracePeriodSeconds). Exit 0 = it
# shut down by itself.
sigterm() {
    local t0=$SECONDS code
    podman stop -t "$2" "$1" >/dev/null 2>>"$CT_LOGS/podman.log"
    code="$(exit_code "$1")"
    [ "$code" = 0 ] || ct_fail "$1 exited $code after SIGTERM (137 = killed at the end of the $2 s grace period)"
    ct_log "SIGTERM $1: exit 0 after $((SECONDS - t0)) s"
}
# grep reads to the end: `grep -q` exits at the first match, and under pipefail the
# SIGPIPE it leaves podman logs with would fail a match that is there.
logs_have() { podman logs "$1" 2>&1 | grep "$2" >/dev/null; }

check_hardening() {   # the running container is non-root and cannot write its root
    local name="$1" uid
    uid="$(podman exec "$name" id -u)"
    [ "$uid" = 10001 ] || ct_fail "$name runs as uid $uid"
    if podman exec "$name" bash -c 'echo x > /usr/local/bin/probe' 2>/dev/null; then
        ct_fail "$name could write to its root filesystem"
    fi
    [ "$(podman inspect -f '{{.HostConfig.ReadonlyRootfs}}' "$name")" = true ] || ct_fail "$name: root not read-only"
    [ "$(podman exec "$name" awk '/^CapEff/ {print $2}' /proc/self/status)" = 0000000000000000 ] ||
        ct_fail "$name has effective capabilities"
}

step_startup() {
    ct_log "1. start-up: api migrate before the database is reachable"
    ct_databases
    ct_proxy amqp "$CT_AMQP_PROXY_PORT" 5672
    local m; m="$(run migrate api -- migrate)"
    local deadline=$((SECONDS + 30))
    until logs_have "$m" "waiting for PostgreSQL"; do
        (( SECONDS < deadline )) || ct_fail "migrate did not say it waits for PostgreSQL: $(podman logs "$m" 2>&1 | tail -5)"
        [ "$(podman inspect -f '{{.State.Running}}' "$m")" = true ] || ct_fail "migrate exited instead of waiting: $(podman logs "$m" 2>&1 | tail -5)"
        sleep 0.5
    done
    ct_proxy pg "$CT_PG_PROXY_PORT" 5432
    [ "$(wait_exit "$m" 120)" = 0 ] || ct_fail "migrate failed: $(podman logs "$m" 2>&1 | tail -5)"
    logs_have "$m" "applied [0-9]* migration" || ct_fail "migrate printed no result"
    ct_log "migrate waited for PostgreSQL, then: $(podman logs "$m" 2>&1 | grep -o 'applied [0-9]* migration(s)')"
    local t; t="$(run tenant api -- create-tenant --name container-test)"
    [ "$(wait_exit "$t" 60)" = 0 ] || ct_fail "create-tenant failed: $(podman logs "$t" 2>&1 | tail -5)"
    CT_KEY="$(podman logs "$t" 2>/dev/null | tail -n1)"
    [ -n "$CT_KEY" ] || ct_fail "create-tenant printed no key"
}

start_services() {
    API="$(run api api -- serve)"
    TRANSCODER="$(run transcoder transcoder --tmpfs /tmp:rw,mode=1777,size=2g -- run)"
    DISPATCHER="$(run dispatcher webhook-dispatcher --)"
    ct_wait_status "$CT_API/readyz" 200 120 || ct_fail "api not ready: $(podman logs "$API" 2>&1 | tail -5)"
    ct_wait_status "http://127.0.0.1:$CT_TRANSCODER_PORT/readyz" 200 60 || ct_fail "transcoder not ready"
    ct_wait_status "http://127.0.0.1:$CT_DISPATCHER_PORT/readyz" 200 60 || ct_fail "dispatcher not ready"
    local c; for c in "$API" "$TRANSCODER" "$DISPATCHER"; do check_hardening "$c"; done
}

step_walking_skeleton() {
    ct_log "2. walking skeleton through the containers"
    start_services
    ct_log "services ready as uid 10001, read-only root, no capabilities"
    ct_endpoint_and_receiver
    OP1="$(ct_upload)"
    ct_log "upload complete: 202, Location /operations/$OP1"
    ct_wait_op "$OP1" succeeded 300
    VIDEO1="$(ct_video_of "$OP1")"
    ct_ready_webhook "$VIDEO1" 120
    ct_log "transcoded; the receiver verified the signed video.ready webhook for $VIDEO1"
}

step_sigterm() {
    ct_log "3. SIGTERM to each container, nothing lost"
    sigterm "$DISPATCHER" 30
    # Transcoder: SIGTERM while it transcodes; it finishes the job within its grace period.
    # Big Buck Bunny (1080p, four rungs): long enough to be caught running.
    local op2; op2="$(ct_upload "$ROOT/fixtures/media/bigbuckbunny.mp4")"
    ct_wait_op "$op2" running 120
    sigterm "$TRANSCODER" 90
    # The transcoder exits once its Succeeded report is confirmed by RabbitMQ; the
    # api applies it asynchronously, so the operation turns succeeded shortly
    # after. With no transcoder left running, a job abandoned at SIGTERM would
    # stay running and fail this wait.
    ct_wait_op "$op2" succeeded 60
    # Api: a :wait open on an operation that cannot move (no transcoder) gets a
    # complete answer from the stopping api.
    local op3 code; op3="$(ct_upload)"
    curl -sS --max-time 60 -o "$CT_LOGS/wait.json" -w '%{http_code}' -X POST -H "Authorization: Bearer $CT_KEY" \
        -H 'Content-Type: application/json' --data '{"timeout_seconds":50}' "$CT_API/operations/$op3:wait" >"$CT_LOGS/wait.code" &
    local waiter=$!
    sleep 2   # the request must be open before the signal; nothing observable tells when it is
    sigterm "$API" 60
    wait "$waiter" || ct_fail "the open :wait request failed during the api's shutdown"
    code="$(cat "$CT_LOGS/wait.code")"
    [ "$code" = 200 ] && [ "$(jq -r .operation.id "$CT_LOGS/wait.json")" = "$op3" ] || ct_fail ":wait during shutdown answered $code: $(cat "$CT_LOGS/wait.json")"
    ct_log "the :wait open during the api's SIGTERM got a complete 200 (operation $(jq -r .operation.status "$CT_LOGS/wait.json"), reason $(jq -r .reason "$CT_LOGS/wait.json"))"
    # Everything back: the pending job runs, events raised meanwhile are delivered once.
    podman start "$API" "$TRANSCODER" "$DISPATCHER" >/dev/null 2>>"$CT_LOGS/podman.log"
    ct_wait_status "$CT_API/readyz" 200 120 || ct_fail "api not ready after restart"
    ct_wait_op "$op3" succeeded 300
    ct_ready_webhook "$(ct_video_of "$op2")" 120
    ct_ready_webhook "$(ct_video_of "$op3")" 120
    ct_log "after restart: both videos ready, each video.ready recorded once and verified by the receiver"
}

readiness() {   # readiness URL: "healthz/readyz" status codes
    echo "$(ct_status "$1/healthz")/$(ct_status "$1/readyz")"
}
expect_ready() {   # expect_ready NAME URL WANT_HEALTHZ/WANT_READYZ SECONDS
    local deadline=$((SECONDS + $4)) got
    while got="$(readiness "$2")"; [ "$got" != "$3" ]; do
        (( SECONDS < deadline )) || ct_fail "$1: healthz/readyz $got, want $3 within $4 s"
        sleep 0.5
    done
    ct_log "$1: healthz/readyz $got"
}

step_dependency_loss() {
    ct_log "4. dependencies taken away and given back"
    local api="$CT_API" tr="http://127.0.0.1:$CT_TRANSCODER_PORT" di="http://127.0.0.1:$CT_DISPATCHER_PORT"
    ct_wait_status "$tr/readyz" 200 60 && ct_wait_status "$di/readyz" 200 60 || ct_fail "not ready before the fault"
    ct_cut pg
    ct_log "database gone"
    expect_ready api "$api" 200/503 30
    expect_ready dispatcher "$di" 200/503 30
    expect_ready transcoder "$tr" 200/200 5   # the transcoder does not use the database
    ct_proxy pg "$CT_PG_PROXY_PORT" 5432
    ct_log "database back"
    expect_ready api "$api" 200/200 60
    expect_ready dispatcher "$di" 200/200 60
    ct_cut amqp
    ct_log "broker gone"
    expect_ready transcoder "$tr" 200/503 30
    expect_ready dispatcher "$di" 200/503 30
    # The api keeps serving without the broker: writes go to its outbox (k8s/README.md).
    expect_ready api "$api" 200/200 5
    ct_proxy amqp "$CT_AMQP_PROXY_PORT" 5672
    ct_log "broker back"
    expect_ready transcoder "$tr" 200/200 120
    expect_ready dispatcher "$di" 200/200 120
    # And work flows again end to end.
    local op; op="$(ct_upload)"
    ct_wait_op "$op" succeeded 300
    ct_ready_webhook "$(ct_video_of "$op")" 120
    for c in "$API" "$TRANSCODER" "$DISPATCHER"; do
        [ "$(podman inspect -f '{{.RestartCount}}' "$c")" = 0 ] && [ "$(podman inspect -f '{{.State.Running}}' "$c")" = true ] ||
            ct_fail "$c did not ride out the outage"
    done
    ct_log "recovered: a new upload went through; no container restarted"
}

ENV_FILE="$(ct_env_file)"
[ -x target/debug/webhook-receiver ] || ct_fail "target/debug/webhook-receiver missing: run make build"
for s in api transcoder webhook-dispatcher; do
    podman image exists "localhost/vid/$s:$TAG" || ct_fail "image localhost/vid/$s:$TAG missing: run make images"
done
step_startup
step_walking_skeleton
step_sigterm
step_dependency_loss
echo "container-test: OK in $((SECONDS - START)) s (logs in ${CT_LOGS#"$ROOT"/})"
