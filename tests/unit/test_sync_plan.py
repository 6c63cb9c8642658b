"""Pure reconcile decisions of autoheal sync: mapping, conditions, taints, both directions."""

from __future__ import annotations

import pytest
from sync_helpers import node_obj, pod_obj, sync_cfg

from autoheal.config import parse_config
from autoheal.errors import ConfigError
from autoheal.k8s_sync import conditions as cond
from autoheal.k8s_sync import names
from autoheal.k8s_sync.mapping import map_nodes
from autoheal.k8s_sync.plan import (
    NODE_PATCH,
    NODE_STATUS,
    POD_STATUS,
    SLURM_DRAIN,
    SLURM_RESUME,
    SLURM_SET_REASON,
    Snapshot,
)
from autoheal.k8s_sync.steps import plan
from autoheal.slurm.model import Node


def world(slurm_nodes, knodes=None, pods=None):
    knodes = knodes if knodes is not None else {f"k8s-{n.name}": node_obj(f"k8s-{n.name}") for n in slurm_nodes}
    pods = pods if pods is not None else {f"slurmd-{n.name}": pod_obj(f"slurmd-{n.name}", f"k8s-{n.name}", n.name)
                                          for n in slurm_nodes}
    return Snapshot({n.name: n for n in slurm_nodes}, knodes, pods, "2026-01-01T00:00:00Z")


def kinds(actions):
    return [(a.kind, a.target) for a in actions]


def all_actions(snap, cfg=None):
    steps, problems = plan(snap, cfg or sync_cfg())
    return [a for acts in steps.values() for a in acts], problems


# ---- mapping -----------------------------------------------------------------------------------------
def test_pod_mapping_by_hostname_and_node_name_modes():
    nodes = {"k8s-a": node_obj("k8s-a"), "b": node_obj("b"), "x": node_obj("x", labels={"autoheal.io/slurm-node": "c"})}
    pods = {"slurmd-a": pod_obj("slurmd-a", "k8s-a", "a")}
    r = map_nodes(["a", "b", "c"], nodes, pods, "pod", "hostname")
    assert r.bindings["a"].node == "k8s-a" and r.bindings["a"].pod == "slurmd-a"
    assert "b" not in r.bindings
    assert map_nodes(["a", "b"], nodes, pods, "node-name").bindings.keys() == {"b"}
    assert map_nodes(["c"], nodes, pods, "node-label", node_label="autoheal.io/slurm-node").bindings["c"].node == "x"


def test_two_pods_claiming_one_slurm_node_are_reported_not_guessed():
    pods = {"p1": pod_obj("p1", "k8s-a", "a"), "p2": pod_obj("p2", "k8s-b", "a")}
    r = map_nodes(["a"], {"k8s-a": node_obj("k8s-a"), "k8s-b": node_obj("k8s-b")}, pods, "pod")
    assert not r.bindings and "2 slurmd pods" in r.problems[0]


def test_terminating_pod_does_not_speak_for_the_node():
    pod = pod_obj("p1", "k8s-a", "a")
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not map_nodes(["a"], {"k8s-a": node_obj("k8s-a")}, {"p1": pod}, "pod").bindings


# ---- Slurm -> pod conditions ---------------------------------------------------------------------------
def test_slinky_conditions_base_plus_flags_with_reason_message():
    n = Node("a", "IDLE", frozenset({"DRAIN", "NOT_RESPONDING", "POWERED_DOWN"}),
             "admin: fan [root@2026-01-01T00:00:00]")
    got = cond.slurm_pod_conditions(n)
    assert [c["type"] for c in got] == ["SlurmNodeStateIdle", "SlurmNodeStateDrain", "SlurmNodeStateNotResponding"]
    assert all(c["status"] == "True" and c["message"] == "admin: fan" for c in got)


def test_pod_conditions_written_then_nothing_when_in_sync():
    snap = world([Node("a", "IDLE")])
    acts, _ = all_actions(snap)
    pod_acts = [a for a in acts if a.kind == POD_STATUS]
    assert len(pod_acts) == 1 and pod_acts[0].patch_type == "strategic"
    assert pod_acts[0].body["status"]["conditions"][0]["type"] == "SlurmNodeStateIdle"
    # apply it: the next plan has nothing for the pod
    snap.pods["slurmd-a"]["status"]["conditions"] = pod_acts[0].body["status"]["conditions"]
    assert not [a for a in all_actions(snap)[0] if a.kind == POD_STATUS]


