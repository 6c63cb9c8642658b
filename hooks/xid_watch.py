"""``autoheal xid-watch``: the node daemon that turns a drain-class XID into a drain within seconds.

Two sources feed one queue: NVML XID events (``nvmlEventSetWait_v2`` with a short timeout, in a
loop) and the kernel log (``/dev/kmsg`` or a file, followed from the cursor kept in the node state).
Each XID is judged once (shared dedupe with the healthcheck and prolog/epilog, across restarts; a
repair of the GPU ends the dedupe window, so a fault that comes back is acted on at once). On a
drain-class XID the daemon drains the node first (``autoheal.nodeops`` ownership rules), then journals
and notifies (in the background: healing never waits for a webhook).

The job side is level-triggered (``autoheal.hooks.jobside``): whoever drained the node for a hardware
fault, every job still running on it gets its grace signal and, if it still runs after
``hooks.grace_seconds``, a requeue, exactly once per job and fault, retried with backoff while
slurmctld does not answer. NVML errors are counted and retried with backoff; counters go to a
node-exporter textfile.

A third source polls the NVML health state every ``hooks.xid_watch_health_poll`` seconds (default 5, 0
off) with the healthcheck's own reads (``gather``) and checks (``checks.judge_sample``), and acts at once
on the hard faults that raise no XID event (see ``HARD_CHECKS``), through the same drain and job side as
an XID; everything else is left to the healthcheck, which then finds the node drained by us and climbs
the recovery ladder as after an XID drain.
"""

from __future__ import annotations

import os
import queue
import signal as _signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Final, List, Optional, Tuple

from autoheal.atomicfile import write_atomic
from autoheal.events import Event
from autoheal.hooks import checks as C
from autoheal.hooks import jobside, xid_jobs
from autoheal.hooks import state as S
from autoheal.hooks.xids import LogCursor, XidEvent, read_kernel_log

if TYPE_CHECKING:
    from autoheal.hooks.context import Context
    from autoheal.hooks.engine import Note

METRICS_FILE = "autoheal_xid_watch.prom"
#: Seconds between rewrites of the textfile when nothing changed: its heartbeat line is how Prometheus
#: tells a live daemon from a file a dead one left behind (the xid-watch-stale alert allows 6 missed beats).
HEARTBEAT_SECONDS = 5.0

#: The checks the health poll acts on at once. Each reads a state the GPU does not leave by itself and
#: that breaks the job running on it now: an uncorrectable ECC count (only a reset clears it), a row
#: remap that failed or more retired pages than allowed (bad memory), a GPU fallen off the bus, an
#: NVLink link down (collectives fail or hang), a recovery action NVML asks for. One failing sample is
#: the fault; a drain seconds earlier than the healthcheck's is the gain. Left to the healthcheck (its
#: HealthCheckInterval is their "several samples" filter, and a drain for them is not urgent):
#: temperature and clock events (a thermal blip cools down; a throttled job is slow, not wrong), PCIe
#: (the link generation drops with the power state, a width change may be retrained), a row remap or
#: page retirement *pending* a reset (the memory is already fenced off; the reset can wait for the
#: healthcheck, and the prolog keeps new jobs off the GPU), persistence, and the node-wide driver and
#: GPU count. A reading NVML could not give (timeout, unknown, library error) is never FAIL in the
#: checks, so it never drains from here either (the healthcheck escalates persistent unknowns).
HARD_CHECKS = frozenset({"ecc", "remapped-rows", "retired-pages", "gpu-lost", "nvlink", "recovery-action"})
#: Evidence that makes a failing result of a hard check a pending-reset one, left to the healthcheck.
PENDING_EVIDENCE = ("remap_pending", "retired_pending")

#: Seconds a new hard fault waits before the poll acts on it: most such faults come with an XID (DBE:
#: 48, remap failure: 64, NVLink: 74), which the XID path turns into a drain within this time; the poll
#: then finds the node drained by us and adds no second drain reason and no second detection record.
XID_SETTLE_SECONDS = 1.0

#: Node-state key of the faults the health poll has already acted on (``"<check>:<gpu>"`` -> reason,
#: since): one detection record per fault, not one per poll.
POLLED: Final = "polled_faults"


def hard_failures(results: List[C.CheckResult]) -> List[C.CheckResult]:
    """The failing results of ``HARD_CHECKS`` (never an unknown, a warning, a soft check or a repair
    that is only pending)."""
    return [r for r in results if r.status == C.FAIL and r.check in HARD_CHECKS
            and not any(r.evidence.get(k) for k in PENDING_EVIDENCE)]


