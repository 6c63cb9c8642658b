"""Issue 7 groundwork (not wired into the daemon yet): the remediation state machine and the circuit
breaker, as pure functions over plain data.

Per-node state lives in Node annotations (so a restarted or failed-over daemon continues where it
stopped): ``<prefix>/remediation-state`` (quarantined -> draining -> drained -> replacing -> done |
failed), ``<prefix>/remediation-since`` (epoch seconds of entering the state), ``<prefix>/remediation-
attempts`` and ``<prefix>/remediation-reason``. ``next_step`` says what to do for one node now; each
transition is one annotation patch written *before* the side effect it announces, and every side effect
is idempotent (cordon, evict, label), so a crash between the two repeats nothing harmful.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

STATES = ("quarantined", "draining", "drained", "replacing", "done", "failed")
ACTIVE = ("quarantined", "draining", "drained", "replacing")


def keys(prefix: str) -> Dict[str, str]:
    return {k: f"{prefix}/remediation-{k}" for k in ("state", "since", "attempts", "reason")}


@dataclass(frozen=True)
class NodeRemediation:
    """What the annotations of one Node say."""

    state: str = ""
    since: float = 0.0
    attempts: int = 0
    reason: str = ""

    @classmethod
    def from_node(cls, node: Dict[str, Any], prefix: str) -> "NodeRemediation":
        ann = ((node.get("metadata") or {}).get("annotations") or {})
        k = keys(prefix)
        state = ann.get(k["state"], "")
        try:
            since = float(ann.get(k["since"], 0) or 0)
            attempts = int(ann.get(k["attempts"], 0) or 0)
        except ValueError:  # hand-edited annotations: treat as a fresh start of that state
            since, attempts = 0.0, 0
        return cls(state if state in STATES else "", since, attempts, ann.get(k["reason"], ""))

    def patch(self, prefix: str) -> Dict[str, Any]:
        k = keys(prefix)
        return {"metadata": {"annotations": {k["state"]: self.state or None,
                                             k["since"]: str(int(self.since)) if self.state else None,
                                             k["attempts"]: str(self.attempts) if self.state else None,
                                             k["reason"]: self.reason or None}}}


@dataclass
class RemediationSettings:
    opt_out_label: str = "autoheal.io/auto-replace"
    opt_out_value: str = "false"
    grace_seconds: float = 300.0  # jobs leave Slurm within this, else fail
    drain_timeout_seconds: float = 600.0
    replace_timeout_seconds: float = 1800.0


@dataclass(frozen=True)
class Step:
    """One decision: the side effect to perform (``do``) and the state to record first (``then``)."""

    do: str  # none | wait | report-opt-out | cordon | evict | request-replacement | retire | fail
    then: Optional[NodeRemediation] = None
    why: str = ""


def next_step(cur: NodeRemediation, wants_replace: bool, slurm_jobs: int, pods_on_node: List[Dict[str, Any]],
              replacement_ready: bool, cfg: RemediationSettings, now: float) -> Step:
    """The next action for one node. ``wants_replace``: autoheal drained it with a replace-class fault."""
    st = cur.state
    if st in ("done", "failed"):
        return Step("none", why=f"remediation {st}")
    if not st:
        if not wants_replace:
            return Step("none")
        for pod in pods_on_node:
            labels = (pod.get("metadata") or {}).get("labels") or {}
            if labels.get(cfg.opt_out_label) == cfg.opt_out_value:
                name = (pod.get("metadata") or {}).get("name")
                return Step("report-opt-out", why=f"pod {name} carries {cfg.opt_out_label}={cfg.opt_out_value}")
        return Step("wait", NodeRemediation("quarantined", now, cur.attempts + 1, "replace-class fault"),
                    "quarantined: waiting for its Slurm jobs to leave")
    age = now - cur.since
    if st == "quarantined":
        if slurm_jobs == 0:
            return Step("cordon", NodeRemediation("draining", now, cur.attempts, cur.reason), "jobs gone: cordon")
        if age > cfg.grace_seconds:
            return Step("fail", NodeRemediation("failed", now, cur.attempts, "jobs did not leave Slurm in time"))
        return Step("wait", why=f"{slurm_jobs} Slurm jobs still on the node")
    if st == "draining":
        evictable = [p for p in pods_on_node if not _is_daemonset_pod(p)]
        if not evictable:
            return Step("request-replacement", NodeRemediation("replacing", now, cur.attempts, cur.reason),
                        "drained: request a replacement")
        if age > cfg.drain_timeout_seconds:
            return Step("fail", NodeRemediation("failed", now, cur.attempts, "eviction blocked (PDB?)"))
        return Step("evict", why=f"{len(evictable)} pods to evict")
    if st == "replacing":
        if replacement_ready:
            return Step("retire", NodeRemediation("done", now, cur.attempts, cur.reason), "replacement in service")
        if age > cfg.replace_timeout_seconds:
            return Step("fail", NodeRemediation("failed", now, cur.attempts, "replacement never arrived"))
        return Step("wait", why="waiting for the replacement Node")
    return Step("none")


def _is_daemonset_pod(pod: Dict[str, Any]) -> bool:
    return any(o.get("kind") == "DaemonSet" for o in ((pod.get("metadata") or {}).get("ownerReferences") or []))


@dataclass
class Breaker:
    """At most ``max_concurrent`` active remediations and ``max_percent`` of nodes in remediation or
    drained by autoheal within ``window_seconds``. Tripped: no new remediations until the share falls
    below ``rearm_percent`` (hysteresis) *and* ``cooldown_seconds`` passed, or a manual reset. Starts
    recorded before a trip are not replayed after re-arming: only nodes still wanting it start again."""

    max_concurrent: int = 2
    max_percent: float = 25.0
    rearm_percent: float = 10.0
    window_seconds: float = 600.0
    cooldown_seconds: float = 900.0
    tripped_at: Optional[float] = None
    starts: List[float] = field(default_factory=list)

    def allowed(self, active: int, affected: int, total: int, now: float) -> Tuple[int, str]:
        """(how many new remediations may start now, why not more)."""
        self.starts = [t for t in self.starts if now - t <= self.window_seconds]
        share = 100.0 * affected / total if total else 100.0
        if self.tripped_at is not None:
            if now - self.tripped_at >= self.cooldown_seconds and share < self.rearm_percent:
                self.tripped_at = None
                self.starts = []
            else:
                return 0, f"breaker tripped ({share:.0f}% of nodes affected)"
        if share > self.max_percent:
            self.tripped_at = now
            return 0, f"breaker tripped: {share:.0f}% of nodes affected > {self.max_percent:.0f}%"
        budget_pct = int(self.max_percent * total / 100.0) - len(self.starts)
        n = max(0, min(self.max_concurrent - active, budget_pct))
        return n, "" if n else "limit reached"

    def record_start(self, now: float) -> None:
        self.starts.append(now)

    def reset(self) -> None:
        self.tripped_at = None
        self.starts = []
