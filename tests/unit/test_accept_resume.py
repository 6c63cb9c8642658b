"""A node autoheal drained and an admin resumed (``scontrol update state=resume`` / ``autoheal node
resume``, without ``autoheal check --clear-faults``): the admin's resume is authoritative for our
record, the GPUs are checked live. Before, the open fault behind our drain made the next prolog fail
(Slurm drained the healthy node again and requeued the job, held without nohold_on_prolog_fail) and the
next healthcheck re-drain it (seen on the lab: prolog-fail detections for the new jobs, "launch failed
requeued held" with Slurm defaults)."""

from __future__ import annotations

import json

import pytest
from test_hooks_jobside import FakeCtld

from autoheal.config import Config
from autoheal.config.hooks_section import HooksSection
from autoheal.hooks import checks as C
from autoheal.hooks import engine, jobhook
from autoheal.hooks.context import Context
from autoheal.hooks.gather import GpuSample, NodeSample
from autoheal.reasons import parse_body
from autoheal.slurm.model import Node

XID79 = "xid 79 on GPU 3 of n1 (0000:5d:00.0): fallen off the bus"


def _sample(lost=()):
    gpus = [GpuSample(index=i, ok=i not in lost, error="lost" if i in lost else "", name="fake",
                      pci=f"0000:{i:02x}:00.0") for i in range(4)]
    return NodeSample(node="n1", driver_version="550.54.15", count=4, gpus=gpus)


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """A node state as the lab left it: XID 79 opened a fault at t=100, our drain landed at t=101, the
    healthcheck's last (failing) result; Slurm's node as the test sets it; live GPUs as the test says."""
    cfg = Config()
    cfg.hooks = HooksSection(state_dir=str(tmp_path / "state"), kernel_log="", expected_gpus=4, dcgm_mapping_dir="")
    cfg.journal.path = str(tmp_path / "journal.jsonl")
    ctx = Context(cfg, "n1", "prolog")
    ctx.slurm = FakeCtld()
    with ctx.store.locked() as st:
        st["faults"] = [{"check": "xid", "gpu": 3, "action": "replace-node", "reason": XID79, "since": 100.0}]
        st["drain"] = {"reason": f"autoheal: {XID79}", "time": 101.0, "source": "xid-watch", "check": "xid", "gpu": 3}
        st["last_result"] = {"time": 9e12, "status": "fail", "source": "healthcheck",
                             "results": [{"check": "xid", "status": "fail", "reason": XID79, "action": "replace-node",
                                          "gpu": 3}]}
    monkeypatch.setattr(Context, "load", classmethod(lambda cls, source, *a, **k: ctx))
    live = {"lost": ()}
    monkeypatch.setattr(engine, "gather", lambda node, budget, cheap=False: _sample(live["lost"]))
    ctx.live = live
    ctx.journal_path = tmp_path / "journal.jsonl"
    return ctx


def _records(ctx):
    if not ctx.journal_path.exists():
        return []
    return [json.loads(x) for x in ctx.journal_path.read_text().splitlines()]


def test_prolog_after_an_admin_resume_runs_the_job_on_healthy_gpus(lab):
    lab.slurm.node = Node("n1", "IDLE", frozenset(), "")  # the admin resumed it
    assert jobhook.run("prolog") == 0
    assert lab.slurm.writes("drain") == [] and lab.slurm.node.reason == ""
    st = lab.store.read()
    assert st["faults"] == [] and st["drain"] is None
    assert st["last_result"]["status"] == "ok"  # the full live check the prolog ran instead
    rec = [r for r in _records(lab) if r["action"] == "accept-resume"]
    assert len(rec) == 1 and rec[0]["evidence"]["faults"] == [XID79]


def test_prolog_after_an_admin_resume_still_fails_a_gpu_that_is_really_bad(lab):
    lab.slurm.node = Node("n1", "IDLE", frozenset(), "")
    lab.live["lost"] = (3,)
    assert jobhook.run("prolog") == 1
    assert lab.slurm.node.drain and lab.slurm.node.reason.startswith("autoheal: gpu-lost: GPU 3 of n1")


def test_prolog_before_the_resume_keeps_failing(lab):
    """The job was placed just before our drain landed: the node is drained, the fault stands."""
    lab.slurm.node = Node("n1", "ALLOCATED", frozenset({"DRAIN"}), f"autoheal: {XID79}")
    assert jobhook.run("prolog") == 1
    assert lab.store.read()["faults"][0]["reason"] == XID79


