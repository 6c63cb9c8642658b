"""The soak's invariants, as pure functions over what was observed (no lab, no I/O).

The runner (``autoheal_lab.soak``) feeds a :class:`Monitor` one :class:`Snapshot` at a time (Slurm's
nodes and jobs, the Kubernetes Nodes and replacement requests) and, at the end, the journal, the
trainers' outputs and the processes left over. The monitor records every violation with its evidence,
and the recovery times the report shows. Every rule is unit-tested on hand-made snapshots.

Invariants (numbers as in issue 12):
1. ``stranded``: a job held by nobody who asked for it, or pending with a satisfiable request, for longer
   than a bound; at the end every opted-in job has a final state it chose.
2. ``admin-touched``: an admin's drain reason and state kept while the admin's drain lasts; a human's
   cordon kept while it lasts.
3. ``false-drain``: every drain with an ``autoheal:`` reason maps to an injected fault (or a cordon) on
   that node.
4. ``acted-twice``: no more resets, reboots, replacement requests or requeues (plus hot-spare swaps;
   for a submitit job, Slurm's restart count too) than faults that could cause them.
5. ``lost-work``: every finished trainer's (and submitit job's) final state equals an uninterrupted
   run's, and every restart or swap resumed from the newest checkpoint saved before it.
6. ``breaker``: no more nodes in remediation at once than the breaker allows; no replacement of an
   opted-out node.
7. ``journal``: no torn line; a job whose comment counts restarts has journal records; a hot-spare
   job's ``swaps=``/``spares=``/``nodes=`` agree with its swap records.
8. ``end-state``: every node in service or retired/held with an ``autoheal:`` reason; no process left.

The remediation circuit breaker latches by design (like a NodeHealthCheck's maxUnhealthy): when most of
the fleet is affected, a human must look. :class:`OnCall` is that human: paged when a snapshot shows the
breaker tripped, it resets it after the schedule's delay. While a trip waits for them (from the moment
the breaker tripped until their reset, or until it re-armed by itself), nodes drained by autoheal and
jobs with no usable node are waiting for a human, not stranded by autoheal; after the reset the normal
bounds apply again.

Slurm drains a node by itself in a few cases a site's runbook has the on-call clear by hand
(``ONCALL_RESUMES``): "Duplicate jobid" follows a ``kill -9`` of slurmctld that lost the state of a job
just started, so the restarted slurmctld hands its id to the next job and the node still running (or
just done with) the first one refuses it. The on-call resumes such a node after the delay for that
page; until then it waits for a human.

A site's spare pool is refilled; the lab's holds 2 spares. When it is empty, a node drained for a
replacement that was requested waits for a technician, who repairs it in place after the schedule's
delay (the soak swaps the fake GPUs, then ``autoheal check --clear-faults`` and ``autoheal node
resume``); the sync then abandons the replacement. Until then the node and the jobs with no usable node
wait for a human too.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set

from autoheal.reasons import is_ours, strip_reason_suffix
from autoheal_lab.soak_plan import KINDS

IN_SERVICE_STATES = ("IDLE", "MIXED", "ALLOCATED", "COMPLETING")
#: Final states a user or Slurm chose for a job (not a job we lost).
FINAL_STATES = ("COMPLETED", "CANCELLED", "TIMEOUT", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "DEADLINE",
                "BOOT_FAIL", "PREEMPTED")
#: Runner comment states an opted-in job may end in (its own decisions).
CHOSEN_COMMENT_STATES = ("completed", "max-restarts", "no-progress", "cancelled", "failed")
#: Pending reasons that only mean "wait your turn".
QUEUE_REASONS = ("Resources", "Priority", "BeginTime", "Dependency", "None", "")
REMEDIATING = ("draining", "replacing")


@dataclass
class Violation:
    invariant: str
    message: str
    time: float
    evidence: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Snapshot:
    """What the runner saw at ``time``.

    ``nodes``: name -> {state, drain, reason, responding}; ``jobs``: id -> {state, reason, comment,
    restarts, nodes (list), held}; ``kube``: Node name -> {unschedulable, remediation, labels} or None
    without Kubernetes; ``replacements``: [{node, name}] replacement requests seen; ``breaker``: the
    remediation breaker's state {tripped_at (None: armed), why}, or None when not read."""

    time: float
    nodes: Dict[str, dict] = field(default_factory=dict)
    jobs: Dict[str, dict] = field(default_factory=dict)
    kube: Optional[Dict[str, dict]] = None
    replacements: List[dict] = field(default_factory=list)
    breaker: Optional[dict] = None


@dataclass
class Injected:
    """A fault as it was carried out: real times (epoch), the resolved target, and what the author did
    (``reason`` of an admin drain, ``job`` held or cancelled)."""

    id: int
    kind: str
    group: str
    start: float
    node: str = ""
    gpu: Optional[int] = None
    end: Optional[float] = None  # when it cleared or was undone (None: left to autoheal)
    reason: str = ""
    job: str = ""
    count: int = 1  # injections it made (flapping: several)
    # when the same defect was raised again (a bad repair's, each time its node came back): each is a
    # cause at its own time, not only at ``start`` (``Monitor.reopen``)
    again: List[float] = field(default_factory=list)
    note: str = ""
    # an admin's drain a slurmctld kill may have lost: missing until then (their look after the restart)
    lost_until: Optional[float] = None


@dataclass
class JobMeta:
    """A job of the workload: ``role`` trainer / hotspare (a trainer with ``--spare-nodes``) / submitit (a
    submitit ``Checkpointable`` job) / plain / array / short / time-limit; ``opted_in``: submitted with
    ``autoheal sbatch``; ``steps``: the trainer's step count."""

    job_id: str
    role: str
    opted_in: bool = False
    steps: int = 0
    nodes: int = 1
    output: str = ""


def node_in_service(n: dict) -> bool:
    state = str(n.get("state", "")).upper()
    return (not n.get("drain") and n.get("responding", True)
            and any(state.startswith(s) for s in IN_SERVICE_STATES) and "DOWN" not in state)


def ours_kind(reason: str, spare_prefix: str = "autoheal: spare") -> str:
    """What an ``autoheal:`` reason is: '' (not ours), spare, retired, k8s or health."""
    r = strip_reason_suffix(reason or "")
    if not is_ours(r):
        return ""
    if r.startswith(spare_prefix.strip()):
        return "spare"
    if r.startswith("autoheal: retired"):
        return "retired"
    if r.startswith("autoheal: lemon:"):  # retired by the node side as a repeat offender (issue 22)
        return "lemon"
    if r.startswith("autoheal: k8s:"):
        return "k8s"
    return "health"


@dataclass
class Trip:
    """One trip of the breaker as the on-call saw it: ``start`` the sync's ``trippedAt``, ``paged`` the
    first snapshot that showed it, ``due`` when the on-call acts (paged + delay); it ends with their
    ``reset`` or, when it re-armed by itself first, at ``rearmed``."""

    n: int
    start: float
    paged: float
    delay: float
    why: str = ""
    stamp: Optional[float] = None  # the ConfigMap's trippedAt that paged
    acting: bool = False
    reset: Optional[float] = None
    rearmed: Optional[float] = None

    @property
    def due(self) -> float:
        return self.paged + self.delay

    @property
    def end(self) -> Optional[float]:
        return self.reset if self.reset is not None else self.rearmed

    def to_dict(self) -> dict:
        return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in asdict(self).items()
                if k not in ("acting", "stamp")}


