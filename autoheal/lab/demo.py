"""``autoheal lab demo``: break a GPU under a running job and watch autoheal drain the node.

Every timestamp comes from what Slurm and the journal report, not from what the demo expects.
Without a node-side detector installed, the demo says so and drains through the same ownership-aware
code path the hooks use, so the Slurm side of the loop is still shown for real.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from typing import List, Optional

from autoheal import nodeops
from autoheal.journal import Journal
from autoheal.lab.cluster import Lab, LabError
from autoheal.lab.gpus import inject
from autoheal.reasons import is_ours


@dataclass
class Phase:
    name: str
    at: Optional[float]
    source: str
    detail: str = ""


@dataclass
class DemoReport:
    phases: List[Phase] = field(default_factory=list)
    fault_time: float = 0.0

    def add(self, name: str, at: Optional[float], source: str, detail: str = "") -> None:
        self.phases.append(Phase(name, at, source, detail))

    @property
    def ok(self) -> bool:
        return all(p.at is not None for p in self.phases)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "phases": [{"phase": p.name, "seconds_after_fault":
                                           None if p.at is None else round(p.at - self.fault_time, 3),
                                           "source": p.source, "detail": p.detail} for p in self.phases]}


def _poll(pred, timeout: float, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(step)
    return None


def run_demo(lab: Lab, detect_timeout: float = 30.0) -> DemoReport:
    """Submit a 2-node job, inject XID 79 on one of its nodes, observe drain and resume."""
    from autoheal.slurm.cli_backend import CliSlurm

    env = lab.slurm_env()
    slurm = CliSlurm(env=env)
    journal = Journal(lab.layout().path("journal", "journal.jsonl"))
    sub = subprocess.run(["sbatch", "--parsable", "-N", "2", "--requeue", "-o", "/dev/null", "--wrap", "sleep 600"],
                         env=env, capture_output=True, text=True, timeout=30, cwd="/tmp")
    if sub.returncode != 0:
        raise LabError(f"sbatch failed: {sub.stderr.strip()}")
    job_id = sub.stdout.strip().split(";")[0]
    report = DemoReport()
    try:
        job = _poll(lambda: (lambda j: j if j.running else None)(slurm.get_job(job_id)), 60)
        if job is None:
            raise LabError(f"job {job_id} did not start within 60 s")
        node = job.nodes[0]
        fault = inject(lab, node, 3, "xid", xid=79)
        report.fault_time = fault["time"]
        report.add(f"XID 79 injected on {node} gpu 3 (job {job_id} running on {','.join(job.nodes)})",
                   fault["time"], "lab inject", fault["kernel_log"] or "")
        detected = _poll(lambda: next((r for r in journal.read(node=node, since=fault["time"] - 1)
                                       if r.event in ("detection", "drain")), None), detect_timeout)
        report.add("detection recorded in the journal", detected.time if detected else None, "journal",
                   detected.message if detected else "no node-side detector recorded anything")
        drained = _poll(lambda: (lambda n: n if n.drain and is_ours(n.reason) else None)(slurm.get_node(node)),
                        2.0 if detected is None else detect_timeout)
        source = "slurm (drained by autoheal hooks)"
        if drained is None and detected is None:
            outcome = nodeops.drain(slurm, node, "xid 79 gpu 3: fallen off the bus (demo: no detector installed)")
            source = f"slurm (drained by the demo itself: {outcome.action})"
            drained = slurm.get_node(node)
        report.add("node drained in Slurm with an autoheal reason", time.time() if drained else None, source,
                   drained.reason if drained else "")
        inject(lab, node, 3, "clear")
        resumed = nodeops.resume(slurm, node)
        report.add("GPU reset (cleared) and our drain resumed", time.time() if resumed.changed else None,
                   "slurm", resumed.action)
    finally:
        subprocess.run(["scancel", job_id], env=env, capture_output=True, timeout=30)
    return report
