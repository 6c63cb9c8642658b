"""The job side of a GPU fault, level-triggered: xid-watch's housekeeping.

Whatever drained the node for a hardware fault (xid-watch itself, the healthcheck, the prolog or the
epilog) and whenever slurmctld answers, every job still RUNNING on the node gets, exactly once per job
and fault:

1. its grace signal: ``autoheal sbatch`` jobs (comment starting with ``hooks.runner_comment``) get
   ``hooks.runner_signal`` on their batch shell and requeue themselves; other jobs get the warning
   they asked for at submission (``--signal=[B:]SIG@SECS``, read back from the submit line and the
   batch script's ``#SBATCH`` lines: Slurm reports it in no job field), delivered as Slurm delivers it
   near the time limit (SIGCONT, then the signal; with ``B:`` to the batch shell only, else to every
   step but the batch shell), so that submitit, Lightning & co. checkpoint and requeue themselves.
   A job that asked for nothing gets ``hooks.grace_signal`` on its steps (never on the batch shell,
   which a USR1/USR2 would kill); with TERM the requeue itself is the grace (Slurm sends SIGTERM and
   waits KillWait), so such a job is requeued at once;
2. a requeue (``scontrol requeue``, with a job comment the user sees) if it still runs on this node
   ``hooks.grace_seconds`` later.

Everything lives in the node state (``pending_drain``, ``episode``, ``job_actions``,
``requeue_faults``), so a restart of xid-watch neither repeats a signal nor forgets a requeue. A drain
or a job action that finds slurmctld down or stopped (SlurmUnavailable) stays pending and is retried
with backoff until it is done, never given up.

Slurm load stays small: Slurm is asked only while the local state says there is work (a pending
drain, open job actions, a drain on record that has not been looked at) or a fault XID just came in,
plus one slow self-check (``hooks.xid_watch_self_check``, jittered) that catches a drain made by a
process whose state write failed.
"""

from __future__ import annotations

import random
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple, cast

from autoheal.events import Event
from autoheal.hooks import checks as C
from autoheal.hooks import state as S
from autoheal.reasons import RUNNER_MARKER
from autoheal.strenum import StrEnum

if TYPE_CHECKING:
    from autoheal.hooks.context import Context
    from autoheal.slurm.model import Job, Node, WarnSignal



class Stage(StrEnum):
    """Where a job action is (kept in the node state as its value): signal to send, being sent, in its
    grace period, done."""

    SIGNAL = "signal"
    SIGNALLING = "signalling"
    GRACE = "grace"
    DONE = "done"


class Mode(StrEnum):
    """What one look at Slurm left: nothing to do, only deadlines to wait for, or work in flight."""

    QUIET = "quiet"
    WAITING = "waiting"
    BUSY = "busy"


SIGNAL, SIGNALLING, GRACE, DONE = Stage.SIGNAL, Stage.SIGNALLING, Stage.GRACE, Stage.DONE
QUIET, WAITING, BUSY = Mode.QUIET, Mode.WAITING, Mode.BUSY
#: Seconds between Slurm checks while there is work in flight (jobs to find, a pending drain).
FAST_SECONDS = 2.0
#: Longest wait between retries while slurmctld does not answer.
MAX_BACKOFF = 10.0
#: Attempts at a job write slurmctld refused (not "unavailable") before it is given up and journalled.
MAX_REFUSALS = 5
#: End states of a job that got hooks.grace_signal and is then requeued all the same: it died of the signal
#: (FAILED) or handled it and exited (COMPLETED). A cancel, a time limit or OOM are left alone.
ENDED_ON_SIGNAL = ("FAILED", "COMPLETED")
#: How long after its grace such a job may stay COMPLETING and still be requeued once it has ended
#: (Slurm's default MinJobAge: a finished job is forgotten after that).
ENDING_WAIT = 300.0

def is_health_reason(reason: Optional[str]) -> bool:
    """``autoheal.reasons.is_health_drain``: the one test, shared with the sync."""
    from autoheal.reasons import is_health_drain

    return is_health_drain(reason)


def backoff(tries: int, cap: float = MAX_BACKOFF) -> float:
    """1, 2, 4, 8, ... seconds, at most ``cap``."""
    return float(min(cap, 2 ** max(0, tries - 1)))


def requeue_note(reason: str) -> str:
    """The job comment of a requeue: ``autoheal: requeued after xid 79 on GPU 1 of gpu1 (...): ...``."""
    from autoheal.reasons import MAX_COMMENT_LEN, PREFIX, RUNGS, Origin, Reason, parse_body

    body = reason.strip()
    if body.startswith(PREFIX.strip()):
        parsed = Reason.parse(body)
        # the rung a drain names (``autoheal: replace: xid 79 ...``, the first drain's since issue 22) is
        # the node's business: the job is told the fault
        body = parsed.body() if parsed is not None and parsed.origin in RUNGS else body[len(PREFIX.strip()):].strip()
    return parse_body(body or "a GPU fault", Origin.REQUEUED).render(max_len=MAX_COMMENT_LEN)


