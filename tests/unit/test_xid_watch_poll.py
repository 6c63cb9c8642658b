"""xid-watch's health poll: which polled faults drain at once (the healthcheck's own checks on the same
gathered data), one detection per fault and not per poll, no action on a node already drained by us,
never a drain from a reading NVML could not give, and a hung NVML read never piling up threads."""

from __future__ import annotations

import threading
import time

import pytest
from test_hooks_jobside import FakeCtld

from autoheal import nodeops
from autoheal.config import parse_config
from autoheal.config.hooks_section import HooksSection
from autoheal.errors import ConfigError
from autoheal.hooks import checks as C
from autoheal.hooks import engine
from autoheal.hooks import state as S
from autoheal.hooks import xid_watch as X
from autoheal.hooks.gather import GpuSample, NodeSample
from autoheal_lab.testing.hooks import hook_context


def healthy(i: int) -> GpuSample:
    return GpuSample(index=i, ok=True, pci=f"0000:{0x1b + i:02x}:00.0", persistence=True, temperature=40,
                     ecc_dbe_volatile=0, remap_pending=False, remap_failure=False, remap_uncorrectable=0,
                     pcie_gen=4, pcie_gen_max=4, pcie_width=16, pcie_width_max=16, nvlinks_down=[],
                     clock_events=0, recovery_action=0, idle=False)


def sample(*changes) -> NodeSample:
    """Two healthy GPUs, then ``(gpu, field, value)`` changes."""
    gpus = [healthy(0), healthy(1)]
    for gpu, fld, val in changes:
        setattr(gpus[gpu], fld, val)
    return NodeSample(node="n1", driver_version="550.54", count=2, gpus=gpus)


def judge(s: NodeSample):
    return C.judge_sample(s, HooksSection(), 0)


def read_ok(s: NodeSample):
    return [g.index for g in s.gpus if g.ok and not g.error]


@pytest.mark.parametrize("changes,check", [
    ([(1, "ecc_dbe_volatile", 1)], "ecc"),
    ([(1, "remap_failure", True)], "remapped-rows"),
    ([(1, "retired_pages", 61)], "retired-pages"),
    ([(1, "error", "lost"), (1, "ok", False)], "gpu-lost"),
    ([(1, "nvlinks_down", [3])], "nvlink"),
    ([(1, "recovery_action", 2)], "recovery-action"),
])
def test_hard_faults_are_the_healthchecks_own_failures(changes, check):
    results = judge(sample(*changes))
    hard = X.hard_failures(results)
    assert [(r.check, r.gpu) for r in hard] == [(check, 1)]
    assert hard[0] in [r for r in results if r.status == C.FAIL]  # the very result the healthcheck judges


@pytest.mark.parametrize("changes", [
    [(1, "temperature", 95), (1, "clock_events", C.CLOCKS_HW_THERMAL)],   # thermal: the healthcheck's
    [(1, "pcie_width", 8)],                                                # PCIe degraded: idem
    [(1, "remap_pending", True)],                                          # a reset that can wait
    [(1, "retired_pending", True), (1, "retired_pages", 2)],
    [(1, "error", "timeout"), (1, "ok", False)],                           # not read: unknown
    [(1, "error", "NVML_ERROR_UNKNOWN"), (1, "ok", False)],
])
def test_soft_pending_and_unknown_are_left_to_the_healthcheck(changes):
    results = judge(sample(*changes))
    assert X.hard_failures(results) == []
    if not any(f == "error" for _, f, _ in changes):
        assert [r for r in results if r.status == C.FAIL]  # the healthcheck does fail the node for them


def test_nvml_that_does_not_answer_never_drains():
    s = NodeSample(node="n1", init_error="NVML did not answer within 3s (nvmlInit or device count hung)")
    st = S.empty()
    assert X.poll_decision(st, judge(s), read_ok(s), 100.0) == ([], False)
    s = NodeSample(node="n1", init_error="Driver Not Loaded")  # the healthcheck's reboot, not ours
    assert X.poll_decision(st, judge(s), read_ok(s), 100.0) == ([], False)


