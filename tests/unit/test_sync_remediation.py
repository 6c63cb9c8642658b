"""Issue 7 groundwork: the remediation state machine and the circuit breaker (pure)."""

from __future__ import annotations

from autoheal.k8s_sync.remediation import Breaker, NodeRemediation, RemediationSettings, next_step

CFG = RemediationSettings(grace_seconds=100, drain_timeout_seconds=100, replace_timeout_seconds=100)


def pod(name, labels=None, daemonset=False):
    meta = {"name": name, "labels": labels or {}}
    if daemonset:
        meta["ownerReferences"] = [{"kind": "DaemonSet", "name": "ds"}]
    return {"metadata": meta}


def test_full_flow_each_state_once():
    cur, now, seen = NodeRemediation(), 0.0, []
    inputs = {"": (2, [pod("p")], False), "quarantined": (0, [pod("p"), pod("d", daemonset=True)], False),
              "draining": (0, [pod("d", daemonset=True)], False), "replacing": (0, [], True)}
    while cur.state not in ("done", "failed"):
        jobs, pods, ready = inputs[cur.state]
        step = next_step(cur, True, jobs, pods, ready, CFG, now)
        seen.append(step.do)
        cur = step.then or cur
        now += 1
    assert seen == ["wait", "cordon", "request-replacement", "retire"] and cur.state == "done"


def test_opt_out_label_blocks_and_timeouts_fail():
    s = next_step(NodeRemediation(), True, 0, [pod("inf", {"autoheal.io/auto-replace": "false"})], False, CFG, 0)
    assert s.do == "report-opt-out" and s.then is None
    q = NodeRemediation("quarantined", 0, 1)
    assert next_step(q, True, 3, [], False, CFG, 50).do == "wait"
    assert next_step(q, True, 3, [], False, CFG, 101).then.state == "failed"
    r = NodeRemediation("replacing", 0, 1)
    assert "replacement never arrived" in next_step(r, True, 0, [], False, CFG, 101).then.reason


def test_state_round_trips_through_annotations():
    cur = NodeRemediation("draining", 1234, 2, "xid 79")
    ann = cur.patch("autoheal.io")["metadata"]["annotations"]
    assert NodeRemediation.from_node({"metadata": {"annotations": ann}}, "autoheal.io") == cur
    assert NodeRemediation.from_node({"metadata": {"annotations": {"autoheal.io/remediation-state": "bogus"}}},
                                     "autoheal.io").state == ""


def test_breaker_10_of_12_failing_allows_2_then_trips_and_rearms_without_replay():
    b = Breaker(max_concurrent=2, max_percent=25, rearm_percent=10, cooldown_seconds=60)
    n, _ = b.allowed(active=0, affected=10, total=12, now=0)
    assert n == 2  # exactly the allowed ones start...
    for _ in range(n):
        b.record_start(0)
    assert b.check_trip(affected=10, total=12, now=0)  # ...then it trips: 83% > 25%
    n, why = b.allowed(active=2, affected=10, total=12, now=1)
    assert n == 0 and "tripped" in why
    assert b.allowed(active=0, affected=1, total=12, now=30)[0] == 0  # cooldown not over
    assert b.allowed(active=0, affected=3, total=12, now=100)[0] == 0  # share still above re-arm level
    n, _ = b.allowed(active=0, affected=1, total=12, now=100)
    assert n == 2 and b.starts == []  # re-armed, old starts forgotten


def test_breaker_percent_budget_per_window_and_state_round_trip():
    b = Breaker(max_concurrent=5, max_percent=25, window_seconds=100)
    assert b.allowed(active=0, affected=0, total=8, now=0)[0] == 2  # 25% of 8
    b.record_start(0)
    b.record_start(0)
    assert b.allowed(active=0, affected=2, total=8, now=50)[0] == 0
    assert b.allowed(active=0, affected=2, total=8, now=101)[0] == 2  # the window slid on
    c = Breaker()
    c.load(b.dump())
    assert c.starts == b.starts and c.tripped_at is None
    c.load({"trippedAt": "garbage"})
    assert c.tripped  # a hand-edited state keeps it tripped rather than forgetting a trip


def test_wants_replace_reasons():
    from sync_helpers import sync_cfg

    from autoheal.k8s_sync.remediation import wants_replace

    cfg = sync_cfg()
    assert wants_replace("autoheal: replace: ecc-dbe on gpu 1 [root@2026-01-01T00:00:00]", cfg)
    # issue 22: the node side owns the rung; an XID named in a plain health drain is not a request
    assert not wants_replace("autoheal: xid 79 on gpu2: fell off the bus", cfg)
    assert not wants_replace("autoheal: xid 79 on gpu2: fell off the bus", sync_cfg(remediate_xids=[79]))
    assert wants_replace("autoheal: replace: xid 79 on GPU 3 of gpu2 (0000:3b:00.0): fallen off the bus", cfg)
    assert not wants_replace("autoheal: xid 48 on gpu2: DBE", cfg)
    assert not wants_replace("autoheal: k8s: node cordoned: xid 79", cfg)
    assert not wants_replace("autoheal: retired: replaced by spare1", cfg)
    assert not wants_replace("admin: xid 79 replace", cfg)


def test_drain_timeout_makes_one_last_attempt_then_fails():
    d = NodeRemediation("draining", 0, 1)
    assert next_step(d, True, 0, [pod("p")], False, CFG, 50).do == "evict"
    last = next_step(d, True, 0, [pod("p")], False, CFG, 101)
    assert last.do == "final-evict" and last.then.final_eviction == 101 and last.then.since == 0
    failed = next_step(last.then, True, 0, [pod("p")], False, CFG, 102)
    assert failed.do == "fail" and "/p" in failed.then.reason and failed.then.final_eviction == 0
    assert next_step(last.then, True, 0, [], False, CFG, 102).do == "request-replacement"


def test_retry_due_after_cooldown_while_attempts_are_left():
    from autoheal.k8s_sync.remediation import retry_due

    cfg = RemediationSettings(retry_seconds=60, max_attempts=2)
    failed = NodeRemediation("failed", 100, 1)
    assert retry_due(failed, cfg, 150)[0] is False and "in 10s" in retry_due(failed, cfg, 150)[1]
    assert retry_due(failed, cfg, 160)[0] is True
    assert retry_due(NodeRemediation("failed", 100, 2), cfg, 10_000) == (
        False, "no automatic retry left (2 of 2 attempts): `autoheal sync remediation retry NODE` starts another")
    assert retry_due(NodeRemediation("done", 100, 1), cfg, 10_000)[0] is False


def test_opt_out_label_on_node_or_pod():
    from autoheal.k8s_sync.remediation import opt_out_reason

    node = {"metadata": {"name": "n1", "labels": {"autoheal.io/auto-replace": "false"}}}
    assert opt_out_reason([], CFG, node) == "Node n1 carries autoheal.io/auto-replace=false"
    assert opt_out_reason([pod("x", {"autoheal.io/auto-replace": "true"})], CFG, {"metadata": {}}) == ""
    s = next_step(NodeRemediation("quarantined", 0, 2), True, 0, [], False, CFG, 1, node=node)
    assert s.do == "report-opt-out" and s.then == NodeRemediation(attempts=2)


def test_breaker_remembers_the_nodes_that_tripped_it():
    b = Breaker()
    b.nodes = ["n1", "n2"]
    b.tripped_at = 5.0
    c = Breaker()
    c.load(b.dump())
    assert c.nodes == ["n1", "n2"]
    c.reset()
    assert c.dump()["nodes"] is None
