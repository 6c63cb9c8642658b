"""Why a run of a job ended, from Slurm's own data (pure functions).

Evidence, strongest first:

1. ``sacct -D`` states of the job's earlier runs (NODE_FAIL, PREEMPTED, TIMEOUT, REQUEUED), when
   accounting exists. The lab has no slurmdbd, and many small clusters don't either: then this is None
   and we fall back to the rest.
2. The reasons of the nodes the run used: a node that is drained/down with an ``autoheal:`` reason means
   autoheal's own drain; drained/down with any other reason means a node failure (admin or other
   health checker); Slurm's ``Not responding``/``Kill task failed`` are node failures too.
3. The job's end time (``squeue %e``): a grace signal inside the last ``grace + 60`` seconds (Slurm may
   send it up to 60 s early) is the time limit. We never guess from elapsed time.
4. The job's state when we look: CANCELLED (the user cancelled: never requeue), PENDING/REQUEUED (someone
   requeued it from outside), PREEMPTED.

Cause names (also exported as ``AUTOHEAL_REQUEUE_REASON``): ``time-limit``, ``preemption``,
``node-failure``, ``autoheal-drain``, ``external-requeue``, ``cancelled``, ``signal``, ``hang`` (the
runner's watchdog ended a step whose ranks stopped making progress with no fault signal; ``hang@node``
when one of the job's nodes was found not responding or down: it is excluded like a failed node).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence

from autoheal.reasons import is_ours, strip_reason_suffix
from autoheal.slurm.model import Node
from autoheal.strenum import StrEnum


class CauseKind(StrEnum):
    """Why a run ended (``AUTOHEAL_REQUEUE_REASON``, ``last=`` in the job comment)."""

    TIME_LIMIT = "time-limit"
    PREEMPTION = "preemption"
    NODE_FAILURE = "node-failure"
    AUTOHEAL_DRAIN = "autoheal-drain"
    EXTERNAL_REQUEUE = "external-requeue"
    CANCELLED = "cancelled"
    SIGNAL = "signal"  # a grace signal with no other evidence (e.g. scancel --signal by hand)
    HANG = "hang"  # the runner's watchdog: no rank progress and no fault signal (hang.py)


TIME_LIMIT, PREEMPTION, NODE_FAILURE = CauseKind.TIME_LIMIT, CauseKind.PREEMPTION, CauseKind.NODE_FAILURE
AUTOHEAL_DRAIN, EXTERNAL_REQUEUE = CauseKind.AUTOHEAL_DRAIN, CauseKind.EXTERNAL_REQUEUE
CANCELLED, SIGNAL, HANG = CauseKind.CANCELLED, CauseKind.SIGNAL, CauseKind.HANG
_KINDS = frozenset(k.value for k in CauseKind)
NODE_CAUSES = (NODE_FAILURE, AUTOHEAL_DRAIN)
#: Slurm may deliver ``--signal`` up to this many seconds before the requested time.
SIGNAL_EARLY_SLACK = 60

_SACCT_CAUSES = {"NODE_FAIL": NODE_FAILURE, "PREEMPTED": PREEMPTION, "TIMEOUT": TIME_LIMIT,
                 "REQUEUED": EXTERNAL_REQUEUE, "CANCELLED": CANCELLED, "DEADLINE": TIME_LIMIT}


@dataclass(frozen=True)
class Cause:
    """Why a run ended: one of the names above, the node concerned (if any) and the evidence used."""

    kind: CauseKind
    node: str = ""
    evidence: str = ""

    @property
    def node_problem(self) -> bool:
        """A node is to blame (and is kept off the next run): a hang counts once a node was found bad."""
        return self.kind in NODE_CAUSES or (self.kind == HANG and bool(self.node))

    def label(self) -> str:
        """``node-failure@gpu2`` or ``time-limit``: the short form kept in the job comment."""
        return f"{self.kind}@{self.node}" if self.node else self.kind


def node_problem(nodes: Iterable[Node]) -> Optional[Cause]:
    """The first unhealthy node among those the run used: autoheal drains first, then other failures."""
    others = []
    for node in nodes:
        reason = strip_reason_suffix(node.reason)
        bad = node.drain or node.down or not node.responding
        if bad and is_ours(reason):
            return Cause(AUTOHEAL_DRAIN, node.name, f"node {node.name} {node.state_text}: {reason}")
        if bad:
            others.append(Cause(NODE_FAILURE, node.name,
                                f"node {node.name} {node.state_text}: {reason or 'no reason given'}"))
    return others[0] if others else None


def near_time_limit(now: float, end_time: Optional[int], grace: float) -> bool:
    """True when ``now`` falls inside the window in which Slurm sends the time-limit grace signal."""
    if not end_time or end_time <= 0:
        return False
    return now >= end_time - grace - SIGNAL_EARLY_SLACK


def from_sacct(states: Optional[Sequence[str]]) -> Optional[Cause]:
    """The cause from the ``sacct -D`` state of the previous run (second newest line), if telling."""
    if not states:
        return None
    # sacct -D lists every run, oldest first; the last one is the run going on now.
    previous = [s.split()[0].upper() for s in states if s.strip()][:-1]
    if not previous:
        return None
    kind = _SACCT_CAUSES.get(previous[-1])
    return Cause(kind, evidence=f"sacct state {previous[-1]}") if kind else None


RUNNING_STATES = ("RUNNING", "SUSPENDED", "CONFIGURING", "")
PENDING_STATES = ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD")


def interrupt_action(job_state: str, job_restart_count: Optional[int], own_restart_count: int) -> str:
    """What the runner must do after an interruption: ``requeue`` (itself), ``none-requeued`` (Slurm or
    someone already requeued the job: its restart count went up or it is pending) or ``none-ending``
    (the job is being cancelled or stopped: never requeue a job the user cancelled).

    Observed on 22.05: right after ``scancel`` squeue says COMPLETING then CANCELLED (restart count
    unchanged); right after ``scontrol requeue`` COMPLETING then PENDING, with the restart count already
    incremented. Observed on 24.11.5 (``job_state`` lists, base state first): ``scancel`` gives
    ["CANCELLED", "COMPLETING"] then ["CANCELLED"]; ``scontrol requeue`` ["PENDING", "COMPLETING"] then
    ["PENDING"], the restart count incremented at once.
    """
    state = (job_state or "").upper()
    if (job_restart_count is not None and job_restart_count > own_restart_count) or state in PENDING_STATES:
        return "none-requeued"
    if state not in RUNNING_STATES:
        return "none-ending"
    return "requeue"


def classify_interrupt(*, signal_name: str, grace_signal: str, now: float, end_time: Optional[int],
                       grace: float, nodes: Sequence[Node], job_state: str = "RUNNING",
                       deadline_hit: bool = False, requeued_elsewhere: bool = False) -> Cause:
    """Why the runner was interrupted (it got a signal, or its own time-limit deadline fired)."""
    state = (job_state or "").upper()
    if deadline_hit:
        return Cause(TIME_LIMIT, evidence=f"end time {end_time}: the runner's own deadline")
    problem = node_problem(nodes)
    if problem:
        return problem
    if near_time_limit(now, end_time, grace):
        return Cause(TIME_LIMIT, evidence=f"signal at {int(now)}, end time {end_time}")
    if requeued_elsewhere or state in PENDING_STATES:
        return Cause(EXTERNAL_REQUEUE, evidence=f"job state {state or '?'}, requeued without the runner")
    if state == "PREEMPTED":
        return Cause(PREEMPTION, evidence=f"job state {state}")
    if state not in RUNNING_STATES:
        return Cause(CANCELLED, evidence=f"job state {state}: the job is ending (cancelled or stopped)")
    if signal_name.upper().replace("SIG", "") == "TERM":
        # SIGTERM alone, job still running, no node problem, not the time limit: preemption without
        # send_user_signal (GraceTime sends SIGTERM first).
        return Cause(PREEMPTION, evidence="SIGTERM while the job is still running")
    return Cause(SIGNAL, evidence=f"{grace_signal} with no node problem and far from the time limit "
                 f"(preemption with send_user_signal, or sent by hand)")


def classify_hang(nodes: Sequence[Node], why: str) -> Cause:
    """Why the watchdog ended a step: ``hang``, naming the first unhealthy node of the run if any (a node
    whose slurmd died stops its ranks with no fault signal: found NOT_RESPONDING or DOWN)."""
    problem = node_problem(nodes)
    if problem:
        return Cause(HANG, problem.node, f"{why}; {problem.evidence}")
    return Cause(HANG, evidence=why)


def unsettled(nodes: Iterable[Node]) -> List[str]:
    """Nodes not responding that Slurm has not yet marked DOWN: requeueing now would let slurmctld
    restart the job with a broken GRES allocation on them (seen in the lab: every srun failed), so the
    runner waits for each to be DOWN or to answer again."""
    return [n.name for n in nodes if not n.responding and not n.down]


def classify_start(*, restart_count: int, recorded: Optional[str], recorded_restarts: int,
                   sacct_states: Optional[Sequence[str]], previous_nodes: Sequence[Node]) -> Optional[Cause]:
    """Why this run is a restart (None on the first run).

    ``recorded`` is the cause the previous run wrote into the comment when it requeued itself
    (``recorded_restarts`` = the restart number it wrote for). Otherwise Slurm or someone else requeued
    the job: sacct if it exists, else the previous run's node reasons, else "external-requeue".
    """
    if restart_count <= 0:
        return None
    if recorded and recorded_restarts == restart_count:
        word, _, node = recorded.partition("@")
        if word in _KINDS:  # a word this release writes; anything else (a hand-edited comment): not recorded
            return Cause(CauseKind(word), node, "recorded by the previous run")
    cause = from_sacct(sacct_states)
    if cause and cause.kind == NODE_FAILURE:
        problem = node_problem(previous_nodes)
        return Cause(NODE_FAILURE, problem.node if problem else "", cause.evidence)
    if cause:
        return cause
    problem = node_problem(previous_nodes)
    if problem:
        return problem
    return Cause(EXTERNAL_REQUEUE, evidence="requeued without the runner; no accounting and no node problem")
