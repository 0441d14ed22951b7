#!/usr/bin/env bash
# The deployment, run (one step of `make test`):
#   1. scripts/ops-kit-check.sh    alert rules and dashboard, offline (promtool)
#   2. scripts/images.sh           the service images from deploy/Dockerfile (Podman; cached)
#   3. scripts/container-test.sh   the images as k8s runs them: e2e, SIGTERM, dependency loss
#   4. scripts/kube-test.sh        k8s/overlays/local through `podman kube play`: e2e
#   5. scripts/compose-test.sh     deploy/docker-compose.yml with podman-compose (override: host network,
#                                  ports 28xxx, local stand-ins): e2e, then down -v (70-90 s warm)
# Each part runs even when an earlier one failed (the container tests need the images).
set -Euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
failed=()
part() {
    local t0=$SECONDS
    echo "--> $*"
    if "$@"; then echo "--> $* passed in $((SECONDS - t0)) s"; else failed+=("$*"); echo "--> $* FAILED after $((SECONDS - t0)) s"; fi
}
part scripts/ops-kit-check.sh
part scripts/images.sh
if [[ " ${failed[*]} " != *" scripts/images.sh "* ]]; then
    part scripts/container-test.sh
    part scripts/kube-test.sh
    part scripts/compose-test.sh
else
    failed+=("container tests (no images)")
fi
if [ "${#failed[@]}" -gt 0 ]; then
    printf 'deploy-test: FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "deploy-test: every part passed"
