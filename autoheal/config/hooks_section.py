"""Config of the node side (``autoheal.hooks``): checks, thresholds, XID policy, drains and resumes."""

from __future__ import annotations

from dataclasses import dataclass

from autoheal.config.schema import setting


@dataclass
class HooksSection:
    """Node-side health checks and the Slurm entry points (healthcheck, prolog, epilog, xid-watch)."""

    state_dir: str = setting("/var/lib/autoheal/node", doc="Per-node state: last check result, seen XIDs, "
                             "consecutive passes, recovery-ladder counts.")
    resume_after_passes: int = setting(2, doc="Consecutive passing healthchecks before we resume a node "
                                       "we drained.", min=1, max=100)
    resume_cooldown: float = setting(300.0, doc="Seconds after our drain before we may resume the node.",
                                     min=0, max=86400)
