"""end_step (issue 23, tiers bench): srun is left a bounded moment to exit by itself after its steps were
SIGKILLed through Slurm, so it can take the killed ranks' task exits; then it is SIGKILLed."""

from __future__ import annotations

import signal

from helpers import FakeSlurm

from autoheal.sbatch_helpers import runner as r
from autoheal.slurm.model import Job, Node


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeSrun:
    """srun's process group: gone ``exits_after`` seconds after the step kill (None: never by itself)."""

    def __init__(self, clock: FakeClock, exits_after):
        self.clock, self.exits_after = clock, exits_after
        self.killed_at = None
        self.signals: list = []
        self.step_killed_at = None

    @property
    def group_alive(self) -> bool:
        if self.killed_at is not None:
            return False
        if self.exits_after is None or self.step_killed_at is None:
            return True
        return self.clock.now < self.step_killed_at + self.exits_after

    def signal(self, sig: int) -> None:
        self.signals.append(sig)
        if sig == signal.SIGKILL:
            self.killed_at = self.clock.now

    def wait_group(self, timeout: float, clock=None) -> bool:
        return not self.group_alive


class StepSlurm(FakeSlurm):
    def __init__(self, *a, srun: FakeSrun, fail: bool = False, **kw):
        super().__init__(*a, **kw)
        self.srun, self.fail = srun, fail

    def signal_job(self, job_id, sig, batch=False, full=False):
        super().signal_job(job_id, sig, batch, full)
        if self.fail:
            from autoheal.errors import SlurmError

            raise SlurmError("scancel: error: Kill job error on job id 42.1: Unexpected message received")
        self.srun.step_killed_at = self.srun.clock.now


def make(tmp_path, exits_after, fail=False):
    clock = FakeClock()
    srun = FakeSrun(clock, exits_after)
    job = Job(job_id="42", raw_id="42", state="RUNNING", nodes=("gpu1",), comment="", end_time=None)
    slurm = StepSlurm(job, [Node("gpu1", "MIXED")], None, srun=srun, fail=fail)
    ident = r.JobIdentity(job_id="42", raw_id="42", restart_count=0, submit_dir=str(tmp_path))
    runner = r.Runner(r.RunnerOptions(checkpoint_dir=str(tmp_path / "ck")), ident, slurm=slurm,
                      env={"PATH": "/usr/bin:/bin"}, sacct=lambda j: None, adopt_orphans=False,
                      monotonic=clock, sleep=clock.sleep)
    return runner, slurm, srun, clock


def test_srun_that_exits_after_the_step_kill_is_not_killed(tmp_path):
    runner, slurm, srun, clock = make(tmp_path, exits_after=0.5)
    runner.end_step(srun)
    assert [c for c in slurm.calls if c[0] == "signal"] == [("signal", "42.1", "KILL", False, False)]
    assert signal.SIGKILL not in srun.signals and not srun.group_alive
    assert clock.now - 100.0 < r.SRUN_EXIT_WAIT  # it returned once srun was gone, not after the bound


def test_srun_still_there_after_the_bound_is_killed(tmp_path):
    runner, slurm, srun, clock = make(tmp_path, exits_after=None)
    runner.end_step(srun)
    assert srun.signals == [signal.SIGKILL]
    assert srun.killed_at is not None and r.SRUN_EXIT_WAIT <= srun.killed_at - 100.0 < r.SRUN_EXIT_WAIT + 1.0


def test_srun_is_killed_at_once_when_no_step_could_be_killed_through_slurm(tmp_path):
    runner, slurm, srun, clock = make(tmp_path, exits_after=0.5, fail=True)
    runner.end_step(srun)
    assert srun.signals == [signal.SIGKILL] and srun.killed_at == 100.0  # nothing would end it by itself
