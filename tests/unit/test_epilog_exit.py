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


def test_the_epilogs_job_identity_brings_no_slurm_adapter_or_model():
    """Every epilog reads the job's node list (job_records.JobIdentity.from_env, autoheal.slurm.hostlist);
    the package's eager re-exports made that import the adapter and the Slurm model (5 ms of each epilog's
    start). Its re-exports are still there for whoever asks for them."""
    import subprocess
    import sys

    code = ("import sys\nfrom autoheal.job_records import JobIdentity\n"
            "who = JobIdentity.from_env({'SLURM_JOB_ID': '7', 'SLURM_JOB_UID': '0', 'SLURM_JOB_NODELIST': 'n[1-2]'})\n"
            "print(list(who.nodes), sorted(m for m in sys.modules if m.startswith('autoheal.slurm')))\n"
            "from autoheal.slurm import Job, SlurmAdapter\nprint(Job.__module__, SlurmAdapter.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["['n1', 'n2'] ['autoheal.slurm', 'autoheal.slurm.hostlist']",
                                       "autoheal.slurm.model autoheal.slurm.base"]
