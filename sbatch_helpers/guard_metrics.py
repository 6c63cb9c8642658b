"""The guard's textfile for node-exporter (``autoheal guard --textfile-dir DIR``): its heartbeat and what it
sees of the jobs autoheal requeued, for the guard-down and requeued-job-not-running alerts.

Label sets are bounded: an action kind (three values), never a job id or node name. Written atomically
(temp file in the same folder, then rename) once per pass, so node-exporter never reads half a file."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from autoheal.reasons import is_ours
from autoheal.sbatch_helpers import fault_metrics as FM
from autoheal.sbatch_helpers.comment import is_runner_comment

METRICS_FILE = "autoheal_guard.prom"
FAULT_TO_RUNNING = "autoheal_guard_fault_to_running_seconds"
#: Buckets (seconds) of eligible -> running of the jobs autoheal requeued.
RUN_AGAIN_BUCKETS = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


@dataclass
class RequeuedWait:
    """The jobs autoheal requeued that are pending, not held, past their EligibleTime (so nothing but a
    free node keeps them from running again), and how long the longest of them has been eligible."""

    jobs: int = 0
    oldest_seconds: float = 0.0


def _requeued_by_us(j) -> bool:
    """Pending after a requeue, with autoheal's mark, not held by a user or an admin (theirs to lift)."""
    return (j.state == "PENDING" and j.restart_count >= 1 and j.eligible_time is not None
            and (is_runner_comment(j.comment) or is_ours(j.comment)) and not (j.held and not j.requeue_held))


def requeued_waiting(jobs: Sequence, now: float) -> RequeuedWait:
    """Pure: ``jobs`` as ``SlurmAdapter.list_jobs`` returns them (pending ones are enough)."""
    out = RequeuedWait()
    for j in jobs:
        if not _requeued_by_us(j):
            continue
        out.jobs += 1
        out.oldest_seconds = max(out.oldest_seconds, now - float(j.eligible_time))
    return out


@dataclass
class RunAgain:
    """Eligible -> running of the jobs autoheal requeued: each such job seen pending is remembered by
    (job, restart count) with its EligibleTime; when it is no longer pending, one look at it tells whether
    it runs again (observed, to the guard's interval) or ended otherwise (forgotten). Memory is bounded by
    the jobs pending at once."""

    tracked: Dict[Tuple[str, int], float] = field(default_factory=dict)
    buckets: Dict[float, int] = field(default_factory=lambda: dict.fromkeys(RUN_AGAIN_BUCKETS, 0))
    count: int = 0
    total: float = 0.0
    fault_at: Dict[Tuple[str, int], float] = field(default_factory=dict)
    #: fault (autoheal's drain of the job's node, slurmctld's stamp) -> running again, the requeue path
    fault_to_running: FM.Histogram = field(default_factory=FM.Histogram)

    def update(self, pending: Sequence, now: float, lookup: Callable[[str], object],
               nodes: Optional[Callable[[], Mapping[str, object]]] = None) -> None:
        """``nodes()`` (Slurm's nodes by name, read at most once here) gives the fault time of a job seen
        requeued for the first time: then fault -> running again is observed too (``fault_metrics``)."""
        seen = set()
        for j in pending:
            if _requeued_by_us(j):
                key = (j.job_id, j.restart_count)
                seen.add(key)
                if key not in self.tracked:
                    self.tracked[key] = float(j.eligible_time)
                    fault = FM.fault_time(FM.fault_nodes(j.comment), nodes()) if nodes is not None else None
                    if fault is not None:
                        self.fault_at[key] = fault
        for key in [k for k in self.tracked if k not in seen]:
            eligible = self.tracked.pop(key)
            fault = self.fault_at.pop(key, None)
            try:
                job = lookup(key[0])
            except Exception:  # gone from Slurm, or slurmctld away: not a run we can time
                continue
            if getattr(job, "state", "") in ("RUNNING", "COMPLETING") and getattr(job, "restart_count", -1) == key[1]:
                self.observe(max(0.0, now - eligible))
                if fault is not None:
                    self.fault_to_running.observe(max(0.0, now - fault))

    def observe(self, value: float) -> None:
        for le in self.buckets:
            if value <= le:
                self.buckets[le] += 1
        self.count += 1
        self.total += value

    def lines(self, name: str) -> List[str]:
        out = [f"# HELP {name} Seconds from EligibleTime to running again, jobs autoheal requeued",
               f"# TYPE {name} histogram"]
        out += [f'{name}_bucket{{le="{le:g}"}} {n}' for le, n in self.buckets.items()]
        out += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.total:.3f}",
                f"{name}_count {self.count}"]
        return out


