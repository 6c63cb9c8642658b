"""The reconcile decisions: pure functions from one snapshot of both sides to a list of actions.

A pass runs named steps in order (declared in one list, ``steps.SYNC_STEPS``); each step looks at the
same read-only ``Context`` and returns a ``StepResult``: the ``Action``s it wants and the problems it found.
No step writes into the context, so no step's decision depends on which steps ran before it. Nothing here
talks to Slurm or Kubernetes, so every rule is unit-tested with plain data, and a dry run prints exactly
what a real pass would write. Remediation (issue 7, ``remediate_step``) is a further step of the same kind.

Rules that keep the two directions from feeding each other (see ``names``):
- only autoheal's *health* drains (``autoheal: ...`` but not ``autoheal: k8s: ...``) become the Node
  health condition and taint; a drain that came from Kubernetes never goes back as a Kubernetes signal;
- only *external* signals drain Slurm: a cordon autoheal made itself, autoheal's taint and condition
  are never signals (config validation forbids listing them);
- Slurm nodes are resumed only when their reason is ``autoheal: k8s: ...``; admin and health drains are
  never touched by this direction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from autoheal.k8s_sync import conditions as cond
from autoheal.k8s_sync import history, names
from autoheal.k8s_sync.mapping import Binding, map_nodes
from autoheal.reasons import strip_reason_suffix
from autoheal.slurm.model import Node
from autoheal.strenum import StrEnum

if TYPE_CHECKING:
    from autoheal.config.sync_section import SyncSection


class ActionKind(StrEnum):
    """Every write the sync's steps can ask of the engine (the engine knows how to perform each)."""

    POD_STATUS = "pod-status"
    NODE_STATUS = "node-status"
    NODE_PATCH = "node-patch"
    SLURM_DRAIN = "slurm-drain"
    SLURM_RESUME = "slurm-resume"
    SLURM_SET_REASON = "slurm-set-reason"
    # the remediation step's (autoheal.k8s_sync.remediation)
    KUBE_EVICT = "kube-evict"
    KUBE_DELETE_NODE = "kube-delete-node"
    KUBE_CREATE_CR = "kube-create-cr"
    KUBE_DELETE_CR = "kube-delete-cr"  # a stale replacement request, once the node no longer needs one
    WEBHOOK = "webhook"
    BREAKER_SAVE = "breaker-save"
    REPORT = "report"  # Event + journal + notification, no write
    SLURM_RETIRE = "slurm-retire"
    SLURM_RESUME_SPARE = "slurm-resume-spare"


POD_STATUS, NODE_STATUS, NODE_PATCH = ActionKind.POD_STATUS, ActionKind.NODE_STATUS, ActionKind.NODE_PATCH
SLURM_DRAIN, SLURM_RESUME = ActionKind.SLURM_DRAIN, ActionKind.SLURM_RESUME
SLURM_SET_REASON = ActionKind.SLURM_SET_REASON
SLURM_KINDS = (SLURM_DRAIN, SLURM_RESUME, SLURM_SET_REASON)


@dataclass
class Action:
    """One write a step wants: to a Kubernetes object (patch) or to a Slurm node."""

    step: str
    kind: ActionKind
    target: str  # Kubernetes object name, or Slurm node name for Slurm kinds
    slurm_node: str = ""
    namespace: str = ""
    patch_type: str = "strategic"  # strategic | merge
    body: Dict[str, Any] = field(default_factory=dict)
    reason: str = ""  # Slurm reason for drains
    why: str = ""  # one line for logs and dry runs
    event: Optional[Tuple[str, str, str]] = None  # (reason, message, Normal|Warning) on the Node
    group: str = ""  # actions of one group run in order; after one fails or is refused, the rest are skipped
    journal: str = ""  # journal event name to record when done (remediation steps)
    nodes: Tuple[str, ...] = ()  # Slurm nodes a fleet-wide record concerns (one journal record each)
    deadline: float = 0.0  # evictions: epoch seconds of the drain timeout (backoff never waits past it)
    force: bool = False  # evictions: the last attempt at the deadline, whatever the backoff says

    def describe(self) -> str:
        where = f"{self.namespace}/{self.target}" if self.namespace else self.target
        return f"{self.step}: {self.kind} {where}: {self.why}"


