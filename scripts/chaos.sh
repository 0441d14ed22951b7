#!/usr/bin/env bash
# The chaos run (issue 11): N uploads through the SDK while every part of the
# system is killed or restarted, then checks that nothing was lost, stuck or
# applied twice. `make chaos` runs the full version, `make test` the small one.
#
#   scripts/chaos.sh [--seed N] [--small] [--uploads N]
#
# The platform's PostgreSQL and RabbitMQ are PRIVATE instances started here
# (under .local/chaos/<run>/, on free ports from 55432 and 5673), because the
# run restarts them and the shared ones (5432, 5672) serve other tests at the
# same time. Garage (S3) and clamd are the shared ones; they are never restarted.
# If a private instance cannot be started, the run falls back to the shared one
# (a fresh database / a unique queue prefix) and skips that restart fault, saying why.
# Everything started here is stopped on exit, on failure too (trap).
#
# The receivers (who stand for customers) get a RabbitMQ node of their own, so
# the "broker loses its state" fault wipes only the platform's queues.
#
# Internal (called by the chaos binary during the run; CHAOS_DIR is set):
#   scripts/chaos.sh __restart postgres|rabbitmq [SECONDS down]
#   scripts/chaos.sh __reset rabbitmq [SECONDS stopped]   (stop_app, reset, start_app)
#
# CHAOS_PRIVATE (default "postgres rabbitmq") names the private instances to
# start; leave one out to run on the shared one (its restart is then skipped).
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# Every psql here gives up on a server that does not answer instead of
# hanging the run (libpq's connect_timeout, in seconds).
export PGCONNECT_TIMEOUT="${PGCONNECT_TIMEOUT:-10}"

PG_BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)"
RMQ_BIN=/usr/lib/rabbitmq/bin

say() { printf 'chaos.sh: %s\n' "$*" >&2; }
port_free() { ! timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }
free_port_from() { local p=$1; while ! port_free "$p"; do p=$((p + 1)); done; echo "$p"; }

as_user() { # as_user USER CMD...: run CMD as USER when we are root, else as ourselves
    local user=$1; shift
    if [ "$(id -u)" -eq 0 ]; then runuser -u "$user" -- "$@"; else "$@"; fi
}