@dataclass
class GuardMetrics:
    directory: str
    passes: Dict[str, int] = field(default_factory=lambda: {"ok": 0, "slurm-unavailable": 0, "error": 0})
    actions: Dict[str, int] = field(default_factory=lambda: {"release": 0, "prune": 0, "schedule": 0})
    wait: RequeuedWait = field(default_factory=RequeuedWait)
    run_again: RunAgain = field(default_factory=RunAgain)
    hot: FM.HotSpareWatch = field(default_factory=FM.HotSpareWatch)
    swaps: Dict[FM.SwapResult, int] = field(default_factory=lambda: dict.fromkeys(FM.SwapResult, 0))
    #: fault -> running again of hot-spare jobs (the swap restarts the step; the requeue path is run_again's)
    hot_fault_to_running: FM.Histogram = field(default_factory=FM.Histogram)
    last_ok: float = 0.0
    error: str = ""

    def observe_jobs(self, pending: Sequence, running: Sequence, now: float, lookup: Callable[[str], object],
                     list_nodes: Callable[[], Sequence]) -> None:
        """After a pass that read Slurm: requeued jobs running again (``run_again``) and hot-spare jobs'
        swaps. Slurm's nodes are read only when a job needs them (one ``list_nodes`` at most)."""
        cache: Dict[str, Mapping[str, object]] = {}

        def nodes() -> Mapping[str, object]:
            if "nodes" not in cache:
                cache["nodes"] = {n.name: n for n in list_nodes()}
            return cache["nodes"]

        self.run_again.update(pending, now, lookup, nodes)
        hot_jobs = [j for j in list(running) + list(pending) if FM.HotSpareView.of(j) is not None]
        if not hot_jobs and not self.hot.seen:
            return
        for seen in self.hot.update([j for j in hot_jobs if j.state != "PENDING"],
                                    [j for j in hot_jobs if j.state == "PENDING"],
                                    lambda: FM.faulty_nodes(nodes())):
            self.swaps[seen.result] += 1
            fault = FM.fault_time(seen.lost, nodes())
            if fault is not None and seen.result in (FM.SwapResult.SWAPPED, FM.SwapResult.SHRUNK):
                self.hot_fault_to_running.observe(max(0.0, now - fault))

    def observe(self, result: str, done_kinds: Sequence[str] = (), wait: Optional[RequeuedWait] = None) -> None:
        self.passes[result] = self.passes.get(result, 0) + 1
        for kind in done_kinds:
            if kind in self.actions:
                self.actions[kind] += 1
        if result == "ok":
            self.last_ok = time.time()
            if wait is not None:
                self.wait = wait

    def render(self, up: bool = True) -> str:
        lines: List[str] = [
            "# HELP autoheal_guard_up 1 while autoheal guard runs (0: stopped cleanly)",
            "# TYPE autoheal_guard_up gauge", f"autoheal_guard_up {1 if up else 0}",
            "# HELP autoheal_guard_heartbeat_timestamp_seconds When the guard last wrote this file",
            "# TYPE autoheal_guard_heartbeat_timestamp_seconds gauge",
            f"autoheal_guard_heartbeat_timestamp_seconds {time.time():.3f}",
            "# HELP autoheal_guard_last_success_timestamp_seconds End of the last pass that read Slurm",
            "# TYPE autoheal_guard_last_success_timestamp_seconds gauge",
            f"autoheal_guard_last_success_timestamp_seconds {self.last_ok:.3f}",
            "# HELP autoheal_guard_passes_total Guard passes by result",
            "# TYPE autoheal_guard_passes_total counter",
            *[f'autoheal_guard_passes_total{{result="{k}"}} {v}' for k, v in sorted(self.passes.items())],
            "# HELP autoheal_guard_actions_total Actions the guard completed, by kind",
            "# TYPE autoheal_guard_actions_total counter",
            *[f'autoheal_guard_actions_total{{kind="{k}"}} {v}' for k, v in sorted(self.actions.items())],
            "# HELP autoheal_guard_requeued_jobs_waiting Jobs autoheal requeued, eligible again, not yet running",
            "# TYPE autoheal_guard_requeued_jobs_waiting gauge",
            f"autoheal_guard_requeued_jobs_waiting {self.wait.jobs}",
            "# HELP autoheal_guard_requeued_oldest_wait_seconds Seconds the longest of them has been eligible",
            "# TYPE autoheal_guard_requeued_oldest_wait_seconds gauge",
            f"autoheal_guard_requeued_oldest_wait_seconds {self.wait.oldest_seconds:.1f}",
            *self.run_again.lines("autoheal_guard_requeued_eligible_to_running_seconds"),
            "# HELP autoheal_guard_hot_spare_swaps_total Hot-spare jobs through the loss of a node, by result",
            "# TYPE autoheal_guard_hot_spare_swaps_total counter",
            *[f'autoheal_guard_hot_spare_swaps_total{{result="{k.value}"}} {v}' for k, v in self.swaps.items()],
            f"# HELP {FAULT_TO_RUNNING} Seconds from autoheal's fault drain of a job's node to the job running "
            "again, by path",
            f"# TYPE {FAULT_TO_RUNNING} histogram",
            *self.run_again.fault_to_running.lines(FAULT_TO_RUNNING, f'path="{FM.FaultPath.REQUEUE.value}"'),
            *self.hot_fault_to_running.lines(FAULT_TO_RUNNING, f'path="{FM.FaultPath.HOT_SPARE.value}"'),
        ]
        return "\n".join(lines) + "\n"

    def write(self, up: bool = True) -> Optional[str]:
        """Write the file; returns an error text (once per distinct error) or None."""
        tmp = ""
        try:
            os.makedirs(self.directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{METRICS_FILE}.", dir=self.directory)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(self.render(up))
            os.chmod(tmp, 0o644)
            os.replace(tmp, os.path.join(self.directory, METRICS_FILE))
        except OSError as exc:
            if tmp:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            msg = f"metrics {self.directory}: {exc}"
            if msg != self.error:
                self.error = msg
                return msg
            return None
        self.error = ""
        return None
