"""``autoheal guard``: finishes, from outside the job, what the runner's requeue could not.

The runner requeues its job after a node fault with requeuehold -> ExcNodeList -> release. Slurm answers
the hold by killing every process of the job (SIGTERM, then SIGKILL after KillWait); the runner shields
its Slurm calls from SIGTERM, but a SIGKILL, a crash, or a controller that stays away longer than the
runner's retry budget can still leave the job held for good. Nothing inside the job can fix that, so
this small controller-side loop does, every ``interval`` seconds:

* **release**: a PENDING job whose comment carries the runner marker with ``state=requeueing`` (or
  ``requeue-failed``: the runner gave up, e.g. slurmctld stayed away past its retry budget) and that is
  held by requeuehold (reason JobHeldUser, description "job requeued in held state"), seen so for at least
  ``release_after`` seconds (the runner's own release usually lands within a second): apply the
  exclusions the runner recorded (``excl=``, pruned to nodes still unhealthy, the user's own list kept),
  release it, and record ``guard=released`` in the comment and a journal record. A job held by anyone
  else (``scontrol hold`` by a user or an admin, Slurm's own launch-failure hold) is never touched.
* **prune**: a PENDING, not held runner job whose autoheal exclusions name nodes that have been healthy
  again for ``prune_after`` seconds gets them removed, so exclusions never grow without bound or keep a
  job pending for good.

* **schedule**: a job autoheal requeued (the runner's, or a plain job xid-watch requeued, whose comment
  says so) becomes eligible again ``cred_expire`` + 1 s after its requeue, but slurmctld only looks at it
  at its next scheduling pass: on an otherwise quiet cluster that is the next backfill cycle, up to
  ``bf_interval`` (30 s by default) later. Any job update makes slurmctld schedule at once, so once the
  job's EligibleTime has passed the guard rewrites its ExcNodeList with the very same list, once per
  requeue. Measured on the lab (22.05, cred_expire=10): requeue -> running 26 s without, 11 s with.
  The ExcNodeList is chosen because Slurm refuses it for a job that is no longer pending: a job that
  started meanwhile is left exactly as it is (a comment rewrite could clobber the runner's newer one).

* **requeue** (a lost prolog): with ``PrologFlags=Alloc`` slurmctld sends the prolog's launch to the nodes
  once, at the allocation (never resent), and starts the batch script only when every node says the
  prolog ended. Only slurmd's own thread that ran the prolog says so: a slurmd killed in that moment (or
  restarted while the prolog ran) never does, and the restarted slurmd knows nothing of the job.
  slurmctld requeues a batch job missing from its node only at a registration that comes more than
  BatchStartTimeout + MessageTimeout after the allocation, so a slurmd back within that window leaves
  the job RUNNING with reason ``Prolog`` on a node that answers, for good (lab soak seed 12: trainer job 4
  allocated gpu1 140 ms before its slurmd was killed, in Prolog for the remaining 3.5 minutes of the
  soak). Slurm 22.05, 24.11 and 26.05 alike, with RunInJob too (docs/admin-guard.md names the source
  lines). An autoheal job in Prolog whose nodes' slurmd started after its allocation (its StartTime,
  read from Slurm for that job alone when the listing lacks it; never guessed), seen so for
  ``lost_prolog_after`` seconds, is requeued: its batch script never ran, so no work is lost. The
  requeue comes first and its comment after, with an intent on disk in between (``guard_intent``).
  Any batch job can be caught so, not only autoheal's (CI soak seed 12 again: a plain ``sbatch`` job
  allocated gpu1 as its slurmd was killed, in Prolog for the 180 s the soak allows and beyond): a plain
  job is requeued as well when it is requeueable (``Requeue=1``: what Slurm itself does to a batch job
  whose launch failed), its comment left as it is; one that is not (``--no-requeue``), or whose requeue
  Slurm refuses, is reported once (``guard-stranded``, with the webhook) for a person to end, never
  touched. ``--lost-prolog-jobs autoheal`` keeps the rule to autoheal's jobs.

Every action is idempotent (the runner may finish at the same moment; two guards may run), reads and
writes go through the Slurm adapter, and a controller that does not answer makes the pass a no-op.
Run one on the slurmctld host (systemd unit: docs/admin-guard.md); the lab starts one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from autoheal.errors import SlurmError, SlurmJobFinished, SlurmJobNotPending, SlurmNotFound, SlurmUnavailable
from autoheal.reasons import is_ours
from autoheal.strenum import StrEnum

if TYPE_CHECKING:
    from autoheal.journal import Journal
    from autoheal.notify import Notifier
    from autoheal.sbatch_helpers.guard_metrics import GuardMetrics
    from autoheal.slurm.base import SlurmAdapter
    from autoheal.slurm.model import Job, Node, SlurmVersion
from autoheal.sbatch_helpers.comment import (
    CommentState,
    is_runner_comment,
    node_unhealthy,
    plan_exclusions,
    split_nodes,
)
from autoheal.sbatch_helpers.guard_intent import IntentOutcome, IntentStore, RequeueIntent, outcome


class GuardKind(StrEnum):
    """What the guard does to a job (the module docstring tells each)."""

    RELEASE = "release"
    PRUNE = "prune"
    SCHEDULE = "schedule"
    REQUEUE = "requeue"
    STRANDED = "stranded"  # a lost prolog the guard may not requeue: reported once, never acted on


class PrologJobs(StrEnum):
    """Which jobs the lost-prolog rule looks at (``autoheal guard --lost-prolog-jobs``)."""

    ALL = "all"  # every batch job: a stranded job holds its nodes for good, whoever submitted it
    AUTOHEAL = "autoheal"  # only the runner's jobs and the jobs autoheal requeued


RELEASE, PRUNE, SCHEDULE, REQUEUE = GuardKind.RELEASE, GuardKind.PRUNE, GuardKind.SCHEDULE, GuardKind.REQUEUE
STRANDED = GuardKind.STRANDED
#: Slurm's reason for a job whose prolog has not ended yet (PrologFlags=Alloc: its batch script waits).
PROLOG_REASON = "Prolog"
#: States a job waiting for its prolog is listed in. launch_prolog sets only the reason (WAIT_PROLOG), so
#: it is RUNNING (lab, 22.05 text listing: "RUNNING (Prolog)"); CONFIGURING is kept for a job whose nodes
#: also boot. No ``--states`` filter selects jobs in Prolog alone: the running jobs are listed.
PROLOG_STATES = ("RUNNING", "CONFIGURING")
#: PrologFlags under which slurmctld runs the prolog at the allocation and waits for its end (Contain and
#: RunInJob imply Alloc: read_config.c); NoHold makes it not wait (node_scheduler.c launch_prolog).
ALLOC_FLAGS = frozenset({"alloc", "contain", "runinjob"})
#: A slurmd start in the very second of the allocation (Slurm keeps whole seconds: lab, slurmd killed and
#: back 0.4 s after the allocation) may have come before it (a healthy long prolog) or after it (lost): such
#: a job is taken as lost only after this many times the bound, so a stuck job is not left for good and a
#: healthy prolog gets five minutes.
SAME_SECOND_WAIT = 5

#: The Slurm releases whose source was read for the rule (docs/admin-guard.md): the case exists in each.
PROLOG_READ = ((22, 5), (24, 11), (26, 5))
#: Comment states that mean "the runner held this job and did not finish": requeueing (it died, the
#: intent is all it left) and requeue-failed (it gave up after its retry budget, e.g. slurmctld away).
UNFINISHED = ("requeueing", "requeue-failed")


@dataclass(frozen=True)
class GuardAction:
    """One thing the guard will do to one job (pure data: planned, printed with --dry-run, executed)."""

    kind: GuardKind
    job_id: str
    exclusions: Tuple[str, ...]  # the whole ExcNodeList to set (the user's own first)
    ours: Tuple[str, ...]  # autoheal exclusions kept, recorded in the comment
    removed: Tuple[str, ...]  # autoheal exclusions dropped because the node is healthy again
    comment: str  # the job comment after the action
    why: str
    restart_count: int = 0  # the job's restart count when planned (a requeue's intent names it)

    def to_dict(self) -> Dict[str, object]:
        return {"action": self.kind, "job": self.job_id, "exclusions": list(self.exclusions),
                "autoheal_exclusions": list(self.ours), "removed": list(self.removed), "why": self.why,
                "restart_count": self.restart_count}


@dataclass
class Sightings:
    """When the guard first saw each job waiting for a release, and since when each node looks healthy
    (in memory: a restarted guard only waits once more)."""

    first_seen: Dict[Tuple[str, int], float] = field(default_factory=dict)
    healthy_since: Dict[str, float] = field(default_factory=dict)
    scheduled: Set[Tuple[str, int]] = field(default_factory=set)  # (job, restart) already nudged
    in_prolog: Dict[Tuple[str, int], float] = field(default_factory=dict)  # (job, restart) -> first seen lost
    #: (job, restart) -> its StartTime as Slurm gave it for that job alone (None: Slurm could not say)
    start_times: Dict[Tuple[str, int], Optional[int]] = field(default_factory=dict)
    #: (job, restart) of lost prologs reported as stranded (not requeueable, or the requeue refused): once
    stranded: Set[Tuple[str, int]] = field(default_factory=set)

    def stable_view(self, nodes: Mapping[str, Node], now: float, prune_after: float) -> Dict[str, Node]:
        """``nodes`` with every node that has looked healthy for less than ``prune_after`` seconds shown
        as unhealthy: right after a slurmctld restart a drained node can look healthy for a moment (seen
        on the lab), and an exclusion dropped on that glimpse puts a job back on a faulty node."""
        from autoheal.slurm.model import Node

        view: Dict[str, Node] = {}
        for name, node in nodes.items():
            if node_unhealthy(node):
                self.healthy_since.pop(name, None)
                view[name] = node
            elif now - self.healthy_since.setdefault(name, now) >= prune_after:
                view[name] = node
            else:
                view[name] = Node(name, "DOWN", frozenset({"NOT_RESPONDING"}), reason="not yet stable")
        return view

    def since(self, job_id: str, restart: int, now: float) -> float:
        return self.first_seen.setdefault((job_id, restart), now)

    def forget_except(self, keys: Sequence[Tuple[str, int]]) -> None:
        keep = set(keys)
        for key in list(self.first_seen):
            if key not in keep:
                del self.first_seen[key]


def plan(jobs: Sequence[Job], nodes: Mapping[str, Node], sightings: Sightings, now: float,
         release_after: float, prune_after: float = 0.0,
         lost_prolog_after: Optional[float] = None, prolog_jobs: PrologJobs = PrologJobs.ALL) -> List[GuardAction]:
    """What to do this pass (pure but for ``sightings``). ``nodes``: name -> Node for every node Slurm
    knows; a node counts as healthy again only after ``prune_after`` seconds of looking healthy.
    ``lost_prolog_after``: seconds a lost prolog is seen before its job is requeued (None: not looked for);
    ``prolog_jobs``: which jobs that rule looks at."""
    actions: List[GuardAction] = []
    if lost_prolog_after is not None:
        actions += plan_lost_prologs(jobs, nodes, sightings, now, lost_prolog_after, prolog_jobs)
    nodes = sightings.stable_view(nodes, now, prune_after)
    waiting: List[Tuple[str, int]] = []
    pending: Set[Tuple[str, int]] = set()
    for job in jobs:
        if job.state != "PENDING":
            continue
        pending.add((job.job_id, job.restart_count))
        before = len(actions)
        if is_runner_comment(job.comment):
            _plan_runner_job(job, nodes, sightings, now, release_after, actions, waiting)
        eligible = job.eligible_time is not None and job.eligible_time <= now
        if len(actions) > before:
            if eligible:  # a release or prune is itself an update: slurmctld schedules after it
                sightings.scheduled.add((job.job_id, job.restart_count))
        elif _wants_schedule(job, sightings, now):
            sightings.scheduled.add((job.job_id, job.restart_count))
            actions.append(GuardAction(SCHEDULE, job.job_id, tuple(job.excluded_nodes), (), (), job.comment,
                                       f"eligible again for {now - (job.eligible_time or now):.0f}s after its "
                                       f"requeue; an update makes slurmctld schedule it now"))
    sightings.forget_except(waiting)
    sightings.scheduled &= pending
    return actions


def _autoheal_comment(comment: str) -> bool:
    """The comment of the runner's job, or of one autoheal requeued."""
    return is_runner_comment(comment) or is_ours(comment)


