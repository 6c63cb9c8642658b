"""``autoheal guard``: what it plans (pure) and what it does to the in-memory Slurm."""

from __future__ import annotations

import json

from click.testing import CliRunner

from autoheal.journal import Journal
from autoheal.sbatch_helpers.comment import CommentState
from autoheal.sbatch_helpers.guard import PRUNE, RELEASE, REQUEUE, SCHEDULE, Guard, Sightings, lost_prolog, plan
from autoheal.slurm.model import Job, Node
from autoheal_lab.testing.slurm import MemorySlurm

NODES = {"gpu1": Node("gpu1", "IDLE"), "gpu2": Node("gpu2", "IDLE", frozenset({"DRAIN"}), reason="autoheal: x"),
         "gpu3": Node("gpu3", "IDLE")}
INTENT = "autoheal-runner restarts=1 last=autoheal-drain@gpu2 step=14 state=requeueing excl=gpu2 | note"


def held_by_requeue(comment=INTENT, excluded=("spare1",), job_id="9"):
    slurm = MemorySlurm(NODES.values(), [Job(job_id=job_id, raw_id=job_id, state="RUNNING", nodes=("gpu2",),
                                             comment=comment, excluded_nodes=excluded, requeue=True)])
    slurm.requeue(job_id, hold=True)  # the runner's hold; the runner died right after it
    slurm.calls.clear()
    return slurm


def test_waits_for_the_runner_then_releases_with_the_recorded_exclusions(tmp_path):
    slurm = held_by_requeue()
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    clock = [100.0]
    guard = Guard(slurm, journal=journal, release_after=5, clock=lambda: clock[0], say=lambda s: None)
    assert guard.pass_once() == [] and slurm.writes() == []  # first sighting: give the runner its chance
    clock[0] = 103.0
    assert guard.pass_once() == []
    clock[0] = 105.5
    [res] = guard.pass_once()
    assert res.done and res.action.kind == RELEASE
    job = slurm.jobs["9"]
    assert not job.held and job.excluded_nodes == ("spare1", "gpu2")
    st = CommentState.parse(job.comment)
    assert (st.state, st.guard, st.user_comment, st.restarts) == ("requeued", "released", "note", 1)
    [rec] = list(journal.read(events=["guard-release"]))
    assert rec.job_ids == ["9"] and rec.node == "gpu2" and "released" in rec.message
    assert guard.pass_once() == []  # done: nothing more to do


def test_holds_by_users_admins_or_slurm_are_never_touched():
    # the user's own hold of an autoheal job
    slurm = MemorySlurm(NODES.values(), [Job(job_id="3", raw_id="3", state="PENDING", comment=INTENT)])
    slurm.hold("3", admin=False)
    # an admin held it again after our requeuehold: JobHeldAdmin, description kept
    slurm2 = held_by_requeue()
    slurm2.hold("9", admin=True)
    # a plain job held by requeuehold (not ours: no runner marker)
    slurm3 = held_by_requeue(comment="my own comment state=requeueing")
    for s in (slurm, slurm2, slurm3):
        guard = Guard(s, release_after=0, say=lambda t: None)
        assert guard.pass_once() == [] and s.writes() == []
        assert all(j.held for j in s.jobs.values())


def test_runner_marker_without_requeueing_intent_is_left_held():
    slurm = held_by_requeue(comment="autoheal-runner restarts=1 state=requeued")
    assert Guard(slurm, release_after=0, say=lambda t: None).pass_once() == []
    assert slurm.jobs["9"].held


def test_prunes_exclusions_of_nodes_healthy_again_but_keeps_the_users():
    job = Job(job_id="4", raw_id="4", state="PENDING", excluded_nodes=("spare1", "gpu1", "gpu2", "gpu3"),
              comment="autoheal-runner restarts=3 state=requeued excl=gpu1,gpu2,gpu3", priority=1)
    actions = plan([job], NODES, Sightings(), 0.0, 5.0)
    assert [(a.kind, a.exclusions, a.removed) for a in actions] == [(PRUNE, ("spare1", "gpu2"), ("gpu1", "gpu3"))]
    slurm = MemorySlurm(NODES.values(), [job])
    [res] = Guard(slurm, say=lambda t: None, prune_after=0).pass_once()
    assert res.done and slurm.jobs["4"].excluded_nodes == ("spare1", "gpu2")
    assert CommentState.parse(slurm.jobs["4"].comment).excl == "gpu2"
    assert Guard(slurm, say=lambda t: None, prune_after=0).pass_once() == []  # stable: nothing more to prune


