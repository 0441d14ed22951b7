#!/usr/bin/env bash
# Local infrastructure for the vid platform: PostgreSQL, RabbitMQ, Garage (S3),
# clamd (ClamAV, with a generated local signature database) and the ffmpeg
# build dependencies.  Everything listens on loopback only.
#
#   scripts/stack.sh infra-up      start/install what is missing, write .local/stack.env
#   scripts/stack.sh infra-down    stop Garage, clamd and whatever infra-up itself started
#   scripts/stack.sh status        one line per component
#   scripts/stack.sh garage-check  curl-only smoke test of the S3 endpoint
#
# State lives in .local/ (git-ignored): garage/ (config, secrets, data),
# clamav/ (clamd.conf, db/ with the local signatures, tmp/),
# logs/, pids/, started/ (markers for services infra-up started), stack.env.
# Re-running infra-up is safe; a second run only checks and changes nothing.
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL="$ROOT/.local"
LOGS="$LOCAL/logs"
PIDS="$LOCAL/pids"
STARTED="$LOCAL/started"
ENV_FILE="$LOCAL/stack.env"

PG_HOST=127.0.0.1
PG_PORT=5432
DB_NAME=vid
AMQP_PORT=5672
FFMPEG_PKGS=(libavcodec-dev libavformat-dev libavutil-dev libswscale-dev libswresample-dev
             libavfilter-dev libavdevice-dev clang libclang-dev pkg-config ffmpeg)

GARAGE_VERSION=2.5.0
GARAGE_DEFAULT_BIN="$HOME/.cargo/bin/garage"
GARAGE_BIN="${GARAGE_BIN:-$GARAGE_DEFAULT_BIN}"
GARAGE_DIR="$LOCAL/garage"
GARAGE_CONF="$GARAGE_DIR/garage.toml"
GARAGE_SECRETS="$GARAGE_DIR/secrets.env"
GARAGE_TEMPLATE="$ROOT/deploy/local/garage.toml.in"
GARAGE_PID="$PIDS/garage.pid"
GARAGE_LOG="$LOGS/garage.log"
S3_PORT=3900
# shellcheck disable=SC2034  # substituted into the template
RPC_PORT=3901
# shellcheck disable=SC2034
ADMIN_PORT=3903
S3_REGION=garage
BUCKET=vid-media
KEY_NAME=vid-dev

CLAMD_PORT=3310
CLAMAV_DIR="$LOCAL/clamav"
CLAMD_CONF="$CLAMAV_DIR/clamd.conf"
CLAMD_DB="$CLAMAV_DIR/db"
CLAMD_SOCK="$CLAMAV_DIR/clamd.sock"
CLAMD_PID="$PIDS/clamd.pid"
CLAMD_LOG="$LOGS/clamd.log"
# Must equal [scanner] stream_max_length_bytes (209715200) in config/default.toml.
CLAMD_STREAM_MAX=200M

# ---------------------------------------------------------------- helpers --

say() { printf '%-9s %s\n' "$1" "$2"; }
die() { printf 'stack.sh: error: %s\n' "$*" >&2; exit 1; }
trap 'printf "stack.sh: error: command failed (line %s): %s\n" "$LINENO" "$BASH_COMMAND" >&2' ERR

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else die "root privileges needed for: $*"; fi
}

as_postgres() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"
    else sudo -u postgres "$@"; fi
}

# wait_for SECONDS CMD...: poll CMD once a second until it succeeds or time runs out.
wait_for() {
    local deadline=$((SECONDS + $1)); shift
    until "$@"; do
        (( SECONDS < deadline )) || return 1
        sleep 1
    done
}

pid_gone() { ! kill -0 "$1" 2>/dev/null; }
tcp_open() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }
rand_hex() { od -An -vtx1 -N32 /dev/urandom | tr -d ' \n'; }

# pid_alive FILE NAME: print the pid from FILE if that process is alive and its
# argv[0] is NAME (guards against a recycled pid).
pid_alive() {
    local pid
    [ -f "$1" ] && pid="$(<"$1")" && [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    [ "$(basename "$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -n1)")" = "$2" ] || return 1
    echo "$pid"
}