@dataclass
class Snapshot:
    """Both sides as read at the start of a pass (never partially: a failed read means no pass)."""

    slurm: Dict[str, Node]
    nodes: Dict[str, Dict[str, Any]]  # Kubernetes Nodes by name
    pods: Dict[str, Dict[str, Any]]  # slurmd pods by name (mapping = pod)
    now: str = "1970-01-01T00:00:00Z"
    # Read only when the "remediate" step is enabled (see ``remediate_step``); None: not read.
    clock: float = 0.0  # epoch seconds of ``now``
    jobs: Optional[Dict[str, int]] = None  # Slurm node -> jobs still holding it
    node_pods: Dict[str, List[Dict[str, Any]]] = field(default_factory=dict)  # Node -> its pods (all namespaces)
    replacements: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # custom resources by name
    breaker: Optional[Dict[str, str]] = None  # the breaker ConfigMap's data
    breaker_rv: str = ""


@dataclass(frozen=True)
class Context:
    """What every step of one pass reads: the snapshot, the config and the mapping made from them. Steps
    only read it; what they found goes into their ``StepResult``."""

    snap: Snapshot
    cfg: SyncSection
    bindings: Dict[str, Binding]
    mapping_problems: Tuple[str, ...] = ()  # what the mapping could not decide (reported once per pass)


@dataclass
class StepResult:
    """What one step returns: the writes it wants, in order, and the problems it found (for the pass
    summary, `sync status` and the problems metric)."""

    actions: List[Action] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)


def make_context(snap: Snapshot, cfg: SyncSection) -> Context:
    result = map_nodes(snap.slurm.keys(), snap.nodes, snap.pods, cfg.mapping, cfg.pod_key, cfg.node_label,
                       cfg.namespace)
    return Context(snap, cfg, result.bindings, tuple(result.problems))


# ---- step: Slurm state -> slurmd pod conditions ------------------------------------------------------
def slurm_to_pods(ctx: Context) -> StepResult:
    """Mirror each Slurm node's state onto its slurmd pod as SlurmNodeState* conditions."""
    cfg = ctx.cfg
    if not cfg.mirror_pod_conditions or cfg.mapping != "pod":
        return StepResult()
    prefix = cfg.condition_prefix
    out = []
    for name, b in sorted(ctx.bindings.items()):
        pod = ctx.snap.pods.get(b.pod or "")
        if pod is None or b.pod is None:
            continue
        node = ctx.snap.slurm[name]
        changed, stale = cond.diff_conditions(pod, cond.slurm_pod_conditions(node, prefix),
                                              lambda t: t.startswith(prefix))
        if not changed and not stale:
            continue
        ptype, body = cond.condition_patch(pod, changed, stale, ctx.snap.now)
        out.append(Action("slurm-to-pods", POD_STATUS, b.pod, name, b.namespace, ptype, body,
                          why=f"Slurm {node.state_text}" + (f" ({node.reason})" if node.reason else "")))
    return StepResult(out)


# ---- step: autoheal health drains -> Node condition + taint -------------------------------------------
def _health_drains(ctx: Context) -> Dict[str, List[Tuple[str, str]]]:
    """Kubernetes Node -> [(slurm node, reason)] of autoheal health drains on it."""
    out: Dict[str, List[Tuple[str, str]]] = {}
    for name, b in ctx.bindings.items():
        if not b.node:
            continue
        node = ctx.snap.slurm[name]
        out.setdefault(b.node, [])
        reason = strip_reason_suffix(node.reason)
        spare = getattr(ctx.cfg, "spare_reason_prefix", "").strip()
        if (node.drain or node.down) and names.is_health_reason(reason) and not (spare and reason.startswith(spare)):
            out[b.node].append((name, reason))
    return out