def result_note(r: C.CheckResult) -> str:
    """The job comment of a requeue for the result ``r`` (``requeue_note`` of its text, from the value)."""
    from autoheal.reasons import MAX_COMMENT_LEN, Origin

    return r.reason.with_origin(Origin.REQUEUED).render(max_len=MAX_COMMENT_LEN)


# ---- pure changes to the state dict --------------------------------------------------------------------

def request_drain(st: S.NodeStateData, failure: C.CheckResult, now: float) -> None:
    """Remember a drain to make (kept, and retried, until slurmctld takes it); the heavier fault wins."""
    pend = st.get("pending_drain")
    if pend:
        old = C.CheckResult.from_dict(pend.get("failure") or {})
        if C.worst_failure([old, failure]) is old:
            return
    st["pending_drain"] = {"failure": failure.to_dict(), "since": (pend or {}).get("since", now), "tries": 0,
                           "next_try": 0.0}


def add_action(st: S.NodeStateData, job: str, fault: str, note: str, now: float, runner: Optional[bool] = None,
               detail: str = "") -> bool:
    """One job action per job and fault; False when this job was already handled for this fault."""
    actions = st.setdefault("job_actions", {})
    key = f"{job}@{fault}"
    if key in actions:
        return False
    actions[key] = {"job": str(job), "fault": fault, "stage": SIGNAL, "runner": runner, "note": note,
                    "detail": detail, "created": now, "deadline": None, "tries": 0, "next_try": 0.0,
                    "outcome": ""}
    return True


def add_requeue_fault(st: S.NodeStateData, r: C.CheckResult, now: float, jobs: Optional[List[str]]) -> str:
    """A "requeue"-policy XID (94, contained ECC): the GPU stays in service, its jobs restart. ``jobs``
    from the DCGM mapping, or None: every job running on the node, found when slurmctld answers."""
    fid = f"xid{r.evidence.get('xid')}-{r.gpu}-{now:.3f}"
    st.setdefault("requeue_faults", []).append({"id": fid, "reason": r.text, "since": now,
                                                "jobs": None if jobs is None else list(jobs)})
    for j in jobs or []:
        add_action(st, j, fid, result_note(r), now, detail=r.text)
    return fid


#: ``autoheal sbatch --spare-nodes`` jobs carry ``spares=`` in their runner comment: on a fault their runner
#: swaps the node for a spare inside the allocation (no requeue); the requeue after the grace stays as the
#: safety net, and finds the job gone from the node once the swap is made.
def mark_hot_spare(st: S.NodeStateData, key: str, runner_comment: str | bool | None,
                   marker: str = RUNNER_MARKER) -> None:
    """Note on a new job action that the job is a hot-spare job (its journal line says what comes).
    ``marker``: ``hooks.runner_comment``, which starts the comment of a runner job."""
    from autoheal.runner_comment import CommentState

    if runner_comment and CommentState.parse(str(runner_comment), marker).hot_spare:
        st["job_actions"][key]["hot_spare"] = True


def _hot_spare(action: S.JobAction) -> bool:
    return bool(action.get("hot_spare"))


def open_work(st: S.NodeStateData) -> bool:
    """Work in flight: a drain to make, jobs still to find or to signal/requeue."""
    return bool(st.get("pending_drain")
                or any(a.get("stage") != DONE for a in (st.get("job_actions") or {}).values())
                or any(f.get("jobs") is None for f in st.get("requeue_faults") or []))


def fingerprint(st: S.NodeStateData) -> Tuple[Any, ...]:
    """What, in the local state, should make xid-watch look at Slurm now when it changes (a drain
    recorded by the healthcheck, a new pending drain, a repair)."""
    d = st.get("drain") or {}
    ep = st.get("episode") or {}
    return (bool(st.get("pending_drain")), d.get("reason"), d.get("time"), ep.get("id"),
            tuple(sorted(k for k, a in (st.get("job_actions") or {}).items() if a.get("stage") != DONE)),
            sum(1 for f in st.get("requeue_faults") or [] if f.get("jobs") is None),
            bool(st.get("reboot_requested")))


def runner_state(comment: str, marker: str = RUNNER_MARKER) -> str:
    """``state=`` of a runner job comment ("" when absent); the user's part after `` | `` is not read
    (the core's comment model, ``autoheal.runner_comment``)."""
    from autoheal.runner_comment import CommentState

    return CommentState.parse(comment, marker).state


# ---- the reconciler ------------------------------------------------------------------------------------

