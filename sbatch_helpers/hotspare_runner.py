"""The job runner's hot-spare part (``autoheal sbatch --spare-nodes K``): swap a failed node for a spare
inside the allocation, without a requeue.

Mixed into :class:`autoheal.sbatch_helpers.runner.Runner`; the decisions are in ``hotspare.py``. On a
fault (the grace signal xid-watch sends when it drains one of the job's nodes, or the user's script
ending non-zero because a step died with its node) the runner reads the job's allocation and node
states, and:

- swap: forwards the grace signal to the step (it checkpoints and exits), removes the bad nodes from
  the allocation (``scontrol update JobId=.. NodeList=..`` through the Slurm adapter: the node is free
  for repair at once, and xid-watch, seeing the job gone from it, requeues nothing), and starts the
  user's script again on the survivors plus spares, resuming from the newest valid checkpoint;
- drop spares: an idle spare went bad; it leaves the allocation, the step goes on;
- shrink (``--min-nodes M``, an elastic job): no spare left, but at least M nodes: the step restarts
  on fewer nodes;
- requeue: spares used up (or the batch host failed, or a second resize would be needed, which Slurm
  22.05 without accounting refuses): today's path. A job not resized yet is requeued with the node
  excluded and asks for its spares again (``NumNodes=N-(N+K)``); a resized one, whose updates Slurm
  refuses while its batch shell lives, with one plain ``scontrol requeue``.
"""

from __future__ import annotations

import atexit
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, List, Optional, Sequence, Tuple, Union

from autoheal.errors import SlurmError
from autoheal.sbatch_helpers import causes
from autoheal.sbatch_helpers import hotspare as hs
from autoheal.sbatch_helpers.comment import CommentState, node_unhealthy

if TYPE_CHECKING:
    from autoheal.sbatch_helpers.runner import Child, JobIdentity, RunnerOptions
    from autoheal.slurm.base import SlurmAdapter
    from autoheal.slurm.model import Job, Node

#: Seconds between the runner's looks at its active nodes for a pre-emptive-swap drain (one
#: ``scontrol show node``) and, once one is seen, at the checkpoint directory.
PRESWAP_POLL = 5.0
SWAP_REASON = "hot-spare-swap"  # AUTOHEAL_REQUEUE_REASON of a step started on a spare
#: Seconds before a second look when the step ended non-zero and no node of the job is unhealthy yet.
RECHECK_SECONDS = 2.0
#: Seconds after a resize during which the runner keeps checking that Slurm still has it: a slurmctld
#: killed within seconds of the resize restarts from its last saved state, with the job on its old nodes
#: (issue 27); a kill later than this finds the resize saved.
VERIFY_SECONDS = 600.0
#: Re-applications of one lost resize before the runner leaves the node to xid-watch's requeue.
MAX_REDO = 3
#: Seconds between those checks for the first VERIFY_FAST_SECONDS after the resize: xid-watch's requeue
#: of the job it sees back on its drained node races the runner's look once slurmctld answers again.
VERIFY_FAST_POLL, VERIFY_FAST_SECONDS = 1.0, 120.0
#: Seconds a fault signal or a step's end, soon after a resize, waits for slurmctld to answer again.
CTLD_WAIT = 60.0


def resume_words(step: str, memory_tier: bool) -> str:
    """What the runner can say of where the restarted ranks resume. It knows the newest durable step
    (``step``: "none" when there is none); with the memory tier on, the ranks choose a newer memory copy
    when every rank has it (memtier.resume_source), which only they know: never name that step for them."""
    if step == "none":
        known = "starting with no checkpoint autoheal knows of"
        return f"{known} (or from a peer-memory copy when every rank has one)" if memory_tier else known
    if memory_tier:
        return f"resuming from durable checkpoint step {step}, or from a newer peer-memory copy when every rank has one"
    return f"resuming from checkpoint step {step}"


