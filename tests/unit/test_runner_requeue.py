"""The runner's requeue after a node fault, against the in-memory Slurm: intent first, every step
idempotent and retried, and a kill at any step finished by ``autoheal guard``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from autoheal.errors import SlurmJobFinished, SlurmRequeueDisabled, SlurmUnavailable
from autoheal.journal import Journal
from autoheal.sbatch_helpers import causes
from autoheal.sbatch_helpers import runner as r
from autoheal.sbatch_helpers.comment import CommentState, plan_exclusions
from autoheal.sbatch_helpers.guard import Guard, Sightings, plan
from autoheal.slurm.model import Job, Node
from autoheal_lab.testing.slurm import MemorySlurm

BAD = Node("gpu2", "MIXED", frozenset({"DRAIN"}), reason="autoheal: xid 79 GPU 3 of gpu2")


class Killed(BaseException):
    """Stands for the SIGKILL that ends the runner between two Slurm calls."""


def setup(comment="autoheal-runner | my note", excluded=("spare1",), nodes=None, requeue=True):
    job = Job(job_id="7", raw_id="7", state="RUNNING", nodes=("gpu1", "gpu2"), comment=comment,
              excluded_nodes=tuple(excluded), requeue=requeue)
    nodes = nodes or [Node("gpu1", "MIXED"), BAD, Node("gpu3", "IDLE"), Node("spare1", "IDLE")]
    slurm = MemorySlurm(nodes, [job])
    ident = r.JobIdentity(job_id="7", raw_id="7", restart_count=0)
    runner = r.Runner(r.RunnerOptions(grace=5), ident, slurm=slurm, env={}, sacct=lambda j: None,
                      adopt_orphans=False)
    runner.comment = CommentState.parse(comment)
    cause = causes.Cause(kind="autoheal-drain", node="gpu2", evidence="test")
    return runner, slurm, cause


def test_intent_is_written_before_the_hold_then_exclude_release():
    runner, slurm, cause = setup()
    outcome, ours = runner.requeue(cause, list(slurm.nodes.values()), slurm.jobs["7"], 1, "14")
    assert (outcome, ours) == ("requeued", ["gpu2"])
    writes = [c[0] if c[0] != "update_job" else ("comment" if "Comment" in c[2] else "exclude")
              for c in slurm.writes("7")]
    assert writes == ["comment", "requeuehold", "exclude", "release", "comment"]
    intent = CommentState.parse(slurm.calls[[c[0] for c in slurm.calls].index("update_job")][2]["Comment"])
    assert (intent.state, intent.excl, intent.restarts, intent.step) == ("requeueing", "gpu2", 1, "14")
    job = slurm.jobs["7"]
    assert job.excluded_nodes == ("spare1", "gpu2") and not job.held
    final = CommentState.parse(job.comment)
    assert final.state == "requeued" and final.user_comment == "my note"


def test_controller_away_during_release_is_retried(monkeypatch):
    monkeypatch.setattr(r.time, "sleep", lambda s: None)
    runner, slurm, cause = setup()
    slurm.fail_next["release"] = [SlurmUnavailable("scontrol release: no answer within 10s")] * 3
    assert runner.requeue(cause, list(slurm.nodes.values()), slurm.jobs["7"], 1, "14")[0] == "requeued"
    assert [c[0] for c in slurm.writes("7")].count("release") == 4
    assert not slurm.jobs["7"].held


def test_already_requeued_by_someone_else_still_excludes():
    runner, slurm, cause = setup()
    slurm.requeue("7")  # xid-watch (or Slurm) was first
    outcome, ours = runner.requeue(cause, list(slurm.nodes.values()), slurm.jobs["7"], 1, "14")
    assert outcome == "already-requeued" and ours == ["gpu2"]
    assert "gpu2" in slurm.jobs["7"].excluded_nodes and not slurm.jobs["7"].held


@pytest.mark.parametrize("killed_before", ["requeuehold", "exclude", "release", "final-comment"])
def test_killed_at_any_step_the_guard_finishes(killed_before):
    runner, slurm, cause = setup()
    seen = {"updates": 0}

    def before(op, args):
        if op == "update_job":
            seen["updates"] += 1
            name = "exclude" if "ExcNodeList" in args[1] else ("final-comment" if seen["updates"] > 1 else "")
            if name == killed_before:
                raise Killed()
        elif op == killed_before:
            raise Killed()

    slurm.before = before
    with pytest.raises(Killed):
        runner.requeue(cause, list(slurm.nodes.values()), slurm.jobs["7"], 1, "14")
    slurm.before = None
    job = slurm.jobs["7"]
    if killed_before == "requeuehold":
        # never held: the job still runs on the drained node; xid-watch's level-triggered pass requeues it
        assert job.state == "RUNNING" and CommentState.parse(job.comment).state == "requeueing"
        assert plan([job], slurm.nodes, Sightings(), 100.0, 0) == []
        return
    guard = Guard(slurm, release_after=0, say=lambda s: None)
    results = guard.pass_once()
    job = slurm.jobs["7"]
    if killed_before == "final-comment":
        assert results == [] and not job.held  # released already; nothing to finish
    else:
        assert [x.action.kind for x in results] == ["release"] and results[0].done
        st = CommentState.parse(job.comment)
        assert (st.state, st.guard, st.excl, st.user_comment) == ("requeued", "released", "gpu2", "my note")
    assert not job.held and job.state == "PENDING"
    assert set(job.excluded_nodes) == {"spare1", "gpu2"}


def test_requeue_refused_for_no_requeue_job_is_reported_not_retried():
    runner, slurm, cause = setup(requeue=False)
    with pytest.raises(SlurmRequeueDisabled):
        runner.requeue(cause, list(slurm.nodes.values()), slurm.jobs["7"], 1, "14")
    assert [c[0] for c in slurm.writes("7")].count("requeuehold") == 1


def test_job_cancelled_meanwhile_is_not_an_error():
    runner, slurm, cause = setup()
    slurm.jobs["7"] = slurm.jobs["7"].__class__(**{**slurm.jobs["7"].__dict__, "state": "CANCELLED"})
    with pytest.raises(SlurmJobFinished):
        runner.requeue(cause, list(slurm.nodes.values()), slurm.jobs["7"], 1, "14")


def test_exclusions_are_pruned_to_nodes_still_unhealthy():
    # finding: five faults in a row grew ExcNodeList to gpu1,gpu2,gpu3,spare1 and the job never ran again
    healthy = {"gpu1": Node("gpu1", "IDLE"), "gpu3": Node("gpu3", "IDLE"), "gpu2": BAD}
    ex = plan_exclusions(["spare1", "gpu1", "gpu3"], ["gpu1", "gpu3"], ["gpu2"], healthy)
    assert ex.user == ["spare1"] and ex.ours == ["gpu2"] and ex.full == ["spare1", "gpu2"]
    # a node we cannot see is kept (no guessing); the user's own exclusion of a failed node stays theirs
    ex = plan_exclusions(["gpu2", "gpu4"], ["gpu4"], ["gpu2"], {"gpu2": BAD})
    assert ex.user == ["gpu2"] and ex.ours == ["gpu4"]


def test_runner_prunes_its_old_exclusions_at_the_next_requeue():
    comment = "autoheal-runner restarts=1 last=autoheal-drain@gpu3 excl=gpu3"
    runner, slurm, cause = setup(comment=comment, excluded=("spare1", "gpu3"))
    runner.requeue(cause, list(slurm.nodes.values()), slurm.jobs["7"], 2, "20")
    assert slurm.jobs["7"].excluded_nodes == ("spare1", "gpu2")  # gpu3 is healthy again
    assert CommentState.parse(slurm.jobs["7"].comment).excl == "gpu2"


def test_shield_children_inherit_ignored_sigterm_and_it_is_restored():
    probe = [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGTERM) == signal.SIG_IGN)"]
    before = signal.getsignal(signal.SIGTERM)
    with r.Shield():
        out = subprocess.run(probe, capture_output=True, text=True, timeout=30).stdout.strip()
    assert out == "True"
    assert signal.getsignal(signal.SIGTERM) == before
    assert subprocess.run(probe, capture_output=True, text=True, timeout=30).stdout.strip() == "False"


def test_final_comment_names_the_last_fault_when_restarts_run_out(tmp_path):
    # issue 17 item 7: the final comment kept the first interruption's last=/step=
    job = Job(job_id="7", raw_id="7", state="RUNNING", nodes=("gpu1",),
              comment="autoheal-runner restarts=1 last=autoheal-drain@gpu3 step=5 resumed=5", requeue=True)
    slurm = MemorySlurm([Node("gpu1", "MIXED", frozenset({"DRAIN"}), reason="autoheal: xid 79")], [job])
    ident = r.JobIdentity(job_id="7", raw_id="7", restart_count=1)
    runner = r.Runner(r.RunnerOptions(grace=1, max_restarts=1, checkpoint_dir=str(tmp_path / "ck")), ident,
                      slurm=slurm, journal=Journal(tmp_path / "j.jsonl", fsync=False), env={},
                      sacct=lambda j: None, adopt_orphans=False)
    runner._on_signal(int(signal.SIGUSR2), None)
    assert runner.run([sys.executable, "-c", "import time; time.sleep(0.3)"]) == r.EXIT_MAX_RESTARTS
    st = CommentState.parse(slurm.jobs["7"].comment)
    assert st.state == "max-restarts" and st.last == "autoheal-drain@gpu1"


def test_a_requeue_lost_by_a_controller_restart_is_done_again():
    # slurmctld killed right after our hold restarts from a state saved before it: the job is RUNNING
    # again with its old restart count. Ending the batch shell then would end the job COMPLETED.
    runner, slurm, cause = setup()
    lost = {"done": False}

    def before(op, args):
        if op == "release" and not lost["done"]:
            lost["done"] = True
            job = slurm.jobs["7"]
            slurm.jobs["7"] = job.__class__(**{**job.__dict__, "state": "RUNNING", "restart_count": 0,
                                                "priority": 1, "state_reason": "None", "nodes": ("gpu2",)})

    slurm.before = before
    assert runner.requeue(cause, list(slurm.nodes.values()), slurm.jobs["7"], 1, "14")[0] == "requeued"
    assert [c[0] for c in slurm.writes("7")].count("requeuehold") == 2
    job = slurm.jobs["7"]
    assert job.state == "PENDING" and job.restart_count == 1 and not job.held and "gpu2" in job.excluded_nodes


def test_final_records_are_filed_under_the_batch_node(tmp_path):
    # issue 17 item 7 / issue 15: job-completed, max-restarts and no-progress were filed under no node
    job = Job(job_id="7", raw_id="7", state="RUNNING", nodes=("gpu3", "gpu4"), comment="autoheal-runner")
    slurm = MemorySlurm([Node("gpu3", "MIXED"), Node("gpu4", "MIXED")], [job])
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    runner = r.Runner(r.RunnerOptions(checkpoint_dir=str(tmp_path / "ck")), r.JobIdentity("7", "7", 0),
                      slurm=slurm, journal=journal, env={"SLURMD_NODENAME": "gpu3"}, sacct=lambda j: None,
                      adopt_orphans=False)
    assert runner.run([sys.executable, "-c", "pass"]) == 0
    [rec] = list(journal.read(events=["job-completed"]))
    assert rec.node == "gpu3" and list(journal.read(node="gpu3"))


def test_default_checkpoint_dir_is_unique_per_submission(tmp_path):
    ident = r.JobIdentity("7", "7", 0, submit_dir=str(tmp_path))
    assert r.expand_checkpoint_dir("", ident, "0a1b2c3d4e") == str(tmp_path / "autoheal-checkpoints/7-0a1b2c3d4e")
    assert r.expand_checkpoint_dir("", ident) == str(tmp_path / "autoheal-checkpoints/7")  # old scripts


def test_a_job_that_requeued_itself_is_still_kept_off_the_bad_node(tmp_path):
    # issue 15: submitit requeued itself first; the runner set no exclusion and wrote resumed=none
    runner, slurm, cause = setup()
    slurm.requeue("7")  # the framework's own `scontrol requeue`
    assert runner.exclude_while_pending(cause, list(slurm.nodes.values())) == ["gpu2"]
    job = slurm.jobs["7"]
    assert job.excluded_nodes == ("spare1", "gpu2") and CommentState.parse(job.comment).excl == "gpu2"
    slurm.start("7", ["gpu3"])  # already running again: too late to exclude, nothing is forced
    assert runner.exclude_while_pending(cause, list(slurm.nodes.values())) == []


def test_progress_marker_counts_as_the_step_reached(tmp_path):
    from autoheal.sbatch_helpers import report_progress
    from autoheal.sbatch_helpers.progress import PROGRESS_FILE, read_progress

    ck = tmp_path / "ck"
    assert report_progress(5, environ={}) is None  # outside autoheal sbatch: a no-op
    assert report_progress(9, environ={"AUTOHEAL_CHECKPOINT_DIR": str(ck), "RANK": "1"}) is None
    report_progress(12, environ={"AUTOHEAL_CHECKPOINT_DIR": str(ck)})
    assert read_progress(ck) == 12
    assert r.Runner._progress_step(None, str(ck)) == "12"
    (ck / PROGRESS_FILE).write_text('{"step": "x"}')
    assert read_progress(ck) is None and r.Runner._progress_step(None, str(ck)) == "none"
    (ck / PROGRESS_FILE).unlink()
    os.mkfifo(ck / PROGRESS_FILE)  # never opened, never a hang
    assert read_progress(ck) is None
    with pytest.raises(Exception, match="whole number"):
        report_progress(-1, environ={"AUTOHEAL_CHECKPOINT_DIR": str(ck)})


def test_the_step_reached_is_the_further_of_the_checkpoint_and_the_progress_marker(tmp_path):
    # submitfix (2026-12-03): the submitit recipe's durable save at 10, its pickle (marked) at 14; a late
    # signal of the first fault requeued it again, and judging by the durable step alone the runner said
    # "restarts 1 and 2 both resume from checkpoint step 10; stopping (no progress)"
    from autoheal.sbatch_helpers import report_progress
    from autoheal.sbatch_helpers.checkpoint import PREFIX, STEP_DIGITS

    ck = tmp_path / "ck"
    durable = ck / f"{PREFIX}{10:0{STEP_DIGITS}d}"
    durable.mkdir(parents=True)
    assert r.Runner._progress_step(durable, str(ck)) == "10"
    report_progress(14, environ={"AUTOHEAL_CHECKPOINT_DIR": str(ck)})
    assert r.Runner._progress_step(durable, str(ck)) == "14"
    newer = ck / f"{PREFIX}{20:0{STEP_DIGITS}d}"
    newer.mkdir()
    assert r.Runner._progress_step(newer, str(ck)) == "20"  # a marker behind the checkpoint does not pull it back