class OnCall:
    """The on-call admin (pure: the runner feeds it what it saw and carries out what is due).

    ``observe(t, tripped_at, why)`` with the breaker's state from a snapshot (``tripped_at`` None when
    armed) pages them on a new trip (a ``tripped_at`` not seen before); ``due(now)`` is the trip to act
    on (once); the runner looks (``autoheal sync breaker``) and resets (``autoheal sync breaker reset``)
    and reports back with ``looked``/``did_reset``. ``delays``: seconds per trip, in order (cycled)."""

    def __init__(self, delays: Sequence[float] = (60.0,), repair_delays: Sequence[float] = (90.0,)):
        self.delays = list(delays) or [60.0]
        self.repair_delays = list(repair_delays) or [90.0]
        self.trips: List[Trip] = []
        self._seen: set = set()
        self._awaiting: Dict[str, dict] = {}  # node -> {since, delay, acting}: waits for the technician
        self._drained: Dict[str, dict] = {}  # node -> {since, delay, acting}: Slurm's own drain, for the on-call
        self.resumes: List[dict] = []  # {node, since, done, outcome}
        self.repairs: List[dict] = []  # {node, since, done, outcome}
        self._episodes = 0

    @property
    def current(self) -> Optional[Trip]:
        t = self.trips[-1] if self.trips else None
        return t if t is not None and t.end is None else None

    def observe(self, t: float, tripped_at: Optional[float], why: str = "") -> Optional[Trip]:
        """A snapshot's view of the breaker; returns the trip it paged for, if a new one."""
        cur = self.current
        if tripped_at is None:
            if cur is not None and not cur.acting:
                cur.rearmed = t  # re-armed by itself (cool-down over, share below the re-arm level)
            return None
        if tripped_at in self._seen:
            last = next(tr for tr in reversed(self.trips) if tr.stamp == tripped_at)
            if last.end is None or t <= last.end:
                return None  # the trip already paged, or a snapshot started before the reset landed
            # the same trip, still there in a snapshot started after they closed it (their look said
            # armed, their reset did not land): it never ended; page again
            start = last.end
        else:
            self._seen.add(tripped_at)
            start = min(tripped_at, t)
        if cur is not None:
            cur.rearmed = min(t, start)  # re-armed and tripped again between two snapshots
        trip = Trip(len(self.trips) + 1, start, t, self.delays[len(self.trips) % len(self.delays)], why,
                    stamp=tripped_at)
        self.trips.append(trip)
        return trip

    def due(self, now: float) -> Optional[Trip]:
        cur = self.current
        if cur is not None and not cur.acting and now >= cur.due:
            cur.acting = True
            return cur
        return None

    def looked(self, trip: Trip, t: float, still_tripped: bool) -> None:
        """What ``autoheal sync breaker`` said when they looked; armed again: nothing to reset."""
        if not still_tripped and trip.end is None:
            trip.rearmed = t

    def did_reset(self, trip: Trip, t: float) -> None:
        if trip.end is None:
            trip.reset = t

    def gave_up(self, trip: Trip) -> None:
        """Their command failed for good (an API outage): they will try again at the next page."""
        trip.acting = False
        trip.paged = trip.due  # the next attempt after another delay

    def waiting(self, t: float) -> bool:
        """A trip waits for the on-call at ``t``: nodes and jobs blocked then wait for a human."""
        return any(tr.start <= t and (tr.end is None or t < tr.end) for tr in self.trips)

    def overlaps(self, a: float, b: float) -> bool:
        """A trip was waiting for a human at some moment between ``a`` and ``b``."""
        return any(tr.start <= b and (tr.end is None or tr.end > a) for tr in self.trips)

    # ---- the technician: nodes waiting for a replacement the empty pool cannot give ------------------
    def observe_awaiting(self, t: float, nodes: Iterable[str]) -> None:
        """The nodes that wait, at ``t``, for a requested replacement with no spare left in the pool
        (see ``awaiting_replacement``). Each new wait gets the next planned repair delay; a node that
        stops waiting (replaced after all, resumed) is forgotten."""
        nodes = set(nodes)
        for n in sorted(nodes):
            if n not in self._awaiting:
                self._awaiting[n] = {"since": t, "delay": self.repair_delays[self._episodes % len(self.repair_delays)],
                                     "acting": False}
                self._episodes += 1
        for n in list(self._awaiting):
            if n not in nodes and not self._awaiting[n]["acting"]:
                del self._awaiting[n]

    def repairs_due(self, now: float) -> List[str]:
        """Nodes the technician repairs now (each once per wait)."""
        out = []
        for n, w in sorted(self._awaiting.items()):
            if not w["acting"] and now >= w["since"] + w["delay"]:
                w["acting"] = True
                out.append(n)
        return out

    def repaired(self, node: str, t: float, outcome: str) -> None:
        """The technician is done with ``node`` (``outcome``: resumed, or why not)."""
        w = self._awaiting.pop(node, None)
        self.repairs.append({"node": node, "since": round(w["since"], 2) if w else None, "done": round(t, 2),
                             "outcome": outcome})

    def awaiting_technician(self) -> List[str]:
        return sorted(self._awaiting)

    # ---- the on-call again: Slurm's own drains of the runbook (ONCALL_RESUMES) -------------------------
    def observe_slurm_drains(self, t: float, nodes: Iterable[str]) -> None:
        """Nodes drained by Slurm itself with a runbook reason at ``t``; each new one pages the on-call
        (the next planned delay); one no longer drained so is forgotten."""
        nodes = set(nodes)
        for n in sorted(nodes - set(self._drained)):
            k = len(self.trips) + len(self.resumes) + len(self._drained)
            self._drained[n] = {"since": t, "delay": self.delays[k % len(self.delays)], "acting": False}
        for n in list(self._drained):
            if n not in nodes and not self._drained[n]["acting"]:
                del self._drained[n]

    def resumes_due(self, now: float) -> List[str]:
        out = []
        for n, w in sorted(self._drained.items()):
            if not w["acting"] and now >= w["since"] + w["delay"]:
                w["acting"] = True
                out.append(n)
        return out

    def resumed(self, node: str, t: float, outcome: str) -> None:
        w = self._drained.pop(node, None)
        self.resumes.append({"node": node, "since": round(w["since"], 2) if w else None, "done": round(t, 2),
                             "outcome": outcome})

    def awaiting_oncall(self) -> List[str]:
        """Nodes drained by Slurm itself that wait for the on-call."""
        return sorted(self._drained)

    def summary(self) -> dict:
        waits = [tr.reset - tr.start for tr in self.trips if tr.reset is not None]
        return {"trips": len(self.trips), "resets": sum(1 for tr in self.trips if tr.reset is not None),
                "repairs": sum(1 for r in self.repairs if r["outcome"] == "resumed"),
                "repairs_list": list(self.repairs),
                "slurm_drains_resumed": sum(1 for r in self.resumes if r["outcome"] == "resumed"),
                "slurm_drains_list": list(self.resumes),
                "rearmed_by_itself": sum(1 for tr in self.trips if tr.rearmed is not None and tr.reset is None),
                "open_at_end": sum(1 for tr in self.trips if tr.end is None),
                "tripped_to_reset_s": percentiles(waits), "episodes": [tr.to_dict() for tr in self.trips]}


def awaiting_replacement(s: Snapshot, spare_prefix: str = "autoheal: spare") -> List[str]:
    """Nodes of ``s`` drained ``autoheal: replace: ...`` or ``autoheal: lemon: ...`` whose replacement was
    requested while no spare is left in the pool (no node held with the spare reason): a technician's
    job (a lemon too: with lemons on, soak seed 46688 kept two lemons out for good once both spares were
    used, and the jobs waited for nodes nobody would bring back). [] without the Kubernetes view."""
    if s.kube is None:
        return []
    if any(n.get("drain") and ours_kind(n.get("reason", ""), spare_prefix) == "spare" for n in s.nodes.values()):
        return []
    requested = {r.get("node") for r in s.replacements}
    return sorted(name for name, n in s.nodes.items() if n.get("drain") and name in requested
                  and strip_reason_suffix(n.get("reason", "")).startswith(PERSON_REPLACES))


#: Reasons of Slurm's own drains the on-call resumes by hand (runbook), after their delay.
ONCALL_RESUMES = ("Duplicate jobid",)


def slurm_own_drains(s: Snapshot) -> List[str]:
    """Nodes of ``s`` drained by Slurm itself with a reason of ``ONCALL_RESUMES``."""
    return sorted(name for name, n in s.nodes.items() if n.get("drain")
                  and strip_reason_suffix(n.get("reason", "")) in ONCALL_RESUMES)


def awaiting_person(s: Snapshot) -> List[str]:
    """Without Kubernetes nobody replaces a node: those of ``s`` drained ``autoheal: replace: ...`` wait for
    a person (a Slurm-only site's technician), as the product says (``autoheal.awaiting``)."""
    return sorted(name for name, n in s.nodes.items() if n.get("drain")
                  and strip_reason_suffix(n.get("reason", "")).startswith(PERSON_REPLACES))