missing_pkgs() {
    local p
    for p in "$@"; do
        [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ] || echo "$p"
    done
}

APT_UPDATED=0
apt_install() {
    command -v apt-get >/dev/null || die "apt-get not available; install these manually: $*"
    if [ "$APT_UPDATED" = 0 ]; then
        say apt "apt-get update"
        as_root apt-get update -qq >>"$LOGS/apt.log" 2>&1 9>&- || die "apt-get update failed (see .local/logs/apt.log)"
        APT_UPDATED=1
    fi
    say apt "installing $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" \
        >>"$LOGS/apt.log" 2>&1 9>&- || die "apt-get install $* failed (see .local/logs/apt.log)"
}

# ------------------------------------------------------------- postgresql --

pg_ready() { command -v pg_isready >/dev/null && pg_isready -q -h "$PG_HOST" -p "$PG_PORT"; }
# shellcheck disable=SC2012  # version directory names are plain numbers
pg_version() { ls /etc/postgresql 2>/dev/null | sort -V | tail -n1; }
psql_pg() { psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -w -X -q -At "$@"; }

postgres_up() {
    if pg_ready; then
        say postgres "already running on $PG_HOST:$PG_PORT"
    else
        if ! command -v pg_ctlcluster >/dev/null || [ -z "$(pg_version)" ]; then
            apt_install postgresql
        fi
        local ver; ver="$(pg_version)"
        [ -n "$ver" ] || die "PostgreSQL installed but no version under /etc/postgresql"
        [ -d "/etc/postgresql/$ver/main" ] || as_root pg_createcluster "$ver" main >/dev/null 9>&-
        say postgres "starting cluster $ver/main"
        as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main start 9>&- \
            || die "pg_ctlcluster $ver main start failed; see /var/log/postgresql/postgresql-$ver-main.log and pg_lsclusters"
        echo "$ver" >"$STARTED/postgresql"
        wait_for 30 pg_ready || die "PostgreSQL not accepting connections on $PG_HOST:$PG_PORT after 30 s (see /var/log/postgresql/postgresql-$ver-main.log)"
    fi

    if ! psql_pg -c 'select 1' >/dev/null 2>&1; then
        local hba
        hba="$(cd / && as_postgres psql -X -At -c 'show hba_file')" || die "cannot reach PostgreSQL as OS user postgres to fix pg_hba.conf"
        as_root cp "$hba" "$hba.before-stack-sh"
        as_root sed -i '1i host all postgres 127.0.0.1/32 trust  # added by scripts/stack.sh (local dev)' "$hba"
        (cd / && as_postgres psql -X -q -At -c 'select pg_reload_conf()') >/dev/null
        sleep 1
        psql_pg -c 'select 1' >/dev/null || die "still cannot connect as postgres@$PG_HOST without a password (check $hba)"
        say postgres "enabled trust auth for postgres@127.0.0.1 in $hba"
    fi

    if [ "$(psql_pg -c "select 1 from pg_database where datname = '$DB_NAME'")" = 1 ]; then
        say postgres "database $DB_NAME exists"
    else
        psql_pg -c "create database $DB_NAME" >/dev/null
        say postgres "created database $DB_NAME"
    fi
}

# --------------------------------------------------------------- rabbitmq --

# Erlang CLI tools may spawn epmd; keep the lock fd away from it.
rabbitmqctl() { command rabbitmqctl "$@" 9>&-; }
rabbitmq-diagnostics() { command rabbitmq-diagnostics "$@" 9>&-; }
rmq_ready() { tcp_open "$AMQP_PORT" && rabbitmq-diagnostics -q ping >/dev/null 2>&1; }
rmq_down() { ! tcp_open "$AMQP_PORT"; }

# Only used when infra-up installed RabbitMQ itself: keep it on loopback.
rabbitmq_loopback_config() {
    local f
    for f in rabbitmq.conf rabbitmq-env.conf; do
        [ -e "/etc/rabbitmq/$f" ] || as_root install -m 644 "$ROOT/deploy/local/rabbitmq/$f" "/etc/rabbitmq/$f"
    done
}

