"""``autoheal guard``'s lost-prolog rule: the real StartTime, the requeue's order and intent, kills at every
instant, the rule's scope by PrologFlags, and how often it lists the running jobs."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from autoheal.errors import SlurmError, SlurmUnavailable
from autoheal.journal import Journal
from autoheal.sbatch_helpers.comment import CommentState
from autoheal.sbatch_helpers.guard import REQUEUE, SCHEDULE, Guard, lost_prolog_scope
from autoheal.sbatch_helpers.guard_intent import IntentOutcome, IntentStore, RequeueIntent, outcome
from autoheal.slurm.model import Job, Node, SlurmVersion
from autoheal.slurm.show_job import start_time_from_show_job
from autoheal_lab.testing.slurm import MemorySlurm

WAITING = ("autoheal-runner restarts=1 last=autoheal-drain@gpu4 step=179 resumed=none nodes=gpu4 state=requeued "
           "excl=gpu4")


class TextListing(MemorySlurm):
    """Slurm 22.05 as the CLI backend reads it: the job listing has no start time, ``scontrol show job`` has;
    the states each listing asked for are kept."""

    def __init__(self, nodes, jobs, config=None):
        super().__init__(nodes, jobs)
        self.config = {} if config is None else config
        self.listed_states = []

    def list_jobs(self, node=None, states=None):
        self.listed_states.append(tuple(states or ()))
        return [replace(j, start_time=None) for j in super().list_jobs(node, states)]

    def job_start_time(self, job_id):
        self._enter("job_start_time", str(job_id))
        return self._job(job_id).start_time

    def show_config(self):
        return dict(self.config)


class Killed(BaseException):
    """The guard killed (SIGKILL) at this instant: nothing after it runs."""


def stuck(start_time=1000, slurmd_started=1007, eligible_time=990, comment=WAITING, config=None):
    """An autoheal job in Prolog on gpu1 since ``start_time``; gpu1's slurmd started at ``slurmd_started``."""
    nodes = [Node("gpu1", "MIXED", slurmd_start_time=slurmd_started), Node("gpu4", "IDLE", frozenset({"DRAIN"}))]
    job = Job(job_id="4", raw_id="4", state="RUNNING", nodes=("gpu1",), comment=comment, requeue=True,
              restart_count=1, batch_host="gpu1", state_reason="Prolog", start_time=start_time,
              eligible_time=eligible_time, excluded_nodes=("gpu4",))
    return TextListing(nodes, [job], config)


def guard_for(slurm, tmp_path, clock, journal=None, **kw):
    return Guard(slurm, journal=journal or Journal(tmp_path / "j.jsonl", fsync=False), lost_prolog_after=60,
                 clock=lambda: clock[0], say=lambda s: None, prolog_every=0,
                 intents=IntentStore(tmp_path / "intents", say=lambda s: None), **kw)


def changes(slurm):
    """The writes made (the start-time look-ups are reads)."""
    return [c for c in slurm.writes() if c[0] != "job_start_time"]


def records(tmp_path):
    return list(Journal(tmp_path / "j.jsonl", fsync=False).read(events=["guard-requeue"]))


# ---- the real StartTime -----------------------------------------------------------------------------------
def test_a_job_that_waited_in_the_queue_is_not_requeued_for_a_restart_before_its_allocation(tmp_path):
    # Regression: eligible at 990, slurmd restarted at 1007 while the job still waited, allocated at 1050; its
    # site prolog takes minutes. The EligibleTime (all 22.05's text listing gives) made it look lost.
    slurm = stuck(start_time=1050, slurmd_started=1007, eligible_time=990)
    clock = [1060.0]
    guard = guard_for(slurm, tmp_path, clock)
    for now in (1060.0, 1125.0, 1200.0, 1300.0):
        clock[0] = now
        assert guard.pass_once() == []
    assert changes(slurm) == [] and slurm.jobs["4"].restart_count == 1
    assert slurm.count("job_start_time") == 1  # asked once, for the one overdue suspect, then remembered


