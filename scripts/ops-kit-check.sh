#!/usr/bin/env bash
# The operators' kit (k8s/monitoring/), validated offline (part of `make test`):
#   1. the PrometheusRule's groups pass `promtool check rules` and the unit tests
#      of k8s/monitoring/rules-test.yaml (`promtool test rules`): each alert fires
#      on series that should fire it and stays silent otherwise;
#   2. every Grafana panel query is valid PromQL (checked by promtool as a
#      recording rule) and names only metrics that exist: ours (the list in
#      crates/vid-infra/src/metrics.rs, which its tests keep true) or RabbitMQ's
#      rabbitmq_prometheus plugin (names as its documentation gives them);
#   3. the kustomization renders (the dashboard ConfigMap and the rule).
# promtool comes from Debian's `prometheus` package (installed when missing;
# only the binary is used, no Prometheus server is started).
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# kubectl from the machine, else the one scripts/validate-deploy.sh installs (it runs first in make test).
KUBECTL="$(command -v kubectl || echo "$ROOT/.local/venv/bin/kubectl")"
# A python3 with PyYAML: the machine's, else validate-deploy's venv.
PY=python3; python3 -c "import yaml" 2>/dev/null || PY="$ROOT/.local/venv/bin/python"
KIT=k8s/monitoring
OUT=.local/ops-kit
mkdir -p "$OUT"
if ! command -v promtool >/dev/null; then
    echo "ops-kit: installing promtool (Debian package prometheus)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    # The package starts a server where systemd runs; the kit needs only promtool.
    if command -v systemctl >/dev/null && systemctl is-active -q prometheus 2>/dev/null; then
        systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
fi

"$PY" - "$KIT" "$OUT" <<'PY'
import json, re, sys, yaml
kit, out = sys.argv[1], sys.argv[2]
rule = yaml.safe_load(open(f"{kit}/prometheusrule.yaml"))
assert rule["kind"] == "PrometheusRule", rule["kind"]
yaml.safe_dump(rule["spec"], open(f"{out}/vid-rules.yaml", "w"), sort_keys=False)

dash = json.load(open(f"{kit}/grafana-dashboard.json"))
doc = open("crates/vid-infra/src/metrics.rs").read()
ours = set(re.findall(r"`([a-z_]+)(?:\{[^`]*\})?`", doc.split("Metric names in use")[1].split("use std::")[0]))
# rabbitmq_prometheus per-object queue metrics, as its documentation names them.
rabbit = {"rabbitmq_queue_messages", "rabbitmq_queue_messages_ready", "rabbitmq_queue_messages_unacked",
          "rabbitmq_queue_consumers"}
subst = {"$__rate_interval": "5m", "$namespace": ".*", "$vhost": "/", "$prefix": "vid"}
rules, bad = [], []
for p in dash["panels"]:
    assert p.get("targets"), f"panel {p['title']!r} has no query"
    for t in p["targets"]:
        expr = t["expr"]
        for k, v in subst.items():
            expr = expr.replace(k, v)
        rules.append({"record": f"dashboard:panel{p['id']}:{t['refId'].lower()}", "expr": expr})
        for name in set(re.findall(r"\b([a-z_]+)\s*(?=\{|\[)", expr)):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if base not in ours and name not in rabbit:
                bad.append(f"panel {p['title']!r}: unknown metric {name}")
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(f"{out}/dashboard-queries.yaml", "w"), sort_keys=False)
if bad:
    sys.exit("ops-kit: " + "\n".join(bad))
print(f"ops-kit: dashboard: {len(dash['panels'])} panels, {len(rules)} queries, every metric known")
PY
cp "$KIT/rules-test.yaml" "$OUT/rules-test.yaml"
(cd "$OUT" && promtool check rules vid-rules.yaml dashboard-queries.yaml && promtool test rules rules-test.yaml)
"$KUBECTL" kustomize "$KIT" >"$OUT/rendered.yaml"
grep -q '^kind: PrometheusRule' "$OUT/rendered.yaml" && grep -q 'grafana_dashboard: "1"' "$OUT/rendered.yaml"
echo "ops-kit: OK (promtool $(promtool --version 2>&1 | head -1 | awk '{print $3}'))"
