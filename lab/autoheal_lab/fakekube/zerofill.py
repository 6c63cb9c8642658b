"""Go zero values the real server always serializes.

The API server encodes Go structs: a field without ``omitempty`` is always on
the wire (``""``, ``0``, ``false``), and a struct-typed field is never omitted
even with ``omitempty``. Clients depend on that (the python client rejects a
``nodeInfo`` missing ``bootID``), so the fake fills these fields for the
objects it serves. Paths are dotted JSON names; ``[]`` means "each element".
"""

from __future__ import annotations

from typing import Any, Dict, List

_CONTAINER_STATUS = {"name": "", "ready": False, "restartCount": 0, "image": "", "imageID": ""}
_CONTAINER_STATUS_PATHS = {}
for _list in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
    _CONTAINER_STATUS_PATHS[f"status.{_list}[]"] = _CONTAINER_STATUS
    for _state in ("state", "lastState"):
        _CONTAINER_STATUS_PATHS[f"status.{_list}[].{_state}.terminated"] = {"exitCode": 0}

_CONTAINER = {"[]": {"name": ""}, "[].ports[]": {"containerPort": 0}, "[].env[]": {"name": ""},
              "[].volumeMounts[]": {"name": "", "mountPath": ""}, "[].volumeDevices[]": {"name": "", "devicePath": ""}}


def _pod_spec(prefix: str) -> Dict[str, Dict[str, Any]]:
    out = {f"{prefix}.volumes[]": {"name": ""}}
    for key in ("containers", "initContainers"):
        for suffix, fields in _CONTAINER.items():
            out[f"{prefix}.{key}{suffix}"] = fields
    return out


_META = {"metadata.ownerReferences[]": {"apiVersion": "", "kind": "", "name": "", "uid": ""}}
_CONDITION = {"type": "", "status": ""}
_META_CONDITION = {"type": "", "status": "", "reason": "", "message": "", "lastTransitionTime": None}

ZERO_FIELDS: Dict[str, Dict[str, Dict[str, Any]]] = {
    "Node": {
        "": {"spec": {}, "status": {}},
        "status": {"daemonEndpoints": {}, "nodeInfo": {}},
        "status.daemonEndpoints": {"kubeletEndpoint": {}},
        "status.daemonEndpoints.kubeletEndpoint": {"Port": 0},
        "status.nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "",
                            "containerRuntimeVersion": "", "kubeletVersion": "", "kubeProxyVersion": "",
                            "operatingSystem": "", "architecture": ""},
        "status.conditions[]": _CONDITION,
        "status.addresses[]": {"type": "", "address": ""},
        "status.volumesAttached[]": {"name": "", "devicePath": ""},
        "spec.taints[]": {"key": "", "effect": ""},
    },
    "Pod": {
        "": {"spec": {}, "status": {}},
        "status.conditions[]": _CONDITION,
        "status.podIPs[]": {"ip": ""},
        "status.hostIPs[]": {"ip": ""},
        **_CONTAINER_STATUS_PATHS,
        **_pod_spec("spec"),
    },
    "Event": {"": {"involvedObject": {}, "source": {}}},
    "PodDisruptionBudget": {
        "": {"spec": {}, "status": {}},
        "status": {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0},
        "status.conditions[]": _META_CONDITION,
        "spec.selector.matchExpressions[]": {"key": "", "operator": ""},
    },
    "DaemonSet": {"": {"spec": {}, "status": {}}, "status": {"currentNumberScheduled": 0, "numberMisscheduled": 0,
                                         "desiredNumberScheduled": 0, "numberReady": 0},
                  "status.conditions[]": {"type": "", "status": ""}, **_pod_spec("spec.template.spec")},
    "ReplicaSet": {"": {"spec": {}, "status": {}}, "status": {"replicas": 0},
                   "status.conditions[]": {"type": "", "status": ""},
                   **_pod_spec("spec.template.spec")},
    "Deployment": {"": {"spec": {}, "status": {}}, "status.conditions[]": {"type": "", "status": ""},
                   **_pod_spec("spec.template.spec")},
    "Namespace": {"": {"spec": {}, "status": {}}},
    "Lease": {"": {"spec": {}}},
}


def _split(path: str) -> List[str]:
    out = []
    for part in path.split("."):
        if part.endswith("[]"):
            out.extend([part[:-2], "[]"])
        else:
            out.append(part)
    return out


def _targets(obj: Any, parts: List[str]) -> List[Dict[str, Any]]:
    """The dicts found at ``parts`` below ``obj`` (only where they exist)."""
    found = [obj]
    for part in parts:
        nxt = []
        for cur in found:
            if part == "[]":
                if isinstance(cur, list):
                    nxt.extend(item for item in cur if isinstance(item, dict))
            elif isinstance(cur, dict) and part in cur:
                nxt.append(cur[part])
        found = nxt
    return [f for f in found if isinstance(f, dict)]


def fill_zero_values(kind: str, obj: Dict[str, Any]) -> None:
    """Add the always-serialized fields of ``kind`` that ``obj`` lacks (in place).

    A ``None`` zero (a required timestamp) is left out: the real server's
    validation would have refused the object instead.
    """
    table = ZERO_FIELDS.get(kind)
    if not table:
        return
    for path in sorted(table, key=lambda p: (p != "", p.count(".") + p.count("[]"))):
        for target in _targets(obj, _split(path)) if path else [obj]:
            for field, zero in table[path].items():
                if field not in target and zero is not None:
                    target[field] = {} if isinstance(zero, dict) else zero
    for path, fields in _META.items():
        for target in _targets(obj, _split(path)):
            for field, zero in fields.items():
                target.setdefault(field, zero)
