"""The Events of a pass's Slurm writes find their Kubernetes Node in the pass's own mapping: mapping a
node anew walks every slurmd pod (65 ms at 10,000 pods), once per write made a burst of cordons cost
seconds of CPU (found by bench/bench_sync_http.py)."""

from __future__ import annotations

from sync_helpers import k8s_name, memory_world, sync_cfg

from autoheal.k8s_sync import engine
from autoheal.k8s_sync.engine import Reconciler


def test_cordon_burst_maps_the_fleet_once_per_pass_and_events_name_the_right_nodes(monkeypatch):
    names = [f"n{i:03d}" for i in range(40)]
    slurm, kube = memory_world(names)
    rec = Reconciler(slurm, kube, sync_cfg(events=True, leader_election=False))
    assert rec.run_pass().ok
    cordoned = names[3:13]
    for n in cordoned:
        kube.patch_node(k8s_name(n), {"spec": {"unschedulable": True}})
    calls = []
    real = engine.make_context
    monkeypatch.setattr(engine, "make_context", lambda snap, cfg: calls.append(len(snap.slurm)) or real(snap, cfg))
    kube.events.clear()
    res = rec.run_pass()
    assert res.ok and not res.errors
    assert sorted(a.target for a in res.applied if a.kind == "slurm-drain") == cordoned
    # the pass and the mirror of its own Slurm writes: two mappings of the fleet, none per write
    assert calls == [len(names), len(names)]
    drained_events = [e for e in kube.events if e["reason"] == "AutohealSlurmDrain"]
    assert sorted(e["node"] for e in drained_events) == sorted(k8s_name(n) for n in cordoned)
    assert all(e["message"].startswith(f"Slurm node {e['node'][4:]} drained") for e in drained_events)


def test_node_of_outside_a_pass_still_maps_the_node():
    slurm, kube = memory_world(["a1", "a2"])
    rec = Reconciler(slurm, kube, sync_cfg(leader_election=False))
    snap = rec.read()
    assert rec._node_of("a2", snap) == k8s_name("a2")
    assert rec._node_of("nope", snap) == ""
