"""Config of the Slurm <-> Kubernetes sync daemon and node remediation (``autoheal sync``)."""

from __future__ import annotations

from dataclasses import dataclass

from autoheal.config.schema import setting


@dataclass
class SyncSection:
    """``autoheal sync``: mirroring node states both ways and replacing broken nodes."""

    slurm_resync_seconds: float = setting(5.0, doc="Seconds between full Slurm reads (one call for all "
                                          "nodes).", min=0.5, max=3600)
    namespace: str = setting("slurm", doc="Namespace of the slurmd pods, Events and the leader Lease.")
