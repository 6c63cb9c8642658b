"""``autoheal lab drill --submitit``: the XID 79 drill for a real submitit ``Checkpointable`` job.

The job is the recipe in ``sbatch_helpers/examples/submitit_job.py``, submitted by its own client (the
real submitit from PyPI): through ``autoheal sbatch`` (the recipe's ``via_autoheal_sbatch``), or with
``--plain`` as plain submitit, which asks Slurm for ``--signal=USR2@<grace>`` and requeues itself.
The timeline is the drill's, read from the same evidence: Slurm, the journal, Kubernetes and the job's
own output (submitit's log and the trainer's lines). submitit saves no checkpoint before the fault:
it pickles the trainer when the signal comes, so the resumed step must be the one it saved then.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from autoheal_lab.cluster import Lab, LabError
from autoheal_lab.drill import POLL, Contradiction, Drill, OutputTail, Phase, Probe, Waiting
from autoheal_lab.stamping import Clock, Evidence

TRAINER = "submitit-trainer: "
#: The trainer runs far longer than any drill (a finished job would end the timeline early).
STEPS = 100000


def submitit_available() -> bool:
    try:
        import submitit  # noqa: F401
    except ImportError:
        return False
    return True


def start_client(env: dict, workdir: Path, folder: Path, steps: int, step_seconds: float, grace: int,
                 extra: List[str], out: Path, timeout: float = 60.0) -> tuple:
    """Start the submitit example's client (sbatch_helpers/examples/submitit_job.py, the real submitit)
    and wait until it has submitted its job. Returns (the client process, the job id). Raises LabError
    when it does not submit within ``timeout`` (its output's tail says why)."""
    import autoheal.sbatch_helpers as helpers

    example = Path(helpers.__file__).parent / "examples" / "submitit_job.py"
    argv = [sys.executable, str(example), "--folder", str(folder), "--steps", str(steps),
            "--step-seconds", str(step_seconds), "--grace", str(grace), "--wait", "3600", *extra]
    env = dict(env, PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
    with open(out, "w") as fh:
        client = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=str(workdir),
                                  stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"(?m)^submitted (\S+)$", out.read_text(errors="replace"))
        if m:
            return client, m.group(1)
        if client.poll() is not None:
            break
        time.sleep(POLL)
    raise LabError(f"the submitit client did not submit within {timeout:.0f} s: "
                   f"{out.read_text(errors='replace')[-800:]}")


#: submitit's own log line time: ``submitit INFO (2026-12-03 06:22:33,123) - ...`` (local time, ms)
_LOGGED_RX = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\)")


def logged_evidence(detail: str, line: str) -> Evidence:
    """A submitit log line as evidence, timed by submitit's logger (the local clock, milliseconds) when
    the line carries its time; else by the poll that saw it."""
    from datetime import datetime

    m = _LOGGED_RX.search(line)
    if not m:
        return Evidence(detail)
    try:
        at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000
    except ValueError:
        return Evidence(detail)
    return Evidence(detail, at, Clock.TRAINER)


