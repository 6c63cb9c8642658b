"""Engine decisions with an in-memory Slurm and a real node-state file: one repair per GPU per pass,
serialised passes, clearing faults."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from autoheal.config.hooks_section import HooksSection
from autoheal.hooks import checks as C
from autoheal.hooks import clearing, engine
from autoheal.hooks import state as S
from autoheal.reasons import parse_body
from autoheal.slurm.model import Node
from autoheal_lab.testing.hooks import hook_context


class FakeSlurm:
    def __init__(self, reason="autoheal: ecc: gpu 2: 1 uncorrectable ECC errors"):
        self.node = Node("n1", "IDLE", frozenset({"DRAIN"}), reason)
        self.reboots = []

    def get_node(self, name):
        return self.node

    def reboot(self, node, reason, asap=True, nextstate="resume"):
        self.reboots.append(reason)


def make_ctx(tmp_path, **hooks):
    h = HooksSection(reset_command=[sys.executable, "-c", "pass"], **hooks)
    ctx = hook_context(h, state_dir=str(tmp_path / "state"), slurm=FakeSlurm())
    with ctx.store.locked() as st:
        st["drain"] = {"reason": ctx.slurm.node.reason, "time": 0}
    return ctx


def ecc_fault(gpu=2):
    """What one double-bit ECC error fails at once on one GPU."""
    return [C.CheckResult("ecc", C.FAIL, parse_body("ecc"), C.RESET, gpu),
            C.CheckResult("remapped-rows", C.FAIL, parse_body("rr"), C.RESET, gpu),
            C.CheckResult("recovery-action", C.FAIL, parse_body("ra"), C.RESET, gpu),
            C.CheckResult("xid", C.FAIL, parse_body("xid 48"), C.RESET, gpu)]


def test_one_reset_per_gpu_per_pass(tmp_path):
    ctx = make_ctx(tmp_path)
    done = engine.maybe_repair(ctx, ecc_fault(2) + ecc_fault(4), now=1000.0)
    assert sorted((a.kind, a.gpu) for a in done) == [("reset-gpu", 2), ("reset-gpu", 4)]
    st = ctx.store.read()
    assert [len(st["ladder"][k]["reset"]) for k in ("gpu2", "gpu4")] == [1, 1]
    # the same fault seen again after that reset climbs to a reboot, once for the node
    done = engine.maybe_repair(ctx, ecc_fault(2), now=1100.0)
    assert [a.kind for a in done] == ["reboot-node"] and len(ctx.slurm.reboots) == 1


def test_heaviest_rung_first(tmp_path):
    ctx = make_ctx(tmp_path)
    results = ecc_fault(1) + [C.CheckResult("gpu-lost", C.FAIL, parse_body("lost"), C.REBOOT, 3)]
    done = engine.maybe_repair(ctx, results, now=1000.0)
    assert [a.kind for a in done] == ["reboot-node"]  # covers GPU 1 too


def test_passes_are_serialised(tmp_path):
    store = S.NodeState(str(tmp_path / "state"))
    inside = threading.Event()
    release = threading.Event()

    def hold():
        with store.pass_lock(5):
            inside.set()
            release.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    assert inside.wait(5)
    with pytest.raises(TimeoutError):
        with store.pass_lock(0.2):
            pass
    release.set()
    t.join()
    with store.pass_lock(0.2):
        pass


def test_clear_faults_all_or_one_gpu(tmp_path):
    ctx = make_ctx(tmp_path)
    with ctx.store.locked() as st:
        S.open_fault(st, {"check": "xid", "gpu": 1, "reason": "xid 79 gpu 1", "since": 1})
        S.open_fault(st, {"check": "xid", "gpu": 2, "reason": "xid 48 gpu 2", "since": 1})
        S.record_rung(st, 1, "reset", 1.0)
        S.record_rung(st, 2, "reboot", 1.0)
        st["unknown_runs"] = {"1": 2}
    dry = clearing.clear_faults(ctx, gpu=1, dry_run=True)
    assert len(dry.faults) == 1 and list(dry.ladder) == ["gpu1"] and not ctx.records
    assert dry.to_dict()["faults"] == 1 and dry.to_dict()["ladder"] == ["gpu1"]  # the --json it always printed
    assert len(ctx.store.read()["faults"]) == 2  # dry run changed nothing
    clearing.clear_faults(ctx, gpu=1)
    st = ctx.store.read()
    assert [f["gpu"] for f in st["faults"]] == [2] and list(st["ladder"]) == ["gpu2"] and st["unknown_runs"] == {}
    assert ctx.records and ctx.records[-1][0] == "clear-faults"
    assert ctx.records[-1][1]["message"].endswith("the ladder counts of GPU 1 of n1")  # never a bare "gpu1"
    clearing.clear_faults(ctx)
    st = ctx.store.read()
    assert st["faults"] == [] and st["ladder"] == {} and st["drain"]  # our drain record stays: resume still works


class RecordingSlurm(FakeSlurm):
    """Applies drains and reason updates like slurmctld would."""

    def __init__(self, reason):
        super().__init__(reason)
        self.calls = []

    def drain(self, node, reason):
        self.calls.append(("drain", reason))
        self.node = Node("n1", "IDLE", frozenset({"DRAIN"}), reason)

    def set_reason(self, node, reason):
        self.calls.append(("set_reason", reason))
        self.node = Node("n1", "IDLE", frozenset({"DRAIN"}), reason)


def test_fault_on_a_node_drained_for_a_k8s_cordon_replaces_the_reason(tmp_path):
    ctx = make_ctx(tmp_path)
    ctx.slurm = RecordingSlurm("autoheal: k8s: node cordoned: lent to inference")
    with ctx.store.locked() as st:
        st.pop("drain", None)
    fault = C.CheckResult("xid", C.FAIL, parse_body("xid 79 gpu 3 (0000:3b:00.0): fallen off the bus"), C.REPLACE, 3)
    act = engine.drain_for(ctx, fault)
    assert act.outcome == "reason-updated"
    # the fault's rung (XID 79: replace) is in the reason that replaces the cordon's
    assert ctx.slurm.calls == [("set_reason", "autoheal: replace: xid 79 gpu 3 (0000:3b:00.0): fallen off the bus")]
    assert ctx.store.read()["drain"]["reason"].startswith("autoheal: replace: xid 79")


def test_fault_on_our_own_health_drain_keeps_the_reason(tmp_path):
    ctx = make_ctx(tmp_path)
    ctx.slurm = RecordingSlurm("autoheal: ecc: gpu 2: 1 uncorrectable ECC errors")
    fault = C.CheckResult("xid", C.FAIL, parse_body("xid 48 on GPU 3 of n1 (0000:3b:00.0): double-bit ECC error"),
                          C.RESET, 3)
    assert engine.drain_for(ctx, fault).outcome == "skipped: already drained with this reason"
    assert ctx.slurm.calls == []


def test_a_replace_rung_fault_on_our_lower_rung_drain_says_replace_at_once_and_once(tmp_path):
    """A node of ours drained for an ECC fault (reset rung) gets an XID 79: the ladder's answer for the
    node is now replace (maybe_repair would write it once the node is idle), so the reason says it now,
    and only once; the wait is announced once."""
    ctx = make_ctx(tmp_path)
    ctx.slurm = RecordingSlurm("autoheal: ecc: gpu 2: 1 uncorrectable ECC errors")
    xid = "xid 79 on GPU 3 of n1 (0000:3b:00.0): fallen off the bus"
    fault = C.CheckResult("xid", C.FAIL, parse_body(xid), C.REPLACE, 3)
    assert engine.drain_for(ctx, fault).outcome == "reason-updated"
    assert ctx.slurm.calls == [("set_reason", "autoheal: replace: " + xid)]
    assert engine.drain_for(ctx, fault).outcome == "skipped: already drained with this reason"
    assert len(ctx.slurm.calls) == 1 and [ev for ev, _ in ctx.records].count("awaiting-replacement") == 1


def test_xid_79_goes_straight_to_replace_once_the_node_is_idle(tmp_path):
    # issue 15: docs/admin-hooks.md described a reset/reboot ladder for XID 79; its policy is `replace`
    # and a lost GPU (the driver's state after XID 79) only asks for a reboot, so the replacement wins
    xid = "xid 79 on GPU 3 of n1 (0000:3b:00.0): fallen off the bus"
    results = [C.CheckResult("xid", C.FAIL, parse_body(xid), C.REPLACE, 3),
               C.CheckResult("gpu-lost", C.FAIL, parse_body("gpu-lost: GPU 3 of n1: GPU is lost"), C.REBOOT, 3)]
    ctx = make_ctx(tmp_path)
    ctx.slurm = RecordingSlurm("autoheal: " + xid)
    ctx.slurm.node = Node("n1", "MIXED", frozenset({"DRAIN"}), "autoheal: " + xid)
    with ctx.store.locked() as st:
        st["drain"] = {"reason": "autoheal: " + xid, "time": 0}
    assert engine.maybe_repair(ctx, results, now=1000.0) == []  # the job is still there: nothing yet
    ctx.slurm.node = Node("n1", "IDLE", frozenset({"DRAIN"}), "autoheal: " + xid)
    done = engine.maybe_repair(ctx, results, now=1030.0)
    assert [(a.kind, a.outcome) for a in done] == [("replace-node", "reason-updated")]
    assert ctx.slurm.calls == [("set_reason", "autoheal: replace: " + xid)] and ctx.slurm.reboots == []
    # issue 27: the wait that starts is said once, with who acts and what to run after the repair
    waits = [kw for ev, kw in ctx.records if ev == "awaiting-replacement"]
    assert len(waits) == 1 and "a person" in waits[0]["message"] and "--clear-faults" in waits[0]["message"]
    # the next health checks ask nothing more: no reset, no reboot, no second reason change
    assert [a.outcome for a in engine.maybe_repair(ctx, results, now=1060.0)] == ["already asked"]
    assert len(ctx.slurm.calls) == 1 and ctx.slurm.reboots == []
    assert set(ctx.store.read()["ladder"]["gpu3"]) == {"replace"}
    assert [ev for ev, _ in ctx.records].count("awaiting-replacement") == 1


def test_second_reboot_class_fault_gets_a_new_reboot_once_the_first_is_over(tmp_path):
    """Soak finding (issue 12): a reboot that keeps the boot id (the lab's, or one an admin cancelled)
    left ``reboot_requested`` set, and a later reboot-class fault on the node, drained again before
    xid-watch saw it back in service (or on a node without xid-watch), only answered "waiting: reboot
    already requested": the node stayed drained for good. Slurm's own flags now tell when it is over."""
    ctx = make_ctx(tmp_path)
    lost = [C.CheckResult("gpu-lost", C.FAIL, parse_body("lost"), C.REBOOT, 3)]
    assert [a.outcome for a in engine.maybe_repair(ctx, lost, now=1000.0)] == ["requested"]
    lost = [C.CheckResult("gpu-lost", C.FAIL, parse_body("lost"), C.REBOOT, 4)]  # (GPU 3 again would climb to replace)
    # Slurm shows the request: a pass for another GPU waits for it
    ctx.slurm.node = Node("n1", "IDLE", frozenset({"DRAIN", "REBOOT_REQUESTED"}), ctx.slurm.node.reason)
    assert [a.outcome for a in engine.maybe_repair(ctx, lost, now=1001.0)] == ["waiting: reboot already requested"]
    # just made, not visible in Slurm yet: still waiting
    ctx.slurm.node = Node("n1", "IDLE", frozenset({"DRAIN"}), ctx.slurm.node.reason)
    assert [a.outcome for a in engine.maybe_repair(ctx, lost, now=1002.0)] == ["waiting: reboot already requested"]
    # the reboot is over (no flag), the boot id unchanged; a new fault on another GPU: a new reboot
    other = [C.CheckResult("gpu-lost", C.FAIL, parse_body("lost"), C.REBOOT, 5)]
    done = engine.maybe_repair(ctx, other, now=1100.0)
    assert [(a.kind, a.outcome) for a in done] == [("reboot-node", "requested")]
    assert len(ctx.slurm.reboots) == 2


def in_service_ctx(tmp_path, **hooks):
    """A node in service with a job on it (MIXED), nothing of ours on it yet."""
    ctx = make_ctx(tmp_path, **hooks)
    ctx.slurm = RecordingSlurm("")
    ctx.slurm.node = Node("n1", "MIXED", frozenset(), "")
    with ctx.store.locked() as st:
        st["drain"] = None
    return ctx


def test_the_first_drain_of_an_xid_79_carries_the_replace_rung(tmp_path):
    """Drill regression (fault -> replacement in service 19 s -> 30 s): XID 79's policy starts at the
    replace rung, but the first drain said only ``autoheal: xid 79 ...`` and the replace reason waited for
    the next healthcheck on the idle node, so the sync (which acts on the rung only) waited too. The
    first drain now names the rung the ladder decided, the wait is announced once, and the repair pass
    once the node is idle asks nothing more."""
    from autoheal.hooks.xids import XidEvent
    from autoheal.reasons import Origin, Reason

    ctx = in_service_ctx(tmp_path)
    fault = C.judge_xid(XidEvent(79, gpu=3), gpu=3, pci="0000:3b:00.0", node="n1")
    assert fault.status == C.FAIL and fault.action == C.REPLACE
    act = engine.drain_for(ctx, fault)
    assert act.outcome == "drained"
    assert ctx.slurm.calls == [("drain", "autoheal: replace: " + fault.text)]
    assert Reason.parse(ctx.slurm.node.reason).rung is Origin.REPLACE  # what the sync reads
    assert ctx.store.read()["drain"]["reason"] == ctx.slurm.node.reason  # resumable as our drain
    assert set(ctx.store.read()["ladder"]["gpu3"]) == {"replace"}
    assert [ev for ev, _ in ctx.records].count("awaiting-replacement") == 1
    ctx.slurm.node = Node("n1", "IDLE", frozenset({"DRAIN"}), ctx.slurm.node.reason)  # the job left
    assert [a.outcome for a in engine.maybe_repair(ctx, [fault], now=2000.0)] == ["already asked"]
    assert len(ctx.slurm.calls) == 1 and [ev for ev, _ in ctx.records].count("awaiting-replacement") == 1


def test_the_first_drain_names_the_rung_the_site_policy_and_the_ladder_decide(tmp_path):
    """One owner: the rung in the first reason is the hooks' ladder's. A site that sets XID 79 to reset
    gets a plain fault drain (no replacement); a reset-class fault back after a reset and a reboot
    within the ladder window starts its new drain at replace."""
    from autoheal.hooks.xids import XidEvent

    ctx = in_service_ctx(tmp_path)
    reset79 = C.judge_xid(XidEvent(79, gpu=3), {"79": "reset"}, gpu=3, node="n1")
    assert reset79.action == C.RESET
    engine.drain_for(ctx, reset79)
    assert ctx.slurm.calls == [("drain", "autoheal: " + reset79.text)]
    assert "awaiting-replacement" not in [ev for ev, _ in ctx.records]

    ctx = in_service_ctx(tmp_path / "again")
    with ctx.store.locked() as st:
        S.record_rung(st, 1, "reset", time.time() - 600)
        S.record_rung(st, 1, "reboot", time.time() - 300)
    dbe = C.judge_xid(XidEvent(48, gpu=1), gpu=1, node="n1")
    assert dbe.action == C.RESET
    engine.drain_for(ctx, dbe)
    assert ctx.slurm.calls == [("drain", "autoheal: replace: " + dbe.text)]


def test_actions_are_typed_values_and_print_the_json_they_always_printed():
    """Issue 24 section 2: a hook's actions are one typed value (kind and outcome read as attributes, no
    dict keys between the parts); ``autoheal check --json`` keeps the keys each kind always had."""
    from autoheal.hooks.actions import Action, Kind

    drain = Action(Kind.DRAIN, "drained", "autoheal: xid 79 on GPU 1 of n1", previous_reason="")
    assert drain.to_dict() == {"action": "drain", "outcome": "drained", "reason": "autoheal: xid 79 on GPU 1 of n1",
                               "previous_reason": "", "dry_run": False}
    rung = Action(Kind(C.RESET.value), "ok", gpu=2, check="ecc")
    assert rung.kind is Kind.RESET and rung.kind == C.RESET and rung.rung
    assert rung.to_dict() == {"action": "reset-gpu", "outcome": "ok", "gpu": 2, "check": "ecc", "dry_run": False}
    waiting = Action(Kind.RESUME, "waiting: cooldown", "autoheal: ecc: GPU 1 of n1")
    assert waiting.to_dict() == {"action": "resume", "outcome": "waiting: cooldown",
                                 "reason": "autoheal: ecc: GPU 1 of n1"}
    accepted = Action(Kind.ACCEPT_RESUME, "node resumed by someone else", "r", faults=["xid 79"], stale_result=True)
    assert accepted.to_dict()["faults"] == ["xid 79"] and accepted.to_dict()["stale_result"] is True
    import json

    assert json.loads(json.dumps(engine.Pass(node="n1", actions=[drain, rung]).to_dict()))["actions"][1] == \
        rung.to_dict()  # JSON-ready: the enum prints as its word
