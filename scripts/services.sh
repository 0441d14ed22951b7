#!/usr/bin/env bash
# Run the vid service binaries in the background against the local stack.
#
#   scripts/services.sh start [debug|release]   start api (waits for /healthz), playback (waits for /healthz),
#                                               transcoder, webhook-dispatcher, ingest
#   scripts/services.sh stop                    SIGTERM, up to 20 s grace, then SIGKILL
#   scripts/services.sh status                  one line per service
#   scripts/services.sh restart NAME [debug|release]
#
# Binaries come from target/<profile>/ unless BIN_DIR is set.  Each service runs
# from the repo root with .local/stack.env sourced and VID_PROFILE=development;
# logs go to .local/logs/NAME.log, pids to .local/pids/NAME.pid.
# Environment knobs: BIN_DIR, VID_API_PORT (default 8080), VID_PLAYBACK_PORT (default 8090, the
# playback service's [playback] listen port), API_HEALTH_TIMEOUT (30 s, also the playback's).
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL="$ROOT/.local"
LOGS="$LOCAL/logs"
PIDS="$LOCAL/pids"
ENV_FILE="$LOCAL/stack.env"
PROFILE_FILE="$PIDS/services.profile"
SERVICES=(api playback transcoder webhook-dispatcher ingest)   # start order; stop runs in reverse
API_PORT="${VID_API_PORT:-8080}"
PLAYBACK_PORT="${VID_PLAYBACK_PORT:-8090}"
API_HEALTH_TIMEOUT="${API_HEALTH_TIMEOUT:-30}"
STOP_TIMEOUT=20

say() { printf '%-19s %s\n' "$1" "$2"; }
die() { printf 'services.sh: error: %s\n' "$*" >&2; exit 1; }
trap 'printf "services.sh: error: command failed (line %s): %s\n" "$LINENO" "$BASH_COMMAND" >&2' ERR

is_service() { local s; for s in "${SERVICES[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
pid_file() { echo "$PIDS/$1.pid"; }

# running NAME: print the pid of NAME if its pid file points at a live process
# whose command line still mentions NAME (guards against recycled pids).
running() {
    local f pid
    f="$(pid_file "$1")"
    [ -f "$f" ] && pid="$(<"$f")" && [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -Eq "(^|/)$1\$" || return 1
    echo "$pid"
}

# clean_stale NAME: drop a pid file that no longer points at our process;
# prints a note for the caller's status line.
clean_stale() {
    local f; f="$(pid_file "$1")"
    if [ -f "$f" ] && ! running "$1" >/dev/null; then
        rm -f "$f"
        echo " (removed stale pid file)"
    fi
}

port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }
api_healthy() { curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$API_PORT/healthz" 2>/dev/null; }
playback_healthy() { curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$PLAYBACK_PORT/healthz" 2>/dev/null; }

# set_profile [debug|release]: sets PROFILE; default is the profile of the last start.
set_profile() {
    case "${1:-}" in
        "") PROFILE=debug
            if [ "$(cat "$PROFILE_FILE" 2>/dev/null)" = release ]; then PROFILE=release; fi ;;
        debug | release) PROFILE="$1" ;;
        *) die "profile must be 'debug' or 'release', got '$1'" ;;
    esac
}

# started_epoch PID: when the process started, in seconds since the epoch.
started_epoch() {
    local stat btime ticks
    stat="$(<"/proc/$1/stat")" || return 1
    stat="${stat##*) }"                       # drop "pid (comm) "; field 22 is now field 20
    ticks="$(awk '{print $20}' <<<"$stat")"
    btime="$(awk '/^btime/ {print $2}' /proc/stat)"
    echo $((btime + ticks / $(getconf CLK_TCK)))
}