class JobSide:
    """Drives pending drains and job actions to done. ``step()`` is called from xid-watch's loop."""

    def __init__(self, ctx: Context, count: Optional[Callable[[str], None]] = None,
                 rng: Optional[random.Random] = None) -> None:
        self.ctx = ctx
        self.h = ctx.hooks
        self._count = count or (lambda _name: None)
        self._rng = rng or random.Random()
        self._kept_foreign: Optional[C.CheckResult] = None  # the last pending drain kept someone else's drain
        now = time.time()
        # the first self-check of an idle node comes at a random point of the interval: nodes started
        # together (a cluster-wide restart) do not all ask slurmctld at once
        self.next_check = now + self._rng.uniform(0, self._interval())
        self.retry_at = 0.0
        self.tries = 0
        # a restart looks at Slurm at once only when the state has something on record
        self.seen_fp: Optional[Tuple[Any, ...]] = fingerprint(S.empty())
        self.last_forced = 0.0
        self.outage_noted = False
        self._t0 = time.monotonic()

    def _interval(self) -> float:
        return float(getattr(self.h, "xid_watch_self_check", 60.0))

    def step(self, now: Optional[float] = None, urgent: bool = False, force: bool = False) -> bool:
        """Look at Slurm if there is reason to; True when it did. ``urgent`` (a new fault XID) ignores
        the backoff; ``force`` (a repeated XID while a drain is on record) at most once a second."""
        from autoheal.errors import SlurmError, SlurmUnavailable

        now = time.time() if now is None else now
        st = self.ctx.store.read()
        fp = fingerprint(st)
        if not urgent:
            if now < self.retry_at:
                return False
            forced = force and now - self.last_forced >= 1.0
            if not (forced or fp != self.seen_fp or now >= self.next_check):
                return False
        if force:
            self.last_forced = now
        self._t0 = time.monotonic()
        try:
            mode, next_due = self.check(now)
        except SlurmUnavailable as exc:
            self._failed(now)
            if not self.outage_noted and open_work(self.ctx.store.read()):
                self.outage_noted = True
                self.ctx.record(Event.ERROR, check="xid", action="retry", outcome="waiting for slurmctld",
                                severity="error", message=f"slurmctld does not answer ({exc}); the drain and "
                                "the job actions stay pending and are retried with backoff until done")
            return True
        except SlurmError as exc:  # an answer we cannot use (parse error, node unknown): back off, say it
            self._failed(now)
            if self.tries == 1 or self.tries % 60 == 0:  # not every 10 s for as long as it lasts
                print(f"xid-watch: slurm: {exc}; retrying with backoff (attempt {self.tries})", file=sys.stderr,
                      flush=True)
            return True
        if self.outage_noted:
            self.outage_noted = False
            self.ctx.record(Event.RETRY, check="xid", action="retry", outcome="slurmctld answers again",
                            severity="info", message="slurmctld answers again: pending drain and job actions "
                            "resumed")
        self.tries = 0
        self.retry_at = 0.0
        self.seen_fp = fingerprint(self.ctx.store.read())
        slow = now + self._interval() * self._rng.uniform(0.75, 1.25)
        if mode == QUIET:
            self.next_check = slow
        elif mode == WAITING:  # only deadlines to wait for: no need to ask Slurm before them
            self.next_check = max(now + 0.2, min(next_due, slow))
        else:
            self.next_check = now + FAST_SECONDS
        return True

    def _failed(self, now: float) -> None:
        self.tries += 1
        self.retry_at = now + backoff(self.tries)
        self.next_check = self.retry_at
        self.seen_fp = fingerprint(self.ctx.store.read())
        self._count("slurm_errors_total")

    # ---- one look at Slurm ---------------------------------------------------------------------------
    def check(self, now: float) -> Tuple[Mode, float]:
        """Drain if pending, follow the node's drain (open/close the fault episode), find the jobs still
        running, and move every due job action on. Returns (QUIET / WAITING / BUSY, when the next
        action is due). Raises SlurmUnavailable: the caller backs off and calls again."""
        node_name = self.ctx.node
        ours = self._drain_pending(now)
        node = self.ctx.slurm.get_node(node_name)
        drained = node.drain or node.down
        closed = None
        redrain = False
        # A pre-emptive swap's drain is not a fault: the job runs on and its runner swaps the node at the
        # next checkpoint. Seen while an older fault's episode is still open, the node was resumed in
        # between (faster than this loop looked): that episode is over, its jobs must not be signalled.
        from autoheal.reasons import is_preswap

        fault_drain = drained and not (ours is None and is_preswap(node.reason))
        with self.ctx.store.locked() as st:
            missed = self._end_missed_episode(st) if fault_drain else None
            ep, closed, redrain = self._follow_drain(st, node, ours, fault_drain, now)
            unresolved = [f for f in st.get("requeue_faults") or [] if f.get("jobs") is None]
        if missed is not None:
            self.ctx.record(Event.RESUME, check="xid", action="job-side", outcome="fault over", severity="info",
                            message=f"{node_name} was back in service and is drained for a new fault: the "
                            "earlier fault episode closed" + (f"; {missed} pending job action(s) dropped"
                                                              if missed > 0 else ""))
        if redrain:  # at once, before the scheduler hands the node a job
            self.ctx.record(Event.DETECTION, check="xid", action="drain", outcome="after someone else's drain",
                            severity="info", message=f"{node_name}: the drain our fault waited behind has ended")
            return self.check(now)
        if closed is not None:
            self.ctx.record(Event.RESUME, check="xid", action="job-side", outcome="fault over", severity="info",
                            message=f"{node_name} is back in service: fault episode closed"
                            + (f"; {closed} pending job action(s) dropped" if closed > 0 else ""))
        settling = False
        if (ep and not node.drained) or unresolved:
            settling = self._find_jobs(node, drained, now)
        next_due = self._process(now)
        with self.ctx.store.locked() as st:
            self._prune(st)
            pend = st.get("pending_drain")
            work = open_work(st)
        if pend:
            next_due = min(next_due, float(pend.get("next_try", 0)))
        if settling:
            return BUSY, now + FAST_SECONDS
        return (WAITING if work else QUIET), next_due

    def _follow_drain(self, st: S.NodeStateData, node: Node, ours: Optional[C.CheckResult], fault_drain: bool,
                      now: float) -> Tuple[Optional[S.Episode], Optional[int], bool]:
        """Open the fault episode on a fault drain, close it once the node is back in service (a drain
        our fault waited behind has ended: drain for it now). (the episode, job actions dropped by a
        close or None, drain again now)."""
        closed, redrain = None, False
        ep = st.get("episode")
        if fault_drain and (ep or ours is not None or is_health_reason(node.reason)):
            if not ep:
                reason = ours.text if ours is not None else node.reason
                ep = st["episode"] = {"id": f"drain-{now:.3f}", "since": now, "reason": reason}
                opened = (st.get("drain") or {}).get("opened")
                if opened:
                    ep["drain_opened"] = float(opened)
            if ours is not None and self._kept_foreign is ours:
                ep["under_foreign"] = ours.to_dict()
                ep.setdefault("under_foreign_at", now)
        elif not fault_drain and ep:
            closed = self._close_episode(st, ep, now)
            kept = ep.get("under_foreign")
            if kept and not _repaired_since(st, kept, ep.get("under_foreign_at")):
                # The fault came while someone else's drain (an admin's maintenance) was on the node, and
                # that drain has ended: their resume says nothing of our fault, so drain for it now. Closing
                # the episode alone put the node back in service with the fault, and the scheduler gave it
                # a job before the next check (CI soak seed 12: a DBE, a hot-spare job that gave up).
                request_drain(st, C.CheckResult.from_dict(kept), now)
                redrain = True
            ep = None
        elif not (node.drain or node.down) and st.get("reboot_requested"):
            # back in service after our reboot (Slurm's nextstate=resume): that repair is done
            st["reboot_requested"] = None
            S.mark_repaired(st, None, now)
        return ep, closed, redrain

    def _end_missed_episode(self, st: S.NodeStateData) -> Optional[int]:
        """The open episode belongs to an earlier drain than the one on record: the node was back in service
        (resumed, rebooted) and drained again for a new fault between two looks of this loop. That episode
        is over; its job actions go (the new fault's episode gives the jobs still running the new fault's
        signal and comment). Kept, the new fault's jobs were told the old one (lab: a grace signal "after:
        xid 48 ... double-bit ECC" on a node drained for XID 74). Returns the actions dropped, or None when
        the episode stands. An episode or record from before ``opened`` existed is never judged stale.
        The repair itself is not marked here: its moment is unknown, and marking it now would end the
        dedupe window of the XID that made the new drain."""
        ep = st.get("episode")
        opened = (st.get("drain") or {}).get("opened")
        if not ep or not ep.get("drain_opened") or not opened or float(opened) == float(ep["drain_opened"]):
            return None
        actions = st.get("job_actions") or {}
        mine = [k for k, a in actions.items() if a.get("fault") == ep.get("id")]
        dropped = sum(1 for k in mine if actions[k].get("stage") != DONE)
        for k in mine:
            actions.pop(k)
        st["episode"] = None
        st["foreign_noted"] = {}
        return dropped

    def _find_jobs(self, node: Node, drained: bool, now: float) -> bool:
        """The jobs still running on the node get their job action (the episode's, a requeue fault's
        whose jobs were not known yet). True while a job is still starting or ending (look again soon)."""
        node_name = self.ctx.node
        jobs = self.ctx.slurm.list_jobs(node=node_name)
        running = [j for j in jobs if j.state == "RUNNING" and node_name in j.nodes]
        # a job still starting (prolog, CONFIGURING) becomes RUNNING in a moment: look again soon
        settling = any(j.state in ("CONFIGURING", "COMPLETING") for j in jobs) or "COMPLETING" in node.flags
        with self.ctx.store.locked() as st:
            ep = st.get("episode")
            if ep and drained:
                note = requeue_note(ep.get("reason", ""))
                for j in running:
                    if add_action(st, j.job_id, ep["id"], note, now, self._is_runner(j), ep.get("reason", "")):
                        mark_hot_spare(st, f"{j.job_id}@{ep['id']}", self._is_runner(j) and j.comment,
                                       self.h.runner_comment)
            for f in st.get("requeue_faults") or []:
                if f.get("jobs") is None:
                    f["jobs"] = [j.job_id for j in running]
                    for j in running:
                        add_action(st, j.job_id, f["id"], requeue_note(f.get("reason", "")), now,
                                   self._is_runner(j), f.get("reason", ""))
        return settling

    def _now(self, now: float) -> float:
        """``now`` of this step plus the real time the step has taken so far."""
        return now + max(0.0, time.monotonic() - self._t0)

    def _is_runner(self, job: Job) -> bool:
        return bool(job.comment) and job.comment.startswith(self.h.runner_comment)

    def _drain_pending(self, now: float) -> Optional[C.CheckResult]:
        """Make the pending drain (ownership rules of drain_for). Returns the fault once it is dealt
        with (drained, already ours, or someone else's drain kept), else None."""
        from autoheal.errors import SlurmError, SlurmUnavailable
        from autoheal.hooks.engine import drain_for

        pend = self.ctx.store.read().get("pending_drain")
        if not pend or now < float(pend.get("next_try", 0)):
            return None
        failure = C.CheckResult.from_dict(pend.get("failure") or {})
        try:
            act = drain_for(self.ctx, failure)
        except SlurmUnavailable:
            raise
        except SlurmError as exc:  # refused (not unreachable): say it once, keep trying, slowly
            with self.ctx.store.locked() as st:
                p = st.get("pending_drain") or {}
                p["tries"] = int(p.get("tries", 0)) + 1
                p["next_try"] = now + backoff(p["tries"], 60.0)
                first = p["tries"] == 1
            if first:
                self.ctx.record(Event.ERROR, check=failure.check, action="drain", severity="error",
                                message=f"cannot drain for {failure.text}: {exc}; retrying")
            return None
        drained = act.outcome in ("drained", "reason-updated")
        from autoheal import nodeops

        # kept someone else's drain: the fault stays ours to drain when theirs ends (see check)
        self._kept_foreign = failure if act.outcome == nodeops.SKIPPED_FOREIGN else None
        with self.ctx.store.locked() as st:
            st["pending_drain"] = None
            if drained and pend.get("since"):  # fault seen -> drain made (the dashboard's "fault -> drain")
                S.observe(st, "fault_to_drain_seconds", max(0.0, time.time() - float(pend["since"])))
        if drained:
            self._count("drains_total")
        return failure

    def _close_episode(self, st: S.NodeStateData, ep: S.Episode, now: float) -> int:
        """The node is back in service (resumed after passes, by an admin, by Slurm after our reboot):
        the fault is over, its repair ends the XID dedupe window, open job actions of it are dropped."""
        actions = st.get("job_actions") or {}
        dropped = [k for k, a in actions.items() if a.get("fault") == ep.get("id") and a.get("stage") != DONE]
        for k in list(actions):
            if actions[k].get("fault") == ep.get("id"):
                actions.pop(k)
        st["episode"] = None
        st["reboot_requested"] = None
        st["foreign_noted"] = {}
        S.mark_repaired(st, None, now)
        # a return to service for the lemon history (hooks.lemon), also the one after our reboot, which the
        # healthcheck alone did not note on the lab (tests/integration/test_lemon_lab.py goes around it)
        from autoheal.hooks import lemon

        lemon.note_return(st, now, "back in service (seen by xid-watch)")
        return len(dropped)

    def _prune(self, st: S.NodeStateData) -> None:
        """Done actions of faults that are over go; a requeue fault goes once all its jobs are done."""
        actions = st.get("job_actions") or {}
        ep_id = (st.get("episode") or {}).get("id")
        faults = st.get("requeue_faults") or []
        keep_faults = []
        for f in faults:
            mine = [a for a in actions.values() if a.get("fault") == f["id"]]
            if f.get("jobs") is None or any(a.get("stage") != DONE for a in mine):
                keep_faults.append(f)
        st["requeue_faults"] = keep_faults
        live = {f["id"] for f in keep_faults} | ({ep_id} if ep_id else set())
        for k in list(actions):
            a = actions[k]
            if a.get("fault") not in live and a.get("stage") == DONE:
                actions.pop(k)

    # ---- job actions ---------------------------------------------------------------------------------
    def _process(self, now: float) -> float:
        """Move every due action on; returns when the next one is due (inf when none waits)."""
        st = self.ctx.store.read()
        next_due = float("inf")
        for key, a in sorted((st.get("job_actions") or {}).items(), key=lambda kv: kv[1].get("created", 0)):
            if a.get("stage") == DONE:
                continue
            due = float(a.get("next_try") or 0)
            if a.get("stage") == GRACE:
                due = max(due, float(a.get("deadline") or 0))
            if now < due:
                next_due = min(next_due, due)
                continue
            self._advance(key, a, now)
            b = self.ctx.store.read().get("job_actions", {}).get(key)
            if b and b.get("stage") != DONE:
                nd = float(b.get("next_try") or 0)
                if b.get("stage") == GRACE:
                    nd = max(nd, float(b.get("deadline") or 0))
                next_due = min(next_due, max(nd, now + 0.2))
        return next_due

    def _update(self, key: str, **changes: Any) -> None:
        with self.ctx.store.locked() as st:
            a = st.setdefault("job_actions", {}).get(key)
            if a is not None:
                a.update(cast("S.JobAction", changes))

    def _advance(self, key: str, a: S.JobAction, now: float) -> None:
        stage = a.get("stage")
        if stage == SIGNALLING:
            # a restart found a signal that may have gone out: never send it twice, keep the requeue
            end = float(a.get("signalled_at", now)) + self.h.grace_seconds
            if a.get("runner") is False and not a.get("requested"):  # hooks.grace_signal went out: look now
                self._update(key, stage=GRACE, deadline=min(end, now), fallback=True, grace_end=end)
            else:
                self._update(key, stage=GRACE, deadline=end)
            return
        if stage == SIGNAL:
            self._signal(key, a, now)
        elif stage == GRACE:
            self._requeue(key, a, now)

    def _signal(self, key: str, a: S.JobAction, now: float) -> None:
        from autoheal.errors import SlurmError, SlurmUnavailable

        job = a["job"]
        runner = a.get("runner")
        requested = a.get("requested")  # None: not looked up yet; "": the job asked for no signal
        if runner is None or (not runner and requested is None):
            found = self._look_up(key, job, runner)
            if found is None:
                return  # gone or no longer here: done
            runner, requested = found
        elif self._where(key, job) is None:
            # looked up on an earlier pass (a restart, slurmctld down when the signal was due): the job may
            # have requeued itself since and run elsewhere; a late signal there would checkpoint and
            # requeue a healthy run again
            return
        warn = None if runner else _warning(requested)
        if not runner and warn is None and _sig(self.h.grace_signal) == "TERM":
            # SIGTERM is what `scontrol requeue` sends itself, KillWait seconds before SIGKILL: requeue at
            # once and let Slurm's kill sequence be the grace (a job that exits on SIGTERM would otherwise
            # end before it could be requeued)
            self._update(key, stage=GRACE, deadline=now)
            self._requeue(key, cast("S.JobAction", dict(a, runner=runner, stage=GRACE, deadline=now)), now)
            return
        if runner and not self._runner_up(key, a, job, now):
            return
        sig, batch, to = self._which_signal(a, bool(runner), warn)
        self._update(key, stage=SIGNALLING, signalled_at=now)
        try:
            if warn is not None:
                self.ctx.slurm.signal_job(job, "CONT", batch=batch)
            self.ctx.slurm.signal_job(job, sig, batch=batch)
        except SlurmUnavailable:
            self._update(key, stage=SIGNAL)  # not sent: send it when slurmctld answers
            raise
        except SlurmError as exc:
            if _finished(exc):
                self._update(key, stage=DONE, outcome="finished before the signal")
                return
            # could not signal (refused): the requeue after the grace still comes
            self.ctx.record(Event.ERROR, job_ids=[job], check="xid", action="signal", severity="error",
                            message=f"job {job}: grace signal {sig} failed: {exc}; requeue in "
                            f"{self.h.grace_seconds:g}s if it still runs here")
            self._update(key, stage=GRACE, deadline=now + self.h.grace_seconds)
            return
        self._signalled(key, a, sig, to, fallback=not runner and warn is None, now=now)

    def _which_signal(self, a: S.JobAction, runner: bool, warn: Optional[WarnSignal]) -> Tuple[str, bool, str]:
        """(signal, to the batch shell only?, to whom, for the journal) for the job of action ``a``."""
        if runner and _hot_spare(a):
            return (_sig(self.h.runner_signal), True,
                    "batch shell; a hot-spare job: the runner swaps the node for a spare inside the allocation")
        if runner:
            return _sig(self.h.runner_signal), True, "batch shell, the runner requeues itself"
        if warn is not None:
            # the job's own --signal, delivered as Slurm delivers it near the time limit
            # (send_job_warn_signal): SIGCONT first, then the signal, with B: to the batch shell only,
            # else to every step but the batch shell. The framework checkpoints and requeues itself.
            return (warn.signal, warn.batch, f"the job's own --signal={warn.spec}: "
                    + ("batch shell only" if warn.batch else "every step, not the batch shell"))
        # the job asked for nothing: hooks.grace_signal to its steps, never to the batch shell
        # (a shell without a trap dies of USR1/USR2 and the job ends FAILED, not requeued)
        return (_sig(self.h.grace_signal), False,
                "hooks.grace_signal, every step, not the batch shell; the job asked for no signal")

    def _signalled(self, key: str, a: S.JobAction, sig: str, to: str, fallback: bool, now: float) -> None:
        """The signal went out: the grace starts now (not when this look at Slurm began: a slow or
        just-restarted slurmctld can make that many seconds)."""
        job = a["job"]
        sent = self._now(now)
        if fallback:
            # hooks.grace_signal to a job that asked for nothing: a step without a handler dies of it
            # (USR1, HUP, ...), and a batch script ending on that step ends FAILED within the grace.
            # Look again every FAST_SECONDS: such a job is requeued as soon as it has ended (issue 15)
            self._update(key, stage=GRACE, fallback=True, grace_end=sent + self.h.grace_seconds,
                         deadline=sent + min(FAST_SECONDS, self.h.grace_seconds))
        else:
            self._update(key, stage=GRACE, deadline=sent + self.h.grace_seconds)
        self._count("signals_total")
        self.ctx.record(Event.SIGNAL, job_ids=[job], check="xid", action="signal", outcome=sig, severity="action",
                        message=f"job {job}: grace signal {sig} ({to}) after: {a.get('detail') or a.get('note', '')}; "
                        f"requeue in {self.h.grace_seconds:g}s if it still runs here")

    def _runner_up(self, key: str, a: S.JobAction, job: str, now: float) -> bool:
        """The runner's grace signal goes to the batch shell, which dies of it until the runner has set
        its handlers (a job, say an array task, that just started). The runner says it is up with
        ``state=running`` in the comment: until then wait (1 s steps); if it never says so within the
        grace, requeue without a signal (nothing ran long enough to checkpoint)."""
        from autoheal.errors import SlurmNotFound

        try:
            info = self.ctx.slurm.get_job(job)
        except SlurmNotFound:
            self._update(key, stage=DONE, outcome="gone")
            return False
        from autoheal.runner_comment import RunnerState

        if runner_state(info.comment, self.h.runner_comment) == RunnerState.RUNNING:
            return True
        if not (info.running and self.ctx.node in info.nodes):
            self._update(key, stage=DONE, outcome=f"not running here ({info.state})")
            return False
        if now - float(a.get("created") or now) < self.h.grace_seconds:
            self._update(key, next_try=now + 1.0)
            return False
        self._update(key, stage=GRACE, deadline=now, note=a.get("note") or "")
        self._requeue(key, cast("S.JobAction", dict(a, stage=GRACE, deadline=now)), now)
        return False

    def _where(self, key: str, job: str) -> Optional[Job]:
        """The job, when it still runs on this node; None (and the action done) when it is gone or runs
        elsewhere. SlurmUnavailable propagates: the action stays in its stage and is tried again."""
        from autoheal.errors import SlurmNotFound

        try:
            info = self.ctx.slurm.get_job(job)
        except SlurmNotFound:
            self._update(key, stage=DONE, outcome="gone")
            return None
        if not (info.running and self.ctx.node in info.nodes):
            self._update(key, stage=DONE, outcome=f"not running here ({info.state})")
            return None
        return info

    def _look_up(self, key: str, job: str, runner: Optional[bool]) -> Optional[Tuple[bool, str]]:
        """(runner?, the job's requested warning as ``B:USR2@90`` or "") for a job about to be signalled;
        None (and the action done) when the job is gone or no longer runs here. SlurmUnavailable
        propagates: the action stays in its signal stage and is tried again."""
        from autoheal.errors import SlurmError, SlurmUnavailable
        from autoheal.slurm.parse import requested_signal

        info = self._where(key, job)
        if info is None:
            return None
        if runner is None:
            runner = self._is_runner(info)
        requested = ""
        if not runner:
            script = ""
            read = getattr(self.ctx.slurm, "batch_script", None)
            if read is not None:
                try:
                    script = read(job)
                except SlurmUnavailable:
                    raise
                except SlurmError:
                    # not a batch job, a backend that cannot read scripts: the submit line (23.02+) and
                    # then hooks.grace_signal decide
                    script = ""
            warn = requested_signal(info.submit_line, script, info.command)
            requested = warn.spec if warn is not None else ""
        self._update(key, runner=runner, requested=requested)
        return runner, requested

    def _requeue(self, key: str, a: S.JobAction, now: float) -> None:
        from autoheal.errors import SlurmError, SlurmNotFound, SlurmUnavailable

        job = a["job"]
        if not self.h.requeue_jobs:
            self._update(key, stage=DONE, outcome="requeue off (hooks.requeue_jobs = false)")
            return
        try:
            info = self.ctx.slurm.get_job(job)
        except SlurmNotFound:
            self._update(key, stage=DONE, outcome="gone")
            return
        note = a.get("note") or requeue_note("")
        ended_on_signal = False
        if a.get("fallback") and self.ctx.node in info.nodes:
            # it ended after hooks.grace_signal (died of it, or checkpointed and exited): requeue the
            # finished batch job, as Slurm requeues a preempted one, so it never ends FAILED here
            ended_on_signal = info.state in ENDED_ON_SIGNAL
            if not ended_on_signal and self._still_in_grace(key, a, info, now):
                return
        if not ended_on_signal and not (info.running and self.ctx.node in info.nodes):
            self._no_longer_here(key, a, info, note)
            return
        try:
            if not self._is_runner(info):
                try:
                    self.ctx.slurm.set_job_comment(job, note)
                except SlurmUnavailable:
                    raise
                except SlurmError:
                    pass  # the comment is for the user; the requeue matters
            self._update(key, requeue_tried=now)
            self.ctx.slurm.requeue(job)
        except SlurmUnavailable:
            raise
        except SlurmError as exc:
            self._requeue_refused(key, a, exc, now)
            return
        outcome = f"requeued after it ended {info.state} on the grace signal" if ended_on_signal else "requeued"
        self._update(key, stage=DONE, outcome=outcome)
        self._count("requeues_total")
        self.ctx.record(Event.REQUEUE, job_ids=[job], check="xid", action="requeue", outcome=outcome,
                        message=note, severity="action")

    def _still_in_grace(self, key: str, a: S.JobAction, info: Job, now: float) -> bool:
        """A job that got hooks.grace_signal is still ending, or running within its grace: look again
        soon (True) instead of requeueing it now."""
        if info.state == "COMPLETING" and now < float(a.get("grace_end") or 0) + ENDING_WAIT:
            self._update(key, deadline=now + FAST_SECONDS)  # ending: requeue it once it has ended
            return True
        if info.running and now < float(a.get("grace_end") or 0):
            self._update(key, deadline=min(float(a["grace_end"]), now + FAST_SECONDS))
            return True
        return False

    def _no_longer_here(self, key: str, a: S.JobAction, info: Job, note: str) -> None:
        """The job does not run here any more: our late-answered requeue, or it ended or moved itself."""
        if a.get("requeue_tried"):
            # our requeue went out while slurmctld was slow to answer and it took it after all
            self._update(key, stage=DONE, outcome="requeued (slurmctld answered late)")
            self._count("requeues_total")
            self.ctx.record(Event.REQUEUE, job_ids=[a["job"]], check="xid", action="requeue", severity="action",
                            outcome="requeued (slurmctld answered late)", message=note)
            return
        # finished, or requeued itself (the runner, a framework): nothing left to do here
        self._update(key, stage=DONE, outcome=f"no longer runs here ({info.state})")

    def _requeue_refused(self, key: str, a: S.JobAction, exc: Exception, now: float) -> None:
        """Slurm refused the requeue: done when the job ended; given up when refused for good (or too
        often); else tried again after a backoff."""
        if _finished(exc):
            self._update(key, stage=DONE, outcome="already requeued or finished")
            return
        tries = int(a.get("tries", 0)) + 1
        if tries >= MAX_REFUSALS or _requeue_disabled(exc):
            self._update(key, stage=DONE, outcome=f"requeue refused: {exc}", tries=tries)
            self.ctx.record(Event.ERROR, job_ids=[a["job"]], check="xid", action="requeue", severity="error",
                            message=f"job {a['job']}: requeue refused by Slurm ({exc}); it keeps running on the "
                            f"drained node {self.ctx.node}")
            return
        self._update(key, tries=tries, next_try=now + backoff(tries, 30.0), requeue_tried=None)


