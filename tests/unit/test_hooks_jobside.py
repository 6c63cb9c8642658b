"""The level-triggered job side of xid-watch (issue 16 finding 2) against an in-memory slurmctld that
can be down, and a real node-state file: whoever drained the node for a GPU fault, every job still
running there is signalled and requeued exactly once per job and fault, retried while slurmctld does
not answer, never given up; Slurm is asked only when there is reason to."""

from __future__ import annotations

import random

import pytest

from autoheal.config.hooks_section import HooksSection
from autoheal.errors import (
    SlurmError,
    SlurmJobAlreadyPending,
    SlurmJobFinished,
    SlurmNotFound,
    SlurmRequeueDisabled,
    SlurmUnavailable,
)
from autoheal.hooks import checks as C
from autoheal.hooks import jobside as J
from autoheal.hooks import state as S
from autoheal.reasons import parse_body
from autoheal.slurm.model import Job, JobUpdate, Node
from autoheal_lab.testing.hooks import hook_context

XID79 = C.CheckResult("xid", C.FAIL, parse_body("xid 79 on GPU 1 of n1 (0000:3b:00.0): fallen off the bus"),
                      C.REPLACE, 1,
                      {"xid": 79})


class FakeCtld:
    """Just enough slurmctld: one node, jobs, drains, signals, requeues; ``down`` answers nothing."""

    def __init__(self):
        self.node = Node("n1", "ALLOCATED", frozenset(), "")
        self.jobs = {}
        self.down = False
        self.calls = []

    def _call(self, what):
        self.calls.append(what)
        if self.down:
            raise SlurmUnavailable(f"{what}: no answer within 5s (slurmctld down or unreachable?)")

    def add_job(self, job_id, comment="", state="RUNNING"):
        self.jobs[job_id] = Job(job_id, state, ("n1",), comment=comment)

    def get_node(self, name):
        self._call("get_node")
        return self.node

    def list_jobs(self, node=None, states=None):
        self._call("list_jobs")
        return [j for j in self.jobs.values() if not states or j.state in states]

    def get_job(self, job_id):
        self._call("get_job")
        if job_id not in self.jobs:
            raise SlurmNotFound(f"job {job_id} not found")
        return self.jobs[job_id]

    def drain(self, node, reason):
        self._call("drain")
        base = "IDLE" if not self.jobs else "ALLOCATED"
        self.node = Node("n1", base, frozenset({"DRAIN"}), reason)

    def set_reason(self, node, reason):
        self._call("set_reason")
        self.node = Node("n1", self.node.state, self.node.flags, reason)

    def resume(self, node):
        self._call("resume")
        self.node = Node("n1", "IDLE", frozenset(), "")

    def signal_job(self, job_id, signal, batch=False, full=False):
        self._call(f"signal {job_id} {signal} {'batch' if batch else 'full'}")

    def update_job(self, job_id, update):
        fields = update.scontrol_fields()
        self._call(f"update {job_id}")
        self.jobs[job_id] = Job(job_id, self.jobs[job_id].state, ("n1",), comment=fields.get("Comment", ""))

    def set_job_comment(self, job_id, comment):
        self.update_job(job_id, JobUpdate(comment=comment))

    def requeue(self, job_id, hold=False):
        self._call(f"requeue {job_id}")
        self.jobs[job_id] = Job(job_id, "PENDING", (), comment=self.jobs[job_id].comment)

    def writes(self, prefix):
        return [c for c in self.calls if c.startswith(prefix)]


def make_ctx(tmp_path, **hooks):
    h = HooksSection(**{"grace_seconds": 10.0, **hooks})
    return hook_context(h, source="xid-watch", state_dir=str(tmp_path / "state"), slurm=FakeCtld())


def side(ctx):
    return J.JobSide(ctx, rng=random.Random(1))


def events(ctx, name):
    return [kw for ev, kw in ctx.records if ev == name]


