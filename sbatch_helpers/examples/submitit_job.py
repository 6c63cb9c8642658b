#!/usr/bin/env python3
"""submitit + autoheal: a ``Checkpointable`` job that survives a GPU fault and resumes where it was.

What happens on a fault (XID 79 on the job's node, say):

1. autoheal drains the node and gives the job the warning it asked for at submission. submitit asks
   for ``--signal=USR2@<signal_delay_s>`` (no ``B:``), so every step gets SIGCONT then SIGUSR2, as
   Slurm does near the time limit; the batch shell is left alone.
2. submitit's handler calls ``Trainer.checkpoint()``, pickles the trainer (its progress included) and
   runs ``scontrol requeue`` itself. The drained node takes no new job: the requeued job starts on
   another node, unpickles the trainer and goes on from the checkpointed step.
3. A job that neither exits nor requeues within ``hooks.grace_seconds`` is requeued by autoheal.

``autoheal_executor()`` sets submitit up to match autoheal: ``signal_delay_s`` = the grace window
(ask your admins for ``hooks.grace_seconds``; KillWait should be at least your checkpoint time, since
submitit's own requeue starts Slurm's SIGTERM .. KillWait .. SIGKILL), ``--requeue``, and with
``via_autoheal_sbatch=True`` the job is submitted through ``autoheal sbatch`` (restart cap, no-progress
stop, exclusion of the bad node, the cause in the job comment). ``Trainer.checkpoint()`` calls
``report_progress(step)`` so the runner counts submitit's checkpoints as progress (a no-op outside
``autoheal sbatch``).

Run it (the client waits for the result and prints it as JSON)::

    python submitit_job.py --folder ~/submitit-logs --steps 600 --step-seconds 1
    python submitit_job.py --folder ~/submitit-logs --via-autoheal-sbatch

The lab test (tests/integration/test_frameworks_submitit.py) runs this file; its output lines
(``submitted``, ``submitit-trainer: ...``, ``result``) are a contract.

``--device lab`` (the autoheal lab only; submit with ``--gpus-per-node``) makes each step and the copy of
the state before ``checkpoint()`` a "GPU call" on the step's fake GPUs (``autoheal_lab.fakedevice``), as
a CUDA job meets its GPU: after XID 79 the next step fails and ``checkpoint()`` cannot copy the state off
the GPU, so nothing is saved on the signal. submitit's only checkpoint is that one: the run is lost back
to its start. Without ``--device`` (the default, and on a real cluster) nothing of the lab is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from typing import Any, Dict, List, Tuple

import submitit

try:
    from autoheal.sbatch_helpers import report_progress
except ImportError:  # autoheal not installed where the job runs: the recipe still works
    def _no_progress(step: int, *args: Any, **kwargs: Any) -> None:
        return None

    report_progress = _no_progress


def next_state(state: int, step: int) -> int:
    return (state * 31 + step + 1) % 1_000_003


def expected_final_state(steps: int) -> int:
    """What an uninterrupted run computes: a resumed run must end with the same value."""
    state = 0
    for step in range(steps):
        state = next_state(state, step)
    return state


class Trainer(submitit.helpers.Checkpointable):
    """A stand-in for a training loop. submitit pickles the whole object on checkpoint, so its
    attributes are the checkpoint: keep the progress in ONE attribute (a signal handler runs between
    two statements, never inside one assignment)."""

    def __init__(self, device: str = "none") -> None:
        self.progress: Tuple[int, int] = (0, 0)  # (step, state)
        self.runs: List[Dict[str, Any]] = []  # where each run started
        self.device = device  # the kind only: the device itself is opened on the node, never pickled
        self._dev: Any = None

    def _gpu(self) -> Any:
        """The step's GPUs (``--device lab``: the lab's fake ones, imported only then), else None."""
        if self.device == "lab" and self._dev is None:
            from autoheal_lab import fakedevice

            self._dev = fakedevice.FakeDevice.from_env()
            print(f"submitit-trainer: device lab gpus={self._dev.describe()}", flush=True)
        return self._dev

    def __getstate__(self) -> Dict[str, Any]:
        return dict(self.__dict__, _dev=None)  # an open device belongs to one process on one node

    def __call__(self, steps: int, step_seconds: float) -> Dict[str, Any]:
        node = os.environ.get("SLURMD_NODENAME", "")
        start = self.progress[0]
        self.runs.append({"start": start, "node": node, "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0"))})
        print(f"submitit-trainer: start step={start} node={node} job={os.environ.get('SLURM_JOB_ID', '')}",
              flush=True)
        dev = self._gpu()
        while self.progress[0] < steps:
            time.sleep(step_seconds)
            if dev is not None:
                dev.step()  # the step's kernels: after XID 79 this raises, as CUDA does
            step, state = self.progress
            self.progress = (step + 1, next_state(state, step))
            if self.progress[0] % 5 == 0:
                print(f"submitit-trainer: step={self.progress[0]}", flush=True)
        print(f"submitit-trainer: done step={self.progress[0]} final_state={self.progress[1]}", flush=True)
        return {"step": self.progress[0], "final_state": self.progress[1], "runs": self.runs}

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        if self._dev is not None:
            self._dev.copy_to_host()  # the state comes off the GPU first: impossible from a GPU that is gone
        print(f"submitit-trainer: checkpoint step={self.progress[0]}", flush=True)
        report_progress(self.progress[0])  # into $AUTOHEAL_CHECKPOINT_DIR under `autoheal sbatch`
        return super().checkpoint(*args, **kwargs)  # resubmits this object, progress included


class AutohealSlurmExecutor(submitit.SlurmExecutor):
    """submitit's SlurmExecutor, submitting through ``autoheal sbatch`` (same options, same script)."""

    def _make_submission_command(self, submission_file_path) -> List[str]:
        # `autoheal` on PATH, else the one installed next to this Python (a venv not activated)
        here = os.path.join(os.path.dirname(sys.executable), "autoheal")
        exe = shutil.which("autoheal") or (here if os.access(here, os.X_OK) else "autoheal")
        return [exe, "sbatch", str(submission_file_path)]