#: Drains a person replaces (or repairs) on a Slurm-only site: the replace rung, a lemon (a repeat
#: offender the node side retired); and the records that tell them (the notifier sends both).
PERSON_REPLACES = ("autoheal: replace", "autoheal: lemon")
TOLD_EVENTS = ("awaiting-replacement", "lemon")


#: Limits of the remediation breaker a site configures; a node the sync shows waiting on one of them
#: (state ``waiting`` on its Node) waits visibly, and starts by itself when the limit allows.
LIMITS = ("start-share", "concurrency", "tripped")


def limit_waits(s: Snapshot) -> Dict[str, dict]:
    """Nodes of ``s`` whose remediation waits, visibly, on a breaker limit: the sync's ``waiting`` state
    on the Node with the limit, since (when it asked) and until (the earliest start the limit allows).
    {} without the Kubernetes view."""
    out = {}
    for name, k in (s.kube or {}).items():
        if k.get("remediation") == "waiting" and k.get("waiting_limit") in LIMITS:
            out[name] = {"limit": k["waiting_limit"], "since": float(k.get("since") or s.time),
                         "until": float(k.get("waiting_until") or 0.0)}
    return out


class Monitor:
    """Invariants checked snapshot by snapshot, then once at the end (``finish``)."""

    def __init__(self, jobs: Sequence[JobMeta], seed: int = 0, held_grace: float = 45.0,
                 pending_limit: float = 180.0, cause_linger: float = 90.0, breaker_max: int = 2,
                 spare_prefix: str = "autoheal: spare", opt_out_label: str = "",
                 oncall_delays: Sequence[float] = (60.0,), repair_delays: Sequence[float] = (90.0,),
                 wait_bound: Optional[float] = None, slurm_only: bool = False):
        self.jobs = {j.job_id: j for j in jobs}
        # no sync, no spare pool: every node waiting for a replacement waits for the technician
        self.slurm_only = slurm_only
        # seconds a remediation may wait visibly on the start share or the concurrency limit: the breaker's
        # window (every start in it expires within one window); None: waiting is not accepted at all
        self.wait_bound = wait_bound
        self.limit_waits: Dict[str, dict] = {}  # node -> its visible wait, as last seen
        self.waiting_limit: List[str] = []  # nodes and jobs that end the soak waiting on a configured limit
        self.oncall = OnCall(oncall_delays, repair_delays)
        self.seed = seed
        self.held_grace = held_grace
        self.pending_limit = pending_limit
        self.cause_linger = cause_linger
        self.breaker_max = breaker_max
        self.spare_prefix = spare_prefix
        self.opt_out_label = opt_out_label
        self.faults: List[Injected] = []
        self.violations: List[Violation] = []
        self._seen_violation = set()
        self._held_since: Dict[str, float] = {}
        self._pending_since: Dict[str, float] = {}
        self._prolog_since: Dict[str, float] = {}  # job -> first seen RUNNING with reason Prolog (this run)
        self._drain_seen: Dict[str, str] = {}  # node -> our reason last seen
        self.ran_on: Dict[str, List[tuple]] = {}  # job -> [(time, nodes)] when seen running
        self._running: Dict[str, dict] = {}  # job -> last running view
        self.last: Optional[Snapshot] = None
        # recovery times, filled as evidence comes: fault id -> seconds
        self.to_drain: Dict[int, float] = {}
        self.to_back: Dict[int, float] = {}
        self.to_job_running: Dict[int, List[float]] = {}
        self.to_job_running_human: Dict[int, List[float]] = {}  # the wait overlapped a breaker trip
        self._job_waits: Dict[tuple, tuple] = {}  # (fault id, job) -> (restarts, hot-spare swaps) at the fault
        self.running_again_by: Dict[str, List[float]] = {"requeue": [], "swap": []}  # how it ran again
        # (fault id, job) -> seconds of its wait the job was pending with no free node it could use (the
        # queue, not the loop): taken off its wait for the ``..._loop_s`` figure
        self._job_wait_queued: Dict[tuple, float] = {}
        self.to_job_running_loop: Dict[int, List[float]] = {}
        self._drained_after: Dict[int, bool] = {}
        self.resolved: Dict[int, float] = {}  # fault id -> time its node was seen back/replaced
        self.snapshots = 0
        self.awaiting: List[str] = []  # nodes that end the soak waiting for a replacement (see finish)
        self.recovering: List[str] = []  # nodes still within the loop's recovery bound at the end
        self.waiting_human: List[str] = []  # nodes and jobs blocked at the end, waiting for the on-call or technician
        self.queued_at_end: List[str] = []  # jobs pending at the end for their turn, with enough usable nodes
        self.last_seen: Dict[str, dict] = {}  # job -> its view in the last snapshot that had it
        self.timeline: List[dict] = []  # compact per-snapshot node states for the plot
        self.node_at_fault: Dict[int, str] = {}  # fault id -> its node's state and reason just before it
        # fault ids whose node was in service just before it: autoheal had to drain it (not an admin's drain,
        # Slurm's own, a node down or rebooting, which drain when that ends; nor one autoheal had drained)
        self.ours_to_drain: Set[int] = set()

    # ---- inputs -----------------------------------------------------------------------------------
    def reopen(self, fault_id: int, t: Optional[float] = None) -> None:
        """Fault ``fault_id`` is back on its node (a bad repair's defect raised again, at ``t``): not
        resolved, so the drain it causes is no false drain however long after its first recovery it comes,
        and a job on the node then may be requeued for it (``possible_requeue_causes``)."""
        self.resolved.pop(fault_id, None)
        if t is not None:
            for f in self.faults:
                if f.id == fault_id:
                    f.again.append(t)

    def add_fault(self, f: Injected) -> None:
        self.faults.append(f)
        if self.last is not None and f.node in self.last.nodes:
            n = self.last.nodes[f.node]
            self.node_at_fault[f.id] = f"{n.get('state', '')} {strip_reason_suffix(n.get('reason', ''))}".strip()
            if node_in_service(n):
                self.ours_to_drain.add(f.id)
        if self.last is not None:
            for jid, j in self.last.jobs.items():
                if j.get("state") == "RUNNING" and (f.group == "gpu" or f.kind in ("kill-slurmd", "kill-slurmctld")) \
                        and (not f.node or f.node in (j.get("nodes") or [])):
                    self._job_waits[(f.id, jid)] = (int(j.get("restarts") or 0), comment_swaps(j.get("comment", "")))

    def _violate(self, invariant: str, key: str, message: str, t: float, **evidence) -> None:
        if (invariant, key) in self._seen_violation:
            return
        self._seen_violation.add((invariant, key))
        evidence["seed"] = self.seed
        self.violations.append(Violation(invariant, message, t, evidence))

    def _user_held(self, job: str, t: float) -> bool:
        return any(f.kind == "user-hold" and f.job == job and f.start - 1 <= t <= (f.end or t) + 5
                   for f in self.faults)

    def _causes(self, node: str, t: float) -> List[Injected]:
        out = []
        for f in self.faults:
            if f.node != node or f.group not in ("gpu", "process", "people"):
                continue
            if f.kind in ("admin-drain", "user-cancel", "user-hold", "time-limit"):
                continue
            end = f.end if f.end is not None else self.resolved.get(f.id)
            if f.start - 1.0 <= t and (end is None or t <= end + self.cause_linger):
                out.append(f)
        return out

    # ---- per snapshot -----------------------------------------------------------------------------
    def observe(self, s: Snapshot) -> List[Violation]:
        before = len(self.violations)
        self.snapshots += 1
        self.timeline.append({"t": s.time, "nodes": {n: ("in" if node_in_service(v) else
                                                         ours_kind(v.get("reason", ""), self.spare_prefix) or
                                                         ("admin" if v.get("drain") else "down"))
                                                     for n, v in s.nodes.items()},
                              "jobs": {j: v.get("state") for j, v in s.jobs.items()}})
        if s.breaker is not None:
            self.oncall.observe(s.time, s.breaker.get("tripped_at"), s.breaker.get("why") or "")
        if s.kube is not None:
            self.oncall.observe_awaiting(s.time, awaiting_replacement(s, self.spare_prefix))
            self.limit_waits = limit_waits(s)
            self._check_limit_waits(s)
        elif self.slurm_only:
            self.oncall.observe_awaiting(s.time, awaiting_person(s))
        self.oncall.observe_slurm_drains(s.time, slurm_own_drains(s))
        self.last_seen.update(s.jobs)
        self._check_nodes(s)
        self._check_jobs(s)
        if s.kube is not None:
            self._check_kube(s)
        self._recovery(s)
        self.last = s
        return self.violations[before:]

    def _check_nodes(self, s: Snapshot) -> None:
        for f in self.faults:
            if f.kind != "admin-drain" or not f.node or s.time < f.start + 2.0:
                continue
            if f.end is not None and s.time >= f.end:
                continue
            n = s.nodes.get(f.node)
            if n is None:
                continue
            if not n.get("drain") or strip_reason_suffix(n.get("reason", "")) != f.reason:
                if f.lost_until is not None and s.time <= f.lost_until:
                    continue  # slurmctld came back without it; their admin looks again (Slurm's doing)
                self._violate("admin-touched", f"drain-{f.id}",
                              f"{f.node}: the admin's drain ({f.reason!r}) was changed while it lasted",
                              s.time, node=f.node, state=n.get("state"), reason=n.get("reason"), fault=f.id)
        for name, n in s.nodes.items():
            kind = ours_kind(n.get("reason", ""), self.spare_prefix) if n.get("drain") else ""
            reason = strip_reason_suffix(n.get("reason", ""))
            if kind in ("health", "k8s", "lemon"):
                if self._drain_seen.get(name) != reason:
                    self._drain_seen[name] = reason
                    if not self._causes(name, s.time):
                        self._violate("false-drain", f"{name}-{s.time:.1f}",
                                      f"{name} drained by autoheal ({reason!r}) with no injected fault or cordon "
                                      f"on it", s.time, node=name, reason=reason, state=n.get("state"),
                                      faults_on_node=[asdict(f) for f in self.faults if f.node == name])
            elif not kind or kind == "spare":
                self._drain_seen.pop(name, None)

    def _check_jobs(self, s: Snapshot) -> None:
        in_service = {n for n, v in s.nodes.items() if node_in_service(v)}
        # nodes where a job of the workload started since the last snapshot: a pending job that could
        # use one of them is waiting its turn in a queue that moves (a backlog behind an outage drains
        # one short job at a time), so its clock starts again
        before = self.last.jobs if self.last is not None else {}
        started = {n for jid, j in s.jobs.items() if j.get("state") == "RUNNING"
                   and (before.get(jid) or {}).get("state") != "RUNNING" for n in (j.get("nodes") or [])}
        for jid, j in s.jobs.items():
            meta = self.jobs.get(jid) or self.jobs.get(jid.split("_")[0])
            if meta is None:
                continue
            state, reason = j.get("state", ""), str(j.get("reason", "") or "")
            if state == "RUNNING":
                self.ran_on.setdefault(jid, []).append((s.time, list(j.get("nodes") or [])))
            if state == "RUNNING" and reason == "Prolog":
                # allocated, its batch script waiting for the prolog's end: a prolog whose end a slurmd
                # restart lost never comes (seed 12: job 4 in Prolog on a working gpu1 for the rest of the
                # soak, which "ends RUNNING" let pass); waiting longer than a pending job may is stranded
                since = self._prolog_since.setdefault(jid, s.time)
                if s.time - since > self.pending_limit:
                    self._violate("stranded", f"prolog-{jid}", f"job {jid} allocated {','.join(j.get('nodes') or [])} "
                                  f"and waiting for its prolog for {s.time - since:.0f} s: its batch script never "
                                  f"starts", s.time, job=jid, nodes=list(j.get("nodes") or []),
                                  comment=j.get("comment", ""), restarts=j.get("restarts"))
            else:
                self._prolog_since.pop(jid, None)
            held = state == "PENDING" and (reason.startswith("JobHeld") or j.get("held"))
            if held and not self._user_held(jid.split("_")[0], s.time) and not self._user_held(jid, s.time):
                since = self._held_since.setdefault(jid, s.time)
                if s.time - since > self.held_grace:
                    self._violate("stranded", f"held-{jid}", f"job {jid} held ({reason}) for "
                                  f"{s.time - since:.0f} s and nobody asked for it", s.time, job=jid, reason=reason,
                                  comment=j.get("comment", ""), restarts=j.get("restarts"))
            else:
                self._held_since.pop(jid, None)
            if state == "PENDING" and not held and reason not in QUEUE_REASONS:
                excl = set(comment_field(j.get("comment", ""), "excl").split(",")) - {""}
                usable = in_service - excl
                if len(usable) >= max(1, meta.nodes):
                    if usable & started:
                        self._pending_since[jid] = s.time
                    since = self._pending_since.setdefault(jid, s.time)
                    if s.time - since > self.pending_limit:
                        self._violate("stranded", f"pending-{jid}", f"job {jid} pending ({reason}) for "
                                      f"{s.time - since:.0f} s although {len(usable)} usable node(s) are in service",
                                      s.time, job=jid, reason=reason, usable=sorted(usable),
                                      comment=j.get("comment", ""))
                else:
                    self._pending_since.pop(jid, None)
            else:
                self._pending_since.pop(jid, None)

    def _check_kube(self, s: Snapshot) -> None:
        for f in self.faults:
            if f.kind != "kubectl-cordon" or s.time < f.start + 2.0 or (f.end is not None and s.time >= f.end):
                continue
            k = (s.kube or {}).get(f.node)
            if k is not None and not k.get("unschedulable"):
                self._violate("admin-touched", f"cordon-{f.id}", f"{f.node}: a human's cordon was undone",
                              s.time, node=f.node, fault=f.id)
        busy = sorted(n for n, k in (s.kube or {}).items() if k.get("remediation") in REMEDIATING)
        if len(busy) > self.breaker_max:
            self._violate("breaker", f"busy-{','.join(busy)}", f"{len(busy)} nodes in remediation at once "
                          f"(breaker allows {self.breaker_max})", s.time, nodes=busy)
        if self.opt_out_label:
            key, _, value = self.opt_out_label.partition("=")
            for r in s.replacements:
                labels = ((s.kube or {}).get(r.get("node")) or {}).get("labels") or {}
                if key in labels and (not value or labels[key] == value):
                    self._violate("breaker", f"optout-{r.get('node')}", f"replacement requested for opted-out "
                                  f"node {r.get('node')}", s.time, request=r)

    def _limit_wait_ok(self, name: str, t: float) -> bool:
        """``name`` waits visibly on a limit at ``t``, within the bound that limit gives (a trip's wait is
        the on-call's, judged with the trip)."""
        w = self.limit_waits.get(name)
        if w is None or self.wait_bound is None:
            return False
        return w["limit"] == "tripped" or t - w["since"] <= self.wait_bound

    def _check_limit_waits(self, s: Snapshot) -> None:
        """A visible wait on the start share or the concurrency limit ends within the bound; its until
        lies within it."""
        for name, w in sorted(self.limit_waits.items()):
            if w["limit"] == "tripped":
                continue
            if self.wait_bound is None:
                self._violate("stranded", f"wait-{name}-{w['since']:.0f}", f"{name}'s remediation waits on "
                              f"the {w['limit']} limit, which this soak does not expect", s.time, node=name, **w)
                continue
            if s.time - w["since"] > self.wait_bound:
                self._violate("stranded", f"wait-{name}-{w['since']:.0f}", f"{name}'s remediation has waited "
                              f"{s.time - w['since']:.0f} s on the {w['limit']} limit, longer than it allows "
                              f"({self.wait_bound:.0f} s)", s.time, node=name, **w)
            elif w["until"] and w["until"] - w["since"] > self.wait_bound + 1.0:
                self._violate("stranded", f"until-{name}-{w['since']:.0f}", f"{name}'s remediation says it "
                              f"waits until {w['until'] - w['since']:.0f} s after it asked, beyond the "
                              f"{w['limit']} limit's bound ({self.wait_bound:.0f} s)", s.time, node=name, **w)

    def _recovery(self, s: Snapshot) -> None:
        for f in self.faults:
            if not f.node or f.group != "gpu":
                continue
            n = s.nodes.get(f.node)
            if n is None:
                continue
            kind = ours_kind(n.get("reason", ""), self.spare_prefix) if n.get("drain") else ""
            if f.id not in self.to_drain and kind in ("health", "k8s", "retired") and s.time >= f.start:
                self.to_drain[f.id] = s.time - f.start
                self._drained_after[f.id] = True
            if f.id not in self.to_back and self._drained_after.get(f.id):
                if node_in_service(n) or kind == "retired":
                    self.to_back[f.id] = s.time - f.start
                    self.resolved.setdefault(f.id, s.time)
        prev = self.last.time if self.last is not None else None
        for (fid, jid), base in list(self._job_waits.items()):
            j = s.jobs.get(jid)
            f = next(x for x in self.faults if x.id == fid)
            if j is None or j.get("state") in FINAL_STATES:
                self._job_waits.pop((fid, jid))
                self._job_wait_queued.pop((fid, jid), None)
                continue
            if j.get("state") == "PENDING" and prev is not None and s.time - prev <= 5.0 \
                    and not self._free_node_for(s, jid, j):
                # no snapshot for a while (slurmctld down): not counted as queue time, the figure stays honest
                self._job_wait_queued[(fid, jid)] = self._job_wait_queued.get((fid, jid), 0.0) + s.time - prev
            restarted = int(j.get("restarts") or 0) > base[0]
            # a hot-spare job runs again in its own allocation: its comment (written before the resize)
            # counts the swap, and the lost node has left the job
            swapped = comment_swaps(j.get("comment", "")) > base[1] and f.node not in (j.get("nodes") or [])
            if j.get("state") == "RUNNING" and (restarted or swapped):
                human = self.oncall.overlaps(f.start, s.time)
                (self.to_job_running_human if human else self.to_job_running).setdefault(fid, []).append(
                    s.time - f.start)
                self.running_again_by["requeue" if restarted else "swap"].append(s.time - f.start)
                queued = self._job_wait_queued.pop((fid, jid), 0.0)
                if not human:
                    self.to_job_running_loop.setdefault(fid, []).append(max(0.0, s.time - f.start - queued))
                self._job_waits.pop((fid, jid))

    def _free_node_for(self, s: Snapshot, jid: str, j: dict) -> bool:
        """Whether ``s`` has as many idle nodes in service, outside the job's exclusions, as the job needs."""
        meta = self.jobs.get(jid) or self.jobs.get(jid.split("_")[0])
        need = max(1, meta.nodes if meta is not None else 1)
        excl = set(comment_field(j.get("comment", ""), "excl").split(",")) - {""}
        idle = [name for name, n in s.nodes.items() if name not in excl and node_in_service(n)
                and str(n.get("state", "")).upper().split("+")[0] == "IDLE"
                and "COMPLETING" not in str(n.get("state", "")).upper()]
        return len(idle) >= need

    def note_drain_time(self, fault_id: int, seconds: float) -> None:
        """A drain time read from the journal (finer than the snapshots): keep the earlier one."""
        if seconds >= 0 and (fault_id not in self.to_drain or seconds < self.to_drain[fault_id]):
            self.to_drain[fault_id] = seconds

    # ---- at the end -------------------------------------------------------------------------------
    def with_last_seen(self, final: Snapshot) -> Snapshot:
        """``final`` with every job of the workload it no longer lists, as last seen: slurmctld forgets a
        job ``MinJobAge`` (300 s) after it ended, so a job that ended early (the submitit job, a hot-spare
        trainer that completed) is not in the final ``squeue`` and would escape the final-state checks
        (bench, this round: job 2 was missing from every seed's end). Marked ``purged``."""
        for jid, view in self.last_seen.items():
            if jid not in final.jobs:
                final.jobs[jid] = dict(view, purged=True)
        return final

    def finish(self, final: Snapshot, journal: Sequence[dict], journal_skipped: int,
               outputs: Dict[str, str], leaked: Sequence[str] = (), user_cancelled: Iterable[str] = (),
               awaiting_ok: bool = False, recovery_bound: Optional[float] = None) -> List[Violation]:
        """The end-of-soak checks. ``awaiting_ok``: a node drained ``autoheal: replace: ...`` is an
        acceptable end when its replacement was requested (or there is no Kubernetes side to ask): the
        spare pool may be empty. Such nodes are listed in ``awaiting``. ``recovery_bound``: seconds the
        loop needs by design to bring a node back (drain, repair, N passing healthchecks, cool-down); a
        node still drained by autoheal whose last fault is younger than that is still recovering (listed
        in ``recovering``), not stuck."""
        before = len(self.violations)
        final = self.with_last_seen(final)
        t = final.time
        cancelled = set(user_cancelled)
        human = self.oncall.waiting(t) or bool(self.oncall.awaiting_technician()) or bool(self.oncall.awaiting_oncall())
        if final.kube is not None:
            self.limit_waits = limit_waits(final)
        limited = sorted(n for n in self.limit_waits
                         if self._limit_wait_ok(n, t) and final.nodes.get(n, {}).get("drain"))
        in_service = {n for n, v in final.nodes.items() if node_in_service(v)}
        # 1. final states
        for jid, meta in self.jobs.items():
            views = {k: v for k, v in final.jobs.items() if k == jid or k.split("_")[0] == jid}
            for vid, j in views.items():
                state = j.get("state", "")
                excl = set(comment_field(j.get("comment", ""), "excl").split(",")) - {""}
                if human and state == "PENDING" and len(in_service - excl) < max(1, meta.nodes):
                    self.waiting_human.append(f"job {vid} (pending, {len(in_service - excl)} usable node(s))")
                    continue
                if limited and state == "PENDING" and len(in_service - excl) < max(1, meta.nodes):
                    self.waiting_limit.append(f"job {vid} (pending, {len(in_service - excl)} usable node(s); "
                                              f"waiting with {', '.join(limited)})")
                    continue
                reason = str(j.get("reason") or "")
                if state == "PENDING" and not j.get("held") and len(in_service - excl) >= max(1, meta.nodes) \
                        and (reason in QUEUE_REASONS or t - self._pending_since.get(vid, t) <= self.pending_limit):
                    # "pending with a satisfiable request" (invariant 1): waiting its turn behind jobs that
                    # still run (bench seeds 1 and 3: short jobs queued for Resources, Priority or, while
                    # retired nodes stay drained in the partition, ReqNodeNotAvail, behind the trainers given
                    # one more settle period). Waiting without the queue moving is judged as while the soak
                    # runs: more than pending_limit (180 s) is stranded.
                    self.queued_at_end.append(f"job {vid} ({reason})")
                    continue
                if state not in FINAL_STATES and state != "RUNNING":
                    self._violate("stranded", f"final-{vid}", f"job {vid} ended the soak {state} "
                                  f"({j.get('reason')})", t, job=vid, state=state, reason=j.get("reason"),
                                  comment=j.get("comment", ""))
                if meta.opted_in and state in FINAL_STATES and state != "COMPLETED" and jid not in cancelled:
                    cstate = comment_field(j.get("comment", ""), "state")
                    if frozen_comment(vid, journal) is not None:
                        # a hot-spare run that resized its job: Slurm froze the comment at the swap; the
                        # journal says how the job ended
                        cstate = next((r["event"][4:] for r in reversed(_job_records(vid, journal))
                                       if r.get("event", "")[4:] in CHOSEN_COMMENT_STATES), cstate)
                    if cstate not in CHOSEN_COMMENT_STATES:
                        self._violate("stranded", f"chosen-{vid}", f"opted-in job {vid} ended {state} with comment "
                                      f"state {cstate or 'none'}: not a final state it chose", t, job=vid,
                                      comment=j.get("comment", ""))
        # 4. acted once
        self._check_acted_once(final, journal, t)
        for jid, meta in self.jobs.items():
            if meta.role == "hotspare":
                self._check_swap_then_requeue(jid, journal, t)
        # 5. no lost work
        for jid, text in outputs.items():
            meta = self.jobs.get(jid) or self.jobs.get(jid.split("_")[0])
            if meta is None:
                continue
            if meta.role in ("trainer", "array", "hotspare"):
                problems = check_trainer_output(text, meta.steps)
            elif meta.role == "submitit":
                problems = check_submitit_output(text, meta.steps, (final.jobs.get(jid) or {}).get("state", ""))
            else:
                continue
            for msg, ev in problems:
                self._violate("lost-work", f"{jid}-{msg[:40]}", f"job {jid}: {msg}", t, job=jid, **ev)
        # 7. journal
        if journal_skipped:
            self._violate("journal", "torn", f"the journal has {journal_skipped} line(s) that are not records "
                          f"(torn or garbage)", t, skipped=journal_skipped)
        for jid, meta in self.jobs.items():
            j = final.jobs.get(jid)
            if not meta.opted_in or j is None:
                continue
            restarts = _comment_restarts(j.get("comment", ""))
            recs = _job_records(jid, journal)
            cstate = comment_field(j.get("comment", ""), "state")
            ended = sorted({r["event"][4:] for r in recs if r.get("event", "").startswith("job-")
                            and r["event"][4:] in CHOSEN_COMMENT_STATES})
            if meta.role == "hotspare":
                self._check_hotspare_comment(jid, j, recs, t)
            # (a resized hot-spare job's comment is the swap's, checked above: Slurm refuses updates after it)
            if frozen_comment(jid, journal) is None and j.get("state") in FINAL_STATES and ended \
                    and cstate not in ended:
                self._violate("journal", f"state-{jid}", f"job {jid} ended {j.get('state')}: the journal says "
                              f"{'/'.join(ended)}, its comment says state={cstate or 'none'}", t, job=jid,
                              comment=j.get("comment", ""), journal=ended)
            if restarts and not recs:
                self._violate("journal", f"comment-{jid}", f"job {jid}'s comment counts {restarts} restart(s) but "
                              f"the journal has no record of it", t, job=jid, comment=j.get("comment", ""))
        # 8. end state
        for name, n in final.nodes.items():
            if node_in_service(n):
                continue
            kind = ours_kind(n.get("reason", ""), self.spare_prefix) if n.get("drain") else ""
            if kind in ("spare", "retired", "lemon"):
                continue
            latest = max((f.start for f in self.faults if f.node == name and f.start != float("inf")), default=None)
            # drained by autoheal, or not responding without a reason (a lab reboot under way)
            if recovery_bound is not None and kind in ("health", "") and latest is not None \
                    and (kind == "health" or not n.get("reason")) and t - latest < recovery_bound:
                self.recovering.append(f"{name} ({t - latest:.0f} s after its last fault, "
                                       f"bound {recovery_bound:.0f} s)")
                continue
            if human and kind == "health" and (self.oncall.waiting(t) or name in self.oncall.awaiting_technician()):
                self.waiting_human.append(f"{name} ({strip_reason_suffix(n.get('reason', ''))})")
                continue
            if name in self.oncall.awaiting_oncall():
                self.waiting_human.append(f"{name} ({strip_reason_suffix(n.get('reason', ''))}, Slurm's own drain)")
                continue
            if kind == "health" and name in limited:
                w = self.limit_waits[name]
                self.waiting_limit.append(f"{name} (waits on the {w['limit']} limit for {t - w['since']:.0f} s"
                                          + (f", until {w['until'] - t:.0f} s from now" if w["until"] else "")
                                          + f", bound {self.wait_bound:.0f} s)")
                continue
            requested = {r.get("node") for r in final.replacements}
            if awaiting_ok and kind == "health" and strip_reason_suffix(n.get("reason", "")).startswith(
                    "autoheal: replace") and (final.kube is None or name in requested):
                self.awaiting.append(name)
                continue
            self._violate("end-state", f"node-{name}", f"{name} ends the soak {n.get('state')} "
                          f"({n.get('reason') or 'no reason'}): neither in service nor retired by autoheal", t,
                          node=name, state=n.get("state"), reason=n.get("reason"),
                          faults_on_node=[asdict(f) for f in self.faults if f.node == name])
        if self.slurm_only:
            self._check_person_told(journal, t)
        self.check_leaks(leaked, t)
        return self.violations[before:]

    #: Seconds between the drain that asks for a replacement and the hooks' record of the wait.
    TOLD_WITHIN = 30.0

    def _check_person_told(self, journal: Sequence[dict], t: float) -> None:
        """Without Kubernetes a node waiting for a replacement waits for a person: the product must have
        said so (an ``awaiting-replacement`` record of that node, which the notifier sends), or the wait
        was invisible, and a technician would never have come."""
        waits = [(r["node"], r["since"]) for r in self.oncall.repairs if r.get("since") is not None]
        waits += [(n, w["since"]) for n, w in self.oncall._awaiting.items()]
        for node, since in waits:
            told = [r for r in journal if r.get("event") in TOLD_EVENTS and r.get("node") == node
                    and since - 4 * self.TOLD_WITHIN <= float(r.get("time") or 0) <= since + self.TOLD_WITHIN]
            if not told:
                self._violate("stranded", f"untold-{node}-{since:.0f}", f"{node} waited for a person to replace "
                              f"it from {since:.0f} with no awaiting-replacement record (nobody was told)", t,
                              node=node, since=since)

    def _check_hotspare_comment(self, jid: str, j: dict, recs: Sequence[dict], t: float) -> None:
        """7. A hot-spare job's comment agrees with the journal: ``swaps=`` counts its ``job-hot-swap``
        records (the count is carried across requeues), and when its last run swapped or dropped a spare
        (the comment is written just before the resize, and Slurm refuses updates after it), ``nodes=`` and
        ``spares=`` are that record's active nodes and spares left."""
        comment = j.get("comment", "")
        if "spares" not in _fields(comment):
            self._violate("journal", f"spares-{jid}", f"hot-spare job {jid}'s comment has no spares= key",
                          t, job=jid, comment=comment)
            return
        swaps = [r for r in recs if r.get("event") == "job-hot-swap"]
        # a kill -9 of slurmctld just after a swap loses it: slurmctld saves job state in the background
        # and restarts with the job on its old nodes and its comment from before the swap
        lost = [r for r in swaps if self._lost_to_slurmctld(r.get("time", 0.0))]
        if not len(swaps) - len(lost) <= comment_swaps(comment) <= len(swaps):
            self._violate("journal", f"swaps-{jid}", f"hot-spare job {jid}'s comment counts "
                          f"{comment_swaps(comment)} swap(s), the journal {len(swaps)}"
                          + (f" ({len(lost)} lost to a slurmctld kill)" if lost else ""), t, job=jid,
                          comment=comment, journal=[r.get("message") for r in swaps])
        last = frozen_comment(jid, recs)
        if last is None or (last.get("event") == "job-hot-swap" and last in lost):
            return
        ev = last.get("evidence") or {}
        want = {"spares": ev.get("spares") or "none"}
        if last.get("event") == "job-hot-swap":
            want["nodes"] = ev.get("active") or ""
        got = {k: comment_field(comment, k) for k in want}
        if got != want:
            self._violate("journal", f"hot-{jid}", f"hot-spare job {jid}'s comment says "
                          f"{' '.join(f'{k}={v}' for k, v in got.items())}, its last {last.get('event')} record "
                          f"{' '.join(f'{k}={v}' for k, v in want.items())}", t, job=jid, comment=comment,
                          record=last.get("message"))

    def _lost_to_slurmctld(self, t: float) -> bool:
        """A ``kill -9`` of slurmctld within ``SLURMCTLD_STATE_LAG`` after ``t``: a job update made at ``t``
        may be lost (the restarted slurmctld reads the state it saved before it)."""
        return any(f.kind == "kill-slurmctld" and t <= f.start <= t + SLURMCTLD_STATE_LAG for f in self.faults)

    def check_leaks(self, leaked: Sequence[str], t: float) -> List[Violation]:
        """8. Processes of the lab still running after it went down."""
        before = len(self.violations)
        for proc in leaked:
            self._violate("end-state", f"leak-{proc}", f"process left after the lab went down: {proc}", t,
                          process=proc)
        return self.violations[before:]

    def _check_acted_once(self, final: Snapshot, journal: Sequence[dict], t: float) -> None:
        injections: Dict[tuple, int] = {}
        node_faults: Dict[str, int] = {}
        for f in self.faults:
            if f.group == "gpu" and f.node:
                injections[(f.node, f.gpu)] = injections.get((f.node, f.gpu), 0) + f.count
                node_faults[f.node] = node_faults.get(f.node, 0) + f.count
        resets: Dict[tuple, int] = {}
        reboots: Dict[str, int] = {}
        replaces: Dict[str, int] = {}
        for r in journal:
            if r.get("event") != "remediation-step":
                continue
            action, node = r.get("action"), r.get("node", "")
            if action == "reset-gpu":
                m = re.search(r"GPU (\d+)", r.get("message", ""))
                key = (node, int(m.group(1)) if m else None)
                resets[key] = resets.get(key, 0) + 1
            elif action == "reboot-node" and r.get("outcome") == "requested":
                reboots[node] = reboots.get(node, 0) + 1
            elif action == "replace-node" and r.get("outcome") not in ("already asked",):
                replaces[node] = replaces.get(node, 0) + 1
        for (node, gpu), n in resets.items():
            allowed = injections.get((node, gpu), 0) if gpu is not None else node_faults.get(node, 0)
            if n > allowed:
                self._violate("acted-twice", f"reset-{node}-{gpu}", f"GPU {gpu} of {node} reset {n} times for "
                              f"{allowed} fault(s)", t, node=node, gpu=gpu, resets=n, faults=allowed)
        for what, counts in (("reboot", reboots), ("replacement", replaces)):
            for node, n in counts.items():
                if n > node_faults.get(node, 0):
                    self._violate("acted-twice", f"{what}-{node}", f"{node}: {n} {what} request(s) for "
                                  f"{node_faults.get(node, 0)} GPU fault(s)", t, node=node, count=n)
        per_node: Dict[str, int] = {}
        for r in final.replacements:
            per_node[r.get("node", "")] = per_node.get(r.get("node", ""), 0) + 1
        for node, n in per_node.items():
            if n > max(1, node_faults.get(node, 0)):
                self._violate("acted-twice", f"cr-{node}", f"{n} replacement requests for {node}", t, node=node,
                              requests=[r for r in final.replacements if r.get("node") == node])
        for jid, meta in self.jobs.items():
            j = final.jobs.get(jid)
            if j is None or not meta.opted_in:
                continue
            restarts = _comment_restarts(j.get("comment", ""))
            if meta.role == "submitit":
                # submitit requeues the job itself on the grace signal; Slurm's count shows a second
                # requeue (autoheal's) for the same fault even when the comment does not
                restarts = max(restarts, int(j.get("restarts") or 0))
            swaps = comment_swaps(j.get("comment", ""))
            causes = self.possible_requeue_causes(jid, journal)
            if restarts + swaps > causes:
                what = f"restarted {restarts} times" + (f" and swapped {swaps} time(s)" if swaps else "")
                self._violate("acted-twice", f"requeue-{jid}", f"job {jid} {what} but only "
                              f"{causes} fault(s) hit its nodes", t, job=jid, comment=j.get("comment", ""),
                              causes=causes, slurm_restarts=j.get("restarts"))

    def _check_swap_then_requeue(self, jid: str, journal: Sequence[dict], t: float) -> None:
        """4. A hot-spare job swapped off a node is not requeued for the same fault on that node too:
        xid-watch's requeue after the grace finds the job gone from the node. Unless slurmctld lost the
        swap (killed within ``SLURMCTLD_STATE_LAG``): it then has the job on the node again, and xid-watch
        rightly requeues it."""
        recs = _job_records(jid, journal)
        for i, r in enumerate(recs):
            if r.get("event") != "job-hot-swap" or self._lost_to_slurmctld(r.get("time", 0.0)):
                continue
            lost = set(str((r.get("evidence") or {}).get("lost") or r.get("node") or "").split(",")) - {""}
            for q in recs[i + 1:]:
                if q.get("event") in NEW_RUN_EVENTS:
                    break  # a new run: a later requeue is for something else
                if q.get("event") == "requeue" and q.get("node") in lost:
                    self._violate("acted-twice", f"swap-requeue-{jid}-{q.get('time')}", f"job {jid} was swapped off "
                                  f"{q.get('node')} and then requeued for the same node", t, job=jid,
                                  swap=r.get("message"), requeue=q.get("message"))

    def possible_requeue_causes(self, jid: str, journal: Sequence[dict] = ()) -> int:
        """Faults that could requeue ``jid``: a GPU fault (or a bad repair's defect raised again) or slurmd
        kill on a node it was running on at the time (or during the 2 s before), slurmctld kills while it
        ran, its time limit. Where it ran: the snapshots, and its prolog's and epilog's records (an
        allocation that a failed prolog ends within a second falls between snapshots: seed 32703, job 4
        started on spare2 17 ms after its return, the defect raised again, its prolog failed, requeued)."""
        seen = self.ran_on.get(jid, []) + [
            (float(r.get("time", 0.0)), [r.get("node", "")]) for r in journal
            if r.get("source") in ("prolog", "epilog") and jid in [str(x) for x in r.get("job_ids") or []]]
        n = 0
        for f in self.faults:
            if f.group == "gpu" or f.kind in ("kill-slurmd", "admin-drain", "kubectl-cordon"):
                def there(at: float, f: Injected = f) -> bool:
                    return any(abs(t - at) <= 10.0 and (f.node in nodes) for t, nodes in seen)

                if there(f.start):
                    n += f.count - len(f.again)
                n += sum(1 for at in f.again if there(at))
            elif f.kind == "kill-slurmctld":
                if any(abs(t - f.start) <= 10.0 for t, _ in seen):
                    n += 1
        return n

    # ---- report figures ----------------------------------------------------------------------------
    def per_fault(self) -> Dict[int, dict]:
        """Each fault's own figures (the percentiles' samples), and its node as the last snapshot before
        it saw it: why one fault took long (a node already drained by an admin, rebooting, ...)."""
        out: Dict[int, dict] = {}
        for f in self.faults:
            row = {"kind": f.kind, "node": f.node, "node_before": self.node_at_fault.get(f.id, ""),
                   "drain_s": self.to_drain.get(f.id), "back_s": self.to_back.get(f.id),
                   "job_running_again_s": self.to_job_running.get(f.id, []) + self.to_job_running_human.get(f.id, []),
                   "job_running_again_loop_s": self.to_job_running_loop.get(f.id, [])}
            out[f.id] = {k: v for k, v in row.items() if v not in (None, [], "")}
        return out

    def recovery(self) -> Dict[str, Dict[str, Optional[float]]]:
        running = [x for xs in self.to_job_running.values() for x in xs]
        human = [x for xs in self.to_job_running_human.values() for x in xs]
        kinds = {f.id: f.kind for f in self.faults}
        # XIDs reach xid-watch as events (bound: 2 s p95); NVML-only faults: xid-watch's health poll (5 s) for hard
        # ones (GPU lost), the next healthcheck for thermal, PCIe and flapping
        # only the kinds autoheal drains for: a warn-only XID (63) or a requeue-only one (94) "drains" when
        # some later fault of the node does, which is not its time (seed 1: XID 94 "drained" after 102 s)
        to_drain = {fid: v for fid, v in self.to_drain.items()
                    if kinds.get(fid) not in KINDS or KINDS[kinds[fid]].drains}
        event = [v for fid, v in to_drain.items() if kinds.get(fid, "").startswith("xid")]
        polled = [v for fid, v in to_drain.items() if not kinds.get(fid, "").startswith("xid")]
        in_service_event = [v for fid, v in to_drain.items()
                            if kinds.get(fid, "").startswith("xid") and fid in self.ours_to_drain]
        return {"fault_to_drain_s": percentiles(list(to_drain.values())),
                "fault_to_drain_xid_event_s": percentiles(event),
                # the XID faults on a node in service, which autoheal had to drain at once: the "drain <= 2 s
                # p95" bound of invariant 4 is about these
                "fault_to_drain_xid_event_in_service_s": percentiles(in_service_event),
                "fault_to_drain_polled_s": percentiles(polled),
                "fault_to_job_running_again_s": percentiles(running + human),
                # the ones whose wait overlapped no breaker trip (no human in the loop)
                "fault_to_job_running_again_no_trip_s": percentiles(running),
                # the same waits without the time no idle node the job could use was free (a full queue):
                # the loop's own part (detection, grace, requeue, Slurm's requeue delay, scheduling, prolog)
                "fault_to_job_running_again_loop_s": percentiles(
                    [x for xs in self.to_job_running_loop.values() for x in xs]),
                # how the job ran again: requeued (and started again), or swapped to its hot spare
                "fault_to_job_running_again_requeue_s": percentiles(self.running_again_by["requeue"]),
                "fault_to_job_running_again_swap_s": percentiles(self.running_again_by["swap"]),
                "fault_to_node_back_or_replaced_s": percentiles(list(self.to_back.values()))}