@pytest.mark.parametrize("reason,ours", [
    ("autoheal: xid 79 on GPU 1 of n1 (0000:3b:00.0): fallen off the bus", True),
    ("autoheal: ecc: GPU 2 of n1: 1 uncorrectable ECC errors [root@2026-01-01T00:00:00]", True),
    ("autoheal: gpu-lost: GPU 3 of n1: unresponsive in 3 checks", True),
    ("autoheal: reboot: xid 48 on GPU 1 of n1", True),
    ("autoheal: replace: xid 79 on GPU 1 of n1", True),
    ("autoheal: k8s: node cordoned: lent to inference", False),
    ("autoheal: spare: held in the spare pool", False),
    ("autoheal: retired: replaced by spare1", False),
    ("admin: bios update", False),
    ("Prolog error", False),
    ("", False),
])
def test_health_reasons_are_only_our_hardware_drains(reason, ours):
    assert J.is_health_reason(reason) is ours


def test_node_drained_by_the_healthcheck_gets_its_jobs_requeued_once(tmp_path):
    # finding 2a: the healthcheck drained first and marked the XID seen; xid-watch never judged it
    ctx = make_ctx(tmp_path)
    ctx.slurm.add_job("7")
    ctx.slurm.drain("n1", "autoheal: " + XID79.text)
    with ctx.store.locked() as st:
        st["drain"] = {"reason": ctx.slurm.node.reason, "time": 100.0, "source": "healthcheck"}
        S.remember_xid(st, 79, 1, "0000:3b:00", 100.0)
    js = side(ctx)
    assert js.step(now=101.0)  # the drain on record is new to xid-watch: it looks at once
    # TERM (the default): the requeue is the grace (Slurm's SIGTERM .. KillWait .. SIGKILL)
    assert ctx.slurm.writes("requeue") == ["requeue 7"] and not ctx.slurm.writes("signal")
    assert ctx.slurm.jobs["7"].comment.startswith("autoheal: requeued after xid 79 on GPU 1 of n1")
    # a restarted xid-watch neither repeats it nor forgets it
    ctx.slurm.add_job("7")  # (as if it were still running: it must not be requeued twice)
    js2 = side(ctx)
    js2.step(now=102.0)
    js2.step(now=200.0, force=True)
    assert ctx.slurm.writes("requeue") == ["requeue 7"]
    assert len(events(ctx, "requeue")) == 1


def test_runner_gets_its_signal_then_a_requeue_only_if_still_running(tmp_path):
    ctx = make_ctx(tmp_path)
    ctx.slurm.add_job("8", comment="autoheal-runner restarts=0 state=running")
    ctx.slurm.add_job("9", comment="autoheal-runner restarts=0 state=running")
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
    js = side(ctx)
    js.step(now=100.0, urgent=True)
    assert ctx.slurm.node.drain
    assert sorted(ctx.slurm.writes("signal")) == ["signal 8 USR2 batch", "signal 9 USR2 batch"]
    assert not ctx.slurm.writes("requeue")
    # job 9 requeued itself (the runner does); job 8 still runs when the grace is over
    ctx.slurm.jobs["9"] = Job("9", "PENDING", ())
    assert not js.step(now=105.0)  # only a deadline to wait for: no Slurm call before it
    js.step(now=110.5)
    assert ctx.slurm.writes("requeue") == ["requeue 8"]
    assert "update 8" not in ctx.slurm.calls  # the runner writes its own comment
    done = {a["job"]: a["outcome"] for a in ctx.store.read()["job_actions"].values()}
    assert done == {"8": "requeued", "9": "no longer runs here (PENDING)"}


def test_the_fault_episode_and_the_job_comment_name_the_fault_in_text(tmp_path):
    """The episode opened by a pending drain keeps the fault's line (the state file holds text, read by
    the requeue comment and `autoheal status`), never the repr of the typed value (issue 24)."""
    ctx = make_ctx(tmp_path)
    ctx.slurm.add_job("7")
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
    side(ctx).step(now=100.0, urgent=True)
    st = ctx.store.read()
    assert st["episode"]["reason"] == "xid 79 on GPU 1 of n1 (0000:3b:00.0): fallen off the bus"
    note = st["job_actions"]["7@" + st["episode"]["id"]]["note"]
    assert note == "autoheal: requeued after xid 79 on GPU 1 of n1 (0000:3b:00.0): fallen off the bus"