def _autoheal_job(job: Job) -> bool:
    return _autoheal_comment(job.comment)


def _prolog_suspect(job: Job, nodes: Mapping[str, Node], prolog_jobs: PrologJobs = PrologJobs.ALL) -> bool:
    """A job in Prolog (autoheal's only, with ``PrologJobs.AUTOHEAL``) with an answering node whose slurmd
    started after its EligibleTime: only a suspect (the EligibleTime of a job that waited in the queue is
    long before its allocation)."""
    if job.state not in PROLOG_STATES or job.state_reason != PROLOG_REASON:
        return False
    if prolog_jobs is PrologJobs.AUTOHEAL and not _autoheal_job(job):
        return False
    since = job.start_time or job.eligible_time
    return since is not None and bool(_restarted_after(job, nodes, since, same_second=True))


def _restarted_after(job: Job, nodes: Mapping[str, Node], since: int, same_second: bool = False) -> List[str]:
    """The job's answering nodes whose slurmd started after ``since`` (``same_second``: or in its second)."""
    return [n for n in job.nodes if n in nodes and nodes[n].responding
            and ((nodes[n].slurmd_start_time or 0) > since
                 or (same_second and (nodes[n].slurmd_start_time or 0) == since))]


def lost_prolog(job: Job, nodes: Mapping[str, Node], start_time: Optional[int] = None,
                same_second: bool = False) -> List[str]:
    """The nodes of a job waiting for its prolog whose slurmd (re)started after the job's
    allocation, answering: the prolog's end can never come from them (see the module docstring).
    ``start_time``: the allocation as Slurm gave it for this job (``job.start_time`` when the listing
    has it). Unknown: []. The EligibleTime is never taken for it (a slurmd restarted while the job still
    waited in the queue would make a healthy job's long prolog look lost). ``same_second``: a slurmd
    started in the allocation's own second counts too (Slurm gives both in whole seconds, so which came
    first is not known: the caller waits longer before taking it as lost)."""
    if not _prolog_suspect(job, nodes):
        return []
    since = start_time if start_time is not None else job.start_time
    return [] if since is None else _restarted_after(job, nodes, since, same_second)