# ------------------------------------------------------------ postgresql --
# State in $CHAOS_DIR/pg.env: PG_DATA, PG_PORT, PG_SOCK.
pg_ctl_() { as_user postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$CHAOS_DIR/logs/postgres.log" "$@"; }
pg_start() {
    [ -n "$PG_BIN" ] && [ -x "$PG_BIN/initdb" ] || { echo "no PostgreSQL server binaries under /usr/lib/postgresql"; return 1; }
    PG_DATA="$CHAOS_DIR/pg/data"; PG_SOCK="$CHAOS_DIR/pg/sock"
    PG_PORT="$(free_port_from "${CHAOS_PG_PORT:-55432}")"
    mkdir -p "$PG_DATA" "$PG_SOCK"
    [ "$(id -u)" -eq 0 ] && chown -R postgres:postgres "$CHAOS_DIR/pg" && chmod 777 "$CHAOS_DIR/logs"
    as_user postgres "$PG_BIN/initdb" -D "$PG_DATA" -U postgres --auth=trust -E UTF8 >"$CHAOS_DIR/logs/initdb.log" 2>&1 \
        || { echo "initdb failed (see $CHAOS_DIR/logs/initdb.log)"; return 1; }
    printf 'PG_DATA=%q\nPG_PORT=%q\nPG_SOCK=%q\n' "$PG_DATA" "$PG_PORT" "$PG_SOCK" >"$CHAOS_DIR/pg.env"
    pg_up || { echo "the private PostgreSQL did not start (see $CHAOS_DIR/logs/postgres.log)"; return 1; }
    "$PG_BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -qc "CREATE DATABASE vid" >/dev/null
}
pg_up() {
    pg_ctl_ -w -t 60 -o "-p $PG_PORT -k $PG_SOCK -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off" start >/dev/null
}
pg_restart() { # pg_restart [SECONDS]: stop (fast: sessions are cut), stay down SECONDS, start
    # shellcheck disable=SC1091
    source "$CHAOS_DIR/pg.env"
    pg_ctl_ -w -t 60 -m fast stop >/dev/null
    sleep "${1:-0}"
    pg_up
}
pg_stop() {
    [ -f "$CHAOS_DIR/pg.env" ] || return 0
    # shellcheck disable=SC1091
    source "$CHAOS_DIR/pg.env"
    [ -f "$PG_DATA/postmaster.pid" ] && pg_ctl_ -w -t 30 -m immediate stop >/dev/null 2>&1 || true
}

# -------------------------------------------------------------- rabbitmq --
# Two private nodes: "rabbitmq" (the platform's: restarted and reset by the
# run) and "receivers-rabbitmq" (the chaos receivers' own queues: they stand
# for customers, whose messages the platform's faults must not touch).
# `rmq_use NAME` selects one: RMQ_BASE=$CHAOS_DIR/NAME, state in
# $CHAOS_DIR/NAME.env (RMQ_NODE, RMQ_PORT). A node runs as the broker's user
# (so it uses that user's Erlang cookie), through a wrapper script holding the
# node's environment: its own node name, ports, data, logs, config, no
# plugins, and not /etc/rabbitmq/rabbitmq-env.conf.
rmq_use() { RMQ_NAME=$1; RMQ_BASE="$CHAOS_DIR/$1"; RMQ_ENV="$CHAOS_DIR/$1.env"; }
rmq_user() { if [ "$(id -u)" -eq 0 ] && id rabbitmq >/dev/null 2>&1; then echo rabbitmq; else id -un; fi; }
rmq() { # rmq PROGRAM ARGS...: a RabbitMQ script against the selected private node
    as_user "$(rmq_user)" "$RMQ_BASE/run" "$@"
}
rmq_start() { # rmq_start NODE_PREFIX AMQP_PORT_FROM DIST_PORT_FROM (after rmq_use)
    [ -x "$RMQ_BIN/rabbitmq-server" ] || { echo "no rabbitmq-server under $RMQ_BIN"; return 1; }
    RMQ_NODE="$1$$@localhost"
    RMQ_PORT="$(free_port_from "$2")"
    local dist base="$RMQ_BASE" home
    dist="$(free_port_from "$3")"
    home="$(getent passwd "$(rmq_user)" | cut -d: -f6)"
    mkdir -p "$base/mnesia" "$base/log"
    printf 'listeners.tcp.default = 127.0.0.1:%s\nlog.file.level = warning\n' "$RMQ_PORT" >"$base/rabbitmq.conf"
    echo '[].' >"$base/advanced.config"
    echo '[].' >"$base/enabled_plugins"
    : >"$base/rabbitmq-env.conf"
    cat >"$base/run" <<WRAPPER
#!/bin/sh
cd /
export HOME='$home' RABBITMQ_NODENAME='$RMQ_NODE' RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT='$RMQ_PORT'
export RABBITMQ_DIST_PORT='$dist' RABBITMQ_CTL_DIST_PORT_MIN='$((dist + 1))' RABBITMQ_CTL_DIST_PORT_MAX='$((dist + 20))'
export RABBITMQ_MNESIA_BASE='$base/mnesia' RABBITMQ_LOG_BASE='$base/log' RABBITMQ_PID_FILE='$base/pid'
export RABBITMQ_CONFIG_FILE='$base/rabbitmq.conf' RABBITMQ_ADVANCED_CONFIG_FILE='$base/advanced.config'
export RABBITMQ_CONF_ENV_FILE='$base/rabbitmq-env.conf' RABBITMQ_ENABLED_PLUGINS_FILE='$base/enabled_plugins'
export ERL_EPMD_ADDRESS=127.0.0.1
prog="\$1"; shift
exec '$RMQ_BIN'/"\$prog" "\$@"
WRAPPER
    chmod 755 "$base/run"
    [ "$(id -u)" -eq 0 ] && chown -R "$(rmq_user)" "$base"
    printf 'RMQ_NODE=%q\nRMQ_PORT=%q\n' "$RMQ_NODE" "$RMQ_PORT" >"$RMQ_ENV"
    rmq_up || { echo "the private RabbitMQ node $RMQ_NAME did not start (see $base/log)"; return 1; }
}
rmq_await() { # until the node answers and its AMQP port is open (90 s at most)
    local deadline=$((SECONDS + 90))
    until rmq rabbitmqctl -n "$RMQ_NODE" -q await_startup --timeout 60 >/dev/null 2>&1; do
        (( SECONDS < deadline )) || return 1
        sleep 1
    done
    until ! port_free "$RMQ_PORT"; do (( SECONDS < deadline )) || return 1; sleep 0.5; done
}
rmq_up() {
    rmq rabbitmq-server -detached >>"$CHAOS_DIR/logs/$RMQ_NAME-start.log" 2>&1 || return 1
    rmq_await
}
rmq_restart() { # rmq_restart [SECONDS]: stop the node, stay down SECONDS, start it
    # shellcheck disable=SC1090
    source "$RMQ_ENV"
    rmq rabbitmqctl -n "$RMQ_NODE" -q stop >/dev/null 2>&1 || true
    local deadline=$((SECONDS + 60))
    while ! port_free "$RMQ_PORT" && (( SECONDS < deadline )); do sleep 0.5; done
    sleep "${1:-0}"
    rmq_up
}
rmq_reset() { # rmq_reset [SECONDS]: the node loses its state: stop_app, reset (every
    # queue, exchange, binding, message and user gone; guest/guest is created
    # again at start), stay stopped SECONDS, start_app.
    # shellcheck disable=SC1090
    source "$RMQ_ENV"
    rmq rabbitmqctl -n "$RMQ_NODE" -q stop_app >/dev/null || return 1
    rmq rabbitmqctl -n "$RMQ_NODE" -q reset >/dev/null || return 1
    sleep "${1:-0}"
    rmq rabbitmqctl -n "$RMQ_NODE" -q start_app >/dev/null || return 1
    rmq_await
}
rmq_stop() {
    [ -f "$RMQ_ENV" ] || return 0
    # shellcheck disable=SC1090
    source "$RMQ_ENV"
    local runner=("$RMQ_BASE/run")
    [ "$(id -u)" -eq 0 ] && runner=(runuser -u "$(rmq_user)" -- "${runner[@]}")
    timeout 60 "${runner[@]}" rabbitmqctl -n "$RMQ_NODE" -q stop >/dev/null 2>&1 || true
    # A node that did not stop: its pid file names the Erlang VM.
    local pid
    pid="$(cat "$RMQ_BASE/pid" 2>/dev/null || true)"
    if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
}

# --------------------------------------------------------- internal calls --
if [ "${1:-}" = "__restart" ]; then
    [ -n "${CHAOS_DIR:-}" ] || { say "CHAOS_DIR is not set"; exit 2; }
    case "${2:-}" in
        postgres) pg_restart "${3:-0}" ;;
        rabbitmq) rmq_use rabbitmq; rmq_restart "${3:-0}" ;;
        *) say "unknown: $2"; exit 2 ;;
    esac
    exit $?
