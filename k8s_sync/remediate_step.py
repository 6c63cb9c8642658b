"""The ``remediate`` reconcile step (issue 7): replace nodes autoheal drained with a replace-class fault.

Pure: from one ``Snapshot`` (Slurm nodes, Nodes, the pods on candidate Nodes, Slurm jobs per node,
replacement custom resources, the breaker ConfigMap) to a list of ``Action``s. Actions for one Node share
a ``group``: the engine runs them in order and skips the rest of a group once one fails, so a side
effect never runs without the state that announces it.

Flow per Node: (wants replacement) -> opt-out check (Node or pod label, re-evaluated every pass) ->
quarantined (waits for its Slurm jobs to leave, bounded) -> opt-out check -> draining (cordon + state in
one patch; evict non-DaemonSet pods, PDB 429s retried with backoff capped by the time left, one last
attempt at the drain timeout) -> replacing (request: label / delete Node / custom resource / webhook;
the spare's Slurm node is resumed once it registered) -> done (once the spare responds in Slurm; the old
one retired) | failed (retried after ``remediation_retry_seconds`` while attempts are left, or by hand).

A remediation whose Slurm node was cleared and resumed (repaired, or an admin's decision) ends: an
active one is abandoned, a failed or finished one is cleared; either way the Node is uncordoned if
autoheal cordoned it (``cordoned-by: autoheal``, never a human's cordon) and the stale request (custom
resource, label, annotations) is removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from autoheal.k8s_sync import names
from autoheal.k8s_sync import remediation as R
from autoheal.k8s_sync.plan import NODE_PATCH, Action, Context, Snapshot, StepResult
from autoheal.k8s_sync.remediation import RS, Do
from autoheal.reasons import is_health_drain, strip_reason_suffix
from autoheal.slurm.model import Node

if TYPE_CHECKING:
    from typing import TypeGuard  # Python 3.10+: annotations only

    from autoheal.config.sync_section import SyncSection
    from autoheal.k8s_sync.mapping import Binding

STEP = "remediate"
NOT_IN_SERVICE = ("DOWN", "UNKNOWN", "FUTURE")
#: At most this many journal records for one breaker event (one per node concerned; the rest counted).
MAX_BREAKER_RECORDS = 100


def _ann(obj: Dict[str, Any]) -> Dict[str, str]:
    return ((obj or {}).get("metadata") or {}).get("annotations") or {}


def _labels(obj: Dict[str, Any]) -> Dict[str, str]:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def _ready(knode: Dict[str, Any]) -> bool:
    for c in ((knode.get("status") or {}).get("conditions") or []):
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
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


def cr_name(cfg: SyncSection, kname: str, sname: str) -> str:
    """Name of the replacement custom resource for Node ``kname`` (from ``replacement_template``)."""
    try:
        return (R.render_template(cfg.replacement_template, kname, sname, "").get("metadata") or {}).get("name") \
            or kname
    except (ValueError, AttributeError):
        return kname


def replacement_of(kname: str, knode: Dict[str, Any], snap: Snapshot, cfg: SyncSection, sname: str = "") -> str:
    """The Node name the provider says replaces ``kname`` (custom resource status or annotation)."""
    k = R.keys(cfg.annotation_prefix)
    cr = snap.replacements.get(cr_name(cfg, kname, sname)) if cfg.replacement_action == "custom-resource" else None
    if cr is not None:
        name = ((cr.get("status") or {}).get("replacementNode") or "")
        if name:
            return name
    return _ann(knode).get(k["replacement"], "")


def responding(node: Optional[Node]) -> TypeGuard[Node]:
    """The Slurm node's slurmd registered and answers (not DOWN/UNKNOWN/FUTURE, no ``*``)."""
    return node is not None and node.state not in NOT_IN_SERVICE and "NOT_RESPONDING" not in node.flags


def _in_service(node: Optional[Node]) -> bool:
    """Responding and not held: takes jobs (what ``done`` waits for)."""
    return responding(node) and not (node.drain or node.down)


