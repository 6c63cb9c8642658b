"""The lab's kubelets (autoheal_lab.kubelet.plan): what they start, finish and register, and what they leave
alone as a real cluster would (a pod on a Node whose kubelet is gone stays Terminating)."""

from __future__ import annotations

from autoheal_lab.kubelet import node_ready, plan, running_pod_status


def node(name, ready="True"):
    conds = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {"metadata": {"name": name}, "status": {"conditions": conds}}


def pod(name, node_name, phase="Pending", deleting=False, ns="slurm"):
    meta = {"name": name, "namespace": ns, "uid": f"uid-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    spec = {"containers": [{"name": "c", "image": "x"}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_pending_pods_on_ready_nodes_start_and_unbound_ones_wait_for_a_scheduler():
    todo = plan({"a": node("a")}, [pod("p", "a"), pod("q", None), pod("r", "a", phase="Running")])
    assert [k for k, _ in todo["start"]] == [("slurm", "p", "uid-p")]
    assert todo["finish"] == [] and todo["register"] == []


def test_deleted_pods_finish_on_ready_nodes_and_as_orphans_but_not_on_a_node_whose_kubelet_is_gone():
    nodes = {"ok": node("ok"), "gone": node("gone", "Unknown"), "down": node("down", "False")}
    pods = [pod("p1", "ok", "Running", True), pod("p2", "gone", "Running", True),
            pod("p3", "down", "Running", True), pod("p4", "deleted-node", "Running", True)]
    todo = plan(nodes, pods)
    assert todo["finish"] == [("slurm", "p1", "uid-p1"), ("slurm", "p4", "uid-p4")]
    assert todo["start"] == []


def test_a_node_without_ready_is_registered_and_pods_on_a_not_ready_node_do_not_start():
    todo = plan({"new": node("new", None), "bad": node("bad", "False")}, [pod("p", "new"), pod("q", "bad")])
    assert todo["register"] == ["new"]
    assert [k[1] for k, _ in todo["start"]] == ["p"]  # registered this very pass


def test_running_status_is_ready_with_a_running_container_each():
    st = running_pod_status(pod("p", "a"))["status"]
    assert st["phase"] == "Running"
    assert {c["type"]: c["status"] for c in st["conditions"]}["Ready"] == "True"
    assert [c["name"] for c in st["containerStatuses"]] == ["c"] and st["containerStatuses"][0]["ready"]
    assert node_ready(node("x", "Unknown")) == "Unknown" and node_ready(node("x", None)) is None


def test_the_not_ready_taint_goes_once_the_node_is_ready_and_other_taints_stay():
    from autoheal_lab.kubelet import NOT_READY_TAINT, without_not_ready_taint

    tainted = node("a")
    tainted["metadata"]["resourceVersion"] = "7"
    tainted["spec"] = {"taints": [{"key": NOT_READY_TAINT, "effect": "NoSchedule"},
                                  {"key": "autoheal.io/gpu-unhealthy", "value": "XID79", "effect": "NoSchedule"}]}
    not_ready = node("b", "False")
    not_ready["spec"] = {"taints": [{"key": NOT_READY_TAINT, "effect": "NoSchedule"}]}
    assert plan({"a": tainted, "b": not_ready}, [])["untaint"] == ["a"]
    patch = without_not_ready_taint(tainted)
    assert patch["metadata"]["resourceVersion"] == "7"
    assert patch["spec"]["taints"] == [{"key": "autoheal.io/gpu-unhealthy", "value": "XID79", "effect": "NoSchedule"}]
    only = node("c")
    only["spec"] = {"taints": [{"key": NOT_READY_TAINT, "effect": "NoSchedule"}]}
    assert without_not_ready_taint(only)["spec"]["taints"] is None  # merge patch: remove the field
