"""The soak's job-storm and bad-repair invariants (issue 22): no drain for an application XID; a node
whose defect keeps coming back ends retired as a lemon, not cycling."""

from __future__ import annotations

from autoheal_lab.soak_checks import Injected, Snapshot, ours_kind
from autoheal_lab.soak_plan import KINDS, make_schedule
from autoheal_lab.soak_storm import check, storm_target


def drain(node, reason, t=10.0):
    return {"event": "drain", "node": node, "message": reason, "time": t}


def test_a_drain_for_an_application_xid_is_a_violation():
    final = Snapshot(100.0)
    ok = [drain("n1", "autoheal: xid 48 on GPU 1 of n1 (0000:1c:00.0): double-bit ECC error")]
    assert check([], ok, final) == []
    bad = [drain("n2", "autoheal: xid 13 on GPU 0 of n2 (0000:1b:00.0): graphics engine exception")]
    v = check([], bad, final)
    assert [x.invariant for x in v] == ["app-xid-drain"] and "xid 13" in v[0].message


def test_a_bad_repair_must_end_a_lemon():
    inj = Injected(1, "bad-repair", "gpu", 0.0, node="n1", gpu=1, count=3)
    cycling = Snapshot(100.0, nodes={"n1": {"state": "IDLE", "drain": False, "reason": ""}})
    assert [x.invariant for x in check([inj], [], cycling)] == ["lemon-cycling"]
    assert check([inj], [], cycling, lemon_faults=0) == []  # lemons off in that lab: not judged
    retired = Snapshot(100.0, nodes={"n1": {"state": "IDLE+DRAIN", "drain": True,
                                            "reason": "autoheal: lemon: 3 faults in 7 d (xid 95, 95, 95)"}})
    assert check([inj], [], retired) == []
    assert ours_kind("autoheal: lemon: 3 faults in 7 d (xid 95, 95, 95)") == "lemon"


def test_storm_targets_the_running_job_on_most_nodes():
    snap = Snapshot(1.0, jobs={"5": {"state": "RUNNING", "nodes": ["n1"]},
                               "7": {"state": "RUNNING", "nodes": ["n1", "n2", "n3"]},
                               "9": {"state": "PENDING", "nodes": []}})
    assert storm_target(snap) == ("7", ["n1", "n2", "n3"])
    assert storm_target(Snapshot(1.0)) == ("", [])


def test_storm_and_bad_repair_kinds_are_planned():
    s = make_schedule(4, 10, ["n1", "n2", "n3"], 4, include=["job-storm", "bad-repair"])
    storms = [f for f in s.faults if f.kind == "job-storm"]
    assert storms and all(f.node == "" and f.xid is not None for f in storms)
    assert not KINDS["job-storm"].drains and KINDS["bad-repair"].drains
