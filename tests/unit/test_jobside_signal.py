"""The warning a job asked for (issue 15): read back from its submit line and batch script, and delivered
by xid-watch's job side the way Slurm delivers it near the time limit, never to a batch shell that did
not ask for it, whatever ``hooks.grace_signal`` says."""

from __future__ import annotations

import pytest
from test_hooks_jobside import XID79, FakeCtld, events, make_ctx, side

from autoheal.config.hooks_section import GRACE_SIGNALS
from autoheal.errors import SlurmError, SlurmNotSupported, SlurmUnavailable
from autoheal.hooks import jobside as J
from autoheal.slurm import parse as P
from autoheal.slurm.model import Job, WarnSignal

SUBMITIT_SCRIPT = """#!/bin/bash

# Parameters
#SBATCH --job-name=submitit
#SBATCH --open-mode=append
#SBATCH --output=/home/u/logs/%j_0_log.out
#SBATCH --signal=USR2@90
#SBATCH --time=60

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /home/u/logs/%j_%t_log.out python -u -m submitit.core._submit /home/u/logs
"""


# ---- reading the request ----------------------------------------------------------------------------
@pytest.mark.parametrize("spec,want", [
    ("USR2@90", WarnSignal("USR2", 90, False)),
    ("B:USR1@60", WarnSignal("USR1", 60, True)),
    ("b:sigusr1", WarnSignal("USR1", 60, True)),  # @secs left out: Slurm's default 60
    ("R:TERM@30", WarnSignal("TERM", 30, False)),  # R: is about reservations, not whom to signal
    ("RB:10@5", WarnSignal("USR1", 5, True)),
    ("12", WarnSignal("USR2", 60, False)),
    ("34@10", WarnSignal("34", 10, False)),  # a real-time signal: scancel takes the number
    ("KILL@90", None), ("SIGSTOP", None), ("9@5", None),  # cannot be caught: no warning at all
    ("USR2@soon", None), ("NOPE@90", None), ("", None), ("99@1", None),
])
def test_signal_specs_are_read_as_sbatch_reads_them(spec, want):
    assert P.parse_signal_spec(spec) == want


def test_submitit_script_asks_for_usr2_on_its_steps():
    assert P.requested_signal(script=SUBMITIT_SCRIPT) == WarnSignal("USR2", 90, False)


def test_only_directives_before_the_first_command_count_and_the_last_wins():
    script = ("#!/bin/bash\n#SBATCH --signal=USR1@30\n\n# a comment\n#SBATCH -N 1 --signal B:USR2@45  # why\n"
              "srun train\n#SBATCH --signal=TERM@10\n")
    assert P.requested_signal(script=script) == WarnSignal("USR2", 45, True)
    assert P.requested_signal(script="#!/bin/bash\necho hi\n#SBATCH --signal=USR2@90\n") is None
    assert P.requested_signal(script=" #SBATCH --signal=USR2@90\n") is None  # not a directive
    script = "#!/bin/bash\n#SBATCH --signal='B:USR2@9'\nsrun x\n"
    assert P.requested_signal(script=script) == WarnSignal("USR2", 9, True)
    assert P.requested_signal() is None


def test_the_command_line_overrides_the_script_and_the_scripts_own_arguments_do_not_count():
    line = "sbatch -N 1 --signal=B:USR1@60 /home/u/train.sh --signal=USR2@5"
    assert P.requested_signal(line, SUBMITIT_SCRIPT, "/home/u/train.sh") == WarnSignal("USR1", 60, True)
    assert P.requested_signal("sbatch train.sh --signal=TERM", SUBMITIT_SCRIPT, "/x/train.sh") == \
        WarnSignal("USR2", 90, False)
    assert P.requested_signal("sbatch --signal USR1@7 job.sh", "", "job.sh") == WarnSignal("USR1", 7, False)


