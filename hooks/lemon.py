"""Lemon nodes: a node that keeps failing after being returned to service is retired, not cycled.

The node state keeps a fault history (``history``) that survives reboots, resets, repairs, an admin's
resume and ``autoheal check --clear-faults``: one ``fault`` entry per drain episode (a drain of ours
for a hardware fault on a node that was in service) and one ``returned`` entry each time the node went
back into service. When a new fault would make ``hooks.lemon_faults`` faults within
``hooks.lemon_window`` (3 in 7 days by default), the node is drained with ``autoheal: lemon: 3 faults in
7 d (xid 79, 48, 79)`` instead of the fault: no repair rung, no automatic resume; the sync asks for a
replacement (``sync.remediate_reasons`` has ``autoheal: lemon:``) or a human takes it from there.

Pure functions over the state dict; ``engine.drain_for`` and the resume paths call them.
"""

from __future__ import annotations

from autoheal.reasons import Origin, Reason

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import List, Optional

    from autoheal.hooks.state import HistoryEntry, NodeStateData

#: Entries kept (the newest); far more than any window needs.
MAX_HISTORY = 500


def _label(entry: HistoryEntry) -> str:
    return f"xid {entry['xid']}" if entry.get("xid") is not None else str(entry.get("check") or "fault")


def note_fault(st: NodeStateData, now: float, check: str, xid: Optional[int], gpu: Optional[int],
               reason: str) -> None:
    hist = st.setdefault("history", [])
    hist.append({"time": now, "event": "fault", "check": check, "xid": xid, "gpu": gpu, "reason": reason})
    st["history"] = hist[-MAX_HISTORY:]


def note_return(st: NodeStateData, now: float, how: str) -> None:
    """The node went back into service (``how``: resumed by autoheal, by someone else, after a reboot)."""
    hist = st.setdefault("history", [])
    if hist and hist[-1].get("event") == "returned":
        return  # one return per episode, whichever path saw it first
    hist.append({"time": now, "event": "returned", "how": how})
    st["history"] = hist[-MAX_HISTORY:]


def window_text(seconds: float) -> str:
    if seconds >= 86400 and seconds % 86400 == 0:
        return f"{int(seconds // 86400)} d"
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    return f"{seconds:g} s"


def verdict(st: NodeStateData, now: float, check: str, xid: Optional[int], limit: int,
            window: float) -> Optional[str]:
    """The lemon reason body when a new fault (``check``/``xid``, not yet in the history) makes
    ``limit`` faults within ``window`` seconds, each after the node was returned to service; else None.
    ``limit`` 0: never."""
    if limit <= 0:
        return None
    hist = st.get("history") or []
    recent = [e for e in hist if e.get("event") == "fault" and now - float(e.get("time", 0)) <= window]
    returned = [e for e in hist if e.get("event") == "returned" and now - float(e.get("time", 0)) <= window]
    if len(recent) + 1 < limit or not returned:
        return None
    labels = [_label(e) for e in recent] + [_label({"xid": xid, "check": check})]
    xids = [lbl[4:] for lbl in labels if lbl.startswith("xid ")]
    what = f"(xid {', '.join(xids)})" if len(xids) == len(labels) else f"({', '.join(labels)})"
    return f"{len(labels)} faults in {window_text(window)} {what}"


def reason(body: str) -> str:
    return Reason(Origin.LEMON, detail=body).render()


def is_lemon(reason_text: Optional[str]) -> bool:
    parsed = Reason.parse(reason_text)
    return parsed is not None and parsed.origin is Origin.LEMON


def history(st: NodeStateData) -> List[HistoryEntry]:
    return list(st.get("history") or [])