class SubmititDrill(Drill):
    """The drill with a submitit job (one node) instead of the 2-node example trainer."""

    PROGRESS_RX = re.compile(r"submitit-trainer: step=(\d+)")

    def __init__(self, lab: Lab, opt_in: bool = True, kube: bool = True, gpu: int = 3,
                 phase_timeout: float = 240.0, step_seconds: float = 0.1, kube_not_run: str = ""):
        super().__init__(lab, opt_in=opt_in, kube=kube, gpu=gpu, phase_timeout=phase_timeout,
                         step_seconds=step_seconds, kube_not_run=kube_not_run,
                         fault_reaches_job=False)  # submitit's trainer is a CPU process: the fault never reaches it
        self.client: Optional[subprocess.Popen] = None
        self.folder = self.workdir / "submitit"

    # ---- submission --------------------------------------------------------------------------------
    def submit(self) -> str:
        from autoheal.config import load_config

        if not submitit_available():
            raise LabError("--submitit needs submitit: pip install submitit (or pip install -e '.[test]')")
        self.workdir.mkdir(parents=True, exist_ok=True)
        grace = int(load_config(self.lay.autoheal_conf).hooks.grace_seconds)
        extra = ["--exclude", ",".join(self.lay.spares)] if self.lay.spares else []
        if self.opt_in:
            extra.append("--via-autoheal-sbatch")
        self.client, jid = start_client(self.env, self.workdir, self.folder, STEPS, self.step_seconds, grace, extra,
                                        self.workdir / "client.out")
        self.report.job_id = jid
        self.tail = OutputTail(self.folder / f"{jid}_0_log.out")
        return jid

    def wait_first_checkpoint(self, timeout: float = 90.0) -> str:
        """Until the trainer computes (step 5: submitit checkpoints only when signalled); its node."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.tail.poll()
            job = self.slurm.get_job(self.report.job_id)
            if job.running and job.nodes and self.tail.find(r"submitit-trainer: step=5\b"):
                self.baseline_restarts = job.restart_count
                return job.nodes[0]
            time.sleep(POLL)
        raise LabError(f"submitit job {self.report.job_id} did not start computing within {timeout:.0f}s; "
                       f"see {self.folder}")

    def run(self):
        try:
            return super().run()
        finally:
            if self.client is not None and self.client.poll() is None:
                self.client.terminate()
                try:
                    self.client.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.client.kill()
                    self.client.wait(timeout=10)

    # ---- probes ------------------------------------------------------------------------------------
    def _line_probe(self, pattern: str, check=None) -> Probe:
        def probe():
            hit = self.tail.find(pattern, after=self.report.fault_time)
            if not hit:
                return None
            _t, line, m = hit
            if check:
                check(m)
            return logged_evidence(line.split(TRAINER, 1)[-1].strip(), line)
        return probe

    def _checkpoint_probe(self) -> Probe:
        def check(m):
            self.saved_step = int(m.group(1))
        return self._line_probe(r"submitit-trainer: checkpoint step=(\d+)", check)

    def _restart_start_probe(self) -> Probe:
        def probe():
            start = 0
            while True:  # the first start after the fault away from the bad node: the requeued run
                hit = self.tail.find(r"submitit-trainer: start step=(\d+) node=(\S+)", after=self.report.fault_time,
                                     start=start)
                if hit is None:
                    return None
                t, line, m = hit
                idx = self.tail.index_of(t, line)
                if m.group(2) != self.report.node:
                    break
                start = idx + 1
            self.first_restart_line = idx
            self.resumed_step = int(m.group(1))
            if self.saved_step is None or self.resumed_step != self.saved_step:
                raise Contradiction(f"resumed from step {self.resumed_step}, but submitit's checkpoint after the "
                                    f"signal was step {self.saved_step}")
            return logged_evidence(f"resumed from step {self.resumed_step} on {m.group(2)} (submitit's pickled "
                                   f"trainer)", line)
        return probe

    def _record_probe(self) -> Probe:
        def probe():
            job = self.slurm.get_job(self.report.job_id)
            recs = [r for r in self.journal.read(job=self.report.job_id) if r.time >= self.report.fault_time - 0.5]
            signals = [r for r in recs if r.event == "signal"]
            if self.opt_in:
                m = re.search(r"\brestarts=(\d+)", job.comment)
                seen = bool(m) and int(m.group(1)) > self.baseline_restarts
                what = f"job comment: {job.comment!r}"
            else:
                seen = bool(signals)
                what = f"journal: {signals[0].message}" if signals else ""
            if seen and recs:
                return Evidence(f"{what}; {len(recs)} journal records for the job")
            return Waiting(f"job comment {job.comment!r}; {len(recs)} journal records for the job since the fault")
        return probe

    def phases_for(self, node: str) -> List[Phase]:
        """The drill's phases; the signal and the checkpoint are read from submitit's log and the trainer's
        lines (the restart and progress probes above replace the base drill's)."""
        signal = Phase("grace signal delivered to the job (submitit)", "submitit log",
                       self._line_probe(r"Caught signal (SIG\S+)"))
        swap = {
            "grace signal delivered to the trainer": signal,
            "checkpoint saved after the signal": Phase("submitit checkpoint after the signal", "trainer output",
                                                       self._checkpoint_probe(), after=signal),
        }
        return [swap.get(p.name, p) for p in super().phases_for(node)]

    def _collect_logs(self) -> None:
        super()._collect_logs()
        if all(p.ok for p in self.report.phases):
            return
        for name in (f"{self.report.job_id}_0_log.out", f"{self.report.job_id}_0_log.err"):
            path = self.folder / name
            if path.exists():
                self.report.logs[name] = path.read_text(errors="replace").splitlines()[-20:]
        client = self.workdir / "client.out"
        if client.exists():
            self.report.logs["client.out"] = client.read_text(errors="replace").splitlines()[-10:]
