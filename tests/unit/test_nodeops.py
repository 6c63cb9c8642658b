"""Ownership-aware drain/resume: decision tables and behaviour against a fake Slurm."""

from __future__ import annotations

from typing import Dict, List, Optional

import pytest

from autoheal import nodeops
from autoheal.errors import SlurmNotFound
from autoheal.nodeops import (
    DRAINED,
    REASON_UPDATED,
    RESUMED,
    SKIPPED_FOREIGN,
    SKIPPED_NOT_DRAINED,
    SKIPPED_NOT_OURS,
    SKIPPED_SAME,
    plan_drain,
    plan_resume,
)
from autoheal.slurm.base import SlurmAdapter
from autoheal.slurm.model import Job, Node, SlurmVersion, parse_state

OURS = "autoheal: xid 79: gpu 3 fell off the bus"
ADMIN = "bad dimm, ticket 4711"


def node(state: str, reason: str = "", name: str = "gpu1") -> Node:
    base, flags = parse_state(state)
    return Node(name=name, state=base, flags=flags, reason=reason)


class FakeSlurm(SlurmAdapter):
    """In-memory Slurm: nodes by name; every write is recorded and applied."""

    name = "fake"
    WRITES = ("drain", "resume", "set_reason", "reboot", "requeue", "release", "update_job", "signal_job")

    def __init__(self, nodes: List[Node], reads: Optional[List[Node]] = None):
        self.nodes: Dict[str, Node] = {n.name: n for n in nodes}
        self.calls: List[tuple] = []
        self._scripted_reads = list(reads or [])  # returned by get_node in order, before the live state

    # reads
    def version(self) -> SlurmVersion:
        return SlurmVersion(24, 11, 5)

    def list_nodes(self) -> List[Node]:
        self.calls.append(("list_nodes",))
        return list(self.nodes.values())

    def get_node(self, name: str) -> Node:
        self.calls.append(("get_node", name))
        if self._scripted_reads:
            return self._scripted_reads.pop(0)
        if name not in self.nodes:
            raise SlurmNotFound(f"node {name!r} not found")
        return self.nodes[name]

    def list_jobs(self, node=None, states=None) -> List[Job]:
        return []

    def show_config(self) -> Dict[str, str]:
        return {}

    def ping(self) -> bool:
        return True

    # writes
    def drain(self, node: str, reason: str) -> None:
        self.calls.append(("drain", node, reason))
        old = self.nodes[node]
        self.nodes[node] = Node(node, old.state, old.flags | {"DRAIN"}, reason)

    def resume(self, node: str) -> None:
        self.calls.append(("resume", node))
        old = self.nodes[node]
        self.nodes[node] = Node(node, "IDLE" if old.state == "DOWN" else old.state, old.flags - {"DRAIN"}, "")

    def set_reason(self, node: str, reason: str) -> None:
        self.calls.append(("set_reason", node, reason))
        old = self.nodes[node]
        self.nodes[node] = Node(node, old.state, old.flags, reason)

    def reboot(self, node, reason, asap=True, nextstate="resume"):
        self.calls.append(("reboot", node, reason))

    def requeue(self, job_id, hold=False):
        self.calls.append(("requeue", job_id))

    def release(self, job_id):
        self.calls.append(("release", job_id))

    def update_job(self, job_id, update):
        self.calls.append(("update_job", job_id, update.scontrol_fields()))

    def signal_job(self, job_id, signal, batch=False, full=False):
        self.calls.append(("signal_job", job_id, signal))

    def writes(self) -> List[tuple]:
        return [c for c in self.calls if c[0] in self.WRITES]


# ---- decision tables ----------------------------------------------------------------------------------

