"""Per-kind defaulting and create/update preparation, after the real registry strategies.

* defaults fill missing fields on every decoded body (create, update, patch);
* ``prepare_for_create`` resets what a client may not set on create (pod status,
  PDB status, custom resource status when the status subresource is on);
* ``spec_changed`` decides whether ``metadata.generation`` moves.
"""

from __future__ import annotations

from typing import Any, Dict

from .resources import ResourceType

Obj = Dict[str, Any]


def _default_container(c: Obj) -> None:
    if not isinstance(c, dict):
        return
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    image = str(c.get("image", ""))
    tag = image.rsplit("/", 1)[-1]
    latest = "@" not in tag and (":" not in tag or tag.endswith(":latest"))
    c.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    c.setdefault("resources", {})


def _default_pod_spec(spec: Obj) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            _default_container(c)


def apply_defaults(rt: ResourceType, obj: Obj) -> None:
    if rt.custom:
        return
    if rt.status_subresource or rt.kind == "Lease":
        obj.setdefault("spec", {})  # a Go struct field without omitempty always serializes
    if rt.kind == "Pod" and isinstance(obj.get("spec"), dict):
        _default_pod_spec(obj["spec"])
    elif rt.kind == "Namespace":
        name = (obj.get("metadata") or {}).get("name")
        if name:
            obj.setdefault("metadata", {}).setdefault("labels", {})["kubernetes.io/metadata.name"] = name
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    elif rt.kind == "PodDisruptionBudget":
        spec = obj.setdefault("spec", {})
        if spec.get("minAvailable") is None and spec.get("maxUnavailable") is None:
            spec["minAvailable"] = 1
    elif rt.kind == "Secret":
        obj.setdefault("type", "Opaque")
    elif rt.kind == "Event":
        obj.setdefault("type", "Normal")


def qos_class(pod: Obj) -> str:
    containers = (pod.get("spec") or {}).get("containers") or []
    requests_seen = limits_seen = False
    guaranteed = True
    for c in containers:
        res = (c.get("resources") or {}) if isinstance(c, dict) else {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        requests_seen = requests_seen or bool(req)
        limits_seen = limits_seen or bool(lim)
        for name in ("cpu", "memory"):
            if name not in lim or req.get(name, lim[name]) != lim[name]:
                guaranteed = False
    if not requests_seen and not limits_seen:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def prepare_for_create(rt: ResourceType, obj: Obj, keep_status: bool) -> None:
    """Reset what the server owns on create. ``keep_status`` is for seeding tests (as if the
    kubelet or a controller had already written the status)."""
    md = obj.setdefault("metadata", {})
    if rt.has_generation:
        md["generation"] = 1
    if rt.custom:
        if rt.status_subresource and not keep_status:
            obj.pop("status", None)
        return
    if rt.kind == "Pod":
        status = obj.get("status") if keep_status and isinstance(obj.get("status"), dict) else {}
        status.setdefault("phase", "Pending")
        status.setdefault("qosClass", qos_class(obj))
        obj["status"] = status
    elif rt.kind == "Namespace":
        obj["status"] = {"phase": "Active"}
    elif rt.kind == "PodDisruptionBudget":
        obj["status"] = {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}
    elif rt.status_subresource and not keep_status and rt.kind != "Node":
        obj.pop("status", None)


def spec_changed(rt: ResourceType, old: Obj, new: Obj) -> bool:
    """Whether an update moves ``metadata.generation`` (only for kinds that have one)."""
    if not rt.has_generation:
        return False
    if rt.custom:
        skip = {"metadata", "kind", "apiVersion"} | ({"status"} if rt.status_subresource else set())
        strip = lambda o: {k: v for k, v in o.items() if k not in skip}  # noqa: E731
        return strip(old) != strip(new)
    return old.get("spec") != new.get("spec")