def test_one_detection_per_fault_not_per_poll_and_a_repair_makes_it_new():
    st = S.empty()
    bad = sample((1, "ecc_dbe_volatile", 1))
    new, drain = X.poll_decision(st, judge(bad), read_ok(bad), 100.0)
    assert [r.check for r in new] == ["ecc"] and drain
    for t in (105.0, 110.0, 115.0):
        assert X.poll_decision(st, judge(bad), read_ok(bad), t) == ([], False)
    # the GPU is not read (a timeout): what is remembered stays
    unread = sample((1, "error", "timeout"), (1, "ok", False))
    X.poll_decision(st, judge(unread), read_ok(unread), 120.0)
    assert X.poll_decision(st, judge(bad), read_ok(bad), 125.0) == ([], False)
    # the GPU reads clean (reset): forgotten; the fault back later is a new one
    good = sample()
    X.poll_decision(st, judge(good), read_ok(good), 130.0)
    assert st[X.POLLED] == {}
    assert [r.check for r in X.poll_decision(st, judge(bad), read_ok(bad), 135.0)[0]] == ["ecc"]
    # a repair of that GPU while it still failed (a reset that did not help, an admin's resume): new again
    S.mark_repaired(st, 1, 140.0)
    assert [r.check for r in X.poll_decision(st, judge(bad), read_ok(bad), 145.0)[0]] == ["ecc"]
    # a repair of another GPU does not
    S.mark_repaired(st, 0, 150.0)
    assert X.poll_decision(st, judge(bad), read_ok(bad), 155.0) == ([], False)


def test_a_sample_read_before_a_repair_is_dropped_and_the_next_one_decides():
    st = S.empty()
    bad = sample((1, "ecc_dbe_volatile", 1))
    X.poll_decision(st, judge(bad), read_ok(bad), 100.0)  # acted on (remembered)
    remembered = dict(st[X.POLLED])
    # read from 110 on; Slurm resumed the node after our reboot and a hook marked it at 111 (the reboot
    # cleared the GPU after the reads): judged at 112, the sample is stale, raises nothing, forgets nothing
    S.mark_repaired(st, None, 111.0)
    assert X.sample_predates_repair(st, 1, 110.0) and X.sample_predates_repair(st, None, 110.0)
    assert X.poll_decision(st, judge(bad), read_ok(bad), 112.0, taken=110.0) == ([], False)
    good = sample()
    assert X.poll_decision(st, judge(good), read_ok(good), 112.0, taken=110.0) == ([], False)
    assert st[X.POLLED] == remembered
    # the next poll, read after the return: a fault really still there is acted on at once
    assert not X.sample_predates_repair(st, 1, 111.0)
    new, drain = X.poll_decision(st, judge(bad), read_ok(bad), 116.0, taken=115.0)
    assert [r.check for r in new] == ["ecc"] and drain


def test_a_reset_of_one_gpu_drops_only_that_gpus_part_of_a_sample_read_before_it():
    st = S.empty()
    both = sample((0, "nvlinks_down", [2]), (1, "ecc_dbe_volatile", 1))
    S.mark_repaired(st, 1, 101.0)  # GPU 1 reset while the sample was in flight
    new, drain = X.poll_decision(st, judge(both), read_ok(both), 102.0, taken=100.0)
    assert [(r.check, r.gpu) for r in new] == [("nvlink", 0)] and drain


def test_a_repair_time_far_after_the_sample_is_a_clock_step_not_a_sample_in_flight():
    # the wall clock went back an hour after a repair was marked: samples read since are not all stale
    st = S.empty()
    S.mark_repaired(st, None, 3700.0)
    assert not X.sample_predates_repair(st, 1, 100.0)
    assert X.sample_predates_repair(st, 1, 3700.0 - X.STALE_SAMPLE_WINDOW)
    bad = sample((1, "ecc_dbe_volatile", 1))
    assert [r.check for r in X.poll_decision(st, judge(bad), read_ok(bad), 101.0, taken=100.0)[0]] == ["ecc"]