def percentiles(values: List[float]) -> Dict[str, Optional[float]]:
    """n, p50, p95, max (nearest-rank), rounded to 0.01 s; None when there is no value."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    xs = sorted(values)

    def rank(p: float) -> float:
        i = max(0, min(len(xs) - 1, int(-(-p * len(xs) // 100)) - 1))
        return round(xs[i], 2)

    return {"n": len(xs), "p50": rank(50), "p95": rank(95), "max": round(xs[-1], 2)}


def comment_field(comment: str, key: str) -> str:
    m = re.search(rf"\b{key}=(\S*)", (comment or "").split("|", 1)[0])
    return m.group(1) if m else ""


def _fields(comment: str) -> set:
    return set(re.findall(r"\b(\w+)=", (comment or "").split("|", 1)[0]))


def comment_swaps(comment: str) -> int:
    """A hot-spare job's ``swaps=`` count (0 without)."""
    m = re.match(r"\d+", comment_field(comment, "swaps"))
    return int(m.group(0)) if m else 0


def _job_records(jid: str, journal: Sequence[dict]) -> List[dict]:
    return sorted((r for r in journal if jid in [str(x) for x in r.get("job_ids") or []]),
                  key=lambda r: r.get("time", 0))


#: Seconds after a job update within which a ``kill -9`` of slurmctld may lose it: slurmctld writes its job
#: state in the background. Measured in the lab: a hot-spare swap (``NodeList`` shrink and comment) 1.3 s
#: before the kill, and 4.3 s before it in a soak (seed 12), were both gone after the restart.
SLURMCTLD_STATE_LAG = 10.0

