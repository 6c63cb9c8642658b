"""The sync's write pool (``k8s_sync.writepool``, ``Reconciler._apply``): independent object patches run side
by side on at most ``api_write_concurrency`` threads; writes to one object and of one group keep their plan
order; the rate limiter, leadership and 409/429/5xx rules hold per write. Found by bench_sync_http.py on the
real API server: one patch at a time, a 1,000-node drain waited on some 5,000 round trips."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

import pytest
from sync_helpers import k8s_name, memory_world, pod_name, sync_cfg

from autoheal.k8s_sync import writepool
from autoheal.k8s_sync.engine import Reconciler
from autoheal.k8s_sync.kube import Conflict, KubeError
from autoheal.k8s_sync.plan import NODE_PATCH, NODE_STATUS, POD_STATUS, SLURM_DRAIN, Action

HEALTH = "autoheal: xid 79 on GPU 3: fallen off the bus"


def act(kind, target: str, group: str = "", namespace: str = "") -> Action:
    return Action("test", kind, target, target, namespace, group=group)


# ---- the pure part ------------------------------------------------------------------------------------
def test_lanes_keep_one_objects_writes_together_in_plan_order():
    run = list(enumerate([act(NODE_STATUS, "a"), act(POD_STATUS, "p", namespace="s"), act(NODE_PATCH, "b"),
                          act(NODE_PATCH, "a"), act(POD_STATUS, "a", namespace="s"), act(NODE_PATCH, "a")]))
    lanes = writepool.lanes(run)
    assert [[i for i, _ in lane] for lane in lanes] == [[0, 3, 5], [1], [2], [4]]  # pod "a" is not Node "a"


def test_lanes_join_the_objects_of_one_group_transitively():
    run = list(enumerate([act(NODE_PATCH, "a", group="g1"), act(NODE_PATCH, "b"), act(NODE_PATCH, "c", group="g2"),
                          act(NODE_PATCH, "b", group="g1"), act(NODE_PATCH, "c", group="g1"),
                          act(NODE_PATCH, "d")]))
    assert [[i for i, _ in lane] for lane in writepool.lanes(run)] == [[0, 1, 2, 3, 4], [5]]


def test_a_taint_and_an_annotation_of_one_node_go_as_one_strategic_patch_keeping_the_guard():
    taint = Action("h", NODE_PATCH, "a", "a", "", "strategic",
                   {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}, "metadata": {"resourceVersion": "5"}})
    hist = Action("h", NODE_PATCH, "a", "a", "", "merge", {"metadata": {"annotations": {"x/h": "[]", "x/o": None}}})
    one = writepool.as_one([taint, hist])
    assert one.patch_type == "strategic" and one.body == {
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
        "metadata": {"resourceVersion": "5", "annotations": {"x/h": "[]", "x/o": None}}}
    assert taint.body == {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
                          "metadata": {"resourceVersion": "5"}}  # the planned actions are left as they were
    run = [(0, act(NODE_STATUS, "a")), (1, taint), (2, hist)]
    assert [[i for i, _ in r] for r in writepool.coalesce(run)] == [[0], [1, 2]]


@pytest.mark.parametrize("second", [
    Action("h", NODE_PATCH, "b", "b", "", "merge", {"metadata": {"annotations": {"x": "1"}}}),  # another Node
    Action("h", NODE_PATCH, "a", "a", "", "merge", {"spec": {"taints": []}}),  # a list in a merge patch
    Action("h", NODE_PATCH, "a", "a", "", "merge", {"metadata": {"resourceVersion": "6"}}),  # another guard
    Action("h", NODE_PATCH, "a", "a", "", "merge", {"metadata": {"annotations": {"x": "1"}}}, group="g"),
    Action("h", NODE_STATUS, "a", "a", "", "strategic", {"status": {"conditions": []}}),  # the status
])
def test_patches_that_mean_something_else_together_stay_apart(second):
    first = Action("h", NODE_PATCH, "a", "a", "", "strategic", {"spec": {"unschedulable": True},
                                                               "metadata": {"resourceVersion": "5"}})
    assert [len(r) for r in writepool.coalesce([(0, first), (1, second)])] == [1, 1]


def test_segments_put_a_barrier_around_every_write_that_is_not_an_object_patch():
    actions = [act(SLURM_DRAIN, "n1"), act(SLURM_DRAIN, "n2"), act(NODE_PATCH, "a"), act(NODE_STATUS, "b"),
               act(SLURM_DRAIN, "n3"), act(POD_STATUS, "p", namespace="s")]
    segs = writepool.segments(actions)
    assert [(pooled, [i for i, _ in run]) for pooled, run in segs] == [
        (False, [0, 1]), (True, [2, 3]), (False, [4]), (True, [5])]
    assert [pooled for pooled, _ in writepool.segments(actions, pooled=False)] == [False]


def test_run_lanes_uses_at_most_the_bound_and_raises_a_workers_exception_after_the_rest():
    lock, state = threading.Lock(), {"now": 0, "max": 0, "done": 0}
    gate = threading.Barrier(3, timeout=10)

    def worker(lane):
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        if lane[0][0] < 3:
            gate.wait()  # the first three lanes are in flight together, or this breaks
        with lock:
            state["now"] -= 1
            state["done"] += 1
        if lane[0][0] == 5:
            raise ValueError("a bug in a write")

    work = [[(i, act(NODE_PATCH, f"n{i}"))] for i in range(12)]
    with pytest.raises(ValueError):
        writepool.run_lanes(work, worker, 3)
    assert state == {"now": 0, "max": 3, "done": 12} and not gate.broken


# ---- the engine over a recording in-memory Kubernetes -----------------------------------------------
class Recording:
    """Wraps MemoryKube: records each write (method, object) in order of arrival, counts writes in
    flight, and can hold a write, fail one or fail all of a method."""

    def __init__(self, kube) -> None:
        self.kube = kube
        self.lock = threading.Lock()
        self.calls: List[Tuple[str, str]] = []
        self.inflight = self.max_inflight = 0
        self.hold: Dict[Tuple[str, str], threading.Event] = {}  # held until the event is set
        self.fail_one: Dict[Tuple[str, str], KubeError] = {}
        self.fail_all: Dict[str, KubeError] = {}
        self.attempts = 0
        self.gate: Optional[threading.Barrier] = None  # the first writes wait here together

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kube, name)

    def _call(self, method: str, target: str, fn, *args) -> Any:
        with self.lock:
            self.attempts += 1
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            gate = self.gate
        try:
            if gate is not None and not gate.broken:
                try:
                    gate.wait()
                except threading.BrokenBarrierError:
                    pass
            held = self.hold.get((method, target))
            if held is not None:
                held.wait(10)
            exc = self.fail_one.get((method, target)) or self.fail_all.get(method)
            if exc is not None:
                raise exc
            out = fn(*args)
            with self.lock:
                self.calls.append((method, target))
            return out
        finally:
            with self.lock:
                self.inflight -= 1

    def patch_pod_status(self, namespace, name, body, patch_type="strategic"):
        return self._call("pod_status", name, self.kube.patch_pod_status, namespace, name, body, patch_type)

    def patch_node_status(self, name, body, patch_type="strategic"):
        return self._call("node_status", name, self.kube.patch_node_status, name, body, patch_type)

    def patch_node(self, name, body, patch_type="strategic"):
        return self._call("node", name, self.kube.patch_node, name, body, patch_type)

    def create_event(self, namespace, node, reason, message, *args, **kwargs):
        name = node["metadata"]["name"]
        return self._call("event", name, self.kube.create_event, namespace, node, reason, message, *args, **kwargs)


def world(n: int, concurrency: int, **cfg: Any):
    names = [f"n{i:03d}" for i in range(n)]
    slurm, kube = memory_world(names)
    rec_kube = Recording(kube)
    rec = Reconciler(slurm, rec_kube, sync_cfg(leader_election=False, events=False,
                                               api_write_concurrency=concurrency, **cfg))
    return names, slurm, rec_kube, rec


def health_drain(slurm, names: List[str]) -> None:
    with slurm.lock:
        for n in names:
            node = slurm.nodes[n]
            slurm.nodes[n] = replace(node, flags=node.flags | {"DRAIN"}, reason=HEALTH)


def test_first_pass_writes_every_pod_on_exactly_the_bound_of_threads():
    names, _, kube, rec = world(40, 4)
    kube.gate = threading.Barrier(4, timeout=10)  # only 4 writes in flight together get past it
    res = rec.run_pass()
    assert res.ok and not res.errors and len(res.applied) == 40
    assert not kube.gate.broken and kube.max_inflight == 4
    # the result lists the writes in plan order, however the threads interleaved
    assert [a.target for a in res.applied] == [pod_name(n) for n in names]


def test_one_at_a_time_when_the_bound_is_one():
    _, _, kube, rec = world(20, 1)
    assert len(rec.run_pass().applied) == 20 and kube.max_inflight == 1


def test_writes_to_one_node_keep_their_order_while_other_nodes_overtake():
    names, slurm, kube, rec = world(6, 4)
    rec.run_pass()
    drained = names[:3]
    health_drain(slurm, drained)
    first = k8s_name(drained[0])
    released = threading.Event()
    kube.hold[("node_status", first)] = released  # the first Node's condition write hangs ...
    kube.calls.clear()
    done = threading.Thread(target=lambda: setattr(kube, "res", rec.run_pass()))
    done.start()
    # ... while the other drained Nodes get their writes through
    others = {k8s_name(n) for n in drained[1:]}
    for _ in range(500):
        with kube.lock:
            if sum(1 for _, t in kube.calls if t in others) >= 4:
                break
        threading.Event().wait(0.01)
    with kube.lock:
        assert not any(t == first for _, t in kube.calls)  # nothing of the held Node overtook its condition
        assert sum(1 for _, t in kube.calls if t in others) == 4
    released.set()
    done.join(10)
    res = kube.res
    assert res.ok and not res.errors
    for n in drained:  # every Node: condition, then taint and fault history in one request, as planned
        assert [m for m, t in kube.calls if t == k8s_name(n)] == ["node_status", "node"]
        node = kube.kube.nodes[k8s_name(n)]
        assert any(t["key"] == "autoheal.io/gpu-unhealthy" for t in node["spec"]["taints"])
        assert "xid 79" in node["metadata"]["annotations"]["autoheal.io/fault-history"]
    # both patches are booked as written (counters, `sync status`), one per planned action
    assert sum(1 for a in res.applied if a.kind == NODE_PATCH) == 2 * len(drained)
    planned = [a for a in res.planned if a.step == "health-to-nodes"]
    assert [a.target for a in res.applied if a.step == "health-to-nodes"] == [a.target for a in planned]


@pytest.mark.parametrize("status", [429, 500, 503, 0])
def test_a_429_5xx_or_timeout_stops_the_other_lanes_next_writes_and_the_next_pass_writes_the_rest(status):
    _, _, kube, rec = world(50, 4)
    kube.fail_all["pod_status"] = KubeError(f"patch_pod_status: HTTP {status}", status)
    res = rec.run_pass()
    # no more attempts than writes in flight at once: every one that would have started after the first
    # failure answered was held back (deferred) instead of sent
    assert 1 <= kube.attempts <= 4 and not res.applied
    assert res.deferred == 50 - kube.attempts and len(res.errors) == kube.attempts
    assert all(f"HTTP {status}" in e for e in res.errors)
    del kube.fail_all["pod_status"]
    res = rec.run_pass()
    assert len(res.applied) == 50 and not res.errors and res.deferred == 0


def test_a_409_fails_only_its_own_write_and_the_next_pass_retries_it():
    names, _, kube, rec = world(30, 4)
    kube.fail_one[("pod_status", pod_name(names[10]))] = Conflict("the object has been modified", 409)
    res = rec.run_pass()
    assert res.conflicts == 1 and not res.errors and res.deferred == 0
    assert [a.target for a in res.applied] == [pod_name(n) for n in names if n != names[10]]
    kube.fail_one = {}
    assert [a.target for a in rec.run_pass().applied] == [pod_name(names[10])]
    assert rec.run_pass().applied == []


def test_the_rate_limit_holds_across_threads():
    _, _, kube, rec = world(40, 8, api_writes_per_second=0.1, api_write_burst=7)
    res = rec.run_pass()
    assert len(res.applied) == 7 and kube.attempts == 7 and res.deferred == 33


def test_leadership_lost_mid_pass_stops_every_lane_and_is_said_once():
    _, _, kube, rec = world(40, 4)

    class Elector:
        left = 10

        def is_leader(self) -> bool:
            self.left -= 1
            return self.left >= 0

    rec.leader = Elector()
    res = rec.run_pass()
    assert kube.attempts <= 10 and len(res.applied) == kube.attempts
    assert [e for e in res.errors if "lost leadership" in e] == res.errors and len(res.errors) == 1


def test_a_group_that_fails_on_one_node_skips_its_writes_on_other_nodes():
    _, _, kube, rec = world(4, 4)
    snap = rec.read()
    rec._fresh = {}
    body = {"metadata": {"annotations": {"autoheal.io/x": "1"}}}
    actions = [Action("health-to-nodes", NODE_PATCH, k8s_name("n000"), "n000", "", "merge", body, group="g"),
               Action("health-to-nodes", NODE_PATCH, k8s_name("n001"), "n001", "", "merge", body),
               Action("health-to-nodes", NODE_PATCH, k8s_name("n002"), "n002", "", "merge", body, group="g"),
               Action("health-to-nodes", NODE_PATCH, k8s_name("n003"), "n003", "", "merge", body)]
    kube.fail_one[("node", k8s_name("n000"))] = Conflict("the object has been modified", 409)
    from autoheal.k8s_sync.engine import PassResult

    res = PassResult()
    rec._apply("health-to-nodes", actions, snap, res)
    assert [a.target for a in res.applied] == [k8s_name("n001"), k8s_name("n003")]
    assert res.conflicts == 1 and res.deferred == 1
    assert ("node", k8s_name("n002")) not in kube.calls


def test_the_events_of_a_pooled_run_are_posted_after_all_its_writes_one_per_taint():
    names, slurm, kube, rec = world(12, 4)
    rec.cfg.events = True
    rec.run_pass()
    drained = names[2:10]
    health_drain(slurm, drained)
    kube.calls.clear()
    res = rec.run_pass()
    assert res.ok and not res.errors
    step = [m for m, t in kube.calls if m != "pod_status"]
    events = [t for m, t in kube.calls if m == "event"]
    assert sorted(events) == sorted(k8s_name(n) for n in drained)  # AutohealTainted, one per Node
    last_write = max(i for i, m in enumerate(step) if m != "event")
    assert all(m == "event" for m in step[last_write + 1:]) and len(step) - last_write - 1 == len(drained)
