"""The deploy manifests and the Helm chart of autoheal sync: valid, 2 replicas, least-privilege RBAC that
grants exactly what the Kubernetes adapter calls. helm is not required: the chart's templates use only
plain value lookups, which the test renders with a tiny substitution (and with `helm template` too when
helm is installed)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

from autoheal.config import parse_config  # noqa: E402
from autoheal.k8s_sync.kube import REQUIRED_PERMISSIONS  # noqa: E402

DEPLOY = Path(__file__).resolve().parents[2] / "k8s_sync" / "deploy"
CHART = DEPLOY / "chart" / "autoheal-sync"


def render_chart(release="autoheal-sync", namespace="slurm", overrides=None):
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    values.update(overrides or {})
    text = (CHART / "templates" / "autoheal-sync.yaml").read_text()

    def sub(m):
        expr = m.group(1).strip()
        if expr == ".Release.Name":
            return release
        if expr == ".Release.Namespace":
            return namespace
        if expr.startswith(".Values."):
            return str(values[expr[len(".Values."):]])
        raise AssertionError(f"template uses more than plain lookups: {expr}")

    return list(yaml.safe_load_all(re.sub(r"\{\{(.*?)\}\}", sub, text)))


def static_docs():
    return list(yaml.safe_load_all((DEPLOY / "manifests" / "autoheal-sync.yaml").read_text()))


def granted(docs):
    out = set()
    for d in docs:
        if d["kind"] in ("Role", "ClusterRole"):
            for rule in d["rules"]:
                for g in rule["apiGroups"]:
                    for r in rule["resources"]:
                        for v in rule["verbs"]:
                            out.add((g, r, v))
    return out


@pytest.mark.parametrize("docs", [static_docs(), render_chart()], ids=["manifests", "chart"])
def test_manifests_are_complete_and_least_privilege(docs):
    kinds = {d["kind"] for d in docs}
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap", "Secret",
            "Deployment"} <= kinds
    assert granted(docs) == REQUIRED_PERMISSIONS  # exactly what the adapter calls, nothing more
    cluster = [d for d in docs if d["kind"] == "ClusterRole"][0]
    # cluster-wide only what must be: Nodes, and (remediation) the pods on a Node being replaced + evictions
    assert {r for rule in cluster["rules"] for r in rule["resources"]} <= {"nodes", "nodes/status", "pods",
                                                                          "pods/eviction", "events"}
    pods_verbs = {v for rule in cluster["rules"] if "pods" in rule["resources"] for v in rule["verbs"]}
    assert pods_verbs == {"list"}
    dep = [d for d in docs if d["kind"] == "Deployment"][0]
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    sa = [d for d in docs if d["kind"] == "ServiceAccount"][0]["metadata"]["name"]
    assert pod["serviceAccountName"] == sa
    c = pod["containers"][0]
    assert "--in-cluster" in c["args"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    secret = [d for d in docs if d["kind"] == "Secret"][0]
    env = {e["name"]: e for e in c["env"]}
    assert env["SLURM_JWT"]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    for b in [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]:
        assert b["subjects"][0]["name"] == sa
    # the ConfigMap holds a config autoheal accepts
    cm = [d for d in docs if d["kind"] == "ConfigMap"][0]
    cfg = parse_config(cm["data"]["autoheal.toml"], "configmap")
    assert cfg.sync.in_cluster and cfg.slurm.backend == "rest"


def test_chart_values_flow_into_the_manifests():
    docs = render_chart(release="hpc-sync", namespace="training", overrides={"replicas": 3, "metricsPort": 9999})
    dep = [d for d in docs if d["kind"] == "Deployment"][0]
    assert dep["metadata"]["namespace"] == "training" and dep["spec"]["replicas"] == 3
    assert dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] == 9999
    cfg = parse_config([d for d in docs if d["kind"] == "ConfigMap"][0]["data"]["autoheal.toml"])
    assert cfg.sync.namespace == "training" and cfg.sync.metrics_port == 9999


@pytest.mark.skipif(not shutil.which("helm"), reason="helm not installed (the substitution render above ran)")
def test_helm_template_renders():  # pragma: no cover - only where helm exists
    out = subprocess.run(["helm", "template", "autoheal-sync", str(CHART), "--namespace", "slurm"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert granted(list(yaml.safe_load_all(out))) == REQUIRED_PERMISSIONS