def test_the_start_time_is_asked_only_for_suspects_past_the_bound(tmp_path):
    slurm = stuck(start_time=1000, slurmd_started=1007)
    clock = [1010.0]
    guard = guard_for(slurm, tmp_path, clock)
    assert guard.pass_once() == [] and slurm.count("job_start_time") == 0  # seen, not yet overdue
    clock[0] = 1069.0
    assert guard.pass_once() == [] and slurm.count("job_start_time") == 0
    clock[0] = 1070.5
    [res] = guard.pass_once()
    assert res.done and res.action.kind == REQUEUE and slurm.count("job_start_time") == 1
    assert slurm.jobs["4"].state == "PENDING" and slurm.jobs["4"].restart_count == 2


def test_a_slurmd_start_in_the_allocations_own_second_is_taken_as_lost_only_after_five_bounds(tmp_path):
    # Regression (lab, 22.05): the slurmd killed and back 0.4 s after the allocation has the job's StartTime
    # as its start, to the second; a strict "after" left the job in Prolog for good.
    slurm = stuck(start_time=1000, slurmd_started=1000)
    clock = [1001.0]
    guard = guard_for(slurm, tmp_path, clock)
    for now in (1001.0, 1070.0, 1200.0, 1300.0):  # one bound, and up to just under five: a long prolog waits
        clock[0] = now
        assert guard.pass_once() == []
    assert changes(slurm) == []
    clock[0] = 1301.5
    [res] = guard.pass_once()
    assert res.done and res.action.kind == REQUEUE and "allocation's second" in res.action.why
    assert slurm.jobs["4"].restart_count == 2


def test_a_slurmd_started_the_second_before_the_allocation_is_never_taken_as_lost(tmp_path):
    slurm = stuck(start_time=1000, slurmd_started=999)
    clock = [1001.0]
    guard = guard_for(slurm, tmp_path, clock)
    for now in (1001.0, 1100.0, 1400.0, 2000.0):
        clock[0] = now
        assert guard.pass_once() == []
    assert changes(slurm) == []


@pytest.mark.parametrize("answer", [None, SlurmError("scontrol: garbled")])
def test_an_unknown_start_time_is_never_acted_on(tmp_path, answer):
    slurm = stuck(start_time=1000, slurmd_started=1007)
    if answer is None:
        slurm.job_start_time = lambda job_id: None  # Slurm could not say (or user text made it ambiguous)
    else:
        slurm.fail_next["job_start_time"] = [answer] * 10
    clock = [1010.0]
    guard = guard_for(slurm, tmp_path, clock)
    for now in (1010.0, 1080.0, 1200.0):
        clock[0] = now
        assert guard.pass_once() == []
    assert changes(slurm) == []


def test_show_job_start_time_counts_only_when_every_occurrence_agrees():
    line = ("JobId=7 JobName=train UserId=u(1) JobState=RUNNING Reason=Prolog Dependency=(null) "
            "SubmitTime=2026-12-03T05:00:00 EligibleTime=2026-12-03T05:00:00 StartTime=2026-12-03T05:01:40 "
            "EndTime=Unknown Command=/home/u/run.sh Comment=x")
    expected = int(time.mktime(time.strptime("2026-12-03T05:01:40", "%Y-%m-%dT%H:%M:%S")))
    assert start_time_from_show_job(line) == expected
    forged = line.replace("JobName=train", "JobName=a StartTime=2020-01-01T00:00:00")
    assert start_time_from_show_job(forged) is None  # a user's text disagrees: unknown, never acted on
    agreeing = line.replace("Comment=x", "Comment=b StartTime=2026-12-03T05:01:40")
    assert start_time_from_show_job(agreeing) == expected
    assert start_time_from_show_job(line.replace("StartTime=2026-12-03T05:01:40", "StartTime=Unknown")) is None
    assert start_time_from_show_job("") is None
    assert start_time_from_show_job(line.replace("JobName=train", "JobName=xStartTime=2020-01-01T00:00:00")) \
        == expected  # not a field of its own