@pytest.mark.parametrize("key,value", [
    ("drain", {"reason": "autoheal: xid 48 on GPU 1 of n1: double bit ECC error", "time": 99.0}),
    ("pending_drain", {"failure": {"check": "xid", "status": "fail"}, "since": 99.0}),
])
def test_a_node_already_drained_by_us_gets_nothing_new(key, value):
    st = S.empty()
    st[key] = value
    bad = sample((1, "ecc_dbe_volatile", 1))
    new, drain = X.poll_decision(st, judge(bad), read_ok(bad), 100.0)
    assert new and not drain  # remembered, not acted on: the healthcheck owns this node's recovery
    st[key] = None
    assert X.poll_decision(st, judge(bad), read_ok(bad), 105.0) == ([], False)


# ---- through xid-watch, against an in-memory slurmctld ---------------------------------------------

def make_watch(tmp_path, **hooks):
    h = HooksSection(state_dir=str(tmp_path), kernel_log="", textfile_dir="", dcgm_mapping_dir="",
                     grace_seconds=10.0, **hooks)
    ctx = hook_context(h, source="xid-watch", slurm=FakeCtld())
    return X.XidWatch(ctx), ctx


def test_polled_fault_drains_like_the_healthcheck_and_moves_the_job_once(tmp_path):
    watch, ctx = make_watch(tmp_path)
    ctx.slurm.add_job("7")
    bad = sample((1, "ecc_dbe_volatile", 1), (1, "recovery_action", 1))
    new = watch.handle_poll(judge(bad), read_ok(bad), now=100.0)
    assert sorted(r.check for r in new) == ["ecc", "recovery-action"]
    # the reason the healthcheck gives for the same sample (its worst failure, through drain_for)
    hc_watch, hc_ctx = make_watch(tmp_path / "hc")
    engine.drain_for(hc_ctx, C.worst_failure(judge(bad)))
    assert ctx.slurm.node.drain and ctx.slurm.node.reason == hc_ctx.slurm.node.reason
    assert ctx.slurm.node.reason.startswith("autoheal: ecc: GPU 1 of n1 (0000:1c:00.0): 1 uncorrectable ECC")
    assert ctx.slurm.writes("requeue") == ["requeue 7"]  # TERM: the requeue is the grace, as for an XID
    assert ctx.store.read()["drain"]["source"] == "xid-watch"
    # the next polls see the same fault: nothing more
    for t in (105.0, 110.0):
        assert watch.handle_poll(judge(bad), read_ok(bad), now=t) == []
    dets = [kw for ev, kw in ctx.records if ev == "detection"]
    assert [d["check"] for d in dets] == ["ecc", "recovery-action"]
    assert len([1 for ev, _ in ctx.records if ev == "drain"]) == 1
    assert len(ctx.slurm.writes("drain")) == 1 and ctx.slurm.writes("requeue") == ["requeue 7"]
    # the healthcheck then finds the node drained by us for it: no reason churn, no record
    calls = len(ctx.slurm.calls)
    act = engine.drain_for(ctx, C.worst_failure(judge(bad)))
    assert act.outcome == nodeops.SKIPPED_SAME and not ctx.slurm.writes("set_reason")
    assert len(ctx.slurm.calls) == calls + 1 and len(ctx.records) == len(dets) + 2  # + drain + requeue records


