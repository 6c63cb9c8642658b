"""Server-side printing: ``meta.k8s.io/v1`` Table answers for ``kubectl get``.

Columns follow the kube-apiserver printers for nodes, pods, namespaces,
configmaps, secrets, events, leases and PDBs; other resources get the default
Name/Age table that CRDs without printer columns get.
"""

from __future__ import annotations

import calendar
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .resources import ResourceType

Obj = Dict[str, Any]
Column = Tuple[str, str, int, str]  # (name, type, priority, description)

NAME_DESC = ("Name must be unique within a namespace. Is required when creating resources, although some "
             "resources may allow a client to request the generation of an appropriate name automatically. "
             "Name is primarily intended for creation idempotence and configuration definition. Cannot be "
             "updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names")
AGE_DESC = ("CreationTimestamp is a timestamp representing the server time when this object was created. It is "
            "not guaranteed to be set in happens-before order across separate operations. Clients may not set "
            "this value. It is represented in RFC3339 form and is in UTC.")


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rem = s % 60
        return f"{minutes}m" if rem == 0 else f"{minutes}m{rem}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rem = minutes % 60
        return f"{hours}h" if rem == 0 else f"{hours}h{rem}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rem = hours % 24
        return f"{hours // 24}d" if rem == 0 else f"{hours // 24}d{rem}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if days == 0 else f"{hours // 24 // 365}y{days}d"
    return f"{hours // 24 // 365}y"


def _age(obj: Obj, now: float) -> str:
    ts = (obj.get("metadata") or {}).get("creationTimestamp")
    if not ts:
        return "<unknown>"
    try:
        created = calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return "<unknown>"
    return human_duration(now - created)


def _name(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _node_status(obj: Obj) -> str:
    ready = next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    parts = ["Unknown" if ready is None or ready.get("status") not in ("True", "False")
             else ("Ready" if ready["status"] == "True" else "NotReady")]
    if (obj.get("spec") or {}).get("unschedulable"):
        parts.append("SchedulingDisabled")
    return ",".join(parts)


def _node_roles(obj: Obj) -> str:
    roles = set()
    for key, value in ((obj.get("metadata") or {}).get("labels") or {}).items():
        if key.startswith("node-role.kubernetes.io/"):
            roles.add(key[len("node-role.kubernetes.io/"):])
        elif key == "kubernetes.io/role" and value:
            roles.add(value)
    return ",".join(sorted(r for r in roles if r)) or "<none>"


def _address(obj: Obj, kind: str) -> str:
    for addr in (obj.get("status") or {}).get("addresses") or []:
        if addr.get("type") == kind:
            return addr.get("address", "")
    return "<none>"


def _node_info(obj: Obj, key: str) -> str:
    return ((obj.get("status") or {}).get("nodeInfo") or {}).get(key) or "<unknown>"


def _pod_status(obj: Obj) -> str:
    status = obj.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Unknown"
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if state.get("waiting", {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif state.get("terminated", {}).get("reason"):
            reason = state["terminated"]["reason"]
    if (obj.get("metadata") or {}).get("deletionTimestamp") and status.get("reason") != "NodeLost":
        reason = "Terminating"
    return reason


def _pod_ready(obj: Obj) -> str:
    total = len((obj.get("spec") or {}).get("containers") or [])
    ready = sum(1 for cs in (obj.get("status") or {}).get("containerStatuses") or [] if cs.get("ready"))
    return f"{ready}/{total}"


def _pod_restarts(obj: Obj) -> int:
    return sum(int(cs.get("restartCount", 0)) for cs in (obj.get("status") or {}).get("containerStatuses") or [])


def _or_none(value: Any) -> str:
    return str(value) if value not in (None, "") else "<none>"


def _pdb_value(obj: Obj, key: str) -> str:
    value = (obj.get("spec") or {}).get(key)
    return "N/A" if value is None else str(value)


def _event_object(obj: Obj) -> str:
    ref = obj.get("involvedObject") or {}
    return f"{(ref.get('kind') or '').lower()}/{ref.get('name', '')}"


def _event_last_seen(obj: Obj, now: float) -> str:
    ts = obj.get("lastTimestamp") or obj.get("eventTime") or (obj.get("metadata") or {}).get("creationTimestamp")
    return _age({"metadata": {"creationTimestamp": (ts or "")[:19] + "Z" if ts else None}}, now)


Printer = Tuple[List[Column], Callable[[Obj, float], List[Any]]]

PRINTERS: Dict[str, Printer] = {
    "Node": ([("Name", "string", 0, NAME_DESC), ("Status", "string", 0, "The status of the node"),
              ("Roles", "string", 0, "The roles of the node"), ("Age", "string", 0, AGE_DESC),
              ("Version", "string", 0, "Kubelet Version reported by the node."),
              ("Internal-IP", "string", 1, "List of addresses reachable to the node. Queried from cloud provider, "
                                            "if available."),
              ("External-IP", "string", 1, "List of addresses reachable to the node. Queried from cloud provider, "
                                            "if available."),
              ("OS-Image", "string", 1, "OS Image reported by the node from /etc/os-release (e.g. Debian "
                                         "GNU/Linux 7 (wheezy))."),
              ("Kernel-Version", "string", 1, "Kernel Version reported by the node from 'uname -r' (e.g. "
                                               "3.16.0-0.bpo.4-amd64)."),
              ("Container-Runtime", "string", 1, "ContainerRuntime Version reported by the node through runtime "
                                                  "remote API (e.g. containerd://1.4.2).")],
             lambda o, now: [_name(o), _node_status(o), _node_roles(o), _age(o, now),
                             _node_info(o, "kubeletVersion").replace("<unknown>", ""),
                             _address(o, "InternalIP"), _address(o, "ExternalIP"), _node_info(o, "osImage"),
                             _node_info(o, "kernelVersion"), _node_info(o, "containerRuntimeVersion")]),
    "Pod": ([("Name", "string", 0, NAME_DESC),
             ("Ready", "string", 0, "The aggregate readiness state of this pod for accepting traffic."),
             ("Status", "string", 0, "The aggregate status of the containers in this pod."),
             ("Restarts", "string", 0, "The number of times the containers in this pod have been restarted and "
                                        "when the last container in this pod has restarted."),
             ("Age", "string", 0, AGE_DESC), ("IP", "string", 1, "IP address allocated to the pod."),
             ("Node", "string", 1, "Name of the node this pod is running on."),
             ("Nominated Node", "string", 1, "Name of the node this pod is nominated to run on."),
             ("Readiness Gates", "string", 1, "Readiness gates of this pod.")],
            lambda o, now: [_name(o), _pod_ready(o), _pod_status(o), _pod_restarts(o), _age(o, now),
                            _or_none((o.get("status") or {}).get("podIP")),
                            _or_none((o.get("spec") or {}).get("nodeName")),
                            _or_none((o.get("status") or {}).get("nominatedNodeName")), "<none>"]),
    "Namespace": ([("Name", "string", 0, NAME_DESC), ("Status", "string", 0, "The status of the namespace"),
                   ("Age", "string", 0, AGE_DESC)],
                  lambda o, now: [_name(o), (o.get("status") or {}).get("phase", ""), _age(o, now)]),
    "ConfigMap": ([("Name", "string", 0, NAME_DESC), ("Data", "string", 0, "Number of keys in the map"),
                   ("Age", "string", 0, AGE_DESC)],
                  lambda o, now: [_name(o), len(o.get("data") or {}) + len(o.get("binaryData") or {}),
                                  _age(o, now)]),
    "Secret": ([("Name", "string", 0, NAME_DESC), ("Type", "string", 0, "The type of the secret"),
                ("Data", "string", 0, "The number of data items"), ("Age", "string", 0, AGE_DESC)],
               lambda o, now: [_name(o), o.get("type", ""), len(o.get("data") or {}), _age(o, now)]),
    "Event": ([("Last Seen", "string", 0, "Time since the most recent occurrence"),
               ("Type", "string", 0, "Type of this event"), ("Reason", "string", 0, "Reason of this event"),
               ("Object", "string", 0, "The object that this event is about"),
               ("Message", "string", 0, "A human-readable description of the status of this operation.")],
              lambda o, now: [_event_last_seen(o, now), o.get("type", ""), o.get("reason", ""), _event_object(o),
                              (o.get("message") or "").strip()]),
    "Lease": ([("Name", "string", 0, NAME_DESC), ("Holder", "string", 0, "Name of the holder of the lease"),
               ("Age", "string", 0, AGE_DESC)],
              lambda o, now: [_name(o), (o.get("spec") or {}).get("holderIdentity") or "", _age(o, now)]),
    "PodDisruptionBudget": ([("Name", "string", 0, NAME_DESC), ("Min Available", "string", 0, "The minimum "
                             "number of pods that must be available"),
                             ("Max Unavailable", "string", 0, "The maximum number of pods that may be unavailable"),
                             ("Allowed Disruptions", "integer", 0, "Calculated number of pods that may be "
                              "disrupted at this time"), ("Age", "string", 0, AGE_DESC)],
                            lambda o, now: [_name(o), _pdb_value(o, "minAvailable"), _pdb_value(o, "maxUnavailable"),
                                            (o.get("status") or {}).get("disruptionsAllowed", 0), _age(o, now)]),
}
DEFAULT_PRINTER: Printer = ([("Name", "string", 0, NAME_DESC), ("Age", "string", 0, AGE_DESC)],
                            lambda o, now: [_name(o), _age(o, now)])


def _printer(rt: ResourceType) -> Printer:
    return DEFAULT_PRINTER if rt.custom else PRINTERS.get(rt.kind, DEFAULT_PRINTER)


def column_definitions(rt: ResourceType) -> List[Dict[str, Any]]:
    return [{"name": name, "type": typ, "format": "name" if name == "Name" else "", "description": desc,
             "priority": prio} for name, typ, prio, desc in _printer(rt)[0]]


def row(rt: ResourceType, obj: Obj, now: float, include_object: str = "Metadata") -> Dict[str, Any]:
    out: Dict[str, Any] = {"cells": _printer(rt)[1](obj, now)}
    if include_object == "Object":
        out["object"] = obj
    elif include_object != "None":
        out["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                         "metadata": obj.get("metadata") or {}}
    return out


def table(rt: ResourceType, objs: List[Obj], list_meta: Optional[Dict[str, Any]], now: float,
          include_object: str = "Metadata", headers: bool = True) -> Dict[str, Any]:
    out: Dict[str, Any] = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": dict(list_meta or {})}
    out["columnDefinitions"] = column_definitions(rt) if headers else None
    out["rows"] = [row(rt, o, now, include_object) for o in objs]
    return out