def test_hot_spare_job_is_recognised_and_signalled_like_a_runner_job(tmp_path):
    ctx = make_ctx(tmp_path)
    ctx.slurm.add_job("8", comment="autoheal-runner nodes=gpu1,gpu2 state=running spares=gpu3")
    ctx.slurm.add_job("9", comment="autoheal-runner nodes=gpu1 state=running | spares=mine")  # user's part
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
    side(ctx).step(now=100.0, urgent=True)
    assert sorted(ctx.slurm.writes("signal")) == ["signal 8 USR2 batch", "signal 9 USR2 batch"]
    assert not ctx.slurm.writes("requeue")  # the runner swaps (or requeues) itself; the grace requeue waits
    hot = {a["job"]: bool(a.get("hot_spare")) for a in ctx.store.read()["job_actions"].values()}
    assert hot == {"8": True, "9": False}


def test_slurmctld_down_at_the_fault_drain_and_jobs_wait_and_are_never_given_up(tmp_path):
    # finding 2b: slurmctld dead (or SIGSTOPped) when the XID hit; xid-watch used to log and give up
    ctx = make_ctx(tmp_path, grace_signal="USR1")
    ctx.slurm.add_job("5")
    ctx.slurm.down = True
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
    js = side(ctx)
    now = 100.0
    js.step(now=now, urgent=True)
    for _ in range(40):  # many minutes of outage: retried with backoff, never dropped
        now += 15.0
        js.step(now=now)
    assert ctx.store.read()["pending_drain"], "the drain must stay pending"
    assert len(events(ctx, "error")) == 1  # said once, not on every retry
    tries = len(ctx.slurm.calls)
    assert 40 <= tries <= 60  # backoff caps at 10 s: about one attempt per loop step here
    ctx.slurm.down = False
    now += 15.0
    js.step(now=now)
    # the drain made after the outage carries XID 79's rung (replace), as any first drain does
    assert ctx.slurm.node.drain and ctx.slurm.node.reason.startswith("autoheal: replace: xid 79")
    assert ctx.slurm.writes("signal") == ["signal 5 USR1 full"]
    assert [kw["outcome"] for kw in events(ctx, "retry")] == ["slurmctld answers again"]
    js.step(now=now + 10.5)
    assert ctx.slurm.writes("requeue") == ["requeue 5"]


def test_signal_not_sent_while_slurmctld_is_stopped_is_sent_once_it_answers(tmp_path):
    ctx = make_ctx(tmp_path, grace_signal="USR1")
    ctx.slurm.add_job("5")
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
    js = side(ctx)
    orig = ctx.slurm.signal_job
    ctx.slurm.signal_job = lambda *a, **k: (_ for _ in ()).throw(SlurmUnavailable("scancel: no answer"))
    js.step(now=100.0, urgent=True)
    assert ctx.store.read()["job_actions"]["5@" + ctx.store.read()["episode"]["id"]]["stage"] == J.SIGNAL
    ctx.slurm.signal_job = orig
    js.step(now=101.0)
    js.step(now=103.0)
    assert ctx.slurm.writes("signal") == ["signal 5 USR1 full"]
    assert len(events(ctx, "signal")) == 1


def test_a_restart_after_a_signal_never_sends_it_twice(tmp_path):
    ctx = make_ctx(tmp_path, grace_signal="USR1")
    ctx.slurm.add_job("5")
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
        st["episode"] = {"id": "drain-1", "since": 100.0, "reason": XID79.text}
        J.add_action(st, "5", "drain-1", "note", 100.0, runner=False)
        st["job_actions"]["5@drain-1"].update(stage=J.SIGNALLING, signalled_at=100.0)  # crashed mid-call
    js = side(ctx)
    js.step(now=101.0)
    assert not ctx.slurm.writes("signal")
    js.step(now=110.5)
    assert ctx.slurm.writes("requeue") == ["requeue 5"]


