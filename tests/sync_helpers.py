"""Helpers for the k8s_sync tests: in-memory worlds and seeding an API server (the fake one or the real
control plane) with the lab's nodes."""

from __future__ import annotations

from typing import Dict, Iterable, Optional

from autoheal.config.sync_section import SyncSection
from autoheal.slurm.model import Node

SLURMD_LABELS = {"app.kubernetes.io/component": "slurmd", "app.kubernetes.io/name": "slurmd"}


def sync_cfg(**overrides) -> SyncSection:
    """A SyncSection with rate limits out of the way (tests count writes, not tokens)."""
    base = dict(api_writes_per_second=10000.0, api_write_burst=100000, slurm_writes_per_second=10000.0,
                slurm_write_burst=100000)
    base.update(overrides)
    cfg = SyncSection(**base)
    cfg.validate()
    return cfg


def k8s_name(slurm_name: str) -> str:
    """Kubernetes Node name for a Slurm node in the tests (different on purpose: mapping must work)."""
    return f"k8s-{slurm_name}"


def pod_name(slurm_name: str) -> str:
    return f"slurmd-{slurm_name}"


def memory_world(names: Iterable[str], namespace: str = "slurm"):
    """(MemorySlurm, MemoryKube) with idle Slurm nodes, Nodes named k8s-<n> and slurmd pods."""
    from autoheal_lab.testing.kube import MemoryKube
    from autoheal_lab.testing.slurm import MemorySlurm

    names = list(names)
    slurm = MemorySlurm(Node(n, "IDLE", frozenset(), "", gres="gpu:8") for n in names)
    kube = MemoryKube()
    for n in names:
        kube.add_node(k8s_name(n))
        kube.add_pod(namespace, pod_name(n), k8s_name(n), n, SLURMD_LABELS)
    return slurm, kube


def node_obj(name: str, unschedulable: bool = False, taints=None, conditions=None, annotations=None,
             labels=None, rv: str = "1") -> Dict:
    return {"metadata": {"name": name, "resourceVersion": rv, "annotations": dict(annotations or {}),
                         "labels": dict(labels or {})},
            "spec": {"unschedulable": unschedulable, **({"taints": taints} if taints is not None else {})},
            "status": {"conditions": list(conditions or [])}}


def pod_obj(name: str, node: str, hostname: str, conditions=None, rv: str = "1") -> Dict:
    return {"metadata": {"name": name, "namespace": "slurm", "resourceVersion": rv, "labels": dict(SLURMD_LABELS)},
            "spec": {"nodeName": node, "hostname": hostname}, "status": {"conditions": list(conditions or [])}}


def seed_api(server, slurm_names: Iterable[str], namespace: str = "slurm") -> None:
    """Create Nodes k8s-<n> and slurmd pods (label app.kubernetes.io/component=slurmd, spec.nodeName,
    spec.hostname=<n>) in the lab's API server (a real kube-apiserver), through the real kubernetes client."""
    from kubernetes import client

    api = core_api(server)
    try:
        api.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    real = hasattr(server, "api_client")
    if real:  # ServiceAccount admission refuses pods until the serviceaccount controller made "default"
        from helpers import wait_for

        wait_for(lambda: any(sa.metadata.name == "default" for sa in api.list_namespaced_service_account(
            namespace).items), 30, f"ServiceAccount {namespace}/default")
    for n in slurm_names:
        api.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": k8s_name(n)},
                         "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        api.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name(n), "labels": dict(SLURMD_LABELS)},
            "spec": {"nodeName": k8s_name(n), "hostname": n,
                     "containers": [{"name": "slurmd", "image": "slurmd:lab"}]}})
        if real:  # the kubelet's part (a create ignores a pod's status), posted here
            from autoheal_lab.kubelet import ready_node_status, running_pod_status, without_not_ready_taint

            api.patch_node_status(k8s_name(n), ready_node_status())
            # and the node-lifecycle controller's: the not-ready taint admission gave the new Node goes
            api.patch_node(k8s_name(n), without_not_ready_taint(
                api.api_client.sanitize_for_serialization(api.read_node(k8s_name(n)))))

            api.patch_namespaced_pod_status(pod_name(n), namespace, running_pod_status(
                {"spec": {"containers": [{"name": "slurmd", "image": "slurmd:lab"}]}}))


def _client_config(server, kubeconfig: Optional[str] = None):
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = server.url
    cfg.api_key = {"authorization": "Bearer " + getattr(server, "token", "fake-token")}
    return cfg


def core_api(server):
    """A CoreV1Api for the fake server or a real one (``autoheal_lab.testing.realkube.RealKube``)."""
    from kubernetes import client

    if hasattr(server, "api_client"):
        return client.CoreV1Api(server.api_client())
    return client.CoreV1Api(client.ApiClient(_client_config(server)))