def test_a_drain_of_ours_an_admin_resumed_does_not_hide_a_new_fault(tmp_path):
    """The bench found it: the healthcheck's drain record outlives an admin's resume until the next
    healthcheck, and a new fault in between waited for that healthcheck."""
    watch, ctx = make_watch(tmp_path)
    ours = "autoheal: ecc: GPU 0 of n1 (0000:1b:00.0): 1 uncorrectable ECC errors"
    with ctx.store.locked() as st:
        st["drain"] = {"reason": ours, "time": 90.0, "source": "healthcheck", "check": "ecc", "gpu": 0}
    ctx.slurm.drain("n1", ours)
    bad = sample((1, "ecc_dbe_volatile", 1))
    assert watch.handle_poll(judge(bad), read_ok(bad), now=100.0) == []  # still drained by us: nothing new
    assert ctx.slurm.writes("drain") == ["drain"]  # (the test's own)
    ctx.slurm.resume("n1")  # the admin's resume; the healthcheck has not run since
    # the same fault alone is not new to the poll: it is acted on once the job side's self-check sees the
    # node back in service (closing the fault episode counts as a repair), not before
    assert watch.handle_poll(judge(bad), read_ok(bad), now=102.0) == [] and not ctx.slurm.node.drain
    # a new fault: Slurm is asked, the drain on record is stale and forgotten; the sample may predate the
    # admin's repair (a lab test clears the GPU and resumes within a second), so the next poll decides,
    # and every fault it sees is one on a node in service
    bad2 = sample((1, "ecc_dbe_volatile", 1), (0, "nvlinks_down", [2]))
    assert watch.handle_poll(judge(bad2), read_ok(bad2), now=105.0) == [] and not ctx.slurm.node.drain
    assert not ctx.store.read()["drain"]
    new = watch.handle_poll(judge(bad2), read_ok(bad2), now=time.time())
    assert sorted(r.check for r in new) == ["ecc", "nvlink"]
    assert ctx.slurm.writes("drain") == ["drain", "drain"]
    assert ctx.slurm.node.reason.startswith("autoheal: nvlink: GPU 0")
    assert ctx.store.read()["drain"]["source"] == "xid-watch"


def test_a_resume_the_poll_sees_first_forgets_the_faults_behind_our_drain_as_the_hooks_do(tmp_path):
    """CI (test_admin_resume_without_clear_faults_...): XID 79 on GPU 1 opened a fault and drained the
    node; the admin resumed it; the poll saw the GPU lost before any hook ran and forgot only the drain
    record. The XID fault stayed open, and the next healthcheck drained the node for it (the fault the
    admin had dealt with) instead of for the live one. The poll now accepts the resume as the hooks do."""
    watch, ctx = make_watch(tmp_path)
    xid79 = "xid 79 on GPU 1 of n1 (0000:1c:00.0): fallen off the bus"
    with ctx.store.locked() as st:
        st["faults"] = [{"check": "xid", "gpu": 1, "action": "replace-node", "reason": xid79, "since": 90.0}]
        st["drain"] = {"reason": f"autoheal: {xid79}", "time": 90.5, "source": "xid-watch", "check": "xid",
                       "gpu": 1}
    ctx.slurm.resume("n1")  # the admin's resume; no hook has run since
    lost = sample((1, "error", "lost"), (1, "ok", False))
    assert watch.handle_poll(judge(lost), read_ok(lost), now=100.0) == []  # the sample may predate it
    st = ctx.store.read()
    assert st["faults"] == [] and st["drain"] is None and S.repaired_at(st, 1) > 0
    assert [kw["action"] for ev, kw in ctx.records if ev == "resume"] == ["accept-resume"]
    new = watch.handle_poll(judge(lost), read_ok(lost), now=time.time())
    assert [r.check for r in new] == ["gpu-lost"]
    assert ctx.slurm.node.reason.startswith("autoheal: gpu-lost: GPU 1 of n1")
    # the healthcheck that follows judges the live GPU, not the forgotten XID: no other reason
    assert engine.drain_for(ctx, C.worst_failure(judge(lost))).outcome == nodeops.SKIPPED_SAME
    assert not ctx.store.read()["faults"]


def test_the_same_fault_on_a_node_an_admin_resumed_is_acted_on_at_the_job_sides_next_look(tmp_path):
    watch, ctx = make_watch(tmp_path)
    ours = "autoheal: ecc: GPU 1 of n1 (0000:1c:00.0): 1 uncorrectable ECC errors"
    ctx.slurm.drain("n1", ours)
    with ctx.store.locked() as st:  # the healthcheck drained
        st["drain"] = {"reason": ours, "time": 90.0, "source": "healthcheck", "check": "ecc", "gpu": 1}
    watch.jobs.step(now=91.0)  # the drain on record is new to xid-watch: it looks, the fault episode opens
    assert ctx.store.read()["episode"]
    bad = sample((1, "ecc_dbe_volatile", 1))
    assert watch.handle_poll(judge(bad), read_ok(bad), now=100.0) == []
    ctx.slurm.resume("n1")  # an admin resumed it, the GPU still bad
    watch.jobs.step(now=watch.jobs.next_check + 0.1)  # the slow self-check: back in service, episode over
    assert not ctx.store.read()["episode"]
    assert watch.handle_poll(judge(bad), read_ok(bad), now=watch.jobs.next_check) == []  # the stale record goes
    new = watch.handle_poll(judge(bad), read_ok(bad), now=time.time())  # the next poll acts
    assert [r.check for r in new] == ["ecc"] and ctx.slurm.node.drain
    assert ctx.store.read()["drain"]["source"] == "xid-watch"