def test_a_node_must_stay_healthy_before_its_exclusion_is_dropped():
    # seen on the lab: right after a slurmctld restart a drained node looked healthy for a moment, the
    # exclusion was dropped, and the job could have gone back to the faulty node
    job = Job(job_id="4", raw_id="4", state="PENDING", excluded_nodes=("gpu1",),
              comment="autoheal-runner restarts=1 state=requeued excl=gpu1", priority=1)
    sightings = Sightings()
    drained = dict(NODES, gpu1=Node("gpu1", "IDLE", frozenset({"DRAIN"}), reason="autoheal: x"))
    assert plan([job], NODES, sightings, 100.0, 5.0, prune_after=30) == []  # the glimpse
    assert plan([job], drained, sightings, 101.0, 5.0, prune_after=30) == []  # drained again
    assert plan([job], NODES, sightings, 120.0, 5.0, prune_after=30) == []  # healthy 0 s (reset)
    assert plan([job], NODES, sightings, 149.0, 5.0, prune_after=30) == []
    [action] = plan([job], NODES, sightings, 150.0, 5.0, prune_after=30)
    assert action.kind == PRUNE and action.removed == ("gpu1",)


def test_runner_wins_the_race_guard_backs_off():
    slurm = held_by_requeue()
    [action] = plan(slurm.list_jobs(), NODES, Sightings(), 0.0, 0.0)
    slurm.release("9")
    slurm.start("9", ["gpu1"])  # the runner's release landed and the job started
    res = Guard(slurm, say=lambda t: None).execute(action)
    assert not res.done and res.detail == "job is no longer pending"
    assert slurm.jobs["9"].state == "RUNNING"


def test_dry_run_changes_nothing():
    slurm = held_by_requeue()
    [res] = Guard(slurm, release_after=0, dry_run=True, say=lambda t: None).pass_once()
    assert not res.done and slurm.writes() == [] and slurm.jobs["9"].held


def test_cli_once_reports_unreachable_slurm_with_exit_2(tmp_path, monkeypatch):
    from autoheal.sbatch_helpers.guard_cli import guard

    conf = tmp_path / "autoheal.toml"
    conf.write_text('[slurm]\nbin_dir = "%s"\ntimeout = 1\nretries = 0\n[journal]\npath = "%s"\n'
                    % (tmp_path / "bin", tmp_path / "j.jsonl"))
    (tmp_path / "bin").mkdir()
    for tool in ("squeue", "sinfo", "scontrol"):
        p = tmp_path / "bin" / tool
        p.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller' >&2\nexit 1\n")
        p.chmod(0o755)
    res = CliRunner().invoke(guard, ["--once", "--json", "--config", str(conf)])
    assert res.exit_code == 2, res.output
    assert "Unable to contact" in res.output