@pytest.mark.parametrize("state, reason, want, expected", [
    ("IDLE", "", OURS, DRAINED),
    ("MIXED", "", OURS, DRAINED),
    ("ALLOCATED", "", OURS, DRAINED),
    ("IDLE+DRAIN", ADMIN, OURS, SKIPPED_FOREIGN),
    ("MIXED+DRAIN", ADMIN + " [root@2026-01-01T00:00:00]", OURS, SKIPPED_FOREIGN),
    ("DOWN*", "Not responding", OURS, SKIPPED_FOREIGN),
    ("DOWN*+DRAIN", ADMIN, OURS, SKIPPED_FOREIGN),
    ("IDLE+DRAIN", OURS, OURS, SKIPPED_SAME),
    ("IDLE+DRAIN", OURS + " [root@2026-11-30T08:19:06]", OURS, SKIPPED_SAME),
    ("DOWN", OURS, OURS, SKIPPED_SAME),
    ("MIXED+DRAIN", "autoheal: older reason", OURS, REASON_UPDATED),
    ("DOWN+DRAIN", "autoheal: older reason", OURS, REASON_UPDATED),
    ("DOWN", "autoheal: older reason", OURS, DRAINED),
    ("IDLE+DRAIN", "", OURS, DRAINED),
    ("DOWN", "", OURS, DRAINED),
])
def test_plan_drain(state, reason, want, expected):
    assert plan_drain(node(state, reason), want) == expected


@pytest.mark.parametrize("state, reason, expected", [
    ("IDLE", "", SKIPPED_NOT_DRAINED),
    ("MIXED", OURS, SKIPPED_NOT_DRAINED),
    ("IDLE+DRAIN", ADMIN, SKIPPED_NOT_OURS),
    ("IDLE+DRAIN", "", SKIPPED_NOT_OURS),
    ("DOWN*", "Not responding", SKIPPED_NOT_OURS),
    ("IDLE+DRAIN", OURS, RESUMED),
    ("MIXED+DRAIN", OURS + " [root@2026-11-30T08:19:06]", RESUMED),
    ("DOWN+DRAIN", OURS, RESUMED),
    ("DOWN", OURS, RESUMED),
])
def test_plan_resume(state, reason, expected):
    assert plan_resume(node(state, reason)) == expected


# ---- drain ---------------------------------------------------------------------------------------------------

def test_drain_healthy_node_prefixes_and_sanitizes_reason():
    slurm = FakeSlurm([node("IDLE")])
    out = nodeops.drain(slurm, "gpu1", "xid 79\ngpu 3")
    assert out.action == DRAINED and out.changed and not out.dry_run
    assert out.reason == "autoheal: xid 79 gpu 3"
    assert slurm.writes() == [("drain", "gpu1", "autoheal: xid 79 gpu 3")]
    assert slurm.nodes["gpu1"].drain


def test_drain_keeps_reason_already_ours():
    slurm = FakeSlurm([node("MIXED")])
    nodeops.drain(slurm, "gpu1", OURS)
    assert slurm.writes() == [("drain", "gpu1", OURS)]


def test_drain_never_overwrites_admin_drain():
    slurm = FakeSlurm([node("IDLE+DRAIN", ADMIN + " [bob@2026-01-01T00:00:00]")])
    out = nodeops.drain(slurm, "gpu1", OURS)
    assert out.action == SKIPPED_FOREIGN and not out.changed
    assert out.previous_reason == ADMIN
    assert slurm.writes() == []


def test_drain_same_reason_skipped():
    slurm = FakeSlurm([node("IDLE+DRAIN", OURS)])
    out = nodeops.drain(slurm, "gpu1", OURS)
    assert out.action == SKIPPED_SAME
    assert slurm.writes() == []


def test_drain_our_drain_with_other_reason_updates_reason_only():
    slurm = FakeSlurm([node("MIXED+DRAIN", "autoheal: ecc")])
    out = nodeops.drain(slurm, "gpu1", "xid 79")
    assert out.action == REASON_UPDATED and out.changed
    assert out.previous_reason == "autoheal: ecc"
    assert slurm.writes() == [("set_reason", "gpu1", "autoheal: xid 79")]


def test_drain_down_node_with_slurm_reason_left_alone():
    slurm = FakeSlurm([node("DOWN*", "Not responding")])
    assert nodeops.drain(slurm, "gpu1", "xid 79").action == SKIPPED_FOREIGN
    assert slurm.writes() == []


def test_drain_unknown_node_propagates_not_found():
    slurm = FakeSlurm([])
    with pytest.raises(SlurmNotFound):
        nodeops.drain(slurm, "ghost", "xid 79")
    assert slurm.writes() == []