# Open-file limit RabbitMQ is started with. Every quorum queue keeps files
# open, and a full `make test` declares ~300 of them (4 per test prefix) within
# the 5-minute expiry of its policy; with a distribution's default soft limit
# of 1024 the broker runs out, then accepts TCP but never answers the AMQP
# handshake (seen: "File Descriptors Total: 933, limit: 927").
RMQ_NOFILE=65536
RMQ_NOFILE_MIN=4096

# The soft open-files limit of the running broker (0 if unknown).
rabbitmq_nofile() {
    local pid
    pid="$(pgrep -f 'beam.smp.*-s rabbit' | head -n 1)"
    [ -n "$pid" ] || { echo 0; return; }
    awk '/^Max open files/ {print $4}' "/proc/$pid/limits" 2>/dev/null || echo 0
}

rabbitmq_start() {
    # Debian's rabbitmq-server switches to the rabbitmq user with `su`, whose
    # pam_limits resets the soft limit to /etc/security/limits.conf's (1024):
    # a limits.d entry is what raises it (capped by this machine's hard limit).
    local hard want
    hard="$(ulimit -Hn)"
    want="$RMQ_NOFILE"
    if [ "$hard" != unlimited ] && [ "$hard" -lt "$want" ]; then want="$hard"; fi
    local limits=/etc/security/limits.d/rabbitmq-vid.conf
    if [ -d /etc/security/limits.d ] && ! grep -qs "nofile $want\$" "$limits"; then
        printf 'rabbitmq soft nofile %s\nrabbitmq hard nofile %s\n' "$want" "$want" | as_root tee "$limits" >/dev/null
    fi
    say rabbitmq "starting rabbitmq-server with an open-file limit of $want (takes ~20 s)"
    as_root sh -c "ulimit -n $want 2>/dev/null; exec rabbitmq-server -detached" >/dev/null 2>&1 9>&- \
        || die "rabbitmq-server -detached failed; see /var/log/rabbitmq/"
    wait_for 90 rmq_ready || die "RabbitMQ not answering on 127.0.0.1:$AMQP_PORT after 90 s; see /var/log/rabbitmq/"
}

rabbitmq_up() {
    if tcp_open "$AMQP_PORT"; then
        local nofile; nofile="$(rabbitmq_nofile)"
        if [ "${nofile:-0}" -gt 0 ] && [ "$nofile" -lt "$RMQ_NOFILE_MIN" ]; then
            say rabbitmq "running with an open-file limit of $nofile, too low for the test suite's quorum queues; restarting it"
            timeout 60 rabbitmqctl -q stop >/dev/null 2>&1 || as_root pkill -TERM -f 'beam.smp.*-s rabbit' || true
            wait_for 60 rmq_down || die "RabbitMQ did not stop; stop it by hand and run this again"
            rabbitmq_start
        else
            say rabbitmq "already running on 127.0.0.1:$AMQP_PORT"
        fi
    else
        if ! command -v rabbitmq-server >/dev/null; then
            apt_install rabbitmq-server
            rabbitmq_loopback_config
        fi
        rabbitmq_start
        touch "$STARTED/rabbitmq"
    fi

    local ok=1
    rabbitmqctl -q authenticate_user guest guest >/dev/null 2>&1 || ok=0
    rabbitmqctl -q list_permissions -p / 2>/dev/null | grep -Eq '^guest[[:space:]]+\.\*[[:space:]]+\.\*[[:space:]]+\.\*$' || ok=0
    if [ "$ok" = 1 ]; then
        say rabbitmq "user guest/guest ok on vhost /"
    else
        if rabbitmqctl -q list_users | awk '{print $1}' | grep -qx guest; then
            rabbitmqctl -q change_password guest guest >/dev/null
        else
            rabbitmqctl -q add_user guest guest >/dev/null
            rabbitmqctl -q set_user_tags guest administrator >/dev/null
        fi
        rabbitmqctl -q set_permissions -p / guest '.*' '.*' '.*' >/dev/null
        rabbitmqctl -q authenticate_user guest guest >/dev/null || die "RabbitMQ user guest still cannot authenticate"
        say rabbitmq "repaired user guest/guest on vhost /"
    fi
}