def test_cli_once_json_lists_actions(tmp_path, monkeypatch):
    from autoheal.sbatch_helpers import guard_cli

    slurm = held_by_requeue()
    monkeypatch.setattr("autoheal.slurm.get_adapter", lambda cfg: slurm)
    conf = tmp_path / "autoheal.toml"
    conf.write_text('[journal]\npath = "%s"\n' % (tmp_path / "j.jsonl"))
    res = CliRunner().invoke(guard_cli.guard, ["--once", "--json", "--release-after", "0", "--config", str(conf)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["ok"] and out["actions"][0]["action"] == "release" and out["actions"][0]["done"]
    assert not slurm.jobs["9"].held


def test_releases_a_job_whose_runner_gave_up():
    # the runner retried for its whole budget (slurmctld away), then wrote requeue-failed and exited
    slurm = held_by_requeue(comment=INTENT.replace("state=requeueing", "state=requeue-failed"))
    [res] = Guard(slurm, release_after=0, say=lambda t: None).pass_once()
    assert res.done and not slurm.jobs["9"].held and "gpu2" in slurm.jobs["9"].excluded_nodes


# ---- schedule: an eligible requeued job is scheduled at once, not at the next backfill cycle ----------

def requeued(job_id="5", comment="autoheal-runner restarts=1 last=autoheal-drain@gpu2 step=4 state=requeued "
             "excl=gpu2", restarts=1, eligible=100, excluded=("gpu2",), **kw):
    fields = dict(state_reason="BeginTime", priority=1)
    fields.update(kw)
    return Job(job_id=job_id, raw_id=job_id, state="PENDING", comment=comment, restart_count=restarts,
               eligible_time=eligible, excluded_nodes=excluded, **fields)


def test_schedule_once_per_requeue_after_the_eligible_time():
    sightings = Sightings()
    job = requeued()
    assert plan([job], NODES, sightings, now=99.0, release_after=5) == []  # not eligible yet
    [act] = plan([job], NODES, sightings, now=100.5, release_after=5)
    assert act.kind == SCHEDULE and act.exclusions == ("gpu2",) and act.comment == job.comment
    assert plan([job], NODES, sightings, now=101.5, release_after=5) == []  # once per requeue
    again = requeued(restarts=2, eligible=200)
    assert plan([again], NODES, sightings, now=150, release_after=5) == []
    assert [a.kind for a in plan([again], NODES, sightings, now=201, release_after=5)] == [SCHEDULE]


def test_schedule_only_jobs_autoheal_requeued_and_never_held_ones():
    sightings = Sightings()
    jobs = [requeued(job_id="1", comment="my own comment"),  # requeued by someone else
            requeued(job_id="2", restarts=0),  # never requeued: Slurm schedules it as it always does
            requeued(job_id="3", priority=0, state_reason="JobHeldAdmin"),  # held: not ours to start
            requeued(job_id="4", eligible=None),
            requeued(job_id="6", comment="autoheal: requeued after xid 79 on GPU 3 of gpu2: fallen off the bus",
                     excluded=())]  # a plain job xid-watch requeued
    assert [(a.kind, a.job_id, a.exclusions) for a in plan(jobs, NODES, sightings, now=500, release_after=5)] \
        == [(SCHEDULE, "6", ())]


def test_schedule_rewrites_the_same_exclusions_and_leaves_the_comment(tmp_path):
    job = requeued()
    slurm = MemorySlurm(NODES.values(), [job])
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    said = []
    guard = Guard(slurm, journal=journal, clock=lambda: 101.0, say=said.append)
    [res] = guard.pass_once()
    assert res.done and res.action.kind == SCHEDULE
    assert slurm.writes() == [("update_job", "5", {"ExcNodeList": "gpu2"})]
    assert slurm.jobs["5"].comment == job.comment and slurm.jobs["5"].excluded_nodes == ("gpu2",)
    assert list(journal.read()) == [] and any("schedule it now" in t for t in said)  # a nudge, not an action to record
    assert guard.pass_once() == [] and len(slurm.writes()) == 1


def test_a_job_that_started_meanwhile_is_left_alone():
    slurm = MemorySlurm(NODES.values(), [requeued()])
    guard = Guard(slurm, clock=lambda: 101.0, say=lambda s: None)
    [act] = plan(slurm.list_jobs(), NODES, Sightings(), now=101.0, release_after=5)
    slurm._set(slurm.jobs["5"], state="RUNNING", nodes=("gpu1",))  # slurmctld started it between read and write
    res = guard.execute(act)
    assert not res.done and res.detail == "job is no longer pending"
    assert slurm.jobs["5"].excluded_nodes == ("gpu2",) and slurm.jobs["5"].state == "RUNNING"


def test_a_release_before_the_eligible_time_still_gets_its_schedule_later():
    slurm = held_by_requeue()
    guard = Guard(slurm, release_after=0, clock=lambda: 50.0, say=lambda s: None)
    [res] = guard.pass_once()
    assert res.action.kind == RELEASE and res.done
    job = slurm.jobs["9"]
    slurm._set(job, eligible_time=60)
    guard.clock = lambda: 61.0
    assert [r.action.kind for r in guard.pass_once()] == [SCHEDULE]


# ---- a lost prolog (soak seed 12: trainer job 4 allocated gpu1 140 ms before its slurmd was killed, RUNNING
# with reason Prolog on a responding gpu1 for the rest of the soak: Slurm sends the prolog's launch once, and
# its "missing from node" purge comes only at a registration later than BatchStartTimeout after the allocation)
WAITING = ("autoheal-runner restarts=1 last=autoheal-drain@gpu4 step=179 resumed=none nodes=gpu4 state=requeued "
           "excl=gpu4")


def in_prolog(slurmd_started, state="RUNNING", start_time=1000, eligible_time=990, comment=WAITING):
    nodes = dict(NODES, gpu1=Node("gpu1", "MIXED", slurmd_start_time=slurmd_started))
    job = Job(job_id="4", raw_id="4", state=state, nodes=("gpu1",), comment=comment, requeue=True, restart_count=1,
              batch_host="gpu1", state_reason="Prolog", start_time=start_time, eligible_time=eligible_time,
              excluded_nodes=("gpu4",))
    return MemorySlurm(nodes.values(), [job]), nodes


def test_a_job_whose_prolog_its_restarted_slurmd_never_ran_is_requeued_with_a_record(tmp_path):
    slurm, _nodes = in_prolog(slurmd_started=1007)  # killed at the allocation (1000), back 7 s later
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    clock = [1010.0]
    guard = Guard(slurm, journal=journal, lost_prolog_after=60, clock=lambda: clock[0], say=lambda s: None,
                  prolog_every=0)
    assert guard.pass_once() == [] and slurm.writes() == []  # first sighting
    clock[0] = 1069.0
    assert guard.pass_once() == []
    clock[0] = 1070.5
    [res] = guard.pass_once()
    assert res.done and res.action.kind == REQUEUE and "gpu1" in res.action.why
    job = slurm.jobs["4"]
    assert job.state == "PENDING" and job.restart_count == 2 and job.excluded_nodes == ("gpu4",)
    st = CommentState.parse(job.comment)
    assert (st.state, st.guard, st.restarts, st.excl) == ("requeued", "requeued", 1, "gpu4")
    [rec] = list(journal.read(events=["guard-requeue"]))
    assert rec.job_ids == ["4"] and "prolog lost" in rec.message
    # pending now: never requeued again, only nudged to be scheduled as any job autoheal requeued
    assert [r.action.kind for r in guard.pass_once()] == [SCHEDULE]


def test_a_prolog_still_running_or_on_a_slurmd_that_started_before_the_job_is_left_alone():
    # a long prolog of the site's on a slurmd that has been up since before the allocation
    slurm, nodes = in_prolog(slurmd_started=900)
    assert lost_prolog(slurm.jobs["4"], nodes) == []
    guard = Guard(slurm, lost_prolog_after=0, clock=lambda: 5000.0, say=lambda s: None)
    assert guard.pass_once() == [] and slurm.writes() == []
    # a slurmd that does not say when it started, or a node that does not answer (Slurm downs it itself)
    slurm, nodes = in_prolog(slurmd_started=None)
    assert lost_prolog(slurm.jobs["4"], nodes) == []
    nodes["gpu1"] = Node("gpu1", "MIXED", frozenset({"NOT_RESPONDING"}), slurmd_start_time=1007)
    assert lost_prolog(slurm.jobs["4"], nodes) == []
    # a job whose batch script runs (no Prolog reason); a plain job's lost prolog: test_guard_plain_prolog.py
    slurm, nodes = in_prolog(slurmd_started=1007)
    running = slurm.jobs["4"].__class__(**{**slurm.jobs["4"].__dict__, "state_reason": "None"})
    assert lost_prolog(running, nodes) == []


def test_without_a_start_time_the_eligible_time_only_makes_a_suspect_never_a_verdict():
    # 22.05's text listing: no start time. A slurmd restart after EligibleTime says nothing about the
    # allocation (a job that waited in the queue was allocated long after it): never requeued on it alone
    slurm, nodes = in_prolog(slurmd_started=1007, start_time=None, eligible_time=990)
    assert lost_prolog(slurm.jobs["4"], nodes) == []
    assert lost_prolog(slurm.jobs["4"], nodes, start_time=1000) == ["gpu1"]  # allocated before the restart
    assert lost_prolog(slurm.jobs["4"], nodes, start_time=1050) == []  # allocated after it
    assert plan(list(slurm.jobs.values()), nodes, Sightings(), now=1100.0, release_after=5,
                lost_prolog_after=0) == []


def test_a_lost_prolog_job_that_ended_meanwhile_is_left_alone():
    slurm, nodes = in_prolog(slurmd_started=1007)
    guard = Guard(slurm, lost_prolog_after=0, clock=lambda: 1100.0, say=lambda s: None)
    [act] = plan(slurm.list_jobs(), nodes, Sightings(), now=1100.0, release_after=5, lost_prolog_after=0)
    slurm._set(slurm.jobs["4"], state="CANCELLED")  # the user cancelled it between read and write
    res = guard.execute(act)
    assert not res.done and slurm.jobs["4"].state == "CANCELLED"
