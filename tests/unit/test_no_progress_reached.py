"""The no-progress rule asks how far the previous run got (the comment's ``reached``), not only where it
resumed: a healthy job hit by two faults within one checkpoint interval resumes twice from the same step
and must go on; a job that cannot get past its resume point is still stopped.

Seen in the soak (2026-12-07, heavy load): the submitit job ended ``no-progress`` ("restarts N-1 and N
both resume from checkpoint step 310; stopping") after two faults within one checkpoint interval.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from test_sbatch_runner import keep_signal_handlers, make, signal_when_started  # noqa: F401 (autouse)

from autoheal.reasons import MAX_COMMENT_LEN
from autoheal.runner_comment import COMMENT_FIELDS, CommentState
from autoheal.sbatch_helpers import hang
from autoheal.sbatch_helpers import runner as r
from autoheal.sbatch_helpers.checkpoint import CheckpointManager
from autoheal.sbatch_helpers.progress import PHASE_SAVED, PHASE_STEP, Heartbeat, heartbeat
from autoheal.slurm.model import Node


def beat(rank: int, step: int, t: float = 100.0, phase: str = PHASE_STEP) -> Heartbeat:
    return Heartbeat(rank=rank, step=step, time=t, phase=phase)


# ---- the rule (pure) -----------------------------------------------------------------------------


def test_the_soaks_case_a_run_past_its_resume_step_goes_on():
    # restart N-1 resumed from 310, its ranks reached 325, a second fault before the checkpoint at 330:
    # restart N resumes from 310 again
    assert not r.no_progress(3, "310", "310", "325")
    assert not r.no_progress(2, "none", "none", "4")  # from scratch (step 0) to step 4


@pytest.mark.parametrize("reached", ["310", "300", "none", "", "x"])
def test_the_lemon_case_a_run_that_did_not_get_past_it_is_stopped(reached):
    # reached its resume step only, or nothing changed, or not known (a runner killed before it wrote the
    # field, a requeue by xid-watch): today's rule
    assert r.no_progress(3, "310", "310", reached)


def test_the_rule_without_the_field_is_the_old_one():
    assert r.no_progress(2, "5", "5") and not r.no_progress(1, "5", "5") and not r.no_progress(2, "5", "6")
    assert r.no_progress(2, "none", "none", "0")  # step 0 is where a fresh start begins: not past it
    assert not r.no_progress(2, "", "", "9")  # no resume recorded: nothing to compare
    assert not r.no_progress(1, "310", "310", "none")  # restart 1: the run before it was no restart


# ---- how far a run got (pure) ---------------------------------------------------------------------


def test_reached_counts_only_records_seen_to_change_never_the_baseline():
    # an earlier run left rank 0 at 325 and rank 1 at 330: that is how far IT got
    t = hang.start({0: beat(0, 325), 1: beat(1, 330)}, now=0.0)
    t = hang.observe(t, {0: beat(0, 325), 1: beat(1, 330)}, now=2.0)
    assert t.reached is None
    t = hang.observe(t, {0: beat(0, 311, 101.0), 1: beat(1, 330)}, now=4.0)  # rank 0 resumed; rank 1 dead
    assert t.reached == 311
    t = hang.observe(t, {0: beat(0, 315, 102.0, PHASE_SAVED), 1: beat(1, 330)}, now=6.0)
    assert t.reached == 315  # a save's record is progress too
    t = hang.observe(t, {}, now=8.0)  # files gone: what was seen stays
    assert t.reached == 315


def test_reached_is_the_furthest_step_seen_not_the_last():
    t = hang.start({}, now=0.0)
    t = hang.observe(t, {0: beat(0, 20, 1.0), 1: beat(1, 18, 1.0)}, now=1.0)
    t = hang.observe(t, {0: beat(0, 12, 2.0), 1: beat(1, 19, 2.0)}, now=2.0)  # rank 0 restarted its count
    assert t.reached == 20


# ---- the comment field ----------------------------------------------------------------------------


def test_the_comment_round_trips_the_field_and_an_old_comment_parses_without_it():
    old = CommentState.parse("autoheal-runner restarts=2 last=signal step=310 resumed=310 nodes=gpu1 "
                             "state=requeued | mine")
    assert old.reached == "" and old.resumed == "310" and old.user_comment == "mine"
    st = replace(old, reached="325")
    text = st.render()
    assert "resumed=310 reached=325 nodes=gpu1" in text
    assert CommentState.parse(text) == st
    assert "reached" in COMMENT_FIELDS


def test_the_comment_stays_within_its_bound_and_keeps_the_field_when_cut():
    # the field is written before the lists that can grow (nodes, excl): a cut at MAX_COMMENT_LEN takes
    # the user's part and the tail of a long node list, never it
    many = ",".join(f"gpu{i:04d}" for i in range(400))
    st = CommentState(restarts=7, last="xid-79@gpu0001", step="1234567", resumed="1234567", reached="1234599",
                      nodes=many, state="requeued", excl=many, user_comment="u" * 900)
    text = st.render()
    assert len(text) <= MAX_COMMENT_LEN
    back = CommentState.parse(text)
    assert (back.resumed, back.reached, back.step) == ("1234567", "1234599", "1234567")


# ---- the runner: records it at the requeue, judges by it at the next start ------------------------

# resumes from the checkpoint, writes one heartbeat (the ranks got to STEP), then waits for the grace
# signal and dies without saving: the fault came before the next checkpoint
CHILD = """
import os, signal, sys, time
from pathlib import Path
from autoheal.sbatch_helpers import heartbeat
got = []
signal.signal(signal.SIGUSR2, lambda *a: got.append(1))
if {step} is not None:
    heartbeat({step})