def prolog_overdue(jobs: Sequence[Job], nodes: Mapping[str, Node], sightings: Sightings, now: float,
                   after: float, prolog_jobs: PrologJobs = PrologJobs.ALL) -> List[Job]:
    """The suspects seen for ``after`` seconds whose StartTime the listing lacks and nobody looked up yet:
    the guard asks Slurm for these few alone (``SlurmAdapter.job_start_time``), then plans."""
    return [j for j in jobs if j.start_time is None and _prolog_suspect(j, nodes, prolog_jobs)
            and (j.job_id, j.restart_count) not in sightings.start_times
            and now - sightings.in_prolog.get((j.job_id, j.restart_count), now) >= after]


def plan_lost_prologs(jobs: Sequence[Job], nodes: Mapping[str, Node], sightings: Sightings, now: float,
                      after: float, prolog_jobs: PrologJobs = PrologJobs.ALL) -> List[GuardAction]:
    """Requeue every job whose prolog was lost (``lost_prolog``) for ``after`` seconds; report, once, a
    plain job that is not requeueable (the user asked Slurm never to requeue it: a person decides)."""
    actions: List[GuardAction] = []
    seen: Dict[Tuple[str, int], float] = {}
    for job in jobs:
        if not _prolog_suspect(job, nodes, prolog_jobs):
            continue
        key = (job.job_id, job.restart_count)
        seen[key] = sightings.in_prolog.get(key, now)
        if now - seen[key] < after:
            continue
        restarted = lost_prolog(job, nodes, sightings.start_times.get(key))
        why = "restarted after the allocation"
        if not restarted and now - seen[key] >= after * SAME_SECOND_WAIT:
            restarted = lost_prolog(job, nodes, sightings.start_times.get(key), same_second=True)
            why = "restarted in the allocation's second (whole seconds: order unknown, so waited longer)"
        if not restarted:
            continue  # allocated after its nodes' slurmd started, or Slurm could not say when: never act
        why = (f"in Prolog for {now - seen[key]:.0f}s on {','.join(restarted)}, whose slurmd {why}: the "
               f"prolog's end will never come")
        if key in sightings.stranded:
            continue  # reported already (or its requeue refused): a person's to end
        if not job.requeue and not _autoheal_job(job):
            sightings.stranded.add(key)
            actions.append(GuardAction(STRANDED, job.job_id, (), (), (), job.comment,
                                       f"{why}; not requeueable (Requeue=0): left for an admin to requeue or "
                                       f"cancel", job.restart_count))
            continue
        st = CommentState.parse(job.comment) if is_runner_comment(job.comment) else None
        if st is not None:
            st.guard = "requeued"
        actions.append(GuardAction(REQUEUE, job.job_id, tuple(job.excluded_nodes), (), (),
                                   st.render() if st is not None else job.comment, why, job.restart_count))
    sightings.in_prolog = seen
    sightings.start_times = {k: v for k, v in sightings.start_times.items() if k in seen}
    sightings.stranded &= set(seen)
    return actions


