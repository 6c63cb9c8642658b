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

That on-signal pickle is all submitit saves, and it needs the state copied off the GPU: a GPU that
fell off the bus fails the next step first, and that copy too. So the trainer also keeps a durable
checkpoint every ``--checkpoint-every`` steps (autoheal's checkpoint API: verified by size, checksum
and owner on loading; ``$AUTOHEAL_CHECKPOINT_DIR`` under ``autoheal sbatch``, else
``<folder>/<job id>_checkpoints``). On a GPU failure (a ``CUDA error`` listed in
``GPU_FAILURE_ERRORS``; not "out of memory", the job's own, raised as any error) it hands over to
submitit's own handler (the preemption signal to itself): ``checkpoint()`` then pickles the last
saved state, never the GPU's (once a GPU error was seen nothing is copied off it: CUDA reports errors
late and a faulted device can still answer with corrupt state), and submitit requeues the job as on a
preemption (at most ``max_gpu_requeues`` times: a CUDA error of the job's own must not requeue it
forever). Raising the error instead would end the job with submitit's error result, and the waiting
client would report the run failed although Slurm (or autoheal) requeues it. submitit checkpoints and
requeues on global rank 0 only: a rank k > 0 whose GPU failed signals the whole step with ``scancel``
so that rank 0 does it, and leaves on the requeue's SIGTERM (see ``Trainer._ask_rank0``). A restart
resumes from whichever is further: the pickle or the newest valid durable checkpoint, and the state it
resumed from is the saved one (a later failure never pickles an older one). Work lost on XID 79: the
steps since the last save (durable, or the pickle this run resumed from).

Note: when submitit's own ``scontrol requeue`` fails (slurmctld down at the fault), its
CalledProcessError ends the job with an error result; and submitit calls a signal after 80% of the
time limit a time-out, so a GPU failure then spends one of ``max_num_timeout``.

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

Several ranks (``--nodes``, ``--tasks-per-node``): every rank trains a replica of the same state and only
global rank 0 writes the durable checkpoint (data-parallel: its replica is enough; the checkpoint API
lets rank 0 alone publish one). ``--collective`` adds a real allreduce among the ranks every step (the
tiny trainer's TCP one, standing in for DDP's gradient all-reduce): then, as under NCCL, a rank whose
peer failed or hung blocks in it with the preemption signal held, so nobody can checkpoint on the signal;
under ``autoheal sbatch`` the runner's hang rule ends the step (each step writes a ``heartbeat()``, a
no-op outside ``autoheal sbatch``) and the job resumes from the last durable save.

``--device lab`` (the autoheal lab only; submit with ``--gpus-per-node``) makes each step, each durable
save and the copy of the state in ``checkpoint()`` a "GPU call" on the step's fake GPUs
(``autoheal_lab.fakedevice``), as a CUDA job meets its GPU: after XID 79 the next call fails. Without
``--device`` (the default, and on a real cluster) nothing of the lab is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Mapping, NoReturn, Optional, Tuple

import submitit

try:
    from autoheal.sbatch_helpers import heartbeat, report_progress
except ImportError:  # autoheal not installed where the job runs: the recipe still works
    def _no_progress(step: int, *args: Any, **kwargs: Any) -> None:
        return None

    report_progress = _no_progress
    heartbeat = _no_progress


def next_state(state: int, step: int) -> int:
    return (state * 31 + step + 1) % 1_000_003


def expected_final_state(steps: int) -> int:
    """What an uninterrupted run computes: a resumed run must end with the same value."""
    state = 0
    for step in range(steps):
        state = next_state(state, step)
    return state


#: submitit's preemption signal (its ``SUBMITIT_PREEMPT_SIGNAL``, USR2 by default): the one its handler
#: checkpoints and requeues on
PREEMPT_SIGNAL_ENV = "SUBMITIT_PREEMPT_SIGNAL"


def preempt_signal(environ: Optional[Mapping[str, str]] = None) -> int:
    env = os.environ if environ is None else environ
    name = (env.get(PREEMPT_SIGNAL_ENV) or "USR2").strip().upper()
    return int(getattr(signal, name if name.startswith("SIG") else "SIG" + name, signal.SIGUSR2))


