"""A node waiting for a replacement: the product's "waiting for a human" state (issue 27).

The node side drains a node ``autoheal: replace: ...`` on the last rung of its recovery ladder. Who acts
next depends on the site: ``autoheal sync`` with the ``remediate`` step replaces it through Kubernetes;
without it (a Slurm-only site) nobody will, until a person repairs or replaces the machine and hands it
back. That wait is explicit: the reason says ``replace``, the hooks journal ``awaiting-replacement`` once
(notified) naming who acts and what to run afterwards, and ``autoheal node list --waiting`` lists the
nodes waiting, with how long. Pure; no part imports another through it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from autoheal.events import Event
from autoheal.reasons import Origin, Reason

if TYPE_CHECKING:
    from autoheal.config import Config
    from autoheal.slurm.model import Node

#: The journal event of a node that starts waiting for a replacement.
EVENT = Event.AWAITING_REPLACEMENT


def awaiting_replacement(node: Node, prefixes: Sequence[str] = ()) -> bool:
    """``node`` is held (drained or down) by autoheal asking for a replacement: the ``replace`` rung, or a
    reason starting with one of ``prefixes`` (``sync.remediate_reasons``: what the sync replaces)."""
    from autoheal.reasons import strip_reason_suffix

    if not (node.drain or node.down):
        return False
    parsed = Reason.parse(node.reason)
    if parsed is None or parsed.origin in (Origin.K8S, Origin.RETIRED):
        return False
    text = strip_reason_suffix(node.reason)
    return parsed.rung is Origin.REPLACE or any(text.startswith(p.strip()) for p in prefixes if p.strip())


def replace_prefixes(cfg: Optional[Config]) -> Sequence[str]:
    """The drain reasons that ask for a replacement on this site (``sync.remediate_reasons``)."""
    sync = getattr(cfg, "sync", None)
    return tuple(sync.remediate_reasons) if sync is not None else ()


def automatic(cfg: Optional[Config]) -> bool:
    """This site's config replaces nodes automatically (``autoheal sync`` runs the ``remediate`` step)."""
    sync = getattr(cfg, "sync", None)
    return sync is not None and "remediate" in sync.enabled_steps


def who_replaces(cfg: Optional[Config]) -> str:
    """Who acts on a node waiting for a replacement, in words."""
    if automatic(cfg):
        # the node cannot see whether a sync runs: the config says one should; a person if none does
        return "autoheal sync (step remediate, within the circuit breaker's limits; a person where no sync runs)"
    return "a person: no automatic replacement here (sync.enabled_steps has no remediate)"


def after_repair(node: str) -> str:
    """What the person runs once the machine is repaired or replaced."""
    return f"after the repair: `autoheal check --node {node} --clear-faults` and `autoheal node resume {node}`"


def message(node: str, reason: str, cfg: Optional[Config]) -> str:
    return f"{node} waits for a replacement by {who_replaces(cfg)}: {reason}; {after_repair(node)}"
