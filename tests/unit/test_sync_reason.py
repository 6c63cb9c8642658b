"""Reason ping-pong (issue 16 finding 9): the drain reason autoheal sync writes for a cordon is compared
in the form Slurm stores and gives back, so a hostile cordon-reason annotation is written once.

What scontrol 22.05 does to a reason (observed on the lab; tests/integration/test_sync_lab.py checks the
real thing): one trailing double quote is dropped; control characters are kept; the one-line output
(`scontrol show node -o`) appends `[user@time]` and its parser cuts the reason at ` Comment=`,
` Extra=`, ` ExtraReason=`; JSON readers give the text back whole."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sync_helpers import k8s_name, memory_world, sync_cfg

from autoheal.k8s_sync import names
from autoheal.k8s_sync.engine import Reconciler
from autoheal.slurm.parse import node_from_oneliner

TRICKY = [
    'lent to inference"',
    'say "hi"',
    'x"""',
    "ticket Comment=INC-1",
    "a Extra=b ExtraReason=c",
    "owner [bob@lab]",
    "owner [bob@2026-01-01T00:00:00]",
    "two [a@b] [c@d]",
    "tab\there\nnewline\x01ctl",
    "trailing space   ",
    "x" * 400,
    "ends in bracket]",
    'quote then suffix [a@b]"',
]


def scontrol_store(reason: str) -> str:
    """What `scontrol update ... reason=<r>` stores (22.05: drops one trailing double quote)."""
    return reason[:-1] if reason.endswith('"') else reason


def read_oneliner(stored: str) -> str:
    """The reason as `scontrol show node -o` prints it and the core's parser reads it back."""
    line = f"NodeName=n1 Arch=x86_64 State=IDLE+DRAIN Reason={stored} [root@2026-02-03T04:05:06]"
    return node_from_oneliner(line).reason


@pytest.mark.parametrize("detail", TRICKY)
def test_written_reason_reads_back_equal_through_every_reader(detail):
    want = names.k8s_reason("node cordoned", detail)
    stored = scontrol_store(want)
    assert stored == want  # nothing left for scontrol to change
    for read in (stored, read_oneliner(stored)):  # JSON readers give the text whole
        assert names.same_reason(read, want), (read, want)
    assert len(want) <= 200 and want.isprintable()


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=0, max_size=300))
def test_slurm_reason_is_idempotent_and_survives_scontrol(text):
    once = names.slurm_reason("autoheal: k8s: node cordoned: " + text)
    assert names.slurm_reason(once) == once
    assert scontrol_store(once) == once
    assert names.same_reason(read_oneliner(once), once)


class ScontrolLikeSlurm:
    """Wraps a MemorySlurm so that writes are stored as scontrol stores them."""

    def __init__(self, inner):
        self.inner = inner
        self.writes = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def drain(self, node, reason):
        self.writes.append(("drain", reason))
        self.inner.drain(node, scontrol_store(reason))

    def set_reason(self, node, reason):
        self.writes.append(("set_reason", reason))
        self.inner.set_reason(node, scontrol_store(reason))

    def get_node(self, name):  # the engine re-reads through `scontrol show node -o`
        n = self.inner.get_node(name)
        return replace(n, reason=read_oneliner(n.reason) if n.reason else "")


@pytest.mark.parametrize("detail", TRICKY)
def test_cordon_with_a_hostile_reason_annotation_drains_once(detail):
    inner, kube = memory_world(["n1", "n2"])
    slurm = ScontrolLikeSlurm(inner)
    kube.nodes[k8s_name("n1")]["metadata"]["annotations"]["autoheal.io/cordon-reason"] = detail
    kube.nodes[k8s_name("n1")]["spec"]["unschedulable"] = True
    r = Reconciler(slurm, kube, sync_cfg())
    for _ in range(6):
        assert r.run_pass().ok
    assert [w[0] for w in slurm.writes] == ["drain"], slurm.writes
    assert r.run_pass().planned == []


def test_reason_an_older_version_wrote_unnormalised_counts_as_equal():
    inner, kube = memory_world(["n1"])
    slurm = ScontrolLikeSlurm(inner)
    inner.drain("n1", "autoheal: k8s: node cordoned: ticket Comment=INC-1")  # written by an older version
    kube.nodes[k8s_name("n1")]["metadata"]["annotations"]["autoheal.io/cordon-reason"] = "ticket Comment=INC-1"
    kube.nodes[k8s_name("n1")]["spec"]["unschedulable"] = True
    r = Reconciler(slurm, kube, sync_cfg())
    for _ in range(4):
        r.run_pass()
    assert slurm.writes == []  # the same text up to what Slurm changes: nothing to rewrite