# ---------------------------------------------------------- ffmpeg deps --

ffmpeg_deps() {
    local missing
    missing="$(missing_pkgs "${FFMPEG_PKGS[@]}")"
    if [ -z "$missing" ]; then
        say ffmpeg "build deps installed (${#FFMPEG_PKGS[@]} packages)"
    else
        # shellcheck disable=SC2086  # one package per word
        apt_install $missing
    fi
}

# ----------------------------------------------------------------- garage --

g() { "$GARAGE_BIN" -c "$GARAGE_CONF" "$@"; }
garage_pid() { pid_alive "$GARAGE_PID" garage; }
s3_answers() { curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$S3_PORT/"; }
garage_ready() { garage_pid >/dev/null && s3_answers && g status >/dev/null 2>&1; }

no_garage_build() { ! pgrep -f 'cargo install --locked garage' >/dev/null; }

garage_binary() {
    if [ ! -x "$GARAGE_BIN" ] && ! no_garage_build; then
        say garage "a 'cargo install garage' is already running; waiting for it (up to 30 min)"
        wait_for 1800 no_garage_build || die "timed out waiting for the running cargo install of garage"
    fi
    if [ ! -x "$GARAGE_BIN" ]; then
        [ "$GARAGE_BIN" = "$GARAGE_DEFAULT_BIN" ] || die "GARAGE_BIN=$GARAGE_BIN is not an executable"
        command -v cargo >/dev/null || die "cargo not found: install Rust (rustup) or point GARAGE_BIN at a garage $GARAGE_VERSION binary"
        say garage "building garage $GARAGE_VERSION with cargo install (takes ~7-15 min; log .local/logs/garage-install.log)"
        cargo install --locked garage --version "$GARAGE_VERSION" >"$LOGS/garage-install.log" 2>&1 9>&- \
            || die "cargo install garage failed; see .local/logs/garage-install.log"
    fi
    local v; v="$("$GARAGE_BIN" --version 2>/dev/null | head -n1)"
    case "$v" in
        *" v2."* | *":2."* | *" 2."*) say garage "binary $GARAGE_BIN (${v%% \[*})" ;;
        *) die "$GARAGE_BIN reports '$v'; these scripts need Garage 2.x" ;;
    esac
}

# Render deploy/local/garage.toml.in with this checkout's paths and secrets.
# Sets GARAGE_CONFIG_CHANGED=1 when the rendered file differs from the old one.
GARAGE_CONFIG_CHANGED=0
garage_config() {
    mkdir -p "$GARAGE_DIR/meta" "$GARAGE_DIR/data"
    chmod 700 "$GARAGE_DIR"
    if [ ! -s "$GARAGE_SECRETS" ]; then
        (umask 077; printf 'RPC_SECRET=%s\nADMIN_TOKEN=%s\nMETRICS_TOKEN=%s\n' \
            "$(rand_hex)" "$(rand_hex)" "$(rand_hex)" >"$GARAGE_SECRETS")
    fi
    # shellcheck disable=SC2034  # read via ${!k} below
    local RPC_SECRET ADMIN_TOKEN METRICS_TOKEN
    # shellcheck disable=SC1090
    . "$GARAGE_SECRETS"
    [ -f "$GARAGE_TEMPLATE" ] || die "missing $GARAGE_TEMPLATE"

    local t k v
    t="$(<"$GARAGE_TEMPLATE")"
    for k in GARAGE_DIR RPC_PORT S3_PORT ADMIN_PORT S3_REGION RPC_SECRET ADMIN_TOKEN METRICS_TOKEN; do
        v="${!k}"
        t="${t//"@$k@"/"$v"}"
    done
    [[ "$t" != *@[A-Z_]*@* ]] || die "unfilled placeholder in $GARAGE_TEMPLATE"

    local tmp; tmp="$(mktemp "$GARAGE_DIR/.garage.toml.XXXXXX")"
    printf '%s\n' "$t" >"$tmp"
    if cmp -s "$tmp" "$GARAGE_CONF"; then
        rm -f "$tmp"
        say garage "config .local/garage/garage.toml unchanged"
    else
        mv "$tmp" "$GARAGE_CONF"
        GARAGE_CONFIG_CHANGED=1
        say garage "config .local/garage/garage.toml written"
    fi
}

