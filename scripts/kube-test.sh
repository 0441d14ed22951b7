#!/usr/bin/env bash
# The Kubernetes manifests, run: k8s/overlays/local rendered with kustomize,
# played with `podman kube play`, and the walking skeleton passed through the
# pods. Part of `make test` (after scripts/container-test.sh).
#
# - A run-specific kustomization layered on the local overlay adds what a
#   cluster operator adds: the Secret vid-secrets (secretGenerator), this run's
#   database and AMQP prefix, and clamd's port on the shared loopback.
# - scripts/kube-split.py turns the rendered YAML into what podman 4.3 runs:
#   ConfigMaps + Deployments as they are; the migration Job's pod template as a
#   Pod; each Secret as a podman secret (kube play's secretKeyRef source).
# - Probes as written: podman would turn httpGet probes into `curl` inside the
#   image (which has no curl, on purpose) and runs healthchecks only under
#   systemd, so this script drives every probe of the rendered YAML itself: the
#   httpGet path on the port the probe names, the exec command in its container.
# - securityContext as written: uid, read-only root, no capabilities, checked
#   inside each running container.
set -Eeuo pipefail
shopt -s inherit_errexit
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# kubectl from the machine, else the one scripts/validate-deploy.sh installs (it runs first in make test).
KUBECTL="$(command -v kubectl || echo "$ROOT/.local/venv/bin/kubectl")"
# A python3 with PyYAML: the machine's, else validate-deploy's venv.
PY=python3; python3 -c "import yaml" 2>/dev/null || PY="$ROOT/.local/venv/bin/python"
# shellcheck source=scripts/podman-env.sh
source scripts/podman-env.sh
# shellcheck disable=SC1091
source .local/stack.env
CT_API_PORT=18180 CT_RECEIVER_PORT=19010
# shellcheck source=scripts/deploy-lib.sh
source scripts/deploy-lib.sh
RUN="$ROOT/.local/kube-test/run"
START=$SECONDS

cleanup() {
    local s
    [ -f "$RUN/play.yaml" ] && podman kube down "$RUN/play.yaml" >/dev/null 2>&1 || true
    for p in vid-migrate vid-create-tenant; do
        podman logs "$p-migrate" >"$CT_LOGS/kube-$p.log" 2>&1 || true
        podman pod rm -f "$p" >/dev/null 2>&1 || true
    done
    for s in $(podman secret ls --format '{{.Name}}' | grep '^vid-secrets' || true); do podman secret rm "$s" >/dev/null; done
    ct_cleanup_shared
}
trap cleanup EXIT

render() {
    rm -rf "$RUN"; mkdir -p "$RUN"
    sed 's/^TCPSocket 3310$/TCPSocket 13310/' k8s/base/clamd.conf >"$RUN/clamd.conf"
    grep -q '^TCPSocket 13310$' "$RUN/clamd.conf" || ct_fail "k8s/base/clamd.conf has no 'TCPSocket 3310' line to move"
    cat >"$RUN/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: vid-local
resources:
  - ../../../k8s/overlays/local
configMapGenerator:
  - name: vid-config
    behavior: merge
    literals:
      - VID__AMQP__PREFIX=$CT_PREFIX
  - name: vid-clamd
    behavior: replace
    files:
      - clamd.conf
secretGenerator:
  - name: vid-secrets
    literals:
      - database-url=postgres://postgres@127.0.0.1:5432/$CT_DB
      - keda-database-url=postgres://postgres@127.0.0.1:5432/$CT_DB
      - amqp-url=amqp://guest:guest@127.0.0.1:5672/%2f
      - s3-access-key-id=$VID__S3__ACCESS_KEY_ID
      - s3-secret-access-key=$VID__S3__SECRET_ACCESS_KEY
      - webhooks-secret-key=$(printf 'kube-test-%s' "$CT_ID" | sha256sum | cut -c1-64)
EOF
    "$KUBECTL" kustomize "$RUN" >"$RUN/rendered.yaml"
    "$PY" scripts/kube-split.py "$RUN/rendered.yaml" "$RUN"
    local f name
    for f in "$RUN"/secret-*.json; do
        name="$(basename "$f" .json)"; name="${name#secret-}"
        podman secret create "$name" "$f" >/dev/null
    done
    ct_log "rendered $(grep -c '^kind:' "$RUN/rendered.yaml") objects; played: ConfigMaps, Deployments, the migrate Job as a Pod; not run by podman: $(tr '\n' ' ' <"$RUN/skipped.txt")"
}

