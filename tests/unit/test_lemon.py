"""Lemon nodes (issue 22 section 4): a node that keeps failing after being returned to service is drained
'autoheal: lemon: 3 faults in 7 d (xid 79, 48, 79)', never repaired or returned again automatically, and
its history survives reboots, repairs and --clear-faults."""

from __future__ import annotations

import json
import sys
import time

from click.testing import CliRunner

from autoheal.config.hooks_section import HooksSection
from autoheal.hooks import checks as C
from autoheal.hooks import clearing, engine, lemon
from autoheal.hooks import state as S
from autoheal.hooks.xids import XidEvent
from autoheal.slurm.model import Node
from autoheal_lab.testing.hooks import hook_context
from autoheal_lab.testing.slurm import MemorySlurm

DAY = 86400.0


def ctx_for(tmp_path, slurm, **hooks):
    h = HooksSection(reset_command=[sys.executable, "-c", "pass"], resume_cooldown=0, **hooks)
    return hook_context(h, state_dir=str(tmp_path / "n1"), slurm=slurm)


def fault(ctx, xid, gpu=1):
    """An XID as xid-watch judges and drains for it."""
    with ctx.store.locked() as st:
        results = engine.xid_results(ctx, st, [XidEvent(xid, gpu=gpu)], {}, time.time())
    failure = C.worst_failure(results)
    assert failure is not None, xid
    return engine.drain_for(ctx, failure), results


def back_in_service(ctx, slurm):
    """A technician repairs the node and resumes it; the next healthcheck accepts that."""
    slurm.resume("n1")
    engine.accept_resume(ctx)


def test_pure_verdict_counts_faults_after_returns_within_the_window():
    st = {}
    now = 100 * DAY
    assert lemon.verdict(st, now, "xid", 79, 3, 7 * DAY) is None
    lemon.note_fault(st, now - 4 * DAY, "xid", 79, 3, "xid 79 ...")
    assert lemon.verdict(st, now, "xid", 79, 2, 7 * DAY) is None  # never returned to service: not a lemon
    st = {}
    lemon.note_fault(st, now - 3 * DAY, "xid", 79, 3, "xid 79 ...")
    lemon.note_return(st, now - 3 * DAY + 600, "resumed")
    lemon.note_fault(st, now - DAY, "xid", 48, 1, "xid 48 ...")
    lemon.note_return(st, now - DAY + 600, "resumed")
    lemon.note_return(st, now - DAY + 700, "seen again by another hook")  # one return per episode
    assert [e["event"] for e in st["history"]] == ["fault", "returned", "fault", "returned"]
    assert lemon.verdict(st, now, "xid", 79, 3, 7 * DAY) == "3 faults in 7 d (xid 79, 48, 79)"
    assert lemon.verdict(st, now, "xid", 79, 0, 7 * DAY) is None  # off
    assert lemon.verdict(st, now + 5 * DAY, "xid", 79, 3, 7 * DAY) is None  # the first aged out
    assert lemon.verdict(st, now, "ecc", None, 3, 7 * DAY) == "3 faults in 7 d (xid 79, xid 48, ecc)"


def test_a_node_repaired_badly_three_times_ends_a_lemon_and_stays_out(tmp_path):
    slurm = MemorySlurm([Node("n1", "IDLE", frozenset(), "")])
    ctx = ctx_for(tmp_path, slurm)
    for xid in (79, 48):
        act, _ = fault(ctx, xid)
        assert act.outcome == "drained" and not lemon.is_lemon(slurm.get_node("n1").reason)
        back_in_service(ctx, slurm)
    act, results = fault(ctx, 79)
    reason = slurm.get_node("n1").reason
    assert reason == "autoheal: lemon: 3 faults in 7 d (xid 79, 48, 79)", reason
    assert [kw["message"] for ev, kw in ctx.records if ev == "lemon"][0].startswith("n1 is a lemon: 3 faults")
    # never repaired or resumed automatically, however healthy it looks
    assert engine.maybe_repair(ctx, results, time.time()) == []
    with ctx.store.locked() as st:
        st["passes"] = 10
        st["faults"] = []
    out = engine.maybe_resume(ctx, time.time() + 3600)
    assert out.outcome.startswith("never") and slurm.get_node("n1").drain
    # the sync asks for a replacement: the reason says so (sync.remediate_reasons)
    from sync_helpers import sync_cfg

    from autoheal.k8s_sync.remediation import wants_replace

    assert wants_replace(reason, sync_cfg())
    # a later fault on the lemon keeps its reason (no churn back to a repairable fault)
    fault(ctx, 95, gpu=2)
    assert slurm.get_node("n1").reason == reason


def test_history_survives_clear_faults_and_a_new_process(tmp_path):
    slurm = MemorySlurm([Node("n1", "IDLE", frozenset(), "")])
    ctx = ctx_for(tmp_path, slurm)
    fault(ctx, 79)
    back_in_service(ctx, slurm)
    clearing.clear_faults(ctx)  # the admin's "repaired by hand"
    again = ctx_for(tmp_path, slurm)  # after a reboot: a new process reads the same state dir
    events = [e["event"] for e in lemon.history(again.store.read())]
    assert events == ["fault", "returned"]


def test_lemon_off_and_faults_while_drained_are_one_episode(tmp_path):
    slurm = MemorySlurm([Node("n1", "IDLE", frozenset(), "")])
    ctx = ctx_for(tmp_path, slurm, lemon_faults=0)
    for xid in (79, 48, 79, 48):
        fault(ctx, xid)
        back_in_service(ctx, slurm)
    assert not lemon.is_lemon(slurm.get_node("n1").reason)
    ctx = ctx_for(tmp_path / "b", MemorySlurm([Node("n1", "IDLE", frozenset(), "")]))
    for xid in (79, 48, 95, 119):  # all while drained: one fault episode, never a lemon by itself
        fault(ctx, xid, gpu=xid % 4)
    assert [e["event"] for e in lemon.history(ctx.store.read())] == ["fault"]


def test_node_history_cli(tmp_path):
    from autoheal.cli.main import cli

    slurm = MemorySlurm([Node("gpu2", "IDLE", frozenset(), "")])
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[hooks]\nstate_dir = "{tmp_path}/{{node}}"\n')
    ctx = ctx_for(tmp_path, slurm)
    ctx.node, ctx.store = "gpu2", S.NodeState(str(tmp_path / "gpu2"))
    fault(ctx, 79)
    res = CliRunner().invoke(cli, ["node", "history", "gpu2", "--config", str(cfg), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["faults_in_window"] == 1 and out["history"][0]["xid"] == 79 and out["lemon_faults"] == 3
    res = CliRunner().invoke(cli, ["node", "history", "gpu2", "--config", str(cfg)])
    assert "fault     xid 79 on GPU 1 of gpu2" in res.output and "a lemon at 3" in res.output