# outdated NAME PID BIN: true (and prints why) when the process runs other
# code than BIN holds now. What counts is the content: the running executable
# (/proc/PID/exe, readable even after the file was deleted or replaced) is
# compared with BIN byte for byte, so a rebuild that changed the binary is
# told from a build that only swapped the file under target/ for an identical
# one (`make test` does that: its test builds relink target/debug/*). Where
# /proc/PID/exe cannot be read, modification time against start time decides.
outdated() {
    local name="$1" pid="$2" bin="$3" started mtime exe
    [ -x "$bin" ] || return 1
    exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
    if [ -r "/proc/$pid/exe" ]; then
        if cmp -s "/proc/$pid/exe" "$bin"; then
            return 1
        fi
        echo "$bin was rebuilt since it started (its content differs from the running ${exe% (deleted)})"
        return 0
    fi
    started="$(started_epoch "$pid")" || return 1
    mtime="$(stat -c %Y "$bin")" || return 1
    if (( mtime > started )); then
        echo "$bin ($(date -d "@$mtime" +%T)) is newer than the process (started $(date -d "@$started" +%T))"
        return 0
    fi
    return 1
}

start_one() {   # start_one NAME BIN_DIR
    local name="$1" bin="$2/$1" log="$LOGS/$1.log" pid why
    if pid="$(running "$name")"; then
        if why="$(outdated "$name" "$pid" "$bin")"; then
            say "$name" "running (pid $pid) but $why: restarting it"
            stop_many "$name"
        else
            say "$name" "already running (pid $pid, binary unchanged since it started)"
            return 0
        fi
    fi
    local note; note="$(clean_stale "$name")"
    [ -z "$note" ] || say "$name" "not running${note}"
    printf '\n==== %s starting %s\n' "$(date -Is)" "$bin" >>"$log"
    (
        cd "$ROOT"
        # shellcheck disable=SC1090
        . "$ENV_FILE"
        export VID_PROFILE=development
        export VID__PLAYBACK__LISTEN="${VID__PLAYBACK__LISTEN:-127.0.0.1:$PLAYBACK_PORT}"
        # setsid: own process group, so stop can signal the service and its children.
        exec setsid "$bin" >>"$log" 2>&1 </dev/null
    ) &
    pid=$!
    echo "$pid" >"$(pid_file "$name")"
    sleep 0.3
    if ! kill -0 "$pid" 2>/dev/null; then
        rm -f "$(pid_file "$name")"
        tail -n 20 "$log" >&2
        die "$name exited right after start (log above: .local/logs/$name.log)"
    fi
    say "$name" "started (pid $pid, log .local/logs/$name.log)"
}

wait_api_healthy() {
    local deadline=$((SECONDS + API_HEALTH_TIMEOUT))
    until api_healthy; do
        if ! running api >/dev/null || (( SECONDS >= deadline )); then
            local why="not healthy after ${API_HEALTH_TIMEOUT}s"
            if ! running api >/dev/null; then
                why="exited before becoming healthy"
                rm -f "$(pid_file api)"
            fi
            echo "---- last 20 lines of .local/logs/api.log ----" >&2
            tail -n 20 "$LOGS/api.log" >&2 || true
            die "api $why (http://127.0.0.1:$API_PORT/healthz); stop leftovers with: scripts/services.sh stop"
        fi
        sleep 0.5
    done
    say api "healthy (http://127.0.0.1:$API_PORT/healthz)"
}

# wait_playback_healthy: the playback service answers /healthz once PostgreSQL
# holds its table (it waits for the api's migrations, bounded) and it listens.
wait_playback_healthy() {
    local deadline=$((SECONDS + API_HEALTH_TIMEOUT))
    until playback_healthy; do
        if ! running playback >/dev/null || (( SECONDS >= deadline )); then
            local why="not healthy after ${API_HEALTH_TIMEOUT}s"
            if ! running playback >/dev/null; then
                why="exited before becoming healthy"
                rm -f "$(pid_file playback)"
            fi
            echo "---- last 20 lines of .local/logs/playback.log ----" >&2
            tail -n 20 "$LOGS/playback.log" >&2 || true
            die "playback $why (http://127.0.0.1:$PLAYBACK_PORT/healthz); stop leftovers with: scripts/services.sh stop"
        fi
        sleep 0.5
    done
    say playback "healthy (http://127.0.0.1:$PLAYBACK_PORT/healthz)"
}

