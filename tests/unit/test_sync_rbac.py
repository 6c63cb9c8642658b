"""Least privilege for autoheal sync's ServiceAccount, per feature setting (issue 25, item 6).

For each chart setting: (1) the grants the chart renders are exactly ``rbac.grants(cfg)`` of the config
the chart renders next to them; (2) the sync's own code, run through its flows for that setting against
an in-memory API server that refuses (403) every call outside those grants, is never refused and uses
every one of them: nothing missing, nothing spare. Before this, the chart granted `delete` on Nodes,
cluster-wide evictions and unnamed ConfigMap and Lease rights whatever the setting.

The 403 of the real kube-apiserver for what is not granted is tested in
tests/integration/test_realkube_lab.py, where the sync runs under the chart's ServiceAccount.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from dataclasses import replace
from typing import ClassVar, Dict, Optional, Tuple

import pytest

yaml = pytest.importorskip("yaml")

from chart_render import CHART, helm_only, render  # noqa: E402
from sync_helpers import SLURMD_LABELS, k8s_name, memory_world, pod_name  # noqa: E402

from autoheal.config import parse_config  # noqa: E402
from autoheal.k8s_sync import rbac  # noqa: E402
from autoheal.k8s_sync.engine import Reconciler  # noqa: E402
from autoheal.k8s_sync.informer import Informer  # noqa: E402
from autoheal.k8s_sync.kube import KubeApi, KubeError  # noqa: E402
from autoheal.k8s_sync.leader import LeaderElector  # noqa: E402
from autoheal.slurm.model import Job, Node  # noqa: E402

# the hooks own the rung: their replace reason is what the sync acts on (issue 22, section 2)
XID79 = "autoheal: replace: xid 79 on GPU 3 of n1 (0000:3b:00.0): fallen off the bus"
SETTINGS = {
    "default": {},
    "no-nodes-to-slurm": {"nodesToSlurm": False},
    "remediation-label": {"remediation": {"enabled": True, "replacementAction": "label"}},
    "remediation-webhook": {"remediation": {"enabled": True, "replacementAction": "webhook",
                                            "webhookUrl": "https://provider.example/replace"}},
    "remediation-delete-node": {"remediation": {"enabled": True, "replacementAction": "delete-node"}},
    "remediation-custom-resource": {"remediation": {"enabled": True, "replacementAction": "custom-resource"}},
    "remediation-only": {"nodesToSlurm": False, "remediation": {"enabled": True, "replacementAction": "label"}},
}


def chart_config(docs):
    cm = [d for d in docs if d["kind"] == "ConfigMap" and "autoheal.toml" in (d.get("data") or {})][0]
    return parse_config(cm["data"]["autoheal.toml"], "chart ConfigMap")


def rendered_grants(docs, sa="autoheal-sync", namespace="slurm"):
    """Grants of the Roles/ClusterRoles bound to the ServiceAccount, as an API server reads them."""
    bound = set()
    for b in docs:
        if b["kind"] in ("RoleBinding", "ClusterRoleBinding") and \
                {"kind": "ServiceAccount", "name": sa, "namespace": namespace} in b["subjects"]:
            bound.add((b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace", "")))
    out = set()
    for d in docs:
        if d["kind"] not in ("Role", "ClusterRole"):
            continue
        ns = d["metadata"].get("namespace", "") if d["kind"] == "Role" else ""
        assert (d["kind"], d["metadata"]["name"], ns) in bound, f"{d['kind']} {d['metadata']['name']} is not bound"
        for rule in d["rules"]:
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    for v in rule["verbs"]:
                        for name in rule.get("resourceNames") or [""]:
                            out.add(rbac.Grant(ns, g, r, v, name))
    return out


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_chart_grants_exactly_what_the_setting_uses(setting):
    docs = render(overrides=SETTINGS[setting])
    cfg = chart_config(docs)
    assert rendered_grants(docs) == rbac.grants(cfg.sync)


def test_remediation_rights_exist_only_with_remediation():
    default = rendered_grants(render())
    for g in default:  # the breadth the issue names is gone from the default chart
        assert (g.resource, g.verb) not in {("nodes", "delete"), ("pods/eviction", "create"),
                                            ("nodereplacements", "create")}
        assert not (g.resource == "pods" and g.namespace == ""), "cluster-wide pod access without remediation"
        assert g.verb != "create" or g.resource == "events"  # no create of Leases / ConfigMaps at all
        if g.resource in ("configmaps", "leases"):
            assert g.name, f"{g} has no resourceNames"
    delete_node = rendered_grants(render(overrides=SETTINGS["remediation-delete-node"]))
    assert rbac.Grant("", "", "nodes", "delete") in delete_node
    assert rbac.Grant("", "", "nodes", "delete") not in rendered_grants(render(overrides=SETTINGS["remediation-label"]))


def test_static_manifests_are_the_default_chart():
    static = [d for d in yaml.safe_load_all((CHART.parents[1] / "manifests" / "autoheal-sync.yaml").read_text()) if d]
    key = lambda d: (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", ""))  # noqa: E731
    assert sorted(static, key=key) == sorted(render(), key=key)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_helm_renders_what_the_test_renderer_renders(setting, tmp_path):
    from helpers import helm_or_skip

    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(SETTINGS[setting]))
    argv = [helm_or_skip(), "template", "autoheal-sync", str(CHART), "--namespace", "slurm", "-f", str(values)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True,
                         cwd=tempfile.gettempdir()).stdout
    helm_docs = [d for d in yaml.safe_load_all(out) if d and not helm_only(d)]
    key = lambda d: (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", ""))  # noqa: E731
    assert sorted(helm_docs, key=key) == sorted(render(overrides=SETTINGS[setting]), key=key)


# ---- the code's own use, against an API server that enforces the grants ----------------------------------------

class Forbidden(KubeError):
    pass


class RbacKube:
    """MemoryKube behind an authorizer: a call outside ``granted`` answers 403 (as kube-apiserver would);
    ``used`` collects the granted rules the calls needed."""

    # how each method names the namespace and object of its call (argument positions)
    _WHERE: ClassVar[Dict[str, Tuple[Optional[int], Optional[int]]]] = {
        "list_pods": (0, None), "watch_pods": (0, None), "patch_pod_status": (0, 1),
        "get_lease": (0, 1), "replace_lease": (0, 1), "create_lease": (0, None),
        "get_configmap": (0, 1), "patch_configmap": (0, 1), "create_configmap": (0, None),
        "create_custom": (2, None), "list_custom": (2, None), "delete_custom": (2, 4),
        "evict_pod": (0, 1), "create_event": (0, None),
        "list_nodes": (None, None), "watch_nodes": (None, None), "patch_node": (None, 0),
        "patch_node_status": (None, 0), "delete_node": (None, 0), "list_node_pods": (None, None),
    }
    _NAMED_VERBS = ("get", "update", "patch", "delete")

    def __init__(self, inner, granted, cfg):
        self.inner, self.granted, self.cfg = inner, granted, cfg
        self.used = set()
        self.refused = []

    def __getattr__(self, method):
        target = getattr(self.inner, method)
        if method not in self._WHERE:
            return target

        def call(*args, **kwargs):
            ns_at, name_at = self._WHERE[method]
            ns = args[ns_at] if ns_at is not None else ""
            if method == "create_event" and kwargs.get("kind", args[6] if len(args) > 6 else "Node") == "Node":
                ns = "default"  # KubeApi files Node Events in "default"
            name = args[name_at] if name_at is not None else ""
            for group, resource, verb in getattr(KubeApi, method).rbac:
                if resource == "nodereplacements":
                    group, resource = args[0], args[3]
                need = rbac.Grant(ns, group, resource, verb, name if verb in self._NAMED_VERBS else "")
                rules = [g for g in self.granted if rbac.allowed(need, [g])]
                if not rules:
                    self.refused.append(need)
                    raise Forbidden(f"{method}: HTTP 403: {need} not granted", 403)
                self.used.update(rules)
            return target(*args, **kwargs)

        return call


def _world(cfg, granted, n=4):
    names = [f"n{i}" for i in range(1, n + 1)]
    slurm, mem = memory_world(names, namespace=cfg.namespace)
    slurm.nodes["spare1"] = Node("spare1", "DOWN", frozenset({"DRAIN", "NOT_RESPONDING"}),
                                 "autoheal: spare: held in the spare pool")
    # what the chart creates: the Lease, and with remediation the breaker ConfigMap
    mem.leases[(cfg.namespace, cfg.lease_name)] = {"metadata": {"name": cfg.lease_name, "namespace": cfg.namespace,
                                                               "resourceVersion": "1"}, "spec": {}}
    if "remediate" in cfg.enabled_steps:
        mem.configmaps[(cfg.namespace, cfg.breaker_configmap)] = {
            "metadata": {"name": cfg.breaker_configmap, "namespace": cfg.namespace, "resourceVersion": "1"},
            "data": {}}
    return slurm, mem, RbacKube(mem, granted, cfg)


class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def _run(r, passes=6):
    # a refused write lands in res.errors (the pass goes on); RbacKube.refused is what the test checks
    for _ in range(passes):
        res = r.run_pass()
        assert res.ok, res.read_error


def _flows(cfg, granted):
    """Every code path the setting enables: informers, leader election, each step, remediation to the end
    and a tripped breaker. Returns the RbacKube proxies used."""
    proxies = []
    slurm, mem, kube = _world(cfg, granted)
    proxies.append(kube)
    informers = [Informer("nodes", kube.list_nodes, kube.watch_nodes, 5)]
    if cfg.mapping == "pod":
        informers.append(Informer("pods", lambda: kube.list_pods(cfg.namespace, cfg.pod_selector),
                                  lambda rv, t: kube.watch_pods(cfg.namespace, cfg.pod_selector, rv, t), 5))
    for inf in informers:
        inf.start()
    deadline = time.monotonic() + 10
    while not all(inf.synced for inf in informers) and time.monotonic() < deadline:
        time.sleep(0.02)
    for inf in informers:
        inf.stop()
    assert all(inf.synced for inf in informers)
    elector = LeaderElector(kube, cfg.namespace, cfg.lease_name, "sync-0", duration=15)
    assert elector.try_acquire_or_renew() and elector.try_acquire_or_renew()
    elector.release()
    # Slurm -> Kubernetes: a health drain (pod conditions, taint, GPUHealthy, Events); Kubernetes -> Slurm: a
    # cordon by someone else (drain + origin annotations); with remediation: n1 replaced by spare1
    clock = Clock()
    r = Reconciler(slurm, kube, cfg, clock=clock)
    slurm.jobs = {"7": Job("7", "RUNNING", ("n1",))}
    slurm.drain("n1", XID79)
    mem.add_workload_pod("inference", "llm-0", k8s_name("n1"))
    mem.nodes[k8s_name("n3")]["spec"]["unschedulable"] = True
    _run(r, 3)
    slurm.jobs = {"7": Job("7", "PENDING", ())}  # requeued by the hooks
    _run(r, 6)
    if "remediate" in cfg.enabled_steps:
        spare = slurm.nodes["spare1"]
        slurm.nodes["spare1"] = replace(spare, state="IDLE", flags=frozenset({"DRAIN"}))
        mem.add_node(k8s_name("spare1"))
        mem.add_pod(cfg.namespace, pod_name("spare1"), k8s_name("spare1"), "spare1", SLURMD_LABELS)
        if k8s_name("n1") in mem.nodes:  # (delete-node: gone, the pool's new Node is the spare)
            ann = mem.nodes[k8s_name("n1")]["metadata"].setdefault("annotations", {})
            ann[f"{cfg.annotation_prefix}/replacement-node"] = k8s_name("spare1")
        for cr in mem.customs.values():
            cr["status"] = {"replacementNode": k8s_name("spare1")}
        _run(r, 6)
        if cfg.replacement_action == "custom-resource":
            # a replacement that never comes: the remediation fails; the node repaired by hand, the
            # stale request is deleted
            slurm3, mem3, kube3 = _world(cfg, granted)
            proxies.append(kube3)
            clock3 = Clock()
            r3 = Reconciler(slurm3, kube3, cfg, clock=clock3)
            slurm3.drain("n2", XID79)
            _run(r3, 6)
            assert mem3.customs
            clock3.t += cfg.remediation_replace_timeout_seconds + 1
            _run(r3, 4)
            slurm3.resume("n2")
            _run(r3, 3)
            assert not mem3.customs
        # a breaker trip: most of the fleet drained at once (its Events are about the breaker ConfigMap)
        slurm2, mem2, kube2 = _world(cfg, granted, n=8)
        proxies.append(kube2)
        for i in range(1, 7):
            slurm2.drain(f"n{i}", XID79)
        r2 = Reconciler(slurm2, kube2, cfg, clock=Clock())
        _run(r2, 2)
        assert any(e["reason"] == "AutohealBreakerTripped" for e in mem2.events)
    return proxies


FLOW_SETTINGS = ["default", "no-nodes-to-slurm", "remediation-label", "remediation-delete-node",
                 "remediation-custom-resource", "remediation-only"]


@pytest.mark.parametrize("setting", FLOW_SETTINGS)
def test_the_code_uses_exactly_the_grants_of_its_setting(setting):
    docs = render(overrides=SETTINGS[setting])
    cfg = chart_config(docs).sync
    cfg = replace(cfg, api_writes_per_second=10000.0, api_write_burst=100000, slurm_writes_per_second=10000.0,
                  slurm_write_burst=100000, remediation_grace_seconds=100, remediation_drain_timeout_seconds=100,
                  remediation_replace_timeout_seconds=100)
    granted = rendered_grants(docs)
    proxies = _flows(cfg, granted)
    refused = [g for p in proxies for g in p.refused]
    assert refused == []  # nothing the code does is missing from the chart
    used = set().union(*(p.used for p in proxies))
    assert used == granted, f"granted but never used: {sorted(granted - used)}"  # nothing spare


def test_the_authorizer_refuses_what_is_not_granted():
    # the double is what makes the flow test able to fail: a write to another controller's ConfigMap or
    # Lease, a Node deletion without delete-node, a create of the Lease are refused
    docs = render()
    cfg = chart_config(docs).sync
    _slurm, mem, kube = _world(cfg, rendered_grants(docs))
    mem.configmaps[("slurm", "slurm-config")] = {"metadata": {"name": "slurm-config"}, "data": {}}
    for call in (lambda: kube.patch_configmap("slurm", "slurm-config", {"data": {"slurm.conf": "x"}}),
                 lambda: kube.get_lease("slurm", "slinky-operator"),
                 lambda: kube.create_lease("slurm", {"metadata": {"name": "autoheal-sync"}}),
                 lambda: kube.delete_node(k8s_name("n1")),
                 lambda: kube.evict_pod("inference", "llm-0"),
                 lambda: kube.list_node_pods(k8s_name("n1"))):
        with pytest.raises(Forbidden):
            call()
    assert mem.configmaps[("slurm", "slurm-config")]["data"] == {}
