"""Per-kind defaulting and create/update preparation, after the real registry strategies.

* defaults fill missing fields on every decoded body (create, update, patch);
* ``prepare_for_create`` resets what a client may not set on create (pod status,
  PDB status, custom resource status when the status subresource is on);
* ``spec_changed`` decides whether ``metadata.generation`` moves.
"""

from __future__ import annotations

import datetime
import re
from typing import Any, Dict, Tuple

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


# -- timestamps ----------------------------------------------------------------------------------

TIME_KEYS = frozenset({"creationTimestamp", "deletionTimestamp", "lastTransitionTime", "lastHeartbeatTime",
                       "lastProbeTime", "lastUpdateTime", "firstTimestamp", "lastTimestamp", "startedAt",
                       "finishedAt", "startTime"})
MICRO_TIME_KEYS = frozenset({"acquireTime", "renewTime", "eventTime", "lastObservedTime"})
_RFC3339 = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


class BadTime(ValueError):
    pass


def _parse_time(value: str) -> Tuple[datetime.datetime, int]:
    m = _RFC3339.match(value)
    if not m:
        raise BadTime(f'parsing time "{value}" as "2006-01-02T15:04:05Z07:00": cannot parse "{value}"')
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    micros = int(((m.group(7) or ".0")[1:] + "000000")[:6])
    zone = m.group(8)
    offset = datetime.timedelta(0)
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        offset = sign * datetime.timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
    stamp = datetime.datetime(year, month, day, hour, minute, second, tzinfo=datetime.timezone(offset))
    return stamp.astimezone(datetime.timezone.utc), micros


def normalize_times(obj: Any) -> None:
    """Re-encode timestamps as the server does: metav1.Time in whole seconds UTC, MicroTime with
    six fractional digits UTC. Raises BadTime for a value the server could not decode."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(value, str) and (key in TIME_KEYS or key in MICRO_TIME_KEYS):
                stamp, micros = _parse_time(value)
                if key in MICRO_TIME_KEYS:
                    obj[key] = stamp.strftime("%Y-%m-%dT%H:%M:%S") + f".{micros:06d}Z"
                else:
                    obj[key] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
            else:
                normalize_times(value)
    elif isinstance(obj, list):
        for item in obj:
            normalize_times(item)