# play_pod FILE POD: plays a one-container Pod and waits for it to exit 0.
play_pod() {
    podman kube play "$1" >>"$CT_LOGS/kube-play.log" 2>&1 || ct_fail "podman kube play $1: $(tail -5 "$CT_LOGS/kube-play.log")"
    local c="$2-${3:-migrate}" deadline=$((SECONDS + 180))
    while [ "$(podman inspect -f '{{.State.Status}}' "$c")" != exited ]; do
        (( SECONDS < deadline )) || ct_fail "$c did not finish: $(podman logs "$c" 2>&1 | tail -5)"
        sleep 0.5
    done
    [ "$(podman inspect -f '{{.State.ExitCode}}' "$c")" = 0 ] || ct_fail "$c failed: $(podman logs "$c" 2>&1 | tail -5)"
}

# check_probes: every probe of the rendered Deployments passes as written.
check_probes() {
    local deadline=$((SECONDS + 180)) pod ctr kind type target port failing
    while :; do
        failing=""
        while IFS=$'\t' read -r pod ctr kind type target port; do
            case "$type" in
                http) [ "$(ct_status "http://127.0.0.1:$port$target")" = 200 ] || failing+=" $pod/$ctr:$kind" ;;
                exec) mapfile -t cmd < <(jq -r '.[]' <<<"$target")
                      podman exec "$pod-pod-0-$ctr" "${cmd[@]}" >/dev/null 2>&1 || failing+=" $pod/$ctr:$kind" ;;
                *) ct_fail "$pod/$ctr: $kind of a type this test cannot drive: $target" ;;
            esac
        done <"$RUN/probes.tsv"
        [ -z "$failing" ] && break
        (( SECONDS < deadline )) || ct_fail "probes still failing after 180 s:$failing"
        sleep 1
    done
    ct_log "every probe of the rendered Deployments passes ($(wc -l <"$RUN/probes.tsv") probes)"
}

# check_security: each container runs with the securityContext the YAML asks for.
check_security() {
    local c uid want
    for c in $(podman ps --format '{{.Names}}' | grep -E '^vid-.*-pod-0-'); do
        want=10001; [[ "$c" == *-clamd ]] && want=100
        uid="$(podman exec "$c" id -u)"
        [ "$uid" = "$want" ] || ct_fail "$c runs as uid $uid, want $want"
        podman exec "$c" bash -c 'echo x >/usr/local/probe' 2>/dev/null && ct_fail "$c can write its root filesystem"
        [ "$(podman exec "$c" awk '/^CapEff/ {print $2}' /proc/self/status)" = 0000000000000000 ] || ct_fail "$c has capabilities"
    done
    ct_log "containers: non-root (10001, clamd 100), read-only root, no capabilities"
}

[ -x target/debug/webhook-receiver ] || ct_fail "target/debug/webhook-receiver missing: run make build"
ct_databases
render
play_pod "$RUN/migrate-pod.yaml" vid-migrate
ct_log "migration Job (as a Pod): $(podman logs vid-migrate-migrate 2>/dev/null | tail -n1)"
play_pod "$RUN/tenant-pod.yaml" vid-create-tenant
CT_KEY="$(podman logs vid-create-tenant-migrate 2>/dev/null | tail -n1)"
[ -n "$CT_KEY" ] || ct_fail "create-tenant printed no key"
timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/13310' 2>/dev/null && ct_fail "127.0.0.1:13310 is taken: the pod's clamd must be the only one there"
# Podman logs that it cannot install healthcheck timers without systemd: expected here (see above).
podman kube play "$RUN/play.yaml" >"$CT_LOGS/kube-play.log" 2>&1 || ct_fail "podman kube play: $(tail -5 "$CT_LOGS/kube-play.log")"
check_probes
check_security
ct_endpoint_and_receiver
OP="$(ct_upload)"
ct_log "upload complete through the vid-api pod: 202, Location /operations/$OP"
ct_wait_op "$OP" succeeded 300
VIDEO="$(ct_video_of "$OP")"
SCAN="$(ct_api GET "/operations/$OP" | ct_body | jq -r .metadata.scan)"
[ "$SCAN" = clean ] || ct_fail "the source was not scanned by the pod's clamd (metadata.scan: $SCAN)"
ct_ready_webhook "$VIDEO" 120
ct_log "transcoded in the vid-transcoder pod (scanned by its clamd container); the receiver verified the signed video.ready for $VIDEO"
echo "kube-test: OK in $((SECONDS - START)) s"