@dataclass(frozen=True)
class PrologScope:
    """Whether the lost-prolog rule can apply on this cluster, and why (printed once by the guard)."""

    applies: bool
    why: str


def lost_prolog_scope(version: Optional[SlurmVersion], prolog_flags: Optional[str]) -> PrologScope:
    """Pure: the rule by Slurm version and PrologFlags (``scontrol show config``; None: not known)."""
    if prolog_flags is not None:
        flags = {f.strip().lower() for f in prolog_flags.split(",") if f.strip() and f.strip() != "(null)"}
        if "nohold" in flags:
            return PrologScope(False, "PrologFlags has NoHold: slurmctld does not wait for the prolog")
        if not flags & ALLOC_FLAGS:
            return PrologScope(False, f"PrologFlags={prolog_flags or '(null)'}: no prolog at the allocation, "
                                      f"so no job waits in Prolog")
    if version is not None and (version.major, version.minor) > PROLOG_READ[-1]:
        return PrologScope(True, f"Slurm {version}: newer than the releases read for the rule (up to "
                                 f"26.05); kept on, it acts only on a StartTime before the slurmd restart")
    return PrologScope(True, "a batch job's prolog end is reported only by the slurmd that ran it")


def _wants_schedule(job: Job, sightings: Sightings, now: float) -> bool:
    """A job autoheal requeued, pending, not held, past its EligibleTime and not nudged yet this requeue."""
    return (not job.held and job.restart_count >= 1 and job.eligible_time is not None
            and job.eligible_time <= now and (job.job_id, job.restart_count) not in sightings.scheduled
            and (is_runner_comment(job.comment) or is_ours(job.comment)))


