"""One reconcile pass: read both sides (fail closed), plan (pure, ``plan``), apply the writes.

Reads: one ``slurm.list_nodes()`` per pass, Kubernetes from the watch caches (or one list each without
them). If either read fails or a cache is not synced, the pass writes nothing.

Writes: step by step, in the planner's order; each write takes a token from its rate limiter (none left:
deferred to a later pass), checks leadership first, and re-reads the Slurm node right before a Slurm
write (an admin may have drained it since the snapshot; their drain always wins). A 409 is normal
(someone wrote in between): the next pass retries on fresh data. A 429/5xx/timeout stops the Kubernetes
writes of the pass; an unreachable slurmctld stops its Slurm writes. An exception in a step stops the
pass (later steps would act on a half-applied plan); errors are collected in the result.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from autoheal.errors import SlurmError, SlurmUnavailable
from autoheal.reasons import strip_reason_suffix

from autoheal.k8s_sync import names
from autoheal.k8s_sync.kube import Conflict, KubeError
from autoheal.k8s_sync.plan import (NODE_PATCH, NODE_STATUS, POD_STATUS, SLURM_DRAIN, SLURM_KINDS, SLURM_RESUME,
                                    SLURM_SET_REASON, STEPS, Action, Snapshot, make_context)
from autoheal.k8s_sync.ratelimit import TokenBucket

log = logging.getLogger("autoheal.sync")

#: Steps that only mirror Slurm into Kubernetes: re-run after the pass's own Slurm writes.
MIRROR_STEPS = ("slurm-to-pods", "health-to-nodes")


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class PassResult:
    ok: bool = True
    read_error: str = ""
    leader: bool = True
    planned: List[Action] = field(default_factory=list)
    applied: List[Action] = field(default_factory=list)
    deferred: int = 0
    conflicts: int = 0
    errors: List[str] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    seconds: float = 0.0
    nodes: int = 0
    mapped: int = 0

    def summary(self) -> Dict[str, Any]:
        return {"ok": self.ok, "read_error": self.read_error, "leader": self.leader,
                "planned": [a.describe() for a in self.planned], "applied": len(self.applied),
                "deferred": self.deferred, "conflicts": self.conflicts, "errors": self.errors,
                "problems": self.problems, "seconds": round(self.seconds, 4), "slurm_nodes": self.nodes,
                "mapped": self.mapped}


class Reconciler:
    """Runs passes for one config against one Slurm adapter and one Kubernetes adapter."""

    def __init__(self, slurm, kube, cfg, *, dry_run: bool = False, leader=None, nodes_cache=None,
                 pods_cache=None, journal=None, metrics=None):
        self.slurm, self.kube, self.cfg = slurm, kube, cfg
        self.dry_run = dry_run
        self.leader = leader  # LeaderElector or None (always leader)
        self.nodes_cache, self.pods_cache = nodes_cache, pods_cache
        self.journal = journal
        self.metrics = metrics
        self.kube_bucket = TokenBucket(cfg.api_writes_per_second, cfg.api_write_burst)
        self.slurm_bucket = TokenBucket(cfg.slurm_writes_per_second, cfg.slurm_write_burst)
        self.writes: Dict[str, int] = {}
        #: Reuse a Slurm read younger than this (seconds) in passes woken early by watch events, so a
        #: storm of Kubernetes updates never turns into a storm of Slurm reads. 0: read every pass.
        self.slurm_max_age = 0.0
        self._slurm_cache = None
        self.last: Optional[PassResult] = None

    # ---- reads -----------------------------------------------------------------------------------
    def read(self) -> Snapshot:
        """Both sides, or an exception (SlurmError / KubeError / RuntimeError when a cache is not synced)."""
        now = time.monotonic()
        if self._slurm_cache is not None and now - self._slurm_cache[0] < self.slurm_max_age:
            slurm_nodes = self._slurm_cache[1]  # a pass woken by a watch event: Slurm was read just now
        else:
            slurm_nodes = {n.name: n for n in self.slurm.list_nodes()}
            self._slurm_cache = (now, slurm_nodes)
        if self.nodes_cache is not None:
            if not self.nodes_cache.synced or (self.pods_cache is not None and not self.pods_cache.synced):
                raise RuntimeError("Kubernetes watch caches not synced")
            nodes = self.nodes_cache.snapshot()
            pods = self.pods_cache.snapshot() if self.pods_cache is not None else {}
        else:
            nodes, _ = self.kube.list_nodes()
            pods = self.kube.list_pods(self.cfg.namespace, self.cfg.pod_selector)[0] \
                if self.cfg.mapping == "pod" else {}
        return Snapshot(slurm_nodes, nodes, pods, utc_now())

    # ---- the pass --------------------------------------------------------------------------------
    def run_pass(self) -> PassResult:
        started = time.perf_counter()
        res = PassResult(leader=self.is_leader())
        try:
            snap = self.read()
        except (SlurmError, KubeError, RuntimeError) as exc:
            res.ok, res.read_error = False, str(exc)
            res.seconds = time.perf_counter() - started
            self._observe(res)
            log.warning("pass skipped, nothing written: %s", exc)
            return res
        res.nodes = len(snap.slurm)
        self._fresh: Dict[Any, Dict[str, Any]] = {}  # objects our writes returned in this pass
        ctx = make_context(snap, self.cfg)
        res.mapped = len(ctx.bindings)
        for step in self.cfg.enabled_steps:
            fn = STEPS.get(step)
            if fn is None:
                continue
            try:
                actions = fn(ctx)
            except Exception as exc:  # a bug or bad data in one step must not half-apply the next ones
                res.ok = False
                res.errors.append(f"step {step}: {type(exc).__name__}: {exc}")
                log.exception("step %s failed; pass stopped", step)
                break
            res.planned.extend(actions)
            if actions and (res.leader or self.dry_run):
                self._apply(step, actions, snap, res)
        if res.ok and not self.dry_run and any(a.kind in SLURM_KINDS for a in res.applied):
            self._mirror_own_slurm_writes(snap, res)
        res.problems = ctx.problems
        res.seconds = time.perf_counter() - started
        self.last = res
        self._observe(res)
        return res

    def _mirror_own_slurm_writes(self, snap: Snapshot, res: PassResult) -> None:
        """After this pass drained/resumed Slurm nodes, mirror the new Slurm state right away (one more
        Slurm read) instead of one resync later; a failed read just leaves it to the next pass."""
        try:
            slurm_nodes = {n.name: n for n in self.slurm.list_nodes()}
        except SlurmError:
            return
        self._slurm_cache = (time.monotonic(), slurm_nodes)
        nodes = dict(snap.nodes)
        pods = dict(snap.pods)
        for key, obj in self._fresh.items():
            (nodes if key[0] == "node" else pods)[key[-1]] = obj
        snap2 = Snapshot(slurm_nodes, nodes, pods, snap.now)
        ctx2 = make_context(snap2, self.cfg)
        self._fresh = {}
        for step in self.cfg.enabled_steps:
            if step in MIRROR_STEPS and step in STEPS:
                actions = STEPS[step](ctx2)
                res.planned.extend(actions)
                if actions:
                    self._apply(step, actions, snap2, res)

    def is_leader(self) -> bool:
        return self.leader is None or self.leader.is_leader()

    def _apply(self, step: str, actions: List[Action], snap: Snapshot, res: PassResult) -> None:
        kube_stopped = slurm_stopped = False
        failed_slurm_nodes = set()
        for action in actions:
            if self.dry_run:
                log.info("dry-run: would %s", action.describe())
                continue
            if not self.is_leader():
                res.errors.append(f"step {step}: lost leadership; remaining writes left to the new leader")
                return
            is_slurm = action.kind in SLURM_KINDS
            if (is_slurm and slurm_stopped) or (not is_slurm and kube_stopped):
                res.deferred += 1
                continue
            if action.kind == NODE_PATCH and action.slurm_node in failed_slurm_nodes:
                continue  # never annotate an origin for a Slurm write that did not happen
            bucket = self.slurm_bucket if is_slurm else self.kube_bucket
            if not bucket.try_take():
                res.deferred += 1
                if is_slurm:
                    failed_slurm_nodes.add(action.slurm_node)
                continue
            try:
                done = self._write(action, snap)
            except Conflict:
                res.conflicts += 1
                continue
            except SlurmUnavailable as exc:
                slurm_stopped = True
                failed_slurm_nodes.add(action.slurm_node)
                res.errors.append(f"{action.describe()}: {exc}")
                continue
            except SlurmError as exc:
                failed_slurm_nodes.add(action.slurm_node)
                res.errors.append(f"{action.describe()}: {exc}")
                continue
            except KubeError as exc:
                res.errors.append(f"{action.describe()}: {exc}")
                if exc.status == 429 or exc.status >= 500 or exc.status == 0:
                    kube_stopped = True  # back off: the next pass retries from fresh data
                continue
            if not done:
                failed_slurm_nodes.add(action.slurm_node)
                continue
            res.applied.append(action)
            if is_slurm:
                self._slurm_cache = None
            self.writes[action.kind] = self.writes.get(action.kind, 0) + 1
            log.info("%s", action.describe(), extra={"step": step, "kind": action.kind, "target": action.target,
                                                    "slurm_node": action.slurm_node})
            self._record(action, snap)

    def _guarded_body(self, action: Action, snap: Snapshot, key) -> Dict[str, Any]:
        """The body of a resourceVersion-guarded patch, re-based on our own earlier write in this pass.

        Two writes to one object in a pass (say the health condition, then the taint list) would
        otherwise make the second fail with 409 against our own first write. The guard means "the list
        we computed from is still the list": if the object our first write returned still has exactly
        that list, the guard holds at the new resourceVersion.
        """
        rv = (action.body.get("metadata") or {}).get("resourceVersion")
        fresh = self._fresh.get(key)
        if not rv or fresh is None:
            return action.body
        old = snap.pods.get(action.target) if key[0] == "pod" else snap.nodes.get(action.target)
        field_path = ("spec", "taints") if "spec" in action.body else ("status", "conditions")

        def get(obj):
            return ((obj or {}).get(field_path[0]) or {}).get(field_path[1]) or []

        if get(fresh) != get(old):
            raise Conflict(f"{action.target}: {'.'.join(field_path)} changed since the snapshot", 409)
        body = dict(action.body)
        body["metadata"] = {**body["metadata"], "resourceVersion": (fresh.get("metadata") or {}).get("resourceVersion")}
        return body

    def _write(self, action: Action, snap: Snapshot) -> bool:
        """Do one write; False when a re-read shows it must not happen any more."""
        kind = action.kind
        if kind == POD_STATUS:
            key = ("pod", action.namespace, action.target)
            obj = self.kube.patch_pod_status(action.namespace, action.target, self._guarded_body(action, snap, key),
                                             action.patch_type)
            self._fresh[key] = obj
            if self.pods_cache is not None:
                self.pods_cache.update(obj)
        elif kind in (NODE_STATUS, NODE_PATCH):
            key = ("node", action.target)
            fn = self.kube.patch_node_status if kind == NODE_STATUS else self.kube.patch_node
            obj = fn(action.target, self._guarded_body(action, snap, key), action.patch_type)
            self._fresh[key] = obj
            if self.nodes_cache is not None:
                self.nodes_cache.update(obj)
        elif kind in SLURM_KINDS:
            cur = self.slurm.get_node(action.target)  # re-read: an admin may have acted since the snapshot
            reason = strip_reason_suffix(cur.reason)
            held = cur.drain or cur.down
            if kind == SLURM_DRAIN:
                if held and reason and not names.is_k8s_reason(reason):
                    return False
                self.slurm.drain(action.target, action.reason)
            elif kind == SLURM_SET_REASON:
                if not (held and names.is_k8s_reason(reason)):
                    return False
                self.slurm.set_reason(action.target, action.reason)
            elif kind == SLURM_RESUME:
                if not (held and names.is_k8s_reason(reason)):
                    return False
                self.slurm.resume(action.target)
        return True

    def _record(self, action: Action, snap: Snapshot) -> None:
        if action.event and self.cfg.events:
            kname = action.target if action.kind in (NODE_STATUS, NODE_PATCH) else ""
            if not kname:  # a Slurm write: the Event goes on the Kubernetes Node bound to that Slurm node
                kname = self._node_of(action.slurm_node, snap)
            node = snap.nodes.get(kname)
            if node is not None and self.kube_bucket.try_take():
                try:
                    self.kube.create_event(self.cfg.namespace, node, action.event[0], action.event[1],
                                           action.event[2], snap.now)
                except KubeError as exc:
                    log.warning("event for %s not posted: %s", kname, exc)
        if self.journal is not None and action.kind in SLURM_KINDS:
            self.journal.record(action.kind.replace("slurm-", ""), node=action.slurm_node, action=action.kind,
                                outcome="done", message=action.why, severity="action", source="sync",
                                evidence={"reason": action.reason})

    def _node_of(self, slurm_node: str, snap: Snapshot) -> str:
        ctx = make_context(Snapshot({slurm_node: snap.slurm[slurm_node]}, snap.nodes, snap.pods), self.cfg)
        b = ctx.bindings.get(slurm_node)
        return (b.node or "") if b else ""

    def _observe(self, res: PassResult) -> None:
        if self.metrics is not None:
            self.metrics.observe_pass(res, self)
