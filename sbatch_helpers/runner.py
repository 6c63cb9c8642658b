"""The job runner: runs inside the allocation as the batch shell (``exec``'d by the generated script).

``python -m autoheal.sbatch_helpers.runner [--grace S] [--signal SIG] [--max-restarts N] ...
--script FILE -- [ARGS]``

For every run of the job it:

1. works out which restart this is (``SLURM_RESTART_COUNT``, unset = 0) and why the previous run ended
   (the cause the previous run recorded in the job comment, else ``sacct``, else node reasons);
2. stops with a clear final state when the restart budget is spent or two consecutive restarts resume
   from the same checkpoint step (no progress);
3. exports ``AUTOHEAL_CHECKPOINT_DIR``, ``AUTOHEAL_RESTART_COUNT``, ``AUTOHEAL_RESUME_FROM`` (newest valid
   checkpoint), ``AUTOHEAL_REQUEUE_REASON`` and ``AUTOHEAL_GRACE_SIGNAL`` and starts the user's script as a
   child in its own process group;
4. on the grace signal, on SIGTERM, or ``requeue_margin`` seconds before the grace window would cross the
   time limit: forwards the signal to the child's process group (``srun`` relays it to every task), waits
   up to the grace window for the whole group to exit (SIGTERM then SIGKILL after that), classifies the
   cause from Slurm's data, records it (job comment + journal + webhook) and requeues the job — checkpoint
   first, requeue second; after a node problem through requeuehold -> ExcNodeList (merged) -> release;
5. watches the ranks' heartbeats (``hang.py``, ``progress.heartbeat``): after the signal, ranks blocked in
   a collective (no handler of theirs runs) are not waited for past ``--hang-after-fault``; with no signal
   at all, ``--watchdog`` ends a step that stopped and requeues the job (cause ``hang``).

The requeue must survive the kill it triggers: requeuehold makes Slurm SIGTERM every process of the job,
our own ``scontrol`` children included. So the intent (``state=requeueing excl=...``) goes into the job
comment before the hold, the Slurm calls run with the termination signals ignored (a disposition children
inherit), each step is idempotent and retried, and whatever a SIGKILL still cuts short is finished by
``autoheal guard`` outside the job (it releases only jobs held by requeuehold whose comment says so).

Exit codes: the user command's own code when it ends by itself; 0 after a requeue; 91 when the restart
budget is spent; 92 when no progress is made; 90 on a runner usage error.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from autoheal.errors import (
    SlurmError,
    SlurmJobAlreadyPending,
    SlurmJobBusy,
    SlurmJobFinished,
    SlurmJobNotPending,
    SlurmNotFound,
    SlurmRequeueDisabled,
    SlurmUnavailable,
)
from autoheal.sbatch_helpers import causes, hang
from autoheal.sbatch_helpers.comment import CommentState, node_unhealthy, plan_exclusions, split_nodes
from autoheal.sbatch_helpers.hotspare_runner import HotSpareRun
from autoheal.sbatch_helpers.preempt import SignalHandler
from autoheal.signals import SignalNameError, signal_name, to_signal

if TYPE_CHECKING:
    from autoheal.job_records import JobOutbox
    from autoheal.journal import Journal
    from autoheal.notify import Notifier
    from autoheal.sbatch_helpers.checkpoint import Rejection
    from autoheal.sbatch_helpers.comment import Exclusions
    from autoheal.slurm.base import SlurmAdapter
    from autoheal.slurm.model import Job, Node
from autoheal.sbatch_helpers.wrapper import WrapperOptions

EXIT_REQUEUED = 0
EXIT_USAGE = 90
EXIT_MAX_RESTARTS = 91
EXIT_NO_PROGRESS = 92
KILL_AFTER_TERM = 5.0  # seconds between SIGTERM and SIGKILL once the grace window is over
#: Seconds srun is given to exit by itself once its steps were SIGKILLed through Slurm (end_step).
#: Killed at once with them, srun cannot take the killed ranks' task exits ("Failed to send
#: MESSAGE_TASK_EXIT: Connection refused" in slurmd's log): the old step then ended ~2 s late and the
#: next srun waited for it (tiers bench: the new step launched 2.07 s after a shrink; 0.23 s with this).
SRUN_EXIT_WAIT = 2.0
POLL = 0.2
#: Seconds the final comment (completed, failed, ...) is retried while slurmctld does not answer.
FINAL_COMMENT_RETRY = 30.0
#: Seconds the runner keeps retrying one requeue step while slurmctld does not answer. Below the
#: recommended KillWait (120 s) so the runner ends by itself; past it the guard finishes the requeue.
REQUEUE_STEP_BUDGET = 60.0
#: Seconds between reads of the ranks' heartbeats while the step runs (one folder listing and a small
#: file per rank on a shared filesystem), and after a fault signal, when an answer is wanted soon.
HEARTBEAT_POLL = 2.0
HEARTBEAT_POLL_FAULT = 0.5
#: Seconds the watchdog's requeue waits for a node that stopped responding to be DOWN or answer again:
#: past SlurmdTimeout (300 s by default). Requeued earlier, slurmctld restarted the job with a broken
#: GRES allocation on the half-dead node and every srun failed (issue 23, seen in the lab).
NODE_SETTLE_BUDGET = 330.0
NODE_SETTLE_PAUSE = 5.0
#: Signals Slurm's kill sequence (and impatient users) send; ignored while the requeue is in flight.
SHIELDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def say(text: str) -> None:
    """One runner line on stderr (lands in the job's output file)."""
    sys.stderr.write(f"autoheal-runner: {text}\n")
    sys.stderr.flush()


# ---- job identity and the comment record (pure) --------------------------------------------------


@dataclass(frozen=True)
class JobIdentity:
    """Who we are, from the batch environment."""

    job_id: str  # "123", or "123_4" for an array task (the form scontrol requeue needs)
    raw_id: str
    restart_count: int
    submit_dir: str = ""
    job_name: str = ""
    user: str = ""
    nodes: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> JobIdentity:
        raw = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
        array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
        job_id = f"{array}_{task}" if array and task else raw
        try:
            restarts = max(0, int(env.get("SLURM_RESTART_COUNT", "0") or 0))
        except ValueError:
            restarts = 0
        return cls(job_id=job_id, raw_id=raw, restart_count=restarts, submit_dir=env.get("SLURM_SUBMIT_DIR", ""),
                   job_name=env.get("SLURM_JOB_NAME", ""), user=env.get("SLURM_JOB_USER") or env.get("USER", ""),
                   nodes=env.get("SLURM_JOB_NODELIST", ""))


def expand_checkpoint_dir(template: str, ident: JobIdentity, token: str = "") -> str:
    """Expand %j %A %a %x %u and make relative paths relative to the submit directory.

    Without a template: the wrapper's default, unique per submission when the script carries its token
    (a job id that comes back in a fresh cluster must not share a folder with the earlier job)."""
    from autoheal.sbatch_helpers.wrapper import DEFAULT_CHECKPOINT_DIR

    template = template or (DEFAULT_CHECKPOINT_DIR.format(token=token) if token else "autoheal-checkpoints/%j")
    array, _, task = ident.job_id.partition("_")
    values = {"j": ident.job_id, "A": array, "a": task or "", "x": ident.job_name or "job", "u": ident.user, "%": "%"}
    out = re.sub(r"%([jAaxu%])", lambda m: values[m.group(1)], template)
    if not os.path.isabs(out):
        out = os.path.join(ident.submit_dir or os.getcwd(), out)
    return out


def reached_past(resumed: str, reached: str) -> bool:
    """The run that resumed from ``resumed`` (a step, or ``none``: from scratch, step 0) got past it by
    the evidence of its heartbeats (``reached``, the comment's field: a step; ``none`` or absent: no)."""
    if not reached.isdigit():
        return False
    if resumed.isdigit():
        return int(reached) > int(resumed)
    return resumed == "none" and int(reached) > 0


def no_progress(restart_count: int, previous_resumed: str, resumed_now: str, previous_reached: str = "") -> bool:
    """Two consecutive restarts (this one and the previous one) resume from the same checkpoint step, and
    the previous run did not get past that step (``previous_reached``: how far its ranks' heartbeats got,
    recorded at its requeue; absent when not known, which keeps the rule as without it).

    A run that did get past it lost its steps to a second fault before its next checkpoint: on a big fleet
    (a failure every few hours, checkpoints every 30 min) a healthy job is hit so, and stopping it would be
    a job autoheal kills. A job that cannot get past a point (it dies right after each resume) is still
    stopped here; one that dies at a fixed step past its checkpoint is bounded by ``--max-restarts``."""
    return (restart_count >= 2 and previous_resumed != "" and previous_resumed == resumed_now
            and not reached_past(previous_resumed, previous_reached))


def reached_words(reached: str) -> str:
    """The comment's ``reached`` for the runner's messages."""
    if reached.isdigit():
        return f"reached step {reached}"
    if reached == "none":
        return "reached no further step (no heartbeat of its ranks changed)"
    return "did not record how far it got"


def retry_step(fn: Callable[[], None], budget: float, what: str, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> None:
    """Run one idempotent Slurm step; retry while slurmctld does not answer or the job is changing
    state, with doubling pauses, for up to ``budget`` seconds. Other outcomes go to the caller."""
    deadline = clock() + budget
    pause = 0.5
    while True:
        try:
            fn()
            return
        except (SlurmUnavailable, SlurmJobBusy) as exc:
            if clock() + pause > deadline:
                raise
            say(f"{what}: {exc}; retrying in {pause:g}s")
            sleep(pause)
            pause = min(pause * 2, 8.0)


class Shield:
    """Ignore the termination signals while Slurm calls are in flight.

    ``SIG_IGN`` (unlike a Python handler) is inherited by the ``scontrol`` children we start, so the
    SIGTERM that Slurm's requeue sends to every process of the job cannot cut a call short. SIGKILL
    still can: that case is finished by ``autoheal guard``."""

    def __init__(self, extra: Sequence[int] = ()):
        self.signals = tuple(dict.fromkeys(tuple(SHIELDED) + tuple(extra)))
        self.saved: Dict[int, SignalHandler] = {}

    def __enter__(self) -> Shield:
        for sig in self.signals:
            try:
                self.saved[sig] = signal.signal(sig, signal.SIG_IGN)
            except (OSError, ValueError):  # not the main thread, or an uncatchable signal
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self.saved.items():
            try:
                signal.signal(sig, old)
            except (OSError, ValueError, TypeError):
                pass


def build_env(base: Mapping[str, str], *, checkpoint_dir: str, restart_count: int, resume_from: Optional[str],
              reason: Optional[str], grace_signal: str) -> Dict[str, str]:
    """The user command's environment."""
    env = dict(base)
    env["AUTOHEAL_CHECKPOINT_DIR"] = checkpoint_dir
    env["AUTOHEAL_RESTART_COUNT"] = str(restart_count)
    env["AUTOHEAL_GRACE_SIGNAL"] = grace_signal
    env.pop("AUTOHEAL_RESUME_FROM", None)
    env.pop("AUTOHEAL_REQUEUE_REASON", None)
    if resume_from:
        env["AUTOHEAL_RESUME_FROM"] = resume_from
    if reason:
        env["AUTOHEAL_REQUEUE_REASON"] = reason
    return env


# ---- side effects ----------------------------------------------------------------------------------


def _set_subreaper() -> None:
    """Become the reaper of orphaned descendants (e.g. srun after the user's bash died on the signal),
    so we can wait for the whole process group, not only its leader."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def wait_until_gone(alive: Callable[[], bool], timeout: float, clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> bool:
    """Poll ``alive`` until it is False (True) or ``timeout`` seconds passed on ``clock`` (False)."""
    deadline = clock() + timeout
    while alive():
        if clock() >= deadline:
            return False
        sleep(POLL)
    return True


class Child:
    """The user's command in its own process group."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], reap_all: bool = True):
        self.proc = subprocess.Popen(list(argv), env=dict(env), start_new_session=True)
        self.pgid = self.proc.pid
        self.status: Optional[int] = None
        self.reap_all = reap_all  # the runner as subreaper reaps adopted orphans; tests in-process must not

    def reap(self) -> None:
        """Collect every exited child (ours and adopted orphans); note our main child's status."""
        while True:
            try:
                pid, status = os.waitpid(-1 if self.reap_all else self.proc.pid, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.proc.pid:
                self.status = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else (
                    -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
                self.proc.returncode = self.status

    @property
    def leader_done(self) -> bool:
        self.reap()
        return self.status is not None

    @property
    def group_alive(self) -> bool:
        self.reap()
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass

    def wait_group(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> bool:
        """Wait until every process of the group exited; False on timeout."""
        return wait_until_gone(lambda: self.group_alive, timeout, clock)


class HangWatch:
    """The ranks' heartbeats of one step, read every so often and judged by ``hang.py``."""

    def __init__(self, checkpoint_dir: str, opts: hang.HangOptions, clock: Callable[[], float] = time.monotonic):
        from autoheal.sbatch_helpers.progress import read_heartbeats

        self.read = read_heartbeats
        self.directory = checkpoint_dir
        self.opts = opts
        self.clock = clock
        now = clock()
        self.tracker = hang.start(self.read(checkpoint_dir), now)
        self.read_at = now

    def poll(self, fault_at: Optional[float]) -> hang.Decision:
        """Read the heartbeats when due, then decide (``fault_at``: when the fault signal came)."""
        now = self.clock()
        if now - self.read_at >= (HEARTBEAT_POLL if fault_at is None else HEARTBEAT_POLL_FAULT):
            self.tracker = hang.observe(self.tracker, self.read(self.directory), now)
            self.read_at = now
        return hang.decide(self.tracker, now, fault_at, self.opts)


@dataclass
class RunnerOptions(WrapperOptions):
    """The wrapper's settings plus what to run: the embedded script or a command."""

    script: Optional[str] = None
    command: List[str] = field(default_factory=list)
    active_nodes: int = 0  # with spare_nodes: the nodes the steps run on (hotspare.py)


class Runner(HotSpareRun):
    """One run of the job under the runner (see the module docstring)."""

    def __init__(self, opts: RunnerOptions, ident: JobIdentity, slurm: Optional[SlurmAdapter] = None,
                 journal: Optional[Union[Journal, JobOutbox]] = None, notifier: Optional[Notifier] = None,
                 env: Optional[Mapping[str, str]] = None, sacct: Optional[Callable[[str], Optional[List[str]]]] = None,
                 clock: Callable[[], float] = time.time, adopt_orphans: bool = True,
                 hooks_grace: Optional[float] = None, monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.opts = opts
        self.ident = ident
        self.slurm = slurm
        self.journal = journal
        self.notifier = notifier
        self.env = dict(os.environ if env is None else env)
        self.sacct = sacct or self._job_state_history
        self.clock = clock
        # short waits (end_step's for srun) go through these, so a unit test can drive them
        self.monotonic, self.sleep = monotonic, sleep
        self.adopt_orphans = adopt_orphans
        self.grace_sig = to_signal(opts.signal)
        self.received: Optional[int] = None
        self.requeueing = False
        self.comment = CommentState()
        self.end_time: Optional[int] = None
        self.job_nodes: List[str] = []
        self.hooks_grace = hooks_grace  # hooks.grace_seconds: xid-watch requeues by itself after it
        self.fault_at: Optional[float] = None  # monotonic time the grace signal came
        self.watch: Optional[HangWatch] = None  # the running step's heartbeats
        self.hang_decision: Optional[hang.Decision] = None  # why a step was ended as hung

    # ---- records ---------------------------------------------------------------------------------
    def record(self, event: str, message: str, severity: str = "info", **evidence: Any) -> None:
        say(message)
        rec = None
        # Filed under the node concerned (the faulty one), else the node running this batch shell, so
        # `autoheal events --node` finds every record of a job's run (not under the submit host).
        node = str(evidence.get("node") or self.batch_node())
        if self.journal is not None:
            rec = self.journal.record(event, job_ids=[self.ident.job_id], node=node,
                                      evidence=evidence, message=message, severity=severity,
                                      action=event, source="sbatch-runner")
        if self.notifier is not None and severity != "info":
            from autoheal.journal import Record

            rec = rec or Record(event=event, job_ids=[self.ident.job_id], node=node, message=message, severity=severity,
                                evidence=evidence, source="sbatch-runner", time=time.time())
            try:
                self.notifier.send(rec, extra_urls=self.opts.notify)
            except Exception as exc:  # a notification must never stop the job
                say(f"warning: notification failed: {exc}")

    def batch_node(self) -> str:
        """The Slurm node this batch shell runs on (the lab runs every node on one host: not hostname)."""
        return self.env.get("SLURMD_NODENAME") or (self.job_nodes[0] if self.job_nodes else "")

    def write_comment(self, retry_for: float = 0.0) -> None:
        """Best effort; ``retry_for`` seconds of retries (1 s apart) while slurmctld does not answer."""
        if self.slurm is None or not self.ident.job_id:
            return
        if self.resized:  # hot spares: Slurm may refuse updates of a resized running job (hotspare_runner)
            say(f"not updating the comment of resized job {self.ident.job_id} (Slurm refuses it until the job "
                f"is requeued; the journal has the record): {self.comment.render()}")
            return
        from autoheal.errors import SlurmJobBusy, SlurmUnavailable

        deadline = time.monotonic() + retry_for
        while True:
            try:
                self.slurm.set_job_comment(self.ident.job_id, self.comment.render())
                return
            except (SlurmUnavailable, SlurmJobBusy) as exc:
                # slurmctld not answering; or, seen for array tasks just after a slurmctld restart, Slurm's
                # "Unexpected message received" (the adapter's SlurmJobBusy): both pass, so they are retried
                if time.monotonic() >= deadline:
                    say(f"warning: cannot update the job comment: {exc}")
                    return
                time.sleep(1.0)
            except Exception as exc:  # the job must go on without its comment
                say(f"warning: cannot update the job comment: {exc}")
                return

    # ---- Slurm reads (best effort) ---------------------------------------------------------------
    def _job_state_history(self, job_id: str) -> Optional[List[str]]:
        """The job's state per run from accounting (sacct), None when there is none to ask."""
        from autoheal.errors import SlurmError

        if self.slurm is None or not job_id:
            return None
        try:
            return self.slurm.job_state_history(job_id)
        except SlurmError:  # SlurmNotSupported (pyslurm), or a failure: as without accounting
            return None

    def _job(self) -> Optional[Job]:
        if self.slurm is None or not self.ident.job_id:
            return None
        try:
            return self.slurm.get_job(self.ident.job_id)
        except Exception as exc:
            say(f"warning: cannot read job {self.ident.job_id}: {exc}")
            return None

    def _nodes(self, names: Sequence[str]) -> List[Node]:
        if self.slurm is None or not names:
            return []
        try:
            wanted = set(names)
            return [n for n in self.slurm.list_nodes() if n.name in wanted]
        except Exception as exc:
            say(f"warning: cannot read node states: {exc}")
            return []

    # ---- the run ---------------------------------------------------------------------------------
    def start_checks(self) -> Optional[int]:
        """Read the comment, classify this restart, enforce the budget. An exit code means: stop now."""
        from autoheal.slurm.hostlist import expand

        job = self._job()
        self.comment = CommentState.parse(job.comment if job else "")
        if job is not None:
            self.end_time = job.end_time
            self.job_nodes = list(job.nodes)
        if not self.job_nodes and self.ident.nodes:
            self.job_nodes = expand(self.ident.nodes)
        restart = self.ident.restart_count
        prev_nodes = self._nodes(expand(self.comment.nodes)) if restart and self.comment.nodes else []
        sacct_states = self.sacct(self.ident.job_id) if restart else None
        self.cause = causes.classify_start(restart_count=restart, recorded=self.comment.last,
                                           recorded_restarts=self.comment.restarts, sacct_states=sacct_states,
                                           previous_nodes=prev_nodes)
        if self.cause and self.comment.restarts != restart:
            # Slurm (or someone) requeued us: record this restart now.
            self.comment.restarts, self.comment.last = restart, self.cause.label()
            self.record("job-restart", f"job {self.ident.job_id} restart {restart}: {self.cause.kind}"
                        f"{' on ' + self.cause.node if self.cause.node else ''} ({self.cause.evidence})",
                        "action", node=self.cause.node, cause=self.cause.kind, restart=restart)
        if restart > self.opts.max_restarts:
            return self.finish("max-restarts", EXIT_MAX_RESTARTS,
                               f"job {self.ident.job_id}: restart {restart} exceeds --max-restarts "
                               f"{self.opts.max_restarts}; not running it again")
        return None

    def finish(self, state: str, code: int, message: str, severity: str = "error") -> int:
        self.comment.state = state
        # the job's last word: a slurmctld restarting right then must not leave "state=running" on an
        # ended job (the journal would say completed, the comment running)
        self.write_comment(retry_for=FINAL_COMMENT_RETRY)
        self.record(f"job-{state}", message, severity, final_state=state, restarts=self.ident.restart_count)
        return code

    def prepare(self) -> Dict[str, str]:
        from autoheal.sbatch_helpers.checkpoint import TOKEN_ENV

        ckdir = expand_checkpoint_dir(self.opts.checkpoint_dir, self.ident, self.env.get(TOKEN_ENV, ""))
        try:
            Path(ckdir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            say(f"warning: cannot create checkpoint dir {ckdir}: {exc.strerror}")
        resume = self._resume_point(ckdir)
        self.resume_step = self._progress_step(resume, ckdir)
        self.checkpoint_dir = ckdir
        return build_env(self.env, checkpoint_dir=ckdir, restart_count=self.ident.restart_count,
                         resume_from=str(resume) if resume else None,
                         reason=self.cause.kind if self.cause else None, grace_signal=self.opts.signal)

    @staticmethod
    def _progress_step(checkpoint: Optional[Path], ckdir: str) -> str:
        """The step reached: the further of autoheal's newest valid checkpoint and the framework's own
        progress marker (`report_progress`), else "none". The further one: a framework that keeps both
        (the submitit recipe: a durable save every N steps and submitit's pickle on the signal, which it
        marks) resumes from the newer, and judging its restarts by the older one stopped a job that was
        progressing ("restarts 1 and 2 both resume from checkpoint step 10") when a late signal of the
        first fault requeued it again."""
        from autoheal.sbatch_helpers.checkpoint import checkpoint_step
        from autoheal.sbatch_helpers.progress import read_progress

        steps: List[int] = []
        if checkpoint is not None:
            try:
                steps.append(checkpoint_step(checkpoint))
            except ValueError:
                pass
        marked = read_progress(ckdir)
        if marked is not None:
            steps.append(marked)
        return str(max(steps)) if steps else "none"

    def _resume_point(self, ckdir: str) -> Optional[Path]:
        """The newest valid checkpoint this job may resume (another job's with the same id is refused,
        and each checkpoint passed over is named in the job's output)."""
        from autoheal.sbatch_helpers.checkpoint import find_resume_point

        rejected: List[Rejection] = []
        found = find_resume_point(ckdir, environ=self.env, rejections=rejected)
        for item in rejected:
            say(f"skipped checkpoint {item}")
        return found

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        if self.requeueing:
            return  # Slurm's kill sequence after our own requeue: finish what we are doing
        if self.received is None:
            self.received = signum
            self.fault_at = time.monotonic()

    def run(self, argv: Sequence[str]) -> int:
        # First thing: a grace signal arriving while we talk to Slurm must not kill the batch shell.
        for sig in {self.grace_sig, signal.SIGTERM}:
            signal.signal(sig, self._on_signal)
        env = self._begin()
        if isinstance(env, int):
            return env
        if self.adopt_orphans:
            _set_subreaper()
        if env.get("AUTOHEAL_MEMORY_TIER"):  # opt-in peer-memory tier: one agent per node until we exit
            from autoheal.sbatch_helpers.memtier_launch import start_for_runner

            env = start_for_runner(self, env)
        if getattr(self.opts, "preload", ""):  # opt-in warm interpreters: one per node until we exit
            from autoheal.sbatch_helpers import warm_launch

            env = warm_launch.start_for_runner(self, env)
        # The heartbeats' baseline before the step starts: a record written before it was read would be
        # taken for an earlier run's, and this run's progress (``reached``) would go unseen.
        self.watch = HangWatch(self.checkpoint_dir, self.hang_options())
        try:
            child = Child(argv, env, reap_all=self.adopt_orphans)
        except OSError as exc:
            say(f"cannot start {argv[0]}: {exc.strerror}")
            return 127
        return self._supervise(child, argv)

    def _begin(self) -> Union[int, Dict[str, str]]:
        """The checks before the user's command runs: an exit code to stop with, or its environment."""
        stop = self.start_checks()
        if stop is not None:
            return stop
        env = self.prepare()
        restart, reached = self.ident.restart_count, self.comment.reached
        both = (f"job {self.ident.job_id}: restarts {restart - 1} and {restart} both resume from checkpoint step "
                f"{self.resume_step}")
        if no_progress(restart, self.comment.resumed, self.resume_step, reached):
            return self.finish("no-progress", EXIT_NO_PROGRESS,
                               f"{both} and run {restart - 1} {reached_words(reached)}; stopping (no progress)")
        if restart >= 2 and self.comment.resumed == self.resume_step:
            say(f"{both}, but run {restart - 1} {reached_words(reached)} before it ended: lost to a second fault "
                f"before the next checkpoint, not a lack of progress; going on")
        self.comment.resumed = self.resume_step
        self.comment.reached = ""  # this run's, written at its requeue: the previous run's says nothing of it
        self.comment.nodes = ",".join(self.job_nodes)
        self.comment.state = "running"
        if self.opts.spare_nodes:
            env = self.hot_setup(env)
        self.write_comment()
        say(f"job {self.ident.job_id} run {self.ident.restart_count} on {self.comment.nodes or '?'}: "
            f"checkpoint dir {self.checkpoint_dir}, resume from step {self.resume_step}"
            f"{', previous run ended by ' + self.cause.label() if self.cause else ''}")
        return env

    def hang_options(self) -> hang.HangOptions:
        return hang.HangOptions(hang_after_fault=float(self.opts.hang_after_fault), watchdog=float(self.opts.watchdog),
                                backstop=self.hooks_grace)

    def _supervise(self, child: Child, argv: Sequence[str]) -> int:
        """Watch the step (and the steps a hot spare restarts) until it ends or is interrupted."""
        deadline = None
        if self.end_time and self.end_time > self.clock():
            deadline = self.end_time - self.opts.grace - self.opts.requeue_margin
        while True:
            if self.watch is None:
                self.watch = HangWatch(self.checkpoint_dir, self.hang_options())
            self.hang_decision = None
            act = self._watch_step(child, deadline)
            if act == "restart":
                child = self._next_step(argv)
                continue
            if isinstance(act, int):
                return act
            code = child.status if child.status is not None else 1
            if self.hot is not None and (self.received is not None or code != 0):
                # a fault signal while the step was ending, or the step died (its node died)
                act = self.hot_fault(child, "signal" if self.received is not None else f"exit {code}")
                if act == "restart":
                    child = self._next_step(argv)
                    continue
                if isinstance(act, int):
                    return act
            break
        if self.received is not None:  # the signal came while the child was exiting (or after)
            return self.interrupted(child, self.received, deadline_hit=False)
        if code == 0:
            return self.finish("completed", 0, f"job {self.ident.job_id} completed", "info")
        return self.finish("failed", code if code > 0 else 128 - code,
                           f"job {self.ident.job_id}: the command exited with {code} (not requeued: a failing "
                           f"command is not a node problem)", "info")

    def _next_step(self, argv: Sequence[str]) -> Child:
        """A hot spare took over: the script again, its heartbeats judged afresh (the baseline read before
        it starts: what the earlier step left is not this step's progress)."""
        self.watch = HangWatch(self.checkpoint_dir, self.hang_options())
        return self.hot_restart(argv)

    def reached(self) -> str:
        """How far the ranks got since this run (or its last hot-spare step) resumed, for the comment's
        ``reached``: the furthest step among the heartbeat records seen to change, read once more now;
        ``none`` when none changed; empty (not known) without a step watched."""
        if self.watch is None:
            return ""
        try:
            self.watch.tracker = hang.observe(self.watch.tracker, self.watch.read(self.watch.directory),
                                              self.watch.clock())
        except Exception as exc:  # the requeue must go on without it (the rule then stays as before)
            say(f"warning: cannot read the ranks' heartbeats: {exc}")
        got = self.watch.tracker.reached
        return "none" if got is None else str(got)

    def _watch_step(self, child: Child, deadline: Optional[float]) -> Union[str, int, None]:
        """Until the step's leader exits (None): "restart" (a hot spare takes over) or the run's exit
        code (interrupted, or ended by the watchdog)."""
        assert self.watch is not None
        while not child.leader_done:
            if self.received is not None:
                act = self.hot_fault(child, "signal") if self.hot is not None else None
                if act == "restart":
                    return act
                if act == "continue":
                    continue
                return self.interrupted(child, self.received, deadline_hit=False)
            if deadline is not None and self.clock() >= deadline:
                return self.interrupted(child, int(self.grace_sig), deadline_hit=True)
            act = self.hot_preswap(child) if self.hot is not None else None
            if act == "restart" or isinstance(act, int):
                return act
            verdict = self.watch.poll(None)
            if verdict.end:
                return self.hung(child, verdict)
            time.sleep(POLL)
        return None

    def interrupted(self, child: Child, signum: int, deadline_hit: bool) -> int:
        """The grace signal came (or the time limit is near): let the job's processes checkpoint and exit,
        find out why, then requeue, or record that the job is ending or was requeued by someone else."""
        sig_name = signal.Signals(signum).name
        waited = self._stop_child(child, signum, sig_name, deadline_hit)
        job = self._job()
        nodes = self._nodes(self._run_nodes(job))
        state = job.state if job else "RUNNING"
        action = causes.interrupt_action(state, job.restart_count if job else None, self.ident.restart_count)
        cause = causes.classify_interrupt(signal_name=sig_name, grace_signal=self.opts.signal, now=self.clock(),
                                          end_time=self.end_time, grace=self.opts.grace, nodes=nodes,
                                          job_state=state, deadline_hit=deadline_hit,
                                          requeued_elsewhere=action == "none-requeued")
        return self._conclude(child, job, nodes, cause, action, waited)

    def _conclude(self, child: Child, job: Optional[Job], nodes: Sequence[Node], cause: causes.Cause, action: str,
                  waited: float) -> int:
        """The step has ended: record why, then requeue, or say the job is ending or requeued by others."""
        state = job.state if job else "RUNNING"
        step = self._progress_step(self._resume_point(self.checkpoint_dir), self.checkpoint_dir)
        evidence = dict(cause=cause.kind, node=cause.node, checkpoint_step=step, detail=cause.evidence,
                        child_exit=child.status, waited=round(waited, 1), job_state=state)
        if self.hang_decision is not None:
            evidence["hang"] = self.hang_decision.verdict.value
        if action == "none-ending":
            return self._ending(child, state, evidence)
        if action == "none-requeued":
            return self._requeued_by_others(cause, step, nodes, evidence)
        if self.ident.restart_count >= self.opts.max_restarts:
            return self._out_of_restarts(cause, step)
        self.requeueing = True
        return self.requeue_and_record(self.ident.restart_count + 1, cause, step, nodes, job, evidence)

    def _stop_child(self, child: Child, signum: int, sig_name: str, deadline_hit: bool) -> float:
        """Forward the signal, wait up to the grace for the processes to exit (ending them at once when
        their ranks are hung, hang.py), then TERM and KILL them; the seconds it took."""
        say(f"{'time limit near' if deadline_hit else sig_name + ' received'}: forwarding "
            f"{sig_name} to the job's processes, waiting up to {self.opts.grace}s for them to checkpoint")
        started = time.monotonic()
        if deadline_hit or self.fault_at is None:  # the runner's own time-limit deadline: no signal came
            self.fault_at = started
        child.signal(signum)
        if not self.wait_step(child, self.opts.grace):
            say(f"the job's processes did not exit within {self.opts.grace}s: SIGTERM, then SIGKILL "
                f"after {KILL_AFTER_TERM:g}s")
            child.signal(signal.SIGTERM)
            if not child.wait_group(KILL_AFTER_TERM):
                child.signal(signal.SIGKILL)
                child.wait_group(KILL_AFTER_TERM)
        return time.monotonic() - started

    def wait_step(self, child: Child, timeout: float) -> bool:
        """After the grace signal: wait up to ``timeout`` for the step's processes to exit; end them at
        once (:meth:`end_step`) when hang.py finds the ranks hung (no progress for --hang-after-fault
        seconds). False on timeout."""
        deadline = time.monotonic() + timeout
        fault_at = self.fault_at if self.fault_at is not None else time.monotonic()
        while child.group_alive:
            if time.monotonic() >= deadline:
                return False
            decision = self.watch.poll(fault_at) if self.watch is not None else None
            if decision is not None and decision.end:
                self.hang_decision = decision
                say(f"the job's ranks are hung: {decision.why}; ending the step now "
                    f"({time.monotonic() - fault_at:.1f}s after the signal, grace {timeout:g}s)")
                self.end_step(child)
                return True
            time.sleep(POLL)
        return True

    def end_step(self, child: Child) -> None:
        """SIGKILL the step: its ranks are blocked where no signal handler runs (a collective whose peer
        is gone), and srun forwards no SIGKILL. Each of the job's Slurm steps gets ``scancel
        --signal=KILL <job>.<step>`` first, so ranks on other nodes end now, not after Slurm's KillWait
        once the job is requeued. Never the whole job (scancel sends a SIGKILL to the batch step too: this
        runner), nor the memory tier's agents (their memory copies are what a restart resumes from).
        Then srun is left up to SRUN_EXIT_WAIT seconds to collect the task exits and end by itself (see
        there) before it, and whatever else of the group is left, is SIGKILLed."""
        killed = 0
        for step in self._user_steps():
            try:
                self._adapter.signal_job(step, "KILL")
                killed += 1
            except SlurmError as exc:  # the local SIGKILL below still ends srun; Slurm's requeue the rest
                say(f"warning: cannot SIGKILL step {step}: {exc}")
        # No step killed through Slurm (none listed, or scancel failed): nothing will end srun by itself.
        if killed and wait_until_gone(lambda: child.group_alive, SRUN_EXIT_WAIT, self.monotonic, self.sleep):
            return
        child.signal(signal.SIGKILL)
        child.wait_group(KILL_AFTER_TERM)

    def _user_steps(self) -> List[str]:
        """The job's steps the user's script started (not batch, extern, the memory-tier agents or the warm
        interpreters: a hung rank's client is ended with its step, and its warm child with the client)."""
        from autoheal.sbatch_helpers.memtier_launch import AGENT_STEP_NAME
        from autoheal.sbatch_helpers.warm import STEP_NAME as WARM_STEP_NAME

        if self.slurm is None or not self.ident.job_id:
            return []
        try:
            steps = self.slurm.job_steps(self.ident.job_id)
        except SlurmError as exc:
            say(f"warning: cannot list the steps of job {self.ident.job_id}: {exc}")
            return []
        ours = (AGENT_STEP_NAME, WARM_STEP_NAME)
        return [step for step, name in steps
                if step.rpartition(".")[2] not in ("batch", "extern", "interactive") and name not in ours]

    def hung(self, child: Child, decision: hang.Decision) -> int:
        """The watchdog: no rank progressed for --watchdog seconds and no fault signal came (a node whose
        slurmd died, an NVLink hang with no XID). End the step, let Slurm settle a node that stopped
        responding, then requeue (cause ``hang``, naming and excluding a node found bad)."""
        self.hang_decision = decision
        self.record("job-hang", f"job {self.ident.job_id}: {decision.why}; no fault signal came: ending the "
                    f"step (--watchdog {self.opts.watchdog}s)", "action", hang=decision.verdict.value,
                    quiet=round(decision.quiet, 1))
        self.end_step(child)
        job = self._job()
        nodes = self._settled_nodes(self._run_nodes(job))
        job = self._job() or job
        state = job.state if job else "RUNNING"
        action = causes.interrupt_action(state, job.restart_count if job else None, self.ident.restart_count)
        cause = causes.classify_hang(nodes, decision.why)
        return self._conclude(child, job, nodes, cause, action, decision.quiet)

    def _run_nodes(self, job: Optional[Job]) -> List[str]:
        """The nodes this run held: the job's allocation while it is still this run's (a hot spare may have
        resized it), else the run's own list. Slurm may have requeued and restarted the job elsewhere by
        the time we look (a node DOWN after its slurmd died): the new allocation says nothing of the node
        that stopped this run (lab, SlurmdTimeout 15 s: the watchdog's cause lost its node)."""
        if job and job.nodes and job.restart_count == self.ident.restart_count:
            return list(job.nodes)
        return list(self.job_nodes)

    def _settled_nodes(self, names: Sequence[str]) -> List[Node]:
        """The run's nodes once none is NOT_RESPONDING without being DOWN yet (up to NODE_SETTLE_BUDGET
        seconds; a signal to the runner, e.g. Slurm requeueing the job, ends the wait early)."""
        deadline = time.monotonic() + NODE_SETTLE_BUDGET
        nodes = self._nodes(names)
        waiting = causes.unsettled(nodes)
        if waiting:
            say(f"node(s) {','.join(waiting)} not responding: waiting up to {NODE_SETTLE_BUDGET:g}s for Slurm to "
                f"mark them DOWN (or for them to answer) before requeueing")
        while waiting and self.received is None and time.monotonic() < deadline:
            time.sleep(NODE_SETTLE_PAUSE)
            nodes = self._nodes(names)
            waiting = causes.unsettled(nodes)
        return nodes

    def _ending(self, child: Child, state: str, evidence: Dict[str, Any]) -> int:
        """The job is ending (cancelled, timed out): no requeue; the child's exit code."""
        self.comment.state = "cancelled"
        self.write_comment()
        self.record("job-cancelled", f"job {self.ident.job_id} is ending ({state}); not requeued", "info",
                    **evidence)
        return child.status if child.status and child.status > 0 else 0

    def _requeued_by_others(self, cause: causes.Cause, step: str, nodes: Sequence[Node],
                            evidence: Dict[str, Any]) -> int:
        """Slurm, an admin, or the job's own framework (submitit, Lightning) requeued it: still keep it
        off the bad node and record why."""
        self.requeueing = True
        self.comment.reached = evidence["reached"] = self.reached()
        self._note_restart(self.ident.restart_count + 1, cause, step, "requeued")
        excluded = self.exclude_while_pending(cause, nodes)
        evidence["excluded"] = ",".join(excluded)
        self.record("job-requeue", f"job {self.ident.job_id} was requeued by Slurm, the job itself or from "
                    f"outside ({cause.label()}); checkpoint step {step}"
                    f"{'; excluded ' + ','.join(excluded) if excluded else ''}", "action", **evidence)
        return EXIT_REQUEUED

    def _out_of_restarts(self, cause: causes.Cause, step: str) -> int:
        self.comment.last, self.comment.step = cause.label(), step  # the final comment names this fault
        return self.finish("max-restarts", EXIT_MAX_RESTARTS,
                           f"job {self.ident.job_id}: {cause.kind} after {self.ident.restart_count} restarts "
                           f"(--max-restarts {self.opts.max_restarts}); not requeued, checkpoint step {step}")

    def _note_restart(self, restart: int, cause: causes.Cause, step: str, state: str) -> None:
        self.comment.restarts, self.comment.last, self.comment.step = restart, cause.label(), step
        self.comment.state = state
        self.write_comment()

    def requeue_and_record(self, next_restart: int, cause: causes.Cause, step: str, nodes: Sequence[Node],
                           job: Optional[Job],
                           evidence: Dict[str, Any]) -> int:
        """Requeue (the checkpoint is already written) and say what happened; the exit code."""
        self.comment.reached = evidence["reached"] = self.reached()  # with the requeue's first comment
        try:
            outcome, excluded = self.requeue(cause, nodes, job, next_restart, step)
        except SlurmRequeueDisabled as exc:
            return self._requeue_failed(f"job {self.ident.job_id} was submitted without requeue "
                                        f"(--no-requeue or JobRequeue=0): {exc}", evidence)
        except SlurmJobFinished:
            self.comment.state = "cancelled"
            self.write_comment()
            self.record("job-cancelled", f"job {self.ident.job_id} ended before it could be requeued "
                        f"(cancelled meanwhile); checkpoint step {step}", "info", **evidence)
            return EXIT_REQUEUED
        except SlurmError as exc:
            return self._requeue_failed(f"job {self.ident.job_id}: requeue failed: {exc}", evidence)
        evidence["excluded"] = ",".join(excluded)
        who = "was already requeued" if outcome == "already-requeued" else "requeued"
        self.record("job-requeue", f"job {self.ident.job_id} {who} after {cause.label()} at checkpoint step "
                    f"{step} (restart {next_restart} of at most {self.opts.max_restarts})"
                    f"{'; excluded ' + ','.join(excluded) if excluded else ''}", "action", **evidence)
        return EXIT_REQUEUED

    def _requeue_failed(self, message: str, evidence: Dict[str, Any]) -> int:
        self.comment.state = "requeue-failed"
        self.write_comment()
        self.record("job-requeue-failed", message, "error", **evidence)
        return 1

    def requeue(self, cause: causes.Cause, nodes: Sequence[Node], job: Optional[Job], next_restart: int = 0,
                step: str = "none") -> Tuple[str, List[str]]:
        """Requeue; after a node problem keep the job off the bad nodes while it is pending.

        Returns ("requeued" | "already-requeued", nodes autoheal excludes). Every Slurm call is
        shielded from the kill it triggers and retried while slurmctld does not answer."""
        if self.slurm is None:
            raise SlurmError("no Slurm access")
        bad = [n.name for n in nodes if node_unhealthy(n)]
        if cause.node and cause.node not in bad:
            bad.append(cause.node)
        job_id = self.ident.job_id
        budget = self.opts_budget()
        with Shield(extra=[int(self.grace_sig)]):
            # A hot-spare job resized this run: Slurm 22.05 without accounting refuses every update of it
            # (until its batch shell is gone), so hold -> exclude -> release would strand it held. The
            # bad node is drained or down, so Slurm will not pick it while it is unhealthy anyway.
            if self.resized or not (cause.node_problem and self.opts.exclude_failed and bad):
                # One call is the whole requeue: nothing to finish if we are killed after it.
                self._note_restart(next_restart, cause, step, "requeued")
                try:
                    retry_step(lambda: self._adapter.requeue(job_id), budget, f"scontrol requeue {job_id}")
                except SlurmJobAlreadyPending:
                    return "already-requeued", []
                return "requeued", []
            states = {n.name: n for n in self._nodes(sorted(set(bad) | set(split_nodes(self.comment.excl))))}
            ours_before = split_nodes(self.comment.excl)
            planned = plan_exclusions(list(job.excluded_nodes) if job is not None else [], ours_before, bad,
                                      states)
            # The intent first: if we die after the hold, `autoheal guard` reads it here and finishes.
            self.comment.restarts, self.comment.last, self.comment.step = next_restart, cause.label(), step
            self.comment.state, self.comment.excl = "requeueing", ",".join(planned.ours)
            self.comment.guard = ""  # a fresh requeue: what the guard did for an earlier one is history
            retry_step(lambda: self._adapter.set_job_comment(job_id, self.comment.render()), budget,
                       f"record the requeue intent of job {job_id}")
            outcome, excl = "requeued", planned
            for attempt in range(1, 4):
                outcome, excl = self._hold_exclude_release(job_id, budget, ours_before, bad, states, planned)
                if self._requeue_took(job_id, budget):
                    break
                # slurmctld restarted from a state saved before our hold: the job runs on as if never
                # requeued. Do it again (a finished batch shell would otherwise end the job COMPLETED).
                say(f"job {job_id}: the requeue did not take (slurmctld restarted?); again ({attempt}/3)")
            else:
                raise SlurmError(f"job {job_id}: requeued three times, still running")
            self.comment.state = "requeued"
            self.write_comment()
        return outcome, excl.ours

    def exclude_while_pending(self, cause: causes.Cause, nodes: Sequence[Node]) -> List[str]:
        """After a requeue someone else made: add the bad nodes to ExcNodeList while the job is pending
        (Slurm's requeue delay leaves the time); nothing when it already runs again or on no node
        problem. Returns autoheal's exclusions now in force."""
        if self.slurm is None or not (cause.node_problem and self.opts.exclude_failed):
            return []
        bad = [n.name for n in nodes if node_unhealthy(n)]
        if cause.node and cause.node not in bad:
            bad.append(cause.node)
        if not bad:
            return []
        job_id, budget = self.ident.job_id, self.opts_budget()
        ours_before = split_nodes(self.comment.excl)
        states = {n.name: n for n in self._nodes(sorted(set(bad) | set(ours_before)))}
        with Shield(extra=[int(self.grace_sig)]):
            try:
                fresh: List[Job] = []
                retry_step(lambda: fresh.append(self._adapter.get_job(job_id)), budget, f"read job {job_id}")
                if fresh[0].state != "PENDING":
                    return []
                excl = plan_exclusions(list(fresh[0].excluded_nodes), ours_before, bad, states)
                retry_step(lambda: self._adapter.set_excluded_nodes(job_id, excl.full), budget,
                           f"exclude {','.join(excl.ours)} from job {job_id}")
            except (SlurmJobNotPending, SlurmNotFound, SlurmJobFinished):
                return []
            except SlurmError as exc:
                say(f"warning: cannot exclude {','.join(bad)} from job {job_id}: {exc}")
                return []
            self.comment.excl = ",".join(excl.ours)
            self.write_comment()
        return excl.ours

    def _hold_exclude_release(self, job_id: str, budget: float, ours_before: List[str], bad: List[str],
                              states: Dict[str, Node], planned: Exclusions) -> Tuple[str, Exclusions]:
        """requeuehold -> ExcNodeList -> release, each step retried; (outcome, exclusions)."""
        outcome = "requeued"
        try:
            retry_step(lambda: self._adapter.requeue(job_id, hold=True), budget, f"scontrol requeuehold {job_id}")
        except SlurmJobAlreadyPending:
            outcome = "already-requeued"  # Slurm, xid-watch or the user requeued first: still exclude
        excl = planned
        try:
            # Read the list again now that it is pending: never overwrite a user's exclusion we did not
            # see (the job record may have been unreadable before the hold).
            fresh: List[Job] = []
            retry_step(lambda: fresh.append(self._adapter.get_job(job_id)), budget, f"read job {job_id}")
            excl = plan_exclusions(list(fresh[0].excluded_nodes), ours_before, bad, states)
            retry_step(lambda: self._adapter.set_excluded_nodes(job_id, excl.full), budget,
                       f"exclude {','.join(excl.ours)} from job {job_id}")
            if self.hot is not None:
                self.hot_restore_size(job_id)
        except SlurmJobNotPending:
            say(f"warning: job {job_id} is no longer pending; not excluding {','.join(excl.ours)}")
        except (SlurmNotFound, SlurmJobFinished):
            raise SlurmJobFinished(f"job {job_id} is gone") from None
        retry_step(lambda: self._adapter.release(job_id), budget, f"scontrol release {job_id}")
        return outcome, excl

    def _requeue_took(self, job_id: str, budget: float) -> bool:
        """The job is pending again, or already on its next run (a higher restart count)."""
        seen: List[Job] = []
        retry_step(lambda: seen.append(self._adapter.get_job(job_id)), budget, f"read job {job_id}")
        job = seen[0]
        return job.state != "RUNNING" or job.restart_count > self.ident.restart_count

    def opts_budget(self) -> float:
        return float(getattr(self.opts, "requeue_budget", 0) or REQUEUE_STEP_BUDGET)


def parse_args(argv: Optional[Sequence[str]]) -> RunnerOptions:
    p = argparse.ArgumentParser(prog="python -m autoheal.sbatch_helpers.runner",
                                description="autoheal job runner (started by the script autoheal sbatch generates)")
    d = WrapperOptions()  # the [sbatch] section's defaults
    p.add_argument("--grace", type=int, default=d.grace)
    p.add_argument("--signal", default=d.signal)
    p.add_argument("--max-restarts", type=int, default=d.max_restarts)
    p.add_argument("--checkpoint-dir", default=d.checkpoint_dir)
    p.add_argument("--exclude-failed", dest="exclude_failed", action="store_true", default=d.exclude_failed)
    p.add_argument("--no-exclude-failed", dest="exclude_failed", action="store_false")
    p.add_argument("--notify", action="append", default=[])
    p.add_argument("--requeue-margin", type=int, default=d.requeue_margin)
    p.add_argument("--hang-after-fault", type=int, default=d.hang_after_fault)
    p.add_argument("--watchdog", type=int, default=d.watchdog)
    p.add_argument("--spare-nodes", type=int, default=0)
    p.add_argument("--active-nodes", type=int, default=0)
    p.add_argument("--min-nodes", type=int, default=0)
    p.add_argument("--preload", default="", help="modules the warm interpreters import (warm.py)")
    p.add_argument("--script", help="the user's script (deleted when the runner exits)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    command = list(a.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        name = signal_name(a.signal)
    except SignalNameError as exc:
        p.error(f"--signal: {exc}")
    return RunnerOptions(grace=a.grace, signal=name, max_restarts=a.max_restarts, checkpoint_dir=a.checkpoint_dir,
                         exclude_failed=a.exclude_failed, notify=a.notify, requeue_margin=a.requeue_margin,
                         script=a.script, command=command, spare_nodes=max(0, a.spare_nodes),
                         active_nodes=max(0, a.active_nodes), min_nodes=max(0, a.min_nodes),
                         hang_after_fault=max(1, a.hang_after_fault), watchdog=max(0, a.watchdog),
                         preload=a.preload)


def _records(cfg: Any, ident: JobIdentity, as_root: bool) -> Tuple[Any, Optional[Notifier]]:
    """Where this run's records go (issue 25, item 4; ``autoheal/job_records.py``).

    As root: the site journal and webhooks, as before. As the job's user: the job's file in the node's
    spool (``journal.job_spool``), which the epilog moves into the site journal as the user's records
    and posts to the site webhooks; notifications from here go only to the user's own ``--notify``
    URLs (the site's webhooks, even where an old main config still lists them, are not posted to)."""
    try:
        from autoheal.notify import Notifier

        n = cfg.notify
        if as_root:
            from autoheal.journal import Journal

            journal: Any = Journal.from_config(cfg)
            return journal, Notifier.from_config(cfg, journal)
        from autoheal.job_records import JobOutbox

        outbox = JobOutbox(cfg.journal.job_spool, ident.raw_id, say=say) if ident.raw_id.isdigit() else None
        return outbox, Notifier([], n.timeout, n.retries, n.min_severity, n.cluster_name or "")
    except Exception as exc:
        say(f"warning: journal/notifications unavailable: {exc}")
        return None, None


def _hooks_grace(cfg: Any) -> Optional[float]:
    """hooks.grace_seconds: xid-watch requeues a drained node's jobs itself after it (the backstop the
    runner must end a hung step inside); None when the config does not say."""
    try:
        return float(cfg.hooks.grace_seconds)
    except (AttributeError, TypeError, ValueError):
        return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        opts = parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else 0
    cmd = ([opts.script] if opts.script else []) + opts.command
    if not cmd:
        say("nothing to run (give --script FILE or a command after --)")
        return EXIT_USAGE
    from autoheal.config import Config, load_config
    from autoheal.errors import AutohealError

    as_root = os.geteuid() == 0
    try:
        cfg = load_config(secrets=as_root)  # a user's runner never reads (or needs) a site secret
    except AutohealError as exc:
        cfg = None
        if as_root:  # a broken secrets file costs the webhooks, not the Slurm settings
            try:
                cfg = load_config(secrets=False)
                say(f"warning: {exc}; going on without the site's secrets")
            except AutohealError:
                cfg = None
        if cfg is None:
            say(f"warning: {exc}; using default settings")
            cfg = Config()
    ident = JobIdentity.from_env(os.environ)
    slurm = None
    try:
        from autoheal.slurm import get_adapter

        slurm = get_adapter(cfg)
    except Exception as exc:
        say(f"warning: no Slurm access ({exc}): the job runs but cannot requeue itself")
    journal, notifier = _records(cfg, ident, as_root)
    runner = Runner(opts, ident, slurm=slurm, journal=journal, notifier=notifier,
                    hooks_grace=_hooks_grace(cfg))
    try:
        return runner.run(cmd)
    finally:
        if notifier is not None:
            notifier.flush(5.0)
        close = getattr(journal, "close", None)
        if close is not None:
            close()
        if opts.script:
            try:
                os.unlink(opts.script)
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