#: Seconds after a sample's reads began within which a repair on record makes that sample stale. A
#: sample is in flight for a read budget, the settle moment and a turn of the main loop: seconds. The bound
#: is for a wall clock stepped back (NTP) past a repair time: samples read after the step look older than
#: that repair, and without it the poll would ignore every sample until the clock caught up again.
STALE_SAMPLE_WINDOW = 300.0

#: Seconds between tries to add a GPU that NVML could not register (lost at the time) to the event set:
#: an XID it raises after it came back and before the next try is never told by NVML (one NVML call per
#: missing GPU a second; a lost GPU answers at once).
REREGISTER_SECONDS = 1.0
#: Seconds before an event set that says GPU_IS_LOST at its first wait is rebuilt (a lost GPU NVML let us
#: register would otherwise spin the loop). A set that waited once is rebuilt at once: the other GPUs'
#: XIDs raised until the new set is registered are never told (repro: an XID 48 on GPU 4 0.3 s after an
#: XID 79 on GPU 2 was lost to NVML while the loop paused a second before rebuilding).
LOST_REBUILD_PAUSE = 1.0


def sample_predates_repair(st: S.NodeStateData, gpu: Optional[int], taken: float) -> bool:
    """Pure: a health sample of ``gpu`` (None: node-wide) whose reads began at ``taken`` (wall clock) was
    read before the node's last return to service or that GPU's last repair on record (``state.repaired_at``:
    a reset, Slurm's resume after our reboot, an admin's resume, an admin clear; marked by whichever hook
    saw it first, so never before it happened). Such a sample says nothing about the GPU now: acted on
    after the repair, it drained a node the repair had just fixed (CI: the lab's reboot cleared the faults
    of gpu3 and Slurm resumed it; xid-watch's poll had read the DBE count just before and drained the node
    again ~20 ms after its return, for a replacement). The next poll reads the GPU afresh: a fault that is
    really still there is acted on one poll later."""
    repaired = S.repaired_at(st, gpu)
    return taken < repaired <= taken + STALE_SAMPLE_WINDOW


def poll_decision(st: S.NodeStateData, results: List[C.CheckResult], read_ok: List[int],
                  now: float, taken: Optional[float] = None) -> Tuple[List[C.CheckResult], bool]:
    """Pure: what one health poll does to the node state ``st``. Returns (the hard faults new since the
    last poll, whether to drain for them). ``taken``: when the sample's reads began (default ``now``).

    A sample read before the last repair of a GPU (or the node's last return to service) is dropped for
    that GPU (``sample_predates_repair``): it neither raises a fault nor forgets one.

    A fault is new unless the poll already acted on it (same check and GPU) after the GPU's last repair
    (``state.repaired_at``: a reset, reboot, resume or admin clear ends it, as it ends the XID dedupe
    window). A remembered fault is forgotten once its GPU reads cleanly without it (``read_ok``: the
    GPUs the poll read in full); a GPU not read keeps what is remembered. New faults on a node that is
    already drained by us, or about to be (a pending drain), are only remembered: the healthcheck owns
    that node's recovery, nothing new is journalled or drained."""
    mem = st.setdefault(POLLED, {})
    taken = now if taken is None else taken
    hard = [r for r in hard_failures(results) if not sample_predates_repair(st, r.gpu, taken)]
    read_ok = [g for g in read_ok if not sample_predates_repair(st, g, taken)]
    keys = {f"{r.check}:{r.gpu}" for r in hard}
    for key in list(mem):
        gpu = mem[key].get("gpu")
        if key not in keys and gpu in read_ok:
            del mem[key]
    new: List[C.CheckResult] = []
    for r in hard:
        key = f"{r.check}:{r.gpu}"
        seen = mem.get(key)
        if seen is not None and float(seen.get("since", 0)) >= S.repaired_at(st, r.gpu):
            continue
        mem[key] = {"check": r.check, "gpu": r.gpu, "reason": r.text, "since": now}
        new.append(r)
    drain = bool(new) and not (st.get("drain") or st.get("pending_drain"))
    return new, drain