def test_an_admins_drain_is_never_overwritten(tmp_path):
    watch, ctx = make_watch(tmp_path)
    ctx.slurm.drain("n1", "admin: bios update")
    bad = sample((0, "error", "lost"), (0, "ok", False))
    watch.handle_poll(judge(bad), read_ok(bad), now=100.0)
    assert ctx.slurm.node.reason == "admin: bios update"
    watch.handle_poll(judge(bad), read_ok(bad), now=105.0)
    dets = [kw for ev, kw in ctx.records if ev == "detection"]
    assert len(dets) == 1 and "already drained by someone else: admin: bios update" in dets[0]["message"], dets
    assert dets[0]["check"] == "gpu-lost"


def test_a_hung_read_skips_the_next_polls_instead_of_piling_up_threads(tmp_path, monkeypatch):
    watch, ctx = make_watch(tmp_path)
    calls = []
    monkeypatch.setattr("autoheal.hooks.gather.gather",
                        lambda node, budget, cheap=False: calls.append(budget) or sample((1, "ecc_dbe_volatile", 1)))
    release = threading.Event()
    stuck = threading.Thread(target=release.wait, args=(10,), name="nvml-gpu1", daemon=True)
    stuck.start()
    rounds, settles = [], []

    def wait(t):
        if t == X.XID_SETTLE_SECONDS:  # a new fault waits a moment for its XID before it is handed on
            settles.append(t)
            return False
        rounds.append(1)
        if len(rounds) == 3:
            release.set()
            stuck.join(5)
        return len(rounds) > 4

    monkeypatch.setattr(watch._stop, "wait", wait)
    monkeypatch.setattr(watch, "_next_poll", watch._stop.wait)  # the interval too
    watch.health_loop()
    assert calls == [ctx.hooks.nvml_timeout, ctx.hooks.nvml_timeout]  # polls 1, 2 skipped; 3 and 4 read
    assert ctx.store.read()["counters"]["health_polls_skipped_total"] == 2
    assert watch.polls.qsize() == 2  # handed to the main loop, which alone drains and moves jobs
    assert len(settles) == 2
    assert not ctx.slurm.calls


def test_healthy_polls_take_no_lock_and_write_nothing(tmp_path, monkeypatch):
    watch, ctx = make_watch(tmp_path)
    monkeypatch.setattr("autoheal.hooks.gather.gather", lambda node, budget, cheap=False: sample())
    rounds = []
    monkeypatch.setattr(watch._stop, "wait", lambda _t: rounds.append(1) or len(rounds) > 3)
    monkeypatch.setattr(watch, "_next_poll", watch._stop.wait)  # the interval too
    monkeypatch.setattr(ctx.store, "locked", lambda *a, **k: pytest.fail("a healthy poll took the lock"))
    watch.health_loop()
    assert watch.polls.empty() and not (tmp_path / "state.json").exists()


def test_a_fault_already_acted_on_takes_no_lock_on_later_polls(tmp_path, monkeypatch):
    watch, ctx = make_watch(tmp_path)
    bad = sample((1, "ecc_dbe_volatile", 1))
    watch.handle_poll(judge(bad), read_ok(bad), now=100.0)
    monkeypatch.setattr("autoheal.hooks.gather.gather", lambda node, budget, cheap=False: bad)
    rounds = []
    monkeypatch.setattr(watch._stop, "wait", lambda _t: rounds.append(1) or len(rounds) > 3)
    monkeypatch.setattr(watch, "_next_poll", watch._stop.wait)  # the interval too
    monkeypatch.setattr(ctx.store, "locked", lambda *a, **k: pytest.fail("a repeated fault took the lock"))
    watch.health_loop()
    assert watch.polls.empty()
    # once the GPU reads clean, the one poll that forgets the fault goes to the main loop
    monkeypatch.setattr("autoheal.hooks.gather.gather", lambda node, budget, cheap=False: sample())
    rounds.clear()
    watch.health_loop()
    assert watch.polls.qsize() == 3  # (not handled here: the main loop would forget it at the first)


