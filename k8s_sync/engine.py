"""One reconcile pass: read both sides (fail closed), plan (pure, ``plan``), apply the writes.

Reads: one ``slurm.list_nodes()`` per pass, Kubernetes from the watch caches (or one list each without
them). If either read fails or a cache is not synced, the pass writes nothing.

Writes: step by step, in the planner's order; each write takes a token from its rate limiter (none left:
deferred to a later pass), checks leadership first, and re-reads the Slurm node right before a Slurm
write (an admin may have drained it since the snapshot; their drain always wins). A 409 is normal
(someone wrote in between): the next pass retries on fresh data. A 429/5xx/timeout stops the Kubernetes
writes of the step; an unreachable slurmctld stops its Slurm writes. An exception in a step stops the
pass (later steps would act on a half-applied plan); errors are collected in the result.

The mirror steps' object patches run on a bounded pool (``writepool``, ``sync.api_write_concurrency``
threads): a 1,000-node drain is some 4,000 independent patches, which one at a time wait on the API
server's round trips. Writes to one object, and the writes of one group, keep their plan order; the rate
limiter, leadership and the 409/429/5xx rules above apply to each write as before (a 429 on one lane
stops the others' next writes; those already sent finish).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple

from autoheal.errors import SlurmError, SlurmUnavailable
from autoheal.k8s_sync import names, remediate_step, steps, writepool
from autoheal.k8s_sync import remediation as R
from autoheal.k8s_sync.kube import Conflict, KubeError
from autoheal.k8s_sync.mapping import Binding
from autoheal.k8s_sync.plan import (
    NODE_PATCH,
    NODE_STATUS,
    POD_STATUS,
    SLURM_DRAIN,
    SLURM_KINDS,
    SLURM_RESUME,
    SLURM_SET_REASON,
    Action,
    Context,
    Snapshot,
    make_context,
)
from autoheal.k8s_sync.ratelimit import TokenBucket
from autoheal.k8s_sync.remediate_step import RemediationResult
from autoheal.k8s_sync.remediation import RS
from autoheal.reasons import strip_reason_suffix
from autoheal.slurm.model import Node

if TYPE_CHECKING:
    from autoheal.config.sync_section import SyncSection
    from autoheal.journal import Journal
    from autoheal.k8s_sync.informer import Informer
    from autoheal.k8s_sync.kube import KubeClient
    from autoheal.k8s_sync.leader import LeaderElector
    from autoheal.k8s_sync.metrics import Metrics
    from autoheal.notify import Notifier
    from autoheal.slurm.base import SlurmAdapter

log = logging.getLogger("autoheal.sync")


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
    breaker: Dict[str, Any] = field(default_factory=dict)
    remediations: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    opted_out: Dict[str, Dict[str, str]] = field(default_factory=dict)  # need a replacement, vetoed by a label
    capacity: Dict[str, Any] = field(default_factory=dict)  # the breaker's arithmetic on this pool (issue 27)

    def summary(self) -> Dict[str, Any]:
        return {"ok": self.ok, "read_error": self.read_error, "leader": self.leader,
                "planned": [a.describe() for a in self.planned], "applied": len(self.applied),
                "deferred": self.deferred, "conflicts": self.conflicts, "errors": self.errors,
                "problems": self.problems, "seconds": round(self.seconds, 4), "slurm_nodes": self.nodes,
                "mapped": self.mapped, "breaker": self.breaker, "remediations": self.remediations,
                "opted_out": self.opted_out, "capacity": self.capacity}


@dataclass
class _Batch:
    """What the writes of one step learnt so far: which paths stopped, which Slurm nodes and groups failed."""

    kube_stopped: bool = False
    slurm_stopped: bool = False
    failed_slurm_nodes: Set[str] = field(default_factory=set)
    failed_groups: Set[str] = field(default_factory=set)
    halted: bool = False  # leadership lost: nothing more is written in this step
    records: Optional[List[Action]] = None  # pooled writes whose Events wait for the end of their run

    def fail(self, action: Action, slurm_node: bool = False) -> None:
        """``action`` did not happen: the rest of its group waits (and its Slurm node's annotations)."""
        if action.group:
            self.failed_groups.add(action.group)
        if slurm_node:
            self.failed_slurm_nodes.add(action.slurm_node)


class Reconciler:
    """Runs passes for one config against one Slurm adapter and one Kubernetes adapter."""

    def __init__(self, slurm: SlurmAdapter, kube: KubeClient, cfg: SyncSection, *, dry_run: bool = False,
                 leader: Optional[LeaderElector] = None, nodes_cache: Optional[Informer] = None,
                 pods_cache: Optional[Informer] = None, journal: Optional[Journal] = None,
                 metrics: Optional[Metrics] = None, notifier: Optional[Notifier] = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.slurm, self.kube, self.cfg = slurm, kube, cfg
        self.dry_run = dry_run
        self.leader = leader  # LeaderElector or None (always leader)
        self.nodes_cache, self.pods_cache = nodes_cache, pods_cache
        self.journal = journal
        self.metrics = metrics
        self.kube_bucket = TokenBucket(cfg.api_writes_per_second, cfg.api_write_burst)
        self.slurm_bucket = TokenBucket(cfg.slurm_writes_per_second, cfg.slurm_write_burst)
        self.writes: Dict[str, int] = {}
        #: guards what the write pool's threads share: the pass result, the batch, the counters
        self._book = threading.Lock()
        #: Reuse a Slurm read younger than this (seconds) in passes woken early by watch events, so a
        #: storm of Kubernetes updates never turns into a storm of Slurm reads. 0: read every pass.
        self.slurm_max_age = 0.0
        self._slurm_cache: Optional[Tuple[float, Dict[str, Node]]] = None
        #: the mapping of the current pass (Slurm node -> its Kubernetes objects), None outside one
        self._bindings: Optional[Dict[str, Binding]] = None
        self.last: Optional[PassResult] = None
        self.notifier = notifier
        self.clock = clock  # epoch seconds (tests pass a fake clock to step through timeouts)
        #: (namespace, pod) -> (failures, not before (self.clock), Slurm node): evictions a
        #: PodDisruptionBudget refused back off; any eviction on that node resets them (progress)
        self.evict_backoff: Dict[Any, Any] = {}

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
        snap = Snapshot(slurm_nodes, nodes, pods, utc_now(), clock=self.clock())
        if "remediate" in self.cfg.enabled_steps:
            self._read_remediation(snap)
        return snap

    def _read_remediation(self, snap: Snapshot) -> None:
        """What the remediate step needs beyond the mirror: the breaker ConfigMap, and for candidate
        Nodes only (a handful, not the fleet) their pods, the Slurm jobs and replacement requests.
        Any failure raises: the pass writes nothing (fail closed)."""
        cfg = self.cfg
        cm = self.kube.get_configmap(cfg.namespace, cfg.breaker_configmap)
        snap.breaker = dict((cm or {}).get("data") or {})
        snap.breaker_rv = ((cm or {}).get("metadata") or {}).get("resourceVersion", "") if cm else ""
        self._breaker_exists = cm is not None
        ctx = make_context(snap, cfg)
        cands = remediate_step.candidates(snap, cfg, ctx.bindings)
        snap.jobs = {}
        if cands:
            # only the states that hold a node: Slurm filters, so a queue flooded with pending jobs costs nothing
            for job in self.slurm.list_jobs(states=list(R.HOLDING_JOB_STATES)):
                if job.state in R.HOLDING_JOB_STATES:
                    for n in job.nodes:
                        snap.jobs[n] = snap.jobs.get(n, 0) + 1
            for kname in cands:
                snap.node_pods[kname] = self.kube.list_node_pods(kname)
        if cfg.replacement_action == "custom-resource" and (cands or remediate_step.needs_requests(snap, cfg)):
            group, version, plural = R.cr_coordinates(cfg.replacement_template)
            snap.replacements = self.kube.list_custom(group, version, cfg.namespace, plural)

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
        self._bindings = ctx.bindings  # the Node of a Slurm node, for the Events of this pass's writes
        res.mapped = len(ctx.bindings)
        problems, remediation = self._run_steps(ctx, snap, res)
        if res.ok and not self.dry_run and any(a.kind in SLURM_KINDS or a.kind in (R.SLURM_RETIRE, R.SLURM_RESUME_SPARE)
                                                for a in res.applied):
            self._mirror_own_slurm_writes(snap, res)
        # the mapping's, the steps' (in step order), then the refusals found while writing
        res.problems = list(ctx.mapping_problems) + problems + res.problems
        if "remediate" in self.cfg.enabled_steps:
            self._summarise_remediation(snap, res, ctx, remediation)
        res.seconds = time.perf_counter() - started
        self._bindings = None
        self.last = res
        self._observe(res)
        return res

    def _run_steps(self, ctx: Context, snap: Snapshot,
                   res: PassResult) -> Tuple[List[str], Optional[RemediationResult]]:
        """Each enabled step in order, its actions applied before the next step runs; the steps' problems
        and the remediate step's result (None: not run). An exception in a step stops the pass."""
        problems: List[str] = []
        remediation: Optional[RemediationResult] = None
        for step in steps.enabled(self.cfg.enabled_steps):
            try:
                result = step.run(ctx)
            except Exception as exc:  # a bug or bad data in one step must not half-apply the next ones
                res.ok = False
                res.errors.append(f"step {step.name}: {type(exc).__name__}: {exc}")
                log.exception("step %s failed; pass stopped", step.name)
                break
            actions = result.actions
            res.planned.extend(actions)
            problems += result.problems
            if isinstance(result, RemediationResult):
                remediation = result
                # forget the backoff of pods no longer to be evicted
                live = {(a.namespace, a.target) for a in actions if a.kind == R.KUBE_EVICT}
                self.evict_backoff = {key: v for key, v in self.evict_backoff.items() if key in live}
            if actions and (res.leader or self.dry_run):
                self._apply(step.name, actions, snap, res)
        return problems, remediation

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
        self._bindings = ctx2.bindings
        self._fresh = {}
        for step in steps.enabled(self.cfg.enabled_steps):
            if step.mirror:
                actions = step.run(ctx2).actions
                res.planned.extend(actions)
                if actions:
                    self._apply(step.name, actions, snap2, res)

    def is_leader(self) -> bool:
        return self.leader is None or self.leader.is_leader()

    def _apply(self, step: str, actions: List[Action], snap: Snapshot, res: PassResult) -> None:
        """Perform one step's actions in plan order, as the leader, within the rate limits; a failed action
        holds back the rest of its group, and Slurm writes that did not happen are not annotated.

        In the pooled steps (``SyncStep.pooled``), runs of plain object patches go through the write pool
        (``writepool``): writes to one object or of one group stay in plan order in one lane, other lanes
        run beside it on at most ``sync.api_write_concurrency`` threads. Everything else runs alone, in order, and a run
        starts only after the one before it finished."""
        if self.dry_run:
            for action in actions:
                log.info("dry-run: would %s", action.describe())
            return
        batch = _Batch()
        for pooled, run in writepool.segments(actions, pooled=steps.named(step).pooled):
            if batch.halted:
                return
            if not pooled:
                self._run_lane(step, run, snap, res, batch)
                continue
            first = len(res.applied)
            order = {id(a): i for i, a in run}
            batch.records = []
            writepool.run_lanes(writepool.lanes(run),
                                lambda lane: self._run_lane(step, lane, snap, res, batch, pooled=True),
                                self.cfg.api_write_concurrency)
            # the result lists its writes in plan order, however the lanes interleaved
            res.applied[first:] = sorted(res.applied[first:], key=lambda a: order.get(id(a), -1))
            # the Events after the state they tell of: a drain of many nodes is visible one round of
            # Events sooner (Events are for people; conditions and taints are what schedulers read)
            events = sorted(batch.records, key=lambda a: order.get(id(a), -1))
            batch.records = None
            writepool.run_lanes([[(i, a)] for i, a in enumerate(events)],
                                lambda one: self._record(one[0][1], snap), self.cfg.api_write_concurrency)

    def _run_lane(self, step: str, lane: List[Tuple[int, Action]], snap: Snapshot, res: PassResult,
                  batch: _Batch, pooled: bool = False) -> None:
        """The writes of one lane in order (alone, or beside other lanes on the write pool's threads): every
        decision on shared state under ``self._book``, the API call itself outside it. In a pooled run,
        consecutive patches of one Node go as one request (``writepool.coalesce``: the taint list and
        the fault-history annotation of a drained node), each still booked, counted and evented."""
        for request in (writepool.coalesce(lane) if pooled else [[item] for item in lane]):
            go: List[Action] = []
            with self._book:
                for _, action in request:
                    if batch.halted:
                        return
                    if action.group and action.group in batch.failed_groups:
                        res.deferred += 1
                        continue
                    if not self.is_leader():
                        batch.halted = True
                        res.errors.append(f"step {step}: lost leadership; remaining writes left to the new leader")
                        return
                    if not self._held_back(action, batch, res):
                        go.append(action)
            if not go:
                continue
            if self._write_one(writepool.as_one(go), snap, batch, res):
                for action in go:
                    self._written(step, action, snap, res, batch)

    def _held_back(self, action: Action, batch: _Batch, res: PassResult) -> bool:
        """True when ``action`` is not written this pass: its path (Slurm or Kubernetes) stopped, it is the
        annotation of a Slurm write that failed, its eviction backs off, or the rate limit says wait. All
        but the annotation count as deferred."""
        is_slurm = action.kind in SLURM_KINDS
        if (is_slurm and batch.slurm_stopped) or (not is_slurm and batch.kube_stopped):
            res.deferred += 1
            return True
        if action.kind == NODE_PATCH and action.slurm_node in batch.failed_slurm_nodes:
            return True  # never annotate an origin for a Slurm write that did not happen
        if action.kind == R.KUBE_EVICT and not self._evict_due(action):
            res.deferred += 1
            return True
        bucket = self.slurm_bucket if is_slurm else self.kube_bucket
        if not bucket.try_take():
            batch.fail(action, slurm_node=is_slurm)
            res.deferred += 1
            return True
        return False

    def _write_one(self, action: Action, snap: Snapshot, batch: _Batch, res: PassResult) -> bool:
        """Write ``action``; False (and the failure noted in ``batch`` and ``res``) when it did not happen."""
        try:
            done = self._write(action, snap)
        except (SlurmError, KubeError, OSError) as exc:
            with self._book:
                self._failed(action, exc, batch, res)
            return False
        if not done:
            with self._book:
                batch.fail(action, slurm_node=True)
        return done

    def _failed(self, action: Action, exc: Exception, batch: _Batch, res: PassResult) -> None:
        """Book a write that raised: a 409 is normal (the next pass retries on fresh data); an unreachable
        slurmctld stops the Slurm writes, a 429/5xx/timeout the Kubernetes writes of this step."""
        if isinstance(exc, Conflict):
            res.conflicts += 1
            batch.fail(action)
            return
        if isinstance(exc, SlurmError):
            batch.fail(action, slurm_node=True)
            batch.slurm_stopped = batch.slurm_stopped or isinstance(exc, SlurmUnavailable)
            res.errors.append(f"{action.describe()}: {exc}")
            return
        batch.fail(action)
        status = getattr(exc, "status", 0)
        if action.kind == R.KUBE_EVICT and status == 429:
            self._evict_refused(action, res, str(exc))
            return
        res.errors.append(f"{action.describe()}: {exc}")
        if status == 429 or status >= 500 or status == 0:
            batch.kube_stopped = True  # back off: the next pass retries from fresh data

    def _written(self, step: str, action: Action, snap: Snapshot, res: PassResult,
                 batch: Optional[_Batch] = None) -> None:
        """Book a write that happened: results, caches, eviction backoff, counters, log and journal (the
        Event of a pooled write waits in ``batch.records`` until its run's writes are done)."""
        with self._book:
            res.applied.append(action)
            if action.kind in SLURM_KINDS:
                self._slurm_cache = None
            if action.kind == R.KUBE_EVICT:  # progress on this node: its other pods try again at once
                self.evict_backoff = {key: v for key, v in self.evict_backoff.items()
                                      if v[2] != action.slurm_node}
            self.writes[action.kind] = self.writes.get(action.kind, 0) + 1
        log.info("%s", action.describe(), extra={"step": step, "kind": action.kind, "target": action.target,
                                                "slurm_node": action.slurm_node})
        if batch is not None and batch.records is not None and action.event and not action.journal:
            with self._book:
                batch.records.append(action)  # its Event once the run's writes are done
            return
        self._record(action, snap)

    def _guarded_body(self, action: Action, snap: Snapshot, key: Tuple[str, ...]) -> Dict[str, Any]:
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

        def get(obj: Optional[Dict[str, Any]]) -> Any:
            return ((obj or {}).get(field_path[0]) or {}).get(field_path[1]) or []

        if get(fresh) != get(old):
            raise Conflict(f"{action.target}: {'.'.join(field_path)} changed since the snapshot", 409)
        body = dict(action.body)
        body["metadata"] = {**body["metadata"], "resourceVersion": (fresh.get("metadata") or {}).get("resourceVersion")}
        return body

    def _evict_due(self, action: Action) -> bool:
        entry = self.evict_backoff.get((action.namespace, action.target))
        return action.force or entry is None or self.clock() >= entry[1]

    def _evict_refused(self, action: Action, res: PassResult, text: str) -> None:
        """A PodDisruptionBudget refused (429): retry with exponential backoff (1, 2, 4 ... 30 s), never
        waiting past the drain timeout (``action.deadline``), where the planner makes one last attempt
        before the remediation fails; an eviction that succeeds on the node resets the backoff."""
        key = (action.namespace, action.target)
        now = self.clock()
        failures = self.evict_backoff.get(key, (0, 0.0, ""))[0] + 1
        delay = min(30.0, 2.0 ** (failures - 1))
        if action.deadline:
            delay = min(delay, max(0.0, action.deadline - now))
        self.evict_backoff[key] = (failures, now + delay, action.slurm_node)
        res.problems.append(f"eviction of {action.namespace}/{action.target} refused ({failures}x, next try in "
                            f"{delay:.0f}s): {text}")

    def _write(self, action: Action, snap: Snapshot) -> bool:
        """Do one write; False when a re-read shows it must not happen any more."""
        kind = action.kind
        if kind in R.KINDS:
            return self._write_remediation(action, snap)
        if kind == POD_STATUS:
            key: Tuple[str, ...] = ("pod", action.namespace, action.target)
            obj = self.kube.patch_pod_status(action.namespace, action.target, self._guarded_body(action, snap, key),
                                             action.patch_type)
            if self.pods_cache is not None:
                obj = self.pods_cache.update(obj)  # kept as the cache keeps it (``slim_pod``)
            self._fresh[key] = obj
        elif kind in (NODE_STATUS, NODE_PATCH):
            key = ("node", action.target)
            fn = self.kube.patch_node_status if kind == NODE_STATUS else self.kube.patch_node
            obj = fn(action.target, self._guarded_body(action, snap, key), action.patch_type)
            if self.nodes_cache is not None:
                obj = self.nodes_cache.update(obj)
            self._fresh[key] = obj
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

    def _write_remediation(self, action: Action, snap: Snapshot) -> bool:
        kind, cfg = action.kind, self.cfg
        if kind == R.REPORT:
            return True
        if kind == R.BREAKER_SAVE:
            if getattr(self, "_breaker_exists", True):
                self.kube.patch_configmap(action.namespace, action.target, action.body)
            else:
                self.kube.create_configmap(action.namespace, {"apiVersion": "v1", "kind": "ConfigMap",
                                                              "metadata": {"name": action.target},
                                                              "data": {k: v for k, v in action.body["data"].items()
                                                                       if v is not None}})
                self._breaker_exists = True
            return True
        if kind == R.KUBE_EVICT:
            self.kube.evict_pod(action.namespace, action.target)
        elif kind == R.KUBE_DELETE_NODE:
            self.kube.delete_node(action.target)
        elif kind == R.KUBE_CREATE_CR:
            group, version, plural = R.cr_coordinates(cfg.replacement_template)
            self.kube.create_custom(group, version, action.namespace, plural, action.body)
        elif kind == R.KUBE_DELETE_CR:
            group, version, plural = R.cr_coordinates(cfg.replacement_template)
            self.kube.delete_custom(group, version, action.namespace, plural, action.target)
        elif kind == R.WEBHOOK:
            self._webhook(action, snap)
        elif kind in (R.SLURM_RETIRE, R.SLURM_RESUME_SPARE):
            cur = self.slurm.get_node(action.target)  # re-read: an admin's drain always wins
            reason = strip_reason_suffix(cur.reason)
            held = cur.drain or cur.down
            if kind == R.SLURM_RETIRE:
                if not (held and names.is_health_reason(reason)):
                    return False
                if reason != action.reason:
                    self.slurm.set_reason(action.target, action.reason)
            else:
                if not (held and reason.startswith(cfg.spare_reason_prefix.strip())):
                    return False
                self.slurm.resume(action.target)
        return True

    def _webhook(self, action: Action, snap: Snapshot) -> None:
        """POST the replacement request; remember it on the Node so a restart does not POST again."""
        import json as _json
        import urllib.request

        kname = action.body.get("node", "")
        uid = snap.nodes.get(kname, {}).get("metadata", {}).get("uid", "")
        data = _json.dumps({**action.body, "idempotency_key": f"{kname}-{uid}"}).encode()
        req = urllib.request.Request(action.target, data=data, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "autoheal-sync"})
        with urllib.request.urlopen(req, timeout=self.cfg.request_timeout_seconds) as resp:
            answer = resp.read(65536)
            status = resp.status
        if status >= 300:
            raise KubeError(f"webhook {action.target}: HTTP {status}", status)
        k = R.keys(self.cfg.annotation_prefix)
        ann = {k["requested"]: str(int(snap.clock))}
        try:
            new = (_json.loads(answer) or {}).get("replacementNode") if answer else None
        except ValueError:
            new = None
        if new:
            ann[k["replacement"]] = str(new)
        self.kube.patch_node(kname, {"metadata": {"annotations": ann}}, "merge")

    def _summarise_remediation(self, snap: Snapshot, res: PassResult, ctx: Optional[Context] = None,
                               step: Optional[RemediationResult] = None) -> None:
        """The remediation part of the pass summary from the Nodes' records and the remediate step's
        result (``step``; None: it did not run, and the breaker is shown as stored)."""
        breaker = (step.breaker if step is not None else None) or R.Breaker.from_cfg(self.cfg, snap.breaker or {})
        res.breaker = {"tripped": breaker.tripped, "why": breaker.why, "starts_in_window": len(breaker.starts),
                       "max_concurrent": breaker.max_concurrent, "max_percent": breaker.max_percent,
                       "nodes": list(breaker.nodes)}
        notes = step.retry_notes if step is not None else {}
        for kname, knode in snap.nodes.items():
            cur = R.NodeRemediation.from_node(knode, self.cfg.annotation_prefix)
            if cur.state:
                res.remediations[kname] = {"state": cur.state, "since": cur.since, "attempts": cur.attempts,
                                           "reason": cur.reason, "slurm_node": cur.slurm_node}
                if cur.state == RS.FAILED and notes.get(kname):
                    res.remediations[kname]["retry"] = notes[kname]
                if cur.state == RS.WAITING:
                    res.remediations[kname].update(until=cur.until, limit=cur.limit)
        res.opted_out = dict(step.opted_out) if step is not None else {}
        if ctx is not None:
            self._check_capacity(ctx, res)
        if self.metrics is not None and hasattr(self.metrics, "observe_remediation"):
            self.metrics.observe_remediation(res)
        if self.metrics is not None and hasattr(self.metrics, "observe_waiting"):
            self.metrics.observe_waiting(res, snap.clock)

    def _check_capacity(self, ctx: Context, res: PassResult) -> None:
        """Small-pool sanity: the breaker's limits against the fleet's expected failure rate on the pool it
        guards (Slurm nodes bound to a Node). A shortfall is logged and journalled once per pool size (at
        start, and when the pool changes), and shown in every pass summary (`autoheal sync status`)."""
        pool = len({b.node for b in ctx.bindings.values() if b.node})
        cap = self.cfg.replacement_capacity(pool)
        res.capacity = {"pool": cap.pool, "per_window": cap.per_window, "per_day": round(cap.per_day, 2),
                        "expected_per_day": round(cap.expected_per_day, 3), "arithmetic": cap.arithmetic,
                        "warning": cap.warning}
        said = getattr(self, "_capacity_said", None)
        if not cap.warning or said == (pool, cap.warning) or self.dry_run:
            return
        self._capacity_said = (pool, cap.warning)
        log.warning("remediation capacity: %s", cap.warning, extra={"pool": pool})
        if self.journal is not None:
            rec = self.journal.record("remediation-capacity-low", action="check", outcome="warning",
                                      message=f"remediation capacity: {cap.warning}", severity="action",
                                      source="sync", evidence={"pool": pool, "per_window": cap.per_window,
                                                               "per_day": cap.per_day,
                                                               "expected_per_day": cap.expected_per_day})
            if rec is not None and self.notifier is not None:
                try:
                    self.notifier.send(rec)
                except Exception as exc:  # best effort, as every notification
                    log.warning("notification not sent: %s", exc)

    def _record(self, action: Action, snap: Snapshot) -> None:
        if action.journal:
            self._record_remediation(action, snap)
            return
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

    def _record_remediation(self, action: Action, snap: Snapshot) -> None:
        """Remediation steps go to the Node's Events, the journal and the notification channel."""
        kname = action.target if action.kind == NODE_PATCH else ""
        if not kname and action.slurm_node:
            kname = self._node_of(action.slurm_node, snap)
        if action.event and self.cfg.events and self.kube_bucket.try_take():
            obj = snap.nodes.get(kname) if kname else None
            if obj is None:  # breaker events: about the breaker ConfigMap
                obj = {"metadata": {"name": self.cfg.breaker_configmap}}
            try:
                self.kube.create_event(self.cfg.namespace, obj, action.event[0], action.event[1], action.event[2],
                                       snap.now, kind="Node" if kname else "ConfigMap")
            except KubeError as exc:
                log.warning("event %s not posted: %s", action.event[0], exc)
        if self.journal is not None:
            severity = "error" if action.journal in ("remediation-failed", "breaker-tripped") else "action"
            message = action.event[1] if action.event else action.why
            # a fleet-wide record (the breaker) is filed under every node it concerns, so that
            # `autoheal events --node N` finds it; the notification goes out once
            rec = None
            for node in (action.nodes or (action.slurm_node or None,)):
                evidence: Dict[str, Any] = {"k8s_node": kname, "reason": action.reason}
                if action.nodes:
                    evidence["nodes"] = list(action.nodes)
                r = self.journal.record(action.journal, node=node, action=action.kind, outcome="done",
                                        message=message, severity=severity, source="sync", evidence=evidence)
                rec = rec or r
            if rec is not None and self.notifier is not None and action.event:
                try:
                    self.notifier.send(rec)
                except Exception as exc:  # a notification is best effort, the flow goes on
                    log.warning("notification not sent: %s", exc)

    def _node_of(self, slurm_node: str, snap: Snapshot) -> str:
        """The Kubernetes Node bound to ``slurm_node`` in this pass's mapping. Mapping one node anew
        walks every pod (65 ms at 10,000 pods): once per Slurm write, a burst of cordons cost seconds."""
        if slurm_node not in snap.slurm:
            return ""
        bindings = self._bindings
        if bindings is None:  # outside a pass
            bindings = make_context(Snapshot({slurm_node: snap.slurm[slurm_node]}, snap.nodes, snap.pods),
                                    self.cfg).bindings
        b = bindings.get(slurm_node)
        return (b.node or "") if b else ""

    def _observe(self, res: PassResult) -> None:
        if self.metrics is not None:
            self.metrics.observe_pass(res, self)
