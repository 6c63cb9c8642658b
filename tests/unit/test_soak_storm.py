"""The soak's job-storm and bad-repair invariants (issue 22): no drain for an application XID; a node
whose defect keeps coming back ends retired as a lemon, not cycling."""

from __future__ import annotations

from autoheal_lab.soak_checks import Injected, Snapshot, ours_kind
from autoheal_lab.soak_plan import KINDS, make_schedule
from autoheal_lab.soak_storm import BadRepair, check, storm_target


def drain(node, reason, t=10.0):
    return {"event": "drain", "node": node, "message": reason, "time": t}


def test_a_drain_for_an_application_xid_is_a_violation():
    final = Snapshot(100.0)
    ok = [drain("n1", "autoheal: xid 48 on GPU 1 of n1 (0000:1c:00.0): double-bit ECC error")]
    assert check([], ok, final) == []
    bad = [drain("n2", "autoheal: xid 13 on GPU 0 of n2 (0000:1b:00.0): graphics engine exception")]
    v = check([], bad, final)
    assert [x.invariant for x in v] == ["app-xid-drain"] and "xid 13" in v[0].message


LEMON = "autoheal: lemon: 3 faults in 7 d (xid 95, 95, 95)"


def lemon_record(node="n1", t=50.0):
    return {"event": "lemon", "node": node, "message": f"{node} is a lemon", "time": t}


def test_a_bad_repair_must_end_a_lemon():
    inj = Injected(1, "bad-repair", "gpu", 0.0, node="n1", gpu=1, count=3)
    cycling = Snapshot(100.0, nodes={"n1": {"state": "IDLE", "drain": False, "reason": ""}})
    v = check([inj], [], cycling)
    assert [x.invariant for x in v] == ["lemon-cycling", "lemon-cycling"]  # never a lemon; in service at the end
    assert check([inj], [], cycling, lemon_faults=0) == []  # lemons off in that lab: not judged
    retired = Snapshot(100.0, nodes={"n1": {"state": "IDLE+DRAIN", "drain": True, "reason": LEMON}})
    assert check([inj], [lemon_record()], retired) == []
    assert [x.invariant for x in check([inj], [], retired)] == ["lemon-cycling"]  # drained so, but no record
    assert ours_kind(LEMON) == "lemon"
    # not judged before the defect came back lemon_faults times...
    young = Injected(2, "bad-repair", "gpu", 0.0, node="n1", gpu=1, count=2)
    assert check([young], [], cycling) == []
    # ...unless the node's earlier faults made it a lemon sooner (soak seed 8201: xid 48, 95, 95): then
    # it must end one all the same
    assert [x.invariant for x in check([young], [lemon_record()], cycling)] == ["lemon-cycling"]
    assert check([young], [lemon_record()], retired) == []
    assert check([young], [lemon_record(t=-50.0)], cycling) == []  # a lemon before this fault: not its doing


def test_a_lemon_at_the_end_must_have_its_replacement_asked():
    inj = Injected(1, "bad-repair", "gpu", 0.0, node="n1", gpu=1, count=4)
    nodes = {"n1": {"state": "IDLE+DRAIN", "drain": True, "reason": LEMON}}
    nobody = Snapshot(100.0, nodes=nodes, kube={"n1": {"remediation": ""}})
    assert [x.invariant for x in check([inj], [lemon_record()], nobody)] == ["lemon-cycling"]
    asked = Snapshot(100.0, nodes=nodes, kube={"n1": {"remediation": "quarantined"}})
    assert check([inj], [lemon_record()], asked) == []
    requested = Snapshot(100.0, nodes=nodes, kube={"n1": {"remediation": ""}},
                         replacements=[{"node": "n1", "name": "n1-x"}])
    assert check([inj], [lemon_record()], requested) == []
    gone = Snapshot(100.0, nodes={}, kube={})
    assert check([inj], [lemon_record()], gone) == []


class FakeSoak:
    """What BadRepair uses of the soak: its lab (the injections are recorded instead of made)."""

    def __init__(self):
        self.lab = object()


def watch_with_injections(monkeypatch):
    from autoheal_lab import gpus

    made = []
    monkeypatch.setattr(gpus, "inject", lambda lab, node, gpu, kind, **kw: made.append((node, gpu, kw.get("xid"))))
    inj = Injected(1, "bad-repair", "gpu", 0.0, node="n1", gpu=2)
    w = BadRepair(inj, "n1", 2)
    w.start(FakeSoak())
    return w, inj, made


def snap_of(t, drain, reason=""):
    return Snapshot(t, nodes={"n1": {"state": "IDLE+DRAIN" if drain else "IDLE", "drain": drain, "reason": reason}})


def test_the_defect_comes_back_on_every_return_whoever_returned_it(monkeypatch):
    w, inj, made = watch_with_injections(monkeypatch)
    soak = FakeSoak()
    w.observe(soak, snap_of(1.0, False))  # the XID not drained yet: no return, nothing again
    assert made == [("n1", 2, 95)] and inj.count == 1
    w.observe(soak, snap_of(2.0, True, "autoheal: xid 95 on GPU 2 of n1"))
    w.observe(soak, snap_of(60.0, False))  # autoheal's reset and resume
    assert inj.count == 2 and len(made) == 2
    w.observe(soak, snap_of(61.0, True, LEMON))
    w.observe(soak, snap_of(150.0, False), repaired_at=[149.5])  # the technician's repair in place
    assert inj.count == 3 and w.lemon_returns == [(150.0, "technician")]
    w.observe(soak, snap_of(151.0, True, LEMON))
    w.observe(soak, snap_of(200.0, False), repaired_at=[149.5])  # back with nobody's repair: cycling
    assert w.lemon_returns[-1] == (200.0, "autoheal") and inj.count == 4
    final = snap_of(260.0, True, LEMON)
    v = check([inj], [lemon_record()], final, watches=[w])
    assert [x.invariant for x in v] == ["lemon-cycling"] and "without a technician" in v[0].message


def test_a_lemon_the_technician_just_returned_is_not_cycling(monkeypatch):
    w, inj, _made = watch_with_injections(monkeypatch)
    soak = FakeSoak()
    for t, drain, reason in ((2.0, True, "autoheal: xid 95"), (60.0, False, ""), (61.0, True, LEMON)):
        w.observe(soak, snap_of(t, drain, reason))
    w.observe(soak, snap_of(150.0, False), repaired_at=[149.0])
    assert inj.count == 3
    assert check([inj], [lemon_record()], snap_of(160.0, False), watches=[w]) == []
    # long after the technician's return it must be a lemon again
    assert [x.invariant for x in check([inj], [lemon_record()], snap_of(400.0, False), watches=[w])] == \
        ["lemon-cycling"]


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
