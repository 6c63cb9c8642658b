"""A progress marker for jobs whose checkpoints are not in autoheal's format.

Frameworks keep their own checkpoints (submitit pickles the callable, Lightning writes ``.ckpt`` files).
The runner cannot read those, so without help it would record ``step=none`` at every restart and the
no-progress rule ("two restarts in a row resume from the same step") could stop a job that is making
progress. One call from the training loop, after each of the framework's checkpoints, fixes that::

    from autoheal.sbatch_helpers import report_progress
    report_progress(step)          # into $AUTOHEAL_CHECKPOINT_DIR (no-op outside `autoheal sbatch`)

The marker is a small JSON file written atomically (temp file, fsync, rename); reading it opens only a
regular file of bounded size, so a broken or hostile marker is ignored, never a hang.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Mapping, Optional, Union

PROGRESS_FILE = "autoheal-progress.json"
_MAX_BYTES = 4096


def report_progress(step: int, directory: Union[str, os.PathLike[str], None] = None,
                    environ: Optional[Mapping[str, str]] = None) -> Optional[Path]:
    """Record that training reached ``step`` (a checkpoint of the framework's own exists for it).

    ``directory`` defaults to ``$AUTOHEAL_CHECKPOINT_DIR``; without either nothing is written and None
    is returned, so the call is safe in code that also runs outside ``autoheal sbatch``. Only rank 0
    (``RANK``/``SLURM_PROCID`` unset or 0) writes."""
    from autoheal.sbatch_helpers.checkpoint import CheckpointError, _write_durable, env_rank

    env = os.environ if environ is None else environ
    target = directory if directory is not None else env.get("AUTOHEAL_CHECKPOINT_DIR")
    if not target or env_rank(env) != 0:
        return None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"report_progress: step must be a whole number >= 0, got {step!r}")
    path = Path(target) / PROGRESS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"step": step, "time": round(time.time(), 3), "job": env.get("SLURM_JOB_ID", "")}
    _write_durable(path, json.dumps(data).encode())
    return path


def read_progress(directory: Union[str, os.PathLike[str], None]) -> Optional[int]:
    """The step of the last ``report_progress`` in ``directory``; None when there is none or it is not
    a small regular file holding a step."""
    from autoheal.sbatch_helpers.checkpoint import _read_regular

    if not directory:
        return None
    try:
        data = json.loads(_read_regular(Path(directory) / PROGRESS_FILE, limit=_MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    step = data.get("step") if isinstance(data, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None
