"""The node's own memory, shared by healthcheck, prolog, epilog and xid-watch.

One JSON file (``<state_dir>/state.json``) changed under an exclusive flock (``state.lock``) and
replaced atomically, so concurrent hooks never lose each other's updates and a crash never leaves
half a file. It holds: the kernel-log cursor (XIDs seen), recent XIDs (dedupe across sources), the
last check result, consecutive passes, the drain we made, open faults, recovery-ladder counts and
xid-watch counters and pending requeues.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

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
        "requeues": {},             # job id -> {"deadline", "reason", "signalled"}
        "job_baseline": {},         # job id -> {gpu: ecc dbe} (prolog -> epilog)
    }


class NodeState:
    """``with NodeState(dir).locked() as st:`` read-modify-write; ``.read()`` for a snapshot."""

    def __init__(self, state_dir: str):
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE

    def read(self) -> Dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return empty()
        base = empty()
        if isinstance(data, dict):
            base.update(data)
        return base

    @contextlib.contextmanager
    def locked(self, timeout: float = 10.0) -> Iterator[Dict[str, Any]]:
        with _flock(self.dir, "state.lock", timeout, "held"):
            state = self.read()
            yield state
            self._write(state)

    @contextlib.contextmanager
    def pass_lock(self, timeout: float) -> Iterator[None]:
        """Serialise whole health passes (observe, drain, repair, resume) on this node.

        Slurm's HealthCheckProgram, ``autoheal check`` and a test may run at the same time; without this
        two passes could both see a fault, both reset the GPU, and the second would count the first's
        reset as a recurrence and escalate to a reboot. Raises TimeoutError after ``timeout`` seconds."""
        with _flock(self.dir, "pass.lock", timeout, "another health pass has run for over"):
            yield

    def _write(self, state: Dict[str, Any]) -> None:
        tmp = self.dir / f".{STATE_FILE}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(state, fh, sort_keys=True, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)


# ---- pure helpers over the state dict --------------------------------------------------------------

def seen_recently(state: Dict[str, Any], xid: int, gpu: Optional[int], pci: str, now: float,
                  window: float) -> bool:
    """True when the same XID on the same GPU was handled within ``window`` seconds."""
    for r in state.get("recent_xids", []):
        if r.get("xid") != xid or now - float(r.get("time", 0)) > window:
            continue
        if (gpu is not None and r.get("gpu") == gpu) or (pci and r.get("pci") == pci):
            return True
        if gpu is None and not pci and r.get("gpu") is None and not r.get("pci"):
            return True
    return False


def remember_xid(state: Dict[str, Any], xid: int, gpu: Optional[int], pci: str, now: float,
                 keep: float = 86400.0) -> None:
    recent = [r for r in state.get("recent_xids", []) if now - float(r.get("time", 0)) <= keep]
    recent.append({"xid": xid, "gpu": gpu, "pci": pci, "time": now})
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


def ladder_key(gpu: Optional[int]) -> str:
    return "node" if gpu is None else f"gpu{gpu}"


def ladder_count(state: Dict[str, Any], gpu: Optional[int], rung: str, now: float, window: float) -> int:
    times = state.get("ladder", {}).get(ladder_key(gpu), {}).get(rung, [])
    return sum(1 for t in times if now - float(t) <= window)


def record_rung(state: Dict[str, Any], gpu: Optional[int], rung: str, now: float) -> None:
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


@contextlib.contextmanager
def _flock(directory: Path, name: str, timeout: float, what: str) -> Iterator[None]:
    """An exclusive flock on ``directory/name``, polled until ``timeout`` (then TimeoutError)."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(str(directory / name), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{directory}/{name}: {what} {timeout:g}s") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)
