"""The watch caches keep only what the sync's steps read of each object (``informer.slim_node``,
``slim_pod``), and lists arrive page by page, each page slimmed as it comes: on the real API server a
slurmd pod is 16 kB once parsed (volumes, tolerations, container statuses the admission plugins and the
kubelet add) and 10,000 of them, with 10,000 Nodes, took the sync to 558 MB (bench_sync_http.py; the
fake server's objects were a quarter of that). Planning on slim objects must plan exactly what planning
on whole objects plans."""

from __future__ import annotations

import copy
import json

import pytest
from sync_helpers import sync_cfg

from autoheal.k8s_sync.informer import Informer, slim_node, slim_pod
from autoheal.k8s_sync.plan import Snapshot
from autoheal.k8s_sync.steps import plan
from autoheal.slurm.model import Node

NOW = "2026-12-02T04:00:00Z"


def real_node(name: str, **spec) -> dict:
    """A Node as kube-apiserver 1.37 serves one a kubelet registered (images, addresses, node info)."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "41", "labels": {
                "kubernetes.io/hostname": name}, "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
            "spec": {"podCIDR": "10.1.0.0/24", **spec},
            "status": {"capacity": {"cpu": "96", "memory": "2063731484Ki", "nvidia.com/gpu": "8", "pods": "110"},
                       "allocatable": {"cpu": "95", "nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "lastHeartbeatTime": NOW, "lastTransitionTime": NOW},
                                      {"type": "GpuHealthy", "status": "False", "reason": "NPD"}],
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
                       "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                       "nodeInfo": {"kubeletVersion": "v1.37.2", "osImage": "Ubuntu 24.04"},
                       "images": [{"names": [f"registry/img{i}@sha256:{i:064d}"], "sizeBytes": 10 ** 9}
                                  for i in range(30)]}}


def real_pod(node: str, slurm: str, conditions=()) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"slurmd-{slurm}", "namespace": "slurm", "resourceVersion": "42",
                         "labels": {"app.kubernetes.io/component": "slurmd"},
                         "ownerReferences": [{"kind": "NodeSet", "name": "gpu", "uid": "u", "controller": True}]},
            "spec": {"nodeName": node, "hostname": slurm, "serviceAccountName": "default",
                     "volumes": [{"name": "kube-api-access", "projected": {"sources": [
                         {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}],
                     "containers": [{"name": "slurmd", "image": "slurmd:25.05", "volumeMounts": [
                         {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
                     "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                      "effect": "NoExecute", "tolerationSeconds": 300}]},
            "status": {"phase": "Running", "qosClass": "BestEffort", "podIP": "10.1.0.5",
                       "conditions": [{"type": "Ready", "status": "True"}, *conditions],
                       "containerStatuses": [{"name": "slurmd", "ready": True, "restartCount": 0,
                                              "state": {"running": {"startedAt": NOW}}}]}}


def world():
    stale = {"type": "SlurmNodeStateIdle", "status": "True", "reason": "Idle", "lastTransitionTime": NOW}
    nodes = {"k1": real_node("k1"), "k2": real_node("k2", unschedulable=True),
             "k3": real_node("k3", taints=[{"key": "nvidia.com/gpu-error", "effect": "NoSchedule"}]),
             "k4": real_node("k4", taints=[{"key": "autoheal.io/gpu-unhealthy", "value": "XID79",
                                            "effect": "NoSchedule"}])}
    pods = {f"slurmd-s{i}": real_pod(f"k{i}", f"s{i}", [stale] if i == 2 else []) for i in range(1, 5)}
    slurm = {"s1": Node("s1", "IDLE", frozenset({"DRAIN"}), "autoheal: xid 79 on GPU 3: fallen off the bus"),
             "s2": Node("s2", "ALLOCATED", frozenset(), ""), "s3": Node("s3", "MIXED", frozenset(), ""),
             "s4": Node("s4", "IDLE", frozenset(), "")}
    return slurm, nodes, pods


def described(planned):
    return {step: [(a.kind, a.target, a.patch_type, json.dumps(a.body, sort_keys=True), a.reason) for a in acts]
            for step, acts in planned.items()}


@pytest.mark.parametrize("mapping", ["pod", "node-name"])
def test_planning_on_slim_objects_plans_what_planning_on_whole_objects_plans(mapping):
    cfg = sync_cfg(drain_on_taints=["nvidia.com/gpu-error:NoSchedule"], drain_on_conditions=["GpuHealthy=False"],
                   mapping=mapping)
    slurm, nodes, pods = world()
    if mapping == "node-name":
        slurm = {n.replace("s", "k"): Node(n.replace("s", "k"), x.state, x.flags, x.reason) for n, x in slurm.items()}
    full = plan(Snapshot(slurm, copy.deepcopy(nodes), copy.deepcopy(pods), NOW), cfg)
    slim = plan(Snapshot(slurm, {k: slim_node(v) for k, v in nodes.items()},
                         {k: slim_pod(v) for k, v in pods.items()}, NOW), cfg)
    assert described(slim[0]) == described(full[0]) and slim[1] == full[1]
    assert sum(len(a) for a in full[0].values()) >= 4  # the world gives every step work


def test_slim_objects_are_a_fraction_of_whole_ones_and_keep_what_is_read():
    node, pod = real_node("k1", unschedulable=True), real_pod("k1", "s1")
    assert len(json.dumps(slim_node(node))) < len(json.dumps(node)) / 3
    assert len(json.dumps(slim_pod(pod))) < len(json.dumps(pod)) / 2
    assert slim_pod(pod)["spec"] == {"nodeName": "k1", "hostname": "s1"}
    assert slim_pod(pod)["status"]["phase"] == "Running" and slim_pod(pod)["metadata"] == pod["metadata"]
    assert slim_node(node)["spec"] == node["spec"] and slim_node(node)["metadata"] == node["metadata"]
    assert slim_node(node)["status"] == {"conditions": node["status"]["conditions"]}


def test_the_cache_slims_watch_events_and_our_own_writes():
    events = [("ADDED", real_pod("k1", "s1")), ("MODIFIED", real_pod("k2", "s2"))]
    inf = Informer("pods", lambda: ({}, "1"), lambda rv, t: iter(events), transform=slim_pod)
    inf.relist()
    for etype, obj in events:
        inf._apply(etype, obj)
    kept = inf.update({**real_pod("k3", "s3")})
    assert kept == slim_pod(real_pod("k3", "s3"))
    assert all(set(p["spec"]) == {"nodeName", "hostname"} for p in inf.snapshot().values())
    assert sorted(inf.snapshot()) == ["slurmd-s1", "slurmd-s2", "slurmd-s3"]


class Pages:
    """A list endpoint serving ``items`` ``limit`` at a time with continue tokens."""

    def __init__(self, items):
        self.items, self.calls = items, []

    def __call__(self, *args, limit=None, _continue=None, **kwargs):
        self.calls.append((limit, _continue))
        start = int(_continue or 0)
        page = self.items[start:start + limit]
        more = start + limit < len(self.items)
        data = {"metadata": {"resourceVersion": "100" if not _continue else "999",
                             **({"continue": str(start + limit)} if more else {})}, "items": page}

        class Resp:
            def __init__(self, d):
                self.data = json.dumps(d).encode()
        return Resp(data)


def test_lists_come_page_by_page_slimmed_as_they_arrive(monkeypatch):
    pytest.importorskip("kubernetes")
    from kubernetes import client

    from autoheal.k8s_sync import kube as K

    monkeypatch.setattr(K, "LIST_PAGE", 3)
    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:1"
    api = K.KubeApi(cfg)
    pager = Pages([real_pod(f"k{i}", f"s{i}") for i in range(8)])
    seen = []

    def slim(obj):
        seen.append(len(pager.calls))  # which page was being read when the object was slimmed
        return slim_pod(obj)

    items, rv = api._list("list_pods", pager, "slurm", transform=slim)
    assert [c[0] for c in pager.calls] == [3, 3, 3] and [c[1] for c in pager.calls] == [None, "3", "6"]
    assert rv == "100"  # the snapshot's resourceVersion is the first page's: the watch starts there
    assert sorted(items) == sorted(f"slurmd-s{i}" for i in range(8))
    assert seen == [1, 1, 1, 2, 2, 2, 3, 3]
    assert all(set(p["spec"]) == {"nodeName", "hostname"} for p in items.values())