def _plan_runner_job(job: Job, nodes: Mapping[str, Node], sightings: Sightings, now: float, release_after: float,
                     actions: List[GuardAction], waiting: List[Tuple[str, int]]) -> None:
    """Release or prune one pending runner job (appends to ``actions`` and ``waiting``)."""
    st = CommentState.parse(job.comment)
    # The comment is the user's to write (`scontrol update JobId=.. Comment=..`): keep only names of nodes
    # Slurm knows, so no `<!channel>` or other text of theirs reaches our records, webhooks or the
    # ExcNodeList (which Slurm would refuse whole, leaving the job held) (issue 25, item 7).
    ours_before = [n for n in split_nodes(st.excl) if n in nodes]
    excl = plan_exclusions(list(job.excluded_nodes), ours_before, [], nodes)
    if job.requeue_held and st.state in UNFINISHED:
        key = (job.job_id, job.restart_count)
        waiting.append(key)
        held_for = now - sightings.since(job.job_id, job.restart_count, now)
        if held_for < release_after:
            return  # the runner is probably finishing this itself
        st.state, st.guard, st.excl = "requeued", "released", ",".join(excl.ours)
        actions.append(GuardAction(RELEASE, job.job_id, tuple(excl.full), tuple(excl.ours),
                                   tuple(n for n in ours_before if n not in excl.ours), st.render(),
                                   f"held by the runner's requeue for {held_for:.0f}s; the runner did "
                                   f"not release it (killed or cut off from slurmctld)"))
    elif not job.held and excl.ours != ours_before:
        removed = tuple(n for n in ours_before if n not in excl.ours)
        st.guard, st.excl = "pruned", ",".join(excl.ours)
        actions.append(GuardAction(PRUNE, job.job_id, tuple(excl.full), tuple(excl.ours), removed,
                                   st.render(), f"{','.join(removed)} healthy again"))


@dataclass
class GuardResult:
    action: GuardAction
    done: bool
    detail: str = ""

    def to_dict(self) -> Dict[str, object]:
        return dict(self.action.to_dict(), done=self.done, detail=self.detail)