#: Journal events that start a new run of a job (the runner writes its comment again then).
NEW_RUN_EVENTS = ("job-restart", "job-requeue")


def frozen_comment(jid: str, journal: Sequence[dict]) -> Optional[dict]:
    """The ``job-hot-swap`` or ``job-spare-dropped`` record of the job's last run, if that run resized the
    job: the runner wrote the comment just before the resize and Slurm (22.05, no accounting) refuses
    every update of the job after it, until the job is requeued. None when the last run resized nothing."""
    last = None
    for r in _job_records(jid, journal):
        ev = r.get("event")
        if ev in ("job-hot-swap", "job-spare-dropped"):
            last = r
        elif ev in NEW_RUN_EVENTS:
            last = None
    return last


def _comment_restarts(comment: str) -> int:
    v = comment_field(comment, "restarts")
    return int(v) if v.isdigit() else 0


_START = re.compile(r"autoheal-trainer: start step=(\d+) resumed_from=(\S+) restart=(\S+) .*rank=0\b")
#: The runner's own line when it picks the checkpoint a run (or a hot-spare swap) resumes from.
_DECIDED = re.compile(r"autoheal-runner: job [^\s:]+(?: run \d+ on .*resume from step|: .*resuming from checkpoint "
                      r"step) (\S+?)[,;]?(?:\s|$)")
