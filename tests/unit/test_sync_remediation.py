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
    assert next_step(r, True, 0, [], False, CFG, 101).then.reason == "replacement never arrived"


def test_state_round_trips_through_annotations():
    cur = NodeRemediation("draining", 1234, 2, "xid 79")
    ann = cur.patch("autoheal.io")["metadata"]["annotations"]
    assert NodeRemediation.from_node({"metadata": {"annotations": ann}}, "autoheal.io") == cur
    assert NodeRemediation.from_node({"metadata": {"annotations": {"autoheal.io/remediation-state": "bogus"}}},
                                     "autoheal.io").state == ""


def test_breaker_10_of_12_failing_allows_2_then_trips_and_rearms_without_replay():
    b = Breaker(max_concurrent=2, max_percent=25, rearm_percent=10, cooldown_seconds=60)
    n, _ = b.allowed(active=0, affected=2, total=12, now=0)
    assert n == 2
    for _ in range(n):
        b.record_start(0)
    n, why = b.allowed(active=2, affected=10, total=12, now=1)
    assert n == 0 and "tripped" in why
    assert b.allowed(active=0, affected=1, total=12, now=30)[0] == 0  # cooldown not over
    assert b.allowed(active=0, affected=3, total=12, now=100)[0] == 0  # share still above re-arm level
    n, _ = b.allowed(active=0, affected=1, total=12, now=100)
    assert n == 2 and b.starts == []  # re-armed, old starts forgotten
