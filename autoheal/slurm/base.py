"""The one interface every Slurm backend implements, plus the shared retry policy.

Callers depend on ``SlurmAdapter`` only; ``autoheal.slurm.get_adapter(config)`` picks the backend.
Reads retry with backoff when slurmctld does not answer; a final failure raises ``SlurmUnavailable``,
which every caller must treat as "unknown" (never as a reason to drain or resume).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

from autoheal.errors import (
    SlurmError,
    SlurmJobAlreadyPending,
    SlurmJobBusy,
    SlurmJobFinished,
    SlurmJobNotPending,
    SlurmNotFound,
    SlurmNotSupported,
    SlurmRequeueDisabled,
    SlurmUnavailable,
)
from autoheal.slurm.model import Job, JobUpdate, Node, SlurmVersion

T = TypeVar("T")


def with_retries(fn: Callable[[], T], retries: int, base_delay: float = 0.5,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """Call ``fn``; on SlurmUnavailable or SlurmJobBusy retry ``retries`` times with doubling delay
    (capped at 5 s)."""
    attempt = 0
    while True:
        try:
            return fn()
        except (SlurmUnavailable, SlurmJobBusy):
            if attempt >= retries:
                raise
            sleep(min(5.0, base_delay * (2 ** attempt)))
            attempt += 1


def filter_jobs(jobs: List[Job], node: Optional[str] = None, states: Optional[List[str]] = None) -> List[Job]:
    """Jobs with an allocation on ``node`` and in one of ``states`` (each filter optional)."""
    if node:
        jobs = [j for j in jobs if node in j.nodes]
    if states:
        wanted = {s.upper() for s in states}
        jobs = [j for j in jobs if j.state in wanted]
    return jobs


#: What a backend may be asked to do; ``SlurmAdapter.capabilities`` says which of them it can.
#: ``update-job``: exclusions and comments; ``resize-job``: a job's node list or count (hot spares).
OPERATIONS = ("read", "show-config", "drain", "resume", "reboot", "requeue", "release", "update-job",
              "resize-job", "signal", "batch-script", "job-gpus", "job-history")


class SlurmAdapter(ABC):
    """Everything autoheal asks of Slurm. Node and job names are plain strings.

    Job writes raise typed outcomes (autoheal.errors) that callers decide on: SlurmJobAlreadyPending
    (requeue of a job already requeued), SlurmJobNotPending (an update/release that needs a pending job),
    SlurmJobFinished, SlurmRequeueDisabled, SlurmJobBusy (retry), SlurmNotFound, SlurmUnavailable.
    """

    name = "abstract"

    def capabilities(self) -> Dict[str, str]:
        """Operation -> how it is done ("cli", "rest", "pyslurm", or "" when it cannot be done)."""
        return dict.fromkeys(OPERATIONS, self.name)

    # ---- reads -----------------------------------------------------------------------------------
    @abstractmethod
    def version(self) -> SlurmVersion:
        """The Slurm version of the client tools / server."""

    @abstractmethod
    def list_nodes(self) -> List[Node]:
        """Every node with state, flags and reason, in one call."""

    def get_node(self, name: str) -> Node:
        """One node; SlurmNotFound when Slurm does not know it."""
        for node in self.list_nodes():
            if node.name == name:
                return node
        raise SlurmNotFound(f"node {name!r} not found")

    @abstractmethod
    def list_jobs(self, node: Optional[str] = None, states: Optional[List[str]] = None) -> List[Job]:
        """Jobs (all, or those with an allocation on ``node``), optionally filtered by state."""

    def get_job(self, job_id: str) -> Job:
        """One job by id (``123`` or ``123_4``); SlurmNotFound when it is gone."""
        for job in self.list_jobs():
            if job.job_id == str(job_id) or job.raw_id == str(job_id):
                return job
        raise SlurmNotFound(f"job {job_id} not found")

    def batch_script(self, job_id: str) -> str:
        """The job's batch script as Slurm stored it (``scontrol write batch_script ID -``): where a
        job's ``#SBATCH --signal`` lives, which no job field reports. SlurmNotSupported by backends
        that cannot read it; SlurmNotFound when the job is gone."""
        raise SlurmNotSupported(f"the {self.name} backend cannot read a job's batch script")

    def job_gpus(self, job_id: str, node: str, timeout: Optional[float] = None) -> List[int]:
        """The GPU indices a job holds on ``node`` (``scontrol -d show job``: ``GRES=gpu:2(IDX:0-1)``), []
        when it holds none there. Not retried: ``timeout`` bounds the one call (the prolog must not
        block). SlurmNotSupported by backends that cannot tell; SlurmNotFound when the job is gone."""
        raise SlurmNotSupported(f"the {self.name} backend cannot read a job's GPU indices")

    def job_state_history(self, job_id: str) -> Optional[List[str]]:
        """The job's state at the end of each of its runs, oldest first, from accounting (``sacct -D``);
        None when accounting is off or does not know the job. SlurmNotSupported by backends without it."""
        raise SlurmNotSupported(f"the {self.name} backend cannot read job accounting")

    @abstractmethod
    def show_config(self) -> Dict[str, str]:
        """The running slurm.conf values as slurmctld reports them (``scontrol show config``)."""

    @abstractmethod
    def ping(self) -> bool:
        """True when slurmctld answers."""

    # ---- node writes -----------------------------------------------------------------------------
    @abstractmethod
    def drain(self, node: str, reason: str) -> None:
        """Set DRAIN with ``reason`` (the caller sanitises and checks ownership: see nodeops)."""

    @abstractmethod
    def resume(self, node: str) -> None:
        """Clear DRAIN/DOWN (state=resume)."""

    @abstractmethod
    def set_reason(self, node: str, reason: str) -> None:
        """Replace the reason of an already drained node."""

    @abstractmethod
    def reboot(self, node: str, reason: str, asap: bool = True, nextstate: str = "resume") -> None:
        """``scontrol reboot [ASAP] nextstate=... reason=... node``."""

    # ---- job writes ------------------------------------------------------------------------------
    @abstractmethod
    def requeue(self, job_id: str, hold: bool = False) -> None:
        """``scontrol requeue`` (or ``requeuehold`` with ``hold``)."""

    @abstractmethod
    def release(self, job_id: str) -> None:
        """Release a held job."""

    @abstractmethod
    def update_job(self, job_id: str, update: JobUpdate) -> None:
        """Change the fields ``update`` sets (``scontrol update jobid=X Key=Value ...``)."""

    def set_excluded_nodes(self, job_id: str, nodes: List[str]) -> None:
        """Replace the job's ExcNodeList (Slurm accepts this only while the job is PENDING)."""
        self.update_job(job_id, JobUpdate(excluded_nodes=tuple(nodes)))

    def shrink_job(self, job_id: str, keep: List[str]) -> None:
        """Shrink a RUNNING job to the nodes in ``keep`` (``scontrol update JobId=X NodeList=<keep>``):
        the other nodes leave the allocation at once, the job and its batch shell keep running. Only
        jobs submitted with ``--no-kill`` survive losing a node this way; steps still running on a
        dropped node are killed by Slurm."""
        if not keep:
            raise SlurmError(f"job {job_id}: refusing to shrink to no node at all")
        self.update_job(job_id, JobUpdate(nodes=tuple(keep)))

    def job_steps(self, job_id: str) -> List[Tuple[str, str]]:
        """The job's running steps as (step id ``123.0``, step name). SlurmNotSupported by backends
        without it."""
        raise SlurmNotSupported(f"the {self.name} backend cannot list a job's steps")

    @abstractmethod
    def signal_job(self, job_id: str, signal: str, batch: bool = False, full: bool = False) -> None:
        """Send a signal to a job's steps (``batch``: only the batch shell; ``full``: every process)."""

    def set_job_comment(self, job_id: str, comment: str) -> None:
        """Replace the job's comment (visible in ``squeue -o %k`` and ``sacct``)."""
        self.update_job(job_id, JobUpdate(comment=comment))

    def set_node_count(self, job_id: str, minimum: int, maximum: int) -> None:
        """Set the node count a PENDING job asks for (``NumNodes=min-max``)."""
        self.update_job(job_id, JobUpdate(node_count=(minimum, maximum)))

    # ---- added for the guard's lost-prolog rule (kept last in the class: other branches edit above) ----
    def job_start_time(self, job_id: str) -> Optional[int]:
        """Epoch seconds of the job's allocation (StartTime), None when Slurm does not say or the answer is
        ambiguous; SlurmNotFound when the job is gone. The default reads the job record (JSON backends
        carry ``start_time``); the CLI backend asks ``scontrol show job``, as 22.05's text listings lack it."""
        return self.get_job(job_id).start_time


