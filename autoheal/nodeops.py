"""Ownership-aware node changes: drain, resume and re-reason only where autoheal is allowed to.

The rules (NHC's and Slinky's, and ours):
- never overwrite a reason that is not ours (an admin's drain wins);
- skip the update when the node is already drained with the same reason;
- resume only nodes whose drain reason is ours.
Each function returns an ``Outcome`` saying what it did, so callers can journal it and dry runs can
show it without touching Slurm.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoheal.reasons import is_ours, make_reason, sanitize, strip_reason_suffix
from autoheal.slurm.base import SlurmAdapter
from autoheal.slurm.model import Node
from autoheal.strenum import StrEnum


class NodeAction(StrEnum):
    """What a node operation did or would do (the words journal records and ``--json`` output carry)."""

    DRAINED = "drained"
    RESUMED = "resumed"
    REASON_UPDATED = "reason-updated"
    SKIPPED_SAME = "skipped: already drained with this reason"
    SKIPPED_FOREIGN = "skipped: drained by someone else"
    SKIPPED_NOT_DRAINED = "skipped: not drained"
    SKIPPED_NOT_OURS = "skipped: drain reason is not ours"


DRAINED, RESUMED, REASON_UPDATED = NodeAction.DRAINED, NodeAction.RESUMED, NodeAction.REASON_UPDATED
SKIPPED_SAME, SKIPPED_FOREIGN = NodeAction.SKIPPED_SAME, NodeAction.SKIPPED_FOREIGN
SKIPPED_NOT_DRAINED, SKIPPED_NOT_OURS = NodeAction.SKIPPED_NOT_DRAINED, NodeAction.SKIPPED_NOT_OURS


@dataclass(frozen=True)
class Outcome:
    """What a node operation did (``action``) or would have done (``dry_run``)."""

    node: str
    action: NodeAction
    reason: str = ""
    previous_reason: str = ""
    dry_run: bool = False

    @property
    def changed(self) -> bool:
        return self.action in (DRAINED, RESUMED, REASON_UPDATED) and not self.dry_run


def _ensure_prefixed(reason: str) -> str:
    reason = sanitize(reason)
    return reason if is_ours(reason) else make_reason(reason)


def plan_drain(node: Node, reason: str) -> NodeAction:
    """Pure decision for a drain request: DRAINED, REASON_UPDATED or a SKIPPED_* value."""
    current = strip_reason_suffix(node.reason)
    if node.drain or node.down:
        if current and not is_ours(current):
            return SKIPPED_FOREIGN
        if current == reason:
            return SKIPPED_SAME
        if node.drain and current:
            return REASON_UPDATED
    return DRAINED


def plan_resume(node: Node) -> NodeAction:
    """Pure decision for a resume request: RESUMED or a SKIPPED_* value."""
    if not (node.drain or node.down):
        return SKIPPED_NOT_DRAINED
    if not is_ours(strip_reason_suffix(node.reason)):
        return SKIPPED_NOT_OURS
    return RESUMED


def drain(slurm: SlurmAdapter, node: str, reason: str, dry_run: bool = False) -> Outcome:
    """Drain ``node`` with an ``autoheal:`` reason unless someone else's drain is already there."""
    reason = _ensure_prefixed(reason)
    current = slurm.get_node(node)
    action = plan_drain(current, reason)
    prev = strip_reason_suffix(current.reason)
    if action in (DRAINED, REASON_UPDATED) and not dry_run:
        if action == DRAINED:
            slurm.drain(node, reason)
        else:
            slurm.set_reason(node, reason)
    return Outcome(node, action, reason, prev, dry_run and action in (DRAINED, REASON_UPDATED))


def resume(slurm: SlurmAdapter, node: str, dry_run: bool = False) -> Outcome:
    """Resume ``node`` only if its drain is ours."""
    current = slurm.get_node(node)
    action = plan_resume(current)
    prev = strip_reason_suffix(current.reason)
    if action == RESUMED and not dry_run:
        # Re-read right before writing: an admin may have re-drained with their own reason meanwhile.
        again = slurm.get_node(node)
        if plan_resume(again) != RESUMED:
            return Outcome(node, plan_resume(again), "", strip_reason_suffix(again.reason))
        slurm.resume(node)
    return Outcome(node, action, "", prev, dry_run and action == RESUMED)
