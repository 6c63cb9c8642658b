"""The Kubernetes rights ``autoheal sync`` needs for a given configuration, and not one more.

Which adapter methods (``KubeClient``) each part of the sync calls is declared here, next to the part
that enables it; the RBAC verb and resource of each method come from the adapter itself (``@needs`` in
``kube.py``); where it is called (cluster-wide, the sync's namespace, ``default`` for Node Events) and
which object it may touch (``resourceNames``) is the ``SCOPES`` table. ``grants(cfg)`` is what the Helm
chart must render for that configuration: ``tests/unit/test_sync_rbac.py`` renders the chart for each
feature setting and checks the grants are exactly these, and runs the sync's flows for each setting
against an in-memory API server that refuses every call outside them and records which it used (the
used set must equal the granted set: nothing missing, nothing spare).

Two choices that keep the grants small:

* The leader Lease and the breaker ConfigMap are created by the chart, so the sync is granted
  ``get``/``update``/``patch`` on those two names only and no ``create`` (RBAC cannot restrict ``create``
  by name: a ``create`` grant would let a compromised sync create any ConfigMap or Lease in its
  namespace, another controller's Lease included while that one is absent).
* Remediation's rules (cluster-wide pod list and evictions, Node deletion, replacement requests, the
  breaker ConfigMap) exist only when the chart turns remediation on, and Node deletion only for
  ``replacement_action = "delete-node"``.

The lab's real kube-apiserver enforces these grants: tests/integration/test_realkube_lab.py runs the sync
as the chart's ServiceAccount and shows what it must not do answering 403.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Iterable, Set, Tuple

if TYPE_CHECKING:
    from autoheal.config.sync_section import SyncSection

#: Called whatever the configuration: the Node informer (list + watch).
ALWAYS: Tuple[str, ...] = ("list_nodes", "watch_nodes")
#: leader_election = true: the Lease (created by the chart: renewed and taken over, never created).
LEADER: Tuple[str, ...] = ("get_lease", "replace_lease")
#: mapping = "pod": the slurmd pod informer in the sync's namespace.
POD_MAPPING: Tuple[str, ...] = ("list_pods", "watch_pods")
#: events = true: an Event per drain, resume and taint change (Node Events live in "default").
EVENTS: Tuple[str, ...] = ("create_event",)
#: Per reconcile step (sync.enabled_steps): the writes that step makes.
STEP_CALLS: Dict[str, Tuple[str, ...]] = {
    "slurm-to-pods": ("patch_pod_status",),  # SlurmNodeState* conditions on slurmd pods
    "health-to-nodes": ("patch_node", "patch_node_status"),  # taint, GPUHealthy condition
    "nodes-to-slurm": ("patch_node",),  # the drain-origin annotations on the Node it mirrored
    # the breaker state, the pods on a Node being replaced (any namespace), evictions, cordon + marks
    "remediate": ("get_configmap", "patch_configmap", "list_node_pods", "evict_pod", "patch_node"),
}
#: Per sync.replacement_action, with the remediate step: how a replacement is asked for.
ACTION_CALLS: Dict[str, Tuple[str, ...]] = {
    "label": (),  # a label on the Node: patch_node, granted with the step
    "webhook": (),  # a POST, then an annotation on the Node (patch_node)
    "delete-node": ("delete_node",),
    "custom-resource": ("create_custom", "list_custom", "delete_custom"),
}

CLUSTER, OWN, DEFAULT = "cluster", "own", "default"
#: method -> (where: cluster-wide, the sync's namespace or "default"; which object name: "" any,
#: "lease" sync.lease_name, "breaker" sync.breaker_configmap)
SCOPES: Dict[str, Tuple[str, str]] = {
    "list_nodes": (CLUSTER, ""), "watch_nodes": (CLUSTER, ""), "patch_node": (CLUSTER, ""),
    "patch_node_status": (CLUSTER, ""), "delete_node": (CLUSTER, ""),
    "list_node_pods": (CLUSTER, ""), "evict_pod": (CLUSTER, ""),
    "list_pods": (OWN, ""), "watch_pods": (OWN, ""), "patch_pod_status": (OWN, ""),
    "get_lease": (OWN, "lease"), "replace_lease": (OWN, "lease"),
    "get_configmap": (OWN, "breaker"), "patch_configmap": (OWN, "breaker"),
    "create_custom": (OWN, ""), "list_custom": (OWN, ""), "delete_custom": (OWN, ""),
    "create_event": (DEFAULT, ""),
}


@dataclass(frozen=True, order=True)
class Grant:
    """One allowed (namespace, apiGroup, resource, verb, resourceName); namespace "" is cluster-wide,
    name "" any object."""

    namespace: str
    group: str
    resource: str
    verb: str
    name: str = ""


def methods(cfg: SyncSection) -> Set[str]:
    """The adapter methods the sync calls with this configuration."""
    out = set(ALWAYS)
    if cfg.leader_election:
        out.update(LEADER)
    if cfg.mapping == "pod":
        out.update(POD_MAPPING)
    if cfg.events:
        out.update(EVENTS)
    for step in cfg.enabled_steps:
        out.update(STEP_CALLS.get(step, ()))
    if "remediate" in cfg.enabled_steps:
        out.update(ACTION_CALLS.get(cfg.replacement_action, ()))
    return out


def method_grants(method: str, cfg: SyncSection, namespace: str = "", name: str = "") -> Set[Grant]:
    """The grants one call of ``method`` needs. ``namespace``/``name``: the call's own (for checking a
    call as an API server would); by default those of the method's scope for ``cfg``."""
    from autoheal.k8s_sync.kube import KubeApi

    where, named = SCOPES[method]
    if not namespace:
        namespace = {CLUSTER: "", OWN: cfg.namespace, DEFAULT: "default"}[where]
    if not name:
        name = {"lease": cfg.lease_name, "breaker": cfg.breaker_configmap}.get(named, "")
    perms = getattr(KubeApi, method).rbac
    out = set()
    for group, resource, verb in perms:
        if resource == "nodereplacements":  # the group and plural the template names
            from autoheal.k8s_sync.remediation import cr_coordinates

            group, _version, resource = cr_coordinates(cfg.replacement_template)
        out.add(Grant(namespace, group, resource, verb, name))
    return out


def grants(cfg: SyncSection) -> Set[Grant]:
    """Every grant the sync needs with this configuration."""
    out: Set[Grant] = set()
    for m in methods(cfg):
        out |= method_grants(m, cfg)
    if cfg.events and "remediate" in cfg.enabled_steps:
        # the breaker's Events are about its ConfigMap, in the sync's namespace
        out |= {Grant(cfg.namespace, g.group, g.resource, g.verb) for g in method_grants("create_event", cfg)}
    return out


def allowed(grant: Grant, granted: Iterable[Grant]) -> bool:
    """Whether an API server with ``granted`` lets ``grant`` through (a named grant allows that name only;
    an unnamed one any name; a cluster-wide one any namespace)."""
    for g in granted:
        if (g.group, g.resource, g.verb) != (grant.group, grant.resource, grant.verb):
            continue
        if g.namespace and g.namespace != grant.namespace:
            continue
        if g.name and g.name != grant.name:
            continue
        return True
    return False
