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
[ "${1:-}" = "--clean-only" ] && exit 0

VID_PROFILE=test target/debug/api storage-setup >/dev/null
rm -rf .local/test-logs

scripts/validate-deploy.sh
# One test binary at a time keeps 2 cores from thrashing; tests inside a binary run in parallel.
cargo test --workspace --no-fail-fast -- --test-threads="${TEST_THREADS:-4}"