def health_to_nodes(ctx: Context) -> StepResult:
    """While autoheal's hardware drain is on a node: Node condition ``<health_condition>=False`` and
    (configurable) a NoSchedule taint; both removed once the drain is gone."""
    cfg = ctx.cfg
    out = []
    for kname, drains in sorted(_health_drains(ctx).items()):
        knode = ctx.snap.nodes.get(kname)
        if knode is None:
            continue
        slurm_name = drains[0][0] if drains else ""
        code = names.health_reason_code(drains[0][1]) if drains else ""
        message = "; ".join(f"{n}: {r}" for n, r in sorted(drains))
        if cfg.health_condition:
            desired = [cond.health_condition(cfg.health_condition, code, message)] if drains else []
            changed, stale = cond.diff_conditions(knode, desired, lambda t: t == cfg.health_condition)
            if changed or stale:
                ptype, body = cond.condition_patch(knode, changed, stale, ctx.snap.now)
                what = f"{cfg.health_condition}=False ({code})" if drains else f"{cfg.health_condition} removed"
                out.append(Action("health-to-nodes", NODE_STATUS, kname, slurm_name, "", ptype, body, why=what))
        if cfg.taint_unhealthy:
            want = {"key": cfg.taint_key, "value": names.label_value(code), "effect": cfg.taint_effect} \
                if drains else None
            taint_body = cond.taint_patch(knode, cfg.taint_key, want)
            if taint_body is not None:
                if want is not None:
                    why = f"taint {cfg.taint_key}={want['value']}:{cfg.taint_effect}: {message}"
                    event = ("AutohealTainted", why, "Warning")
                else:
                    why = f"taint {cfg.taint_key} removed: no autoheal drain left"
                    event = ("AutohealUntainted", why, "Normal")
                out.append(Action("health-to-nodes", NODE_PATCH, kname, slurm_name, "", "strategic", taint_body,
                                  why=why, event=event))
        hist = history.patch(knode, cfg.annotation_prefix, drains, ctx.snap.now) if drains else None
        if hist is not None:  # the sync's view of the node's fault history (issue 22, lemons)
            out.append(Action("health-to-nodes", NODE_PATCH, kname, slurm_name, "", "merge", hist,
                              why=f"fault history: {message}"))
    return StepResult(out)


# ---- step: Kubernetes signals -> Slurm drain / resume -------------------------------------------------
def _parse_taint_spec(spec: str) -> Tuple[str, Optional[str], Optional[str]]:
    effect = None
    if ":" in spec:
        spec, effect = spec.rsplit(":", 1)
    value = None
    if "=" in spec:
        spec, value = spec.split("=", 1)
    return spec, value, effect


def external_causes(knode: Dict[str, Any], cfg: SyncSection) -> List[Tuple[str, str]]:
    """(what, detail) for every external signal on a Node that takes it out of Slurm, in a fixed order
    (cordon, taints, conditions) so the chosen reason is stable across passes."""
    meta = knode.get("metadata") or {}
    ann = meta.get("annotations") or {}
    spec = knode.get("spec") or {}
    out: List[Tuple[str, str]] = []
    if cfg.drain_on_cordon and spec.get("unschedulable") \
            and ann.get(names.cordoned_by_key(cfg.annotation_prefix)) != names.ME:
        out.append(("node cordoned", ann.get(cfg.cordon_reason_annotation, "")))
    taint_list = cond.taints(knode)
    for tspec in cfg.drain_on_taints:
        key, value, effect = _parse_taint_spec(tspec)
        for t in taint_list:
            if t.get("key") == key and (value is None or (t.get("value") or "") == value) \
                    and (effect is None or t.get("effect") == effect):
                text = key + (f"={t['value']}" if t.get("value") else "") + f":{t.get('effect', '')}"
                out.append((f"taint {text}", ""))
                break
    conds = {c.get("type"): c for c in ((knode.get("status") or {}).get("conditions") or [])}
    for cspec in cfg.drain_on_conditions:
        ctype, _, status = cspec.partition("=")
        status = status or "True"
        c = conds.get(ctype)
        if c is not None and c.get("status") == status:
            detail = ": ".join(x for x in (c.get("reason") or "", c.get("message") or "") if x)
            out.append((f"condition {ctype}={status}", detail))
    return out