garage_start() {
    # setsid: own session, so Ctrl-C in the calling terminal does not reach it.
    # 9>&-: do not inherit the stack.lock descriptor.
    NO_COLOR=1 setsid "$GARAGE_BIN" -c "$GARAGE_CONF" server >>"$GARAGE_LOG" 2>&1 </dev/null 9>&- &
    local pid=$!
    echo "$pid" >"$GARAGE_PID"
    say garage "started (pid $pid, log .local/logs/garage.log)"
}

garage_stop() {
    local pid
    pid="$(garage_pid)" || { rm -f "$GARAGE_PID"; return 1; }
    kill -TERM "$pid"
    wait_for 20 pid_gone "$pid" || kill -KILL "$pid" 2>/dev/null || true
    rm -f "$GARAGE_PID"
}

garage_up() {
    local pid
    garage_binary
    garage_config

    if pid="$(garage_pid)"; then
        if [ "$GARAGE_CONFIG_CHANGED" = 1 ]; then
            say garage "config changed; restarting pid $pid"
            garage_stop
            garage_start
        else
            say garage "already running (pid $pid)"
        fi
    else
        rm -f "$GARAGE_PID"
        s3_answers && die "127.0.0.1:$S3_PORT answers but no garage started by this script is running; stop whatever listens there"
        garage_start
    fi
    if ! wait_for 30 garage_ready; then
        tail -n 20 "$GARAGE_LOG" >&2 || true
        die "Garage did not become ready within 30 s (log above: .local/logs/garage.log)"
    fi

    local ver node
    ver="$(g layout show 2>/dev/null | sed -n 's/^Current cluster layout version: \([0-9][0-9]*\).*/\1/p')"
    [ -n "$ver" ] || die "cannot read the Garage cluster layout (garage layout show failed)"
    if [ "$ver" = 0 ]; then
        node="$(g node id -q 2>/dev/null)"; node="${node%%@*}"
        [[ "$node" =~ ^[0-9a-f]{64}$ ]] || die "unexpected output from garage node id: '$node'"
        g layout assign -z dc1 -c 1G "$node" >/dev/null
        g layout apply --version 1 >/dev/null
        say garage "layout: node ${node:0:16} assigned (zone dc1, 1G), applied version 1"
    else
        say garage "layout version $ver already applied"
    fi
    wait_for 30 g health -q >/dev/null 2>&1 || die "Garage cluster not healthy after 30 s (garage -c $GARAGE_CONF health)"

    if g bucket info "$BUCKET" >/dev/null 2>&1; then
        say garage "bucket $BUCKET exists"
    else
        g bucket create "$BUCKET" >/dev/null
        say garage "created bucket $BUCKET"
    fi

    local out
    if out="$(g key info "$KEY_NAME" --key-id 2>&1)"; then
        KEY_ID="$out"
        say garage "key $KEY_NAME exists ($KEY_ID)"
    else
        case "$out" in
            *NoSuchAccessKey* | *"not found"*) ;;
            *) die "garage key info $KEY_NAME failed: $out" ;;
        esac
        g key create "$KEY_NAME" >/dev/null
        KEY_ID="$(g key info "$KEY_NAME" --key-id)"
        say garage "created key $KEY_NAME ($KEY_ID)"
    fi
    SECRET_KEY="$(g key info "$KEY_ID" --secret-key)"
    [[ "$KEY_ID" =~ ^GK[0-9a-f]{24}$ ]] || die "unexpected access key id from garage: '$KEY_ID'"
    [[ "$SECRET_KEY" =~ ^[0-9a-f]{64}$ ]] || die "could not read the secret of key $KEY_NAME"

    if g bucket info "$BUCKET" | grep -Eq "^RWO[[:space:]]+$KEY_ID([[:space:]]|\$)"; then
        say garage "key $KEY_NAME has read/write/owner on $BUCKET"
    else
        g bucket allow --read --write --owner "$BUCKET" --key "$KEY_ID" >/dev/null
        say garage "granted read/write/owner on $BUCKET to $KEY_NAME"
    fi
}