@dataclass(frozen=True)
class PolledSample:
    """One health poll handed from the poll thread to the main loop: its results, the GPUs it read in
    full, when it was judged (``seen``) and when its reads began (``taken``, wall clock both)."""

    results: List[C.CheckResult]
    read_ok: List[int]
    seen: float
    taken: float


def recovery_changed(results: List[C.CheckResult]) -> bool:
    """An XID among ``results`` leaves the decision to NVML's GPU recovery action (XID 154, and the
    fallback for XIDs the catalog does not know): the action is to be read now."""
    return any(r.check == "xid" and r.evidence.get("decided_by") == "recovery-action" for r in results)


def _event_of(events: List[XidEvent], r: C.CheckResult) -> XidEvent:
    """The event a result was judged from (same XID, same GPU when known)."""
    xid = r.evidence.get("xid")
    for ev in events:
        if ev.xid == xid and (ev.gpu is None or ev.gpu == r.gpu):
            return ev
    return XidEvent(xid=int(xid or 0))


class XidWatch:
    """One daemon for one node. ``run()`` blocks until ``stop()``."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.h = ctx.hooks
        self.q: queue.Queue[XidEvent] = queue.Queue()
        self._stop = threading.Event()
        self._metrics_dirty = True
        self._metrics_error = ""
        self._metrics_written = 0.0  # monotonic time of the last textfile write (heartbeat)
        # health polls finished since the start, and when the last one began (wall clock), in memory only
        # (a healthy poll writes nothing): the textfile shows them, so a stalled poll thread is visible
        # and a test can wait for polls that read the GPUs after it changed them
        self.health_polls = 0
        self.health_poll_started = 0.0
        # GPUs whose XID events the current NVML event set receives (0 between sets): the textfile shows
        # it, so a set without a GPU is visible and a test can wait until NVML is watched
        self.nvml_gpus = 0
        self._nvml_said: Optional[Tuple[List[int], List[int]]] = None  # the GPUs the last log line named
        self.jobs = jobside.JobSide(ctx, count=self._count)
        self.proc = xid_jobs.PROC  # where processes are looked up (tests point it at a fake /proc)
        self._retries: Dict[XidEvent, int] = {}
        # health-poll results, handed from the poll thread to the main loop (which alone runs the job side)
        self.polls: queue.Queue[PolledSample] = queue.Queue()
        # set by an XID whose policy leaves the decision to NVML's recovery action (XID 154 "GPU recovery
        # action changed"): the health poll reads it now, not at its next interval
        self.poll_now = threading.Event()

    def stop(self, *_args: object) -> None:
        self._stop.set()
        self.poll_now.set()  # a health poll waiting for its interval ends at once

    # ---- sources -----------------------------------------------------------------------------------
    def nvml_loop(self) -> None:
        """Wait on NVML XID events; rebuild the event set after errors (with backoff)."""
        backoff = 1.0
        while not self._stop.is_set():
            try:
                self._nvml_session()
                backoff = 1.0
            except Exception as exc:  # NVMLError, library missing: count, back off, retry
                self._count("nvml_errors")
                print(f"xid-watch: NVML: {exc}; retrying in {backoff:g}s", file=sys.stderr, flush=True)
                self._stop.wait(backoff)
                backoff = min(30.0, backoff * 2)

    def _nvml_register(self, nv: Any, evset: Any, i: int, by_handle: Dict[Any, int]) -> bool:
        """Add GPU ``i``'s XID events to ``evset``. True when done with it (registered, or it has no XID
        events to give); False when NVML could not tell now (a lost GPU), to be tried again."""
        import ctypes

        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mask = nv.nvmlDeviceGetSupportedEventTypes(h) & nv.nvmlEventTypeXidCriticalError
            if mask:
                nv.nvmlDeviceRegisterEvents(h, mask, evset)
                by_handle[ctypes.cast(h, ctypes.c_void_p).value] = i
        except nv.NVMLError:
            return False  # a lost GPU: the kernel log and the health poll still see it
        return True

    def _nvml_watching(self, by_handle: Dict[Any, int], missing: List[int]) -> None:
        """Say which GPUs NVML tells XIDs of (log line, textfile): an XID on a GPU not in the set reaches
        xid-watch only through the kernel log, and NVML never replays an event from before its
        registration."""
        gpus = sorted(by_handle.values())
        self.nvml_gpus = len(gpus)
        self._metrics_dirty = True
        if (gpus, missing) == self._nvml_said:
            return  # a set rebuilt with the same GPUs (e.g. once a second around a lost one): said already
        self._nvml_said = (gpus, list(missing))
        left = f" (not yet: GPU {', '.join(map(str, missing))}, tried again every {REREGISTER_SECONDS:g}s)" \
            if missing else ""
        print(f"xid-watch: NVML: XID events of GPU {', '.join(map(str, gpus)) or 'none'}{left}", flush=True)

    def _nvml_session(self) -> None:
        import pynvml as nv

        from autoheal.hooks.gather import _init

        _init(nv)
        import ctypes

        evset = nv.nvmlEventSetCreate()
        by_handle: Dict[Any, int] = {}  # the device of a lost GPU cannot tell its index any more
        try:
            # a GPU that could not be registered (lost at the time) is tried again while the set runs:
            # one that comes back (a reset, a driver rebind) raised its next XIDs into a set without it,
            # and NVML never told them (the lab: an XID 79, the GPU cleared, the next XID on it only in
            # the kernel log; a node whose kernel log is not readable never saw it)
            missing = [i for i in range(nv.nvmlDeviceGetCount()) if not self._nvml_register(nv, evset, i, by_handle)]
            waited = False  # a wait of this set returned an event or timed out
            self._nvml_watching(by_handle, missing)
            if not by_handle and not missing:
                self._stop.wait(5.0)
                return
            next_try = time.monotonic() + REREGISTER_SECONDS
            while not self._stop.is_set():
                if missing and time.monotonic() >= next_try:
                    still = [i for i in missing if not self._nvml_register(nv, evset, i, by_handle)]
                    if still != missing:
                        missing = still
                        self._nvml_watching(by_handle, missing)
                    next_try = time.monotonic() + REREGISTER_SECONDS
                if not by_handle:  # nothing to wait on yet (every GPU lost): only the tries above
                    self._stop.wait(min(REREGISTER_SECONDS, max(0.0, next_try - time.monotonic())))
                    continue
                try:
                    data = nv.nvmlEventSetWait_v2(evset, self.h.xid_poll_ms)
                except nv.NVMLError as exc:
                    if exc.value == nv.NVML_ERROR_TIMEOUT:
                        waited = True
                        continue
                    if exc.value == nv.NVML_ERROR_GPU_IS_LOST:
                        # a registered GPU went away: a new set with the others (the lost one is tried
                        # again while it runs); at once unless this set never waited
                        if not waited:
                            self._stop.wait(LOST_REBUILD_PAUSE)
                        return
                    raise
                waited = True
                idx = by_handle.get(ctypes.cast(data.device, ctypes.c_void_p).value)
                self.q.put(XidEvent(xid=int(data.eventData), gpu=idx, source="nvml"))
        finally:
            self.nvml_gpus = 0
            self._metrics_dirty = True
            try:
                nv.nvmlEventSetFree(evset)
            except Exception:
                pass

    def log_loop(self) -> None:
        """Follow the kernel log from the shared cursor (new records only, replays dropped)."""
        path = self.ctx.path(self.h.kernel_log)
        last_size = -1
        while not self._stop.is_set():
            try:
                if path != "/dev/kmsg":
                    try:
                        size = os.stat(path).st_size
                    except OSError:
                        size = -1
                    if size == last_size:
                        self._stop.wait(self.h.kernel_log_poll)
                        continue
                    last_size = size
                with self.ctx.store.locked() as st:
                    events, cur = read_kernel_log(path, LogCursor.from_dict(st.get("kmsg")))
                    st["kmsg"] = cur.to_dict()
                    if cur.rejected_count:
                        S.bump(st, "kernel_log_rejected_total", cur.rejected_count)
                self._report_log_read(path, cur)
                for ev in events:
                    self.q.put(ev)
            except Exception as exc:
                print(f"xid-watch: kernel log {path}: {exc}", file=sys.stderr, flush=True)
            self._stop.wait(self.h.kernel_log_poll)

    def _report_log_read(self, path: str, cur: LogCursor) -> None:
        """Say what a read of the kernel log left out: the history a node without a cursor does not act on,
        and lines that look like an XID but are not the driver's kernel record (a forgery, or a log format
        autoheal does not trust: docs/security.md)."""
        from autoheal.reasons import sanitize

        if cur.skipped:
            print(f"xid-watch: kernel log {path}: no cursor in the node state (new install, or the state was "
                  f"lost): starting at the log's end; {cur.skipped} earlier XID record(s) not judged, the live "
                  f"NVML checks decide", file=sys.stderr, flush=True)
        for line in cur.rejected:
            print(f"xid-watch: kernel log {path}: not the NVIDIA driver's kernel record, ignored: "
                  f"{sanitize(line, 300)}", file=sys.stderr, flush=True)
        if cur.rejected_count > len(cur.rejected):
            print(f"xid-watch: kernel log {path}: {cur.rejected_count - len(cur.rejected)} more such line(s) "
                  f"ignored", file=sys.stderr, flush=True)
        if cur.rejected_count:
            self._metrics_dirty = True

    def health_loop(self) -> None:
        """Poll the NVML health state every ``hooks.xid_watch_health_poll`` seconds. The reads run in
        ``gather``'s worker threads with the healthcheck's budget (``hooks.nvml_timeout``): a hung call
        leaves this thread waiting at most that long, never the XID loop, and while a hung read is still
        stuck in the driver the next poll is skipped (counted) rather than piling up threads. Healthy
        polls take no lock and write nothing; results with a hard fault go to the main loop."""
        from autoheal.hooks.gather import gather

        interval = max(1.0, float(self.h.xid_watch_health_poll))
        while not self._next_poll(interval):
            if any(t.name.startswith("nvml-") and t.is_alive() for t in threading.enumerate()):
                self._count("health_polls_skipped_total")  # a read of an earlier poll hangs in the driver
                continue
            started = time.time()
            try:
                sample = gather(self.ctx.node, budget=self.h.nvml_timeout)
                results = C.judge_sample(sample, self.h, 0)
            except Exception as exc:  # a bug in a judge: say it, poll again later
                print(f"xid-watch: health poll: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                continue
            self.health_polls, self.health_poll_started = self.health_polls + 1, started
            read_ok = [g.index for g in sample.gpus if g.ok and not g.error]
            if not hard_failures(results) and not self.ctx.store.read().get(POLLED):
                continue  # the common case: healthy, nothing remembered
            # decided once on a snapshot: a fault already acted on, seen again, changes nothing and takes
            # no lock (the main loop decides again under the lock when something does change)
            snap = self.ctx.store.read()
            before = dict(snap.get(POLLED) or {})
            seen = time.time()
            new, _ = poll_decision(snap, results, read_ok, seen, taken=started)
            if new and self._stop.wait(XID_SETTLE_SECONDS):
                break
            if new or snap.get(POLLED) != before:
                self.polls.put(PolledSample(results, read_ok, seen, started))

    def _next_poll(self, interval: float) -> bool:
        """Wait for the next health poll: ``interval`` seconds, or less when an XID asks for one
        (``poll_now``). True once the daemon stops."""
        self.poll_now.wait(interval)
        self.poll_now.clear()
        return self._stop.is_set()

    # ---- handling ----------------------------------------------------------------------------------
    def handle_poll(self, results: List[C.CheckResult], read_ok: List[int],
                    now: Optional[float] = None, taken: Optional[float] = None) -> List[C.CheckResult]:
        """Act on one health poll: a new hard fault drains the node the way the healthcheck would (its
        worst failure names the drain) and moves the jobs as an XID drain does; drain first, journal
        after. The lock is held only for the decision, which is made on the state as it is then: a
        repair recorded while the sample was in flight (``taken``: when its reads began) drops it. Returns
        the new faults (for tests)."""
        now = time.time() if now is None else now
        snap = self.ctx.store.read()
        new, drain = poll_decision(snap, results, read_ok, now, taken)
        if new and not drain and snap.get("drain") and not snap.get("pending_drain"):
            if self._forget_stale_drain(snap["drain"]):
                # back in service since: this sample may predate the admin's repair and resume (the lab
                # tests clear the GPU and resume within a second); the next poll, read after, decides
                return []
        with self.ctx.store.locked() as st:
            new, drain = poll_decision(st, results, read_ok, now, taken)
            # the drain reason is the one the healthcheck would give on this sample: its worst failure
            # over every check (a soft one may outrank the hard fault that made the poll act)
            worst = C.worst_failure(results) if drain else None
            if worst is not None:
                jobside.request_drain(st, worst, now)
                for r in new:
                    S.bump(st, f'health_faults_total{{check="{r.check}",gpu="{r.gpu}"}}')
        if worst is None:
            return []
        self._metrics_dirty = True
        self.jobs.step(now, urgent=True)
        after = self.ctx.store.read()
        if not after.get("drain") and not after.get("pending_drain"):
            # dealt with, but not drained by us: someone else's drain was kept, and drain_for journalled
            # the fault once with that reason; a second detection record would say the same again
            return new
        for r in new:
            self.ctx.record(Event.DETECTION, check=r.check, evidence={**r.evidence, "source": "health-poll"},
                            message=r.text, severity="action", action=r.action, time=now)
        return new

    def handle(self, events: List[XidEvent], now: Optional[float] = None) -> List[C.CheckResult]:
        """Judge events once each and act on failures: drain first (and the jobs), then journal and
        notify; healing never waits for a record or a webhook. Returns the results (for tests)."""
        from autoheal.hooks.engine import xid_results

        now = time.time() if now is None else now
        self._refresh_repairs(events, now)
        notes: List[Note] = []
        with self.ctx.store.locked() as st:
            results = xid_results(self.ctx, st, events, dict(st.get("gpu_pci", {})), now, notes)
            for r in results:
                S.bump(st, f'xid_events_total{{xid="{r.evidence.get("xid")}",gpu="{r.gpu}"}}')
                st.setdefault("counters", {})["last_event_timestamp_seconds"] = now
            fails = [r for r in results if r.status == C.FAIL]
            worst = C.worst_failure(fails)
            if worst is not None:
                jobside.request_drain(st, worst, now)
            for r in results:
                # the kernel log's copy of an XID NVML told first is there to name the process of an
                # application XID (xid_jobs); a requeue was already opened for NVML's: one fault, one action
                if r.status != C.FAIL and r.action == C.REQUEUE and not r.evidence.get("companion"):
                    jobs = self._jobs_on_gpu(r.gpu) if r.gpu is not None else None
                    # issue 25: the job whose process the driver named, when its cgroup says so: that one only
                    pid, _ = xid_jobs.process_of(_event_of(events, r))
                    owner = xid_jobs.job_of_cgroup(pid, self.proc) if pid is not None else None
                    jobside.add_requeue_fault(st, r, now, [owner] if owner else jobs)
        self._metrics_dirty = bool(results) or self._metrics_dirty
        if recovery_changed(results):
            self.poll_now.set()
        if fails or any(r.action == C.REQUEUE for r in results):
            self.jobs.step(now, urgent=True)
        # application XIDs: the job's record, never the node's (outside the state lock: it asks Slurm)
        xid_jobs.attribute(self.ctx, [r for r in results if r.action != C.REQUEUE], events,
                           self._jobs_on_gpu, now, self.proc)
        for r in results:
            if xid_jobs.app_results([r]) and r.action != C.REQUEUE:
                continue  # journalled against its job just above
            if r.action == C.REQUEUE and r.evidence.get("companion"):
                continue  # NVML's copy was journalled and acted on
            sev = "action" if r.status == C.FAIL else "info"
            msg = r.text + (" (back after a repair)" if r.evidence.get("after_repair") else "")
            self.ctx.record(Event.DETECTION, check="xid", evidence=r.evidence, message=msg, severity=sev,
                            action=r.action, time=now)
        for n in notes:
            self.ctx.record(Event.DETECTION, **n)
        return results

    def _forget_stale_drain(self, ours: Optional[S.Drain]) -> bool:
        """A new hard fault on a node whose state says "drained by us": ask Slurm whether it still is.
        An admin's ``scontrol resume`` is seen by the hooks only when one of them next runs; until then
        the record would keep the poll from acting on a node that is back in service. Back in service:
        the admin's resume is accepted as the hooks accept it (``engine.forget_behind_drain``: the record,
        the faults opened before our drain and a failing result are forgotten, the node counts as
        repaired), and True is returned. Forgetting only the record left those faults open, and the next
        healthcheck drained the node again for the XID the admin had dealt with, not for the live fault
        (CI: test_admin_resume_without_clear_faults_runs_the_next_job_and_a_bad_gpu_still_drains). Still
        drained (by us or anyone over us), or Slurm could not tell: the record stands, nothing new."""
        from autoheal.errors import SlurmError
        from autoheal.hooks.engine import forget_behind_drain

        try:
            node = self.ctx.slurm.get_node(self.ctx.node)
        except SlurmError:
            return False
        if node.drain or node.down:
            return False
        forget_behind_drain(self.ctx, time.time(), expect=ours)
        return True

    def _refresh_repairs(self, events: List[XidEvent], now: float) -> None:
        """An XID that repeats one already handled, while a drain or reboot of ours is on record: ask
        Slurm first whether the node went back into service meanwhile (resumed, rebooted). If it did,
        that repair ended the dedupe window and the XID is a returning fault, to act on at once."""
        st = self.ctx.store.read()
        if not (st.get("episode") or st.get("drain") or st.get("reboot_requested")):
            return
        pci_map = st.get("gpu_pci", {})
        for ev in events:
            gpu = ev.gpu if ev.gpu is not None else pci_map.get(ev.pci)
            if S.recent_xid(st, ev.xid, gpu, ev.pci, now, self.h.xid_dedupe_seconds) is not None:
                self.jobs.step(now, force=True)
                return

    def _jobs_on_gpu(self, gpu: int) -> Optional[List[str]]:
        """Job ids the DCGM mapping file of ``gpu`` names; None when there is no mapping to ask."""
        d = self.ctx.path(self.h.dcgm_mapping_dir)
        if not d:
            return None
        try:
            with open(os.path.join(d, str(gpu)), encoding="utf-8") as fh:
                return [ln.strip() for ln in fh if ln.strip().isdigit()]
        except FileNotFoundError:
            # the prolog keeps the mapping: no file for this GPU while others have one = no job on it
            return [] if os.path.isdir(d) and os.listdir(d) else None
        except OSError:
            return None

    # ---- metrics -----------------------------------------------------------------------------------
    def _count(self, name: str) -> None:
        with self.ctx.store.locked() as st:
            S.bump(st, name)
        self._metrics_dirty = True

    def write_metrics(self, up: bool = True) -> None:
        d = self.ctx.path(self.h.textfile_dir)
        beat_due = time.monotonic() - self._metrics_written >= HEARTBEAT_SECONDS
        if not d or not (self._metrics_dirty or beat_due or not up):
            return
        self._metrics_dirty = False
        self._metrics_written = time.monotonic()
        counters = self.ctx.store.read().get("counters") or {}
        node = self.ctx.node
        lines = ["# HELP autoheal_xid_watch counters of the autoheal xid-watch daemon",
                 "# TYPE autoheal_xid_watch_up gauge", f'autoheal_xid_watch_up{{node="{node}"}} {1 if up else 0}',
                 # when this file was written: a dead daemon's file keeps its last beat (alert: stale)
                 "# TYPE autoheal_xid_watch_heartbeat_timestamp_seconds gauge",
                 f'autoheal_xid_watch_heartbeat_timestamp_seconds{{node="{node}"}} {time.time():.3f}',
                 "# TYPE autoheal_xid_watch_health_polls_total counter",
                 f'autoheal_xid_watch_health_polls_total{{node="{node}"}} {self.health_polls}',
                 "# TYPE autoheal_xid_watch_health_poll_started_timestamp_seconds gauge",
                 f'autoheal_xid_watch_health_poll_started_timestamp_seconds{{node="{node}"}} '
                 f'{self.health_poll_started:.3f}',
                 "# TYPE autoheal_xid_watch_nvml_event_gpus gauge",
                 f'autoheal_xid_watch_nvml_event_gpus{{node="{node}"}} {self.nvml_gpus}']
        for key, val in sorted(counters.items()):
            name, _, labels = key.partition("{")
            labels = f'node="{node}"' + ("," + labels.rstrip("}") if labels else "")
            lines.append(f"autoheal_xid_watch_{name}{{{labels}}} {val}")
        if "fault_to_drain_seconds_count" not in counters:
            # the histogram at zero before the first drain: rate() then sees the first one (0 -> 1)
            zero = S.empty()
            S.observe(zero, "fault_to_drain_seconds", 0.0)
            for key in sorted(zero["counters"]):
                name, _, labels = key.partition("{")
                labels = f'node="{node}"' + ("," + labels.rstrip("}") if labels else "")
                lines.append(f"autoheal_xid_watch_{name}{{{labels}}} 0")
        try:
            os.makedirs(d, exist_ok=True)
            # a fresh temporary name (O_EXCL|O_NOFOLLOW) and a rename: the collector directory may be
            # another user's (node-exporter's), and a name they planted is never opened by root
            write_atomic(os.path.join(d, METRICS_FILE), ("\n".join(lines) + "\n").encode(), mode=0o644,
                         fsync=False)
        except (OSError, ValueError) as exc:
            self._metrics_dirty = True  # try again at the next housekeeping
            if str(exc) != self._metrics_error:  # once per distinct error, not every second
                self._metrics_error = str(exc)
                print(f"xid-watch: metrics {d}: {exc}", file=sys.stderr, flush=True)
            return
        self._metrics_error = ""

    # ---- main loop ---------------------------------------------------------------------------------
    def run(self, nvml: bool = True, kernel_log: bool = True) -> int:
        threads = []
        if nvml:
            threads.append(threading.Thread(target=self.nvml_loop, daemon=True, name="xid-nvml"))
        if kernel_log and self.h.kernel_log:
            threads.append(threading.Thread(target=self.log_loop, daemon=True, name="xid-kmsg"))
        if nvml and self.h.xid_watch_health_poll > 0:
            threads.append(threading.Thread(target=self.health_loop, daemon=True, name="xid-health"))
        for t in threads:
            t.start()
        poll = self.h.xid_watch_health_poll if nvml and self.h.xid_watch_health_poll > 0 else 0
        print(f"xid-watch: watching node {self.ctx.node} (nvml={nvml}, kernel log="
              f"{self.ctx.path(self.h.kernel_log) or 'off'}, health poll={f'{max(1.0, poll):g}s' if poll else 'off'})",
              flush=True)
        next_housekeeping = 0.0
        while not self._stop.is_set():
            batch: List[XidEvent] = []
            try:
                batch.append(self.q.get(timeout=0.2))
                while True:
                    batch.append(self.q.get_nowait())
            except queue.Empty:
                pass
            if batch:
                try:
                    self.handle(batch)
                    for ev in batch:
                        self._retries.pop(ev, None)
                except Exception as exc:  # never die on one bad event; say why, try it again
                    print(f"xid-watch: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                    self._retry(batch)
                    self._stop.wait(1.0)
            while True:
                try:
                    polled = self.polls.get_nowait()
                except queue.Empty:
                    break
                try:
                    self.handle_poll(polled.results, polled.read_ok, polled.seen, polled.taken)
                except Exception as exc:  # failed before the decision was saved: the next poll sees it
                    # again; after it, the pending drain is the job side's to retry (housekeeping)
                    print(f"xid-watch: health poll: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            if time.monotonic() >= next_housekeeping:
                next_housekeeping = time.monotonic() + 1.0
                try:
                    self.jobs.step()  # level-triggered: asks Slurm only when there is reason to
                    self.write_metrics()
                except Exception as exc:
                    print(f"xid-watch: housekeeping: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                    self._stop.wait(1.0)
        try:  # a clean stop says so at once (up 0); a killed daemon is found by its stale heartbeat
            self.write_metrics(up=False)
        except Exception as exc:
            print(f"xid-watch: metrics at stop: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        self.ctx.close()
        return 0

    def _retry(self, batch: List[XidEvent]) -> None:
        """Events of a batch that failed go back on the queue (three tries each): an XID is never
        dropped because of one bad moment (a full disk, a bug on one event)."""
        for ev in batch:
            n = self._retries.get(ev, 0) + 1
            if n <= 3:
                self._retries[ev] = n
                self.q.put(ev)
            else:
                self._retries.pop(ev, None)
                where = C.gpu_label(None, ev.gpu, ev.pci, self.ctx.node)
                print(f"xid-watch: giving up on xid {ev.xid} on {where} after 3 tries", file=sys.stderr, flush=True)


def main(node: Optional[str] = None, config_path: Optional[str] = None, nvml: bool = True,
         kernel_log: bool = True) -> int:
    """Run the daemon until SIGTERM/SIGINT."""
    from autoheal.hooks.context import Context, report_own_trouble

    try:
        ctx = Context.load("xid-watch", node, config_path)
    except Exception as exc:  # a config that does not load or crashes the loader: one line, exit 2
        report_own_trouble("xid-watch", None, "config", exc)
        return 2
    # no adapter-level retries: the job side has its own backoff, and a stopped slurmctld then holds the
    # loop for one hooks.slurm_timeout, not two plus a pause
    if hasattr(ctx.slurm, "retries"):
        ctx.slurm.retries = 0
    watch = XidWatch(ctx)
    _signal.signal(_signal.SIGTERM, watch.stop)
    _signal.signal(_signal.SIGINT, watch.stop)
    return watch.run(nvml=nvml, kernel_log=kernel_log)