# ---- the requeue first, then the comment ---------------------------------------------------------------------
def test_a_failed_requeue_leaves_the_comment_and_no_record(tmp_path):
    slurm = stuck()
    slurm.fail_next["requeue"] = [SlurmError("scontrol requeue 4: Access/permission denied")]
    clock = [1100.0]
    guard = guard_for(slurm, tmp_path, clock)
    guard.lost_prolog_after = 0
    [res] = guard.pass_once()
    assert res.action.kind == REQUEUE and not res.done and "denied" in res.detail
    assert slurm.jobs["4"].comment == WAITING and slurm.count("update_job") == 0  # the comment tells no lie
    assert records(tmp_path) == [] and guard.intents.pending() == []


def test_a_comment_that_cannot_be_written_after_the_requeue_is_said_in_the_record(tmp_path):
    slurm = stuck()
    slurm.fail_next["update_job"] = [SlurmError("scontrol update: Invalid comment")]
    guard = guard_for(slurm, tmp_path, [1100.0])
    guard.lost_prolog_after = 0
    [res] = guard.pass_once()
    assert res.done and slurm.jobs["4"].restart_count == 2 and slurm.jobs["4"].comment == WAITING
    [rec] = records(tmp_path)
    assert "requeued, its prolog lost" in rec.message and "comment could not be written" in rec.message
    assert guard.intents.pending() == []


def test_a_comment_waiting_for_slurmctld_is_written_by_the_next_pass(tmp_path):
    slurm = stuck()
    slurm.fail_next["update_job"] = [SlurmUnavailable("slurmctld not answering")]
    guard = guard_for(slurm, tmp_path, [1100.0])
    guard.lost_prolog_after = 0
    [res] = guard.pass_once()
    assert res.done and records(tmp_path) == [] and len(guard.intents.pending()) == 1
    assert [r.action.kind for r in guard.pass_once()] == [SCHEDULE]  # pending now: only nudged
    assert CommentState.parse(slurm.jobs["4"].comment).guard == "requeued" and len(records(tmp_path)) == 1
    assert slurm.count("requeue") == 1 and guard.intents.pending() == []


@pytest.mark.parametrize("instant", ["intent", "requeue", "comment", "record", "drop"])
def test_a_guard_killed_at_any_instant_is_finished_by_the_next_one_without_a_second_requeue(tmp_path, instant):
    slurm = stuck()
    journal = Journal(tmp_path / "j.jsonl", fsync=False)

    class KillingJournal(Journal):
        def record(self, *a, **kw):
            raise Killed()

    def kill_before(op, _args):
        if (instant, op) in (("requeue", "requeue"), ("comment", "update_job")):
            raise Killed()

    store = IntentStore(tmp_path / "intents", say=lambda s: None)
    if instant == "intent":
        store.add = lambda intent: (_ for _ in ()).throw(Killed())
    if instant == "drop":  # after the record, before the intent is removed
        store.drop = lambda intent: (_ for _ in ()).throw(Killed())
    slurm.before = kill_before
    first = guard_for(slurm, tmp_path, [1100.0], journal=KillingJournal(tmp_path / "j.jsonl", fsync=False)
                      if instant == "record" else journal)
    first.intents = store
    first.lost_prolog_after = 0
    with pytest.raises(Killed):
        first.pass_once()
    slurm.before = None
    second = guard_for(slurm, tmp_path, [1101.0], journal=journal)  # a new process: nothing in memory
    second.lost_prolog_after = 0
    second.pass_once()
    second.pass_once()
    job = slurm.jobs["4"]
    assert job.state == "PENDING" and job.restart_count == 2  # requeued exactly once
    assert CommentState.parse(job.comment).guard == "requeued"
    assert len(records(tmp_path)) == 1 and second.intents.pending() == []


