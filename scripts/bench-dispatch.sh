#!/usr/bin/env bash
# Benchmark of issue 5 ("Performance"): webhook-dispatcher throughput in
# deliveries/s (event published → 2xx received at a fast receiver on
# 127.0.0.1) as a ratio to wrk's requests/s against the SAME receiver, in the
# same run; p50/p99 publish → receipt latency in a burst and when paced at half
# the measured throughput, and the CPU time a delivery costs PostgreSQL,
# RabbitMQ and the bench's own process in each phase (from /proc; Linux).
# Figures only, nothing asserted. Loopback only; the local stack must be up
# (`make infra`).
#
#   EVENTS=4000 ENDPOINTS=1 PER_ENDPOINT_CONCURRENCY=64 WRK_DURATION=10s scripts/bench-dispatch.sh
# (also BATCH_SIZE, MAX_IN_FLIGHT, PREFETCH, POOL_SIZE, PUBLISH_CONCURRENCY,
#  PLAN_CACHE_MODE, LEASE_AT_FANIN, REPLICAS (dispatchers in one process, sharing the queue and
#  the database as replicas do), WRK_THREADS, WRK_CONNECTIONS, BENCH_DISPATCH_BIN). Fan-out (one
#  event to 100 endpoints of one tenant): ENDPOINTS=100 EVENTS=400. Figures and
#  their reading: BENCHMARKS.md, "Webhook dispatcher throughput".
set -Eeuo pipefail
cd "$(dirname "$0")/.."
WRK_THREADS="${WRK_THREADS:-2}"
WRK_CONNECTIONS="${WRK_CONNECTIONS:-32}"
WRK_DURATION="${WRK_DURATION:-10s}"

if ! command -v wrk >/dev/null; then
    echo "installing wrk (Debian package)…" >&2
    if [[ $(id -u) -eq 0 ]]; then apt-get install -y -q wrk >&2; else sudo apt-get install -y -q wrk >&2; fi
fi
# BENCH_DISPATCH_BIN: a bench_dispatch built elsewhere (e.g. two builds compared A/B in one session).
if [[ -n "${BENCH_DISPATCH_BIN:-}" ]]; then
    BIN="$BENCH_DISPATCH_BIN"
else
    echo "building bench_dispatch (release)…" >&2
    cargo build --release -q -p vid-webhook-dispatcher --example bench_dispatch
    BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/examples/bench_dispatch"
fi

LUA="$(mktemp /tmp/vid-bench-dispatch-XXXXXX.lua)"
trap 'rm -f "$LUA"' EXIT
# ~200-byte JSON body, the size of a `video.ready` event; a Webhook-Id header so
# the receiver does the same work as for the dispatcher's requests.
cat >"$LUA" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Webhook-Id"] = "evt_01jbenchwrk0000000000000000"
wrk.body = '{"id":"evt_01jbenchwrk0000000000000000","type":"video.ready","created":1730000000,"data":{"video_id":"vid_01jbenchwrk000000000000000","operation_id":"op_01jbenchwrk0000000000000000","version":2}}'
LUA

# The bench binary starts the receiver, prints its URL, waits for wrk's figure
# on stdin, then runs the dispatcher measurements against the same receiver.
coproc BENCH { "$BIN"; }
BENCH_PID_SAVED="$BENCH_PID"
read -r tag URL <&"${BENCH[0]}"
[[ "$tag" == RECEIVER_URL ]] || { echo "unexpected first line from bench_dispatch: $tag $URL" >&2; exit 1; }
echo "receiver: $URL"
echo "wrk -t$WRK_THREADS -c$WRK_CONNECTIONS -d$WRK_DURATION (POST, $(grep -o "'.*'" "$LUA" | wc -c) -byte body):"
WRK_OUT="$(wrk -t"$WRK_THREADS" -c"$WRK_CONNECTIONS" -d"$WRK_DURATION" --latency -s "$LUA" "$URL")"
echo "$WRK_OUT" | sed 's/^/    /'
RPS="$(echo "$WRK_OUT" | awk '/^Requests\/sec:/ {print $2}')"
echo "${RPS:-}" >&"${BENCH[1]}"
cat <&"${BENCH[0]}"
wait "$BENCH_PID_SAVED"