def test_no_slurm_calls_while_quiet_only_the_slow_self_check(tmp_path):
    ctx = make_ctx(tmp_path, xid_watch_self_check=60.0)
    t0 = __import__("time").time()
    js = J.JobSide(ctx, rng=random.Random(3))
    start = js.next_check
    assert t0 <= start <= t0 + 61  # the first self-check falls somewhere in the first interval
    now = start - 30.0
    for _ in range(25):  # one housekeeping per second, healthy node, nothing on record
        now += 1.0
        js.step(now=now)
    assert ctx.slurm.calls == []
    js.step(now=start + 0.1)
    assert ctx.slurm.calls == ["get_node"]
    for _ in range(30):
        now = start + 1 + _
        js.step(now=now)
    assert ctx.slurm.calls == ["get_node"]  # the next self-check is 45..75 s later


def test_slow_self_check_catches_a_drain_nobody_recorded(tmp_path):
    # the prolog drained with a read-only state dir: nothing on record, only Slurm knows
    ctx = make_ctx(tmp_path, xid_watch_self_check=30.0)
    ctx.slurm.add_job("11")
    ctx.slurm.drain("n1", "autoheal: ecc: GPU 2 of n1 (0000:5d:00.0): 1 uncorrectable ECC errors")
    js = side(ctx)
    js.step(now=js.next_check + 0.1)
    assert ctx.slurm.writes("requeue") == ["requeue 11"]
    assert ctx.slurm.jobs["11"].comment == ("autoheal: requeued after ecc: GPU 2 of n1 (0000:5d:00.0): 1 "
                                             "uncorrectable ECC errors")


def test_foreign_and_k8s_drains_leave_jobs_alone(tmp_path):
    for reason in ("admin: bios update", "autoheal: k8s: node cordoned"):
        ctx = make_ctx(tmp_path / reason.split(":")[0])
        ctx.slurm.add_job("3")
        ctx.slurm.drain("n1", reason)
        js = side(ctx)
        js.step(now=js.next_check + 0.1)
        assert not ctx.slurm.writes("requeue") and not ctx.slurm.writes("signal"), reason


def test_our_own_fault_on_an_admin_drained_node_still_moves_the_jobs(tmp_path):
    ctx = make_ctx(tmp_path)
    ctx.slurm.add_job("4")
    ctx.slurm.drain("n1", "admin: bios update")
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
    side(ctx).step(now=100.0, urgent=True)
    assert ctx.slurm.node.reason == "admin: bios update"  # never overwritten
    assert ctx.slurm.writes("requeue") == ["requeue 4"]


def test_resume_closes_the_fault_and_ends_the_dedupe_window(tmp_path):
    ctx = make_ctx(tmp_path)
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
        S.remember_xid(st, 79, 1, "0000:3b:00", 100.0)
        st["reboot_requested"] = {"boot_id": "b", "time": 101.0}
    js = side(ctx)
    js.step(now=100.0, urgent=True)
    assert ctx.store.read()["episode"]
    assert S.seen_recently(ctx.store.read(), 79, 1, "0000:3b:00", 150.0, 120.0)
    ctx.slurm.resume("n1")  # Slurm's nextstate=resume after our reboot
    js.step(now=150.0, force=True)
    st = ctx.store.read()
    assert st["episode"] is None and st["reboot_requested"] is None
    assert not S.seen_recently(st, 79, 1, "0000:3b:00", 151.0, 120.0)  # back after the repair: new fault
    assert [e["event"] for e in st["history"]][-1:] == ["returned"]  # for the lemon count (issue 22)


def test_requeue_refused_for_good_is_journalled_and_given_up(tmp_path):
    ctx = make_ctx(tmp_path)
    ctx.slurm.add_job("6")

    def refuse(job_id, hold=False):
        ctx.slurm.calls.append(f"requeue {job_id}")
        raise SlurmError("scontrol requeue: Requeue of this job is disabled")

    ctx.slurm.requeue = refuse
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
    js = side(ctx)
    now = 100.0
    js.step(now=now, urgent=True)
    for _ in range(20):
        now += 31.0
        js.step(now=now)
    assert len(ctx.slurm.writes("requeue")) == J.MAX_REFUSALS
    assert len([e for e in events(ctx, "error") if e.get("action") == "requeue"]) == 1