def test_squeue_json_submit_line_and_command_are_kept():
    job = P.job_from_json({"job_id": 5, "job_state": "RUNNING", "submit_line": "sbatch --signal=USR1@9 a.sh",
                           "command": "/w/a.sh"})
    assert (job.submit_line, job.command) == ("sbatch --signal=USR1@9 a.sh", "/w/a.sh")
    assert P.job_from_json({"job_id": 5, "job_state": "RUNNING"}).submit_line == ""  # 22.05: not reported


# ---- delivering it ----------------------------------------------------------------------------------
class ScriptCtld(FakeCtld):
    """FakeCtld that knows batch scripts and records exactly whom a signal went to."""

    def __init__(self, scripts=None, script_error=None):
        super().__init__()
        self.scripts = dict(scripts or {})
        self.script_error = script_error

    def batch_script(self, job_id):
        self._call(f"batch_script {job_id}")
        if self.script_error is not None:
            raise self.script_error
        return self.scripts.get(job_id, "#!/bin/bash\nsrun train\n")

    def signal_job(self, job_id, signal, batch=False, full=False):
        self._call(f"signal {job_id} {signal} {'batch' if batch else 'full' if full else 'steps'}")


def _ctx(tmp_path, scripts=None, script_error=None, **hooks):
    ctx = make_ctx(tmp_path, **hooks)
    ctx.slurm = ScriptCtld(scripts, script_error)
    return ctx


def _fault(ctx, js, now=100.0):
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, now)
    js.step(now=now, urgent=True)


@pytest.mark.parametrize("grace_signal", GRACE_SIGNALS)
def test_a_submitit_job_gets_its_own_usr2_on_its_steps_whatever_grace_signal_says(tmp_path, grace_signal):
    ctx = _ctx(tmp_path, {"7": SUBMITIT_SCRIPT, "8": "#!/bin/bash\n#SBATCH --signal=B:USR1@30\npython t.py\n"},
               grace_signal=grace_signal)
    ctx.slurm.add_job("7")
    ctx.slurm.add_job("8")
    js = side(ctx)
    _fault(ctx, js)
    # SIGCONT then the job's signal, to the steps (7) or only the batch shell (8): never --full
    assert ctx.slurm.writes("signal") == ["signal 7 CONT steps", "signal 7 USR2 steps",
                                          "signal 8 CONT batch", "signal 8 USR1 batch"]
    assert not ctx.slurm.writes("requeue")  # the framework requeues itself within the grace
    msgs = {kw["job_ids"][0]: kw["message"] for kw in events(ctx, "signal")}
    assert "--signal=USR2@90: every step, not the batch shell" in msgs["7"]
    assert "--signal=B:USR1@30: batch shell only" in msgs["8"]
    # it requeued itself: nothing left to do after the grace
    ctx.slurm.jobs["7"] = Job("7", "PENDING", ())
    js.step(now=111.0)
    assert ctx.slurm.writes("requeue") == ["requeue 8"]  # 8 neither exited nor requeued: autoheal does
    js.step(now=200.0, force=True)
    assert ctx.slurm.writes("requeue") == ["requeue 8"]
    assert len(ctx.slurm.writes("signal")) == 4  # once per job and fault


@pytest.mark.parametrize("grace_signal", [s for s in GRACE_SIGNALS if s != "TERM"])
def test_a_job_that_asked_for_nothing_gets_grace_signal_on_its_steps_never_its_batch_shell(tmp_path,
                                                                                          grace_signal):
    ctx = _ctx(tmp_path, grace_signal=grace_signal)
    ctx.slurm.add_job("5")
    js = side(ctx)
    _fault(ctx, js)
    assert ctx.slurm.writes("signal") == [f"signal 5 {grace_signal} steps"]
    assert "the job asked for no signal" in events(ctx, "signal")[0]["message"]
    js.step(now=111.0)
    assert ctx.slurm.writes("requeue") == ["requeue 5"]


