"""``autoheal check --clear-faults``: an admin's "repaired by hand". Its own module: only that command
uses it, and the health pass every hook runs never pays for its types (issue 24 section 6)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional

from autoheal.events import Event
from autoheal.hooks import state as S

if TYPE_CHECKING:
    from autoheal.hooks.context import Context


@dataclass
class Cleared:
    """What ``clear_faults`` forgot (or, with ``dry_run``, would forget) on ``node``: all of it, or one
    GPU's (``gpu``)."""

    node: str
    gpu: Optional[int]
    dry_run: bool
    faults: List[S.Fault] = field(default_factory=list)
    ladder: Dict[str, Dict[str, List[float]]] = field(default_factory=dict)
    unknown_runs: Dict[str, int] = field(default_factory=dict)
    app_xids: Dict[str, List[float]] = field(default_factory=dict)
    reboot_requested: Optional[S.RebootRequest] = None

    def anything(self) -> bool:
        return bool(self.faults or self.ladder or self.unknown_runs or self.reboot_requested)

    def to_dict(self) -> Dict[str, object]:
        """The JSON of ``autoheal check --clear-faults --json`` (the counts, then what was cleared)."""
        return {"node": self.node, "gpu": self.gpu, "dry_run": self.dry_run, "faults": len(self.faults),
                "ladder": sorted(self.ladder),
                "cleared": {"faults": self.faults, "ladder": self.ladder, "unknown_runs": self.unknown_runs,
                            "app_xids": self.app_xids, "reboot_requested": self.reboot_requested}}


def pick(st: S.NodeStateData, node: str, gpu: Optional[int], dry_run: bool) -> Cleared:
    """Pure: what clearing ``gpu`` (None: the whole node) forgets from the state ``st``."""
    keys = None if gpu is None else {S.ladder_key(gpu)}
    return Cleared(
        node, gpu, dry_run,
        faults=[f for f in st.get("faults", []) if gpu is None or f.get("gpu") == gpu],
        ladder={k: v for k, v in st.get("ladder", {}).items() if keys is None or k in keys},
        unknown_runs={k: v for k, v in st.get("unknown_runs", {}).items() if gpu is None or k == str(gpu)},
        app_xids={k: v for k, v in st.get("app_xids", {}).items() if gpu is None or k == str(gpu)},
        reboot_requested=st.get("reboot_requested") if gpu is None else None)


def clear_faults(ctx: Context, gpu: Optional[int] = None, dry_run: bool = False) -> Cleared:
    """Forget open faults and recovery-ladder counts (all, or one GPU's) after an admin repaired the
    node by hand, so the next fault starts again at the cheapest rung. Our drain record is kept: the
    healthcheck still resumes the node once it passes. Returns what was (or would be) cleared."""
    if dry_run:
        return pick(ctx.store.read(), ctx.node, gpu, dry_run)
    with ctx.store.locked() as st:
        out = pick(st, ctx.node, gpu, dry_run)
        st["faults"] = [f for f in st.get("faults", []) if f not in out.faults]
        st["ladder"] = {k: v for k, v in st["ladder"].items() if k not in out.ladder}
        st["unknown_runs"] = {k: v for k, v in st["unknown_runs"].items() if k not in out.unknown_runs}
        st["app_xids"] = {k: v for k, v in st["app_xids"].items() if k not in out.app_xids}
        if gpu is None:
            st["reboot_requested"] = None
            st["last_result"] = None  # a stale failing result would make the prolog fail jobs
        S.mark_repaired(st, gpu, time.time())  # repaired by hand: the same XID back is a new fault
    if out.anything():
        ctx.record(Event.CLEAR_FAULTS, action="clear-faults", outcome="cleared", severity="action",
                   message=f"admin cleared {len(out.faults)} open fault(s) and the ladder counts of "
                   f"{', '.join(S.ladder_label(k, ctx.node) for k in sorted(out.ladder)) or 'nothing'}",
                   evidence={"gpu": gpu, "faults": [f.get("reason", "") for f in out.faults]})
    return out