def test_a_fault_the_xid_path_drains_meanwhile_gets_no_second_record(tmp_path, monkeypatch):
    """A DBE comes with XID 48: when the poll reads the count before the XID is handled, the moment it
    waits lets the XID path drain first, and the poll then adds nothing."""
    from autoheal.hooks.xids import XidEvent

    watch, ctx = make_watch(tmp_path)
    bad = sample((1, "ecc_dbe_volatile", 1))
    monkeypatch.setattr("autoheal.hooks.gather.gather", lambda node, budget, cheap=False: bad)
    rounds = []

    def wait(t):
        if t == X.XID_SETTLE_SECONDS:
            watch.handle([XidEvent(xid=48, gpu=1, source="nvml")], now=100.0)  # the XID arrives meanwhile
            return False
        rounds.append(1)
        return len(rounds) > 1

    monkeypatch.setattr(watch._stop, "wait", wait)
    monkeypatch.setattr(watch, "_next_poll", watch._stop.wait)  # the interval too
    watch.health_loop()
    polled = watch.polls.get_nowait()
    assert watch.handle_poll(polled.results, polled.read_ok, polled.seen, polled.taken) == []
    assert ctx.slurm.node.reason.startswith("autoheal: xid 48 on GPU 1 of n1")
    assert [kw["check"] for ev, kw in ctx.records if ev == "detection"] == ["xid"]


def test_a_sample_in_flight_across_the_return_after_our_reboot_never_drains_again(tmp_path, monkeypatch):
    """CI (test_ladder_reset_then_reboot_then_replace_and_clear_faults): the reboot rung's reboot cleared
    the DBE of gpu3 and Slurm resumed the node; xid-watch's poll had read the DBE count just before, and
    acted on it ~20 ms after the return: a second drain, for a replacement, of a node the reboot had fixed.
    Here the sample is held across the return (the job side sees it and marks the repair), then handed on."""
    watch, ctx = make_watch(tmp_path)
    ours = "autoheal: reboot: ecc: GPU 1 of n1 (0000:1c:00.0): 1 uncorrectable ECC errors"
    t0 = time.time() - 30
    ctx.slurm.drain("n1", ours)
    bad = sample((1, "ecc_dbe_volatile", 1))
    with ctx.store.locked() as st:  # the healthcheck drained for the reboot rung and asked for the reboot
        st["drain"] = {"reason": ours, "time": t0, "source": "healthcheck", "check": "ecc", "gpu": 1}
        st["reboot_requested"] = {"boot_id": "b", "time": t0}
        X.poll_decision(st, judge(bad), read_ok(bad), t0 + 1)  # the poll saw the DBE (remembered)
    watch.jobs.step(now=t0 + 2)
    assert ctx.store.read()["episode"]

    def in_flight(node, budget, cheap=False):  # the reads see the DBE; then the node returns to service
        ctx.slurm.resume("n1")  # Slurm's nextstate=resume once the rebooted node registered
        watch.jobs.step(now=time.time(), force=True)
        engine.maybe_resume(ctx, time.time())  # and the test's healthcheck run: our drain record goes
        return bad

    monkeypatch.setattr("autoheal.hooks.gather.gather", in_flight)
    rounds = []

    def wait(t):  # one poll a run; the settle moment passes at once
        if t == X.XID_SETTLE_SECONDS:
            return False
        rounds.append(1)
        return len(rounds) > 1

    monkeypatch.setattr(watch._stop, "wait", wait)
    monkeypatch.setattr(watch, "_next_poll", watch._stop.wait)
    watch.health_loop()
    st = ctx.store.read()
    assert not (st["episode"] or st["drain"]) and S.repaired_at(st, 1) > t0 + 2  # back in service
    while not watch.polls.empty():  # (the main loop's part)
        polled = watch.polls.get_nowait()
        watch.handle_poll(polled.results, polled.read_ok, polled.seen, polled.taken)
    assert not ctx.slurm.node.drain and ctx.slurm.writes("drain") == ["drain"]  # (the test's own)
    assert not [kw for ev, kw in ctx.records if ev == "detection"]
    # the next poll reads the GPU after the return: were the DBE really still there, it drains at once
    monkeypatch.setattr("autoheal.hooks.gather.gather", lambda node, budget, cheap=False: bad)
    rounds.clear()
    watch.health_loop()
    polled = watch.polls.get_nowait()
    assert [r.check for r in watch.handle_poll(polled.results, polled.read_ok, polled.seen, polled.taken)] == ["ecc"]
    assert ctx.slurm.node.drain and ctx.slurm.node.reason.startswith("autoheal: ")


