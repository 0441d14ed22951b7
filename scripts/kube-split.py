#!/usr/bin/env python3
"""Turns a rendered kustomization into what `podman kube play` (4.3) runs.

Usage: kube-split.py RENDERED.yaml OUTDIR

Writes into OUTDIR:
- play.yaml: the ConfigMaps and Deployments, unchanged but for `ports` of
  host-network pods (podman 4.3 would publish them, which host networking
  refuses; the listen addresses come from env, the probes were resolved first);
- migrate-pod.yaml: the Job `vid-migrate`'s pod template as a Pod (podman runs
  no Jobs); tenant-pod.yaml: the same template with `create-tenant` as args;
- secret-NAME.json: each Secret as podman's kube play reads a podman secret
  named NAME for `secretKeyRef`: one JSON object, key -> base64 value;
- probes.tsv: every container's probes (pod, container, probe kind, type,
  path or command, port number with named ports resolved);
- skipped.txt: every other object, by kind and name (what kube play does not run).
Everything comes from the rendered YAML: nothing is written by hand.
"""

import base64
import json
import sys

import yaml

PLAYED = {"ConfigMap", "Deployment"}


def as_pod(job, name, args=None):
    spec = json.loads(json.dumps(job["spec"]["template"]["spec"]))
    if args is not None:
        spec["containers"][0]["args"] = args
    meta = job["spec"]["template"].get("metadata", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": job["metadata"].get("namespace"), "labels": meta.get("labels", {})},
        "spec": spec,
    }


def secret_json(secret):
    data = dict(secret.get("data") or {})
    for key, value in (secret.get("stringData") or {}).items():
        data[key] = base64.b64encode(value.encode()).decode()
    return data


def probes(doc):
    spec = doc["spec"]["template"]["spec"]
    rows = []
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = c.get(kind)
            if not probe:
                continue
            if "httpGet" in probe:
                port = probe["httpGet"]["port"]
                port = ports[port] if isinstance(port, str) else port
                rows.append([doc["metadata"]["name"], c["name"], kind, "http", probe["httpGet"]["path"], str(port)])
            elif "exec" in probe:
                rows.append([doc["metadata"]["name"], c["name"], kind, "exec", json.dumps(probe["exec"]["command"]), "-"])
            else:
                rows.append([doc["metadata"]["name"], c["name"], kind, "other", json.dumps(probe), "-"])
    return rows


def strip_ports(doc):
    """Podman 4.3 turns containerPorts into published ports, which host networking
    refuses; the ports are still what the probes above were resolved against."""
    spec = doc["spec"]["template"]["spec"]
    if spec.get("hostNetwork"):
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            c.pop("ports", None)


def main(rendered, out):
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    play, skipped, rows, jobs = [], [], [], []
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind in PLAYED:
            if kind == "Deployment":
                rows += probes(doc)
                strip_ports(doc)
            play.append(doc)
        elif kind == "Job" and name == "vid-migrate":
            jobs.append(doc)
        elif kind == "Secret":
            json.dump(secret_json(doc), open(f"{out}/secret-{name}.json", "w"))
        else:
            skipped.append(f"{kind}/{name}")
    yaml.safe_dump_all(play, open(f"{out}/play.yaml", "w"), sort_keys=False)
    # A Pod's file carries the ConfigMaps too: kube play resolves configMapRef within the file.
    config_maps = [d for d in play if d["kind"] == "ConfigMap"]
    for job in jobs:
        pod = as_pod(job, "vid-migrate")
        tenant = as_pod(job, "vid-create-tenant", ["create-tenant", "--name", "kube-test"])
        yaml.safe_dump_all(config_maps + [pod], open(f"{out}/migrate-pod.yaml", "w"), sort_keys=False)
        yaml.safe_dump_all(config_maps + [tenant], open(f"{out}/tenant-pod.yaml", "w"), sort_keys=False)
    with open(f"{out}/probes.tsv", "w") as f:
        for r in rows:
            f.write("\t".join(r) + "\n")
    with open(f"{out}/skipped.txt", "w") as f:
        f.write("\n".join(skipped) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
