"""The node's own memory, shared by healthcheck, prolog, epilog and xid-watch.

One JSON file (``<state_dir>/state.json``) changed under an exclusive flock (``locks/state.lock``: a
0600 file in a 0700 directory, so no other user can hold it: ``autoheal.lockfile``) and replaced
atomically (a fresh temporary name, ``autoheal.atomicfile``), so concurrent hooks never lose each
other's updates and a crash never leaves half a file. It holds: the kernel-log cursor (XIDs seen),
recent XIDs (dedupe across sources), the last check result, consecutive passes, the drain we made, open
faults, recovery-ladder counts and xid-watch counters and its job-side work (pending drain, fault
episode, per-job actions).

A state dir that cannot be written (read-only, full, lock held by a stuck hook, a path Python refuses)
is the hooks' own trouble, never a reason to fail Slurm: with ``fallback=True`` the store keeps working
on an in-memory copy, says so in ``trouble``, and writes the copy back once the disk takes it again.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, ContextManager, Dict, Iterator, List, Optional, Tuple

if TYPE_CHECKING:
    from autoheal.hooks.ladder import Rung

STATE_FILE = "state.json"


def expand(path: str, node: str) -> str:
    """Expand ``{node}`` in a configured path."""
    return path.replace("{node}", node) if path else path


def empty() -> Dict[str, Any]:
    return {
        "version": 1,
        "kmsg": {},                 # LogCursor.to_dict()
        "recent_xids": [],          # [{"xid", "gpu", "pci", "time"}] for dedupe across sources
        "app_xids": {},             # gpu -> [times] of ignored (application) XIDs
        "last_result": None,        # {"time", "status", "results": [...], "source"}
        "last_pass": None,          # {"time", "boot_id", "usec"}
        "passes": 0,                # consecutive passing healthchecks
        "unknown_runs": {},         # gpu -> consecutive runs it could not be read
        "drain": None,              # {"reason", "time", "source", "check", "action", "gpu"} of OUR drain
        "faults": [],               # open faults awaiting a repair rung
        "ladder": {},               # "gpu3"/"node" -> {"reset": [times], "reboot": [times]}
        "gpu_pci": {},              # "0000:3b:00" -> index (kept for GPUs that are lost now)
        "counters": {},             # xid-watch counters for the textfile exporter
        "job_baseline": {},         # job id -> {gpu: ecc dbe} (prolog -> epilog)
        "repaired": {},             # "gpu3"/"node" -> time of the last repair (ends the XID dedupe window)
        "foreign_noted": {},        # fault key -> foreign reason already journalled as "skipped"
        "polled_faults": {},        # "<check>:<gpu>" -> hard fault xid-watch's health poll acted on
        "history": [],              # faults and returns to service, kept across repairs (hooks.lemon)
        # xid-watch's job side (autoheal.hooks.jobside)
        "pending_drain": None,      # a drain slurmctld did not take yet: retried until it does
        "episode": None,            # {"id", "since", "reason"}: the node is drained for a hardware fault
        "requeue_faults": [],       # "requeue"-policy XIDs whose jobs are still to be found
        "job_actions": {},          # "<job>@<fault id>" -> {"stage", "deadline", ...}: once per job and fault
    }


class NodeState:
    """``with NodeState(dir).locked() as st:`` read-modify-write; ``.read()`` for a snapshot.

    ``fallback``: when the state cannot be locked or written, keep going on an in-memory copy (``read``
    returns it) instead of raising, and record why in ``trouble``. The next locked write that works
    merges the copy into what is on disk then: the top-level keys this process changed since it fell
    back win, everything else another process wrote meanwhile is kept. Hooks use it so that their own
    trouble never turns into a Slurm failure, and a long-running xid-watch never loses an XID to it."""

    def __init__(self, state_dir: str, lock_timeout: float = 10.0, fallback: bool = False):
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE
        self.lock_timeout = lock_timeout
        self.fallback = fallback
        self.trouble = ""  # why the last locked() could not persist ("" when it could)
        self._unsaved: Optional[Dict[str, Any]] = None  # our view while the disk does not take it
        self._base: Dict[str, Any] = {}  # what the disk held when we fell back (to tell our changes)

    def read(self) -> Dict[str, Any]:
        if self._unsaved is not None:
            return copy.deepcopy(self._unsaved)
        return self._read_disk()

    def _read_disk(self) -> Dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return empty()
        base = empty()
        if isinstance(data, dict):
            base.update(data)
        return base

    @contextlib.contextmanager
    def locked(self, timeout: Optional[float] = None) -> Iterator[Dict[str, Any]]:
        timeout = self.lock_timeout if timeout is None else timeout
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(_flock(self.dir, "state.lock", timeout, "held"))
        except (OSError, ValueError, TimeoutError) as exc:  # ValueError: a NUL in the path
            stack.close()
            if not self.fallback:
                raise
            state = self.read()
            before = copy.deepcopy(state)
            yield state
            self._keep(state, before, f"state dir {self.dir}: {_why(exc)}")
            return
        with stack:
            if self._unsaved is not None:
                state = self._read_disk()
                state.update({k: v for k, v in self._unsaved.items() if self._base.get(k) != v})
            else:
                state = self._read_disk()
            before = copy.deepcopy(state) if self.fallback else {}
            yield state
            try:
                self._write(state)
            except (OSError, ValueError) as exc:
                if not self.fallback:
                    raise
                self._keep(state, before, f"state {self.path}: cannot write: {_why(exc)}")
                return
            self._unsaved = None
            self._base = {}
            self.trouble = ""

    def _keep(self, state: Dict[str, Any], before: Dict[str, Any], why: str) -> None:
        if self._unsaved is None:
            self._base = before
        self._unsaved = copy.deepcopy(state)
        self.trouble = why

    @contextlib.contextmanager
    def pass_lock(self, timeout: float) -> Iterator[None]:
        """Serialise whole health passes (observe, drain, repair, resume) on this node.

        Slurm's HealthCheckProgram, ``autoheal check`` and a test may run at the same time; without this
        two passes could both see a fault, both reset the GPU, and the second would count the first's
        reset as a recurrence and escalate to a reboot. Raises TimeoutError after ``timeout`` seconds."""
        with _flock(self.dir, "pass.lock", timeout, "another health pass has run for over"):
            yield

    def _write(self, state: Dict[str, Any]) -> None:
        from autoheal.atomicfile import write_atomic

        # a full disk fails the write or the fsync: write_atomic leaves no temporary file behind. 0644:
        # `autoheal status` and admins read it; only root writes it (the directory is root's)
        write_atomic(self.path, json.dumps(state, sort_keys=True, default=str).encode(), mode=0o644)


def _why(exc: BaseException) -> str:
    """One line for an OS error (``Read-only file system``) or a timeout."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