def test_a_job_that_asked_for_nothing_with_term_is_requeued_at_once(tmp_path):
    ctx = _ctx(tmp_path)  # grace_signal TERM, the default
    ctx.slurm.add_job("5")
    _fault(ctx, side(ctx))
    assert ctx.slurm.writes("requeue") == ["requeue 5"] and not ctx.slurm.writes("signal")


def test_the_runner_still_gets_runner_signal_on_its_batch_shell_and_its_script_is_not_read(tmp_path):
    ctx = _ctx(tmp_path, {"9": SUBMITIT_SCRIPT})
    ctx.slurm.add_job("9", comment="autoheal-runner restarts=0 state=running")
    _fault(ctx, side(ctx))
    assert ctx.slurm.writes("signal") == ["signal 9 USR2 batch"]
    assert not ctx.slurm.writes("batch_script")


@pytest.mark.parametrize("error", [SlurmNotSupported("rest backend"), SlurmError("not a batch job")])
def test_a_script_that_cannot_be_read_falls_back_to_grace_signal(tmp_path, error):
    ctx = _ctx(tmp_path, script_error=error, grace_signal="USR1")
    ctx.slurm.add_job("5")
    _fault(ctx, side(ctx))
    assert ctx.slurm.writes("signal") == ["signal 5 USR1 steps"]


def test_submit_line_alone_is_enough_when_the_script_cannot_be_read(tmp_path):
    ctx = _ctx(tmp_path, script_error=SlurmNotSupported("rest"))
    ctx.slurm.jobs["5"] = Job("5", "RUNNING", ("n1",), submit_line="sbatch --signal=USR1@60 t.sh", command="t.sh")
    _fault(ctx, side(ctx))
    assert ctx.slurm.writes("signal") == ["signal 5 CONT steps", "signal 5 USR1 steps"]


def test_slurmctld_down_while_reading_the_script_keeps_the_signal_pending(tmp_path):
    ctx = _ctx(tmp_path, {"7": SUBMITIT_SCRIPT}, script_error=SlurmUnavailable("scontrol: no answer"))
    ctx.slurm.add_job("7")
    js = side(ctx)
    _fault(ctx, js)
    key = "7@" + ctx.store.read()["episode"]["id"]
    assert ctx.store.read()["job_actions"][key]["stage"] == J.SIGNAL and not ctx.slurm.writes("signal")
    ctx.slurm.script_error = None
    js.step(now=115.0)
    assert ctx.slurm.writes("signal") == ["signal 7 CONT steps", "signal 7 USR2 steps"]
    assert ctx.store.read()["job_actions"][key]["requested"] == "USR2@90"


def test_a_restart_keeps_the_request_it_read(tmp_path):
    ctx = _ctx(tmp_path, {"7": SUBMITIT_SCRIPT})
    ctx.slurm.add_job("7")
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
        st["episode"] = {"id": "drain-1", "since": 100.0, "reason": XID79.reason}
        J.add_action(st, "7", "drain-1", "note", 100.0, runner=False)
        st["job_actions"]["7@drain-1"]["requested"] = "B:USR1@30"  # read before a restart
    js = side(ctx)
    js.step(now=101.0)
    assert ctx.slurm.writes("signal") == ["signal 7 CONT batch", "signal 7 USR1 batch"]
    assert not ctx.slurm.writes("batch_script")


@pytest.mark.parametrize("end,requeued", [("FAILED", True), ("COMPLETED", True), ("CANCELLED", False),
                                          ("TIMEOUT", False)])