def _sig(name: str) -> str:
    """``SIGUSR2`` / ``usr2`` / ``12`` -> ``USR2`` (what scancel takes); the config checked it is one."""
    from autoheal.signals import signal_name

    return signal_name(name)


def _warning(spec: Optional[str]) -> Optional[WarnSignal]:
    """The WarnSignal a job asked for, from the spec kept in its action; None for none."""
    from autoheal.slurm.parse import parse_signal_spec

    return parse_signal_spec(spec) if spec else None


def _finished(exc: Exception) -> bool:
    """The job is past what we wanted to do to it: finished, already pending again (requeued itself or
    by someone else), or gone."""
    from autoheal.errors import SlurmJobAlreadyPending, SlurmJobFinished, SlurmNotFound

    return isinstance(exc, (SlurmJobFinished, SlurmJobAlreadyPending, SlurmNotFound))


def _requeue_disabled(exc: Exception) -> bool:
    from autoheal.errors import SlurmRequeueDisabled

    return isinstance(exc, SlurmRequeueDisabled)


def _repaired_since(st: S.NodeStateData, kept: C.ResultDict, since: Optional[float]) -> bool:
    """Pure: the GPU of a fault kept behind someone else's drain was repaired on record after
    the fault was kept (a reset of that GPU): the fault is gone, draining for
    it again took a healthy node out (CI soak seed 12: Slurm's "Duplicate jobid" drain, a DBE on GPU 2 kept
    behind it, the prolog's drain, the healthcheck's reset and resume; xid-watch then drained gpu3 again
    for the DBE the reset had cleared, and it stayed drained). No time on record (older state): not known;
    a node-wide fault is never taken as repaired here (the node's return to service is their resume)."""
    if since is None:
        return False
    gpu = kept.get("gpu")
    if not isinstance(gpu, int) or isinstance(gpu, bool):
        return False  # node-wide: the node's own "repair" may be just their resume, which says nothing of it
    # the GPU's own repair only (its reset): the node's return to service is their resume, not a repair
    return float((st.get("repaired") or {}).get(S.ladder_key(gpu), 0) or 0) > float(since)
