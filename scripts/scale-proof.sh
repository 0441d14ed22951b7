#!/usr/bin/env bash
# Scaling proof on one machine (issue 8, item 8).
#
#   scripts/scale-proof.sh
#
# Runs tests/e2e/tests/scaling.rs: the same batch of six uploads against one
# replica of each service, then against TWO replicas of each (api x2 on two
# ports, transcoder x2, webhook-dispatcher x2; one RabbitMQ, one PostgreSQL),
# uploads alternating between the apis, webhooks to a loopback receiver. It
# fails unless both runs end with every operation `succeeded`, every event
# delivered exactly once (one delivery, one attempt, one receipt per
# Webhook-Id), the same per-upload results, both apis and both transcoders
# having done part of the work (each process's own /metrics), and each
# upload's operation id present as `correlation_id` in the JSON logs.
# Needs the local stack (`make up`, or scripts/stack.sh infra-up).
# Output: the test's summary line; logs in .local/test-logs/<prefix>/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ ! -f .local/stack.env ]; then
    echo "scale-proof: .local/stack.env is missing: start the stack first (make up)" >&2
    exit 1
fi
cargo build --bins
exec cargo test -p vid-e2e --test scaling -- --nocapture