def test_requeue_policy_xid_moves_only_the_jobs_of_that_gpu(tmp_path):
    ctx = make_ctx(tmp_path)
    ctx.slurm.add_job("21")
    ctx.slurm.add_job("22")
    r = C.CheckResult("xid", C.WARN, parse_body("xid 94 on GPU 0 of n1 (0000:1b:00.0): contained ECC error"),
                      C.REQUEUE, 0,
                      {"xid": 94})
    with ctx.store.locked() as st:
        J.add_requeue_fault(st, r, 100.0, ["21"])
    js = side(ctx)
    js.step(now=100.0, urgent=True)
    assert ctx.slurm.writes("requeue") == ["requeue 21"] and not ctx.slurm.node.drain
    assert ctx.slurm.jobs["21"].comment.startswith("autoheal: requeued after xid 94 on GPU 0 of n1")
    js.step(now=101.0)
    st = ctx.store.read()
    assert st["requeue_faults"] == [] and st["job_actions"] == {}  # done and pruned


@pytest.mark.parametrize("exc,writes,outcome", [
    (SlurmJobAlreadyPending("job 6 is already pending"), 1, "already requeued or finished"),
    (SlurmJobFinished("job 6 is completing"), 1, "already requeued or finished"),
    (SlurmRequeueDisabled("Requeue of this job is disabled"), 1, "requeue refused"),
])
def test_typed_requeue_outcomes_end_the_action_at_once(tmp_path, exc, writes, outcome):
    ctx = make_ctx(tmp_path)
    ctx.slurm.add_job("6")

    def requeue(job_id, hold=False):
        ctx.slurm.calls.append(f"requeue {job_id}")
        raise exc

    ctx.slurm.requeue = requeue
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
    js = side(ctx)
    js.step(now=100.0, urgent=True)
    for t in (110.0, 140.0, 200.0):
        js.step(now=t, force=True)
    assert len(ctx.slurm.writes("requeue")) == writes
    (action,) = ctx.store.read()["job_actions"].values()
    assert action["stage"] == J.DONE and action["outcome"].startswith(outcome)


def test_a_requeue_slurmctld_took_while_timing_out_is_journalled_once(tmp_path):
    # slurmctld just back from SIGSTOP, busy: the requeue times out on our side but is carried out
    ctx = make_ctx(tmp_path)
    ctx.slurm.add_job("6")
    real = ctx.slurm.requeue

    def slow(job_id, hold=False):
        real(job_id)
        raise SlurmUnavailable("scontrol requeue: no answer within 5s")

    ctx.slurm.requeue = slow
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
    js = side(ctx)
    js.step(now=100.0, urgent=True)
    ctx.slurm.requeue = real
    js.step(now=102.0)
    assert ctx.slurm.writes("requeue") == ["requeue 6"]  # not sent twice
    assert [kw["outcome"] for kw in events(ctx, "requeue")] == ["requeued (slurmctld answered late)"]


def test_a_runner_not_up_yet_gets_no_signal_that_would_kill_its_batch_shell(tmp_path):
    """Soak finding (issue 12): USR2 to the batch shell of a job whose runner has not set its handlers
    yet (an array task that just started) kills the shell: the job ends FAILED instead of requeued.
    The runner says it is up with state=running; until then xid-watch waits, and after the grace it
    requeues without a signal."""
    ctx = make_ctx(tmp_path)
    ctx.slurm.add_job("4_1", comment="autoheal-runner")  # submitted, runner not up
    ctx.slurm.add_job("4_2", comment="autoheal-runner restarts=1 state=requeued")  # the last run's state
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
    js = side(ctx)
    js.step(now=100.0, urgent=True)
    assert ctx.slurm.node.drain and not ctx.slurm.writes("signal") and not ctx.slurm.writes("requeue")
    # 4_1's runner comes up: it gets its signal; 4_2's never does
    ctx.slurm.jobs["4_1"] = Job("4_1", "RUNNING", ("n1",), comment="autoheal-runner state=running nodes=n1")
    js.step(now=101.5)
    assert ctx.slurm.writes("signal") == ["signal 4_1 USR2 batch"]
    js.step(now=110.5)
    assert "requeue 4_2" in ctx.slurm.writes("requeue") and "signal 4_2 USR2 batch" not in ctx.slurm.calls
    assert J.runner_state("autoheal-runner restarts=2 state=running | state=user") == "running"
    assert J.runner_state("autoheal-runner | state=running") == ""


