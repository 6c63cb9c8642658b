"""Property test: random interleavings of admin drains, health drains, cordons, uncordons, Slurm/API
outages and daemon restarts against in-memory Slurm and Kubernetes, running the real reconcile engine.

Invariants checked after every step:
- an admin's drain is never changed or resumed by sync;
- autoheal's health drains are never resumed or re-reasoned by sync;
- a failed read writes nothing;
- no ping-pong: a second pass right after a pass writes nothing (the state is a fixpoint);
- at the fixpoint both views agree (cordon <-> k8s drain, health drain <-> condition + taint, pods mirror).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sync_helpers import k8s_name, memory_world, pod_name, sync_cfg

from autoheal import nodeops
from autoheal.k8s_sync import conditions as cond
from autoheal.k8s_sync import names
from autoheal.k8s_sync.engine import Reconciler
from autoheal.reasons import strip_reason_suffix

NODES = ["n1", "n2", "n3", "n4"]
OPS = ["admin_drain", "admin_resume", "health_drain", "health_resume", "cordon", "uncordon", "restart",
       "slurm_down", "api_down", "sync", "sync"]


class World:
    def __init__(self):
        self.slurm, self.kube = memory_world(NODES)
        self.cfg = sync_cfg(max_k8s_drain_fraction=1.0)
        self.rec = Reconciler(self.slurm, self.kube, self.cfg)

    def reason(self, n):
        return strip_reason_suffix(self.slurm.nodes[n].reason)

    def apply(self, op, n):
        s, k = self.slurm, self.kube
        node = s.nodes[n]
        if op == "admin_drain":
            # an admin drains with their own words, over anything (scontrol update state=drain)
            s.drain(n, "admin: hardware check")
        elif op == "admin_resume":
            if node.drain and not self.reason(n).startswith("autoheal"):
                s.resume(n)
        elif op == "health_drain":
            nodeops.drain(s, n, "autoheal: xid 79: gpu 1 fell off the bus")
        elif op == "health_resume":
            # the hooks resume only their own (health) drains
            if node.drain and names.is_health_reason(self.reason(n)):
                s.resume(n)
        elif op == "cordon":
            k.patch_node(k8s_name(n), {"spec": {"unschedulable": True}})
        elif op == "uncordon":
            k.patch_node(k8s_name(n), {"spec": {"unschedulable": False}})
        elif op == "restart":
            self.rec = Reconciler(self.slurm, self.kube, self.cfg)  # no state survives but the two sides

    def sync_once(self):
        before = {n: (self.slurm.nodes[n].drain, self.reason(n)) for n in NODES}
        res = self.rec.run_pass()
        after = {n: (self.slurm.nodes[n].drain, self.reason(n)) for n in NODES}
        for n in NODES:
            was_drain, was_reason = before[n]
            if was_drain and was_reason and not names.is_k8s_reason(was_reason):
                assert after[n] == before[n], f"sync touched a foreign/health drain on {n}: {before[n]} -> {after[n]}"
        return res

    def check_fixpoint(self):
        res = self.sync_once()
        assert res.ok and not res.errors, res.errors
        writes = self.kube.writes
        slurm_writes = self.slurm.writes()
        again = self.sync_once()
        assert again.planned == [], [a.describe() for a in again.planned]  # no ping-pong
        assert self.kube.writes == writes
        assert self.slurm.writes() == slurm_writes
        for n in NODES:
            node = self.slurm.nodes[n]
            knode = self.kube.nodes[k8s_name(n)]
            reason = self.reason(n)
            cordoned = bool(knode["spec"].get("unschedulable"))
            if cordoned:
                assert node.drain, f"{n} cordoned but not drained in Slurm"
            else:
                assert not names.is_k8s_reason(reason) or not node.drain, f"{n}: k8s drain left after uncordon"
            health = node.drain and names.is_health_reason(reason)
            taint_keys = [t["key"] for t in cond.taints(knode)]
            assert (self.cfg.taint_key in taint_keys) == health
            gh = [c for c in knode["status"]["conditions"] if c["type"] == "GPUHealthy"]
            assert bool(gh) == health
            origin = knode["metadata"].get("annotations", {}).get("autoheal.io/slurm-drain-origin", "")
            assert origin == (reason if node.drain and names.is_k8s_reason(reason) else "")
            pod = self.kube.pods[("slurm", pod_name(n))]
            mirrored = sorted(c["type"] for c in pod["status"]["conditions"])
            assert mirrored == sorted(c["type"] for c in cond.slurm_pod_conditions(node))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(OPS), st.sampled_from(NODES)), min_size=1, max_size=30))
def test_random_interleavings_keep_invariants(steps):
    w = World()
    for op, n in steps:
        if op == "sync":
            w.sync_once()
        elif op == "slurm_down":
            w.slurm.fail = True
            writes = w.kube.writes
            res = w.rec.run_pass()
            assert not res.ok and w.kube.writes == writes  # fail closed
            w.slurm.fail = False
        elif op == "api_down":
            w.kube.fail_reads = True
            writes = w.slurm.writes()
            res = w.rec.run_pass()
            assert not res.ok
            assert w.slurm.writes() == writes
            w.kube.fail_reads = False
        else:
            w.apply(op, n)
        w.check_fixpoint()