# ---- pure helpers over the state dict --------------------------------------------------------------

def seen_recently(state: Dict[str, Any], xid: int, gpu: Optional[int], pci: str, now: float,
                  window: float) -> bool:
    """True when the same XID on the same GPU was handled within ``window`` seconds and no repair of
    that GPU (or of the node) came in between: a fault back after a repair is a new fault."""
    return recent_xid(state, xid, gpu, pci, now, window) is not None


#: Seconds within which the other source's report of one XID arrives (the driver writes the NVML event and
#: the kernel-log record at the same moment; xid-watch reads both within a poll). Such a copy is the same
#: XID even when a repair came in between: seen in the soak, an NVML XID 48 at .800, a reset of that GPU
#: for an earlier fault at .953, the kernel-log copy at .972 judged "back after a repair" (a ladder climb).
COMPANION_SECONDS = 5.0


def recent_xid(state: Dict[str, Any], xid: int, gpu: Optional[int], pci: str, now: float,
               window: float, source: str = "") -> Optional[Dict[str, Any]]:
    """The remembered XID this one duplicates (see ``seen_recently``), or None. ``source``: where this
    one was read (nvml, kmsg, file); the other source's copy of an XID judged just before a repair is
    still that XID (``COMPANION_SECONDS``)."""
    r: Dict[str, Any]
    for r in reversed(state.get("recent_xids", [])):
        if r.get("xid") != xid or now - float(r.get("time", 0)) > window:
            continue
        same = ((gpu is not None and r.get("gpu") == gpu) or (pci and r.get("pci") == pci)
                or (gpu is None and not pci and r.get("gpu") is None and not r.get("pci")))
        if not same:
            continue
        if float(r.get("time", 0)) < repaired_at(state, r.get("gpu") if r.get("gpu") is not None else gpu):
            if source and r.get("sources") and source not in r["sources"] \
                    and now - float(r.get("time", 0)) <= COMPANION_SECONDS:
                return r  # the other source's copy of the XID judged before the repair
            continue  # judged before the last repair: that window is closed
        return r
    return None