def test_a_preswap_drain_seen_with_an_old_fault_episode_open_signals_nobody(tmp_path):
    """Seen in CI: XID 79 on a node (episode open, no jobs), the node repaired and resumed faster than
    xid-watch looked, then the health check drained it for a pre-emptive swap under a hot-spare job.
    xid-watch took the new drain for the old fault and sent the runner its grace signal: the runner
    requeued the job instead of swapping the node at its next checkpoint."""
    ctx = make_ctx(tmp_path)
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
    js = side(ctx)
    js.step(now=100.0, urgent=True)
    assert ctx.store.read()["episode"]
    ctx.slurm.resume("n1")
    ctx.slurm.add_job("8", comment="autoheal-runner nodes=n1,n2 state=running spares=n3")
    ctx.slurm.drain("n1", "autoheal: pre-emptive swap: row remap pending on GPU 0 of n1")
    js.step(now=150.0, force=True)
    js.step(now=200.0, force=True)
    assert not ctx.slurm.writes("signal") and not ctx.slurm.writes("requeue")
    assert ctx.store.read()["episode"] is None
    # a real fault on top of it still moves the job (the fault's drain replaces the pre-emptive reason)
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 210.0)
    js.step(now=210.0, urgent=True)
    assert ctx.slurm.writes("signal") == ["signal 8 USR2 batch"]


def test_a_fault_seen_under_an_admins_drain_is_drained_for_the_moment_theirs_ends(tmp_path):
    """CI soak seed 12: an XID 48 came while an admin's maintenance drain was on the node (kept, never
    overwritten); the admin resumed their drain, xid-watch closed the episode and the node went back in
    service with the fault, and the scheduler gave it a hot-spare job before any check drained it. The
    admin's resume of their own drain says nothing of our fault: it is drained for at that look."""
    ctx = make_ctx(tmp_path)
    ctx.slurm.drain("n1", "admin: soak maintenance 11")
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
    js = side(ctx)
    js.step(now=100.0, urgent=True)
    assert ctx.slurm.node.reason == "admin: soak maintenance 11"  # theirs is never overwritten
    ctx.slurm.resume("n1")  # the admin's maintenance is over
    js.step(now=150.0, force=True)
    assert ctx.slurm.node.drain and ctx.slurm.node.reason == "autoheal: replace: " + XID79.text
    assert ctx.store.read()["episode"]  # ours now, with its own episode


def test_a_fault_kept_behind_someone_elses_drain_and_repaired_meanwhile_is_not_drained_for_again(tmp_path):
    """CI soak seed 12 (later run): Slurm drained gpu3 "Duplicate jobid", a DBE on GPU 2 was kept behind it;
    the prolog drained for the DBE, the healthcheck reset GPU 2 and resumed the node; xid-watch then drained
    the healthy node again for the DBE the reset had cleared, and it stayed drained to the end."""
    from autoheal.hooks import state as S

    ctx = make_ctx(tmp_path)
    ctx.slurm.drain("n1", "Duplicate jobid")
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
    js = side(ctx)
    js.step(now=100.0, urgent=True)
    assert ctx.slurm.node.reason == "Duplicate jobid"
    with ctx.store.locked() as st:
        S.mark_repaired(st, XID79.gpu, 120.0)  # the GPU's reset, after the fault was kept
    ctx.slurm.resume("n1")
    js.step(now=150.0, force=True)
    assert not ctx.slurm.node.drain and ctx.store.read()["episode"] is None


def test_an_admins_resume_of_our_drain_still_ends_the_fault(tmp_path):
    """The other side of it: an admin's resume of *our* drain is their decision (accept_resume), not
    drained again."""
    ctx = make_ctx(tmp_path)
    with ctx.store.locked() as st:
        J.request_drain(st, XID79, 100.0)
    js = side(ctx)
    js.step(now=100.0, urgent=True)
    assert ctx.slurm.node.drain
    ctx.slurm.resume("n1")
    js.step(now=150.0, force=True)
    assert not ctx.slurm.node.drain and ctx.store.read()["episode"] is None