#: What CUDA says (``cudaGetErrorString``, after PyTorch's ``CUDA error: ``) when the GPU failed under the
#: job rather than the job failing on it; matched as a prefix of a line of the error, nothing else
#: counts. XID 79 (fallen off the bus) shows as the first three or "unknown error"; XID 13/31/43 as a
#: launch failure or an illegal access (also a job's own bad pointer: the requeue cap bounds that);
#: XID 48/94/95 as the uncorrectable ECC error; XID 74 as the NVLink one. Deliberately NOT here: "out
#: of memory" (cuBLAS/cuDNN handles, cudaMalloc outside the caching allocator: the job's own, a requeue
#: only meets it again), "device-side assert triggered", "invalid argument", "too many resources
#: requested for launch" (bugs of the job). An error not listed is raised: the run fails as before.
GPU_FAILURE_ERRORS = (
    "unspecified launch failure",
    "an illegal memory access was encountered",
    "CUDA-capable device(s) is/are busy or unavailable",
    "unknown error",
    "uncorrectable ECC error encountered",
    "uncorrectable NVLink error was detected during the execution",
)
CUDA_ERROR_PREFIX = "CUDA error: "


def is_gpu_failure(exc: BaseException) -> bool:
    """A GPU that failed under the job, as CUDA reports it through PyTorch (a ``RuntimeError`` with a line
    ``CUDA error: <one of GPU_FAILURE_ERRORS>``), or the lab's :class:`DeviceLost` (matched by its class:
    the fake device's message names the XID, not a CUDA string). Not an out-of-memory error."""
    for cls in type(exc).__mro__:
        if cls.__module__ == "autoheal_lab.fakedevice" and cls.__name__ == "DeviceLost":
            return True
    if not isinstance(exc, RuntimeError):
        return False
    for line in str(exc).splitlines():
        line = line.strip()
        if line.startswith(CUDA_ERROR_PREFIX):
            kind = line[len(CUDA_ERROR_PREFIX):]
            return any(kind.startswith(known) for known in GPU_FAILURE_ERRORS)
    return False


def global_rank() -> int:
    """This task's rank as submitit's own handler reads it (``SLURM_PROCID`` under Slurm); 0 outside a
    submitit job (a plain ``python`` run, a unit test: one process)."""
    try:
        return int(submitit.JobEnvironment().global_rank)
    except Exception:  # submitit raises when no job environment is active
        return 0


def _digits(value: str) -> bool:
    return value.isascii() and value.isdigit()


def step_signal_argv(sig: int, environ: Mapping[str, str]) -> Optional[List[str]]:
    """``scancel`` sending ``sig`` to every task of this job step (rank 0's submitit handler among them,
    as Slurm's ``--signal`` would), or None without numeric ``SLURM_JOB_ID`` and ``SLURM_STEP_ID``."""
    job, step = environ.get("SLURM_JOB_ID", "").strip(), environ.get("SLURM_STEP_ID", "").strip()
    if not (_digits(job) and _digits(step)):
        return None
    return ["scancel", f"--signal={signal.Signals(sig).name[3:]}", f"{job}.{step}"]


def newer(pickled: Tuple[int, int], durable: Optional[Tuple[int, int]]) -> Tuple[str, Tuple[int, int]]:
    """Where to resume: submitit's pickle (what ``checkpoint()`` saved on the signal) or the newest valid
    durable checkpoint, whichever is further; the pickle on a tie (it is already loaded)."""
    if durable is not None and durable[0] > pickled[0]:
        return "durable", durable
    return ("pickle" if pickled[0] else "none"), pickled


