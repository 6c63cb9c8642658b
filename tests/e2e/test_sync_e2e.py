"""Opt-in end-to-end flows of `autoheal sync` against a real Kubernetes cluster (`pytest -m e2e`).

Needs $KUBECONFIG. Real clusters do not let a test invent Nodes, so it uses
an existing Node named by $AUTOHEAL_E2E_NODE (default: the first Node), a Slurm
node simulated in memory (the Kubernetes side is what this suite checks), and a scratch namespace
$AUTOHEAL_E2E_NAMESPACE (default autoheal-e2e) for the Lease and Events. It cordons that Node briefly and
always uncordons it and removes autoheal's taint/condition/annotations at the end.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.e2e

if not os.environ.get("KUBECONFIG"):
    pytest.skip("e2e needs $KUBECONFIG", allow_module_level=True)
kubernetes = pytest.importorskip("kubernetes")

from sync_helpers import sync_cfg  # noqa: E402

from autoheal.k8s_sync.engine import Reconciler  # noqa: E402
from autoheal.k8s_sync.kube import KubeApi  # noqa: E402
from autoheal.reasons import strip_reason_suffix  # noqa: E402
from autoheal.slurm.model import Node  # noqa: E402
from autoheal_lab.testing.slurm import MemorySlurm  # noqa: E402


@pytest.fixture(scope="module")
def real():
    kube = KubeApi.from_settings(os.environ["KUBECONFIG"])
    nodes, _ = kube.list_nodes()
    name = os.environ.get("AUTOHEAL_E2E_NODE") or sorted(nodes)[0]
    ns = os.environ.get("AUTOHEAL_E2E_NAMESPACE", "autoheal-e2e")
    core = kube.core
    try:
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    except kubernetes.client.ApiException as exc:
        if exc.status != 409:
            raise
    slurm = MemorySlurm([Node(name, "IDLE")])
    cfg = sync_cfg(mapping="node-name", namespace=ns, max_k8s_drain_fraction=1.0)
    yield kube, name, slurm, cfg
    # leave the Node as we found it
    kube.patch_node(name, {"spec": {"unschedulable": None},
                           "metadata": {"annotations": {"autoheal.io/slurm-drain-origin": None}}}, "merge")
    node = kube.list_nodes()[0][name]
    taints = [t for t in (node["spec"].get("taints") or []) if t["key"] != cfg.taint_key]
    kube.patch_node(name, {"spec": {"taints": taints}}, "merge")


def test_health_drain_to_condition_and_taint_and_back(real):
    kube, name, slurm, cfg = real
    rec = Reconciler(slurm, kube, cfg)
    slurm.drain(name, "autoheal: xid 79: gpu 0 (e2e)")
    assert rec.run_pass().ok
    node = kube.list_nodes()[0][name]
    assert any(t["key"] == cfg.taint_key for t in node["spec"].get("taints") or [])
    assert any(c["type"] == "GPUHealthy" and c["status"] == "False" for c in node["status"]["conditions"])
    slurm.resume(name)
    assert rec.run_pass().ok
    node = kube.list_nodes()[0][name]
    assert not any(t["key"] == cfg.taint_key for t in node["spec"].get("taints") or [])
    assert not any(c["type"] == "GPUHealthy" for c in node["status"]["conditions"])
    assert rec.run_pass().planned == []


def test_cordon_drains_and_uncordon_resumes(real):
    kube, name, slurm, cfg = real
    rec = Reconciler(slurm, kube, cfg)
    kube.patch_node(name, {"spec": {"unschedulable": True}})
    assert rec.run_pass().ok
    assert strip_reason_suffix(slurm.nodes[name].reason).startswith("autoheal: k8s: node cordoned")
    kube.patch_node(name, {"spec": {"unschedulable": False}})
    assert rec.run_pass().ok
    assert not slurm.nodes[name].drain


def test_lease_roundtrip(real):
    from autoheal.k8s_sync.leader import LeaderElector

    kube, name, slurm, cfg = real
    a = LeaderElector(kube, cfg.namespace, "autoheal-e2e", "a", 5)
    b = LeaderElector(kube, cfg.namespace, "autoheal-e2e", "b", 5)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    a.release()
    assert b.try_acquire_or_renew()
    b.release()