def test_admin_took_over_our_drain_then_resumed(lab):
    """Re-drained with the admin's own reason (a repair), then resumed: the same as a plain resume."""
    lab.slurm.node = Node("n1", "IDLE", frozenset({"DRAIN"}), "RMA GPU 3 [admin]")
    assert jobhook.run("prolog") == 1  # cannot happen in Slurm (drained), but the fault must stand
    lab.slurm.node = Node("n1", "IDLE", frozenset(), "")
    assert jobhook.run("prolog") == 0


def test_a_fault_opened_after_our_drain_was_never_seen_by_the_admin(lab):
    with lab.store.locked() as st:
        st["faults"].append({"check": "xid", "gpu": 1, "action": "reset-gpu", "reason": "xid 48 on GPU 1 of n1",
                             "since": 150.0})
    lab.slurm.node = Node("n1", "IDLE", frozenset(), "")
    assert jobhook.run("prolog") == 1
    assert [f["gpu"] for f in lab.store.read()["faults"]] == [1]
    assert lab.slurm.node.reason == "autoheal: xid 48 on GPU 1 of n1"


def test_slurm_not_answering_leaves_the_record_standing(lab):
    lab.slurm.node = Node("n1", "IDLE", frozenset(), "")
    lab.slurm.down = True
    assert jobhook.run("prolog") == 1  # could not tell: the fault stands (the drain itself fails too)
    assert lab.store.read()["faults"] and lab.store.read()["drain"]


def test_without_a_drain_of_ours_an_open_fault_still_fails(lab):
    """A fault whose drain never landed (or was someone else's) is real and unacted on."""
    with lab.store.locked() as st:
        st["drain"] = None
    lab.slurm.node = Node("n1", "IDLE", frozenset(), "")
    assert jobhook.run("prolog") == 1
    # XID 79's policy starts at the replace rung: the first drain says so (the sync acts on it at once)
    assert "get_node" in lab.slurm.calls and lab.slurm.node.reason == f"autoheal: replace: {XID79}"


def test_healthcheck_after_an_admin_resume_does_not_drain_the_node_again(lab):
    lab.source = "healthcheck"
    lab.slurm.node = Node("n1", "IDLE", frozenset(), "")
    p = engine.health_pass(lab, now=1000.0)
    assert p.exit_code == engine.EXIT_OK, p.to_dict()
    assert lab.slurm.writes("drain") == [] and lab.slurm.writes("set_reason") == []
    assert [a.kind for a in p.actions] == ["accept-resume"]


def test_healthcheck_while_still_drained_keeps_the_fault(lab):
    lab.source = "healthcheck"
    lab.slurm.node = Node("n1", "IDLE", frozenset({"DRAIN"}), f"autoheal: {XID79}")
    p = engine.health_pass(lab, now=1000.0)
    assert p.exit_code == engine.EXIT_FAIL and lab.store.read()["faults"]


def test_the_same_xid_back_after_the_resume_is_a_new_fault(lab):
    lab.slurm.node = Node("n1", "IDLE", frozenset(), "")
    assert engine.accept_resume(lab, now=500.0) is not None
    st = lab.store.read()
    assert st["repaired"]["node"] == 500.0  # ends the dedupe window: the ladder climbs if it returns
    assert engine.accept_resume(lab, now=501.0) is None  # nothing left to forget: Slurm is not asked
    assert lab.slurm.calls.count("get_node") == 1


def test_a_drain_record_left_by_a_technicians_resume_is_replaced_by_the_next_drain(lab):
    """Soak seed 2, gpu4: a technician cleared the faults and resumed the node (`autoheal node resume`), the
    next healthcheck found a new fault and drained, but kept the old drain record; the pass after it read
    "our record names another reason than Slurm's" as someone else's re-drain and forgot it, and nobody
    ever resumed gpu4. The new drain's record replaces the stale one, and the node is resumed once healthy."""
    with lab.store.locked() as st:
        st["faults"] = []  # the technician's --clear-faults; the drain record stays
        st["last_result"] = None
    lab.slurm.node = Node("n1", "IDLE", frozenset(), "")  # the technician's resume
    pcie = C.CheckResult("pcie", C.FAIL, parse_body("pcie: GPU 1 of n1 (0000:3b:00.0): link x8 below x16"), C.DRAIN, 1)
    engine.drain_for(lab, pcie)
    assert lab.slurm.node.drain and lab.store.read()["drain"]["reason"] == lab.slurm.node.reason
    with lab.store.locked() as st:
        st["passes"] = 99
        st["drain"]["time"] = 0.0  # past the cool-down
    assert engine.maybe_resume(lab, now=1e10).outcome == "resumed"
    assert not lab.slurm.node.drain
