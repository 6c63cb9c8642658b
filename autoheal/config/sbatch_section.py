"""Config of the researcher side (``autoheal sbatch`` and its job runner)."""

from __future__ import annotations

from dataclasses import dataclass

from autoheal.config.schema import setting


@dataclass
class SbatchSection:
    """Defaults for ``autoheal sbatch`` (command-line options and ``#AUTOHEAL`` lines win)."""

    grace: int = setting(120, doc="Seconds between the grace signal and the requeue: time to checkpoint.",
                         min=5, max=3600)
    signal: str = setting("USR2", doc="Signal sent to the batch shell (then forwarded to the job's steps) "
                          "to ask for a checkpoint. USR1 is avoided: NCCL may use it.")
    max_restarts: int = setting(5, doc="Stop requeueing after this many restarts.", min=0, max=1000)
