"""The guard's lost-prolog rule for jobs that are not autoheal's (CI soak seed 12, stop 34's last run: a plain
``sbatch`` job allocated gpu1 as the soak killed its slurmd, back 7 s later; the prolog's end never came and
the job sat RUNNING with reason Prolog past the soak's 180 s stranded bound, holding gpu1; the rule then
looked at autoheal's jobs only). A requeueable plain job is requeued, its comment left alone; one the user
made not requeueable, or whose requeue Slurm refuses, is reported once for a person, never touched."""

from __future__ import annotations

from autoheal.errors import SlurmError
from autoheal.journal import Journal
from autoheal.sbatch_helpers.guard import (
    REQUEUE,
    STRANDED,
    Guard,
    PrologJobs,
    Sightings,
    pending_ids,
    plan_lost_prologs,
)
from autoheal.sbatch_helpers.guard_intent import IntentStore
from autoheal.slurm.model import Job, Node
from autoheal_lab.testing.slurm import MemorySlurm

AUTOHEAL = "autoheal-runner restarts=1 last=autoheal-drain@gpu4 step=179 resumed=none nodes=gpu4 state=requeued"


def stuck(comment="", requeue=True, job_id="12"):
    """A job in Prolog on gpu1 since its allocation at 1000; gpu1's slurmd killed then and back at 1007."""
    nodes = {"gpu1": Node("gpu1", "MIXED", slurmd_start_time=1007), "gpu2": Node("gpu2", "IDLE")}
    job = Job(job_id=job_id, raw_id=job_id, state="RUNNING", nodes=("gpu1",), comment=comment, requeue=requeue,
              batch_host="gpu1", state_reason="Prolog", start_time=1000, eligible_time=990)
    return MemorySlurm(nodes.values(), [job]), nodes


class Refusing(MemorySlurm):
    """Slurm refusing the requeue of a job it cannot requeue (an interactive allocation is not a batch job)."""

    def requeue(self, job_id, hold=False):
        self._enter("requeue", str(job_id))
        raise SlurmError(f"Only batch jobs are accepted or processed for job {job_id}")


def guard_for(slurm, tmp_path, clock, **kw):
    return Guard(slurm, journal=Journal(tmp_path / "j.jsonl", fsync=False), lost_prolog_after=60,
                 clock=lambda: clock[0], say=lambda s: None, prolog_every=0,
                 intents=IntentStore(tmp_path / "intents", say=lambda s: None), **kw)


def events(tmp_path, name):
    return list(Journal(tmp_path / "j.jsonl", fsync=False).read(events=[name]))


def test_a_plain_requeueable_job_whose_prolog_was_lost_is_requeued_with_its_comment_untouched(tmp_path):
    slurm, _ = stuck(comment="lr sweep 3 of 8")
    clock = [1010.0]
    guard = guard_for(slurm, tmp_path, clock)
    assert guard.pass_once() == [] and slurm.writes() == []  # first sighting
    clock[0] = 1071.0
    [res] = guard.pass_once()
    assert res.done and res.action.kind == REQUEUE and "gpu1" in res.action.why
    job = slurm.jobs["12"]
    assert job.state == "PENDING" and job.restart_count == 1
    assert job.comment == "lr sweep 3 of 8"  # the user's comment: never rewritten
    assert slurm.writes() == [("requeue", "12")]
    [rec] = events(tmp_path, "guard-requeue")
    assert rec.job_ids == ["12"] and "prolog lost" in rec.message and rec.severity == "action"
    assert pending_ids([res]) is None


def test_a_plain_job_the_user_made_not_requeueable_is_reported_once_and_never_touched(tmp_path):
    slurm, _ = stuck(requeue=False)
    clock = [1010.0]
    guard = guard_for(slurm, tmp_path, clock)
    guard.pass_once()
    clock[0] = 1071.0
    [res] = guard.pass_once()
    assert res.done and res.action.kind == STRANDED and "Requeue=0" in res.action.why
    assert pending_ids([res]) == ["12"]  # `autoheal guard --once` exits 1: a person has to end it
    for t in (1090.0, 1200.0, 5000.0):  # still stranded: no second report, no action
        clock[0] = t
        assert guard.pass_once() == []
    assert slurm.writes() == [] and slurm.jobs["12"].state == "RUNNING"
    [rec] = events(tmp_path, "guard-stranded")
    assert rec.severity == "error" and rec.job_ids == ["12"] and "stranded" in rec.message


def test_a_plain_job_whose_requeue_slurm_refuses_is_reported_once_not_retried_every_look(tmp_path):
    _, nodes = stuck()
    slurm = Refusing(nodes.values(), [stuck()[0].jobs["12"]])
    clock = [1010.0]
    guard = guard_for(slurm, tmp_path, clock)
    guard.pass_once()
    clock[0] = 1071.0
    [res] = guard.pass_once()
    assert not res.done and res.action.kind == REQUEUE and "batch jobs" in res.detail
    for t in (1090.0, 1200.0):
        clock[0] = t
        assert guard.pass_once() == []
    assert slurm.count("requeue") == 1
    [rec] = events(tmp_path, "guard-stranded")
    assert "Slurm refused its requeue" in rec.message and "batch jobs" in rec.message
    assert events(tmp_path, "guard-requeue") == []
    assert list((tmp_path / "intents").glob("*")) == []  # the refused requeue's intent is gone


def test_an_autoheal_job_whose_requeue_is_refused_stays_retried(tmp_path):
    # the runner's job: its comment says autoheal requeues it; a refusal (slurmctld's state in flux) is
    # tried again on the next look, as before the rule covered plain jobs
    _, nodes = stuck()
    slurm = Refusing(nodes.values(), [stuck(comment=AUTOHEAL)[0].jobs["12"]])
    clock = [1010.0]
    guard = guard_for(slurm, tmp_path, clock)
    for t in (1010.0, 1071.0, 1090.0):
        clock[0] = t
        guard.pass_once()
    assert slurm.count("requeue") == 2 and events(tmp_path, "guard-stranded") == []


def test_lost_prolog_jobs_autoheal_leaves_plain_jobs_to_slurm(tmp_path):
    slurm, _ = stuck()
    clock = [1010.0]
    guard = guard_for(slurm, tmp_path, clock, prolog_jobs=PrologJobs.AUTOHEAL)
    for t in (1010.0, 1071.0, 1400.0):
        clock[0] = t
        assert guard.pass_once() == []
    assert slurm.writes() == [] and slurm.count("list_nodes") == 0  # not even looked at
    slurm, nodes = stuck(comment=AUTOHEAL)
    sightings = Sightings()
    plan_lost_prologs(list(slurm.jobs.values()), nodes, sightings, 1010.0, 60, PrologJobs.AUTOHEAL)
    [act] = plan_lost_prologs(list(slurm.jobs.values()), nodes, sightings, 1071.0, 60, PrologJobs.AUTOHEAL)
    assert act.kind == REQUEUE


def test_a_plain_job_in_prolog_on_a_slurmd_up_since_before_its_allocation_is_left_alone(tmp_path):
    # a site's long prolog (a file system mount): the slurmd that runs it has been up all along
    slurm, nodes = stuck()
    nodes["gpu1"] = Node("gpu1", "MIXED", slurmd_start_time=900)
    slurm = MemorySlurm(nodes.values(), list(slurm.jobs.values()))
    clock = [1010.0]
    guard = guard_for(slurm, tmp_path, clock)
    for t in (1010.0, 1100.0, 2000.0, 9000.0):
        clock[0] = t
        assert guard.pass_once() == []
    assert slurm.writes() == []
