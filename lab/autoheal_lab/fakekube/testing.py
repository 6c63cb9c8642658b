"""Helpers for tests that use the fake API server: object builders, a client factory, fixtures.

Import the fixtures into a test module (``from autoheal_lab.fakekube.testing import fake_kube``)
to get a started server per test; ``kube_api_client(server)`` gives a configured
``kubernetes.client.ApiClient`` (the kubernetes package is imported lazily, the
server itself needs only the standard library).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional

from .server import FakeKubeServer

Obj = Dict[str, Any]


def make_node(name: str, ready: Optional[bool] = True, labels: Optional[Dict[str, str]] = None,
              unschedulable: bool = False, taints: Optional[List[Obj]] = None,
              kubelet_version: str = "v1.32.0") -> Obj:
    """A Node as a kubelet would register it; ``ready=None`` gives an Unknown Ready condition."""
    status_word = "Unknown" if ready is None else ("True" if ready else "False")
    node: Obj = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {},
        "status": {
            "conditions": [{"type": "Ready", "status": status_word,
                            "reason": "KubeletReady" if ready else "KubeletNotReady",
                            "message": "kubelet is posting ready status" if ready else "kubelet stopped posting",
                            "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "addresses": [{"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": kubelet_version, "osImage": "Debian GNU/Linux 12 (bookworm)",
                         "kernelVersion": "6.1.0", "containerRuntimeVersion": "containerd://1.7.0",
                         "architecture": "amd64", "operatingSystem": "linux"},
        },
    }
    if unschedulable:
        node["spec"]["unschedulable"] = True
    if taints:
        node["spec"]["taints"] = list(taints)
    return node


def make_pod(name: str, node: Optional[str] = None, namespace: str = "default",
             labels: Optional[Dict[str, str]] = None, ready: bool = True, phase: str = "Running",
             owner_kind: Optional[str] = "ReplicaSet", owner_name: str = "owner",
             image: str = "busybox:1.36") -> Obj:
    """A running pod bound to ``node``; ``owner_kind=None`` makes an unmanaged pod."""
    pod: Obj = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {"containers": [{"name": "main", "image": image}]},
        "status": {"phase": phase,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                   "containerStatuses": [{"name": "main", "ready": ready, "restartCount": 0, "image": image,
                                          "imageID": "", "started": phase == "Running",
                                          "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]},
    }
    if node:
        pod["spec"]["nodeName"] = node
    if owner_kind:
        pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner_kind, "name": owner_name,
                                               "uid": f"uid-{owner_kind.lower()}-{owner_name}",
                                               "controller": True, "blockOwnerDeletion": True}]
    return pod


def make_pdb(name: str, match_labels: Dict[str, str], namespace: str = "default",
             min_available: Any = None, max_unavailable: Any = None) -> Obj:
    spec: Obj = {"selector": {"matchLabels": dict(match_labels)}}
    if min_available is not None:
        spec["minAvailable"] = min_available
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def kube_api_client(server: FakeKubeServer) -> Any:
    """A ``kubernetes.client.ApiClient`` talking to ``server`` (bearer token included)."""
    from kubernetes import client

    config = client.Configuration()
    config.host = server.url
    config.api_key = {"authorization": f"Bearer {server.token}"}
    return client.ApiClient(config)


def started_server(**kwargs: Any) -> Iterator[FakeKubeServer]:
    server = FakeKubeServer(**kwargs).start()
    try:
        yield server
    finally:
        server.stop()


try:  # fixtures only when pytest is around; the module stays importable without it
    import pytest

    @pytest.fixture
    def fake_kube() -> Iterator[FakeKubeServer]:
        """A started server with short watch bookmarks, stopped after the test."""
        yield from started_server(bookmark_interval=0.2)

    @pytest.fixture
    def fake_kube_config(fake_kube: FakeKubeServer, tmp_path: Any) -> str:
        """Path of a kubeconfig for ``fake_kube`` (for kubectl or ``load_kube_config``)."""
        return fake_kube.write_kubeconfig(str(tmp_path / "kubeconfig"))
except ImportError:  # pragma: no cover
    pass