def _took_over(node: Optional[Node]) -> bool:
    """The replacement arrived: in service, or responding and drained by the hooks for a fault of its own.
    The hooks keep a spare's drain while it is held (a fault on it stays behind the spare reason), so
    such a drain means it was resumed and in service; the old machine is gone either way, and the spare's
    fault is its own (soak seed 46688: an XID 95 on the spare seconds after its resume failed the
    replacement, and the retired machine kept its replace reason). An admin's drain proves nothing."""
    if _in_service(node):
        return True
    return responding(node) and is_health_drain(strip_reason_suffix(node.reason))


@dataclass
class RemediationResult(StepResult):
    """The remediate step's actions and problems, and what the pass summary (`sync status`) and the
    metrics show of this pass beyond them."""

    breaker: Optional[R.Breaker] = None  # as this pass left it; None: not read (no remediation this pass)
    opted_out: Dict[str, Dict[str, str]] = field(default_factory=dict)  # Node -> {slurm_node, why}
    retry_notes: Dict[str, str] = field(default_factory=dict)  # Node -> when a failed one is retried


def remediate(ctx: Context) -> RemediationResult:
    """All remediation actions for this snapshot (see the module docstring)."""
    snap = ctx.snap
    result = RemediationResult()
    if snap.breaker is None or snap.jobs is None:
        result.problems.append("remediation: breaker state or Slurm jobs not read; no remediation this pass")
        return result
    settings = R.RemediationSettings.from_cfg(ctx.cfg)
    survey = _survey(ctx, settings)
    result.retry_notes = survey.retry_notes
    breaker = R.Breaker.from_cfg(ctx.cfg, snap.breaker)
    result.breaker = breaker
    before, was_tripped = breaker.dump(), breaker.tripped
    n_allowed, why_not = breaker.allowed(len(survey.active), len(survey.affected), survey.total, snap.clock)
    rearmed_nodes: List[str] = []
    if was_tripped and not breaker.tripped:
        rearmed_nodes, breaker.nodes = list(breaker.nodes), []
    out = survey.out
    # a pass that trips the breaker (or one still tripped) files one record for the whole event: the nodes
    # it holds back wait quietly (state on the Node, no page each)
    trip_event = breaker.tripped or (100.0 * len(survey.affected) / survey.total > breaker.max_percent
                                     if survey.total else False)
    out.extend(_start_wanted(ctx, result, survey.wanting, breaker, n_allowed, why_not, settings,
                             len(survey.active), survey.total, quiet=trip_event))
    out.extend(_trip_if_needed(ctx, result, breaker, survey))
    if before != breaker.dump():
        out.insert(0, _save_breaker(ctx, breaker))
        if was_tripped and not breaker.tripped:
            out.append(Action(STEP, R.REPORT, "", "", why="circuit breaker re-armed",
                              event=("AutohealBreakerRearmed", "circuit breaker re-armed", "Normal"),
                              journal="breaker-rearmed", nodes=tuple(rearmed_nodes[:MAX_BREAKER_RECORDS])))
    for kname, cur in survey.active:
        out.extend(_advance(ctx, result, kname, cur, settings, snap.clock))
    result.actions = out
    return result


@dataclass
class _Survey:
    """What one look at every Node found: actions decided on the spot and the Nodes left to act on."""

    total: int  # Slurm nodes bound to a Node
    out: List[Action] = field(default_factory=list)
    active: List[Tuple[str, R.NodeRemediation]] = field(default_factory=list)  # remediations under way
    wanting: List[Tuple[str, str, str]] = field(default_factory=list)  # (Node, Slurm node, "" | "retry" | "opted-out")
    affected: List[str] = field(default_factory=list)  # Slurm nodes out of the pool (the breaker counts them)
    retry_notes: Dict[str, str] = field(default_factory=dict)  # failed Node -> when it is retried


def _survey(ctx: Context, settings: R.RemediationSettings) -> _Survey:
    """Sort every Node: remediation under way, wanting one (new, retry, opted out), or one to clean up."""
    slurm_of = {b.node: name for name, b in ctx.bindings.items() if b.node}
    survey = _Survey(total=len(slurm_of))
    opted_out_key = R.keys(ctx.cfg.annotation_prefix)["opted-out"]
    for kname in sorted(ctx.snap.nodes):
        _survey_node(ctx, kname, slurm_of, opted_out_key, settings, survey)
    # The breaker's share is of the pool: a Slurm node counts once, and only while it is bound to a Node.
    # A remediation still under way for a node that has left the pool (its slurmd pod gone once the spare
    # took over) is held by the concurrency limit (``active``), not counted against a total it is not
    # part of (the soak saw "5 of 4 nodes (125%)" and an early trip during a hand-over).
    pool = set(slurm_of.values())
    survey.affected = sorted({name for name in survey.affected if name in pool})
    return survey