@pytest.mark.parametrize("state, reason", [("IDLE", ""), ("MIXED+DRAIN", "autoheal: ecc"),
                                           ("IDLE+DRAIN", ADMIN)])
def test_drain_dry_run_never_writes(state, reason):
    slurm = FakeSlurm([node(state, reason)])
    out = nodeops.drain(slurm, "gpu1", "xid 79", dry_run=True)
    assert slurm.writes() == []
    assert not out.changed
    assert out.action == plan_drain(node(state, reason), "autoheal: xid 79")
    assert out.dry_run == (out.action in (DRAINED, REASON_UPDATED))


# ---- resume --------------------------------------------------------------------------------------------------

def test_resume_our_drain():
    slurm = FakeSlurm([node("IDLE+DRAIN", OURS + " [root@2026-11-30T08:19:06]")])
    out = nodeops.resume(slurm, "gpu1")
    assert out.action == RESUMED and out.changed
    assert out.previous_reason == OURS
    assert slurm.writes() == [("resume", "gpu1")]
    assert not slurm.nodes["gpu1"].drain


def test_resume_rereads_before_writing():
    slurm = FakeSlurm([node("IDLE+DRAIN", OURS)])
    nodeops.resume(slurm, "gpu1")
    reads = [c for c in slurm.calls if c[0] == "get_node"]
    assert len(reads) == 2
    assert slurm.calls.index(reads[1]) < slurm.calls.index(("resume", "gpu1"))


def test_resume_never_resumes_admin_drain():
    slurm = FakeSlurm([node("IDLE+DRAIN", ADMIN)])
    out = nodeops.resume(slurm, "gpu1")
    assert out.action == SKIPPED_NOT_OURS and not out.changed
    assert slurm.writes() == []


def test_resume_not_drained():
    slurm = FakeSlurm([node("IDLE")])
    assert nodeops.resume(slurm, "gpu1").action == SKIPPED_NOT_DRAINED
    assert slurm.writes() == []


def test_resume_race_admin_redrained_between_reads():
    first = node("IDLE+DRAIN", OURS)
    second = node("IDLE+DRAIN", ADMIN + " [alice@2026-11-30T09:00:00]")
    slurm = FakeSlurm([second], reads=[first, second])
    out = nodeops.resume(slurm, "gpu1")
    assert out.action == SKIPPED_NOT_OURS
    assert out.previous_reason == ADMIN
    assert not out.changed
    assert slurm.writes() == []


def test_resume_race_node_resumed_meanwhile():
    slurm = FakeSlurm([node("IDLE")], reads=[node("IDLE+DRAIN", OURS), node("IDLE")])
    out = nodeops.resume(slurm, "gpu1")
    assert out.action == SKIPPED_NOT_DRAINED
    assert slurm.writes() == []


def test_resume_dry_run_never_writes():
    slurm = FakeSlurm([node("IDLE+DRAIN", OURS)])
    out = nodeops.resume(slurm, "gpu1", dry_run=True)
    assert out.action == RESUMED and out.dry_run and not out.changed
    assert slurm.writes() == []


def test_drain_then_resume_roundtrip():
    slurm = FakeSlurm([node("MIXED")])
    assert nodeops.drain(slurm, "gpu1", "xid 79").action == DRAINED
    assert nodeops.drain(slurm, "gpu1", "xid 79").action == SKIPPED_SAME
    assert nodeops.resume(slurm, "gpu1").action == RESUMED
    assert [c[0] for c in slurm.writes()] == ["drain", "resume"]


def test_base_get_node_and_get_job_defaults():
    slurm = FakeSlurm([node("IDLE", name="a"), node("IDLE", name="b")])
    assert SlurmAdapter.get_node(slurm, "b").name == "b"
    with pytest.raises(SlurmNotFound):
        SlurmAdapter.get_node(slurm, "zz")
    with pytest.raises(SlurmNotFound, match="job 5 not found"):
        slurm.get_job("5")
    slurm.set_job_comment("7", "autoheal: requeued")
    assert ("update_job", "7", {"Comment": "autoheal: requeued"}) in slurm.calls