def test_left_over_intents_are_judged_by_the_restart_count():
    intent = RequeueIntent("4", 1, WAITING, "why")
    job = Job(job_id="4", raw_id="4", state="RUNNING", restart_count=1)
    assert outcome(intent, job) is IntentOutcome.NOT_REQUEUED
    assert outcome(intent, replace(job, state="PENDING", restart_count=2)) is IntentOutcome.REQUEUED
    assert outcome(intent, None) is IntentOutcome.GONE


def test_intent_files_refuse_odd_job_ids_and_drop_unreadable_files(tmp_path):
    store = IntentStore(tmp_path, say=lambda s: None)
    with pytest.raises(OSError):
        store.add(RequeueIntent("../../etc/x", 1, None, "why"))
    (tmp_path / "requeue-4-1.json").write_text("{not json")
    assert store.pending() == [] and not (tmp_path / "requeue-4-1.json").exists()
    store.add(RequeueIntent("12_3", 0, None, "why"))
    assert IntentStore(tmp_path).pending() == [RequeueIntent("12_3", 0, None, "why")]


def test_a_plain_jobs_comment_is_never_rewritten(tmp_path):
    plain = "autoheal: requeued after xid 79 on GPU 0 of gpu3"
    slurm = stuck(comment=plain)
    guard = guard_for(slurm, tmp_path, [1100.0])
    guard.lost_prolog_after = 0
    [res] = guard.pass_once()
    assert res.done and slurm.jobs["4"].comment == plain and slurm.count("update_job") == 0


# ---- the rule's scope and its listings ---------------------------------------------------------------------
def test_the_rule_applies_only_where_slurmctld_waits_for_an_allocation_prolog():
    v = SlurmVersion(24, 11, 5)
    assert lost_prolog_scope(v, "Alloc").applies and lost_prolog_scope(v, "Alloc,Contain").applies
    assert lost_prolog_scope(SlurmVersion(26, 5, 3), "Contain,RunInJob").applies
    assert lost_prolog_scope(v, None).applies  # not known: on (it acts only on a real StartTime)
    assert not lost_prolog_scope(v, "(null)").applies and not lost_prolog_scope(v, "").applies
    assert not lost_prolog_scope(v, "X11").applies
    assert not lost_prolog_scope(v, "Alloc,NoHold").applies
    newer = lost_prolog_scope(SlurmVersion(27, 5, 0), "Alloc")
    assert newer.applies and "newer" in newer.why


def test_without_an_allocation_prolog_running_jobs_are_never_listed(tmp_path):
    slurm = stuck(config={"PrologFlags": "(null)"})
    guard = guard_for(slurm, tmp_path, [1100.0])
    guard.lost_prolog_after = 0
    assert guard.pass_once() == [] and guard.pass_once() == []
    assert slurm.listed_states == [("PENDING",), ("PENDING",)] and changes(slurm) == []


def test_running_jobs_are_listed_once_per_prolog_look_not_every_pass(tmp_path):
    slurm = stuck(config={"PrologFlags": "Alloc"})
    clock = [1000.0]
    guard = guard_for(slurm, tmp_path, clock)
    guard.prolog_every = 15
    for _ in range(16):  # 30 s of passes every 2 s
        guard.pass_once()
        clock[0] += 2
    looks = [s for s in slurm.listed_states if "RUNNING" in s]
    assert len(slurm.listed_states) == 16 and len(looks) == 2  # at 0 s and 16 s
    metrics = stuck(config={"PrologFlags": "Alloc"})
    g2 = guard_for(metrics, tmp_path, [1000.0], list_running=True)
    g2.pass_once()
    g2.pass_once()
    assert all("RUNNING" in s for s in metrics.listed_states)  # the metrics' hot-spare view needs them
