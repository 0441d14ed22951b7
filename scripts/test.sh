#!/usr/bin/env bash
# `make test`: every test against the real local stack. The Makefile has already
# run `scripts/stack.sh infra-up` and built the binaries (the end-to-end tests
# run them as child processes).
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
source .local/stack.env

# Tests create databases named vidtest_* / receivertest_*; drop those of earlier runs.
drop_test_dbs() {
    psql -h 127.0.0.1 -U postgres -d postgres -Atc \
        "SELECT datname FROM pg_database WHERE datname LIKE 'vidtest\_%' OR datname LIKE 'receivertest\_%'" |
    while read -r db; do
        [ -n "$db" ] && psql -h 127.0.0.1 -U postgres -d postgres -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null
    done
}
drop_test_dbs

# Every test declares its queues under a unique prefix (t<ulid>., receivertest.<ulid>).
# A policy lets RabbitMQ delete them once unused for 5 minutes, so runs never pile
# up hundreds of quorum queues; leftovers of earlier runs are deleted now.
rabbitmqctl -q set_policy --apply-to queues vid-test-queues-expire \
    '^(t[0-9a-z]{26}|receivertest)\.' '{"expires":300000}' >/dev/null
# One `rabbitmqctl eval` deletes them all inside the broker (1,646 queues in 6 s);
# one `rabbitmqctl delete_queue` per queue costs ~4 s each (an Erlang VM start),
# which took more than an hour after a day of runs.
if ! left="$(timeout 300 rabbitmqctl -q eval '
        Re = "^(t[0-9a-z]{26}|receivertest)\\.",
        Qs = [Q || Q <- rabbit_amqqueue:list(<<"/">>), re:run(element(4, amqqueue:get_name(Q)), Re) =/= nomatch],
        [catch rabbit_amqqueue:delete(Q, false, false, <<"vid-test-cleanup">>) || Q <- Qs],
        length(Qs).' 2>&1)"; then
    echo "make test: could not delete the earlier runs' test queues (continuing): $left" >&2
elif [ "$left" != "0" ]; then
    echo "make test: deleted $left test queues of earlier runs"
fi
[ "${1:-}" = "--clean-only" ] && exit 0

VID_PROFILE=test target/debug/api storage-setup >/dev/null
rm -rf .local/test-logs

# Each step runs even when an earlier one failed; the run fails if any did.
failed=()
step() { echo "==> $*"; "$@" || failed+=("$*"); }
# No import circle inside any crate; the api's domain/ and store/ never import routes/
# (crates/vid-modgraph; prints each circle and one way round it).
step cargo run -q -p vid-modgraph
step scripts/validate-deploy.sh
# The api against its own OpenAPI document (schemathesis, bounded; `make fuzz` runs more).
step scripts/fuzz-api.sh
# The console in headless Chromium through Playwright, against the real stack.
[ -x scripts/console-test.sh ] && step scripts/console-test.sh
# The small chaos run (kills, broker and database restarts, receivers down) on its own
# private PostgreSQL and RabbitMQ, so the shared ones are never restarted.
[ -x scripts/chaos.sh ] && step scripts/chaos.sh --small
# The images built with Podman and run as k8s runs them, then the manifests through podman kube play.
step scripts/deploy-test.sh
# One test binary at a time keeps 2 cores from thrashing; tests inside a binary run in parallel.
# Independent parsers of the HLS playlists and the DASH MPD the transcoder writes
# (services/transcoder/tests/stream.rs) and of its storyboard WebVTT (tests/storyboard.rs), and PyJWT minting playback
# tokens nobody here wrote (services/playback/tests/signed.rs), pinned in a venv of their own (first run:
# two small packages from PyPI, a few seconds); a stamp skips pip afterwards.
media_venv() {
    local venv=.local/media-venv want="m3u8==6.0.0 mpegdash==0.4.1 webvtt-py==0.5.1 pyjwt[crypto]==2.10.1"
    if [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$want" ]; then
        rm -rf "$venv" && python3 -m venv "$venv" && "$venv/bin/pip" install -q $want && echo "$want" > "$venv/.stamp"
    fi
}
media_venv || { echo "make test: could not install m3u8/mpegdash into .local/media-venv" >&2; failed+=("media venv"); }
export VID_TEST_PYTHON="$ROOT/.local/media-venv/bin/python"
step cargo test --workspace --no-fail-fast -- --test-threads="${TEST_THREADS:-4}"
if [ "${#failed[@]}" -gt 0 ]; then
    printf 'make test: FAILED step: %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "make test: every step passed"