fi
if [ "${1:-}" = "__reset" ]; then # __reset rabbitmq [SECONDS]: the platform's node loses its state
    [ -n "${CHAOS_DIR:-}" ] || { say "CHAOS_DIR is not set"; exit 2; }
    [ "${2:-}" = rabbitmq ] || { say "unknown: ${2:-}"; exit 2; }
    rmq_use rabbitmq; rmq_reset "${3:-0}"
    exit $?
fi

# ------------------------------------------------------------------ main --
ARGS=("$@")
# shellcheck disable=SC1091
[ -f .local/stack.env ] || { say ".local/stack.env is missing: run \`make up\` (or scripts/stack.sh infra-up) first"; exit 1; }
source .local/stack.env

RUN="$(date -u +%Y%m%dT%H%M%SZ)-$$"
export CHAOS_DIR="$ROOT/.local/chaos/$RUN"
mkdir -p "$CHAOS_DIR/logs"
SHARED_DBS=()

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    # The chaos binary kills its own children when it exits; anything left in our
    # process group that we started (receivers, services) is ended by pid below.
    if [ -n "${CHAOS_PID:-}" ] && kill -0 "$CHAOS_PID" 2>/dev/null; then
        kill -TERM "$CHAOS_PID" 2>/dev/null; sleep 2; kill -KILL "$CHAOS_PID" 2>/dev/null
    fi
    if [ -f "$CHAOS_DIR/children.pids" ]; then
        while read -r pid; do [[ "$pid" =~ ^[0-9]+$ ]] && kill -KILL "$pid" 2>/dev/null; done <"$CHAOS_DIR/children.pids"
    fi
    rmq_use rabbitmq; rmq_stop
    rmq_use receivers-rabbitmq; rmq_stop
    pg_stop
    for db in "${SHARED_DBS[@]}"; do
        psql -h 127.0.0.1 -U postgres -d postgres -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1
    done
    # Keep the logs of the run, drop the data directories.
    rm -rf "$CHAOS_DIR/pg" "$CHAOS_DIR/rabbitmq/mnesia" "$CHAOS_DIR/receivers-rabbitmq/mnesia"
    # Only the 10 newest runs' logs are kept.
    ls -1dt "$ROOT"/.local/chaos/*/ 2>/dev/null | tail -n +11 | xargs -r rm -rf
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "building the binaries"
cargo build -q -p vid-api -p vid-transcoder -p vid-webhook-dispatcher -p vid-webhook-receiver -p vid-e2e --bins

CHAOS_FLAGS=()
PRIVATE="${CHAOS_PRIVATE-postgres rabbitmq}"
private_wanted() { [[ " $PRIVATE " == *" $1 "* ]] || { echo "CHAOS_PRIVATE leaves it out"; return 1; }; }
if reason="$(private_wanted postgres && pg_start 2>&1)"; then
    # shellcheck disable=SC1091
    source "$CHAOS_DIR/pg.env"
    DB_SERVER="postgres://postgres@127.0.0.1:$PG_PORT"
    DB_URL="$DB_SERVER/vid"
    say "private PostgreSQL on 127.0.0.1:$PG_PORT ($PG_DATA)"
    CHAOS_FLAGS+=(--postgres-restart-cmd "bash $ROOT/scripts/chaos.sh __restart postgres")
else
    pg_stop
    say "private PostgreSQL unavailable ($reason); using the shared one, the PostgreSQL restart is skipped"
    DB_SERVER="${VID__DATABASE__URL%/*}"
    db="chaos_$(date +%s)_$$"
    psql -h 127.0.0.1 -U postgres -d postgres -qc "CREATE DATABASE $db" >/dev/null
    SHARED_DBS+=("$db" "${db}_receiver_a" "${db}_receiver_b")
    DB_URL="$DB_SERVER/$db"
    CHAOS_FLAGS+=(--skip-postgres-restart "private PostgreSQL unavailable: $reason")
fi
rmq_use rabbitmq
if reason="$(private_wanted rabbitmq && rmq_start chaos "${CHAOS_AMQP_PORT:-5673}" "${CHAOS_DIST_PORT:-25673}" 2>&1)"; then
    # shellcheck disable=SC1090
    source "$RMQ_ENV"
    AMQP_URL="amqp://guest:guest@127.0.0.1:$RMQ_PORT/%2f"
    say "private RabbitMQ node $RMQ_NODE on 127.0.0.1:$RMQ_PORT"
    CHAOS_FLAGS+=(--rabbitmq-restart-cmd "bash $ROOT/scripts/chaos.sh __restart rabbitmq")
    PLATFORM_MQ_PORT=$RMQ_PORT
else
    rmq_stop
    say "private RabbitMQ unavailable ($reason); using the shared one, the RabbitMQ restart and reset are skipped"
    AMQP_URL="${VID__AMQP__URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"
    CHAOS_FLAGS+=(--skip-rabbitmq-restart "private RabbitMQ unavailable: $reason")
    CHAOS_FLAGS+=(--skip-rabbitmq-reset "private RabbitMQ unavailable: $reason")
    PLATFORM_MQ_PORT=
fi
# The receivers' own node (the customers' broker): a reset of the platform's
# node must not wipe messages a receiver already answered 200 for.
if [ -n "$PLATFORM_MQ_PORT" ]; then
    rmq_use receivers-rabbitmq
    if reason="$(rmq_start chaosr "$((PLATFORM_MQ_PORT + 1))" "${CHAOS_RECEIVERS_DIST_PORT:-25773}" 2>&1)"; then
        # shellcheck disable=SC1090
        source "$RMQ_ENV"
        say "the receivers' private RabbitMQ node $RMQ_NODE on 127.0.0.1:$RMQ_PORT"
        CHAOS_FLAGS+=(--receiver-amqp-url "amqp://guest:guest@127.0.0.1:$RMQ_PORT/%2f")
        CHAOS_FLAGS+=(--rabbitmq-reset-cmd "bash $ROOT/scripts/chaos.sh __reset rabbitmq")
    else
        rmq_stop
        say "the receivers' RabbitMQ node did not start ($reason); the RabbitMQ reset is skipped"
        CHAOS_FLAGS+=(--skip-rabbitmq-reset "the receivers' own RabbitMQ node did not start: $reason")
    fi
    rmq_use rabbitmq
fi

VID__DATABASE__URL="$DB_URL" VID_PROFILE=test VID_CONFIG_DIR="$ROOT/config" target/debug/api migrate >/dev/null

target/debug/chaos --database-url "$DB_URL" --amqp-url "$AMQP_URL" --receiver-db-server "$DB_SERVER" \
    --run-dir "$CHAOS_DIR" "${CHAOS_FLAGS[@]}" "${ARGS[@]}" &
CHAOS_PID=$!
set +e
wait "$CHAOS_PID"
rc=$?
set -e
CHAOS_PID=
say "total wall time ${SECONDS} s (build, private PostgreSQL/RabbitMQ and clean-up included)"
[ "$rc" -eq 0 ] || say "FAILED (exit $rc); logs in $CHAOS_DIR/logs"
exit "$rc"