def autoheal_executor(folder: str, grace_seconds: int = 120, via_autoheal_sbatch: bool = False,
                      **params: Any) -> submitit.SlurmExecutor:
    """A SlurmExecutor whose warning matches autoheal's grace window, requeue-able, with
    ``max_num_timeout`` restarts on time limits. ``params`` go to ``update_parameters`` (time,
    partition, nodes, gpus_per_node, ...)."""
    cls = AutohealSlurmExecutor if via_autoheal_sbatch else submitit.SlurmExecutor
    ex = cls(folder=folder, max_num_timeout=3)
    extra = dict(params.pop("additional_parameters", None) or {})
    extra.setdefault("requeue", True)
    # time: submitit calls a warning "timed-out" once 80% of it has run (and at once for 10 min or
    # less), which spends one of max_num_timeout; give it more than the job needs
    params.setdefault("time", 60)
    ex.update_parameters(signal_delay_s=int(grace_seconds), additional_parameters=extra, **params)
    return ex


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", required=True, help="submitit's log and pickle folder (shared filesystem)")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--step-seconds", type=float, default=1.0)
    ap.add_argument("--grace", type=int, default=120, help="hooks.grace_seconds of your cluster")
    ap.add_argument("--via-autoheal-sbatch", action="store_true", help="submit through `autoheal sbatch`")
    ap.add_argument("--exclude", default="", help="sbatch --exclude")
    ap.add_argument("--wait", type=float, default=3600, help="seconds the client waits for the result")
    ap.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node for the job (default 0: none)")
    ap.add_argument("--device", choices=("none", "lab"), default="none",
                    help="lab: each step on the job's fake GPUs (the autoheal lab only; default none)")
    args = ap.parse_args(argv)
    params: Dict[str, Any] = {}
    if args.exclude:
        params["exclude"] = args.exclude
    if args.gpus_per_node:
        params["gpus_per_node"] = args.gpus_per_node
    ex = autoheal_executor(args.folder, args.grace, args.via_autoheal_sbatch, **params)
    job = ex.submit(Trainer(args.device), args.steps, args.step_seconds)
    print(f"submitted {job.job_id}", flush=True)
    deadline = time.monotonic() + args.wait
    while not job.done():  # done once the result pickle exists (sacct is not needed)
        if time.monotonic() > deadline:
            print(f"timeout: job {job.job_id} gave no result within {args.wait:g}s", file=sys.stderr)
            return 1
        time.sleep(1)
    try:
        result = job.result()
    except Exception as exc:  # submitit raises the job's own failure here
        print(f"failed: job {job.job_id}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
              file=sys.stderr)
        return 1
    print("result " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
