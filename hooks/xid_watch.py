"""``autoheal xid-watch``: the node daemon that turns a drain-class XID into a drain within seconds.

Two sources feed one queue: NVML XID events (``nvmlEventSetWait_v2`` with a short timeout, in a
loop) and the kernel log (``/dev/kmsg`` or a file, followed from the cursor kept in the node state).
Each XID is judged once (shared dedupe with the healthcheck and prolog/epilog, across restarts); on a
drain-class XID the daemon drains the node (``autoheal.nodeops`` ownership rules), sends the jobs on
the node their grace signal (``autoheal sbatch`` jobs: ``runner_signal`` to the batch shell, they
requeue themselves; others: ``grace_signal``), and requeues what still runs after
``hooks.grace_seconds`` with a job comment the user sees. Pending requeues live in the node state, so
a restart neither repeats signals nor forgets a requeue. NVML errors are counted and retried with
backoff; counters go to a node-exporter textfile.
"""

from __future__ import annotations

import os
import queue
import signal as _signal
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from autoheal.hooks import checks as C
from autoheal.hooks import state as S
from autoheal.hooks.xids import LogCursor, XidEvent, read_kernel_log

METRICS_FILE = "autoheal_xid_watch.prom"


class XidWatch:
    """One daemon for one node. ``run()`` blocks until ``stop()``."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.h = ctx.hooks
        self.q: "queue.Queue[XidEvent]" = queue.Queue()
        self._stop = threading.Event()
        self._metrics_dirty = True

    def stop(self, *_args) -> None:
        self._stop.set()

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

    def _nvml_session(self) -> None:
        import pynvml as nv

        from autoheal.hooks.gather import _init

        _init(nv)
        import ctypes

        evset = nv.nvmlEventSetCreate()
        registered = 0
        by_handle: Dict[Any, int] = {}  # the device of a lost GPU cannot tell its index any more
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                try:
                    h = nv.nvmlDeviceGetHandleByIndex(i)
                    mask = nv.nvmlDeviceGetSupportedEventTypes(h) & nv.nvmlEventTypeXidCriticalError
                    if mask:
                        nv.nvmlDeviceRegisterEvents(h, mask, evset)
                        by_handle[ctypes.cast(h, ctypes.c_void_p).value] = i
                        registered += 1
                except nv.NVMLError:
                    continue  # a lost GPU: the kernel log and the healthcheck still see it
            if not registered:
                self._stop.wait(5.0)
                return
            while not self._stop.is_set():
                try:
                    data = nv.nvmlEventSetWait_v2(evset, self.h.xid_poll_ms)
                except nv.NVMLError as exc:
                    if exc.value == nv.NVML_ERROR_TIMEOUT:
                        continue
                    if exc.value == nv.NVML_ERROR_GPU_IS_LOST:
                        # a registered GPU went away; re-register the rest after a pause
                        self._stop.wait(1.0)
                        return
                    raise
                idx = by_handle.get(ctypes.cast(data.device, ctypes.c_void_p).value)
                self.q.put(XidEvent(xid=int(data.eventData), gpu=idx, source="nvml"))
        finally:
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
                for ev in events:
                    self.q.put(ev)
            except Exception as exc:
                print(f"xid-watch: kernel log {path}: {exc}", file=sys.stderr, flush=True)
            self._stop.wait(self.h.kernel_log_poll)

    # ---- handling ----------------------------------------------------------------------------------
    def handle(self, events: List[XidEvent], now: Optional[float] = None) -> List[C.CheckResult]:
        """Judge events once each and act on failures. Returns the results (for tests)."""
        from autoheal.hooks.engine import xid_results

        now = time.time() if now is None else now
        with self.ctx.store.locked() as st:
            results = xid_results(self.ctx, st, events, dict(st.get("gpu_pci", {})), now)
            for r in results:
                S.bump(st, f'xid_events_total{{xid="{r.evidence.get("xid")}",gpu="{r.gpu}"}}')
                st.setdefault("counters", {})["last_event_timestamp_seconds"] = now
        self._metrics_dirty = bool(results) or self._metrics_dirty
        for r in results:
            sev = "action" if r.status == C.FAIL else "info"
            self.ctx.record("detection", check="xid", evidence=r.evidence, message=r.reason, severity=sev,
                            action=r.action)
            if r.status == C.FAIL:
                self._drain_and_signal(r, now)
            elif r.action == C.REQUEUE:
                self._requeue_without_drain(r, now)
        return results

    def _drain_and_signal(self, r: C.CheckResult, now: float) -> None:
        from autoheal.errors import SlurmError
        from autoheal.hooks.engine import drain_for

        try:
            act = drain_for(self.ctx, r)
            if act.get("outcome") in ("drained", "reason-updated"):
                self._count("drains_total")
            jobs = [j.job_id for j in self.ctx.slurm.list_jobs(node=self.ctx.node, states=["RUNNING"])]
        except SlurmError as exc:  # slurmctld down: the XID stays an open fault; the healthcheck drains later
            self._count("slurm_errors_total")
            self.ctx.record("error", check="xid", message=f"cannot drain for {r.reason}: {exc}", severity="error")
            return
        self._signal_jobs(r, now, jobs)

    def _requeue_without_drain(self, r: C.CheckResult, now: float) -> None:
        """A "requeue" XID (94, contained ECC): the GPU stays in service, the job that hit it restarts.

        Only the jobs on that GPU (DCGM mapping written by the prolog) when the mapping knows the GPU,
        else every job running on the node: a job left running on corrupted memory is worse than a
        requeue of its neighbours."""
        from autoheal.errors import SlurmError

        jobs = self._jobs_on_gpu(r.gpu) if r.gpu is not None else None
        if jobs is None:
            try:
                jobs = [j.job_id for j in self.ctx.slurm.list_jobs(node=self.ctx.node, states=["RUNNING"])]
            except SlurmError as exc:
                self._count("slurm_errors_total")
                self.ctx.record("error", check="xid", message=f"cannot list jobs for {r.reason}: {exc}",
                                severity="error")
                return
        if jobs:
            self._signal_jobs(r, now, jobs)

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

    def _signal_jobs(self, r: C.CheckResult, now: float, job_ids: List[str]) -> None:
        from autoheal.errors import SlurmError

        xid = r.evidence.get("xid")
        where = f"gpu{r.gpu}" if r.gpu is not None else "a gpu"
        with self.ctx.store.locked() as st:
            pending = st.setdefault("requeues", {})
            fresh = [j for j in job_ids if j not in pending]
            for j in fresh:
                pending[j] = {"deadline": now + self.h.grace_seconds, "xid": xid, "gpu": r.gpu,
                              "note": f"requeued after xid {xid} on {where}", "signalled": False}
        # SIGTERM is what `scontrol requeue` sends itself, KillWait seconds before SIGKILL: for plain jobs
        # requeue at once and let Slurm's kill sequence be the grace window (a job that exits on SIGTERM
        # would otherwise end before we could requeue it).
        term = self.h.grace_signal.upper().replace("SIG", "") == "TERM"
        for j in fresh:
            try:
                job = self.ctx.slurm.get_job(j)
                runner = job.comment.startswith(self.h.runner_comment)
                if not runner and term:
                    with self.ctx.store.locked() as st:
                        if j in st.get("requeues", {}):
                            st["requeues"][j]["deadline"] = now
                    continue
                if runner:
                    self.ctx.slurm.signal_job(j, self.h.runner_signal, batch=True)
                else:
                    self.ctx.slurm.signal_job(j, self.h.grace_signal, full=True)
                self._count("signals_total")
                self.ctx.record("signal", job_ids=[j], check="xid", action="signal",
                                outcome=self.h.runner_signal if runner else self.h.grace_signal, severity="action",
                                message=f"job {j}: grace signal after xid {xid} on {where}; requeue in "
                                f"{self.h.grace_seconds:g}s if still running")
            except SlurmError as exc:
                self.ctx.record("error", job_ids=[j], message=f"signal job {j}: {exc}", severity="error")
            with self.ctx.store.locked() as st:
                if j in st.get("requeues", {}):
                    st["requeues"][j]["signalled"] = True
        self.requeue_due(now)

    def requeue_due(self, now: Optional[float] = None) -> None:
        """Requeue jobs whose grace window ended and that still run on this node."""
        from autoheal.errors import SlurmError, SlurmNotFound
        from autoheal.reasons import MAX_COMMENT_LEN, make_reason

        now = time.time() if now is None else now
        due = {j: v for j, v in self.ctx.store.read().get("requeues", {}).items() if now >= float(v["deadline"])}
        for j, info in due.items():
            done = True
            try:
                job = self.ctx.slurm.get_job(j)
                if job.running and self.ctx.node in job.nodes and self.h.requeue_jobs:
                    note = make_reason(info.get("note", "requeued"), max_len=MAX_COMMENT_LEN)
                    if not job.comment.startswith(self.h.runner_comment):
                        self.ctx.slurm.update_job(j, Comment=note)
                    self.ctx.slurm.requeue(j)
                    self._count("requeues_total")
                    self.ctx.record("requeue", job_ids=[j], action="requeue", outcome="requeued", message=note,
                                    severity="action")
            except SlurmNotFound:
                pass
            except SlurmError as exc:
                done = "unavailable" not in type(exc).__name__.lower()
                if not done:
                    continue  # slurmctld down: try again next loop
                self.ctx.record("error", job_ids=[j], message=f"requeue job {j}: {exc}", severity="error")
            with self.ctx.store.locked() as st:
                st.get("requeues", {}).pop(j, None)

    # ---- metrics -----------------------------------------------------------------------------------
    def _count(self, name: str) -> None:
        with self.ctx.store.locked() as st:
            S.bump(st, name)
        self._metrics_dirty = True

    def write_metrics(self) -> None:
        d = self.ctx.path(self.h.textfile_dir)
        if not d or not self._metrics_dirty:
            return
        self._metrics_dirty = False
        counters: Dict[str, Any] = self.ctx.store.read().get("counters", {})
        node = self.ctx.node
        lines = ["# HELP autoheal_xid_watch counters of the autoheal xid-watch daemon",
                 "# TYPE autoheal_xid_watch_up gauge", f'autoheal_xid_watch_up{{node="{node}"}} 1']
        for key, val in sorted(counters.items()):
            name, _, labels = key.partition("{")
            labels = f'node="{node}"' + ("," + labels.rstrip("}") if labels else "")
            lines.append(f"autoheal_xid_watch_{name}{{{labels}}} {val}")
        try:
            os.makedirs(d, exist_ok=True)
            tmp = os.path.join(d, f".{METRICS_FILE}.tmp")
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write("\n".join(lines) + "\n")
            os.replace(tmp, os.path.join(d, METRICS_FILE))
        except OSError as exc:
            print(f"xid-watch: metrics {d}: {exc}", file=sys.stderr, flush=True)

    # ---- main loop ---------------------------------------------------------------------------------
    def run(self, nvml: bool = True, kernel_log: bool = True) -> int:
        threads = []
        if nvml:
            threads.append(threading.Thread(target=self.nvml_loop, daemon=True, name="xid-nvml"))
        if kernel_log and self.h.kernel_log:
            threads.append(threading.Thread(target=self.log_loop, daemon=True, name="xid-kmsg"))
        for t in threads:
            t.start()
        print(f"xid-watch: watching node {self.ctx.node} (nvml={nvml}, kernel log="
              f"{self.ctx.path(self.h.kernel_log) or 'off'})", flush=True)
        next_housekeeping = 0.0
        while not self._stop.is_set():
            batch: List[XidEvent] = []
            try:
                batch.append(self.q.get(timeout=0.2))
                while True:
                    batch.append(self.q.get_nowait())
            except queue.Empty:
                pass
            try:
                if batch:
                    self.handle(batch)
                if time.monotonic() >= next_housekeeping:
                    next_housekeeping = time.monotonic() + 1.0
                    if self.ctx.store.read().get("requeues"):
                        self.requeue_due()
                    self.write_metrics()
            except Exception as exc:  # never die on one bad event; say why and go on
                print(f"xid-watch: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                self._stop.wait(1.0)
        return 0


def main(node: Optional[str] = None, config_path: Optional[str] = None, nvml: bool = True,
         kernel_log: bool = True) -> int:
    """Run the daemon until SIGTERM/SIGINT."""
    from autoheal.hooks.context import Context

    ctx = Context.load("xid-watch", node, config_path)
    watch = XidWatch(ctx)
    _signal.signal(_signal.SIGTERM, watch.stop)
    _signal.signal(_signal.SIGINT, watch.stop)
    return watch.run(nvml=nvml, kernel_log=kernel_log)