class Guard:
    """One guard loop: ``pass_once()`` reads Slurm, plans and (unless ``dry_run``) acts."""

    def __init__(self, slurm: SlurmAdapter, journal: Optional[Journal] = None, notifier: Optional[Notifier] = None,
                 release_after: float = 5.0, dry_run: bool = False,
                 clock: Callable[[], float] = time.time, say: Callable[[str], None] = print,
                 prune_after: float = 30.0, lost_prolog_after: Optional[float] = 60.0,
                 intents: Optional[IntentStore] = None, prolog_every: Optional[float] = None,
                 list_running: bool = False, prolog_jobs: PrologJobs = PrologJobs.ALL):
        self.slurm = slurm
        self.lost_prolog_after = lost_prolog_after
        self.prolog_jobs = prolog_jobs
        #: seconds between the looks for lost prologs (a listing of every running job, the costly part
        #: of a pass on a big cluster): a quarter of the bound, so a lost prolog is acted on within 1.25x it
        self.prolog_every = (lost_prolog_after or 0) / 4 if prolog_every is None else prolog_every
        self.prune_after = prune_after
        self.journal = journal
        self.notifier = notifier
        self.release_after = release_after
        self.dry_run = dry_run
        self.clock = clock
        self.say = say
        self.intents = intents if intents is not None else IntentStore(say=say)
        #: list the running jobs on every pass (the metrics' hot-spare swaps need them)
        self.list_running = list_running
        self.sightings = Sightings()
        self.scope: Optional[PrologScope] = None
        self._last_look: Optional[float] = None
        self.last_jobs: Sequence[Job] = ()
        #: the running jobs of the same call (the metrics' hot-spare swaps): one squeue a pass
        self.last_running: Sequence[Job] = ()

    def pass_once(self) -> List[GuardResult]:
        """One pass. SlurmUnavailable propagates (the caller waits and tries again)."""
        if not self.dry_run:
            self._finish_intents()
        look = self._prolog_look_due(self.clock())
        # a job waiting for a lost prolog is RUNNING: only on a look (or for the metrics) are those listed
        extra = ["RUNNING", "CONFIGURING"] if look or self.list_running else []
        listed = self.slurm.list_jobs(states=["PENDING", *extra])
        jobs = [j for j in listed if j.state == "PENDING"]
        self.last_running = [j for j in listed if j.state == "RUNNING"]
        self.last_jobs = jobs  # for the metrics (guard_metrics.requeued_waiting)
        prolog = [j for j in listed if j.state in PROLOG_STATES and j.state_reason == PROLOG_REASON] if look else []
        now = self.clock()
        if look:
            self._last_look = now
        # nothing of autoheal's pending and no job in Prolog: no node listing needed (the common pass)
        if not any(_autoheal_job(j) for j in jobs) and not [j for j in prolog if self._in_scope(j)]:
            self.sightings.forget_except([])
            if look:
                self.sightings.in_prolog.clear()
                self.sightings.start_times.clear()
            return []
        nodes = {n.name: n for n in self.slurm.list_nodes()}
        after = self.lost_prolog_after if look else None
        if after is not None:
            self._look_up_start_times(prolog_overdue(prolog, nodes, self.sightings, now, after, self.prolog_jobs))
        actions = plan(jobs + prolog, nodes, self.sightings, now, self.release_after, self.prune_after, after,
                       self.prolog_jobs)
        if self.dry_run:
            return [GuardResult(a, False, "dry run") for a in actions]
        return [self.execute(a) for a in actions]

    def _in_scope(self, job: Job) -> bool:
        return self.prolog_jobs is PrologJobs.ALL or _autoheal_job(job)

    def _prolog_look_due(self, now: float) -> bool:
        if self.lost_prolog_after is None or not self._prolog_scope().applies:
            return False
        return self._last_look is None or now - self._last_look >= self.prolog_every

    def _prolog_scope(self) -> PrologScope:
        """The rule's scope, read once from Slurm (version, PrologFlags); unknown while Slurm does not say."""
        if self.scope is not None:
            return self.scope
        try:
            flags = self.slurm.show_config().get("PrologFlags")
            scope = lost_prolog_scope(self.slurm.version(), flags)
        except SlurmError as exc:
            return PrologScope(True, f"PrologFlags not known yet ({exc})")
        self.scope = scope
        self.say(f"autoheal guard: lost-prolog rule {'on' if scope.applies else 'off'}: {scope.why}")
        return scope

    def _look_up_start_times(self, jobs: Sequence[Job]) -> None:
        """StartTime of each job, one ``scontrol show job`` each (a few jobs at most: the overdue suspects)."""
        for job in jobs:
            key = (job.job_id, job.restart_count)
            try:
                self.sightings.start_times[key] = self.slurm.job_start_time(job.raw_id or job.job_id)
            except SlurmNotFound:
                self.sightings.start_times[key] = None  # gone: nothing to requeue
            except SlurmUnavailable:
                raise
            except SlurmError as exc:  # unknown this pass (never acted on); asked again next look
                self.say(f"autoheal guard: job {job.job_id}: cannot read its start time: {exc}")

    def execute(self, action: GuardAction) -> GuardResult:
        job_id = action.job_id
        if action.kind == REQUEUE:
            return self._requeue(action)
        if action.kind == STRANDED:
            self._record(action)
            return GuardResult(action, True)
        try:
            try:
                self.slurm.set_excluded_nodes(job_id, list(action.exclusions))
            except SlurmJobNotPending:
                # started meanwhile (the runner's own release won the race): nothing left to do
                return GuardResult(action, False, "job is no longer pending")
            if action.kind == SCHEDULE:
                self.say(f"autoheal guard: job {job_id}: {action.why}")
                return GuardResult(action, True)
            if action.kind == RELEASE:
                self.slurm.release(job_id)
            self.slurm.set_job_comment(job_id, action.comment)
        except (SlurmNotFound, SlurmJobFinished):
            return GuardResult(action, False, "job is gone")
        except SlurmError as exc:
            self.say(f"autoheal guard: job {job_id}: {action.kind} failed: {exc}")
            return GuardResult(action, False, str(exc))
        self._record(action)
        return GuardResult(action, True)

    def _requeue(self, action: GuardAction) -> GuardResult:
        """Intent on disk, then the requeue, then the comment (``guard=requeued``: the next run's runner
        and the metrics see why) and the record (``_finish_requeue``): the comment never claims a requeue
        that failed, and a guard killed in between leaves the intent for the next pass to finish."""
        from autoheal.errors import SlurmJobAlreadyPending

        intent = RequeueIntent(action.job_id, action.restart_count,
                               action.comment if is_runner_comment(action.comment) else None, action.why)
        try:
            self.intents.add(intent)
        except OSError as exc:  # no record of the intent: better not act than act unrecorded
            self.say(f"autoheal guard: job {action.job_id}: requeue not done: cannot record its intent: {exc}")
            return GuardResult(action, False, f"cannot record the intent: {exc}")
        try:
            self.slurm.requeue(action.job_id)
        except (SlurmNotFound, SlurmJobFinished, SlurmJobAlreadyPending):
            self.intents.drop(intent)
            return GuardResult(action, False, "job is gone")
        except SlurmUnavailable as exc:  # its answer lost: it may have happened; the next pass looks
            self.say(f"autoheal guard: job {action.job_id}: requeue unanswered: {exc}")
            return GuardResult(action, False, str(exc))
        except SlurmError as exc:  # refused: nothing happened
            self.intents.drop(intent)
            self.say(f"autoheal guard: job {action.job_id}: {action.kind} failed: {exc}")
            if not _autoheal_comment(action.comment):
                self._strand(action, f"Slurm refused its requeue ({exc})")
            return GuardResult(action, False, str(exc))
        return GuardResult(action, True, self._finish_requeue(intent, action))

    def _strand(self, action: GuardAction, refused: str) -> None:
        """A plain job's refused requeue (not a batch job, its partition gone, ...): reported once, not
        tried again every look (an autoheal job's stays retried: its runner waits for it)."""
        self.sightings.stranded.add((action.job_id, action.restart_count))
        self._record(GuardAction(STRANDED, action.job_id, (), (), (), action.comment,
                                 f"{action.why}; {refused}: left for an admin to requeue or cancel",
                                 action.restart_count))

    def _finish_requeue(self, intent: RequeueIntent, action: GuardAction) -> str:
        """The comment and the record of a requeue that happened; the intent is dropped when both are done
        (or the comment cannot be written: the record says so). slurmctld away: kept, the next pass ends it."""
        note = ""
        if intent.comment is not None:
            try:
                self.slurm.set_job_comment(intent.job_id, intent.comment)
            except SlurmUnavailable as exc:
                self.say(f"autoheal guard: job {intent.job_id}: requeued; its comment waits for slurmctld: {exc}")
                return "requeued; comment not written yet"
            except SlurmError as exc:
                note = f"its comment could not be written ({exc})"
        self._record(action, note)
        self.intents.drop(intent)
        return note

    def _finish_intents(self) -> None:
        """The requeue intents a killed guard (or an unanswered requeue) left: finish or drop each."""
        for intent in self.intents.pending():
            try:
                job: Optional[Job] = self.slurm.get_job(intent.job_id)
            except SlurmNotFound:
                job = None
            result = outcome(intent, job)
            if result is IntentOutcome.REQUEUED and self._recorded(intent):
                self.intents.drop(intent)  # killed after its record, before the intent went: all was done
                continue
            if result is IntentOutcome.REQUEUED:
                action = GuardAction(REQUEUE, intent.job_id, (), (), (), intent.comment or "",
                                     intent.why, intent.restart_count)
                self._finish_requeue(intent, action)
                continue
            self.say(f"autoheal guard: job {intent.job_id}: an earlier requeue intent was not carried out "
                     f"({result.value}); dropped")
            self.intents.drop(intent)

    def _recorded(self, intent: RequeueIntent) -> bool:
        """Whether the journal already has this requeue (read only for an intent a killed guard left)."""
        if self.journal is None:
            return False
        return any(rec.evidence.get("restart_count") == intent.restart_count
                   for rec in self.journal.read(job=intent.job_id, events=["guard-requeue"]))

    def _record(self, action: GuardAction, note: str = "") -> None:
        if action.kind == REQUEUE:
            message = f"job {action.job_id}: requeued, its prolog lost ({action.why}){'; ' + note if note else ''}"
            event, severity = "guard-requeue", "action"
        elif action.kind == STRANDED:
            message = f"job {action.job_id}: stranded, its prolog lost ({action.why})"
            event, severity = "guard-stranded", "error"
        elif action.kind == RELEASE:
            message = (f"job {action.job_id}: released after an interrupted requeue ({action.why})"
                       f"{'; excluded ' + ','.join(action.ours) if action.ours else ''}")
            event, severity = "guard-release", "action"
        else:
            message = f"job {action.job_id}: no longer excluded from {','.join(action.removed)} ({action.why})"
            event, severity = "guard-prune", "info"
        self.say(f"autoheal guard: {message}")
        if self.journal is None:
            return
        node = (action.ours or action.removed or ("",))[0]
        rec = self.journal.record(event, job_ids=[action.job_id], node=node, message=message, severity=severity,
                                  action=action.kind, source="guard", evidence=action.to_dict())
        if rec is not None and self.notifier is not None and severity != "info":
            try:
                self.notifier.send(rec)
            except Exception as exc:  # a notification never stops the guard
                self.say(f"autoheal guard: notification failed: {exc}")


