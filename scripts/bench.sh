#!/usr/bin/env bash
# `make bench`: every benchmark, in release mode, each printing its figures as
# ratios to a baseline measured in the same run. No benchmark asserts a time.
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck disable=SC1091
source .local/stack.env
cargo build --release --workspace --bins
echo "== uploads: POST /uploads latency and presigning cost (issue 3)"
target/release/bench-uploads
for b in scripts/bench-*.sh; do
    [ -x "$b" ] || continue
    echo
    echo "== $(basename "$b" .sh)"
    "$b"
done