def _survey_node(ctx: Context, kname: str, slurm_of: Dict[str, str], opted_out_key: str,
                 settings: R.RemediationSettings, survey: _Survey) -> None:
    cfg, snap = ctx.cfg, ctx.snap
    knode = snap.nodes[kname]
    cur = R.NodeRemediation.from_node(knode, cfg.annotation_prefix)
    sname = slurm_of.get(kname) or cur.slurm_node
    snode = snap.slurm.get(sname)
    held = snode is not None and (snode.drain or snode.down)
    wants = held and snode is not None and R.wants_replace(snode.reason, cfg)
    released = snode is not None and not held  # cleared and resumed in Slurm
    if cur.state in R.ACTIVE:
        if released and snode is not None and not replacement_of(kname, knode, snap, cfg, sname):
            survey.out.extend(_cleanup(ctx, kname, sname, knode, cur, True, "abandoned",
                                       f"Slurm node {sname} was resumed ({snode.state_text}) before a "
                                       f"replacement arrived"))
            return
        survey.active.append((kname, cur))
        survey.affected.append(sname or kname)
        return
    if held and snode is not None and names.is_health_reason(snode.reason) and not R.is_retired(snode.reason) \
            and not strip_reason_suffix(snode.reason).startswith(cfg.spare_reason_prefix.strip()):
        survey.affected.append(sname)  # retired nodes left the pool; spares were never in it
    opted = bool(_ann(knode).get(opted_out_key))
    if cur.state == RS.DONE:
        if released:  # the old machine came back into Slurm service: autoheal's cordon goes
            survey.out.extend(_cleanup(ctx, kname, sname, knode, cur, True, "cleared",
                                       f"retired Slurm node {sname} is in service again"))
        return
    if snode is not None and not wants:
        # healed (the hooks resumed it), or an admin's drain replaced ours: forget the record, so the
        # next fault starts fresh; uncordon only a node Slurm runs jobs on again
        if cur.state or opted or _leftovers(ctx, kname, sname, knode, released):
            survey.out.extend(_cleanup(ctx, kname, sname, knode, cur, released, "cleared",
                                       f"Slurm node {sname} no longer asks for a replacement"))
        return
    if not wants:
        return
    if cur.state == RS.FAILED:
        due, note = R.retry_due(cur, settings, snap.clock)
        survey.retry_notes[kname] = note
        if due:
            survey.wanting.append((kname, sname, "retry"))
        return
    survey.wanting.append((kname, sname, "opted-out" if opted else ""))


def queue_order(ctx: Context, wanting: List[Tuple[str, str, str]]) -> List[Tuple[str, str, str]]:
    """The Nodes wanting a replacement, oldest request first: a ``waiting`` one by when it first asked (its
    ``since``, kept on the Node, so a restarted or failed-over sync keeps the order), new ones after them
    (asking now); ties by name."""
    prefix, now = ctx.cfg.annotation_prefix, ctx.snap.clock

    def key(item: Tuple[str, str, str]) -> Tuple[float, str]:
        cur = R.NodeRemediation.from_node(ctx.snap.nodes[item[0]], prefix)
        return (cur.since if cur.state == RS.WAITING and cur.since else now, item[0])

    return sorted(wanting, key=key)


