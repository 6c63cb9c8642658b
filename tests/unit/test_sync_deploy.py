"""The deploy manifests and the Helm chart of autoheal sync: complete, 2 replicas, the Slurm token only
by reference to a Secret, TLS and a dedicated Slurm account by default, the metrics port bound where the
values say and fenced by a NetworkPolicy. helm is not required: tests/chart_render.py renders the
chart's template subset (test_sync_rbac.py compares it with `helm template` where helm is installed, and
checks the RBAC per feature setting)."""

from __future__ import annotations

from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

from chart_render import CHART, render  # noqa: E402

from autoheal.config import parse_config  # noqa: E402

DEPLOY = Path(__file__).resolve().parents[2] / "k8s_sync" / "deploy"


def static_docs():
    return [d for d in yaml.safe_load_all((DEPLOY / "manifests" / "autoheal-sync.yaml").read_text()) if d]


def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def sync_config(docs):
    return parse_config(one(docs, "ConfigMap", "autoheal-sync")["data"]["autoheal.toml"], "configmap")


@pytest.mark.parametrize("docs", [static_docs(), render()], ids=["manifests", "chart"])
def test_manifests_are_complete(docs):
    kinds = {d["kind"] for d in docs}
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap", "Deployment",
            "Lease", "Service", "NetworkPolicy"} <= kinds
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    c = pod["containers"][0]
    assert "--in-cluster" in c["args"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    cfg = sync_config(docs)
    assert cfg.sync.in_cluster and cfg.slurm.backend == "rest"
    assert cfg.sync.lease_name == one(docs, "Lease")["metadata"]["name"]  # the Lease the chart creates


@pytest.mark.parametrize("docs", [static_docs(), render()], ids=["manifests", "chart"])
def test_slurm_token_is_a_secret_reference_never_a_value(docs):
    # the token used to be a chart value (slurmToken: helm --set puts it in shell history and the release
    # record) rendered into a Secret of the chart; now the chart only names a Secret the site creates
    assert not [d for d in docs if d["kind"] == "Secret"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values["slurmRest"]) >= {"existingSecret", "tokenKey"} and "slurmToken" not in values
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    vol = {v["name"]: v for v in pod["volumes"]}["token"]
    assert vol["secret"]["secretName"] == values["slurmRest"]["existingSecret"]
    assert vol["secret"]["items"] == [{"key": values["slurmRest"]["tokenKey"], "path": "token"}]
    mount = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}["token"]
    cfg = sync_config(docs)
    assert cfg.slurm.rest_token_file == f"{mount['mountPath']}/token" and mount["readOnly"]
    assert not any("valueFrom" in e and "secretKeyRef" in e["valueFrom"] for e in pod["containers"][0]["env"])


@pytest.mark.parametrize("docs", [static_docs(), render()], ids=["manifests", "chart"])
def test_defaults_are_tls_and_a_dedicated_slurm_account(docs):
    cfg = sync_config(docs)
    assert cfg.slurm.rest_url.startswith("https://") and not cfg.slurm.rest_allow_http
    assert cfg.slurm.rest_user not in ("root", "slurm", "")  # not SlurmUser: docs/security.md


def test_private_ca_and_plain_http_are_explicit_choices():
    docs = render(overrides={"slurmRest": {"caConfigMap": "slurm-ca", "url": "http://restd.slurm.svc:6820",
                                           "allowHttp": True}})
    cfg = sync_config(docs)
    assert cfg.slurm.rest_ca_file == "/etc/autoheal/ca/ca.crt" and cfg.slurm.rest_allow_http
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["ca"]["configMap"]["name"] == "slurm-ca"
    from autoheal.errors import ConfigError

    with pytest.raises(ConfigError, match="clear text to another host"):
        sync_config(render(overrides={"slurmRest": {"url": "http://restd.slurm.svc:6820"}}))


def test_chart_values_flow_into_the_manifests():
    docs = render(release="hpc-sync", namespace="training",
                  overrides={"replicas": 3, "metrics": {"port": 9999, "address": "10.0.0.7",
                                                        "networkPolicy": {"scrapeNamespace": "obs"}}})
    dep = one(docs, "Deployment")
    assert dep["metadata"]["namespace"] == "training" and dep["spec"]["replicas"] == 3
    assert dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] == 9999
    cfg = parse_config(one(docs, "ConfigMap", "hpc-sync")["data"]["autoheal.toml"])
    assert cfg.sync.namespace == "training" and cfg.sync.metrics_port == 9999
    assert cfg.sync.metrics_address == "10.0.0.7"
    assert cfg.sync.lease_name == "hpc-sync" and cfg.sync.breaker_configmap == "hpc-sync-breaker"
    np = one(docs, "NetworkPolicy")
    assert np["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    rule = np["spec"]["ingress"][0]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9999}]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}}}]
    assert np["spec"]["policyTypes"] == ["Ingress"]


def test_network_policy_is_a_toggle():
    assert not [d for d in render(overrides={"metrics": {"networkPolicy": {"enabled": False}}})
                if d["kind"] == "NetworkPolicy"]