def test_stale_slurm_conditions_removed_with_guarded_merge_patch_others_kept():
    pod = pod_obj("slurmd-a", "k8s-a", "a", rv="42", conditions=[
        {"type": "Ready", "status": "True"},
        {"type": "SlurmNodeStateIdle", "status": "True", "reason": "Idle", "message": ""},
        {"type": "SlurmNodeStateDrain", "status": "True", "reason": "Drain", "message": "x"}])
    snap = world([Node("a", "ALLOCATED")], pods={"slurmd-a": pod})
    act = [a for a in all_actions(snap)[0] if a.kind == POD_STATUS][0]
    assert act.patch_type == "merge" and act.body["metadata"]["resourceVersion"] == "42"
    types = [c["type"] for c in act.body["status"]["conditions"]]
    assert types == ["Ready", "SlurmNodeStateAllocated"]


def test_mirroring_switch_off():
    acts, _ = all_actions(world([Node("a", "IDLE")]), sync_cfg(mirror_pod_conditions=False))
    assert not [a for a in acts if a.kind == POD_STATUS]


# ---- health drains -> Node condition + taint -------------------------------------------------------------
def test_health_drain_sets_condition_and_taint_then_removes_both():
    n = Node("a", "IDLE", frozenset({"DRAIN"}), "autoheal: xid 79: gpu 3 fell off the bus")
    snap = world([n])
    acts, _ = all_actions(snap)
    status = [a for a in acts if a.kind == NODE_STATUS][0]
    c = status.body["status"]["conditions"][0]
    assert (c["type"], c["status"], c["reason"]) == ("GPUHealthy", "False", "XID79")
    assert "gpu 3" in c["message"]
    taint = [a for a in acts if a.kind == NODE_PATCH and "spec" in a.body][0]
    assert taint.body["spec"]["taints"] == [{"key": "autoheal.io/gpu-unhealthy", "value": "XID79",
                                             "effect": "NoSchedule"}]
    # no Slurm write: the drain is autoheal's own, not a Kubernetes signal
    assert not [a for a in acts if a.kind.startswith("slurm-")]
    # healthy again: both removed, others' taints kept
    k = snap.nodes["k8s-a"]
    k["status"]["conditions"] = [{"type": "Ready", "status": "True"}, dict(c)]
    k["spec"]["taints"] = [{"key": "other", "effect": "NoSchedule"}] + taint.body["spec"]["taints"]
    snap2 = world([Node("a", "IDLE")], knodes={"k8s-a": k})
    acts2, _ = all_actions(snap2)
    st = [a for a in acts2 if a.kind == NODE_STATUS][0]
    assert [x["type"] for x in st.body["status"]["conditions"]] == ["Ready"]
    tt = [a for a in acts2 if a.kind == NODE_PATCH and "spec" in a.body][0]
    assert tt.body["spec"]["taints"] == [{"key": "other", "effect": "NoSchedule"}]
    assert tt.body["metadata"]["resourceVersion"] == "1"


def test_admin_drain_gets_no_health_condition():
    acts, _ = all_actions(world([Node("a", "IDLE", frozenset({"DRAIN"}), "bad psu")]))
    assert not [a for a in acts if a.kind in (NODE_STATUS,)]


@pytest.mark.parametrize("reason,code", [("autoheal: xid 48 on gpu 1", "XID48"), ("autoheal: XID=94", "XID94"),
                                         ("autoheal: ecc-dbe on gpu 2: count 3", "EccDbeOnGpu"),
                                         ("autoheal: ", "AutohealDrain")])
def test_health_reason_code(reason, code):
    assert names.health_reason_code(reason) == code


# ---- Kubernetes -> Slurm ---------------------------------------------------------------------------------
def test_cordon_drains_with_k8s_reason_and_annotation_reason_then_origin_annotation():
    k = node_obj("k8s-a", unschedulable=True, annotations={"autoheal.io/cordon-reason": "lent to\ninference"})
    acts, _ = all_actions(world([Node("a", "IDLE")], knodes={"k8s-a": k}))
    slurm = [a for a in acts if a.kind == SLURM_DRAIN]
    assert len(slurm) == 1 and slurm[0].reason == "autoheal: k8s: node cordoned: lent to inference"
    ann = [a for a in acts if a.kind == NODE_PATCH and "metadata" in a.body and "annotations" in a.body["metadata"]]
    assert ann[0].body["metadata"]["annotations"]["autoheal.io/slurm-drain-origin"] == slurm[0].reason
    nodes_to_slurm = [a for a in acts if a.step == "nodes-to-slurm"]
    assert nodes_to_slurm.index(slurm[0]) < nodes_to_slurm.index(ann[0])  # Slurm first, then the origin


def test_uncordon_resumes_only_k8s_drains():
    plain = {"k8s-a": node_obj("k8s-a", annotations={"autoheal.io/slurm-drain-origin": "x"})}
    ours = Node("a", "IDLE", frozenset({"DRAIN"}), "autoheal: k8s: node cordoned [root@2026-01-01T00:00:00]")
    acts, _ = all_actions(world([ours], knodes=plain))
    assert (SLURM_RESUME, "a") in kinds(acts)
    assert any(a.kind == NODE_PATCH and a.body["metadata"]["annotations"]["autoheal.io/slurm-drain-origin"] is None
               for a in acts)
    for reason in ("admin: broken", "autoheal: xid 79"):
        acts, _ = all_actions(world([Node("a", "IDLE", frozenset({"DRAIN"}), reason)]))
        assert not [a for a in acts if a.kind.startswith("slurm-")]