def test_a_requeued_jobs_comment_names_the_fault_not_the_nodes_rung():
    """Since the first drain of an XID 79 carries its rung (``autoheal: replace: xid 79 ...``), an episode
    xid-watch opens from the node's reason (the healthcheck drained first) would have told the job
    "requeued after replace: ...": the job is told the fault, as before."""
    from autoheal.hooks.jobside import requeue_note

    fault = "xid 79 on GPU 1 of gpu1 (0000:3b:00.0): fallen off the bus"
    want = "autoheal: requeued after " + fault
    assert requeue_note("autoheal: replace: " + fault) == want
    assert requeue_note("autoheal: reboot: " + fault) == want
    assert requeue_note("autoheal: " + fault) == want
    assert requeue_note(fault) == want  # a pending drain's fault text
    assert requeue_note("") == "autoheal: requeued after a GPU fault"


XID48 = C.CheckResult("xid", C.FAIL, parse_body("xid 48 on GPU 1 of n1 (0000:3b:00.0): double-bit ECC"),
                      C.RESET, 1, {"xid": 48})
XID74 = C.CheckResult("xid", C.FAIL, parse_body("xid 74 on GPU 2 of n1 (0000:5e:00.0): NVLink error"),
                      C.RESET, 2, {"xid": 74})


def _signal_messages(ctx, job):
    return [kw["message"] for kw in events(ctx, "signal") if kw["job_ids"] == [job]]


def test_a_second_fault_after_a_resume_xid_watch_did_not_see_names_the_second_fault(tmp_path):
    """Lab run: XID 48 drained the node and its job got its grace signal; the node was resumed and the
    next case's XID 74 came before xid-watch looked at Slurm again. The episode of the first fault was
    still open in the node state, so the new job's grace signal (and its requeue comment) named
    "xid 48 double-bit ECC" while the node was drained for XID 74."""
    ctx = make_ctx(tmp_path, grace_signal="USR1")
    ctx.slurm.add_job("7")
    with ctx.store.locked() as st:
        J.request_drain(st, XID48, 100.0)
    js = side(ctx)
    js.step(now=100.0, urgent=True)
    assert "xid 48" in _signal_messages(ctx, "7")[0]
    ctx.slurm.jobs.clear()  # job 7 ended on its signal; the node is repaired and resumed
    ctx.slurm.resume("n1")
    ctx.slurm.add_job("8")
    with ctx.store.locked() as st:  # xid-watch's next look at Slurm is this fault's
        J.request_drain(st, XID74, 130.0)
    js.step(now=130.0, urgent=True)
    assert ctx.slurm.node.reason == "autoheal: " + XID74.text
    msgs = _signal_messages(ctx, "8")
    assert len(msgs) == 1 and "xid 74 on GPU 2" in msgs[0] and "xid 48" not in msgs[0], msgs
    st = ctx.store.read()
    assert st["episode"]["reason"] == XID74.text
    note = st["job_actions"]["8@" + st["episode"]["id"]]["note"]
    assert note == "autoheal: requeued after " + XID74.text


def test_a_second_fault_drained_by_the_healthcheck_after_an_unseen_resume_names_the_second_fault(tmp_path):
    """The same with the second drain made by another hook (the healthcheck's drain_for): xid-watch
    finds the node drained and must not take that drain for the first fault's episode."""
    from autoheal.hooks.engine import drain_for

    ctx = make_ctx(tmp_path, grace_signal="USR1")
    ctx.slurm.add_job("7")
    with ctx.store.locked() as st:
        J.request_drain(st, XID48, 100.0)
    js = side(ctx)
    js.step(now=100.0, urgent=True)
    ctx.slurm.jobs.clear()
    ctx.slurm.resume("n1")
    ctx.slurm.add_job("8")
    drain_for(ctx, XID74)  # the healthcheck, between two looks of xid-watch
    js.step(now=130.0)
    msgs = _signal_messages(ctx, "8")
    assert len(msgs) == 1 and "xid 74 on GPU 2" in msgs[0] and "xid 48" not in msgs[0], msgs
