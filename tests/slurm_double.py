"""An in-memory Slurm that answers like the real one for the job writes autoheal makes.

The semantics are the ones observed on the lab (Debian 12, Slurm 22.05.8) and recorded in
tests/integration/test_adapter_lab.py::test_job_write_outcomes_are_typed: ExcNodeList only while
PENDING, a second requeue answers "Job is pending execution", requeuehold leaves reason JobHeldUser with
the description "job requeued in held state", an admin's hold turns the reason into JobHeldAdmin,
release of a job that is not held succeeds. Tests script faults with ``fail_next`` and ``before``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, List, Optional

from autoheal.errors import (SlurmJobAlreadyPending, SlurmJobFinished, SlurmJobNotPending, SlurmNotFound,
                             SlurmRequeueDisabled)
from autoheal.slurm.base import SlurmAdapter, filter_jobs
from autoheal.slurm.model import REQUEUE_HELD_DESCRIPTION, Job, Node, SlurmVersion

FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}


class MemorySlurm(SlurmAdapter):
    name = "memory"

    def __init__(self, nodes=(), jobs=()):
        self.nodes: Dict[str, Node] = {n.name: n for n in nodes}
        self.jobs: Dict[str, Job] = {j.job_id: j for j in jobs}
        self.calls: List[tuple] = []
        self.fail_next: Dict[str, List[Exception]] = {}  # op -> errors raised by its next calls
        self.before: Optional[Callable[[str, tuple], None]] = None  # runs before each write (e.g. a kill)

    # ---- plumbing --------------------------------------------------------------------------------
    def _enter(self, op: str, *args) -> None:
        self.calls.append((op,) + args)
        if self.before is not None:
            self.before(op, args)
        queue = self.fail_next.get(op)
        if queue:
            raise queue.pop(0)

    def _job(self, job_id: str) -> Job:
        try:
            return self.jobs[str(job_id)]
        except KeyError:
            raise SlurmNotFound(f"Invalid job id specified for job {job_id}") from None

    def _set(self, job: Job, **changes) -> Job:
        job = replace(job, **changes)
        self.jobs[job.job_id] = job
        return job

    def writes(self, job_id: Optional[str] = None) -> List[tuple]:
        """The write calls made (reads left out), optionally for one job."""
        return [c for c in self.calls if c[0] not in ("list_nodes", "list_jobs", "get_job")
                and (job_id is None or (len(c) > 1 and str(c[1]) == str(job_id)))]

    # ---- reads -----------------------------------------------------------------------------------
    def version(self) -> SlurmVersion:
        return SlurmVersion(22, 5, 8, "22.05.8")

    def list_nodes(self) -> List[Node]:
        self._enter("list_nodes")
        return list(self.nodes.values())

    def list_jobs(self, node=None, states=None) -> List[Job]:
        self._enter("list_jobs")
        return filter_jobs(list(self.jobs.values()), node, states)

    def get_job(self, job_id: str) -> Job:
        self._enter("get_job", str(job_id))
        return self._job(job_id)

    def show_config(self) -> Dict[str, str]:
        return {}

    def ping(self) -> bool:
        return True

    # ---- node writes -----------------------------------------------------------------------------
    def drain(self, node: str, reason: str) -> None:
        self._enter("drain", node, reason)
        self.nodes[node] = replace(self.nodes[node], flags=self.nodes[node].flags | {"DRAIN"}, reason=reason)

    def resume(self, node: str) -> None:
        self._enter("resume", node)
        self.nodes[node] = replace(self.nodes[node], flags=self.nodes[node].flags - {"DRAIN"}, reason="")

    def set_reason(self, node: str, reason: str) -> None:
        self._enter("set_reason", node, reason)
        self.nodes[node] = replace(self.nodes[node], reason=reason)

    def reboot(self, node: str, reason: str, asap: bool = True, nextstate: str = "resume") -> None:
        self._enter("reboot", node, reason)

    # ---- job writes ------------------------------------------------------------------------------
    def requeue(self, job_id: str, hold: bool = False) -> None:
        self._enter("requeuehold" if hold else "requeue", str(job_id))
        job = self._job(job_id)
        if job.state in FINISHED:
            raise SlurmJobFinished(f"Job/step already completing or completed for job {job_id}")
        if job.state == "PENDING":
            raise SlurmJobAlreadyPending(f"Job is pending execution for job {job_id}")
        if not job.requeue:
            raise SlurmRequeueDisabled(f"Requested operation is presently disabled for job {job_id}")
        held = dict(priority=0, state_reason="JobHeldUser", state_description=REQUEUE_HELD_DESCRIPTION)
        self._set(job, state="PENDING", nodes=(), restart_count=job.restart_count + 1,
                  **(held if hold else dict(priority=1, state_reason="BeginTime", state_description="")))

    def release(self, job_id: str) -> None:
        self._enter("release", str(job_id))
        job = self._job(job_id)
        if job.held:
            self._set(job, priority=1, state_reason="None")  # the description stays, as in Slurm

    def hold(self, job_id: str, admin: bool = True) -> None:
        """Someone's own ``scontrol hold`` (test helper, not part of the adapter)."""
        job = self._job(job_id)
        self._set(job, priority=0, state_reason="JobHeldAdmin" if admin else "JobHeldUser",
                  state_description=job.state_description if admin else "")

    def update_job(self, job_id: str, **fields: str) -> None:
        self._enter("update_job", str(job_id), fields)
        job = self._job(job_id)
        if "ExcNodeList" in fields:
            if job.state != "PENDING":
                raise SlurmJobNotPending(f"Job is no longer pending execution for job {job_id}")
            job = self._set(job, excluded_nodes=tuple(n for n in fields["ExcNodeList"].split(",") if n))
        if "Comment" in fields:
            self._set(job, comment=fields["Comment"])

    def signal_job(self, job_id: str, signal: str, batch: bool = False, full: bool = False) -> None:
        self._enter("signal_job", str(job_id), signal)
        if self._job(job_id).state in FINISHED:
            raise SlurmJobFinished(f"Job/step already completing or completed for job {job_id}")

    # ---- test helpers ----------------------------------------------------------------------------
    def start(self, job_id: str, nodes) -> None:
        """The scheduler placed the job."""
        self._set(self._job(job_id), state="RUNNING", nodes=tuple(nodes))
