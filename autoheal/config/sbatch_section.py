"""Config of the researcher side (``autoheal sbatch`` and its job runner)."""

from __future__ import annotations

from autoheal.config import values as V
from autoheal.config.schema import setting
from autoheal.records import record

TYPE_CHECKING = False  # typing only for mypy: the hooks load this module on every run
if TYPE_CHECKING:
    from typing import Tuple


@record
class SbatchSection:
    """Defaults for ``autoheal sbatch`` (``#AUTOHEAL`` lines and command-line options win, in that order)."""

    grace: int = setting(120, doc="Seconds between the grace signal and the requeue: time to checkpoint.",
                         min=5, max=3600)
    signal: str = setting("USR2", doc="Signal sent to the batch shell (then forwarded to the job's steps) "
                          "to ask for a checkpoint. USR1 is avoided: NCCL may use it. A name Slurm knows (USR2, "
                          "SIGUSR2, usr2 all mean USR2); KILL and STOP cannot be caught, so they are refused.",
                          parse=V.grace_signal)
    max_restarts: int = setting(5, doc="Stop requeueing after this many restarts.", min=0, max=1000)
    checkpoint_dir: str = setting("", doc="Checkpoint folder exported as AUTOHEAL_CHECKPOINT_DIR; %j (job id, "
                                  "123 or 123_4 for array tasks), %A, %a, %x (job name) and %u (user) are "
                                  "expanded at run time. Empty: <submit dir>/autoheal-checkpoints/%j-<token>, "
                                  "the token made at submission (a job id that comes back never shares a folder).",
                                  parse=V.path)
    exclude_failed: bool = setting(True, doc="After a node problem, add the failed node to the job's "
                                   "excluded nodes before it restarts (merged with the user's own --exclude).")
    requeue_margin: int = setting(15, doc="Seconds before the grace window would cross the time limit at "
                                  "which the runner starts checkpoint-then-requeue on its own (in case the "
                                  "Slurm signal comes late or not at all).", min=0, max=3600)
    hang_after_fault: int = setting(10, doc="After a grace signal: seconds with no rank's heartbeat advancing "
                                    "(no rank saving either) before the runner ends the step at once instead of "
                                    "waiting the whole grace for ranks blocked in a collective. Never more than "
                                    "half of hooks.grace_seconds.", min=1, max=3600)
    watchdog: int = setting(300, doc="With no fault signal: seconds with no rank's heartbeat advancing before "
                            "the runner ends the step and requeues the job (cause 'hang'); only for jobs that call "
                            "heartbeat() each step, and the first step of a run gets twice as long. Well under "
                            "NCCL's 600 s collective timeout. 0: off.", min=0, max=7 * 86400)
    spare_nodes: int = setting(0, doc="Hot spares inside the allocation: the job gets this many nodes more "
                               "than it asks for (and --no-kill), its steps run on the others, and a node "
                               "that fails is swapped for a spare without a requeue. 0: off.", min=0, max=64)
    python: str = setting("", doc="Python interpreter the generated batch script runs the job runner with "
                          "(must have autoheal installed on the compute nodes). Empty: the interpreter "
                          "running `autoheal sbatch`.", parse=V.path)
    sbatch: str = setting("", doc="sbatch binary. Empty: slurm.bin_dir, then PATH and the usual directories.",
                         parse=V.path)
    submit_timeout: float = setting(60.0, doc="Seconds before a hanging sbatch submission is abandoned.",
                                    min=1, max=3600)


def limits(name: str) -> Tuple[int, int]:
    """(min, max) of an integer ``[sbatch]`` setting: also the range of the wrapper option of that name."""
    meta = SbatchSection.__dataclass_fields__[name].metadata
    return int(meta["min"]), int(meta["max"])