_SAVED = re.compile(r"autoheal-trainer: checkpoint saved step=(\d+)")
_DONE = re.compile(r"autoheal-trainer: done step=(\d+) final_state=(\d+)")


def check_trainer_output(text: str, steps: int) -> List[tuple]:
    """Problems in one trainer job's output (every run appended): a final state that differs from an
    uninterrupted run's, or a restart that did not resume from the newest checkpoint saved before it.
    Returns [(message, evidence)]; a job that has not finished yet has nothing to say on its final
    state."""
    from autoheal.sbatch_helpers.examples.tiny_trainer import expected_final_state

    out: List[tuple] = []
    newest: Optional[int] = None
    runs = 0
    decided: Optional[tuple] = None  # (step, newest then, line): the runner's pick for the next start
    for line in text.splitlines():
        m = _DECIDED.search(line)
        if m:
            # judged when the runner picked it: a duplicate of the job that Slurm started after losing
            # state (a slurmctld kill) may save a newer checkpoint before this run's trainer prints its start
            step = int(m.group(1)) if m.group(1).isdigit() else 0
            decided = (step, newest, line.strip())
            if step != (newest or 0):
                out.append((f"the runner resumed a run from step {m.group(1)}, the newest checkpoint was "
                            f"{newest if newest is not None else 'none'}", {"line": line.strip()}))
            continue
        m = _START.search(line)
        if m:
            runs += 1
            step = int(m.group(1))
            if decided is not None:
                if step != decided[0]:
                    out.append((f"run {runs} started at step {step}, its runner resumed it from step {decided[0]}",
                                {"line": line.strip(), "runner": decided[2]}))
                decided = None
            elif runs > 1 and step != (newest or 0):
                out.append((f"run {runs} resumed from step {step}, the newest checkpoint was "
                            f"{newest if newest is not None else 'none'}", {"line": line.strip()}))
            continue
        m = _SAVED.search(line)
        if m:
            newest = max(newest or 0, int(m.group(1)))
            continue
        m = _DONE.search(line)
        if m:
            want = expected_final_state(steps)
            if int(m.group(1)) != steps or int(m.group(2)) != want:
                out.append((f"final state {m.group(2)} at step {m.group(1)}, an uninterrupted run ends at step "
                            f"{steps} with {want}", {"line": line.strip()}))
    return out


