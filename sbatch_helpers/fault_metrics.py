"""What the guard sees of a fault's end for the jobs on the node: hot-spare swaps by result, and
fault -> job running again (issue 26), for its textfile (``guard_metrics``).

Why the guard: the runner, which makes the swaps, runs as the job's user and can write no metrics file
of root's (nor read a site secret, docs/security.md); its records reach the journal only when the job's
run ends (the epilog), hours late. The guard runs next to slurmctld, sees every job each pass, and Slurm
holds both ends of the measurement:

* the fault: autoheal's drain of the node, stamped by slurmctld (``Reason_Time``, whole seconds; only
  root or SlurmUser can drain). The hooks drain within ``fault_to_drain_seconds`` of their detection
  (xid-watch's histogram, sub-second on the lab), so this is the detection time the hooks journal up to
  that and the stamp's rounding down. A pre-emptive swap's drain is a warning sign, not a fault: not timed.
* running again: a requeued job seen RUNNING again with the same restart count (to the guard's interval),
  or a hot-spare job's comment saying the runner made its swap (it restarts the step at once).

The runner's comment (``spares=``, ``swaps=``, ``nodes=``) is the job's user's to write: a user can make
their own job's swap count go up, under a closed label set, never another job's or a node's, and no
action depends on it. Label sets are bounded: a result (four values), a path (two), never a job or node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from autoheal.reasons import Reason, is_ours, is_preswap
from autoheal.sbatch_helpers.comment import CommentState, is_runner_comment, split_nodes
from autoheal.sbatch_helpers.hotspare import NONE as NO_SPARE_LEFT  # the comment's ``spares=`` once all are used
from autoheal.strenum import StrEnum

#: Buckets (seconds) of fault -> running again: grace, requeue, EligibleTime, scheduling, or a swap.
FAULT_TO_RUNNING_BUCKETS = (5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


class SwapResult(StrEnum):
    """How a hot-spare job (``autoheal sbatch --spare-nodes``) came through the loss of a node."""

    SWAPPED = "swapped"  # a spare took the lost node's place inside the allocation
    SHRUNK = "shrunk"  # an elastic job (--min-nodes) goes on with fewer nodes, no spare left
    SPARE_DROPPED = "spare-dropped"  # an idle spare went bad and left the allocation; the step went on
    REQUEUED = "requeued"  # no swap was possible: the job was requeued, as without spares


class FaultPath(StrEnum):
    """How a job got running again after a fault on one of its nodes."""

    REQUEUE = "requeue"
    HOT_SPARE = "hot-spare"


@dataclass
class Histogram:
    """A cumulative Prometheus histogram kept in memory (one label value set)."""

    bounds: Tuple[float, ...] = FAULT_TO_RUNNING_BUCKETS
    buckets: List[int] = field(default_factory=list)
    count: int = 0
    total: float = 0.0

    def observe(self, value: float) -> None:
        if not self.buckets:
            self.buckets = [0] * len(self.bounds)
        for i, le in enumerate(self.bounds):
            if value <= le:
                self.buckets[i] += 1
        self.count += 1
        self.total += value

    def lines(self, name: str, labels: str = "") -> List[str]:
        sep = "," if labels else ""
        counts = self.buckets or [0] * len(self.bounds)
        out = [f'{name}_bucket{{{labels}{sep}le="{le:g}"}} {n}' for le, n in zip(self.bounds, counts)]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        tail = f"{{{labels}}}" if labels else ""
        return out + [f"{name}_sum{tail} {self.total:.3f}", f"{name}_count{tail} {self.count}"]


def _fault_drain_time(node) -> Optional[float]:
    """slurmctld's stamp of autoheal's fault drain of ``node`` (None: not drained by us for a fault)."""
    reason = getattr(node, "reason", "") or ""
    stamp = getattr(node, "reason_time", None)
    if not (getattr(node, "drain", False) or getattr(node, "down", False)) or stamp is None:
        return None
    if not is_ours(reason) or is_preswap(reason):
        return None
    return float(stamp)


def fault_nodes(comment: str) -> List[str]:
    """The nodes whose fault moved a job, as its comment names them: the runner's cause (``last=kind@node``)
    and autoheal's exclusions, or the node of xid-watch's ``autoheal: requeued after <fault>``."""
    if is_runner_comment(comment):
        st = CommentState.parse(comment)
        names = [st.last.rpartition("@")[2]] if "@" in st.last else []
        return names + [n for n in split_nodes(st.excl) if n not in names]
    reason = Reason.parse(comment)
    fault = reason.requeued_fault() if reason is not None else None
    return [fault.node] if fault is not None and fault.node else []


def fault_time(names: Iterable[str], nodes: Mapping[str, object]) -> Optional[float]:
    """The earliest autoheal fault drain among ``names`` that Slurm still shows (None: none does)."""
    stamps = [t for t in (_fault_drain_time(nodes[n]) for n in names if n in nodes) if t is not None]
    return min(stamps) if stamps else None


@dataclass(frozen=True)
class HotSpareView:
    """A hot-spare job in one pass: Slurm's restart count, and its runner's comment (active nodes, idle
    spares, swaps this run)."""

    restarts: int
    active: Tuple[str, ...]
    spares: Tuple[str, ...]
    swaps: int

    @classmethod
    def of(cls, job) -> Optional[HotSpareView]:
        if not is_runner_comment(job.comment):
            return None
        st = CommentState.parse(job.comment)
        if not st.spares:
            return None  # not a hot-spare job (the key marks one, ``none`` once all are in use)
        digits = st.swaps.split(">", 1)[0]
        spares = () if st.spares == NO_SPARE_LEFT else tuple(split_nodes(st.spares))
        return cls(int(job.restart_count or 0), tuple(split_nodes(st.nodes)), spares,
                   int(digits) if digits.isdigit() else 0)


@dataclass(frozen=True)
class SwapSeen:
    """One outcome seen between two passes, and the nodes the job lost in it."""

    result: SwapResult
    lost: Tuple[str, ...] = ()


def judge_change(before: HotSpareView, after: HotSpareView, requeued: bool, faulty: Set[str]) -> List[SwapSeen]:
    """Pure: what happened to a hot-spare job between two looks. ``requeued``: Slurm requeued it since
    (pending again, or a higher restart count); ``faulty``: the nodes autoheal has drained for a fault.
    A requeue counts only while one of the job's nodes is such a node (a user's own requeue is not a
    fallback of the swap)."""
    if requeued:
        lost = tuple(n for n in before.active + before.spares if n in faulty)
        return [SwapSeen(SwapResult.REQUEUED, lost)] if lost else []
    lost = tuple(n for n in before.active if n not in after.active)
    if after.swaps > before.swaps:
        took_spare = any(n in after.active for n in before.spares)
        result = SwapResult.SWAPPED if took_spare else SwapResult.SHRUNK
        return [SwapSeen(result, lost)] * (after.swaps - before.swaps)
    dropped = tuple(n for n in before.spares if n not in after.spares and n not in after.active)
    return [SwapSeen(SwapResult.SPARE_DROPPED, dropped)] if dropped else []


@dataclass
class HotSpareWatch:
    """The running hot-spare jobs seen last pass (by job id), so the next pass can tell what changed.
    Memory is bounded by the hot-spare jobs running at once (one not seen running again is forgotten)."""

    seen: Dict[str, HotSpareView] = field(default_factory=dict)

    def update(self, running: Sequence, pending: Sequence, faulty: Callable[[], Set[str]]) -> List[SwapSeen]:
        """``faulty()`` is asked only when a job was requeued (it reads Slurm's nodes)."""
        out: List[SwapSeen] = []
        now: Dict[str, HotSpareView] = {}
        for j in list(running) + list(pending):
            view = HotSpareView.of(j)
            if view is None:
                continue
            is_pending = j.state == "PENDING"
            before = self.seen.get(j.job_id)
            if before is not None:
                requeued = is_pending or view.restarts > before.restarts
                out += judge_change(before, view, requeued, faulty() if requeued else set())
            if not is_pending:
                now[j.job_id] = view
        self.seen = now
        return out


def faulty_nodes(nodes: Mapping[str, object]) -> Set[str]:
    """The nodes autoheal has drained for a fault (a pre-emptive swap's drain is not one)."""
    return {name for name, n in nodes.items() if _fault_drain_time(n) is not None}