# ------------------------------------------------------------------ clamd --
#
# The official signature database (freshclam) cannot be downloaded here, and
# clamd refuses to start with an empty DatabaseDirectory ("cli_loaddbdir: No
# supported database files found").  It starts fine with only local signature
# files, so infra-up generates two for the EICAR test file: an MD5 hash
# signature of the exact 68-byte file (.hsb) and a body signature that matches
# it anywhere in a stream (.ndb).  clamd reports them as
# `Vid.Test.EICAR-*.UNOFFICIAL FOUND`.

# The EICAR test string, split so this script is not itself a match.
EICAR_A='X5O!P%@AP[4\PZX54(P^)7CC)7}$'
EICAR_B='EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*'

clamd_bin() { command -v clamd 2>/dev/null || { [ -x /usr/sbin/clamd ] && echo /usr/sbin/clamd; }; }
clamd_pid() { pid_alive "$CLAMD_PID" clamd; }
# zPING -> PONG on the TCP socket.
clamd_ping() {
    timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf "zPING\0" >&3 && IFS= read -r -d "" r <&3 && [ "$r" = PONG ]' _ "$CLAMD_PORT" 2>/dev/null
}

# write_if_changed FILE: stdin to FILE unless identical; returns 0 if it changed.
write_if_changed() {
    local tmp; tmp="$(mktemp "$(dirname "$1")/.new.XXXXXX")"
    cat >"$tmp"
    if cmp -s "$tmp" "$1"; then rm -f "$tmp"; return 1; fi
    chmod 644 "$tmp"
    mv "$tmp" "$1"
}

