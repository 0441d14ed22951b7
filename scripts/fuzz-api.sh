#!/usr/bin/env bash
# Fuzzes the api against its own contract (issue 8, item 7): schemathesis
# (PyPI) reads the served /openapi.json and sends generated requests, valid
# and invalid, with a valid API key; any 5xx or any answer that the document
# does not describe (status, content type, headers, body schema) fails.
#
#   scripts/fuzz-api.sh                      # bounded: 20 examples per operation (make test)
#   FUZZ_EXAMPLES=200 scripts/fuzz-api.sh    # longer (make fuzz)
#   FUZZ_SEED=123 scripts/fuzz-api.sh        # reproduce a run
#   FUZZ_ARGS="--include-path /uploads --output-sanitize false" scripts/fuzz-api.sh
#
# Needs the local stack (`make up`): it runs target/debug/api on a free
# loopback port with a fresh PostgreSQL database and its own RabbitMQ prefix,
# creates a tenant with `api create-tenant`, runs schemathesis, stops the api
# and drops the database. The api runs in a private mount namespace whose
# /etc/resolv.conf points at 127.0.0.1, so the webhook URLs the fuzzer makes
# up are never resolved outside this machine (registration fails with
# `dns_failed`, a documented 422).
#
# Reports (JUnit, NDJSON) and the api log go to .local/fuzz/. schemathesis is
# installed once into .local/fuzz-venv (pinned; a stamp file skips pip later).
# It has a venv of its own: .local/venv holds checkov, whose pins clash.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

EXAMPLES="${FUZZ_EXAMPLES:-20}"
SEED="${FUZZ_SEED:-}"
VENV="$ROOT/.local/fuzz-venv"
OUT="$ROOT/.local/fuzz"
TOOLS=(schemathesis==4.32.5)
die() { printf 'fuzz-api: %s\n' "$*" >&2; exit 1; }

# ------------------------------------------------------------------ tools --
ensure_tools() {
    local stamp="$VENV/.vid-fuzz" want="${TOOLS[*]}"
    if [ -x "$VENV/bin/schemathesis" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    mkdir -p "$ROOT/.local/logs"
    local log="$ROOT/.local/logs/fuzz-install.log"
    if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
        rm -rf "$VENV"
        if ! python3 -m venv "$VENV" >>"$log" 2>&1; then
            rm -rf "$VENV"
            echo "installing python3-venv" >&2
            apt-get update -qq >>"$log" 2>&1
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >>"$log" 2>&1 \
                || die "apt-get install python3-venv failed (see $log)"
            python3 -m venv "$VENV" >>"$log" 2>&1 || die "python3 -m venv failed (see $log)"
        fi
    fi
    echo "installing ${TOOLS[*]} into .local/fuzz-venv (first run only)" >&2
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q "${TOOLS[@]}" >>"$log" 2>&1 \
        || die "pip install failed (see $log)"
    printf '%s\n' "$want" >"$stamp"
}

ensure_tools
[ -f .local/stack.env ] || die "no .local/stack.env: start the stack first (make up)"
# shellcheck disable=SC1091
source .local/stack.env
command -v psql >/dev/null || die "psql not found (the stack installs it)"
command -v unshare >/dev/null || die "unshare not found (util-linux)"

if [ -z "${FUZZ_NO_BUILD:-}" ]; then
    cargo build -q -p vid-api --bin api
fi
API="$ROOT/target/debug/api"

rm -rf "$OUT"
mkdir -p "$OUT"

# ------------------------------------------------------ database and port --
SERVER="${VID__DATABASE__URL%/*}"
DB="vidfuzz_$(date +%s)_$$"
psql -q "$SERVER/postgres" -c "CREATE DATABASE $DB" >/dev/null
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
export VID_PROFILE=test
export VID__DATABASE__URL="$SERVER/$DB"
export VID__AMQP__PREFIX="vidfuzz$$"
export VID__API__LISTEN="127.0.0.1:$PORT"
# No ingest worker or transcoder runs here, so an operation the fuzzer creates
# (POST /ingests) stays pending: its :wait would hold the full minute per
# request. One second still exercises the wait path.
export VID__OPERATIONS__MAX_WAIT_SECONDS=1
export RUST_LOG="${RUST_LOG:-warn,vid_api=info}"

API_PID=""
cleanup() {
    if [ -n "$API_PID" ]; then
        kill "$API_PID" 2>/dev/null || true
        wait "$API_PID" 2>/dev/null || true
    fi
    psql -q "$SERVER/postgres" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT

KEY="$("$API" create-tenant --name fuzz 2>>"$OUT/api.log")"
[[ "$KEY" == vidk_* ]] || die "create-tenant printed no key (see $OUT/api.log)"

printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"$OUT/resolv.conf"
unshare --mount sh -c 'mount --bind "$1" /etc/resolv.conf && exec "$2"' sh "$OUT/resolv.conf" "$API" >>"$OUT/api.log" 2>&1 &
API_PID=$!
BASE="http://127.0.0.1:$PORT"
for _ in $(seq 1 100); do
    curl -fsS "$BASE/healthz" >/dev/null 2>&1 && break
    kill -0 "$API_PID" 2>/dev/null || die "the api exited (see $OUT/api.log)"
    sleep 0.1
done
curl -fsS "$BASE/healthz" >/dev/null || die "the api did not answer on $BASE (see $OUT/api.log)"
curl -fsS "$BASE/openapi.json" -o "$OUT/openapi.json"

# --------------------------------------------------------------- fuzz --
# Checks: every one (including unsupported_method: an undocumented method on
# a documented path must answer 405 with an `Allow` header, which the api
# does as a `method_not_allowed` problem) except those scripts/fuzz-api.toml
# turns off, each with its reason there.
echo "fuzzing $BASE/openapi.json: $EXAMPLES examples per operation${SEED:+, seed $SEED}" >&2
set +e
"$VENV/bin/schemathesis" --config-file "$ROOT/scripts/fuzz-api.toml" run "$BASE/openapi.json" \
    --header "Authorization: Bearer $KEY" \
    --max-examples "$EXAMPLES" ${SEED:+--seed "$SEED"} \
    --workers 1 --request-timeout 70 --max-redirects 0 \
    --report junit,ndjson --report-dir "$OUT" \
    --output-sanitize true --no-color ${FUZZ_ARGS:-} 2>&1 | tee "$OUT/schemathesis.txt"
RC=${PIPESTATUS[0]}
set -e

# One recorded response per request sent; the status histogram shows how deep it got.
STATUSES="$(cat "$OUT"/*.ndjson 2>/dev/null | grep -o '"status_code":[0-9]*' | cut -d: -f2 | sort | uniq -c | sort -rn | awk '{printf "%s%s×%s", (NR>1?", ":""), $2, $1}')"
REQUESTS="$(cat "$OUT"/*.ndjson 2>/dev/null | grep -o '"status_code":[0-9]*' | wc -l)"
echo "fuzz-api: $REQUESTS requests ($STATUSES); schemathesis exit $RC; reports in .local/fuzz/" >&2
exit "$RC"