def _start_wanted(ctx: Context, result: RemediationResult, wanting: List[Tuple[str, str, str]],
                  breaker: R.Breaker, n_allowed: int, why_not: str, settings: R.RemediationSettings,
                  active: int = 0, total: int = 0, quiet: bool = False) -> List[Action]:
    """Quarantine the Nodes wanting a replacement, oldest first, as many as the breaker allows; the rest
    wait visibly (state ``waiting``); report the opted out."""
    snap, prefix = ctx.snap, ctx.cfg.annotation_prefix
    jobs = snap.jobs or {}
    k = R.keys(prefix)
    now = snap.clock
    out: List[Action] = []
    started = refused = 0
    for kname, sname, how in queue_order(ctx, wanting):
        knode = snap.nodes[kname]
        cur = R.NodeRemediation.from_node(knode, prefix)
        pods = snap.node_pods.get(kname)
        if pods is None:
            result.problems.append(f"remediation: pods on Node {kname} not read; skipped")
            continue
        base = R.NodeRemediation("", 0, cur.attempts, "", cur.slurm_node) if how == "retry" else cur
        step = R.next_step(base, True, jobs.get(sname, 0), pods, False, settings, now, sname, knode)
        if step.do is Do.REPORT_OPT_OUT:
            result.opted_out[kname] = {"slurm_node": sname, "why": step.why}
            result.problems.append(f"Node {kname} (Slurm {sname}) needs a replacement but {step.why}: replace it "
                                f"by hand or remove the label")
            if how != "opted-out":  # said once; the annotation keeps it visible until lifted
                out.extend(_opt_out(kname, sname, step.why, prefix, cur.attempts))
            continue
        if started >= n_allowed:
            wait = R.wait_for(breaker, active + started, total, now, refused)
            if quiet and wait.limit is not R.Limit.TRIPPED:  # the trip this pass makes holds it
                wait = R.Wait(R.Limit.TRIPPED, "circuit breaker tripping: too much of the pool is out; no new "
                              "remediation until it re-arms by itself or `autoheal sync breaker reset`",
                              now + breaker.cooldown_seconds)
            refused += 1
            result.problems.append(f"remediation of {kname} ({sname}) not started: {why_not or 'breaker limit'}")
            if how == "opted-out":
                out.append(_opt_out_lifted(kname, sname, prefix, "waiting for the circuit breaker"))
            out.extend(_waiting(ctx, kname, sname, cur, wait, quiet))
            continue
        started += 1
        breaker.record_start(now)
        extra = {"metadata": {"annotations": {k["opted-out"]: None, k["requested"]: None}}}
        reason = snode_reason(snap, sname)
        waited = f" after waiting {now - cur.since:.0f}s ({cur.limit})" if cur.state == RS.WAITING else ""
        if how == "retry" or (cur.state == RS.WAITING and cur.attempts):
            note = result.retry_notes.get(kname) or f"attempt {cur.attempts + 1}"
            event = ("AutohealRemediationRetry", f"Node {kname} (Slurm {sname}): remediation {note}{waited}"
                     f"; it had failed: {cur.reason}", "Warning")
            journal = "remediation-retry"
        else:
            lifted = " (opt-out lifted)" if how == "opted-out" else ""
            event = ("AutohealQuarantined", f"Node {kname} (Slurm {sname}) quarantined for replacement{lifted}"
                     f"{waited}: {reason}", "Warning")
            journal = "remediation"
        out.append(_state(kname, sname, _then(step), prefix, f"quarantined: {reason}", extra=extra, event=event,
                          journal=journal))
    return out


def _waiting(ctx: Context, kname: str, sname: str, cur: R.NodeRemediation, wait: R.Wait,
             quiet: bool = False) -> List[Action]:
    """A wanted remediation the breaker does not let start now: state ``waiting`` on the Node, with why
    (``-reason``), which limit (``-waiting-limit``) and until when (``-waiting-until``); ``since`` is
    when it first asked (its place in the queue). Said once, when it starts waiting (Event, journal,
    notification); a later change of limit or time only updates the Node. Nodes held by a trip
    (``quiet``: tripped, or tripping in this pass) are named by the trip's own record (one page for a
    fleet-wide event, not one per node): no record each."""
    prefix = ctx.cfg.annotation_prefix
    extra = {"metadata": {"annotations": {R.keys(prefix)["opted-out"]: None}}}
    if cur.state == RS.WAITING:
        if cur.limit == wait.limit and cur.reason == wait.why[:256] and abs(cur.until - wait.until) < 1.0:
            return []  # nothing new: no write
        then = replace(cur, reason=wait.why[:256], until=wait.until, limit=str(wait.limit))
        # said once: a node that began waiting in a trip (the trip's record spoke for it) is told about
        # when the trip is over and a limit of its own holds it
        if quiet or cur.limit != R.Limit.TRIPPED or wait.limit is R.Limit.TRIPPED:
            return [_state(kname, sname, then, prefix, f"still waiting: {wait.why}", journal="")]
    else:
        # attempts kept: a failed one due for its retry waits like a new one, and starts as a retry
        then = R.NodeRemediation(RS.WAITING, ctx.snap.clock, cur.attempts, wait.why[:256], sname or cur.slurm_node,
                                 until=wait.until, limit=str(wait.limit))
    if quiet or wait.limit is R.Limit.TRIPPED:
        return [_state(kname, sname, then, prefix, wait.why, extra=extra, journal="")]
    when = f"; the limit lets it start by itself at {_clock_text(wait.until)} (nodes that asked before it " \
        f"go first)" if wait.until else "; starts by itself when the limit allows (nodes that asked before it go first)"
    text = f"Node {kname} (Slurm {sname}) needs a replacement; waiting: {wait.why}{when}"
    return [_state(kname, sname, then, prefix, wait.why, extra=extra,
                   event=("AutohealRemediationWaiting", text, "Normal"), journal="remediation-waiting")]


