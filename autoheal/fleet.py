"""How autoheal sees the fleet at a glance: each Slurm node in one bucket, for the sync's metrics
(``autoheal_sync_fleet_nodes{state}``) and ``autoheal status``. Pure; no I/O.

Buckets (one per node, first match wins): ``spare`` (held out of service by the spare pool's reason),
``retired`` (autoheal retired it: replaced for good), ``drained-autoheal`` (drained or down with an
``autoheal:`` reason), ``drained-other`` (drained or down by anyone else: an admin, Slurm itself),
``in-service``. The share drained by autoheal is what the alert on mass drains watches; a foreign
drain is never counted as ours (ownership rule: the reason's prefix decides)."""

from __future__ import annotations

from typing import Dict, Iterable

from autoheal.reasons import Origin, Reason, is_ours
from autoheal.slurm.model import Node

IN_SERVICE, DRAINED_AUTOHEAL, DRAINED_OTHER, RETIRED, SPARE = (
    "in-service", "drained-autoheal", "drained-other", "retired", "spare")
#: Every bucket, in the order a person reads them (the metric always exports all of them, 0 included,
#: so a ratio over them never has a missing series).
BUCKETS = (IN_SERVICE, DRAINED_AUTOHEAL, DRAINED_OTHER, RETIRED, SPARE)


def bucket(node: Node, spare_prefix: str = "autoheal: spare:") -> str:
    """The bucket of one node (see the module docstring)."""
    reason = node.reason or ""
    out = node.drain or node.down
    if not out:
        return IN_SERVICE
    if spare_prefix and reason.strip().startswith(spare_prefix.strip()):
        return SPARE
    if is_ours(reason):
        parsed = Reason.parse(reason)
        origin = parsed.origin if parsed is not None else Origin.HEALTH
        if origin == Origin.RETIRED:
            return RETIRED
        if origin in (Origin.SPARE, Origin.SPARE_POOL):
            return SPARE
        return DRAINED_AUTOHEAL
    return DRAINED_OTHER


def counts(nodes: Iterable[Node], spare_prefix: str = "autoheal: spare:") -> Dict[str, int]:
    """Nodes per bucket, every bucket present."""
    out = dict.fromkeys(BUCKETS, 0)
    for n in nodes:
        out[bucket(n, spare_prefix)] += 1
    return out