# Slurm's own error strings (slurm_strerror: the same text on scontrol's stderr and in slurmrestd's
# "errors"), translated into typed outcomes here and nowhere else.
_JOB_OUTCOMES = (
    ("job is no longer pending execution", SlurmJobNotPending),
    ("job is pending execution", SlurmJobAlreadyPending),
    ("already completing or completed", SlurmJobFinished),
    ("job/step already completed", SlurmJobFinished),
    ("job has already finished", SlurmJobFinished),
    ("requested operation is presently disabled", SlurmRequeueDisabled),
    ("requeue of this job is disabled", SlurmRequeueDisabled),
    ("can not be altered now", SlurmJobBusy),
    # after a running job was resized, until accounting gives it a new record; with
    # accounting_storage/none (22.05) that never happens: callers bound their retries
    ("the db index is being set", SlurmJobBusy),
    # SLURM_UNEXPECTED_MSG_ERROR: seen in the soak for an array task's update just after a slurmctld
    # restart; the same update passes a moment later
    ("unexpected message received", SlurmJobBusy),
    ("invalid job id", SlurmNotFound),
)


def job_outcome(message: str) -> Optional[type]:
    """The typed outcome a Slurm job-write error message stands for, or None for any other error."""
    text = message.lower()
    for needle, kind in _JOB_OUTCOMES:
        if needle in text:
            return kind
    return None


#: Slurm's words for "no such node/job" (slurm_strerror: ESLURM_INVALID_NODE_NAME, ESLURM_INVALID_JOB_ID, and
#: the tools' own "not found"), shared by the three backends.
_NOT_FOUND = ("not found", "invalid node name", "invalid job id")


def not_found_if(message: str) -> bool:
    """True when a Slurm error message means the named node or job does not exist."""
    text = message.lower()
    return any(s in text for s in _NOT_FOUND)


def unavailable_if(message: str) -> bool:
    """True when a Slurm error message means "controller unreachable / not answering"."""
    text = message.lower()
    return any(s in text for s in ("unable to contact slurm controller", "socket timed out",
                                   "connection refused", "connect failure", "communication connection failure",
                                   "slurm backup controller in standby", "zero bytes were transmitted",
                                   "unable to process configuration file", "timed out"))
