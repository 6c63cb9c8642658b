"""Application XIDs belong to the job whose process raised them (issues 22 and 25).

NVIDIA's driver names the process in the Xid line: ``NVRM: Xid (PCI:0000:3b:00): 13, pid=4567,
name=python, ...``. An XID whose policy is the application's (``job``, ``requeue``) is attributed to
the Slurm job that owns that process and acted on for that job only: journalled with its job id, the
job told once in its comment, and (``requeue``) only that job requeued. It never drains the node, so
one job's bug on 77 nodes is one job's record on 77 nodes, not 77 drains.

Which job owns a pid, in order of trust:
1. ``/proc/<pid>/cgroup``: Slurm's cgroup plugins put every task under ``.../job_<id>/step_...``; a
   process cannot leave its job's cgroup without root.
2. ``SLURM_JOB_ID`` in ``/proc/<pid>/environ``, only when Slurm says that job runs on this node and its
   user owns the process (a user can put any job id in their own environment: without the check, their
   crash would be pinned on a victim's job).
3. The GPU's DCGM job-mapping file, when it names exactly one job.
Otherwise the XID is recorded with no job, and nothing else happens.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from autoheal.events import Event
from autoheal.hooks import checks as C
from autoheal.hooks.xid_catalog import JOB_POLICIES
from autoheal.hooks.xids import XidEvent

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Callable, Dict, Final, List, Optional, Tuple

    from autoheal.hooks.context import Context
    from autoheal.hooks.state import NodeStateData

PROC = "/proc"
#: The driver's own fields right after the XID number (a user's process name comes after ``pid=``, so it
#: cannot supply the pid).
_WHO = re.compile(r"^NVRM: Xid \([^()]*\): \d+, pid=(?P<pid>\d+|'<unknown>'|<unknown>), name=(?P<name>[^,]{0,64})")
_JOB_CGROUP = re.compile(r"/job_(\d{1,12})(?:/|$)")
_JOB_ENV = re.compile(rb"(?:^|\x00)SLURM_JOB_ID=(\d{1,12})(?:\x00|$)")
#: State key: per job, the application XIDs seen on this node ({job: {"xids": {xid: count}, "told": [..]}}).
APP_JOBS: Final = "app_jobs"
MAX_JOBS_KEPT = 200


def process_of(ev: XidEvent) -> Tuple[Optional[int], str]:
    """(pid, process name) the driver named in the Xid line; (None, "") when it said ``<unknown>`` or the
    event came from NVML (which names no process)."""
    m = _WHO.match(ev.line or "")
    if not m:
        return None, ""
    pid = int(m.group("pid")) if m.group("pid").isdigit() else None
    name = m.group("name").strip()
    return (pid if pid and pid > 0 else None), ("" if name in ("<unknown>", "'<unknown>'") else name[:32])


def _read(path: str, limit: int = 65536) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return b""
    try:
        return os.read(fd, limit)
    except OSError:
        return b""
    finally:
        os.close(fd)


def job_of_cgroup(pid: int, proc: str = PROC) -> Optional[str]:
    """The Slurm job id in the cgroup path of ``pid`` (cgroup v1 or v2), or None."""
    for line in _read(os.path.join(proc, str(int(pid)), "cgroup")).decode("utf-8", "replace").splitlines():
        path = line.split(":", 2)[-1]
        m = _JOB_CGROUP.search(path)
        if m:
            return m.group(1)
    return None


def job_of_environ(pid: int, proc: str = PROC) -> Tuple[Optional[str], Optional[int]]:
    """(``SLURM_JOB_ID`` of the process, the uid owning it): a claim to verify with Slurm, never trusted
    alone."""
    base = os.path.join(proc, str(int(pid)))
    try:
        uid = os.stat(base).st_uid
    except OSError:
        return None, None
    m = _JOB_ENV.search(_read(os.path.join(base, "environ"), 1 << 20))
    return (m.group(1).decode() if m else None), uid


def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def resolve_job(ctx: Context, pid: Optional[int], gpu_jobs: Optional[List[str]], proc: str = PROC) -> Tuple[str, str]:
    """(job id, how it was found) for an application XID, ("", why not) when no job can be named."""
    if pid is not None:
        job = job_of_cgroup(pid, proc)
        if job:
            return job, f"cgroup of process {pid}"
        claim, uid = job_of_environ(pid, proc)
        if claim and uid is not None:
            from autoheal.errors import SlurmError

            try:
                info = ctx.slurm.get_job(claim)
            except SlurmError:
                info = None
            if info is not None and info.running and ctx.node in info.nodes and info.user == _user_name(uid):
                return claim, f"SLURM_JOB_ID of process {pid}, checked with Slurm"
    if gpu_jobs is not None and len(gpu_jobs) == 1:
        return gpu_jobs[0], "the GPU's job mapping"
    return "", "no job owns the process the driver named" if pid is not None else "the driver named no process"


def app_results(results: List[C.CheckResult]) -> List[C.CheckResult]:
    return [r for r in results if r.evidence.get("policy") in JOB_POLICIES]


def remember(st: NodeStateData, job: str, xid: int, now: float, repeat: int = 0) -> Tuple[int, bool]:
    """Count one application XID of ``job``; (its count of that XID on this node, tell the job now?). A
    job is told on the first of each XID (its comment), and again each ``repeat`` more (hooks.app_xid_repeat,
    the count in the comment), never on every one (a storm is one record per XID and job)."""
    jobs = st.setdefault(APP_JOBS, {})
    ent = jobs.setdefault(job, {"xids": {}, "told": [], "first": now})
    ent["last"] = now
    key = str(xid)
    ent["xids"][key] = int(ent["xids"].get(key, 0)) + 1
    tell = xid not in ent["told"] or (repeat > 0 and ent["xids"][key] % repeat == 0)
    if xid not in ent["told"]:
        ent["told"].append(xid)
    if len(jobs) > MAX_JOBS_KEPT:  # the oldest jobs go first
        for old in sorted(jobs, key=lambda j: float(jobs[j].get("last", 0)))[:len(jobs) - MAX_JOBS_KEPT]:
            del jobs[old]
    return int(ent["xids"][key]), tell


def comment_for(r: C.CheckResult, job: str, count: int = 1) -> str:
    """The job comment: ``autoheal: xid 13 on GPU 2 of n1 (...): ...: raised by job 77 (process 4567
    python)[, 5 times on n1]; the node stays in service``."""
    from autoheal.reasons import MAX_COMMENT_LEN, make_reason

    who = r.evidence.get("process") or ""
    times = f", {count} times on {r.reason.node}" if count > 1 else ""
    return make_reason(f"{r.text}: raised by job {job}" + (f" ({who})" if who else "") + times
                       + "; the node stays in service", max_len=MAX_COMMENT_LEN)


@dataclass(frozen=True)
class Attributed:
    """What ``attribute`` did with one application XID: the job it named ("" for none) and how it found
    it, that job's count of this XID on the node, and whether the job was told in its comment."""

    xid: int
    gpu: Optional[int]
    job: str
    how: str
    count: int
    told: bool