def run_forever(guard: Guard, interval: float, stop: Callable[[], bool],
                sleep: Callable[[float], object] = time.sleep, metrics: Optional[GuardMetrics] = None) -> None:
    """Pass after pass until ``stop()``; a controller that does not answer is waited out with backoff.
    With ``metrics``, its textfile is written after every pass (the heartbeat) and once more at the end."""
    from autoheal.sbatch_helpers.guard_metrics import requeued_waiting

    pause = interval
    if metrics is not None:
        guard.list_running = True  # the hot-spare swaps are seen in the running jobs
    while not stop():
        result, done = "ok", []
        try:
            done = [r.action.kind for r in guard.pass_once() if r.done]
            pause = interval
        except SlurmUnavailable as exc:
            result = "slurm-unavailable"
            guard.say(f"autoheal guard: slurmctld not answering ({exc}); next try in {pause:g}s")
            pause = min(max(interval, pause * 2), 60.0)
        except SlurmError as exc:
            result = "error"
            guard.say(f"autoheal guard: {exc}")
        if metrics is not None:
            if result == "ok":
                _observe_jobs(guard, metrics)
            metrics.observe(result, done, requeued_waiting(guard.last_jobs, guard.clock()))
            err = metrics.write()
            if err:
                guard.say(f"autoheal guard: {err}")
        sleep(pause)
    if metrics is not None:
        metrics.write(up=False)