def test_cordon_on_admin_or_health_drain_leaves_it():
    for reason in ("admin: broken", "autoheal: xid 79"):
        k = node_obj("k8s-a", unschedulable=True)
        acts, _ = all_actions(world([Node("a", "IDLE", frozenset({"DRAIN"}), reason)], knodes={"k8s-a": k}))
        assert not [a for a in acts if a.kind.startswith("slurm-")]


def test_our_own_cordon_and_taint_are_not_signals():
    k = node_obj("k8s-a", unschedulable=True, annotations={"autoheal.io/cordoned-by": "autoheal"},
                 taints=[{"key": "autoheal.io/gpu-unhealthy", "value": "XID79", "effect": "NoSchedule"}])
    acts, _ = all_actions(world([Node("a", "IDLE")], knodes={"k8s-a": k}),
                          sync_cfg(drain_on_taints=["nvidia.com/gpu-error"]))
    assert not [a for a in acts if a.kind.startswith("slurm-")]


def test_configured_taint_and_condition_drain_and_change_reason():
    cfg = sync_cfg(drain_on_taints=["nvidia.com/gpu-error:NoSchedule"], drain_on_conditions=["GpuXid=True"],
                   drain_on_cordon=False)
    k = node_obj("k8s-a", taints=[{"key": "nvidia.com/gpu-error", "value": "xid79", "effect": "NoSchedule"}])
    acts, _ = all_actions(world([Node("a", "MIXED")], knodes={"k8s-a": k}), cfg)
    drains = [a.reason for a in acts if a.kind == SLURM_DRAIN]
    assert drains == ["autoheal: k8s: taint nvidia.com/gpu-error=xid79:NoSchedule"]
    k2 = node_obj("k8s-a", conditions=[{"type": "GpuXid", "status": "True", "reason": "XID79", "message": "gpu 2"}])
    held = Node("a", "MIXED", frozenset({"DRAIN"}), "autoheal: k8s: taint nvidia.com/gpu-error=xid79:NoSchedule")
    acts, _ = all_actions(world([held], knodes={"k8s-a": k2}), cfg)
    sr = [a for a in acts if a.kind == SLURM_SET_REASON]
    assert sr and sr[0].reason == "autoheal: k8s: condition GpuXid=True: XID79: gpu 2"
    # wrong effect: no match
    k3 = node_obj("k8s-a", taints=[{"key": "nvidia.com/gpu-error", "effect": "PreferNoSchedule"}])
    assert not [a for a in all_actions(world([Node("a", "IDLE")], knodes={"k8s-a": k3}), cfg)[0]
                if a.kind.startswith("slurm-")]


def test_missing_kubernetes_node_changes_nothing_in_slurm():
    ours = Node("a", "IDLE", frozenset({"DRAIN"}), "autoheal: k8s: node cordoned")
    acts, _ = all_actions(world([ours], knodes={}, pods={}))
    assert acts == []


def test_mass_cordon_is_refused_not_turned_into_mass_drain():
    slurm = [Node(f"n{i}", "IDLE") for i in range(10)]
    knodes = {f"k8s-n{i}": node_obj(f"k8s-n{i}", unschedulable=True) for i in range(10)}
    acts, problems = all_actions(world(slurm, knodes=knodes))
    assert not [a for a in acts if a.kind == SLURM_DRAIN]
    assert not [a for a in acts if a.kind == NODE_PATCH and "annotations" in a.body.get("metadata", {})]
    assert "refusing to drain 10" in problems[0]
    acts, problems = all_actions(world(slurm, knodes=knodes), sync_cfg(max_k8s_drain_fraction=1.0))
    assert len([a for a in acts if a.kind == SLURM_DRAIN]) == 10 and not problems


# ---- config --------------------------------------------------------------------------------------------
def test_config_rejects_own_taint_and_condition_as_signals():
    with pytest.raises(ConfigError, match="own taint"):
        parse_config('[sync]\ndrain_on_taints = ["autoheal.io/gpu-unhealthy:NoSchedule"]\n')
    with pytest.raises(ConfigError, match="own condition"):
        parse_config('[sync]\ndrain_on_conditions = ["GPUHealthy=False"]\n')
    with pytest.raises(ConfigError, match="mapping"):
        parse_config('[sync]\nmapping = "guess"\n')
    cfg = parse_config('[sync]\nmapping = "node-label"\ndrain_on_conditions = ["KernelDeadlock"]\n')
    assert cfg.sync.mapping == "node-label"