def test_a_job_that_ended_on_grace_signal_is_requeued_at_once(tmp_path, end, requeued):
    # issue 15: grace_signal USR1 killed the plain job's srun step, its batch script ended, and the job
    # stayed FAILED: the grace's requeue found it "no longer running" and left it (seen on the lab)
    ctx = _ctx(tmp_path, grace_signal="USR1")
    ctx.slurm.add_job("5")
    js = side(ctx)
    _fault(ctx, js)
    assert ctx.slurm.writes("signal") == ["signal 5 USR1 steps"]
    ctx.slurm.jobs["5"] = Job("5", "COMPLETING", ("n1",))  # the step died; the batch script is ending
    js.step(now=102.5)
    assert not ctx.slurm.writes("requeue")
    ctx.slurm.jobs["5"] = Job("5", end, ("n1",))
    js.step(now=104.6)  # looked at again every FAST_SECONDS, long before the 10 s grace is over
    assert ctx.slurm.writes("requeue") == (["requeue 5"] if requeued else [])
    if requeued:
        assert events(ctx, "requeue")[0]["outcome"] == f"requeued after it ended {end} on the grace signal"
    js.step(now=200.0, force=True)
    assert len(ctx.slurm.writes("requeue")) == (1 if requeued else 0)


def test_a_job_still_running_through_the_grace_is_requeued_when_it_ends_not_before(tmp_path):
    ctx = _ctx(tmp_path, grace_signal="USR1")
    ctx.slurm.add_job("5")
    js = side(ctx)
    _fault(ctx, js)
    for now in (102.1, 104.2, 106.3, 108.4):
        js.step(now=now)
    assert not ctx.slurm.writes("requeue")
    js.step(now=110.5)
    assert ctx.slurm.writes("requeue") == ["requeue 5"] and events(ctx, "requeue")[0]["outcome"] == "requeued"


def test_a_job_completing_for_ever_is_not_looked_at_for_ever(tmp_path):
    ctx = _ctx(tmp_path, grace_signal="USR1")
    ctx.slurm.add_job("5")
    js = side(ctx)
    _fault(ctx, js)
    ctx.slurm.jobs["5"] = Job("5", "COMPLETING", ("n1",))
    js.step(now=102.5)
    js.step(now=110.0 + J.ENDING_WAIT + 1)  # past the grace and Slurm's MinJobAge: give up, no requeue
    [action] = ctx.store.read()["job_actions"].values()
    assert action["stage"] == J.DONE and action["outcome"] == "no longer runs here (COMPLETING)"
    assert not ctx.slurm.writes("requeue")


def test_after_a_restart_mid_signal_a_job_that_ended_on_grace_signal_is_still_requeued(tmp_path):
    ctx = _ctx(tmp_path, grace_signal="USR1")
    ctx.slurm.add_job("5")
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
        st["episode"] = {"id": "drain-1", "since": 100.0, "reason": XID79.reason}
        J.add_action(st, "5", "drain-1", "note", 100.0, runner=False)
        st["job_actions"]["5@drain-1"].update(stage=J.SIGNALLING, signalled_at=100.0, requested="")
    ctx.slurm.jobs["5"] = Job("5", "FAILED", ("n1",))  # the signal went out and killed its step
    js = side(ctx)
    js.step(now=101.0)
    js.step(now=103.5)
    assert ctx.slurm.writes("requeue") == ["requeue 5"] and not ctx.slurm.writes("signal")


def test_a_signal_looked_up_before_is_not_sent_to_a_job_that_moved_since(tmp_path):
    # submitfix's lab run (2026-12-03): a signal due from the first fault reached the job after it had
    # requeued itself and run again on another node, which made it checkpoint and requeue a healthy run
    ctx = _ctx(tmp_path, {"7": SUBMITIT_SCRIPT})
    ctx.slurm.add_job("7")
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
        st["episode"] = {"id": "drain-1", "since": 100.0, "reason": XID79.reason}
        J.add_action(st, "7", "drain-1", "note", 100.0, runner=False)
        st["job_actions"]["7@drain-1"]["requested"] = "USR2@90"  # looked up on an earlier pass
    ctx.slurm.jobs["7"] = Job("7", "RUNNING", ("other-node",))  # requeued itself, running elsewhere
    side(ctx).step(now=101.0)
    assert not ctx.slurm.writes("signal")
    action = ctx.store.read()["job_actions"]["7@drain-1"]
    assert action["stage"] == J.DONE and action["outcome"].startswith("not running here"), action
