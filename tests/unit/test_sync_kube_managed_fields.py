"""The adapter drops ``metadata.managedFields`` from everything it reads (lists, watch events, the answers
to its writes): a real API server adds one entry per writer to every object (1.6 kB of a 4.2 kB slurmd
pod, measured on kube-apiserver 1.37), which the sync never reads and its watch caches would hold for
10,000 Nodes and 10,000 pods. Found moving bench_sync_http.py to the real API server (the fake server
wrote no managedFields)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("kubernetes")

from autoheal.k8s_sync.kube import KubeApi

MANAGED = [{"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:status": {"f:conditions": {}}}}]


def obj(name: str) -> dict:
    return {"metadata": {"name": name, "resourceVersion": "7", "managedFields": MANAGED, "labels": {"a": "b"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


class Resp:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, *_args, **_kwargs):
        yield self.data

    def release_conn(self) -> None:
        pass


def api() -> KubeApi:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:1"
    return KubeApi(cfg, connections=12)


def test_lists_and_write_answers_come_without_managed_fields():
    kube = api()
    listed = kube._raw("list_nodes", lambda **kw: Resp(json.dumps({"items": [obj("a"), obj("b")],
                                                                   "metadata": {"resourceVersion": "9"}}).encode()))
    assert [i["metadata"] for i in listed["items"]] == [{"name": n, "resourceVersion": "7", "labels": {"a": "b"}}
                                                        for n in ("a", "b")]
    written = kube._raw("patch_node", lambda *a, **kw: Resp(json.dumps(obj("a")).encode()))
    assert "managedFields" not in written["metadata"] and written["status"]["conditions"][0]["type"] == "Ready"


def test_watch_events_come_without_managed_fields():
    kube = api()
    lines = b"".join(json.dumps({"type": t, "object": obj(n)}).encode() + b"\n" for t, n in
                     (("ADDED", "a"), ("MODIFIED", "b")))
    events = list(kube._watch("watch_nodes", lambda **kw: Resp(lines), resource_version="1", timeout=5))
    assert [(t, o["metadata"]["name"]) for t, o in events] == [("ADDED", "a"), ("MODIFIED", "b")]
    assert all("managedFields" not in o["metadata"] for _, o in events)


def test_the_connection_pool_holds_the_write_pools_connections():
    assert api().api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] >= 12
