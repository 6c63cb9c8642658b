"""The sync's view of a node's fault history (issue 22, lemon nodes): one annotation on the Node,
``<prefix>/fault-history``, a JSON list of the node side's health drains as the sync saw them (time,
Slurm node, fault), the newest ``KEEP``. It lives on the Kubernetes Node, so it survives what the
node's own record may not (a reimaged disk, a wiped state dir) and is readable with ``kubectl``.

A new entry is written when a health drain's fault differs from the last entry's: the recovery rungs of
one fault (``reboot:``, ``replace:``) are the same fault, a lemon retirement is its own entry. The step
writes nothing while nothing changes (an idle pass plans no action)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from autoheal.reasons import Origin, Reason

KEEP = 20


def key(prefix: str) -> str:
    return f"{prefix}/fault-history"


def fault_of(reason: str) -> str:
    """The fault a health drain reason names, the same for every rung of it."""
    parsed = Reason.parse(reason)
    if parsed is None:
        return ""
    if parsed.origin is Origin.LEMON:
        return f"lemon: {parsed.body()}"
    return parsed.with_origin(Origin.HEALTH).body()


def read(knode: Dict[str, Any], prefix: str) -> List[Dict[str, Any]]:
    raw = ((knode.get("metadata") or {}).get("annotations") or {}).get(key(prefix), "")
    try:
        value = json.loads(raw) if raw else []
    except ValueError:
        return []  # someone else's text: started again, never a crash of the pass
    return [e for e in value if isinstance(e, dict)] if isinstance(value, list) else []


def patch(knode: Dict[str, Any], prefix: str, drains: List[Tuple[str, str]], now: str) -> Optional[Dict[str, Any]]:
    """The merge patch adding the drains' faults not yet last in the history, or None."""
    entries = read(knode, prefix)
    last = entries[-1].get("fault") if entries else None
    added = False
    for slurm_node, reason in sorted(drains):
        fault = fault_of(reason)
        if not fault or fault == last:
            continue
        entries.append({"time": now, "node": slurm_node, "fault": fault[:300]})
        last, added = fault, True
    if not added:
        return None
    return {"metadata": {"annotations": {key(prefix): json.dumps(entries[-KEEP:], separators=(",", ":"))}}}
