"""The in-memory Slurm the tests and benches share: a ``SlurmAdapter`` over dicts of nodes and jobs.

Node writes do what slurmctld does to the node (drain sets DRAIN and the reason; resume clears DRAIN
and FAIL and brings a DOWN node back IDLE). Job writes answer like the real Slurm, with the semantics
observed on the lab (Debian 12, Slurm 22.05.8) and recorded in
tests/integration/test_adapter_lab.py::test_job_write_outcomes_are_typed: ExcNodeList only while
PENDING, a second requeue answers "Job is pending execution", requeuehold leaves reason JobHeldUser with
the description "job requeued in held state", an admin's hold turns the reason into JobHeldAdmin,
release of a job that is not held succeeds.

Faults: ``fail = True`` makes every call answer SlurmUnavailable (slurmctld down); ``fail_next[op]``
lists errors raised by the next calls of one operation; ``before`` runs before each call (e.g. a kill).
Every call is recorded in ``calls``; ``writes()`` lists the writes. Thread-safe (the sync daemon's
threads share one).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from autoheal.errors import (
    SlurmJobAlreadyPending,
    SlurmJobFinished,
    SlurmJobNotPending,
    SlurmNotFound,
    SlurmRequeueDisabled,
    SlurmUnavailable,
)
from autoheal.slurm.base import SlurmAdapter, filter_jobs
from autoheal.slurm.model import REQUEUE_HELD_DESCRIPTION, Job, JobUpdate, Node, SlurmVersion

FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}
READS = ("list_nodes", "list_jobs", "get_job")


class MemorySlurm(SlurmAdapter):
    name = "memory"

    def __init__(self, nodes: Iterable[Node] = (), jobs: Iterable[Job] = ()) -> None:
        self.nodes: Dict[str, Node] = {n.name: n for n in nodes}
        self.jobs: Dict[str, Job] = {j.job_id: j for j in jobs}
        self.calls: List[Tuple[Any, ...]] = []
        self.fail = False  # every call answers SlurmUnavailable while set
        self.fail_next: Dict[str, List[Exception]] = {}  # op -> errors raised by its next calls
        self.before: Optional[Callable[[str, Tuple[Any, ...]], None]] = None  # runs before each call
        self.lock = threading.RLock()

    # ---- plumbing --------------------------------------------------------------------------------
    def _enter(self, op: str, *args: Any) -> None:
        self.calls.append((op,) + args)
        if self.before is not None:
            self.before(op, args)
        if self.fail:
            raise SlurmUnavailable("slurmctld not answering (simulated)")
        queue = self.fail_next.get(op)
        if queue:
            raise queue.pop(0)

    def _node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise SlurmNotFound(f"Invalid node name specified: {name}") from None

    def _job(self, job_id: str) -> Job:
        try:
            return self.jobs[str(job_id)]
        except KeyError:
            raise SlurmNotFound(f"Invalid job id specified for job {job_id}") from None

    def _set(self, job: Job, **changes: Any) -> Job:
        job = replace(job, **changes)
        self.jobs[job.job_id] = job
        return job

    def writes(self, job_id: Optional[str] = None) -> List[Tuple[Any, ...]]:
        """The write calls made (reads left out), optionally for one job."""
        return [c for c in self.calls if c[0] not in READS
                and (job_id is None or (len(c) > 1 and str(c[1]) == str(job_id)))]

    def count(self, op: str) -> int:
        """How many times ``op`` was called."""
        return sum(1 for c in self.calls if c[0] == op)

    # ---- reads -----------------------------------------------------------------------------------
    def version(self) -> SlurmVersion:
        return SlurmVersion(22, 5, 8, "22.05.8")

    def list_nodes(self) -> List[Node]:
        with self.lock:
            self._enter("list_nodes")
            return list(self.nodes.values())

    def list_jobs(self, node: Optional[str] = None, states: Optional[List[str]] = None) -> List[Job]:
        with self.lock:
            self._enter("list_jobs")
            return filter_jobs(list(self.jobs.values()), node, states)

    def get_job(self, job_id: str) -> Job:
        with self.lock:
            self._enter("get_job", str(job_id))
            return self._job(job_id)

    def show_config(self) -> Dict[str, str]:
        return {}

    def ping(self) -> bool:
        return not self.fail

    # ---- node writes -----------------------------------------------------------------------------
    def drain(self, node: str, reason: str) -> None:
        with self.lock:
            self._enter("drain", node, reason)
            n = self._node(node)
            self.nodes[node] = replace(n, flags=n.flags | {"DRAIN"}, reason=reason)

    def resume(self, node: str) -> None:
        with self.lock:
            self._enter("resume", node)
            n = self._node(node)
            state = "IDLE" if n.state == "DOWN" else n.state
            self.nodes[node] = replace(n, state=state, flags=n.flags - {"DRAIN", "FAIL"}, reason="")

    def set_reason(self, node: str, reason: str) -> None:
        with self.lock:
            self._enter("set_reason", node, reason)
            self.nodes[node] = replace(self._node(node), reason=reason)

    def reboot(self, node: str, reason: str, asap: bool = True, nextstate: str = "resume") -> None:
        with self.lock:
            self._enter("reboot", node, reason)
            self._node(node)

    # ---- job writes ------------------------------------------------------------------------------
    def requeue(self, job_id: str, hold: bool = False) -> None:
        with self.lock:
            self._enter("requeuehold" if hold else "requeue", str(job_id))
            job = self._job(job_id)
            if job.state in FINISHED:
                raise SlurmJobFinished(f"Job/step already completing or completed for job {job_id}")
            if job.state == "PENDING":
                raise SlurmJobAlreadyPending(f"Job is pending execution for job {job_id}")
            if not job.requeue:
                raise SlurmRequeueDisabled(f"Requested operation is presently disabled for job {job_id}")
            held: Dict[str, Any] = dict(priority=0, state_reason="JobHeldUser",
                                        state_description=REQUEUE_HELD_DESCRIPTION)
            pending: Dict[str, Any] = dict(priority=1, state_reason="BeginTime", state_description="")
            self._set(job, state="PENDING", nodes=(), restart_count=job.restart_count + 1,
                      **(held if hold else pending))

    def release(self, job_id: str) -> None:
        with self.lock:
            self._enter("release", str(job_id))
            job = self._job(job_id)
            if job.held:
                self._set(job, priority=1, state_reason="None")  # the description stays, as in Slurm

    def update_job(self, job_id: str, update: JobUpdate) -> None:
        fields = update.scontrol_fields()
        with self.lock:
            self._enter("update_job", str(job_id), fields)
            job = self._job(job_id)
            if "ExcNodeList" in fields:
                if job.state != "PENDING":
                    raise SlurmJobNotPending(f"Job is no longer pending execution for job {job_id}")
                job = self._set(job, excluded_nodes=tuple(n for n in fields["ExcNodeList"].split(",") if n))
            if "Comment" in fields:
                self._set(job, comment=fields["Comment"])

    def signal_job(self, job_id: str, signal: str, batch: bool = False, full: bool = False) -> None:
        with self.lock:
            self._enter("signal_job", str(job_id), signal)
            if self._job(job_id).state in FINISHED:
                raise SlurmJobFinished(f"Job/step already completing or completed for job {job_id}")

    # ---- what others do (test helpers, not part of the adapter) ----------------------------------
    def hold(self, job_id: str, admin: bool = True) -> None:
        """Someone's own ``scontrol hold``."""
        with self.lock:
            job = self._job(job_id)
            self._set(job, priority=0, state_reason="JobHeldAdmin" if admin else "JobHeldUser",
                      state_description=job.state_description if admin else "")

    def start(self, job_id: str, nodes: Iterable[str]) -> None:
        """The scheduler placed the job."""
        with self.lock:
            self._set(self._job(job_id), state="RUNNING", nodes=tuple(nodes))