def attribute(ctx: Context, results: List[C.CheckResult], events: List[XidEvent],
              gpu_jobs: Optional[Callable[[int], Optional[List[str]]]] = None, now: float = 0.0,
              proc: str = PROC) -> List[Attributed]:
    """Name the job of every application XID among ``results`` (judged from ``events``, same order
    and XID), journal it against that job and tell the job once. ``gpu_jobs(gpu)``: the jobs the GPU's
    mapping names (None: no mapping). Returns what was done (for the caller and tests). Slurm not
    answering only loses the comment, never the record."""
    done: List[Attributed] = []
    apps = app_results(results)
    if not apps:
        return done
    by_xid: Dict[Tuple[int, Optional[int]], XidEvent] = {}
    for ev in sorted(events, key=lambda e: not e.line):  # a kernel-log line (it names the process) first
        by_xid.setdefault((ev.xid, ev.gpu), ev)
        by_xid.setdefault((ev.xid, None), ev)
    for r in apps:
        xid = int(r.evidence.get("xid", 0))
        found = by_xid.get((xid, r.gpu)) or by_xid.get((xid, None))
        pid, name = process_of(found) if found is not None else (None, "")
        mapped = gpu_jobs(r.gpu) if (gpu_jobs is not None and r.gpu is not None) else None
        job, how = resolve_job(ctx, pid, mapped, proc)
        if pid is not None:
            r.evidence["process"] = f"process {pid}" + (f" {name}" if name else "")
        r.evidence["job"] = job
        r.evidence["job_found_by"] = how
        count, tell = 1, False
        if job:
            with ctx.store.locked() as st:
                count, tell = remember(st, job, xid, now, int(getattr(ctx.hooks, "app_xid_repeat", 0) or 0))
        r.evidence["job_xid_count"] = count
        told = _tell(ctx, job, r, count) if job and tell else False
        msg = f"{r.text}: " + (f"raised by job {job} ({how})" if job else how) + \
            ": the application's XID (NVIDIA: restart the application); the node stays in service"
        ctx.record(Event.APP_XID, check="xid", job_ids=[job] if job else [], severity="info", action=r.action,
                   outcome="attributed" if job else "unattributed", message=msg, evidence=dict(r.evidence),
                   **({"time": now} if now else {}))
        done.append(Attributed(xid, r.gpu, job, how, count, told))
    return done


def _tell(ctx: Context, job: str, r: C.CheckResult, count: int = 1) -> bool:
    """Tell the job in its comment, unless the comment is someone else's: an ``autoheal sbatch`` runner's
    state, or the user's own words, are never overwritten (the journal record stands for them)."""
    from autoheal.errors import SlurmError
    from autoheal.reasons import is_ours

    try:
        info = ctx.slurm.get_job(job)
        if info.comment and not is_ours(info.comment):
            return False
        ctx.slurm.set_job_comment(job, comment_for(r, job, count))
        return True
    except SlurmError:
        return False