Path(os.environ["AUTOHEAL_CHECKPOINT_DIR"], "started").write_text(os.environ.get("AUTOHEAL_RESUME_FROM", "-"))
while not got:
    time.sleep(0.05)
sys.exit(1)
"""


def _run(tmp_path, job, restart, step):
    started = tmp_path / "ck" / "started"
    started.unlink(missing_ok=True)
    runner, slurm, journal = make(tmp_path, job=job, restart=restart,
                                  nodes=[Node("gpu1", "MIXED"), Node("gpu2", "MIXED")])
    signal_when_started(runner, tmp_path / "ck")
    code = runner.run([sys.executable, "-c", CHILD.format(step=step)])
    return code, slurm, journal, started.exists()


def test_two_faults_within_one_interval_go_on_and_a_run_that_got_nowhere_stops(tmp_path, capsys):
    ck = tmp_path / "ck"
    CheckpointManager(ck, keep=None, rank=0).save(310, b"state at 310")
    heartbeat(330, directory=ck, environ={"RANK": "1"})  # left by an earlier run: not this run's progress
    job = replace(make(tmp_path)[1].job, comment="autoheal-runner restarts=1 last=signal step=310 resumed=none")

    # restart 1 resumes from 310, its ranks reach 325, the first fault: requeued
    code, slurm, journal, ran = _run(tmp_path, job, 1, 325)
    assert code == r.EXIT_REQUEUED and ran
    st = CommentState.parse(slurm.job.comment)
    assert (st.restarts, st.resumed, st.reached, st.step) == (2, "310", "325", "310"), slurm.job.comment
    assert list(journal.read(events=["job-requeue"]))[-1].evidence["reached"] == "325"

    # restart 2 resumes from 310 again (the second fault came before step 320's checkpoint): it runs
    code, slurm, journal, ran = _run(tmp_path, replace(slurm.job, state="RUNNING"), 2, None)
    assert code == r.EXIT_REQUEUED and ran, slurm.job.comment
    assert "run 1 reached step 325 before it ended" in capsys.readouterr().err
    st = CommentState.parse(slurm.job.comment)
    assert (st.restarts, st.resumed, st.reached) == (3, "310", "none"), slurm.job.comment  # no record changed

    # restart 3: run 2 got nowhere past 310 (the earlier run's 330 was not counted): no progress
    code, slurm, journal, ran = _run(tmp_path, replace(slurm.job, state="RUNNING"), 3, None)
    assert code == r.EXIT_NO_PROGRESS and not ran
    assert "state=no-progress" in slurm.job.comment
    (stop,) = journal.read(events=["job-no-progress"])
    assert "restarts 2 and 3 both resume from checkpoint step 310 and run 2 reached no further step" in stop.message


def test_a_run_that_did_not_record_how_far_it_got_is_judged_as_before(tmp_path):
    # the runner was killed before the requeue's comment (the guard finished it), or xid-watch requeued
    CheckpointManager(tmp_path / "ck", keep=None, rank=0).save(310, b"x")
    job = replace(make(tmp_path)[1].job, comment="autoheal-runner restarts=2 last=xid-79@gpu1 step=310 resumed=310")
    code, slurm, journal, ran = _run(tmp_path, job, 2, None)
    assert code == r.EXIT_NO_PROGRESS and not ran
    (stop,) = journal.read(events=["job-no-progress"])
    assert "run 1 did not record how far it got" in stop.message


def test_a_new_run_clears_the_previous_runs_field(tmp_path):
    # what run N-1 reached says nothing of run N: a run N killed before its requeue's comment must not
    # leave run N-1's field beside its own resume step
    CheckpointManager(tmp_path / "ck", keep=None, rank=0).save(310, b"x")
    job = replace(make(tmp_path)[1].job,
                  comment="autoheal-runner restarts=2 last=signal step=310 resumed=300 reached=325")
    runner, slurm, _ = make(tmp_path, job=job, restart=2)
    seen = []
    runner.write_comment = lambda retry_for=0.0: seen.append(runner.comment.render())  # type: ignore[method-assign]
    env = runner._begin()
    assert isinstance(env, dict)
    assert "resumed=310 nodes=" in seen[-1] and "reached=" not in seen[-1], seen