_SUB_START = re.compile(r"submitit-trainer: start step=(\d+) node=(\S*)")
_SUB_CKPT = re.compile(r"submitit-trainer: checkpoint (?:saved )?step=(\d+)")  # on the signal, or durable
_SUB_DONE = re.compile(r"submitit-trainer: done step=(\d+) final_state=(\d+)")
_SUB_RESULT = re.compile(r"^result (\{.*\})\s*$", re.M)


def check_submitit_output(text: str, steps: int, state: str = "") -> List[tuple]:
    """Problems in a submitit job's log (every run appended) and its client's output: a run that did not
    start from the newest step submitit checkpointed (pickled) before it (from step 0 without one), a
    final state that differs from an uninterrupted run's (in the log and in the result the client got),
    or a COMPLETED job whose client got no result. A job not finished has nothing to say yet."""
    import json

    from autoheal.sbatch_helpers.examples.submitit_job import expected_final_state

    out: List[tuple] = []
    newest = 0
    runs = 0
    want = expected_final_state(steps)
    for line in text.splitlines():
        m = _SUB_START.search(line)
        if m:
            runs += 1
            if runs > 1 and int(m.group(1)) != newest:
                out.append((f"run {runs} started from step {m.group(1)}, submitit's newest checkpoint was "
                            f"step {newest}", {"line": line.strip()}))
            continue
        m = _SUB_CKPT.search(line)
        if m:
            newest = int(m.group(1))
            continue
        m = _SUB_DONE.search(line)
        if m and (int(m.group(1)) != steps or int(m.group(2)) != want):
            out.append((f"final state {m.group(2)} at step {m.group(1)}, an uninterrupted run ends at step "
                        f"{steps} with {want}", {"line": line.strip()}))
    m = _SUB_RESULT.search(text)
    if m:
        try:
            res = json.loads(m.group(1))
        except ValueError:
            res = {}
        if res.get("step") != steps or res.get("final_state") != want:
            out.append((f"the client's result is step {res.get('step')} final_state {res.get('final_state')}, an "
                        f"uninterrupted run's is step {steps} final_state {want}", {"line": m.group(0)[:300]}))
    elif state == "COMPLETED":
        out.append(("the job COMPLETED but its submitit client got no result", {"state": state}))
    return out
