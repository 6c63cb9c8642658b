"""The ``remediate`` reconcile step (issue 7): replace nodes autoheal drained with a replace-class fault.

Pure: from one ``Snapshot`` (Slurm nodes, Nodes, the pods on candidate Nodes, Slurm jobs per node,
replacement custom resources, the breaker ConfigMap) to a list of ``Action``s. Actions for one Node share
a ``group``: the engine runs them in order and skips the rest of a group once one fails, so a side
effect never runs without the state that announces it.

Flow per Node: (wants replacement) -> quarantined (waits for its Slurm jobs to leave, bounded) ->
opt-out check -> draining (cordon + state in one patch; evict non-DaemonSet pods, PDB 429s retried with
backoff until the drain timeout) -> replacing (request: label / delete Node / custom resource / webhook)
-> done (the replacement's Slurm node resumed from its spare drain, the old one retired) | failed.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from autoheal.reasons import strip_reason_suffix

from autoheal.k8s_sync import names
from autoheal.k8s_sync import remediation as R
from autoheal.k8s_sync.plan import NODE_PATCH, Action, Context, register_step

STEP = "remediate"
NOT_IN_SERVICE = ("DOWN", "UNKNOWN", "FUTURE")


def _ann(obj: Dict[str, Any]) -> Dict[str, str]:
    return ((obj or {}).get("metadata") or {}).get("annotations") or {}


def _labels(obj: Dict[str, Any]) -> Dict[str, str]:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def _ready(knode: Dict[str, Any]) -> bool:
    for c in ((knode.get("status") or {}).get("conditions") or []):
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def evictable_pods(pods: List[Dict[str, Any]], slurmd_pod: Optional[str]) -> List[Dict[str, Any]]:
    """Pods eviction has to remove: not DaemonSet pods, not static (mirror) pods, not the node's own
    slurmd pod (it goes with the Node; Slinky: never before the node left Slurm), not terminating."""
    out = []
    for p in pods:
        meta = p.get("metadata") or {}
        if R.is_daemonset_pod(p) or meta.get("deletionTimestamp") or meta.get("name") == slurmd_pod \
                or "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
            continue
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        out.append(p)
    return out


def replacement_of(kname: str, knode: Dict[str, Any], snap, cfg) -> str:
    """The Node name the provider says replaces ``kname`` (custom resource status or annotation)."""
    k = R.keys(cfg.annotation_prefix)
    cr = snap.replacements.get(kname)
    if cr is not None:
        name = ((cr.get("status") or {}).get("replacementNode") or "")
        if name:
            return name
    return _ann(knode).get(k["replacement"], "")


def _in_service(node) -> bool:
    return node is not None and node.state not in NOT_IN_SERVICE and "NOT_RESPONDING" not in node.flags


def remediate(ctx: Context) -> List[Action]:
    """All remediation actions for this snapshot (see the module docstring)."""
    cfg, snap = ctx.cfg, ctx.snap
    if snap.breaker is None or snap.jobs is None:
        ctx.problems.append("remediation: breaker state or Slurm jobs not read; no remediation this pass")
        return []
    settings = R.RemediationSettings.from_cfg(cfg)
    prefix = cfg.annotation_prefix
    k = R.keys(prefix)
    now = snap.clock
    slurm_of = {b.node: name for name, b in ctx.bindings.items() if b.node}
    total = len(slurm_of)
    out: List[Action] = []
    active: List[Tuple[str, R.NodeRemediation]] = []
    wanting: List[Tuple[str, str]] = []
    affected = 0
    for kname in sorted(snap.nodes):
        knode = snap.nodes[kname]
        cur = R.NodeRemediation.from_node(knode, prefix)
        sname = slurm_of.get(kname) or cur.slurm_node
        snode = snap.slurm.get(sname)
        held = snode is not None and (snode.drain or snode.down)
        wants = held and R.wants_replace(snode.reason, cfg)
        if cur.state in R.ACTIVE:
            active.append((kname, cur))
            affected += 1
            continue
        if held and names.is_health_reason(snode.reason) and not R.is_retired(snode.reason) \
                and not strip_reason_suffix(snode.reason).startswith(cfg.spare_reason_prefix.strip()):
            affected += 1  # retired nodes left the pool; spares were never in it
        if cur.state in R.TERMINAL or _ann(knode).get(k["opted-out"]):
            if not wants and (cur.state == "failed" or _ann(knode).get(k["opted-out"])):
                # healed (the hooks resumed it) or no longer asking: forget, so the next fault starts fresh
                body = R.NodeRemediation("", 0, cur.attempts).patch(prefix)
                body["metadata"]["annotations"][k["opted-out"]] = None
                body["metadata"]["annotations"][k["attempts"]] = str(cur.attempts) if cur.attempts else None
                out.append(Action(STEP, NODE_PATCH, kname, sname, "", "merge", body, group=kname,
                                  why=f"remediation record cleared: Slurm node {sname} no longer asks for a "
                                      f"replacement"))
            continue
        if wants:
            wanting.append((kname, sname))
    breaker = R.Breaker.from_cfg(cfg, snap.breaker)
    ctx.breaker_state = breaker  # type: ignore[attr-defined]  # for the pass summary
    before = breaker.dump()
    n_allowed, why_not = breaker.allowed(len(active), affected, total, now)
    started = 0
    for kname, sname in wanting:
        knode = snap.nodes[kname]
        cur = R.NodeRemediation.from_node(knode, prefix)
        pods = snap.node_pods.get(kname)
        if pods is None:
            ctx.problems.append(f"remediation: pods on Node {kname} not read; skipped")
            continue
        step = R.next_step(cur, True, snap.jobs.get(sname, 0), pods, False, settings, now, sname)
        if step.do == "report-opt-out":
            out.extend(_opt_out(kname, sname, step.why, prefix))
            continue
        if started >= n_allowed:
            ctx.problems.append(f"remediation of {kname} ({sname}) not started: {why_not or 'breaker limit'}")
            continue
        started += 1
        breaker.record_start(now)
        then = step.then
        out.append(_state(kname, sname, then, prefix, f"quarantined: {snode_reason(snap, sname)}",
                          event=("AutohealQuarantined", f"Node {kname} (Slurm {sname}) quarantined for "
                                 f"replacement: {snode_reason(snap, sname)}", "Warning"), journal="remediation"))
    if breaker.check_trip(affected, total, now):
        ctx.problems.append(f"circuit breaker tripped: {breaker.why}")
        out.append(Action(STEP, R.REPORT, "", "", why=f"circuit breaker tripped: {breaker.why}; no new "
                          f"remediations until it re-arms or `autoheal sync breaker reset`",
                          event=("AutohealBreakerTripped", breaker.why, "Warning"), journal="breaker-tripped"))
    elif breaker.tripped:
        ctx.problems.append(f"circuit breaker tripped: {breaker.why}; {len(wanting)} nodes waiting")
    if before != breaker.dump():
        body = {"data": breaker.dump()}
        if snap.breaker_rv:
            body["metadata"] = {"resourceVersion": snap.breaker_rv}
        out.insert(0, Action(STEP, R.BREAKER_SAVE, cfg.breaker_configmap, "", cfg.namespace, "merge", body,
                             why="breaker state: " + ("tripped" if breaker.tripped else
                                                      f"{len(breaker.starts)} starts in window")))
        if before.get("trippedAt") and not breaker.tripped:
            out.append(Action(STEP, R.REPORT, "", "", why="circuit breaker re-armed",
                              event=("AutohealBreakerRearmed", "circuit breaker re-armed", "Normal"),
                              journal="breaker-rearmed"))
    for kname, cur in active:
        out.extend(_advance(ctx, kname, cur, settings, now))
    return out


def snode_reason(snap, sname: str) -> str:
    node = snap.slurm.get(sname)
    return strip_reason_suffix(node.reason) if node is not None else ""


def _state(kname: str, sname: str, then: R.NodeRemediation, prefix: str, why: str, extra=None, event=None,
           journal: str = "remediation") -> Action:
    body = _deep_merge(then.patch(prefix), extra or {})
    return Action(STEP, NODE_PATCH, kname, sname, "", "merge", body, why=f"{then.state or 'cleared'}: {why}",
                  event=event, group=kname, journal=journal)


def _deep_merge(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        out[key] = _deep_merge(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def _opt_out(kname: str, sname: str, why: str, prefix: str) -> List[Action]:
    k = R.keys(prefix)
    body = R.NodeRemediation().patch(prefix)
    body["metadata"]["annotations"][k["opted-out"]] = why[:256]
    return [Action(STEP, NODE_PATCH, kname, sname, "", "merge", body, group=kname,
                   why=f"opted out of automatic replacement: {why}; no action",
                   event=("AutohealReplaceOptOut", f"Node {kname} (Slurm {sname}) needs replacing but {why}: "
                          "no automatic action, replace it by hand", "Warning"), journal="remediation-opt-out")]


def _advance(ctx: Context, kname: str, cur: R.NodeRemediation, settings, now: float) -> List[Action]:
    cfg, snap = ctx.cfg, ctx.snap
    prefix = cfg.annotation_prefix
    knode = snap.nodes[kname]
    sname = cur.slurm_node or next((n for n, b in ctx.bindings.items() if b.node == kname), "")
    slurmd_pod = next((b.pod for b in ctx.bindings.values() if b.node == kname), None)
    pods = snap.node_pods.get(kname)
    if pods is None:
        ctx.problems.append(f"remediation: pods on Node {kname} not read; skipped")
        return []
    evict = evictable_pods(pods, slurmd_pod)
    new = replacement_of(kname, knode, snap, cfg)
    new_slurm = next((n for n, b in ctx.bindings.items() if new and b.node == new), "")
    ready = bool(new) and new in snap.nodes and _ready(snap.nodes[new]) and _in_service(snap.slurm.get(new_slurm))
    step = R.next_step(cur, True, snap.jobs.get(sname, 0), evict if cur.state != "quarantined" else pods,
                       ready, settings, now, sname)
    cordon = {"spec": {"unschedulable": True},
              "metadata": {"annotations": {names.cordoned_by_key(prefix): names.ME}}}
    out: List[Action] = []
    if step.do == "report-opt-out":
        return _opt_out(kname, sname, step.why, prefix)
    if step.do == "fail":
        then = step.then
        return [_state(kname, sname, then, prefix, then.reason,
                       event=("AutohealRemediationFailed", f"Node {kname} (Slurm {sname}): remediation failed: "
                              f"{then.reason}", "Warning"), journal="remediation-failed")]
    if step.do == "cordon":
        return [_state(kname, sname, step.then, prefix, "cordoned; evicting its pods", extra=cordon,
                       event=("AutohealCordoned", f"Node {kname} cordoned for replacement (Slurm {sname})",
                              "Normal"))]
    if cur.state in ("draining", "drained") and not (knode.get("spec") or {}).get("unschedulable"):
        # a crash between states, or someone uncordoned it: the flow needs it cordoned
        out.append(Action(STEP, NODE_PATCH, kname, sname, "", "merge", cordon, group=kname, why="re-cordon"))
    if step.do == "evict":
        for p in evict:
            meta = p.get("metadata") or {}
            out.append(Action(STEP, R.KUBE_EVICT, meta.get("name", ""), sname, meta.get("namespace", ""),
                              group=f"evict:{kname}", why=f"evict from {kname}"))
        return out
    if step.do == "request-replacement":
        return out + _request(ctx, kname, sname, step.then, knode)
    if cur.state == "replacing" and step.do == "wait":
        return out + _ensure_request(ctx, kname, sname, cur, knode)
    if step.do == "retire":
        acts = [_state(kname, sname, step.then, prefix, f"replaced by {new} (Slurm {new_slurm})",
                       event=("AutohealReplaced", f"Node {kname} (Slurm {sname}) replaced by {new} (Slurm "
                              f"{new_slurm})", "Normal"), journal="remediation-done")]
        spare = snap.slurm.get(new_slurm)
        if spare is not None and (spare.drain or spare.down) and \
                strip_reason_suffix(spare.reason).startswith(cfg.spare_reason_prefix.strip()):
            acts.append(Action(STEP, R.SLURM_RESUME_SPARE, new_slurm, new_slurm, group=kname,
                               why=f"replacement {new_slurm} comes into service", journal="resume"))
        if sname in snap.slurm:
            acts.append(Action(STEP, R.SLURM_RETIRE, sname, sname, reason=R.retire_reason(new_slurm), group=kname,
                               why=f"{sname} retired: replaced by {new_slurm}", journal="retire"))
        return out + acts
    return out


def _request(ctx: Context, kname: str, sname: str, then: R.NodeRemediation, knode) -> List[Action]:
    """State ``replacing`` plus the configured request (label: one patch; others: state first)."""
    cfg = ctx.cfg
    prefix = cfg.annotation_prefix
    k = R.keys(prefix)
    reason = snode_reason(ctx.snap, sname)
    action = cfg.replacement_action
    ev = ("AutohealReplacementRequested", f"Node {kname} (Slurm {sname}): replacement requested ({action}): "
          f"{reason}", "Normal")
    if action == "label":
        lkey, _, lval = cfg.replacement_label.partition("=")
        extra = {"metadata": {"labels": {lkey: lval}, "annotations": {k["requested"]: str(int(then.since))}}}
        return [_state(kname, sname, then, prefix, f"label {cfg.replacement_label}", extra=extra, event=ev)]
    acts = [_state(kname, sname, then, prefix, f"request via {action}", event=ev)]
    return acts + _request_effect(ctx, kname, sname, reason)


def _request_effect(ctx: Context, kname: str, sname: str, reason: str) -> List[Action]:
    cfg = ctx.cfg
    action = cfg.replacement_action
    if action == "delete-node":
        # the Node (and its annotations) go away with the request: retire the Slurm node first
        return [Action(STEP, R.SLURM_RETIRE, sname, sname, reason=R.retire_reason(""), group=kname,
                       why=f"{sname} retired: its Node is deleted for replacement", journal="retire"),
                Action(STEP, R.KUBE_DELETE_NODE, kname, sname, group=kname, why="delete Node for replacement")]
    if action == "custom-resource":
        body = R.render_template(cfg.replacement_template, kname, sname, reason)
        return [Action(STEP, R.KUBE_CREATE_CR, kname, sname, cfg.namespace, body=body, group=kname,
                       why=f"create {body.get('kind')} {(body.get('metadata') or {}).get('name')}")]
    body = {"node": kname, "slurm_node": sname, "reason": reason}
    return [Action(STEP, R.WEBHOOK, cfg.replacement_webhook, sname, body=body, group=kname,
                   why=f"POST replacement request for {kname}")]


def _ensure_request(ctx: Context, kname: str, sname: str, cur: R.NodeRemediation, knode) -> List[Action]:
    """In ``replacing``: re-issue a request that a crash lost (all requests are idempotent)."""
    cfg = ctx.cfg
    k = R.keys(cfg.annotation_prefix)
    action = cfg.replacement_action
    if action == "label":
        lkey, _, lval = cfg.replacement_label.partition("=")
        if _labels(knode).get(lkey) != lval:
            return [Action(STEP, NODE_PATCH, kname, sname, "", "merge", {"metadata": {"labels": {lkey: lval}}},
                           group=kname, why=f"re-label {cfg.replacement_label}")]
        return []
    if action == "custom-resource":
        if kname in ctx.snap.replacements:
            return []
        return _request_effect(ctx, kname, sname, snode_reason(ctx.snap, sname))
    if action == "webhook" and not _ann(knode).get(k["requested"]):
        return _request_effect(ctx, kname, sname, snode_reason(ctx.snap, sname))
    return []


def candidates(snap, cfg, bindings) -> List[str]:
    """Nodes whose pods the engine must read for this step: active remediations and new candidates."""
    prefix = cfg.annotation_prefix
    slurm_of = {b.node: name for name, b in bindings.items() if b.node}
    out = []
    for kname, knode in snap.nodes.items():
        cur = R.NodeRemediation.from_node(knode, prefix)
        if cur.state in R.ACTIVE:
            out.append(kname)
            continue
        snode = snap.slurm.get(slurm_of.get(kname, ""))
        if snode is not None and (snode.drain or snode.down) and R.wants_replace(snode.reason, cfg) \
                and cur.state not in R.TERMINAL:
            out.append(kname)
    return sorted(out)


register_step(STEP, remediate)
