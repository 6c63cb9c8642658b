"""Pure builders and diffs for what autoheal writes on Kubernetes objects: Slinky-style slurmd pod
conditions, the Node health condition and the Node taint.

Objects are plain dicts in the API's JSON form (camelCase), as the adapter returns them.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from autoheal.reasons import sanitize, strip_reason_suffix
from autoheal.slurm.model import Node

#: Slurm base state -> Slinky condition suffix (COMPLETING alone counts as Allocated: jobs still on it).
BASE_NAMES = {"ALLOCATED": "Allocated", "DOWN": "Down", "ERROR": "Error", "FUTURE": "Future", "IDLE": "Idle",
              "MIXED": "Mixed", "UNKNOWN": "Unknown", "COMPLETING": "Allocated"}
#: Slurm flag -> Slinky flag condition suffix; other flags are not mirrored.
FLAG_NAMES = {"COMPLETING": "Completing", "DRAIN": "Drain", "FAIL": "Fail", "INVALID": "Invalid",
              "INVALID_REG": "InvalidReg", "MAINTENANCE": "Maintenance", "NOT_RESPONDING": "NotResponding",
              "UNDRAIN": "Undrain"}
_COMPARED = ("status", "reason", "message")


def slurm_pod_conditions(node: Node, prefix: str = "SlurmNodeState") -> List[Dict[str, str]]:
    """The conditions Slinky writes for ``node``: one base state plus one per flag, status True,
    message = the Slurm reason (without scontrol's ``[user@time]`` suffix)."""
    message = sanitize(strip_reason_suffix(node.reason), 1024)
    names = [BASE_NAMES.get(node.state, "Unknown")]
    names += sorted({FLAG_NAMES[f] for f in node.flags if f in FLAG_NAMES})
    return [{"type": prefix + n, "status": "True", "reason": n, "message": message} for n in names]


def _conditions(obj: Dict[str, Any]) -> List[Dict[str, Any]]:
    return list(((obj or {}).get("status") or {}).get("conditions") or [])


def diff_conditions(obj: Dict[str, Any], desired: List[Dict[str, str]],
                    owned: Callable[[str], bool]) -> Tuple[List[Dict[str, Any]], List[str]]:
    """(conditions to add or change, types to remove) to bring the conditions ``owned(type)`` on ``obj``
    to ``desired``; conditions other writers own are never touched."""
    current = {c.get("type"): c for c in _conditions(obj)}
    wanted = {c["type"]: c for c in desired}
    changed = []
    for ctype, cond in wanted.items():
        have = current.get(ctype)
        if have is None or any((have.get(k) or "") != (cond.get(k) or "") for k in _COMPARED):
            changed.append(cond)
    stale = sorted(t for t in current if t and owned(t) and t not in wanted)
    return changed, stale


def condition_patch(obj: Dict[str, Any], changed: List[Dict[str, Any]], stale: List[str], now: str,
                    ) -> Tuple[str, Dict[str, Any]]:
    """(patch type, body) writing ``changed`` and removing ``stale`` on a status subresource.

    Only additions/changes: a strategic merge patch (merged by ``type``, so concurrent writers of other
    conditions are safe). Removals: a JSON merge patch of the whole list guarded by the object's
    resourceVersion (409 when someone wrote in between; the next pass retries on fresh data).
    """
    current = _conditions(obj)
    stamped = []
    by_type = {c.get("type"): c for c in current}
    for cond in changed:
        cond = dict(cond)
        old = by_type.get(cond["type"])
        if old and old.get("status") == cond["status"] and old.get("lastTransitionTime"):
            cond["lastTransitionTime"] = old["lastTransitionTime"]
        else:
            cond["lastTransitionTime"] = now
        stamped.append(cond)
    if not stale:
        return "strategic", {"status": {"conditions": stamped}}
    new_by_type = {c["type"]: c for c in stamped}
    merged = [new_by_type.pop(c.get("type"), c) for c in current if c.get("type") not in stale]
    merged += list(new_by_type.values())
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    body: Dict[str, Any] = {"status": {"conditions": merged}}
    if rv:
        body["metadata"] = {"resourceVersion": rv}
    return "merge", body


def health_condition(ctype: str, reason_code: str, message: str) -> Dict[str, str]:
    """The Node condition autoheal sets while its hardware drain is on the node."""
    return {"type": ctype, "status": "False", "reason": reason_code, "message": sanitize(message, 1024)}


def taints(obj: Dict[str, Any]) -> List[Dict[str, Any]]:
    return list(((obj or {}).get("spec") or {}).get("taints") or [])


def taint_patch(obj: Dict[str, Any], key: str, want: Optional[Dict[str, str]]) -> Optional[Dict[str, Any]]:
    """Strategic merge patch setting (``want``) or removing (``None``) the taint ``key``, or None when the
    Node already matches. ``spec.taints`` is replaced as a whole list, so the patch is guarded by the
    Node's resourceVersion: a taint someone else adds meanwhile is never lost (409, retried)."""
    current = taints(obj)
    mine = [t for t in current if t.get("key") == key]
    if want is None and not mine:
        return None
    if want is not None and len(mine) == 1 and all(mine[0].get(k) == v for k, v in want.items()) \
            and (mine[0].get("value") or "") == (want.get("value") or ""):
        return None
    new = [t for t in current if t.get("key") != key]
    if want is not None:
        new.append(dict(want))
    body: Dict[str, Any] = {"spec": {"taints": new}}
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    if rv:
        body["metadata"] = {"resourceVersion": rv}
    return body