class HotSpareRun:
    """Runner methods for jobs with hot spares (``self.hot`` is None for every other job)."""

    hot: Optional[hs.NodeSets] = None
    shim_dir: Optional[Path] = None
    real_srun: str = ""
    batch_host: str = ""
    swaps: int = 0
    resized = False  # this run removed nodes from the allocation (Slurm may refuse comment updates now)
    # nodes this run released from the allocation, and until when to check that Slurm kept that
    _released: FrozenSet[str] = frozenset()
    _verify_until = 0.0
    _verify_next = 0.0
    _redone = 0

    if TYPE_CHECKING:  # what these methods use of Runner, which they are mixed into (defined there)
        opts: RunnerOptions
        ident: JobIdentity
        env: Dict[str, str]
        slurm: Optional[SlurmAdapter]
        comment: CommentState
        job_nodes: List[str]
        checkpoint_dir: str
        received: Optional[int]
        requeueing: bool
        grace_sig: signal.Signals
        adopt_orphans: bool

        def record(self, event: str, message: str, severity: str = ..., **evidence: Any) -> None: ...
        def write_comment(self) -> None: ...
        def _job(self) -> Optional[Job]: ...
        def _nodes(self, names: Sequence[str]) -> List[Node]: ...
        @staticmethod
        def _progress_step(checkpoint: Optional[Path], ckdir: str) -> str: ...
        def _resume_point(self, ckdir: str) -> Optional[Path]: ...
        def finish(self, state: str, code: int, message: str, severity: str = ...) -> int: ...
        def requeue_and_record(self, next_restart: int, cause: causes.Cause, step: str, nodes: Sequence[Node],
                               job: Optional[Job], evidence: Dict[str, Any]) -> int: ...
        def opts_budget(self) -> float: ...
        def wait_step(self, child: Child, timeout: float) -> bool: ...
        def interrupted(self, child: Child, signum: int, deadline_hit: bool) -> int: ...

    @property
    def _adapter(self) -> SlurmAdapter:
        """``self.slurm``, in the steps that only run with one (their callers check it first)."""
        if self.slurm is None:
            raise SlurmError("no Slurm access")
        return self.slurm

    @property
    def _sets(self) -> hs.NodeSets:
        """``self.hot``, in the methods that only run for a job with hot spares."""
        if self.hot is None:
            raise RuntimeError("hot-spare step for a job without hot spares")
        return self.hot

    # ---- setup -----------------------------------------------------------------------------------
    def hot_setup(self, env: Dict[str, str]) -> Dict[str, str]:
        """Split the allocation into active nodes and spares, write the srun shim, record both in the
        comment; returns the user's script's environment."""
        from autoheal.sbatch_helpers.runner import say

        if not self.job_nodes:
            say("warning: the job's nodes are unknown (no Slurm access?): running without hot spares")
            return env
        job = self._job()
        self.batch_host = (job.batch_host if job is not None else "") or self.env.get("SLURMD_NODENAME", "")
        self.hot = hs.initial_sets(self.job_nodes, int(getattr(self.opts, "active_nodes", 0) or 1),
                                   self.batch_host)
        self.real_srun = hs.find_srun(self.env.get("PATH", ""))
        if self.real_srun:
            self.shim_dir = Path(tempfile.mkdtemp(prefix=f"autoheal-srun-{self.ident.raw_id or 'job'}-"))
            atexit.register(shutil.rmtree, str(self.shim_dir), True)
            hs.write_shim(self.shim_dir, self.hot.spares)
        else:
            say("warning: srun not found on PATH: the spares cannot be kept out of the job's steps")
        try:
            self.swaps = int(self.comment.swaps or 0)
        except ValueError:
            self.swaps = 0
        self._hot_comment()
        say(f"hot spares: steps run on {','.join(self.hot.active)}; idle spare(s) "
            f"{','.join(self.hot.spares) or 'none'}")
        return self._hot_env(env)

    def _hot_env(self, env: Dict[str, str]) -> Dict[str, str]:
        return hs.step_env(env, self._sets, str(self.shim_dir) if self.shim_dir else "", self.real_srun)

    def _hot_comment(self) -> None:
        self.comment.nodes = ",".join(self._sets.active)
        self.comment.spares = hs.comment_spares(self._sets.spares)
        self.comment.swaps = str(self.swaps) if self.swaps else ""

    # ---- pre-emptive swap --------------------------------------------------------------------------
    _preswap: Optional[Dict[str, Any]] = None
    _preswap_next = 0.0
    _preswap_given_up: FrozenSet[str] = frozenset()

    def hot_preswap(self, child: Child) -> Union[str, int, None]:
        """Called while the step runs. An active node drained for a pre-emptive swap (the health check saw
        a warning sign: ``autoheal: pre-emptive swap: ...``) is swapped for a spare at the trainer's next
        checkpoint, as after a fault. Returns "restart" after the swap, an exit code if the swap failed
        and the job was requeued, else None (nothing to do, or wait). Without a spare, or once this run
        resized the job (Slurm 22.05 refuses a second resize), the node is left to today's path."""
        from autoheal.reasons import Origin, Reason
        from autoheal.sbatch_helpers.checkpoint import find_resume_point
        from autoheal.sbatch_helpers.runner import say

        if self.hot is not None and self._released:
            self.hot_verify(child)
        if self.hot is None or not self.hot.spares or self.resized:
            self._preswap = None
            return None
        now = time.monotonic()
        if now < self._preswap_next:
            return None
        self._preswap_next = now + PRESWAP_POLL
        ckdir = self.checkpoint_dir
        pending = self._preswap
        if pending is None:
            found = [t for t in hs.preswap_targets(self.hot, self._nodes(list(self.hot.active)), self.batch_host)
                     if t[0] not in self._preswap_given_up]
            if not found:
                return None
            step = self._progress_step(find_resume_point(ckdir, environ=self.env), ckdir)
            node, reason = found[0]
            self._preswap = {"nodes": [n for n, _ in found], "reason": reason, "step": step}
            self.record("job-preswap-pending", f"job {self.ident.job_id}: {node} drained ({reason}); swapping it "
                        f"for a spare at the next checkpoint (now at step {step})", "info", node=node,
                        reason=reason, checkpoint_step=step)
            self._preswap_next = 0.0  # from now on look at the checkpoints on every poll
            return None
        step = self._progress_step(find_resume_point(ckdir, environ=self.env), ckdir)
        if not hs.checkpoint_taken(pending["step"], step):
            self._preswap_next = now + 0.5
            return None
        job = self._job()
        if job is None or self._requeued_meanwhile(job):
            return None  # (requeued under this run: its signal or its step's end takes the requeued path)
        self._preswap = None
        # still drained for it (an admin may have resumed it; a fault reason means the fault path has it)
        still = [n for n, _ in hs.preswap_targets(self.hot, self._nodes(pending["nodes"]), self.batch_host)]
        if not still:
            say(f"hot spares: {','.join(pending['nodes'])} no longer drained for a pre-emptive swap; no swap")
            return None
        decision = hs.judge(self.hot, list(job.nodes), still, self.batch_host)
        if decision.kind != hs.SWAP:
            self._preswap_given_up = self._preswap_given_up | set(still)
            say(f"hot spares: pre-emptive swap of {','.join(still)} not possible ({decision.why}); the node "
                f"stays drained, the step goes on")
            return None
        parsed = Reason.parse(pending["reason"])
        body = parsed.body() if parsed is not None and parsed.origin is Origin.PRESWAP else pending["reason"]
        return self._hot_swap(child, decision, job, f"pre-emptive swap at checkpoint step {step}: {body}")

    # ---- faults ----------------------------------------------------------------------------------
    def hot_fault(self, child: Child, trigger: str) -> Union[str, int, None]:
        """A fault signal came, or the user's script ended non-zero. Returns "restart" (a swap was made:
        start the script again), "continue" (bad idle spares dropped: keep waiting), an exit code (the
        step died with a node and the job was requeued), or None (not a node problem, or the signal
        path's requeue: the caller goes on as without spares)."""
        from autoheal.sbatch_helpers.runner import say

        if self.received == signal.SIGTERM:
            return None  # Slurm's kill sequence (cancel, time limit, requeue): never a swap
        redone = self.hot_verify(child, force=True)
        if redone is not None:
            return redone
        if self._requeued_meanwhile(self._job()):
            return self._requeued_path(child)
        found = self._fault_decision(trigger)
        if found is None:
            return None
        job, allocation, decision = found
        if any(n not in allocation for n in self._sets.all):
            self.resized = True  # Slurm removed a failed node itself (--no-kill): no comment updates now
        if self.resized and decision.drop and decision.kind != hs.REQUEUE:
            # Slurm 22.05 without accounting refuses any further update of a job it resized (measured: a
            # second NodeList update waits 5 s in slurmctld, then "the DB index is being set"), so a node
            # that must leave the allocation cannot: requeue. A node Slurm removed itself needs no update.
            decision = hs.Decision(hs.REQUEUE, decision.lost, decision.drop,
                                   why=f"{decision.why}; but the job was resized already and Slurm refuses "
                                       f"another resize of it, so requeue")
        say(f"hot spares: {trigger}: {decision.kind}: {decision.why}")
        if decision.kind == hs.DROP_SPARES:
            return self._drop_bad_spares(job, decision)
        if decision.kind == hs.REQUEUE:
            if trigger == "signal":
                return None  # interrupted(): checkpoint, then requeue away from the drained node
            return self._hot_requeue(child, decision, job)
        return self._hot_swap(child, decision, job, trigger)

    def _requeued_meanwhile(self, job: Optional[Job]) -> bool:
        """Slurm (or someone) requeued the job under this run (xid-watch's own requeue at the end of its
        grace, a node failure): its allocation now is the next run's, and a swap judged by it would take
        this run's active nodes missing from it for nodes Slurm removed (lab, before hang detection ended
        blocked steps: the spare swapped in was recorded as the failed node, ``last=node-failure@gpu3``)."""
        from autoheal.sbatch_helpers.runner import say

        if job is None or causes.interrupt_action(job.state, job.restart_count,
                                                  self.ident.restart_count) != "none-requeued":
            return False
        say(f"hot spares: job {self.ident.job_id} was requeued meanwhile (state {job.state}, restart "
            f"{job.restart_count}): no swap in an allocation that is no longer this run's")
        return True

    def _requeued_path(self, child: Child) -> int:
        """The requeued-by-others path: the run's own nodes name the cause."""
        signum = self.received if self.received is not None else int(self.grace_sig)
        return self.interrupted(child, signum, deadline_hit=False)

    def _fault_decision(self, trigger: str) -> Optional[Tuple[Job, List[str], hs.Decision]]:
        """(the job, its allocation, what to do) for a node problem among the job's nodes, or None.

        A step that died with its GPU (XID 79 kills the CUDA process) may end before xid-watch has
        drained the node: look once more after a moment before calling it the command's own failure."""
        for attempt in range(1 if trigger == "signal" else 2):
            if attempt:
                time.sleep(RECHECK_SECONDS)
            job = self._job()
            if job is None:
                return None
            allocation = list(job.nodes)
            names = sorted(set(allocation) | set(self._sets.all))
            unhealthy = [n.name for n in self._nodes(names) if node_unhealthy(n) and not hs.preswap_only(n)]
            decision = hs.judge(self._sets, allocation, unhealthy, self.batch_host,
                                int(getattr(self.opts, "min_nodes", 0) or 0))
            if decision.kind != hs.NOTHING:
                return job, allocation, decision
        return None

    def _drop_bad_spares(self, job: Job, decision: hs.Decision) -> Optional[str]:
        """Release unhealthy idle spares from the allocation: "continue" when Slurm took the resize."""
        before = self.hot
        self.hot = decision.after
        self._hot_comment()
        self.write_comment()  # before the resize (see _hot_swap)
        if self._hot_shrink(job, decision.drop):
            self.resized = True
            self.received = None
            self._write_spares()
            self._released_now([n for n in decision.drop if n in job.nodes])
            self.record("job-spare-dropped", f"job {self.ident.job_id}: idle spare(s) {','.join(decision.drop)} "
                        f"unhealthy, released from the allocation; the step goes on on "
                        f"{','.join(self._sets.active)}", "action", node=decision.drop[0],
                        dropped=",".join(decision.drop), spares=",".join(self._sets.spares))
            return "continue"
        self.hot = before
        self._hot_comment()
        return None

    # ---- a resize slurmctld lost (killed within seconds of it) ------------------------------------------
    def _released_now(self, nodes: Sequence[str]) -> None:
        if nodes:
            self._released = self._released | set(nodes)
            self._released_at = time.monotonic()
            self._verify_until = self._released_at + VERIFY_SECONDS
            self._redone = 0

    def hot_verify(self, child: Child, force: bool = False) -> Union[str, None]:
        """After a resize: does Slurm still have it? A slurmctld killed within seconds of the
        ``scontrol update NodeList=`` restarts from its last saved state, with the job on its old nodes,
        the released (bad) node among them; xid-watch, seeing the job on its drained node, would requeue
        it at the end of its grace. Seen (every poll, and on any fault signal or step exit): the comment
        is written again and the node released again, the swap the runner already made; the step goes on
        (``continue``) or, if it ended meanwhile, starts again on the active nodes from the newest
        checkpoint (``restart``). None: nothing lost, or not looked now."""
        from autoheal.sbatch_helpers.runner import say

        now = time.monotonic()
        if not self._released or now > self._verify_until or self._redone >= MAX_REDO:
            return None
        if not force and now < self._verify_next:
            return None
        fast = now - getattr(self, "_released_at", 0.0) < VERIFY_FAST_SECONDS
        self._verify_next = now + (VERIFY_FAST_POLL if fast else PRESWAP_POLL)
        job = self._job()
        waited = 0.0
        while job is None and force and fast and waited < CTLD_WAIT:
            # slurmctld away (restarting) right after our resize, and a signal or the step's end needs an
            # answer now: what Slurm will say when it is back decides (swap again, or the fault path)
            time.sleep(VERIFY_FAST_POLL)
            waited += VERIFY_FAST_POLL
            job = self._job()
        if job is None:  # still away: look again at the next poll
            return None
        back = [n for n in job.nodes if n in self._released]
        if not back:
            return None
        self._redone += 1
        say(f"hot spares: Slurm has {','.join(back)} in job {self.ident.job_id} again (slurmctld restarted "
            f"without the resize): releasing it again")
        self.resized = False  # Slurm's view: the job was never resized, so it takes updates again
        self._hot_comment()
        self.write_comment()
        if not self._hot_shrink(job, back):
            return None  # refused: the next look tries again (at most MAX_REDO), then xid-watch's requeue
        self.resized = True
        self.received = None  # the grace signal xid-watch sent for the node the job is off again
        alive = bool(getattr(child, "group_alive", False)) and not getattr(child, "leader_done", False)
        self.record("job-hot-swap-redone", f"job {self.ident.job_id}: slurmctld restarted with {','.join(back)} "
                    f"back in the allocation (its last resize lost); released again, the step "
                    f"{'goes on' if alive else 'starts again'} on {','.join(self._sets.active)}; no requeue",
                    "action", node=back[0], released=",".join(back), active=",".join(self._sets.active),
                    swaps=self.swaps)
        if alive:
            return "continue"
        if getattr(child, "group_alive", False):  # the step's leader ended, some of its processes did not
            self._stop_step(child)
        self._next_resume = self._resume_point(self.checkpoint_dir)
        return "restart"

    def _stop_step(self, child: Child) -> float:
        """Forward the grace signal to the step, wait for it to checkpoint and end; seconds waited."""
        from autoheal.sbatch_helpers.runner import KILL_AFTER_TERM, say

        started = time.monotonic()
        if not child.group_alive:
            return 0.0
        say(f"forwarding {self.grace_sig.name} to the step, waiting up to {self.opts.grace}s for it to checkpoint")
        child.signal(int(self.grace_sig))
        # ranks hung after the fault are ended at once (hang.py); the memory-tier agents live on
        if not self.wait_step(child, self.opts.grace):
            child.signal(signal.SIGTERM)
            if not child.wait_group(KILL_AFTER_TERM):
                child.signal(signal.SIGKILL)
                child.wait_group(KILL_AFTER_TERM)
        return time.monotonic() - started

    def _hot_shrink(self, job: Job, drop: Sequence[str]) -> bool:
        """Remove ``drop`` from the allocation; False when Slurm refused (the caller falls back)."""
        from autoheal.errors import SlurmError
        from autoheal.sbatch_helpers.runner import retry_step, say

        if not drop or self.slurm is None:
            return bool(not drop)
        keep = [n for n in job.nodes if n not in drop]
        try:
            retry_step(lambda: self._adapter.shrink_job(self.ident.job_id, keep), self.opts_budget(),
                       f"release {','.join(drop)} from job {self.ident.job_id}")
        except SlurmError as exc:
            say(f"warning: cannot release {','.join(drop)} from job {self.ident.job_id}: {exc}")
            return False
        return True

    def _hot_swap(self, child: Child, decision: hs.Decision, job: Job, trigger: str) -> Union[str, int, None]:
        waited = self._stop_step(child)
        fresh = self._job() or job
        if self._requeued_meanwhile(fresh):  # requeued while the step was stopping: nothing left to swap in
            return self._requeued_path(child)
        latest = self._resume_point(self.checkpoint_dir)
        step = self._progress_step(latest, self.checkpoint_dir)
        before = (self.hot, self.swaps)
        self.hot, self.swaps = decision.after, self.swaps + 1
        # The comment first: once a running job was resized, Slurm 22.05 without accounting refuses
        # every update of it ("the DB index is being set", after 5 s of retries inside scontrol) until
        # it ends or is requeued (see hot_fault for a job Slurm resized itself).
        self._hot_comment()
        # a new resume point: how far the run got before it says nothing of the step starting now
        self.comment.resumed, self.comment.reached, self.comment.state = step, "", "running"
        self.write_comment()
        if not self._hot_shrink(fresh, [n for n in decision.drop if n in fresh.nodes]):
            self.hot, self.swaps = before
            self._hot_comment()
            if trigger == "signal":
                return None  # the requeue path, away from the node
            return self._hot_requeue(child, decision, fresh)
        self.resized = True
        self.received = None
        self._write_spares()
        self._released_now([n for n in decision.drop if n in fresh.nodes])
        lost, took = ",".join(decision.lost), ",".join(decision.swapped_in)
        what = (f"{lost} swapped for spare {took}" if decision.kind == hs.SWAP else
                f"{lost} lost, elastic job continues on {len(self._sets.active)} node(s)"
                + (f" (spare {took} taken)" if took else ""))
        memory = self._memory_tier_on()
        self.record("job-hot-swap", f"job {self.ident.job_id}: {what} inside the allocation ({trigger}); "
                    f"{resume_words(step, memory)} on {','.join(self._sets.active)}; no requeue "
                    f"({len(self._sets.spares)} spare(s) left)", "action", node=decision.lost[0], kind=decision.kind,
                    lost=lost, spare=took, active=",".join(self._sets.active), spares=",".join(self._sets.spares),
                    checkpoint_step=step, memory_tier=memory, waited=round(waited, 1), trigger=trigger,
                    swaps=self.swaps, preemptive=trigger.startswith("pre-emptive"))
        self._next_resume = latest
        return "restart"

    def _memory_tier_on(self) -> bool:
        """The peer-memory tier's agents run for this job (memtier_launch put their addresses into the
        runner's environment): the ranks may resume from a memory copy newer than any durable step."""
        from autoheal.sbatch_helpers.memtier import AGENTS_ENV

        return bool(self.env.get(AGENTS_ENV))

    def hot_restart(self, argv: Sequence[str]) -> Child:
        """The user's script again, on the new active nodes, resuming from the newest valid checkpoint."""
        from autoheal.sbatch_helpers.runner import Child, build_env

        latest = getattr(self, "_next_resume", None)
        env = build_env(self.env, checkpoint_dir=self.checkpoint_dir, restart_count=self.ident.restart_count,
                        resume_from=str(latest) if latest else None, reason=SWAP_REASON,
                        grace_signal=self.opts.signal)
        env["AUTOHEAL_SWAP_COUNT"] = str(self.swaps)
        return Child(argv, self._hot_env(env), reap_all=self.adopt_orphans)

    def _hot_requeue(self, child: Child, decision: hs.Decision, job: Job) -> int:
        """The step died with a node and no spare can replace it: requeue away from it (as after a drain)."""
        from autoheal.sbatch_helpers.runner import EXIT_MAX_RESTARTS

        lost_nodes = self._nodes(list(decision.lost))
        cause = causes.node_problem(lost_nodes) or causes.Cause(
            causes.NODE_FAILURE, decision.lost[0] if decision.lost else "",
            "removed from the allocation by Slurm (node failure)")
        nodes = self._nodes(sorted(set(job.nodes) | set(decision.lost)))
        latest = self._resume_point(self.checkpoint_dir)
        step = self._progress_step(latest, self.checkpoint_dir)
        evidence = dict(cause=cause.kind, node=cause.node, checkpoint_step=step, detail=decision.why,
                        child_exit=child.status, job_state=job.state)
        if self.ident.restart_count >= self.opts.max_restarts:
            self.comment.last, self.comment.step = cause.label(), step
            return self.finish("max-restarts", EXIT_MAX_RESTARTS,
                               f"job {self.ident.job_id}: {cause.kind} after {self.ident.restart_count} restarts "
                               f"(--max-restarts {self.opts.max_restarts}); not requeued, checkpoint step {step}")
        self.requeueing = True
        return self.requeue_and_record(self.ident.restart_count + 1, cause, step, nodes, job, evidence)

    def hot_restore_size(self, job_id: str) -> None:
        """Before a requeued hot-spare job is released: ask for the spares again, as a range, so the job
        starts with fewer spares rather than wait for all of them (sbatch's --nodes=min-max)."""
        from autoheal.errors import SlurmError
        from autoheal.sbatch_helpers.runner import say

        want = int(getattr(self.opts, "active_nodes", 0) or 0)
        if not want or self.slurm is None:
            return
        spec = f"{want}-{want + self.opts.spare_nodes}"
        try:
            self.slurm.set_node_count(job_id, want, want + self.opts.spare_nodes)
        except SlurmError as exc:
            say(f"warning: cannot ask for the spares again (NumNodes={spec}): {exc}")

    def _write_spares(self) -> None:
        if self.shim_dir is not None:
            try:
                hs.write_spares(self.shim_dir, self._sets.spares)
            except OSError as exc:
                from autoheal.sbatch_helpers.runner import say

                say(f"warning: cannot update the srun shim's spares: {exc}")