def _clock_text(epoch: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _trip_if_needed(ctx: Context, result: RemediationResult, breaker: R.Breaker, survey: _Survey) -> List[Action]:
    """Trip the breaker when too much of the pool is out (a report), or say it is still tripped."""
    affected_names = sorted(set(survey.affected))
    if breaker.check_trip(len(survey.affected), survey.total, ctx.snap.clock):
        breaker.nodes = affected_names
        result.problems.append(f"circuit breaker tripped: {breaker.why}")
        return [Action(STEP, R.REPORT, "", "", why=f"circuit breaker tripped: {breaker.why}; no new "
                       f"remediations until it re-arms or `autoheal sync breaker reset`",
                       event=("AutohealBreakerTripped", breaker.why, "Warning"), journal="breaker-tripped",
                       nodes=tuple(affected_names[:MAX_BREAKER_RECORDS]))]
    if breaker.tripped:
        result.problems.append(f"circuit breaker tripped: {breaker.why}; {len(survey.wanting)} nodes waiting")
    return []


def _save_breaker(ctx: Context, breaker: R.Breaker) -> Action:
    """Write the breaker's changed state to its ConfigMap (first: the other actions rely on it)."""
    cfg = ctx.cfg
    body: Dict[str, Any] = {"data": breaker.dump()}
    if ctx.snap.breaker_rv:
        body["metadata"] = {"resourceVersion": ctx.snap.breaker_rv}
    return Action(STEP, R.BREAKER_SAVE, cfg.breaker_configmap, "", cfg.namespace, "merge", body,
                  why="breaker state: " + ("tripped" if breaker.tripped else f"{len(breaker.starts)} starts in window"))


def _then(step: R.Step) -> R.NodeRemediation:
    """The state a step records (``next_step`` gives one with every step but none, wait and report-opt-out)."""
    if step.then is None:
        raise ValueError(f"remediation step {str(step.do)!r} carries no state to record")
    return step.then


def snode_reason(snap: Snapshot, sname: str) -> str:
    node = snap.slurm.get(sname)
    return strip_reason_suffix(node.reason) if node is not None else ""


def _state(kname: str, sname: str, then: R.NodeRemediation, prefix: str, why: str,
           extra: Optional[Dict[str, Any]] = None, event: Optional[Tuple[str, str, str]] = None,
           journal: str = "remediation") -> Action:
    body = _deep_merge(then.patch(prefix), extra or {})
    return Action(STEP, NODE_PATCH, kname, sname, "", "merge", body, why=f"{then.state or 'cleared'}: {why}",
                  event=event, group=kname, journal=journal)


def _deep_merge(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        out[key] = _deep_merge(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def _opt_out(kname: str, sname: str, why: str, prefix: str, attempts: int = 0) -> List[Action]:
    k = R.keys(prefix)
    body = R.NodeRemediation().patch(prefix)
    body["metadata"]["annotations"][k["opted-out"]] = why[:256]
    body["metadata"]["annotations"][k["attempts"]] = str(attempts) if attempts else None
    return [Action(STEP, NODE_PATCH, kname, sname, "", "merge", body, group=kname,
                   why=f"opted out of automatic replacement: {why}; no action",
                   event=("AutohealReplaceOptOut", f"Node {kname} (Slurm {sname}) needs replacing but {why}: "
                          "no automatic action, replace it by hand or remove the label", "Warning"),
                   journal="remediation-opt-out")]


def _opt_out_lifted(kname: str, sname: str, prefix: str, why: str) -> Action:
    k = R.keys(prefix)
    return Action(STEP, NODE_PATCH, kname, sname, "", "merge", {"metadata": {"annotations": {k["opted-out"]: None}}},
                  group=kname, why=f"opt-out lifted; {why}",
                  event=("AutohealReplaceOptOutLifted", f"Node {kname} (Slurm {sname}): opt-out lifted; {why}",
                         "Normal"), journal="remediation-opt-out-lifted")


def _leftovers(ctx: Context, kname: str, sname: str, knode: Dict[str, Any], released: bool) -> bool:
    """Anything a past remediation left on a Node that no longer needs one (a crash between writes, an
    operator's retry of a node that healed meanwhile, an older version)."""
    k = R.keys(ctx.cfg.annotation_prefix)
    ann = _ann(knode)
    if any(ann.get(k[x]) for x in ("requested", "replacement", "final-eviction", "retry-requested")):
        return True
    if released and ann.get(names.cordoned_by_key(ctx.cfg.annotation_prefix)) == names.ME:
        return True
    if ctx.cfg.replacement_action == "label":
        lkey, _, lval = ctx.cfg.replacement_label.partition("=")
        if _labels(knode).get(lkey) == lval:
            return True
    # (replacements are only listed when some Node carries a mark: no template rendering per idle Node)
    return bool(ctx.snap.replacements) and ctx.cfg.replacement_action == "custom-resource" \
        and cr_name(ctx.cfg, kname, sname) in ctx.snap.replacements


def _cleanup(ctx: Context, kname: str, sname: str, knode: Dict[str, Any], cur: R.NodeRemediation, uncordon: bool,
             what: str, why: str) -> List[Action]:
    """End a remediation the Slurm node no longer needs: delete the stale request (custom resource), then
    one Node patch dropping every remediation annotation and label and, when ``uncordon``, autoheal's own
    cordon. The request goes first: if its deletion fails the record stays and the next pass retries."""
    cfg = ctx.cfg
    prefix = cfg.annotation_prefix
    k = R.keys(prefix)
    out: List[Action] = []
    if cfg.replacement_action == "custom-resource":
        name = cr_name(cfg, kname, sname)
        if name in ctx.snap.replacements:
            out.append(Action(STEP, R.KUBE_DELETE_CR, name, sname, cfg.namespace, group=kname,
                              why=f"delete the stale replacement request {name}"))
    body = R.NodeRemediation().patch(prefix)
    ann = body["metadata"]["annotations"]
    for key in ("opted-out", "requested", "replacement"):
        ann[k[key]] = None
    have = _ann(knode)
    if cfg.replacement_action == "label":
        lkey, _, lval = cfg.replacement_label.partition("=")
        if _labels(knode).get(lkey) == lval:
            body["metadata"]["labels"][lkey] = None
    undone = []
    if uncordon and have.get(names.cordoned_by_key(prefix)) == names.ME:
        ann[names.cordoned_by_key(prefix)] = None
        if (knode.get("spec") or {}).get("unschedulable"):
            body["spec"] = {"unschedulable": None}
            undone.append("uncordoned")
    undone += [f"request {a.target} deleted" for a in out]
    note = f"{why}; {', '.join(undone)}" if undone else why
    event = journal = None
    if what == "abandoned":
        event = ("AutohealRemediationAbandoned", f"Node {kname} (Slurm {sname}): remediation ({cur.state}) "
                 f"abandoned: {note}", "Normal")
        journal = "remediation-abandoned"
    elif cur.state or undone:
        event = ("AutohealRemediationCleared", f"Node {kname} (Slurm {sname}): remediation record "
                 f"{'(' + cur.state + ') ' if cur.state else ''}cleared: {note}", "Normal")
        journal = "remediation-cleared"
    out.append(Action(STEP, NODE_PATCH, kname, sname, "", "merge", body, group=kname,
                      why=f"remediation {what}: {note}", event=event, journal=journal or ""))
    return out


def _advance(ctx: Context, result: RemediationResult, kname: str, cur: R.NodeRemediation,
             settings: R.RemediationSettings, now: float) -> List[Action]:
    cfg, snap = ctx.cfg, ctx.snap
    prefix = cfg.annotation_prefix
    knode = snap.nodes[kname]
    sname = cur.slurm_node or next((n for n, b in ctx.bindings.items() if b.node == kname), "")
    slurmd_pod = next((b.pod for b in ctx.bindings.values() if b.node == kname), None)
    pods = snap.node_pods.get(kname)
    if pods is None:
        result.problems.append(f"remediation: pods on Node {kname} not read; skipped")
        return []
    evict = evictable_pods(pods, slurmd_pod)
    new = replacement_of(kname, knode, snap, cfg, sname)
    new_slurm = next((n for n, b in ctx.bindings.items() if new and b.node == new), "")
    spare = snap.slurm.get(new_slurm)
    node_ready = bool(new) and new in snap.nodes and _ready(snap.nodes[new])
    # done only once the replacement takes jobs: registered, resumed from its spare drain, and answering
    # (a spare just resumed shows `idle*`, not responding, for a while), or drained since for its own fault
    ready = node_ready and _took_over(spare)
    step = R.next_step(cur, True, (snap.jobs or {}).get(sname, 0), evict if cur.state != RS.QUARANTINED else pods,
                       ready, settings, now, sname, knode)
    cordon = {"spec": {"unschedulable": True},
              "metadata": {"annotations": {names.cordoned_by_key(prefix): names.ME}}}
    out: List[Action] = []
    if step.do is Do.REPORT_OPT_OUT:
        result.opted_out[kname] = {"slurm_node": sname, "why": step.why}
        result.problems.append(f"Node {kname} (Slurm {sname}) needs a replacement but {step.why}: replace it "
                            f"by hand or remove the label")
        return _opt_out(kname, sname, step.why, prefix, cur.attempts)
    if step.do is Do.FAIL:
        then = _then(step)
        _, note = R.retry_due(then, settings, now)
        return [_state(kname, sname, then, prefix, then.reason,
                       event=("AutohealRemediationFailed", f"Node {kname} (Slurm {sname}): remediation failed: "
                              f"{then.reason}; {note}", "Warning"), journal="remediation-failed")]
    if step.do is Do.CORDON:
        return [_state(kname, sname, _then(step), prefix, "cordoned; evicting its pods", extra=cordon,
                       event=("AutohealCordoned", f"Node {kname} cordoned for replacement (Slurm {sname})",
                              "Normal"))]
    if cur.state in (RS.DRAINING, RS.DRAINED) and not (knode.get("spec") or {}).get("unschedulable"):
        # a crash between states, or someone uncordoned it: the flow needs it cordoned
        out.append(Action(STEP, NODE_PATCH, kname, sname, "", "merge", cordon, group=kname, why="re-cordon"))
    if step.do in (Do.EVICT, Do.FINAL_EVICT):
        return out + _evict(kname, sname, step, prefix, cur.since + settings.drain_timeout_seconds, evict)
    if step.do is Do.REQUEST_REPLACEMENT:
        return out + _request(ctx, kname, sname, _then(step), knode)
    if cur.state == RS.REPLACING and step.do is Do.WAIT:
        out += _ensure_request(ctx, kname, sname, cur, knode)
        if node_ready and responding(spare) and (spare.drain or spare.down):
            out += _resume_replacement(ctx, result, kname, new_slurm, spare)
        return out
    if step.do is Do.RETIRE:
        return out + _retire(ctx, kname, sname, step, new, new_slurm)
    return out


def _evict(kname: str, sname: str, step: R.Step, prefix: str, deadline: float,
           evict: List[Dict[str, Any]]) -> List[Action]:
    """Evict the pods left on the Node; the last attempt (forced) is recorded first: the next pass fails
    the remediation if pods are still there."""
    out: List[Action] = []
    final = step.do is Do.FINAL_EVICT
    if final:
        out.append(_state(kname, sname, _then(step), prefix, step.why))
    for p in evict:
        meta = p.get("metadata") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        # one group per pod: a PodDisruptionBudget refusing one pod never holds back the others
        out.append(Action(STEP, R.KUBE_EVICT, name, sname, ns, group=f"evict:{kname}:{ns}/{name}",
                          why=f"evict from {kname}" + (" (last attempt)" if final else ""),
                          deadline=deadline, force=final))
    return out


def _resume_replacement(ctx: Context, result: RemediationResult, kname: str, new_slurm: str,
                        spare: Node) -> List[Action]:
    """The replacement registered and answers but is still drained: resume it from our spare drain, or
    wait (a problem said) while someone else's drain holds it."""
    if strip_reason_suffix(spare.reason).startswith(ctx.cfg.spare_reason_prefix.strip()):
        return [Action(STEP, R.SLURM_RESUME_SPARE, new_slurm, new_slurm, group=kname,
                       why=f"replacement {new_slurm} registered: resumed; {kname} is done once it responds",
                       journal="resume")]
    result.problems.append(f"remediation of {kname}: replacement {new_slurm} is held in Slurm by "
                        f"someone else ({snode_reason(ctx.snap, new_slurm)!r}); waiting")
    return []


def _retire(ctx: Context, kname: str, sname: str, step: R.Step, new: str, new_slurm: str) -> List[Action]:
    """Slurm first, then the record: "done" must mean the old node is retired. Killed in between (or
    slurmctld away), the record still says replacing and the next pass (any leader) retires again."""
    acts = []
    if sname in ctx.snap.slurm:
        acts.append(Action(STEP, R.SLURM_RETIRE, sname, sname, reason=R.retire_reason(new_slurm), group=kname,
                           why=f"{sname} retired: replaced by {new_slurm}", journal="retire"))
    acts.append(_state(kname, sname, _then(step), ctx.cfg.annotation_prefix, f"replaced by {new} (Slurm {new_slurm})",
                       event=("AutohealReplaced", f"Node {kname} (Slurm {sname}) replaced by {new} (Slurm "
                              f"{new_slurm})", "Normal"), journal="remediation-done"))
    return acts


def _request(ctx: Context, kname: str, sname: str, then: R.NodeRemediation, knode: Dict[str, Any]) -> List[Action]:
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


def _ensure_request(ctx: Context, kname: str, sname: str, cur: R.NodeRemediation,
                    knode: Dict[str, Any]) -> List[Action]:
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
        if cr_name(cfg, kname, sname) in ctx.snap.replacements:
            return []
        return _request_effect(ctx, kname, sname, snode_reason(ctx.snap, sname))
    if action == "webhook" and not _ann(knode).get(k["requested"]):
        return _request_effect(ctx, kname, sname, snode_reason(ctx.snap, sname))
    return []


def candidates(snap: Snapshot, cfg: SyncSection, bindings: Dict[str, Binding]) -> List[str]:
    """Nodes whose pods the engine must read for this step: active remediations and nodes that ask for
    a replacement (new ones, opted-out ones, failed ones that may be retried)."""
    prefix = cfg.annotation_prefix
    slurm_of = {b.node: name for name, b in bindings.items() if b.node}
    out = []
    for kname, knode in snap.nodes.items():
        cur = R.NodeRemediation.from_node(knode, prefix)
        if cur.state in R.ACTIVE:
            out.append(kname)
            continue
        snode = snap.slurm.get(slurm_of.get(kname, "") or cur.slurm_node)
        if snode is not None and (snode.drain or snode.down) and R.wants_replace(snode.reason, cfg) \
                and cur.state != RS.DONE:
            out.append(kname)
    return sorted(out)


def needs_requests(snap: Snapshot, cfg: SyncSection) -> bool:
    """Whether the pass must list the replacement custom resources: some Node carries a remediation
    record or autoheal's cordon (a request may have to be found, re-issued or cleaned up)."""
    k = R.keys(cfg.annotation_prefix)
    marks = (k["state"], k["opted-out"], k["requested"], names.cordoned_by_key(cfg.annotation_prefix))
    return any(any(_ann(n).get(m) for m in marks) for n in snap.nodes.values())

