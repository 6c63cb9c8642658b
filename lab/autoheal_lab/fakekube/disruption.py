"""PodDisruptionBudget arithmetic: the disruption controller's status and the eviction check.

The fake runs the controller synchronously after every pod or PDB write, so a
PDB's status is always current (the real controller lags by a few hundred ms).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

from . import errors
from .selectors import LabelSelector, SelectorError, label_selector_from_dict, labels_of

EVICTION_BLOCKED = "Cannot evict pod as it would violate the pod's disruption budget."
MULTIPLE_PDBS = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."


def pod_is_ready(pod: Dict[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def pdb_selector(pdb: Dict[str, Any]) -> LabelSelector:
    """A nil or empty selector matches nothing (as the eviction subresource treats it)."""
    try:
        sel = label_selector_from_dict((pdb.get("spec") or {}).get("selector"))
    except SelectorError:
        return LabelSelector(nothing=True)
    return LabelSelector(nothing=True) if sel.empty else sel


def pdbs_for_pod(pod: Dict[str, Any], pdbs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [p for p in pdbs if pdb_selector(p).matches(labels_of(pod))]


def _scaled(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        pct = int(value[:-1])
        exact = pct * total / 100.0
        return math.ceil(exact) if round_up else math.floor(exact)
    return int(value)


def compute_status(pdb: Dict[str, Any], pods: List[Dict[str, Any]], now: str) -> Dict[str, Any]:
    """The status the disruption controller would write for ``pdb`` given the namespace's pods."""
    old = pdb.get("status") or {}
    selector = pdb_selector(pdb)
    selected = [p for p in pods if selector.matches(labels_of(p))]
    names = {p["metadata"]["name"] for p in selected}
    disrupted = {k: v for k, v in (old.get("disruptedPods") or {}).items() if k in names}
    healthy = sum(1 for p in selected
                  if pod_is_ready(p) and not p["metadata"].get("deletionTimestamp")
                  and p["metadata"]["name"] not in disrupted)
    expected = len(selected)
    spec = pdb.get("spec") or {}
    if spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected, round_up=True))
    else:
        desired = _scaled(spec.get("minAvailable", 1), expected, round_up=True)
    allowed = max(0, healthy - desired)
    status: Dict[str, Any] = {
        "observedGeneration": pdb["metadata"].get("generation", 1),
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
    }
    if disrupted:
        status["disruptedPods"] = disrupted
    status["conditions"] = [_condition(old, allowed > 0, status["observedGeneration"], now)]
    return status


def _condition(old_status: Dict[str, Any], allowed: bool, generation: int, now: str) -> Dict[str, Any]:
    want = "True" if allowed else "False"
    reason = "SufficientPods" if allowed else "InsufficientPods"
    previous = next((c for c in old_status.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None)
    since = previous["lastTransitionTime"] if previous and previous.get("status") == want else now
    return {"type": "DisruptionAllowed", "status": want, "reason": reason, "message": "",
            "observedGeneration": generation, "lastTransitionTime": since}


def can_ignore_pdb(pod: Dict[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed", "Pending") or bool(pod["metadata"].get("deletionTimestamp"))


def check_eviction(pod: Dict[str, Any], pdbs: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """Decide an eviction. Returns the PDB whose budget must be decremented, or None when no PDB
    is involved; raises ApiError (429/403/500) when the eviction is refused."""
    matching = pdbs_for_pod(pod, pdbs)
    if not matching:
        return None
    if len(matching) > 1:
        raise errors.ApiError(500, "", MULTIPLE_PDBS)
    pdb = matching[0]
    status = pdb.get("status") or {}
    name = pdb["metadata"]["name"]
    if not pod_is_ready(pod) and status.get("currentHealthy", 0) >= status.get("desiredHealthy", 0) \
            and status.get("desiredHealthy", 0) > 0:
        return None  # an unready pod does not count towards the budget
    if status.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
        raise errors.too_many_requests(EVICTION_BLOCKED, 10, [{
            "reason": "DisruptionBudget",
            "message": f"The disruption budget {name} is still being processed by the server."}])
    allowed = status.get("disruptionsAllowed", 0)
    if allowed < 0:
        raise errors.ApiError(403, "Forbidden", f'poddisruptionbudget.policy "{name}" is forbidden: '
                              "pdb disruptions allowed is negative",
                              {"name": name, "group": "policy", "kind": "poddisruptionbudget"})
    if allowed == 0:
        raise errors.too_many_requests(EVICTION_BLOCKED, 0, [{
            "reason": "DisruptionBudget",
            "message": f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} healthy pods "
                       f"and has {status.get('currentHealthy', 0)} currently"}])
    return pdb
