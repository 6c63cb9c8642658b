"""Processes the lab starts: spawn detached, record by PID, check liveness, stop by PID.

A PID alone can be reused by an unrelated process after a crash; every record keeps the process's
start time from /proc so that ``stop`` never signals a stranger.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional


@dataclass
class ProcRecord:
    """One lab process: what it is, its PID and /proc start time, its log file."""

    name: str
    pid: int
    start_time: int
    argv: List[str]
    log: str

    def to_dict(self) -> dict:
        return asdict(self)


def proc_start_time(pid: int) -> Optional[int]:
    """The start time (clock ticks since boot) of ``pid`` from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode(errors="replace")
    except OSError:
        return None
    # comm may contain spaces and parentheses: split after the last ')'
    rest = data.rsplit(")", 1)[-1].split()
    try:
        if rest[0] == "Z":  # a zombie is as good as dead
            return None
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def proc_cmdline(pid: int) -> Optional[List[str]]:
    """The argv of ``pid`` from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]


def is_alive(rec: ProcRecord) -> bool:
    """True when the recorded process still runs: same PID and same start time, or same PID and the
    exact argv we started. The second test matters for processes started inside another time
    namespace (the lab's "reboot"), whose start time /proc reports shifted by the namespace offset."""
    start = proc_start_time(rec.pid)
    if start is None:
        return False
    return start == rec.start_time or proc_cmdline(rec.pid) == list(rec.argv)


def spawn(name: str, argv: List[str], log: Path, env: Optional[Dict[str, str]] = None,
          cwd: Optional[Path] = None) -> ProcRecord:
    """Start ``argv`` detached from us (own session, no stdin), output appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=str(cwd) if cwd else None, start_new_session=True,
                                close_fds=True)
    start = None
    for _ in range(50):
        start = proc_start_time(proc.pid)
        if start is not None:
            break
        time.sleep(0.01)
    return ProcRecord(name=name, pid=proc.pid, start_time=start or -1, argv=list(argv), log=str(log))


def stop(rec: ProcRecord, timeout: float = 10.0) -> bool:
    """SIGTERM the process (and its process group), SIGKILL after ``timeout``. True if it was running."""
    if not is_alive(rec):
        _reap(rec.pid)
        return False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(rec.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(rec.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            _reap(rec.pid)
            if not is_alive(rec):
                return True
            time.sleep(0.05)
    return True


def _reap(pid: int) -> None:
    """Collect the exit status when the process is our own child (tests start labs in-process)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    except OSError:
        pass


def step_daemons(root: Path) -> List[int]:
    """PIDs of the slurmstepd processes of the lab under ``root``: named slurmstepd and holding a file
    under ``root`` open (their node's slurmd log). They run in their own sessions, so they are not in
    any recorded process group."""
    prefix = str(root).rstrip("/") + "/"
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm", encoding="utf-8", errors="replace") as fh:
                if fh.read().strip() != "slurmstepd":
                    continue
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(prefix):
                out.append(int(entry))
                break
    return out


def open_files(pid: int) -> List[str]:
    """The paths ``pid`` holds open (empty when it is gone or not ours to look at)."""
    out = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return out


def job_processes(slurm_conf: str) -> List[int]:
    """PIDs of processes of this lab's jobs: ``SLURM_JOB_ID`` set and ``SLURM_CONF`` = the lab's
    slurm.conf in their environment (a shell that only sourced ``lab env`` has no SLURM_JOB_ID)."""
    want = f"SLURM_CONF={slurm_conf}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if want in env and any(e.startswith(b"SLURM_JOB_ID=") for e in env):
            out.append(int(entry))
    return out


def ancestors(pid: int) -> List[int]:
    """``pid`` and its parents up to init, init included (never to be killed by the process itself, nor
    counted as someone else's: in a container or PID namespace, PID 1 is often the launcher whose
    command line names the lab, e.g. ``unshare --pid ... autoheal lab soak --dir D``)."""
    out = []
    while pid >= 1 and pid not in out:
        out.append(pid)
        if pid == 1:
            break
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def descendants(pid: int) -> List[int]:
    """Every process below ``pid`` (children first, then theirs), from /proc's parent PIDs."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            out.append(child)
            todo.append(child)
    return out


def kill_pid(pid: int) -> None:
    """SIGKILL one process, ignoring one that is already gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _reap(pid)
