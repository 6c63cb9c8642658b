"""``autoheal lab drill --submitit``: the XID 79 drill for a real submitit ``Checkpointable`` job.

The job is the recipe in ``sbatch_helpers/examples/submitit_job.py``, submitted by its own client (the
real submitit from PyPI): through ``autoheal sbatch`` (the recipe's ``via_autoheal_sbatch``), or with
``--plain`` as plain submitit, which asks Slurm for ``--signal=USR2@<grace>`` and requeues itself.
The timeline is the drill's, read from the same evidence: Slurm, the journal, Kubernetes and the job's
own output (submitit's log and the trainer's lines).

The fault reaches the job as on real hardware: the trainer runs on the fake GPU Slurm gave its step
(``--device lab --gpus-per-node 1``) and the XID goes to that GPU, so its next step fails and
submitit's on-signal ``checkpoint()`` cannot copy the state off it. The trainer keeps a durable
checkpoint every ``CHECKPOINT_EVERY`` steps; the resumed step must be the last one saved before the
fault, and the lost steps (the newest step done before the restart minus the step resumed from) are
read from the trainer's own lines.
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
from autoheal_lab.drill import (
    JOURNAL_WAIT,
    MID_INTERVAL,
    POLL,
    Contradiction,
    Drill,
    OutputTail,
    Phase,
    Probe,
    Waiting,
    _untimed,
    judge_requeued,
    trainer_evidence,
)
from autoheal_lab.stamping import Clock, Evidence

TRAINER = "submitit-trainer: "
#: The trainer runs far longer than any drill (a finished job would end the timeline early).
STEPS = 100000
#: The trainer's durable checkpoint interval (steps); the fault comes MID_INTERVAL steps after the first.
CHECKPOINT_EVERY = 10
NOT_SENT = "not sent: "


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


class SubmititDrill(Drill):
    """The drill with a submitit job (one node, one fake GPU) instead of the 2-node example trainer."""

    PROGRESS_RX = re.compile(r"submitit-trainer: step=(\d+)")

    def __init__(self, lab: Lab, opt_in: bool = True, kube: bool = True, gpu: int = 3,
                 phase_timeout: float = 240.0, step_seconds: float = 0.1, kube_not_run: str = ""):
        super().__init__(lab, opt_in=opt_in, kube=kube, gpu=gpu, phase_timeout=phase_timeout,
                         step_seconds=step_seconds, kube_not_run=kube_not_run)
        self.client: Optional[subprocess.Popen] = None
        self.folder = self.workdir / "submitit"
        self.signal_phase: Optional[Phase] = None

    # ---- submission --------------------------------------------------------------------------------
    def submit(self) -> str:
        from autoheal.config import load_config

        if not submitit_available():
            raise LabError("--submitit needs submitit: pip install submitit (or pip install -e '.[test]')")
        self.workdir.mkdir(parents=True, exist_ok=True)
        grace = int(load_config(self.lay.autoheal_conf).hooks.grace_seconds)
        # the step's GPU is the lab's fake one, every step logged (the lost steps are read from them)
        extra = ["--gpus-per-node", "1", "--device", "lab", "--checkpoint-every", str(CHECKPOINT_EVERY),
                 "--log-every", "1"]
        if self.lay.spares:
            extra += ["--exclude", ",".join(self.lay.spares)]
        if self.opt_in:
            extra.append("--via-autoheal-sbatch")
        self.client, jid = start_client(self.env, self.workdir, self.folder, STEPS, self.step_seconds, grace, extra,
                                        self.workdir / "client.out")
        self.report.job_id = jid
        self.tail = OutputTail(self.folder / f"{jid}_0_log.out")
        return jid

    def wait_first_checkpoint(self, timeout: float = 90.0) -> str:
        """Until the trainer has saved its first durable checkpoint and run half an interval past it (a
        fault right after a save would lose nothing); its node, and its GPU as the one to break."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.tail.poll()
            job = self.slurm.get_job(self.report.job_id)
            saved = self.tail.find(r"submitit-trainer: checkpoint saved step=(\d+)")
            dev = self.tail.find(r"submitit-trainer: device lab gpus=(\d+)")
            past = saved and self.tail.find(rf"submitit-trainer: step={int(saved[2].group(1)) + MID_INTERVAL}\b")
            if job.running and job.nodes and dev and past:
                self.baseline_restarts = job.restart_count
                self.gpu = int(dev[2].group(1))
                return job.nodes[0]
            time.sleep(POLL)
        raise LabError(f"submitit job {self.report.job_id} did not save a checkpoint within {timeout:.0f}s; "
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
        """A trainer line after the fault, timed by the trainer's own clock (``time=``) when it has one."""
        def probe():
            hit = self.tail.find(pattern, after=self.report.fault_time)
            if not hit:
                return None
            _t, line, m = hit
            if check:
                check(m)
            return trainer_evidence(_untimed(line.split(TRAINER, 1)[-1].strip()), line)
        return probe

    def _signal_checkpoint_probe(self) -> Probe:
        """submitit's ``checkpoint()`` on the signal: it cannot copy the state off the lost GPU, so it
        pickles the last durable one; a checkpoint that did copy it is the lab being kinder than the world."""
        def check(m):
            if m.group(1) is None:
                raise Contradiction(f"submitit checkpointed step {m.group(3)} off a GPU that fell off the bus")
        return self._line_probe(r"submitit-trainer: checkpoint (?:(failed) step=\d+ .*durable step=(\d+)|step=(\d+))",
                                check)

    def _signal_probe(self, record_wait: float = JOURNAL_WAIT) -> Probe:
        """The grace signal's journal record (xid-watch's for a plain job, the runner's under autoheal
        sbatch); none is sent when the job requeued itself first (its step's GPU call failed, the trainer
        handed over to submitit's handler): then the trainer's own line of that, once the job shows the
        requeue and no record came within ``record_wait``."""
        seen: List[float] = []

        def probe():
            rec = self._journal_record(("signal",), job=self.report.job_id)
            if rec is not None:
                return Evidence(f"{rec.event}: {rec.message or rec.outcome}", float(rec.time), Clock.JOURNAL)
            if not judge_requeued(self.slurm.get_job(self.report.job_id), self.baseline_restarts):
                return Waiting("no signal record for the job yet")
            hit = self.tail.find(r"submitit-trainer: device error step=(\d+)", after=self.report.fault_time)
            seen.append(time.monotonic())
            if hit is None or seen[-1] - seen[0] < record_wait:
                return Waiting("the job was requeued; waiting for the signal's journal record")
            return Evidence(f"{NOT_SENT}the job requeued itself first (submitit's handler, on the trainer's GPU "
                            f"error at step {hit[2].group(1)})")
        return probe

    def _watch(self, phases: List[Phase]) -> None:
        super()._watch(phases)
        p = self.signal_phase
        if p is not None and p.evidence is not None and p.detail.startswith(NOT_SENT):
            # not a signal: the phase did not apply to this run (no time of it in the totals)
            p.skipped, p.evidence, p.polled_at, p.at = p.detail, None, None, None

    def _job_side_phases(self, node: str, drained: Phase) -> List[Phase]:
        """The step's next GPU call fails; the signal (xid-watch's, or the runner's) comes; submitit's
        handler runs (on that signal or on the trainer's own after its GPU failed) and cannot save."""
        # the first GPU call after the fault fails: the next step's, or the copy in checkpoint() when the
        # signal came first
        failed = Phase("the broken rank's GPU call failed", "trainer output",
                       self._line_probe(r"submitit-trainer: (?:device error|checkpoint failed) step=(\d+) error=(\S+)"))
        signal = Phase("grace signal sent to the job", "journal", self._signal_probe(), follows=drained)
        self.signal_phase = signal
        return [failed, signal,
                Phase("submitit checkpoint on the signal (state on the lost GPU: last durable one pickled)",
                      "trainer output", self._signal_checkpoint_probe())]

    def _restart_start_probe(self) -> Probe:
        def probe():
            start = 0
            while True:  # the first start after the fault away from the bad node: the requeued run
                hit = self.tail.find(r"submitit-trainer: start step=(\d+) node=(\S+) \S+ resumed_from=(\S+)",
                                     after=self.report.fault_time, start=start)
                if hit is None:
                    return None
                t, line, m = hit
                idx = self.tail.index_of(t, line)
                if m.group(2) != self.report.node:
                    break
                start = idx + 1
            self.first_restart_line = idx
            self.resumed_step = int(m.group(1))
            saved = [int(s.group(1)) for s in (re.search(r"submitit-trainer: checkpoint saved step=(\d+)", ln)
                                               for _t, ln in self.tail.lines[:idx]) if s]
            self.saved_step = saved[-1] if saved else None
            if self.resumed_step != self.saved_step:
                raise Contradiction(f"resumed from step {self.resumed_step}, but the last durable checkpoint "
                                    f"before the fault was step {self.saved_step}")
            return trainer_evidence(f"resumed from step {self.resumed_step} on {m.group(2)} (from {m.group(3)}: "
                                    f"the last durable checkpoint before the fault)", line)
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
            else:  # xid-watch's signal record; none when the job requeued itself first: then any record of it
                first = (signals or recs or [None])[0]
                seen = bool(signals) or bool(judge_requeued(job, self.baseline_restarts))
                what = f"journal: {first.event}: {first.message}" if first is not None else ""
            if seen and recs:
                return Evidence(f"{what}; {len(recs)} journal records for the job")
            return Waiting(f"job comment {job.comment!r}; {len(recs)} journal records for the job since the fault")
        return probe

    def _measure_lost_steps(self) -> None:
        """The lost steps from the trainer's own lines (read as the example trainers' by lostwork)."""
        from autoheal_lab.lostwork import resumes

        self.tail.poll()
        text = "\n".join(line.split(TRAINER, 1)[-1] for _, line in self.tail.lines if TRAINER in line)
        found = resumes("\n".join("autoheal-trainer: " + ln for ln in text.splitlines()))
        if found and found[0].resumed:
            r = found[0]
            self.report.lost_steps = r.lost
            self.report.notes.append(f"lost steps (trainer output): newest step before the restart "
                                     f"{max(r.before.values())}, resumed from step {min(r.resumed.values())}")

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