def mark_repaired(state: Dict[str, Any], gpu: Optional[int], now: float) -> None:
    """A repair of ``gpu`` (None: the whole node: reboot, resume, admin clear) ends its XID dedupe window."""
    state.setdefault("repaired", {})[ladder_key(gpu)] = now


def repaired_at(state: Dict[str, Any], gpu: Optional[int]) -> float:
    """When ``gpu`` (or the node as a whole) was last repaired; 0 when never."""
    rep = state.get("repaired") or {}
    times = [float(rep.get("node", 0) or 0)]
    if gpu is not None:
        times.append(float(rep.get(ladder_key(gpu), 0) or 0))
    return max(times)


def remember_xid(state: Dict[str, Any], xid: int, gpu: Optional[int], pci: str, now: float,
                 keep: float = 86400.0, source: str = "") -> None:
    recent = [r for r in state.get("recent_xids", []) if now - float(r.get("time", 0)) <= keep]
    recent.append({"xid": xid, "gpu": gpu, "pci": pci, "time": now, "sources": [source] if source else []})
    state["recent_xids"] = recent[-500:]


def count_app_xid(state: Dict[str, Any], gpu: Optional[int], now: float, window: float) -> int:
    """Record one application XID on ``gpu`` and return how many fell within the window."""
    key = str(gpu)
    times = [t for t in state.setdefault("app_xids", {}).get(key, []) if now - t <= window]
    times.append(now)
    state["app_xids"][key] = times[-1000:]
    return len(times)


def bump(state: Dict[str, Any], counter: str, amount: float = 1) -> None:
    c = state.setdefault("counters", {})
    c[counter] = c.get(counter, 0) + amount


#: Buckets (seconds) of the node-side latency histograms in the textfile (fault -> drain).
LATENCY_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def observe(state: Dict[str, Any], name: str, value: float, buckets: Tuple[float, ...] = LATENCY_BUCKETS) -> None:
    """Add ``value`` to the cumulative histogram ``name`` in the counters (``_bucket{le=..}``, ``_sum``,
    ``_count``: the Prometheus histogram layout, so histogram_quantile() reads the textfile directly)."""
    for le in buckets:  # every bucket exists from the first observation on (0 where the value is above it)
        bump(state, f'{name}_bucket{{le="{le:g}"}}', 1 if value <= le else 0)
    bump(state, f'{name}_bucket{{le="+Inf"}}')
    bump(state, f"{name}_sum", round(value, 6))
    bump(state, f"{name}_count")


def ladder_key(gpu: Optional[int]) -> str:
    return "node" if gpu is None else f"gpu{gpu}"


def ladder_label(key: str, node: str) -> str:
    """A ladder key for people: ``gpu3`` -> ``GPU 3 of gpu2`` (never a bare ``gpu3``, which reads as a node
    name), ``node`` -> ``gpu2 as a whole``."""
    if key.startswith("gpu") and key[3:].isdigit():
        return f"GPU {key[3:]} of {node}"
    return f"{node} as a whole" if key == "node" else key


def ladder_count(state: Dict[str, Any], gpu: Optional[int], rung: Rung, now: float, window: float) -> int:
    times = state.get("ladder", {}).get(ladder_key(gpu), {}).get(rung, [])
    return sum(1 for t in times if now - float(t) <= window)


def record_rung(state: Dict[str, Any], gpu: Optional[int], rung: Rung, now: float) -> None:
    ent = state.setdefault("ladder", {}).setdefault(ladder_key(gpu), {})
    ent.setdefault(rung, []).append(now)
    ent[rung] = ent[rung][-50:]


def open_fault(state: Dict[str, Any], fault: Dict[str, Any]) -> None:
    """Add a fault awaiting repair (one per check and GPU)."""
    faults: List[Dict[str, Any]] = state.setdefault("faults", [])
    for f in faults:
        if f.get("check") == fault.get("check") and f.get("gpu") == fault.get("gpu"):
            f.update({k: v for k, v in fault.items() if k != "since"})
            return
    faults.append(fault)


def _flock(directory: Path, name: str, timeout: float, what: str) -> ContextManager[None]:
    """An exclusive lock ``directory/locks/name`` only this user can take, polled until ``timeout``
    (then TimeoutError)."""
    from autoheal.lockfile import exclusive

    return exclusive(directory, name, timeout, what)
