#!/usr/bin/env bash
# Issue 12 performance: 1,000 concurrent open operation event streams on one
# api process (release build): memory per stream, and the time from a
# committed change to the event being received (p50/p99 over 200 changes).
# Figures only, no assertions. Needs the local stack (`make up`).
# Usage: scripts/bench-watch.sh [streams=1000] [changes=200]
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# 1,000 streams need 1,000+ sockets on each side.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
cargo build --release -p vid-api --bin api --example bench_watch
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
"$TARGET/release/examples/bench_watch" "$TARGET/release/api" "${1:-1000}" "${2:-200}"
