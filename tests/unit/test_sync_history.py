"""The sync's view of a node's fault history (issue 22 section 4): the Node annotation
autoheal.io/fault-history, one entry per fault (its rungs and repeats are the same fault), nothing
written while nothing changes."""

from __future__ import annotations

import json

from sync_helpers import k8s_name
from test_remediation_flow import recon, world

from autoheal.k8s_sync import history

STEPS = ["slurm-to-pods", "health-to-nodes", "nodes-to-slurm"]


def entries(kube, node):
    return json.loads(kube.nodes[k8s_name(node)]["metadata"]["annotations"]["autoheal.io/fault-history"])


def test_fault_history_on_the_node_one_entry_per_fault():
    slurm, kube, cfg, clock = world(enabled_steps=STEPS)
    r = recon(slurm, kube, cfg, clock)
    slurm.drain("n1", "autoheal: xid 79 on GPU 3 of n1 (0000:3b:00.0): fallen off the bus")
    assert r.run_pass().ok
    assert [e["fault"] for e in entries(kube, "n1")] == ["xid 79 on GPU 3 of n1 (0000:3b:00.0): fallen off the bus"]
    # the hooks' rung for the same fault: the same entry
    slurm.set_reason("n1", "autoheal: replace: xid 79 on GPU 3 of n1 (0000:3b:00.0): fallen off the bus")
    assert r.run_pass().ok
    idle = r.run_pass()
    assert idle.ok and idle.planned == [], [a.describe() for a in idle.planned]
    assert len(entries(kube, "n1")) == 1
    # repaired, returned, failed again: a second entry; then a lemon: a third
    slurm.resume("n1")
    assert r.run_pass().ok
    slurm.drain("n1", "autoheal: xid 48 on GPU 1 of n1 (0000:1c:00.0): double-bit ECC error")
    assert r.run_pass().ok
    slurm.set_reason("n1", "autoheal: lemon: 3 faults in 7 d (xid 79, 48, 79)")
    assert r.run_pass().ok
    assert [e["fault"] for e in entries(kube, "n1")][1:] == [
        "xid 48 on GPU 1 of n1 (0000:1c:00.0): double-bit ECC error", "lemon: 3 faults in 7 d (xid 79, 48, 79)"]
    assert all(e["node"] == "n1" for e in entries(kube, "n1"))
    # an admin's drain is no fault: no entry
    slurm.drain("n2", "autoheal: admin: maintenance by bob")
    assert r.run_pass().ok
    assert "autoheal.io/fault-history" not in (kube.nodes[k8s_name("n2")]["metadata"].get("annotations") or {})


def test_history_is_bounded_and_survives_foreign_text():
    knode = {"metadata": {"annotations": {"autoheal.io/fault-history": "not json"}}}
    body = history.patch(knode, "autoheal.io", [("n1", "autoheal: xid 95 on GPU 0 of n1: uncontained")], "T")
    assert json.loads(body["metadata"]["annotations"]["autoheal.io/fault-history"])[0]["fault"].startswith("xid 95")
    many = [{"time": "T", "node": "n1", "fault": f"xid {i} on GPU 0 of n1"} for i in range(40)]
    knode = {"metadata": {"annotations": {"autoheal.io/fault-history": json.dumps(many)}}}
    body = history.patch(knode, "autoheal.io", [("n1", "autoheal: xid 48 on GPU 0 of n1")], "T")
    kept = json.loads(body["metadata"]["annotations"]["autoheal.io/fault-history"])
    assert len(kept) == history.KEEP and kept[-1]["fault"] == "xid 48 on GPU 0 of n1"