class Trainer(submitit.helpers.Checkpointable):
    """A stand-in for a training loop. submitit pickles the whole object on checkpoint, so its
    attributes are the checkpoint: keep the progress in ONE attribute (a signal handler runs between
    two statements, never inside one assignment).

    Two checkpoints, because submitit's own cannot always be written: every ``checkpoint_every`` steps
    a durable one (autoheal's checkpoint API: size, checksum, owner = this job), and submitit's pickle
    on the preemption signal. A GPU that fell off the bus (XID 79) fails the next step, and the copy of
    the state off it in ``checkpoint()``: then (and after any GPU error, even if the copy would work)
    the pickle carries the last saved state, never the GPU's, and the job is requeued through
    submitit's own handler as on any preemption. A restart resumes from whichever of the two is
    further, and that state counts as saved from then on."""

    def __init__(self, device: str = "none", checkpoint_every: int = 10, checkpoint_dir: str = "",
                 log_every: int = 5, max_gpu_requeues: int = 3, rank_wait_s: float = 600.0,
                 collective: bool = False, collective_timeout: float = 600.0) -> None:
        self.progress: Tuple[int, int] = (0, 0)  # (step, state)
        self.saved: Tuple[int, int] = (0, 0)  # the last durable save (host memory: copied off the GPU)
        self.runs: List[Dict[str, Any]] = []  # where each run started
        self.device = device  # the kind only: the device itself is opened on the node, never pickled
        self.checkpoint_every = checkpoint_every
        self.checkpoint_dir = checkpoint_dir
        self.log_every = log_every
        #: requeues after a GPU failure left (a CUDA error that is the job's own would otherwise loop)
        self.gpu_requeues_left = max_gpu_requeues
        self.max_gpu_requeues = max_gpu_requeues
        #: how long a rank other than 0 whose GPU failed waits for rank 0's requeue to end it
        self.rank_wait_s = rank_wait_s
        #: a real allreduce among the tasks every step (DDP's gradient all-reduce; see _open_collective)
        self.collective = collective
        self.collective_timeout = collective_timeout  # NCCL's default process-group timeout
        self._dev: Any = None
        self._mgr: Any = None
        self._rank = 0  # this task's global rank (set where it runs)
        #: the type of the GPU error seen in this process ("" none): then the state on the GPU is never
        #: copied and trusted again
        self._gpu_error = ""

    def _gpu(self) -> Any:
        """The step's GPUs (``--device lab``: the lab's fake ones, imported only then), else None."""
        if self.device == "lab" and self._dev is None:
            from autoheal_lab import fakedevice

            self._dev = fakedevice.FakeDevice.from_env()
            say(f"device lab gpus={self._dev.describe()}")
        return self._dev

    def _store(self) -> Any:
        """The durable checkpoints: ``checkpoint_dir``, else ``$AUTOHEAL_CHECKPOINT_DIR`` (``autoheal
        sbatch``), else ``<submitit folder>/<job id>_checkpoints`` (one per job: a requeue keeps its id).
        None without autoheal's checkpoint API or with ``checkpoint_every`` 0."""
        if self._mgr is None and self.checkpoint_every > 0:
            try:
                from autoheal.sbatch_helpers import checkpoint as ck
            except ImportError:
                say("warning no durable checkpoints: autoheal is not installed where the job runs")
                self.checkpoint_every = 0
                return None
            directory = self.checkpoint_dir or os.environ.get("AUTOHEAL_CHECKPOINT_DIR", "")
            if not directory:
                env = submitit.JobEnvironment()
                directory = str(env.paths.folder / f"{env.job_id}_checkpoints")
            self._mgr = ck.CheckpointManager(directory, keep=2)
        return self._mgr

    def _durable(self) -> Optional[Tuple[int, int]]:
        """(step, state) of the newest valid durable checkpoint, or None."""
        mgr = self._store()
        found = mgr.latest_valid() if mgr is not None else None
        for rejected in (mgr.rejections if mgr is not None else []):
            say(f"warning skipped {rejected}")
        if found is None:
            return None
        doc = json.loads(found.read_bytes().decode("utf-8"))
        if doc.get("step") != found.step or not isinstance(doc.get("state"), int):
            say(f"warning skipped {found.path}: not this trainer's state")
            return None
        return found.step, doc["state"]

    def _open_collective(self, dev: Any) -> Any:
        """With ``collective`` and more than one task: the ranks' allreduce, connected (rank 0 the hub at
        ``MASTER_ADDR``:``MASTER_PORT``, else the step's first node and a port from the job id). It is the
        tiny trainer's TCP allreduce (autoheal must be installed), standing in for torch.distributed's:
        like NCCL it blocks the rank until ``collective_timeout`` when a peer is gone or hung, with the
        preemption signal held pending (a Python handler does not run inside NCCL's C++ code), and with
        ``--device lab`` it hangs over an NVLink that is down."""
        if not getattr(self, "collective", False):
            return None
        env = submitit.JobEnvironment()
        if env.num_tasks < 2:
            return None
        from autoheal.sbatch_helpers.examples.tiny_trainer import Collective, rendezvous

        addr, port = rendezvous()
        coll = Collective(env.global_rank, env.num_tasks, addr, port, getattr(self, "collective_timeout", 600.0),
                          (preempt_signal(), signal.SIGTERM), dev.links_ok if dev is not None else (lambda: True))
        coll.connect()
        say(f"collective ranks={env.num_tasks} hub={addr}:{port}")
        return coll

    def _agree(self, coll: Any, step: int, state: int) -> None:
        """The step's collective: every rank contributes its new state; data-parallel ranks must agree."""
        total = coll.allreduce(step, state)
        if total != coll.world * state:
            raise RuntimeError(f"rank {coll.rank} at step {step}: the ranks' states differ (sum {total})")

    def _save(self, dev: Any) -> None:
        """A durable checkpoint of the current progress (the state comes off the GPU first)."""
        if dev is not None:
            dev.copy_to_host()
        step, state = self.progress
        path = self._store().save(step, json.dumps({"step": step, "state": state}).encode(), {"trainer": "submitit"})
        self.saved = (step, state)
        say(f"checkpoint saved step={step} path={path}")
        report_progress(step)  # into $AUTOHEAL_CHECKPOINT_DIR under `autoheal sbatch`

    def __getstate__(self) -> Dict[str, Any]:
        # an open device belongs to one process on one node; the store is opened again where it runs
        # _gpu_error: about this process's GPU, not the next run's
        return dict(self.__dict__, _dev=None, _mgr=None, _gpu_error="", _rank=0)

    def __call__(self, steps: int, step_seconds: float) -> Dict[str, Any]:
        node = os.environ.get("SLURMD_NODENAME", "")
        source, self.progress = newer(self.progress, self._durable())
        # whatever it came from, the resumed state is a saved one: submitit's pickle holds a state that was
        # copied off a working GPU (or the last durable one). Keeping the older durable step here would let
        # the next GPU failure pickle that over the newer pickle: a checkpoint going backwards.
        self.saved = self.progress
        self._gpu_error = ""  # a new process (the field is not pickled): no GPU error seen yet
        self._rank = global_rank()
        start = self.progress[0]
        self.runs.append({"start": start, "node": node, "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
                          "from": source})
        say(f"start step={start} node={node} job={os.environ.get('SLURM_JOB_ID', '')} resumed_from={source}",
            timed=True)
        try:
            dev = self._gpu()
            coll = self._open_collective(dev)
            while self.progress[0] < steps:
                time.sleep(step_seconds)
                if dev is not None:
                    dev.step()  # the step's kernels: after XID 79 this raises, as CUDA does
                step, state = self.progress
                new = next_state(state, step)
                if coll is not None:
                    self._agree(coll, step, new)
                self.progress = (step + 1, new)
                heartbeat(step + 1)  # under `autoheal sbatch`: the runner's hang rule sees each step
                if self.log_every and self.progress[0] % self.log_every == 0:
                    say(f"step={self.progress[0]}", timed=True)
                # data-parallel: rank 0's replica is the checkpoint (the API lets rank 0 alone publish one)
                if self.checkpoint_every and self.progress[0] % self.checkpoint_every == 0 and self._rank == 0:
                    self._save(dev)
        except Exception as exc:
            if not is_gpu_failure(exc):
                raise
            # first, before anything can run a handler: from now on nothing on the GPU is trusted
            self._gpu_error = type(exc).__name__
            self._gpu_failed(exc)
        say(f"done step={self.progress[0]} final_state={self.progress[1]}")
        return {"step": self.progress[0], "final_state": self.progress[1], "runs": self.runs}

    def _gpu_failed(self, exc: BaseException) -> None:
        """The GPU failed under a step: requeue through submitit's own handler (the preemption signal to
        this process), whose ``checkpoint()`` pickles the last durable state. Raising instead would end
        the job with submitit's error result, and the client would report the run failed."""
        say(f"device error step={self.progress[0]} error={type(exc).__name__} "
            f"{str(exc).splitlines()[0] if str(exc) else ''}", timed=True)
        sig = preempt_signal()
        if self.gpu_requeues_left <= 0 or not callable(signal.getsignal(sig)):
            raise exc  # not under submitit, or too many GPU failures: the job's own error, reported as such
        if global_rank() != 0:
            self._ask_rank0(exc, sig)
        self.gpu_requeues_left -= 1
        os.kill(os.getpid(), sig)
        for _ in range(100):  # the handler runs at once (between two bytecodes, or ends the sleep): it exits
            time.sleep(0.1)
        raise exc  # only if the handler came back

    def _ask_rank0(self, exc: BaseException, sig: int) -> NoReturn:
        """Rank k > 0: submitit's handler checkpoints and requeues on global rank 0 only (it returns at
        once elsewhere), and only rank 0's trainer is pickled. So send the preemption signal to the whole
        step, as Slurm's ``--signal`` does: rank 0 (a working GPU: its copy of the replicated state is
        good) checkpoints and requeues, and the requeue ends this task: on its SIGTERM (which submitit
        itself ignores) this rank leaves at once (:func:`leave_on_requeue`), with no result written: no
        error result of this rank overrides rank 0's requeue. Raised instead (the job's own error)
        without a step to signal, when ``scancel`` fails, after ``max_gpu_requeues`` requeues of the job
        (``SLURM_RESTART_COUNT``: every requeue counts, since rank 0 cannot know which were GPU failures),
        or when nothing ended this task within ``rank_wait_s``. Not covered: a real DDP rank 0 blocked in
        a collective that waits for this rank runs its handler only when the collective returns (NCCL's
        timeout; with async error handling NCCL's watchdog may abort it first: then only autoheal's
        grace requeue saves the job); with ``--collective`` that is the lab's case too, and the runner's
        hang rule ends the step under ``autoheal sbatch``."""
        argv = step_signal_argv(sig, os.environ)
        restarts = os.environ.get("SLURM_RESTART_COUNT", "0").strip() or "0"
        if argv is None or not _digits(restarts) or int(restarts) >= getattr(self, "max_gpu_requeues", 3):
            raise exc
        # Slurm ends a requeued job's tasks with SIGTERM and SIGKILL only after KillWait: waiting for the
        # SIGKILL held the requeued job back by KillWait (122 s on the lab) for a rank with nothing to save.
        # Set before the signal goes out: rank 0's requeue may come before scancel returns.
        previous = signal.signal(signal.SIGTERM, leave_on_requeue)
        try:
            # scancel runs inside this step, so Slurm signals it too: with the default action it died of the
            # very signal it had just delivered (exit -12, seen on the lab) and this rank raised, writing
            # the error result it must not. Ignored by the shell before the exec (kept across it), it exits
            # 0. A shell rather than preexec_fn: that is not safe in a process with threads.
            subprocess.run(["sh", "-c", f'trap "" {signal.Signals(sig).name[3:]}; exec "$@"', argv[0], *argv],
                           check=True, timeout=30, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except (OSError, subprocess.SubprocessError) as err:
            signal.signal(signal.SIGTERM, previous)  # no requeue is coming: this rank's error result is due
            detail = (getattr(err, "stderr", b"") or b"").decode(errors="replace").strip().splitlines()
            say(f"warning could not signal the step: {type(err).__name__}{': ' + detail[-1] if detail else ''}",
                timed=True)
            raise exc from None
        say(f"asked rank 0 to checkpoint and requeue: {' '.join(argv)}", timed=True)
        deadline = time.monotonic() + getattr(self, "rank_wait_s", 600.0)
        while time.monotonic() < deadline:  # rank 0's requeue ends this process
            time.sleep(1.0)
        raise exc

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        # one requeue: a second signal (autoheal's, after a GPU failure handled above) while this one is
        # handled would checkpoint and requeue again
        signal.signal(preempt_signal(), signal.SIG_IGN)
        if getattr(self, "_gpu_error", ""):
            # CUDA reports errors late and a faulted device may still answer (XID 13/31/48/94: a poisoned
            # context can return bytes): a copy that succeeds now proves nothing about the state
            return self._checkpoint_saved(f"error={self._gpu_error}: seen by a step, the state on the GPU is "
                                          "not trusted", args, kwargs)
        if self._dev is not None:
            try:
                self._dev.copy_to_host()  # the state comes off the GPU first: impossible from a GPU that is gone
            except Exception as exc:
                if not is_gpu_failure(exc):
                    raise
                self._gpu_error = type(exc).__name__
                return self._checkpoint_saved(f"error={type(exc).__name__}: the state is on a lost GPU", args, kwargs)
        say(f"checkpoint step={self.progress[0]}")
        report_progress(self.progress[0])  # into $AUTOHEAL_CHECKPOINT_DIR under `autoheal sbatch`
        return super().checkpoint(*args, **kwargs)  # resubmits this object, progress included

    def _checkpoint_saved(self, why: str, args: Tuple[Any, ...],
                          kwargs: Dict[str, Any]) -> submitit.helpers.DelayedSubmission:
        """Pickle the last saved state (never older than the one this run resumed from), not the GPU's."""
        say(f"checkpoint failed step={self.progress[0]} {why}; requeued with the last durable "
            f"step={self.saved[0]}", timed=True)
        self.progress = self.saved
        return super().checkpoint(*args, **kwargs)


def leave_on_requeue(signum: int, frame: Any) -> None:
    """SIGTERM for a rank k > 0 that asked rank 0 to requeue: end the process now, writing no result
    (``os._exit``: submitit's error result would say the run failed)."""
    say(f"ended by signal {signal.Signals(signum).name} after asking rank 0 to requeue", timed=True)
    os._exit(128 + signum)


def say(text: str, timed: bool = False) -> None:
    """One trainer line (``timed``: with the trainer's own clock, ``time=<epoch>``, at its end)."""
    print(f"submitit-trainer: {text}" + (f" time={time.time():.3f}" if timed else ""), flush=True)


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
    ap.add_argument("--nodes", type=int, default=1, help="nodes for the job (default 1)")
    ap.add_argument("--tasks-per-node", type=int, default=1,
                    help="tasks (ranks) per node (default 1); with --device lab give each task its own node")
    ap.add_argument("--collective", action="store_true",
                    help="a real allreduce among the ranks every step (needs autoheal installed; a stand-in "
                         "for DDP's gradient all-reduce: a rank whose peer is gone or hung blocks in it)")
    ap.add_argument("--device", choices=("none", "lab"), default="none",
                    help="lab: each step on the job's fake GPUs (the autoheal lab only; default none)")
    ap.add_argument("--checkpoint-every", type=int, default=10,
                    help="a durable checkpoint every N steps (0: only submitit's pickle on the signal)")
    ap.add_argument("--checkpoint-dir", default="",
                    help="where the durable checkpoints go (shared filesystem; default $AUTOHEAL_CHECKPOINT_DIR "
                         "under autoheal sbatch, else <folder>/<job id>_checkpoints)")
    ap.add_argument("--log-every", type=int, default=5, help="print the step every N steps (0: never)")
    args = ap.parse_args(argv)
    params: Dict[str, Any] = {}
    if args.exclude:
        params["exclude"] = args.exclude
    if args.gpus_per_node:
        params["gpus_per_node"] = args.gpus_per_node
    if args.nodes > 1:
        params["nodes"] = args.nodes
    if args.tasks_per_node > 1:
        params["ntasks_per_node"] = args.tasks_per_node
    ex = autoheal_executor(args.folder, args.grace, args.via_autoheal_sbatch, **params)
    trainer = Trainer(args.device, args.checkpoint_every, args.checkpoint_dir, args.log_every,
                      collective=args.collective)
    job = ex.submit(trainer, args.steps, args.step_seconds)
    print(f"submitted {job.job_id}", flush=True)
    deadline = time.monotonic() + args.wait
    while not job.done():  # done once the result pickle exists (sacct is not needed)
        if time.monotonic() > deadline:
            print(f"timeout: job {job.job_id} gave no result within {args.wait:g}s", file=sys.stderr)
            return 1
        time.sleep(1)
    try:
        results = job.results()  # one per task: every rank's own
    except Exception as exc:  # submitit raises the job's own failure here
        print(f"failed: job {job.job_id}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
              file=sys.stderr)
        return 1
    result = results[0]  # global rank 0's (its replica is the one checkpointed)
    if len(results) > 1:
        result = dict(result, ranks=[{"step": r["step"], "final_state": r["final_state"]} for r in results])
    print("result " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
