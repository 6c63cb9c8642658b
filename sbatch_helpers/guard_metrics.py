"""The guard's textfile for node-exporter (``autoheal guard --textfile-dir DIR``): its heartbeat and what it
sees of the jobs autoheal requeued, for the guard-down and requeued-job-not-running alerts.

Label sets are bounded: an action kind (three values), never a job id or node name. Written atomically
(temp file in the same folder, then rename) once per pass, so node-exporter never reads half a file."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from autoheal.reasons import is_ours
from autoheal.sbatch_helpers.comment import is_runner_comment

METRICS_FILE = "autoheal_guard.prom"


@dataclass
class RequeuedWait:
    """The jobs autoheal requeued that are pending, not held, past their EligibleTime (so nothing but a
    free node keeps them from running again), and how long the longest of them has been eligible."""

    jobs: int = 0
    oldest_seconds: float = 0.0


def requeued_waiting(jobs: Sequence, now: float) -> RequeuedWait:
    """Pure: ``jobs`` as ``SlurmAdapter.list_jobs`` returns them (pending ones are enough)."""
    out = RequeuedWait()
    for j in jobs:
        if j.state != "PENDING" or j.restart_count < 1 or j.eligible_time is None:
            continue
        if not (is_runner_comment(j.comment) or is_ours(j.comment)):
            continue
        if j.held and not j.requeue_held:  # a user's or an admin's hold: theirs to lift, not a stuck requeue
            continue
        out.jobs += 1
        out.oldest_seconds = max(out.oldest_seconds, now - float(j.eligible_time))
    return out


@dataclass
class GuardMetrics:
    directory: str
    passes: Dict[str, int] = field(default_factory=lambda: {"ok": 0, "slurm-unavailable": 0, "error": 0})
    actions: Dict[str, int] = field(default_factory=lambda: {"release": 0, "prune": 0, "schedule": 0})
    wait: RequeuedWait = field(default_factory=RequeuedWait)
    last_ok: float = 0.0
    error: str = ""

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
