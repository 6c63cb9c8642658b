"""Node remediation (issue 7): the per-node state machine, the circuit breaker, and the ``remediate``
reconcile step, all pure functions over plain data (the engine reads and writes).

Per-node state lives in Node annotations, so a restarted or failed-over daemon continues where it
stopped: ``<prefix>/remediation-state`` (quarantined -> draining -> drained -> replacing -> done |
failed), ``-since`` (epoch seconds of entering the state), ``-attempts``, ``-reason``, ``-slurm-node``
and ``-final-eviction`` (when the last eviction attempt at the drain timeout was made). ``failed`` is
retried after ``remediation_retry_seconds`` while attempts are left, or by hand (``autoheal sync
remediation retry NODE``, which clears the state: ``retry_patch``). ``next_step`` says what to do for one
node now. A state change is written *with* the Node patch it announces (cordon, label: one atomic patch)
or *before* a side effect on another object (eviction, custom resource, webhook, Slurm), and every side
effect is idempotent and re-checked each pass (cordon present? request present?), so a crash between two
writes neither repeats nor loses an action.

The step is level-triggered: it looks at what Slurm and Kubernetes say *now*, never at a queue of
past events, so a breaker that re-arms never replays faults that healed meanwhile.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple

from autoheal.config.sync_section import SyncSection
from autoheal.k8s_sync.plan import ActionKind
from autoheal.reasons import Origin, Reason, strip_reason_suffix
from autoheal.strenum import StrEnum


class RemediationState(StrEnum):
    """Where a Node's replacement is (its ``remediation-state`` annotation): waiting for the breaker,
    then quarantined (jobs leaving), draining (cordoned, pods evicted), drained, replacing (request
    made), and done or failed."""

    #: wanted but not started, held back by a limit of the circuit breaker (its share of starts per
    #: window, the concurrency limit, or a trip); it starts by itself when the limit allows, oldest first.
    WAITING = "waiting"
    QUARANTINED = "quarantined"
    DRAINING = "draining"
    DRAINED = "drained"
    REPLACING = "replacing"
    DONE = "done"
    FAILED = "failed"


RS = RemediationState
STATES = tuple(RemediationState)
ACTIVE = (RS.QUARANTINED, RS.DRAINING, RS.DRAINED, RS.REPLACING)
TERMINAL = (RS.DONE, RS.FAILED)

# Action kinds of this step (the engine knows how to write each).
KUBE_EVICT, KUBE_DELETE_NODE = ActionKind.KUBE_EVICT, ActionKind.KUBE_DELETE_NODE
KUBE_CREATE_CR, KUBE_DELETE_CR = ActionKind.KUBE_CREATE_CR, ActionKind.KUBE_DELETE_CR
WEBHOOK, BREAKER_SAVE, REPORT = ActionKind.WEBHOOK, ActionKind.BREAKER_SAVE, ActionKind.REPORT
SLURM_RETIRE, SLURM_RESUME_SPARE = ActionKind.SLURM_RETIRE, ActionKind.SLURM_RESUME_SPARE
KINDS = (KUBE_EVICT, KUBE_DELETE_NODE, KUBE_CREATE_CR, KUBE_DELETE_CR, WEBHOOK, BREAKER_SAVE, REPORT,
         SLURM_RETIRE, SLURM_RESUME_SPARE)

#: Slurm job states that still hold a node.
HOLDING_JOB_STATES = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING",
                      "STAGE_OUT", "RESIZING")


def keys(prefix: str) -> Dict[str, str]:
    out = {k: f"{prefix}/remediation-{k}" for k in ("state", "since", "attempts", "reason", "slurm-node",
                                                    "final-eviction", "retry-requested", "waiting-until",
                                                    "waiting-limit")}
    out["opted-out"] = f"{prefix}/remediation-opted-out"
    out["requested"] = f"{prefix}/replacement-requested"
    out["replacement"] = f"{prefix}/replacement-node"
    out["label"] = f"{prefix}/remediation"  # a label (selectable): the state, for kubectl get -l
    return out


@dataclass(frozen=True)
class NodeRemediation:
    """What the annotations of one Node say."""

    state: str = ""
    since: float = 0.0
    attempts: int = 0
    reason: str = ""
    slurm_node: str = ""
    final_eviction: float = 0.0  # draining: when the last eviction attempt at the timeout was made
    # waiting: the earliest moment the limit lets it start (0: when a running remediation ends) and which
    # limit holds it (``Wait.limit``); ``since`` is when it first asked, the order of the queue
    until: float = 0.0
    limit: str = ""

    @classmethod
    def from_node(cls, node: Dict[str, Any], prefix: str) -> NodeRemediation:
        ann = ((node.get("metadata") or {}).get("annotations") or {})
        k = keys(prefix)
        state = ann.get(k["state"], "")
        try:
            since = float(ann.get(k["since"], 0) or 0)
            attempts = int(ann.get(k["attempts"], 0) or 0)
        except ValueError:  # hand-edited annotations: treat as a fresh start of that state
            since, attempts = 0.0, 0
        try:
            final = float(ann.get(k["final-eviction"], 0) or 0)
        except ValueError:
            final = 0.0
        try:
            until = float(ann.get(k["waiting-until"], 0) or 0)
        except ValueError:
            until = 0.0
        return cls(state if state in STATES else "", since, attempts, ann.get(k["reason"]) or "",
                   ann.get(k["slurm-node"]) or "", final, until, ann.get(k["waiting-limit"]) or "")

    def patch(self, prefix: str) -> Dict[str, Any]:
        """The merge patch recording this state; a state change also drops the per-state marks (last
        eviction attempt, an operator's retry request)."""
        k = keys(prefix)
        on = bool(self.state)
        return {"metadata": {"annotations": {k["state"]: self.state or None,
                                             k["since"]: str(int(self.since)) if on else None,
                                             k["attempts"]: str(self.attempts) if on else None,
                                             k["reason"]: self.reason or None,
                                             k["slurm-node"]: self.slurm_node or None,
                                             k["final-eviction"]: str(int(self.final_eviction))
                                             if on and self.final_eviction else None,
                                             k["retry-requested"]: None,
                                             k["waiting-until"]: str(int(self.until))
                                             if self.state == RS.WAITING and self.until else None,
                                             k["waiting-limit"]: (self.limit or None)
                                             if self.state == RS.WAITING else None},
                             "labels": {k["label"]: self.state or None}}}


_DEFAULTS = SyncSection()
_OPT_OUT_KEY, _, _OPT_OUT_VALUE = _DEFAULTS.opt_out_label.partition("=")


@dataclass
class RemediationSettings:
    """The ``[sync]`` remediation settings this step reads (the defaults are the section's)."""

    opt_out_label: str = _OPT_OUT_KEY
    opt_out_value: str = _OPT_OUT_VALUE
    grace_seconds: float = _DEFAULTS.remediation_grace_seconds  # jobs leave Slurm within this, else fail
    drain_timeout_seconds: float = _DEFAULTS.remediation_drain_timeout_seconds
    replace_timeout_seconds: float = _DEFAULTS.remediation_replace_timeout_seconds
    # a failed remediation whose node still asks for a replacement starts again after this long
    retry_seconds: float = _DEFAULTS.remediation_retry_seconds
    # attempts (the first one included) before only `autoheal sync remediation retry` starts another
    max_attempts: int = _DEFAULTS.remediation_max_attempts

    @classmethod
    def from_cfg(cls, cfg: SyncSection) -> RemediationSettings:
        key, _, value = cfg.opt_out_label.partition("=")
        return cls(key, value, cfg.remediation_grace_seconds, cfg.remediation_drain_timeout_seconds,
                   cfg.remediation_replace_timeout_seconds, cfg.remediation_retry_seconds,
                   cfg.remediation_max_attempts)


class Do(StrEnum):
    """The side effect a remediation decision asks for."""

    NONE = "none"
    WAIT = "wait"
    REPORT_OPT_OUT = "report-opt-out"
    CORDON = "cordon"
    EVICT = "evict"
    FINAL_EVICT = "final-evict"
    REQUEST_REPLACEMENT = "request-replacement"
    RETIRE = "retire"
    FAIL = "fail"


@dataclass(frozen=True)
class Step:
    """One decision: the side effect to perform (``do``) and the state to record with it (``then``)."""

    do: Do
    then: Optional[NodeRemediation] = None
    why: str = ""


def opt_out_pod(pods: List[Dict[str, Any]], cfg: RemediationSettings) -> str:
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(cfg.opt_out_label) == cfg.opt_out_value:
            meta = pod.get("metadata") or {}
            return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    return ""


def opt_out_reason(pods: List[Dict[str, Any]], cfg: RemediationSettings, node: Optional[Dict[str, Any]] = None) -> str:
    """Why automatic replacement is vetoed, or "": the opt-out label on the Node itself (a platform
    engineer's ``kubectl label node X autoheal.io/auto-replace=false``) or on any pod running there."""
    meta = (node or {}).get("metadata") or {}
    if (meta.get("labels") or {}).get(cfg.opt_out_label) == cfg.opt_out_value:
        return f"Node {meta.get('name', '')} carries {cfg.opt_out_label}={cfg.opt_out_value}"
    who = opt_out_pod(pods, cfg)
    return f"pod {who} carries {cfg.opt_out_label}={cfg.opt_out_value}" if who else ""


def retry_due(cur: NodeRemediation, cfg: RemediationSettings, now: float) -> Tuple[bool, str]:
    """(may a failed remediation start again now, what the operator should know)."""
    if cur.state != RS.FAILED:
        return False, ""
    if cfg.max_attempts and cur.attempts >= cfg.max_attempts:
        return False, (f"no automatic retry left ({cur.attempts} of {cfg.max_attempts} attempts): "
                       "`autoheal sync remediation retry NODE` starts another")
    wait = cur.since + cfg.retry_seconds - now
    limit = cfg.max_attempts or "unlimited"
    if wait > 0:
        return False, f"automatic retry in {wait:.0f}s (attempt {cur.attempts + 1} of {limit})"
    return True, f"retried after {cfg.retry_seconds:.0f}s (attempt {cur.attempts + 1} of {limit})"


def next_step(cur: NodeRemediation, wants_replace: bool, slurm_jobs: int, pods_on_node: List[Dict[str, Any]],
              replacement_ready: bool, cfg: RemediationSettings, now: float, slurm_node: str = "",
              node: Optional[Dict[str, Any]] = None) -> Step:
    """The next action for one node. ``wants_replace``: autoheal drained it with a replace-class fault;
    ``pods_on_node``: the pods eviction would still have to remove (DaemonSet/slurmd pods excluded by the
    caller, or here for DaemonSets); ``node``: the Node (its labels may opt out too)."""
    st = cur.state
    if st in TERMINAL:
        return Step(Do.NONE, why=f"remediation {st}")
    if not st or st == RS.WAITING:  # a waiting one starts like a new one (the breaker let it through)
        if not wants_replace:
            return Step(Do.NONE)
        who = opt_out_reason(pods_on_node, cfg, node)
        if who:
            return Step(Do.REPORT_OPT_OUT, why=who)
        return Step(Do.WAIT, NodeRemediation(RS.QUARANTINED, now, cur.attempts + 1, "replace-class fault",
                                             slurm_node or cur.slurm_node),
                     "quarantined: waiting for its Slurm jobs to leave")
    age = now - cur.since
    if st == RS.QUARANTINED:
        if slurm_jobs == 0:
            who = opt_out_reason(pods_on_node, cfg, node)
            if who:
                return Step(Do.REPORT_OPT_OUT, NodeRemediation(attempts=cur.attempts), who)
            return Step(Do.CORDON, cur_with(cur, RS.DRAINING, now), "jobs gone: cordon and evict")
        if age > cfg.grace_seconds:
            return Step(Do.FAIL, cur_with(cur, RS.FAILED, now, f"{slurm_jobs} Slurm jobs did not leave in "
                                          f"{cfg.grace_seconds:.0f}s"))
        return Step(Do.WAIT, why=f"{slurm_jobs} Slurm jobs still on the node")
    if st in (RS.DRAINING, RS.DRAINED):
        evictable = [p for p in pods_on_node if not is_daemonset_pod(p)]
        if not evictable:
            return Step(Do.REQUEST_REPLACEMENT, cur_with(cur, RS.REPLACING, now), "drained: request a replacement")
        if age > cfg.drain_timeout_seconds:
            if not cur.final_eviction:  # one last attempt at the deadline, whatever the backoff said
                return Step(Do.FINAL_EVICT, replace(cur, final_eviction=now),
                             f"drain timeout: last eviction attempt of {len(evictable)} pods")
            names = ", ".join(sorted((p.get("metadata") or {}).get("namespace", "") + "/" +
                                     (p.get("metadata") or {}).get("name", "") for p in evictable)[:5])
            return Step(Do.FAIL, cur_with(cur, RS.FAILED, now, f"eviction of {len(evictable)} pods ({names}) blocked "
                                          f"for {cfg.drain_timeout_seconds:.0f}s (PodDisruptionBudget?)"))
        return Step(Do.EVICT, why=f"{len(evictable)} pods to evict")
    if st == RS.REPLACING:
        if replacement_ready:
            return Step(Do.RETIRE, cur_with(cur, RS.DONE, now), "replacement in service")
        if age > cfg.replace_timeout_seconds:
            return Step(Do.FAIL, cur_with(cur, RS.FAILED, now, f"replacement never arrived within "
                                          f"{cfg.replace_timeout_seconds:.0f}s"))
        return Step(Do.WAIT, why="waiting for the replacement Node")
    return Step(Do.NONE)


def cur_with(cur: NodeRemediation, state: str, now: float, reason: Optional[str] = None) -> NodeRemediation:
    return NodeRemediation(state, now, cur.attempts, cur.reason if reason is None else reason, cur.slurm_node)


def retry_patch(node: Dict[str, Any], prefix: str, now: float, who: str = "") -> Dict[str, Any]:
    """The Node patch of ``autoheal sync remediation retry``: a failed remediation goes back to no state
    (attempts kept), so the leader starts it afresh on its next pass, through the opt-out check and the
    circuit breaker, like a new fault. Guarded by the Node's resourceVersion (a leader writing at the
    same moment makes it fail with 409, never half-apply). ValueError when the node is not failed."""
    cur = NodeRemediation.from_node(node, prefix)
    if cur.state != RS.FAILED:
        raise ValueError(f"remediation is {cur.state or 'not running'}, not failed: nothing to retry")
    k = keys(prefix)
    body = NodeRemediation("", 0, cur.attempts, "", cur.slurm_node).patch(prefix)
    ann = body["metadata"]["annotations"]
    ann[k["attempts"]] = str(cur.attempts)
    ann[k["requested"]] = None  # a new attempt makes a new request (a webhook is POSTed again)
    ann[k["retry-requested"]] = f"{int(now)}" + (f" by {who}" if who else "")
    body["metadata"]["resourceVersion"] = (node.get("metadata") or {}).get("resourceVersion")
    return body


def is_daemonset_pod(pod: Dict[str, Any]) -> bool:
    return any(o.get("kind") == "DaemonSet" for o in ((pod.get("metadata") or {}).get("ownerReferences") or []))


# ---- circuit breaker -----------------------------------------------------------------------------
@dataclass
class Breaker:
    """At most ``max_concurrent`` active remediations, at most ``max_percent`` of nodes started within
    ``window_seconds``; it trips when more than ``max_percent`` of nodes are in remediation or drained by
    autoheal (a fleet-wide glitch, not broken hardware). Tripped: no new remediations until the share is
    below ``rearm_percent`` (hysteresis) *and* ``cooldown_seconds`` passed, or a manual reset. Starts
    recorded before a trip are forgotten on re-arm, and nothing is queued while tripped: only nodes that
    still want a replacement when it re-arms start (level-triggered: no replay of old events)."""

    max_concurrent: int = 2
    max_percent: float = 25.0
    rearm_percent: float = 10.0
    window_seconds: float = 600.0
    cooldown_seconds: float = 900.0
    tripped_at: Optional[float] = None
    starts: List[float] = field(default_factory=list)
    why: str = ""
    nodes: List[str] = field(default_factory=list)  # the Slurm nodes that made it trip (journal records)

    @classmethod
    def from_cfg(cls, cfg: SyncSection, data: Optional[Dict[str, str]] = None) -> Breaker:
        b = cls(cfg.breaker_max_concurrent, cfg.breaker_max_percent, cfg.breaker_rearm_percent,
                cfg.breaker_window_seconds, cfg.breaker_cooldown_seconds)
        b.load(data or {})
        return b

    def load(self, data: Dict[str, str]) -> None:
        try:
            self.tripped_at = float(data["trippedAt"]) if data.get("trippedAt") else None
            self.starts = [float(x) for x in json.loads(data.get("starts") or "[]")]
        except (ValueError, TypeError):  # hand-edited: keep it tripped rather than forget a trip
            self.tripped_at, self.starts = 0.0, []
        self.why = data.get("why", "")
        try:
            nodes = json.loads(data.get("nodes") or "[]")
            self.nodes = [str(n) for n in nodes] if isinstance(nodes, list) else []
        except ValueError:
            self.nodes = []

    def dump(self) -> Dict[str, Optional[str]]:
        return {"trippedAt": None if self.tripped_at is None else repr(self.tripped_at),
                "starts": json.dumps([round(s, 3) for s in self.starts]), "why": self.why or None,
                "nodes": json.dumps(self.nodes) if self.nodes else None}

    @property
    def tripped(self) -> bool:
        return self.tripped_at is not None

    def allowed(self, active: int, affected: int, total: int, now: float) -> Tuple[int, str]:
        """(how many new remediations may start now, why not more). Call ``check_trip`` after starting."""
        self.starts = [t for t in self.starts if now - t <= self.window_seconds]
        share = 100.0 * affected / total if total else 100.0
        if self.tripped_at is not None:
            if now - self.tripped_at >= self.cooldown_seconds and share < self.rearm_percent:
                self.tripped_at, self.starts, self.why = None, [], ""  # nodes kept: the re-arm record names them
            else:
                return 0, f"breaker tripped ({self.why or 'by hand'}); now {share:.0f}% of nodes affected"
        budget_pct = math.floor(self.max_percent * total / 100.0 + 1e-9) - len(self.starts)
        n = max(0, min(self.max_concurrent - active, budget_pct))
        return n, "" if n else (f"{self.max_concurrent} remediations at once" if budget_pct > 0 else
                               f"{self.max_percent:.0f}% of nodes already started within the window")

    def check_trip(self, affected: int, total: int, now: float) -> bool:
        """Trip when the affected share exceeds the limit; True when it tripped just now."""
        share = 100.0 * affected / total if total else 0.0
        if self.tripped_at is None and share > self.max_percent:
            self.tripped_at = now
            self.why = f"{affected} of {total} nodes ({share:.0f}%) in remediation or drained by autoheal " \
                       f"> {self.max_percent:.0f}%"
            return True
        return False

    def record_start(self, now: float) -> None:
        self.starts.append(now)

    def reset(self) -> None:
        self.tripped_at = None
        self.starts = []
        self.why = ""
        self.nodes = []


class Limit(StrEnum):
    """Which limit of the breaker holds a wanted remediation back (``waiting-limit`` on the Node)."""

    START_SHARE = "start-share"  # breaker_max_percent of the pool already started within the window
    CONCURRENCY = "concurrency"  # breaker_max_concurrent remediations under way
    TRIPPED = "tripped"  # the breaker tripped: until it re-arms by itself or `autoheal sync breaker reset`


@dataclass(frozen=True)
class Wait:
    """Why a wanted remediation waits, and the earliest moment that limit lets it start (epoch seconds;
    0: not a time, e.g. when a running remediation ends)."""

    limit: Limit
    why: str
    until: float = 0.0


def start_capacity(max_percent: float, total: int) -> int:
    """Starts the share limit lets through per window on a pool of ``total`` nodes (the breaker's
    arithmetic: floor(share x pool))."""
    return math.floor(max_percent * total / 100.0 + 1e-9)


def wait_for(breaker: Breaker, active: int, total: int, now: float, position: int) -> Wait:
    """The limit holding back the ``position``-th (0: the first) of the nodes refused in this pass, after
    the pass's own starts were recorded (``active`` counts them). Pure; the breaker is not changed."""
    if breaker.tripped:
        until = (breaker.tripped_at or now) + breaker.cooldown_seconds
        return Wait(Limit.TRIPPED, f"circuit breaker tripped ({breaker.why or 'by hand'}): no new remediation "
                    f"until it re-arms by itself (after the {breaker.cooldown_seconds:.0f}s cool-down, once fewer "
                    f"than {breaker.rearm_percent:.0f}% of nodes are affected) or `autoheal sync breaker reset`",
                    until)
    cap = start_capacity(breaker.max_percent, total)
    starts = sorted(t for t in breaker.starts if now - t <= breaker.window_seconds)
    if cap - len(starts) - position <= 0:
        if cap <= 0:
            return Wait(Limit.START_SHARE, f"{breaker.max_percent:.0f}% of a pool of {total} nodes allows no start "
                        f"at all (sync.breaker_max_percent too low for this pool): replace it by hand")
        # the slot this node needs frees when the (len - cap + position)-th start of the window expires;
        # beyond the starts recorded, no earlier than a window after the newest
        i = len(starts) - cap + position
        until = (starts[i] if i < len(starts) else (starts[-1] if starts else now)) + breaker.window_seconds
        return Wait(Limit.START_SHARE, f"{len(starts)} of {cap} starts allowed per {breaker.window_seconds:.0f}s "
                    f"window already made ({breaker.max_percent:.0f}% of {total} nodes)", until)
    return Wait(Limit.CONCURRENCY, f"{breaker.max_concurrent} remediations at once already under way "
                f"({active} active): starts when one ends")


# ---- which drains ask for a replacement ------------------------------------------------------------
def wants_replace(reason: str, cfg: SyncSection) -> bool:
    """An autoheal drain reason asking for a replacement: the node side's ``replace`` rung (``autoheal:
    replace: ...``, or another of ``remediate_reasons``). The node side alone decides that (its XID
    policy and recovery ladder, issue 22): an XID named in a plain health drain never does, so a site
    that sets XID 79 to ``reset`` gets no replacement, and the sync never acts before the hooks' rung.
    Retirements and Kubernetes drains never do."""
    parsed = Reason.parse(reason)
    if parsed is None or parsed.origin in (Origin.K8S, Origin.RETIRED):
        return False
    text = strip_reason_suffix(reason)
    return any(text.startswith(p.strip()) for p in cfg.remediate_reasons if p.strip())


def is_retired(reason: str) -> bool:
    parsed = Reason.parse(reason)
    return parsed is not None and parsed.origin is Origin.RETIRED


def retire_reason(replacement: str) -> str:
    return Reason(Origin.RETIRED, detail=f"replaced by {replacement}" if replacement
                  else "Node deleted for replacement").render()


def render_template(template: str, node: str, slurm_node: str, reason: str) -> Dict[str, Any]:
    """The custom resource from ``replacement_template`` (JSON text) with placeholders filled in, each
    JSON-escaped so a reason cannot break out of its string."""
    def esc(v: str) -> str:
        return json.dumps(v)[1:-1]

    text = template.replace("{node}", esc(node)).replace("{slurm_node}", esc(slurm_node)) \
        .replace("{reason}", esc(reason))
    body: Dict[str, Any] = json.loads(text)  # validated as a JSON object when the config is loaded
    return body


def cr_coordinates(template: str) -> Tuple[str, str, str]:
    """(group, version, plural) of the template's custom resource (plural: lower-case kind + s)."""
    tpl = json.loads(template)
    group, _, version = tpl["apiVersion"].partition("/")
    return group, version, tpl["kind"].lower() + "s"
