"""The in-memory Kubernetes the tests and benches share, behind ``KubeClient`` as ``KubeApi`` is: for the
sync tests, the property test and the 10,000-node benchmark (no sockets, so they measure our code).
Its Slurm counterpart is ``autoheal_lab.testing.slurm.MemorySlurm``.

``MemoryKube`` keeps dicts with resourceVersions (409 on a stale one), merges ``status.conditions`` by
type on strategic merge patches, replaces other lists, and deletes keys set to null on merge patches.
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

from autoheal.k8s_sync.kube import Conflict, KubeError, NotFound


def _merge(target: Any, patch: Any, strategic: bool) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif key == "conditions" and strategic and isinstance(value, list):
            merged = {c.get("type"): c for c in (out.get(key) or [])}
            for c in value:
                merged[c.get("type")] = {**merged.get(c.get("type"), {}), **c}
            out[key] = list(merged.values())
        else:
            out[key] = _merge(out.get(key), value, strategic)
    return out


class MemoryKube:
    """A thread-safe in-memory Kubernetes with the KubeApi method set (no watch: callers relist)."""

    def __init__(self) -> None:
        self.nodes: Dict[str, Dict[str, Any]] = {}
        self.pods: Dict[Tuple[str, str], Dict[str, Any]] = {}
        self.leases: Dict[Tuple[str, str], Dict[str, Any]] = {}
        self.events: List[Dict[str, Any]] = []
        self.writes = 0
        self.rv = 0
        self.lock = threading.Lock()
        self.fail_reads = False
        self.configmaps: Dict[Tuple[str, str], Dict[str, Any]] = {}
        self.customs: Dict[Tuple[str, str, str], Dict[str, Any]] = {}  # (plural, namespace, name)
        self.other_pods: Dict[Tuple[str, str], Dict[str, Any]] = {}  # workload pods (not slurmd)
        self.pdb_blocked: Set[Tuple[str, str]] = set()  # (namespace, name) of pods whose eviction answers 429
        self.evictions: List[Tuple[str, str]] = []
        self.deleted_nodes: List[str] = []
        #: method name -> KubeError to raise (fault injection for tests)
        self.fail: Dict[str, KubeError] = {}

    def _bump(self, obj: Dict[str, Any]) -> Dict[str, Any]:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        return obj

    def add_node(self, name: str, **spec: Any) -> Dict[str, Any]:
        with self.lock:
            obj = {"metadata": {"name": name, "annotations": {}, "labels": {}}, "spec": dict(spec),
                   "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
            self.nodes[name] = self._bump(obj)
            return copy.deepcopy(obj)

    def add_pod(self, namespace: str, name: str, node: str, hostname: str, labels: Dict[str, str]) -> None:
        with self.lock:
            obj = {"metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
                   "spec": {"nodeName": node, "hostname": hostname}, "status": {"conditions": []}}
            self.pods[(namespace, name)] = self._bump(obj)

    def add_workload_pod(self, namespace: str, name: str, node: str, labels: Optional[Dict[str, str]] = None,
                         owner_kind: str = "ReplicaSet") -> None:
        with self.lock:
            meta = {"name": name, "namespace": namespace, "labels": dict(labels or {}),
                    "ownerReferences": [{"kind": owner_kind, "name": "owner"}] if owner_kind else []}
            self.other_pods[(namespace, name)] = self._bump({"metadata": meta, "spec": {"nodeName": node},
                                                             "status": {"phase": "Running"}})

    def _check(self, what: str) -> None:
        exc = self.fail.get(what)
        if exc is not None:
            raise exc

    # ---- remediation surface ---------------------------------------------------------------------
    def list_node_pods(self, node: str) -> List[Dict[str, Any]]:
        with self.lock:
            self._check("list_node_pods")
            if self.fail_reads:
                raise KubeError("list_node_pods: HTTP 500", 500)
            return [copy.deepcopy(p) for p in list(self.pods.values()) + list(self.other_pods.values())
                    if (p.get("spec") or {}).get("nodeName") == node]

    def evict_pod(self, namespace: str, name: str) -> None:
        with self.lock:
            self._check("evict_pod")
            if (namespace, name) in self.pdb_blocked:
                raise KubeError(f"evict {namespace}/{name}: HTTP 429: Cannot evict pod as it would violate the "
                                "pod's disruption budget.", 429)
            self.evictions.append((namespace, name))
            self.other_pods.pop((namespace, name), None)
            self.pods.pop((namespace, name), None)
            self.writes += 1

    def delete_node(self, name: str) -> None:
        with self.lock:
            self._check("delete_node")
            self.nodes.pop(name, None)
            self.deleted_nodes.append(name)
            self.writes += 1

    def create_custom(self, group: str, version: str, namespace: str, plural: str,
                      body: Dict[str, Any]) -> Dict[str, Any]:
        with self.lock:
            self._check("create_custom")
            key = (plural, namespace, body["metadata"]["name"])
            if key not in self.customs:
                self.customs[key] = self._bump(copy.deepcopy(body))
                self.writes += 1
            return copy.deepcopy(self.customs[key])

    def delete_custom(self, group: str, version: str, namespace: str, plural: str, name: str) -> None:
        with self.lock:
            self._check("delete_custom")
            if self.customs.pop((plural, namespace, name), None) is not None:
                self.writes += 1

    def list_custom(self, group: str, version: str, namespace: str, plural: str) -> Dict[str, Dict[str, Any]]:
        with self.lock:
            self._check("list_custom")
            return {k[2]: copy.deepcopy(v) for k, v in self.customs.items() if k[0] == plural and k[1] == namespace}

    def get_configmap(self, namespace: str, name: str) -> Optional[Dict[str, Any]]:
        with self.lock:
            self._check("get_configmap")
            cm = self.configmaps.get((namespace, name))
            return copy.deepcopy(cm) if cm else None

    def create_configmap(self, namespace: str, body: Dict[str, Any]) -> Dict[str, Any]:
        with self.lock:
            key = (namespace, body["metadata"]["name"])
            if key in self.configmaps:
                raise Conflict("configmap exists", 409)
            self.configmaps[key] = self._bump(copy.deepcopy(body))
            return copy.deepcopy(self.configmaps[key])

    def patch_configmap(self, namespace: str, name: str, body: Dict[str, Any]) -> Dict[str, Any]:
        return self._apply(self.configmaps, (namespace, name), body, "merge", "all")

    # ---- KubeApi surface -------------------------------------------------------------------------
    def list_nodes(self, transform: Optional[Any] = None) -> Tuple[Dict[str, Dict[str, Any]], str]:
        with self.lock:
            if self.fail_reads:
                raise KubeError("list_nodes: HTTP 500", 500)
            out = copy.deepcopy(self.nodes)
            return ({k: transform(v) for k, v in out.items()} if transform else out), str(self.rv)

    def list_pods(self, namespace: str, selector: str,
                  transform: Optional[Any] = None) -> Tuple[Dict[str, Dict[str, Any]], str]:
        key, _, value = (selector or "").partition("=")
        with self.lock:
            if self.fail_reads:
                raise KubeError("list_pods: HTTP 500", 500)
            out = {n: copy.deepcopy(p) for (ns, n), p in self.pods.items() if ns == namespace and
                   (not key or (p["metadata"].get("labels") or {}).get(key) == value)}
            return ({k: transform(v) for k, v in out.items()} if transform else out), str(self.rv)

    def watch_nodes(self, resource_version: str,
                    timeout: int) -> Iterator[Tuple[str, Dict[str, Any]]]:  # pragma: no cover - unused
        return iter(())

    def watch_pods(self, namespace: str, selector: str, resource_version: str,
                   timeout: int) -> Iterator[Tuple[str, Dict[str, Any]]]:  # pragma: no cover
        return iter(())

    def _apply(self, store: Dict[Any, Dict[str, Any]], key: Any, body: Dict[str, Any], patch_type: str,
               part: Optional[str]) -> Dict[str, Any]:
        with self.lock:
            obj = store.get(key)
            if obj is None:
                raise NotFound(f"{key} not found", 404)
            want_rv = (body.get("metadata") or {}).get("resourceVersion")
            if want_rv and want_rv != obj["metadata"]["resourceVersion"]:
                raise Conflict(f"{key}: the object has been modified", 409)
            body = dict(body)
            if "metadata" in body:
                body["metadata"] = {k: v for k, v in body["metadata"].items() if k != "resourceVersion"}
            if part == "status":
                body = {"status": body.get("status", {})}
            elif part == "all":
                pass
            else:
                body = {k: v for k, v in body.items() if k != "status"}
            new = _merge(obj, body, patch_type == "strategic")
            store[key] = self._bump(new)
            self.writes += 1
            return copy.deepcopy(new)

    def patch_node(self, name: str, body: Dict[str, Any], patch_type: str = "strategic") -> Dict[str, Any]:
        self._check("patch_node")
        return self._apply(self.nodes, name, body, patch_type, None)

    def patch_node_status(self, name: str, body: Dict[str, Any], patch_type: str = "strategic") -> Dict[str, Any]:
        return self._apply(self.nodes, name, body, patch_type, "status")

    def patch_pod_status(self, namespace: str, name: str, body: Dict[str, Any],
                         patch_type: str = "strategic") -> Dict[str, Any]:
        return self._apply(self.pods, (namespace, name), body, patch_type, "status")

    def create_event(self, namespace: str, node: Dict[str, Any], reason: str, message: str, etype: str = "Normal",
                     now: str = "", kind: str = "Node") -> Dict[str, Any]:
        with self.lock:
            self.events.append({"node": (node.get("metadata") or {}).get("name"), "reason": reason,
                                "message": message, "type": etype})
            self.writes += 1
            return {}

    def get_lease(self, namespace: str, name: str) -> Optional[Dict[str, Any]]:
        with self.lock:
            lease = self.leases.get((namespace, name))
            return copy.deepcopy(lease) if lease else None

    def create_lease(self, namespace: str, body: Dict[str, Any]) -> Dict[str, Any]:
        with self.lock:
            key = (namespace, body["metadata"]["name"])
            if key in self.leases:
                raise Conflict("lease exists", 409)
            self.leases[key] = self._bump(copy.deepcopy(body))
            return copy.deepcopy(self.leases[key])

    def replace_lease(self, namespace: str, name: str, body: Dict[str, Any]) -> Dict[str, Any]:
        with self.lock:
            cur = self.leases.get((namespace, name))
            if cur is None:
                raise NotFound("lease not found", 404)
            if body["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
                raise Conflict("lease modified", 409)
            self.leases[(namespace, name)] = self._bump(copy.deepcopy(body))
            return copy.deepcopy(self.leases[(namespace, name)])