def describe(results: Sequence[GuardResult]) -> List[str]:
    """Human lines for ``autoheal guard --once``."""
    if not results:
        return ["nothing to do: no autoheal job is left held or over-excluded"]
    return [f"{r.action.kind:8} job {r.action.job_id}: {r.action.why}"
            f"{' -> ExcNodeList=' + ','.join(r.action.exclusions) if r.action.exclusions else ''}"
            f"{'' if r.done else ' [' + (r.detail or 'not done') + ']'}" for r in results]


def pending_ids(results: Sequence[GuardResult]) -> Optional[List[str]]:
    """Job ids whose action did not complete, or that are stranded for a person to end (None: none)."""
    left = [r.action.job_id for r in results
            if r.action.kind == STRANDED
            or (not r.done and r.detail not in ("dry run", "job is gone", "job is no longer pending"))]
    return left or None


def _observe_jobs(guard: Guard, metrics: GuardMetrics) -> None:
    """The metrics' look at the jobs the pass listed: pending (requeued ones running again) and running
    (hot-spare swaps); Slurm's nodes when a job needs them."""
    from autoheal.errors import SlurmError

    try:
        metrics.observe_jobs(guard.last_jobs, guard.last_running, guard.clock(), guard.slurm.get_job,
                             guard.slurm.list_nodes)
    except SlurmError as exc:  # the metrics wait for the next pass; the guard's work is done
        guard.say(f"autoheal guard: metrics: {exc}")