# stop_many NAME...: SIGTERM all, wait up to STOP_TIMEOUT s in total, SIGKILL survivors.
stop_many() {
    local name pid target
    local -a names=() pids=()
    for name in "$@"; do
        if pid="$(running "$name")"; then
            # Signal the whole process group when the service leads one (it does
            # when started by this script), so helper children go too.
            target="$pid"
            [ "$(ps -o pgid= -p "$pid" | tr -d ' ')" = "$pid" ] && target="-$pid"
            kill -TERM -- "$target" 2>/dev/null || true
            names+=("$name"); pids+=("$pid")
        else
            say "$name" "not running$(clean_stale "$name")"
        fi
    done
    local deadline=$((SECONDS + STOP_TIMEOUT)) i alive
    while :; do
        alive=0
        for i in "${!pids[@]}"; do kill -0 "${pids[$i]}" 2>/dev/null && alive=1; done
        (( alive == 0 || SECONDS >= deadline )) && break
        sleep 0.2
    done
    for i in "${!pids[@]}"; do
        if kill -0 "${pids[$i]}" 2>/dev/null; then
            kill -KILL -- "-${pids[$i]}" 2>/dev/null || kill -KILL "${pids[$i]}" 2>/dev/null || true
            say "${names[$i]}" "killed (pid ${pids[$i]}, no exit ${STOP_TIMEOUT}s after SIGTERM)"
        else
            say "${names[$i]}" "stopped (pid ${pids[$i]})"
        fi
        rm -f "$(pid_file "${names[$i]}")"
    done
}

start_services() {   # start_services PROFILE NAME...
    local profile="$1"; shift
    local dir="${BIN_DIR:-$ROOT/target/$profile}" name missing=()
    [ -f "$ENV_FILE" ] || die ".local/stack.env not found; run scripts/stack.sh infra-up first"
    for name in "$@"; do
        running "$name" >/dev/null || [ -x "$dir/$name" ] || missing+=("$dir/$name")
    done
    if (( ${#missing[@]} )); then
        local hint="cargo build"; [ "$profile" = release ] && hint="cargo build --release"
        [ -n "${BIN_DIR:-}" ] && hint="check BIN_DIR"
        die "missing binaries: ${missing[*]} ($hint)"
    fi
    if [[ " $* " == *" api "* ]] && ! running api >/dev/null && port_open "$API_PORT"; then
        die "127.0.0.1:$API_PORT is already in use by a process services.sh did not start; stop it or set VID_API_PORT"
    fi
    if [[ " $* " == *" playback "* ]] && ! running playback >/dev/null && port_open "$PLAYBACK_PORT"; then
        die "127.0.0.1:$PLAYBACK_PORT is already in use by a process services.sh did not start; stop it or set VID_PLAYBACK_PORT"
    fi
    echo "$profile" >"$PROFILE_FILE"
    for name in "$@"; do
        start_one "$name" "$dir"
        [ "$name" = api ] && wait_api_healthy
        [ "$name" = playback ] && wait_playback_healthy
    done
    return 0
}

cmd_status() {
    local name pid rc=0
    for name in "${SERVICES[@]}"; do
        if pid="$(running "$name")"; then
            if [ "$name" = api ]; then
                if api_healthy; then say api "running (pid $pid, healthy)"
                else say api "running (pid $pid, /healthz NOT answering)"; rc=1; fi
            elif [ "$name" = playback ]; then
                if playback_healthy; then say playback "running (pid $pid, healthy, http://127.0.0.1:$PLAYBACK_PORT/play/)"
                else say playback "running (pid $pid, /healthz NOT answering)"; rc=1; fi
            else
                say "$name" "running (pid $pid)"
            fi
        elif [ -f "$(pid_file "$name")" ]; then
            say "$name" "NOT running (stale pid file)"; rc=1
        else
            say "$name" "NOT running"; rc=1
        fi
    done
    return "$rc"
}

usage() {
    sed -n '2,/^set -/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

mkdir -p "$LOGS" "$PIDS"
case "${1:-}" in
    start)
        set_profile "${2:-}"
        start_services "$PROFILE" "${SERVICES[@]}" ;;
    stop)
        stop_many ingest webhook-dispatcher transcoder playback api ;;
    status)
        cmd_status || exit 1 ;;
    restart)
        if [ -z "${2:-}" ] || ! is_service "$2"; then
            die "usage: restart NAME [debug|release]; NAME is one of: ${SERVICES[*]}"
        fi
        set_profile "${3:-}"
        stop_many "$2"
        start_services "$PROFILE" "$2" ;;
    *) usage ;;
esac