def test_the_poll_interval_is_typed_and_checked():
    assert HooksSection().xid_watch_health_poll == 5.0
    assert parse_config("[hooks]\nxid_watch_health_poll = 0\n").hooks.xid_watch_health_poll == 0
    with pytest.raises(ConfigError, match="did you mean"):
        parse_config("[hooks]\nxid_watch_health_pol = 5\n")
    with pytest.raises(ConfigError):
        parse_config("[hooks]\nxid_watch_health_poll = -1\n")
    with pytest.raises(ConfigError):
        parse_config('[hooks]\nxid_watch_health_poll = "often"\n')


@pytest.mark.parametrize("poll,nvml,runs", [(5.0, True, True), (0, True, False), (5.0, False, False)])
def test_the_poll_runs_only_when_on_and_nvml_is_watched(tmp_path, monkeypatch, poll, nvml, runs):
    watch, _ = make_watch(tmp_path, xid_watch_health_poll=poll)
    ran = threading.Event()
    monkeypatch.setattr(watch, "nvml_loop", lambda: None)
    monkeypatch.setattr(watch, "health_loop", ran.set)
    watch.stop()
    watch.run(nvml=nvml, kernel_log=False)
    assert ran.wait(2.0 if runs else 0.2) is runs


def test_an_xid_154_wakes_the_health_poll_which_acts_on_the_recovery_action(tmp_path, monkeypatch):
    """XID 154 says NVML's recovery action changed: xid-watch journals it (a warning: the XID itself
    names no rung) and has the health poll read the action now instead of at its next interval; the
    action read names the drain and its rung. An XID 48 wakes nothing (its own policy acts)."""
    from autoheal.hooks.xids import XidEvent

    other, _ = make_watch(tmp_path / "other")
    other.handle([XidEvent(xid=48, gpu=0, source="nvml")], now=50.0)
    assert not other.poll_now.is_set()
    watch, ctx = make_watch(tmp_path)
    res = watch.handle([XidEvent(xid=154, gpu=1, source="nvml")], now=100.0)
    assert [(r.status, r.evidence.get("decided_by")) for r in res] == [(C.WARN, "recovery-action")]
    assert watch.poll_now.is_set() and X.recovery_changed(res)
    assert not watch._next_poll(3600.0)  # returns at once (not stopping)
    assert not watch.poll_now.is_set()
    reset = sample((1, "recovery_action", 1))
    new = watch.handle_poll(judge(reset), read_ok(reset), now=101.0)
    assert [(r.check, r.action) for r in new] == [("recovery-action", C.RESET)]
    assert ctx.slurm.node.drain and "recovery-action: GPU 1 of n1" in ctx.slurm.node.reason
    watch.stop()
    assert watch._next_poll(3600.0)  # a stop ends the wait too


def test_a_recovery_action_of_none_after_xid_154_changes_nothing(tmp_path):
    from autoheal.hooks.xids import XidEvent

    watch, ctx = make_watch(tmp_path)
    watch.handle([XidEvent(xid=154, gpu=1, source="nvml")], now=100.0)
    fine = sample()  # recovery_action 0 (NONE) on both GPUs
    assert watch.handle_poll(judge(fine), read_ok(fine), now=101.0) == []
    assert not ctx.slurm.node.drain and not ctx.slurm.calls
