#!/usr/bin/env bash
# Benchmark of issue 4, second part: the overhead of the pipeline around the
# transcode, over N small uploads through the real api, transcoder and
# webhook-dispatcher (the e2e harness; the local stack must be up: `make infra`):
#   - webhook `video.ready` received − the transcoder's Succeeded report emitted
#     (report consumer → DB transaction → outbox relay → RabbitMQ → dispatcher → HTTP);
#   - the transcoder's Started report − the 202 of `POST /uploads/{id}/complete`
#     (outbox relay → job queue → worker).
# Report timestamps come from the transcoder's JSON debug log line written just
# before each report is published; webhook arrival is stamped by the receiver.
#
#   N=10 MODE=release scripts/bench-pipeline.sh      (MODE=debug uses target/debug)
set -euo pipefail
cd "$(dirname "$0")/.."
N="${N:-10}"
MODE="${MODE:-release}"
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"

if [[ "$MODE" == release ]]; then
    echo "building the services (release)…" >&2
    cargo build --release -q -p vid-api -p vid-transcoder -p vid-webhook-dispatcher
    # The harness runs <CARGO_TARGET_DIR>/debug/<service>: point a shim's debug/ at release/.
    SHIM="$(mktemp -d /tmp/vid-bench-target-XXXXXX)"
    trap 'rm -rf "$SHIM"' EXIT
    ln -s "$TARGET/release" "$SHIM/debug"
    BINS_TARGET="$SHIM"
else
    cargo build -q -p vid-api -p vid-transcoder -p vid-webhook-dispatcher
    BINS_TARGET="$TARGET"
fi
VID_PROFILE=test target/debug/api storage-setup >/dev/null 2>&1 || true

# The benchmark is an example of the e2e package (tests/e2e/examples/bench-pipeline.rs),
# so `cargo test` never runs it; it is built in debug (it only drives the services).
cargo build -q -p vid-e2e --example bench-pipeline
EXE="$TARGET/debug/examples/bench-pipeline"
[[ -x "$EXE" ]] || { echo "could not build the benchmark ($EXE)" >&2; exit 1; }
CARGO_TARGET_DIR="$BINS_TARGET" VID_BENCH_PIPELINE="$N" "$EXE"