CLAMD_CHANGED=0
clamd_config() {
    mkdir -p "$CLAMD_DB" "$CLAMAV_DIR/tmp"
    local eicar md5 hex
    eicar="$(mktemp)"
    printf '%s%s' "$EICAR_A" "$EICAR_B" >"$eicar"
    md5="$(md5sum "$eicar" | cut -d' ' -f1)"
    hex="$(od -An -vtx1 "$eicar" | tr -d ' \n')"
    [ "$(stat -c %s "$eicar")" = 68 ] && [ "$md5" = 44d88612fea8a8f36de82e1278abb02f ] || die "generated EICAR file is wrong (md5 $md5)"
    rm -f "$eicar"
    # .hsb: md5:size:name (what `sigtool --md5 eicar.com` prints); .ndb: name:target:offset:hex.
    if printf '%s:68:Vid.Test.EICAR-File\n' "$md5" | write_if_changed "$CLAMD_DB/vid-local.hsb"; then CLAMD_CHANGED=1; fi
    if printf 'Vid.Test.EICAR-Body:0:*:%s\n' "$hex" | write_if_changed "$CLAMD_DB/vid-local.ndb"; then CLAMD_CHANGED=1; fi

    local sock_line="LocalSocket $CLAMD_SOCK"
    (( ${#CLAMD_SOCK} < 100 )) || sock_line="# LocalSocket: $CLAMD_SOCK is too long for a unix socket path"
    # MaxFileSize/MaxScanSize = StreamMaxLength: clamd answers "OK" for a
    # stream above MaxFileSize WITHOUT scanning it; equal limits mean every
    # stream clamd accepts is scanned whole.
    if write_if_changed "$CLAMD_CONF" <<EOF
# Generated by scripts/stack.sh infra-up; re-run it instead of editing.
Foreground no
PidFile $CLAMD_PID
LogFile $CLAMD_LOG
LogTime yes
LogFileMaxSize 10M
DatabaseDirectory $CLAMD_DB
TemporaryDirectory $CLAMAV_DIR/tmp
TCPSocket $CLAMD_PORT
TCPAddr 127.0.0.1
$sock_line
LocalSocketMode 660
StreamMaxLength $CLAMD_STREAM_MAX
MaxFileSize $CLAMD_STREAM_MAX
MaxScanSize $CLAMD_STREAM_MAX
MaxThreads 4
SelfCheck 600
EOF
    then CLAMD_CHANGED=1; fi
}

clamd_stop() {
    local pid
    pid="$(clamd_pid)" || { rm -f "$CLAMD_PID"; return 1; }
    kill -TERM "$pid"
    wait_for 20 pid_gone "$pid" || kill -KILL "$pid" 2>/dev/null || true
    rm -f "$CLAMD_PID"
}

clamd_start() {
    local bin; bin="$(clamd_bin)"
    rm -f "$CLAMD_PID"
    # Foreground no: clamd forks, writes PidFile and returns once it listens.
    # setsid: own session; 9>&-: do not inherit the stack.lock descriptor.
    setsid "$bin" -c "$CLAMD_CONF" </dev/null >>"$CLAMD_LOG" 2>&1 9>&- \
        || { tail -n 20 "$CLAMD_LOG" >&2; die "clamd failed to start (log above: .local/logs/clamd.log)"; }
    if ! wait_for 30 clamd_ping; then
        tail -n 20 "$CLAMD_LOG" >&2 || true
        die "clamd not answering PING on 127.0.0.1:$CLAMD_PORT after 30 s (log above: .local/logs/clamd.log)"
    fi
    say clamd "started (pid $(clamd_pid || echo '?'), 127.0.0.1:$CLAMD_PORT, log .local/logs/clamd.log)"
}

clamd_up() {
    if [ -z "$(clamd_bin)" ]; then
        apt_install clamav-daemon
        [ -n "$(clamd_bin)" ] || die "clamav-daemon installed but no clamd binary found"
    fi
    clamd_config
    local pid
    if pid="$(clamd_pid)"; then
        if [ "$CLAMD_CHANGED" = 1 ]; then
            say clamd "config or signatures changed; restarting pid $pid"
            clamd_stop
            clamd_start
        elif clamd_ping; then
            say clamd "already running (pid $pid, 127.0.0.1:$CLAMD_PORT)"
        else
            say clamd "pid $pid not answering; restarting"
            clamd_stop
            clamd_start
        fi
    else
        tcp_open "$CLAMD_PORT" && die "127.0.0.1:$CLAMD_PORT answers but no clamd started by this script is running; stop whatever listens there"
        clamd_start
    fi
}

# -------------------------------------------------------------- stack.env --

write_env() {
    local tmp; tmp="$(mktemp "$LOCAL/.stack.env.XXXXXX")"   # mktemp creates mode 600
    cat >"$tmp" <<EOF
# Generated by scripts/stack.sh infra-up; re-run it instead of editing.
export VID__S3__ENDPOINT='http://127.0.0.1:$S3_PORT'
export VID__S3__REGION='$S3_REGION'
export VID__S3__BUCKET='$BUCKET'
export VID__S3__ACCESS_KEY_ID='$KEY_ID'
export VID__S3__SECRET_ACCESS_KEY='$SECRET_KEY'
export VID__DATABASE__URL='postgres://postgres@$PG_HOST:$PG_PORT/$DB_NAME'
export VID__AMQP__URL='amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2f'
EOF
    if cmp -s "$tmp" "$ENV_FILE"; then
        rm -f "$tmp"
        say env ".local/stack.env unchanged"
    else
        mv "$tmp" "$ENV_FILE"
        say env ".local/stack.env written (mode 600)"
    fi
}

# ------------------------------------------------------------ subcommands --

# Serialise infra-up/infra-down.  Fd 9 holds the lock, so every command that
# may leave a daemon behind (pg_ctlcluster, rabbitmq-server, apt-get, garage)
# runs with 9>&-; otherwise that daemon would hold the lock forever.
lock() {
    exec 9>"$LOCAL/stack.lock"
    flock -w 900 9 || die "another scripts/stack.sh is still running (lock .local/stack.lock)"
}

cmd_infra_up() {
    lock
    postgres_up
    rabbitmq_up
    ffmpeg_deps
    garage_up
    clamd_up
    write_env
    say "done" "infra up in ${SECONDS}s; use: source .local/stack.env"
}

cmd_infra_down() {
    lock
    if garage_stop; then say garage "stopped"; else say garage "not running"; fi
    if clamd_stop; then say clamd "stopped"; else say clamd "not running (or not started by stack.sh)"; fi

    if [ -f "$STARTED/rabbitmq" ]; then
        if tcp_open "$AMQP_PORT" || rmq_ready; then
            rabbitmqctl -q shutdown >/dev/null || die "rabbitmqctl shutdown failed"
            say rabbitmq "stopped"
        else
            say rabbitmq "not running"
        fi
        rm -f "$STARTED/rabbitmq"
    else
        say rabbitmq "not started by stack.sh; left alone"
    fi

    if [ -f "$STARTED/postgresql" ]; then
        local ver; ver="$(<"$STARTED/postgresql")"
        if pg_ready; then
            as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main stop || die "pg_ctlcluster $ver main stop failed"
            say postgres "stopped cluster $ver/main"
        else
            say postgres "not running"
        fi
        rm -f "$STARTED/postgresql"
    else
        say postgres "not started by stack.sh; left alone"
    fi
}

started_note() { if [ -f "$STARTED/$1" ]; then echo " [started by stack.sh]"; fi; }

cmd_status() {
    local rc=0 pid missing
    if pg_ready; then say postgres "running ($PG_HOST:$PG_PORT)$(started_note postgresql)"
    else say postgres "NOT running"; rc=1; fi
    if tcp_open "$AMQP_PORT"; then say rabbitmq "running (127.0.0.1:$AMQP_PORT)$(started_note rabbitmq)"
    else say rabbitmq "NOT running"; rc=1; fi
    if pid="$(garage_pid)" && s3_answers; then say garage "running (pid $pid, http://127.0.0.1:$S3_PORT)"
    elif [ -n "${pid:-}" ]; then say garage "process $pid alive but S3 port $S3_PORT not answering"; rc=1
    else say garage "NOT running"; rc=1; fi
    if pid="$(clamd_pid)" && clamd_ping; then say clamd "running (pid $pid, 127.0.0.1:$CLAMD_PORT)"
    elif [ -n "${pid:-}" ]; then say clamd "process $pid alive but not answering PING on $CLAMD_PORT"; rc=1
    else say clamd "NOT running"; rc=1; fi
    missing="$(missing_pkgs "${FFMPEG_PKGS[@]}" | tr '\n' ' ')"
    if [ -z "$missing" ]; then say ffmpeg "build deps installed"
    else say ffmpeg "MISSING packages: $missing"; rc=1; fi
    if [ -f "$ENV_FILE" ]; then say env ".local/stack.env present"
    else say env ".local/stack.env missing (run infra-up)"; rc=1; fi
    return "$rc"
}

cmd_garage_check() {
    local url="http://127.0.0.1:$S3_PORT/" resp code body
    resp="$(curl -sS --max-time 5 -w '\n%{http_code}' "$url" 2>&1)" \
        || die "no answer from $url ($(grep -m1 '^curl:' <<<"$resp")); is Garage running? try scripts/stack.sh infra-up"
    code="${resp##*$'\n'}"
    body="${resp%$'\n'*}"
    if [[ "$body" == *"<Error>"* && "$body" == *"<Code>"* ]]; then
        say garage-check "OK: $url answered HTTP $code with S3 error $(sed -n 's:.*<Code>\([^<]*\)</Code>.*:\1:p' <<<"$body")"
    else
        die "$url answered HTTP $code but not with an S3 XML error: ${body:0:200}"
    fi
}

usage() {
    sed -n '2,/^set -/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

mkdir -p "$LOGS" "$PIDS" "$STARTED"
case "${1:-}" in
    infra-up) cmd_infra_up ;;
    infra-down) cmd_infra_down ;;
    status) cmd_status || exit 1 ;;
    garage-check) cmd_garage_check ;;
    *) usage ;;
esac
