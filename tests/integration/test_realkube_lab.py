"""`autoheal lab up --kube` on the real control plane (issue 21): etcd, kube-apiserver and
kube-controller-manager are lab processes with their ports; the sync's Helm chart passes `helm lint` and
`helm template` and is installed with the real `helm install`; `autoheal sync` runs as the chart's
ServiceAccount, every call it makes is allowed, and what it must not do answers 403 from the real RBAC."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request

import pytest

pytest.importorskip("kubernetes")

from click.testing import CliRunner
from helpers import wait_for

from autoheal_lab import controlplane, procs, realkube
from autoheal_lab import kube as labkube
from autoheal_lab.cli import lab as lab_cli

SA_USER = f"system:serviceaccount:{labkube.NAMESPACE}:{realkube.RELEASE}"


@pytest.fixture(scope="module")
def bindir():
    why = controlplane.missing_toolchain()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to build the control plane: {why}")
        pytest.skip(why)
    return controlplane.ensure_binaries()


def _helm(bindir, tmp_path, *args):
    env = dict(os.environ, HELM_CACHE_HOME=str(tmp_path / "c"), HELM_CONFIG_HOME=str(tmp_path / "f"),
               HELM_DATA_HOME=str(tmp_path / "d"))
    return subprocess.run([str(bindir / "helm"), *args], env=env, capture_output=True, text=True, timeout=120)


def test_helm_lint_and_template_of_the_chart(bindir, tmp_path):
    yaml = pytest.importorskip("yaml")
    lint = _helm(bindir, tmp_path, "lint", "--strict", str(realkube.CHART))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    out = _helm(bindir, tmp_path, "template", "hpc-sync", str(realkube.CHART), "--namespace", "training",
                "--include-crds", "--set", "replicas=3")
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    # the sync's objects (its token comes from a Secret the site makes, never from the chart), the Lease it
    # may only get/update, its metrics' NetworkPolicy, the on-call's dashboard; remediation is off by default
    assert kinds == sorted(["CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                            "Role", "Role", "RoleBinding", "RoleBinding", "ConfigMap", "ConfigMap", "Lease",
                            "NetworkPolicy", "Deployment", "Service"]), kinds
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 3 and dep["metadata"]["namespace"] == "training"
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "hpc-sync"
    crd = next(d for d in docs if d["kind"] == "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "nodereplacements.autoheal.io"
    assert "status" in crd["spec"]["versions"][0]["subresources"]


def _sa_call(handle, method, path, body=None):
    """One request to the lab's API server as the chart's ServiceAccount (its token from sync.kubeconfig)."""
    kc = json.loads((handle.root / "kube" / labkube.SYNC_KUBECONFIG).read_text())
    token, cluster = kc["users"][0]["user"]["token"], kc["clusters"][0]["cluster"]
    ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(cluster["server"] + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_sync_runs_as_the_charts_service_account_allowed_everything_it_does_and_nothing_more(lab_factory):
    handle = lab_factory(nodes=2, gpus=2, spares=1, kube=True)
    lab = handle.lab
    res = CliRunner().invoke(lab_cli, ["status", "--dir", str(handle.root), "--json"])
    st = {p["name"]: p for p in json.loads(res.output)["processes"]}
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-api-faults", "kubelet", "sync",
                 "spare-pool"):
        assert st[name]["alive"], (name, st)
    assert st["etcd"]["port"] and st["kube-apiserver"]["port"] and st["kube-api-faults"]["port"]
    # the sync's server is the fault proxy (untouched until told a window), its token the chart's
    sync_kc = json.loads((handle.root / "kube" / labkube.SYNC_KUBECONFIG).read_text())
    assert sync_kc["clusters"][0]["cluster"]["server"] == f"https://127.0.0.1:{st['kube-api-faults']['port']}"
    text = CliRunner().invoke(lab_cli, ["status", "--dir", str(handle.root)]).output
    assert f"port {st['kube-apiserver']['port']}" in text

    # the sync reads and writes (slurmd pod conditions, its Lease) as the ServiceAccount, never refused
    def sync_writes():
        return [r for r in realkube.audit_requests(lab) if r["user"] == SA_USER]

    wait_for(lambda: any(r["path"].endswith("/status") and "/pods/" in r["path"] and r["status"] == 200
                         for r in sync_writes()), 60, "the sync to patch a pod's status as the ServiceAccount")
    # the hooks' replace rung is what the sync acts on (issue 22, section 2)
    handle.adapter(timeout=10).drain("gpu1", "autoheal: replace: xid 79 on gpu 3: fell off the bus")
    wait_for(lambda: any(r["path"].startswith("/apis/autoheal.io/") and r["status"] == 201 for r in sync_writes()),
             60, "the sync's NodeReplacement request")
    refused = [r for r in sync_writes() if r["status"] == 403]
    assert not refused, refused
    assert any(r["method"] == "GET" and r["path"] == "/api/v1/nodes" and r["status"] == 200 for r in sync_writes())
    # no write of the sync came with the lab's admin certificate
    assert not [r for r in realkube.audit_requests(lab) if r["user"] == controlplane.ADMIN_USER
                and "/leases/" in r["path"]]

    # what the ServiceAccount must not do answers 403 from the real RBAC
    ns = labkube.NAMESPACE
    forbidden = {
        "read Secrets": ("GET", f"/api/v1/namespaces/{ns}/secrets/{realkube.RELEASE}-slurm-token", None),
        "list Secrets": ("GET", "/api/v1/secrets", None),
        "exec into a pod": ("POST", f"/api/v1/namespaces/{ns}/pods/slurmd-gpu2/exec?command=id&stdout=true", None),
        "create pods": ("POST", f"/api/v1/namespaces/{ns}/pods",
                        {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
        "delete a pod": ("DELETE", f"/api/v1/namespaces/{ns}/pods/slurmd-gpu2", None),
        "patch another namespace's pod": ("PATCH", "/api/v1/namespaces/kube-system/pods/x/status", {}),
        "replace a Node": ("PUT", "/api/v1/nodes/gpu2", {"metadata": {"name": "gpu2"}}),
        "edit RBAC": ("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                      {"metadata": {"name": "x"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                              "kind": "ClusterRole", "name": "cluster-admin"},
                       "subjects": [{"kind": "User", "name": "x"}]}),
        "write another namespace's ConfigMaps": ("POST", "/api/v1/namespaces/default/configmaps",
                                                 {"metadata": {"name": "x"}}),
    }
    answers = {what: _sa_call(handle, *call) for what, call in forbidden.items()}
    assert answers == dict.fromkeys(forbidden, 403), answers

    recs = {n: r for n, r in lab.records().items() if n in ("etcd", "kube-apiserver", "kube-controller-manager")}
    lab.down()
    assert not [n for n, r in recs.items() if procs.is_alive(r)]


def test_a_missing_crd_is_named_and_the_charts_crd_serves_it(bindir, tmp_path):
    """Regression (found moving to the real server): without the NodeReplacement CRD the real API server
    answers a bare "404 page not found"; the sync's pass was skipped with only that. The fake served the
    resource without a CRD. Now the error names the CRD to install; the chart's CRD makes it served."""
    from kubernetes import client, utils

    from autoheal.k8s_sync.kube import KubeApi, NotFound
    from autoheal_lab.testing.realkube import RealKube

    kube = RealKube.start(tmp_path / "cp", bindir)
    try:
        api = KubeApi.from_settings(kube.kubeconfig)
        with pytest.raises(NotFound) as exc:
            api.list_custom("autoheal.io", "v1alpha1", "slurm", "nodereplacements")
        assert "does not serve nodereplacements.autoheal.io/v1alpha1" in str(exc.value)
        assert "CustomResourceDefinition" in str(exc.value)
        admin = kube.api_client()
        utils.create_from_yaml(admin, str(realkube.CHART / "crds" / "nodereplacements.autoheal.io.yaml"))
        realkube.wait_crds(admin, realkube.CHART_CRDS, 60)
        client.CoreV1Api(admin).create_namespace({"metadata": {"name": "slurm"}})
        assert api.list_custom("autoheal.io", "v1alpha1", "slurm", "nodereplacements") == {}
    finally:
        kube.stop()


def test_lab_up_starts_from_a_clean_etcd_unless_keep_state(lab_factory):
    from kubernetes import client, config

    handle = lab_factory(nodes=1, gpus=1, spares=0, kube=True)
    lab = handle.lab

    def core():
        return client.CoreV1Api(config.new_client_from_config(config_file=str(labkube.kubeconfig_path(lab))))

    def has_marker():
        return "keepme" in [c.metadata.name for c in core().list_namespaced_config_map(labkube.NAMESPACE).items]

    core().create_namespaced_config_map(labkube.NAMESPACE, {"metadata": {"name": "keepme"}})
    opts = dict(nodes=1, gpus=1, spares=0, hooks=False, xid_watch=False, install=False, kube=True)
    lab.down()
    lab.up(keep_state=True, **opts)
    assert has_marker()  # etcd kept: the objects an earlier lab made are there
    assert core().read_node("gpu1").metadata.name == "gpu1"  # registered once, no 409 at the second start
    lab.down()
    lab.up(**opts)
    assert not has_marker()  # a clean start empties etcd
