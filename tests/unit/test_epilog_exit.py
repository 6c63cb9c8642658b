"""The epilog's exit code. A failed prolog is how Slurm requeues a job off a bad node (exit 1); a failed
epilog only makes Slurm drain the node "Epilog error", a reason autoheal never owns or resumes. So the
epilog exits 1 only when our own drain could not be put in place (slurmctld did not answer): then Slurm's
drain is the fallback. Before, it exited 1 on every fault it found, and an admin's resume in the moment
before the epilog ended (seen in CI: 11 ms) left the node drained "Epilog error" for a human to clear."""

from __future__ import annotations

import pytest
from test_accept_resume import _sample
from test_hooks_jobside import FakeCtld

from autoheal.config import Config
from autoheal.config.hooks_section import HooksSection
from autoheal.hooks import engine, jobhook
from autoheal.hooks.context import Context
from autoheal.slurm.model import Node

LOST = "autoheal: gpu-lost: GPU 2 of n1"


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A node whose GPU 2 is lost (live), a job that just ended on it, Slurm's node as the test sets it."""
    cfg = Config()
    cfg.hooks = HooksSection(state_dir=str(tmp_path / "state"), kernel_log="", expected_gpus=4, dcgm_mapping_dir="")
    cfg.journal.path = str(tmp_path / "journal.jsonl")
    ctx = Context(cfg, "n1", "epilog")
    ctx.slurm = FakeCtld()
    ctx.slurm.node = Node("n1", "IDLE", frozenset(), "")
    monkeypatch.setattr(Context, "load", classmethod(lambda cls, source, *a, **k: ctx))
    monkeypatch.setattr(engine, "gather", lambda n, budget, cheap=False: _sample((2,)))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    return ctx


def test_epilog_that_drains_the_node_itself_exits_0(node):
    assert jobhook.run("epilog") == 0
    assert node.slurm.node.drain and node.slurm.node.reason.startswith(LOST)


def test_epilog_on_a_node_already_carrying_our_drain_exits_0(node):
    node.slurm.node = Node("n1", "IDLE", frozenset({"DRAIN"}), "autoheal: gpu-lost: GPU 2 of n1: GPU is lost")
    assert jobhook.run("epilog") == 0
    assert node.slurm.writes("drain") == [] and node.slurm.writes("set_reason") == []


def test_epilog_on_a_node_an_admin_drained_exits_0_and_leaves_the_reason(node):
    node.slurm.node = Node("n1", "IDLE", frozenset({"DRAIN"}), "RMA GPU 2 [admin]")
    assert jobhook.run("epilog") == 0
    assert node.slurm.node.reason == "RMA GPU 2 [admin]" and node.slurm.writes("drain") == []


def test_epilog_whose_drain_fails_exits_1_so_slurm_drains_the_node(node):
    node.slurm.down = True  # slurmctld does not answer: Slurm's own "Epilog error" drain is the fallback
    assert jobhook.run("epilog") == 1


def test_prolog_still_exits_1_on_a_fault_even_with_our_drain_in_place(node):
    node.source = "prolog"
    assert jobhook.run("prolog") == 1  # the one way to have Slurm requeue the job off this node
    assert node.slurm.node.reason.startswith(LOST)