def nodes_to_slurm(ctx: Context) -> StepResult:
    """Cordon / configured taint / configured condition -> drain with ``autoheal: k8s: ...``; signal gone
    -> resume, only for our k8s drains; the origin annotation on the Node follows the Slurm reason."""
    cfg = ctx.cfg
    drains, others = [], []
    problems: List[str] = []
    origin_key = names.drain_origin_key(cfg.annotation_prefix)
    mapped = 0
    for name, b in sorted(ctx.bindings.items()):
        knode = ctx.snap.nodes.get(b.node or "")
        if knode is None or b.node is None:  # no Node: nothing is known about Kubernetes' view -> change nothing
            continue
        mapped += 1
        node = ctx.snap.slurm[name]
        current = strip_reason_suffix(node.reason)
        held = node.drain or node.down
        causes = external_causes(knode, cfg)
        # compared and recorded in the form Slurm stores (names.slurm_reason): no rewrite every pass
        origin = names.slurm_reason(current) if held and names.is_k8s_reason(current) else ""
        if causes:
            what, detail = causes[0]
            reason = names.k8s_reason(what, detail)
            if held and current and not names.is_k8s_reason(current):
                pass  # an admin's or a health drain: theirs, leave it
            elif held and names.same_reason(current, reason):
                pass
            elif held and current:
                others.append(Action("nodes-to-slurm", SLURM_SET_REASON, name, name, reason=reason,
                                     why=f"{what}; reason was {current!r}"))
                origin = reason
            else:
                drains.append(Action("nodes-to-slurm", SLURM_DRAIN, name, name, reason=reason,
                                     why=f"Kubernetes Node {b.node}: {what}",
                                     event=("AutohealSlurmDrain", f"Slurm node {name} drained: {reason}",
                                            "Normal")))
                origin = reason
        elif held and names.is_k8s_reason(current):
            others.append(Action("nodes-to-slurm", SLURM_RESUME, name, name,
                                 why=f"Kubernetes Node {b.node} no longer cordoned/tainted; drain was ours",
                                 event=("AutohealSlurmResume", f"Slurm node {name} resumed (was: {current})",
                                        "Normal")))
            origin = ""
        have = (knode.get("metadata") or {}).get("annotations", {}) or {}
        if (have.get(origin_key) or "") != origin:
            body = {"metadata": {"annotations": {origin_key: origin or None}}}
            others.append(Action("nodes-to-slurm", NODE_PATCH, b.node, name, "", "merge", body,
                                 why=f"{origin_key}={origin!r}" if origin else f"{origin_key} removed"))
    limit = max(2, math.floor(cfg.max_k8s_drain_fraction * mapped))
    if len(drains) > limit:
        problems.append(f"refusing to drain {len(drains)} Slurm nodes at once from Kubernetes signals "
                            f"(limit {limit} of {mapped}: sync.max_k8s_drain_fraction); check the cluster")
        drained_nodes = {a.target for a in drains}
        # the origin annotations for the refused drains must not be written either
        others = [a for a in others if not (a.kind == NODE_PATCH and a.slurm_node in drained_nodes
                                            and (a.body["metadata"]["annotations"][origin_key]))]
        drains = []
    # Slurm writes first, annotations after: an annotation must never claim a drain that did not happen.
    slurm_first = [a for a in drains + others if a.kind in SLURM_KINDS]
    return StepResult(slurm_first + [a for a in others if a.kind not in SLURM_KINDS], problems)
