"""Where the peer-memory checkpoint tier keeps a job's copies on a node, and how root cleans them up.

Shared by the job side (``sbatch_helpers/memtier_*``: the agent writes there) and the hooks, which never
import the job side: the epilog removes what a finished job left, and the prolog and the healthcheck what
a job that is over left on a node it no longer ran on (``sweep_over``). Layout on every node::

    <base>/autoheal-memtier-<uid>/          # 0700, owned by the job's user
        <job id>/                           # 0700: one folder per Slurm job (kept across requeues)
            agent.pid                       # the node's agent (for the epilog after a kill -9 of the job)
            warm.pid, warm.sock             # the node's warm interpreter (--preload), its socket
            r00003-s00000120.copy           # rank 3's state at step 120 (memtier_wire frame)

``<base>`` is ``/dev/shm`` (node memory), or ``$AUTOHEAL_MEMTIER_BASE`` with ``{node}`` replaced by the
node's name: the lab runs every "node" on one machine and gives each its own memory this way. The
variable comes from slurmd's environment for the epilog (the admin's) and from the job's for the agent.

Users are hostile: a user can put a symlink, a FIFO or another user's folder wherever they may write.
Root's cleanup opens every folder with ``O_NOFOLLOW | O_DIRECTORY`` and removes below it by file
descriptor (``shutil.rmtree``'s fd-based walk, which never follows a symlink), and kills only processes
that are the job's user's and carry this job's id in their environment. An ``autoheal-memtier-<uid>``
folder that ``<uid>`` does not own (``/dev/shm`` is world-writable: anyone can name a folder for another
user) is nobody's memory folder: root reads nothing in it, signals nothing and removes nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Mapping, Optional, Tuple

# where the folders are: its own small module, so the epilog of a job that never used the tier looks for
# them without importing this one
from autoheal.memtier_base import BASE_ENV, DEFAULT_BASE, base_dir, user_dir, user_ids  # noqa: F401

PIDFILE = "agent.pid"
#: The job's warm interpreter on the node (``sbatch_helpers/warm_zygote.py``, ``--preload``): its socket
#: and pidfile live in the same folder, and the epilog ends it like the agent.
WARM_PIDFILE = "warm.pid"
_JOB_RE = re.compile(r"^[0-9]{1,12}$")


def job_dir(node: str, uid: int, job_id: str, environ: Optional[Mapping[str, str]] = None) -> Path:
    """``<base>/autoheal-memtier-<uid>/<job id>``; ValueError for a job id that is not a plain number."""
    if not _JOB_RE.match(job_id or ""):
        raise ValueError(f"job id {job_id!r} is not a Slurm job id")
    return user_dir(node, uid, environ) / job_id


def _open_dir(path: Path, dir_fd: Optional[int] = None) -> int:
    """An fd of the folder ``path`` that is no symlink (ELOOP/ENOTDIR otherwise)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path if dir_fd is None else path.name, flags, dir_fd=dir_fd)


def _open_user_dir(node: str, uid: int, environ: Optional[Mapping[str, str]]) -> int:
    """An fd of ``uid``'s memory folder, which must be owned by ``uid`` (PermissionError otherwise): in
    ``/dev/shm`` anyone may make a folder named for another user, and a pidfile in it would be that
    other user's lie about the named user's processes (root's epilog signalled them on its word)."""
    fd = _open_dir(user_dir(node, uid, environ))
    if os.fstat(fd).st_uid != uid:
        os.close(fd)
        raise PermissionError(f"the memory folder of uid {uid} belongs to another user")
    return fd


def _proc_is_job_agent(pid: int, uid: int, job_id: str) -> bool:
    """True when ``pid`` is the job's user's process with ``SLURM_JOB_ID=<job id>`` in its environment:
    a pid a hostile user wrote into the pidfile names nobody else's process."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != uid:
            return False
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read(1 << 20).split(b"\0")
    except OSError:
        return False
    return f"SLURM_JOB_ID={job_id}".encode() in env


@dataclass(frozen=True)
class AgentRecord:
    """What the pidfile says: the agent's pid and the run of the job it belongs to (Slurm's restart count
    when it started). Written by the job's user: a lie can only make root keep or free that user's own
    copies, or signal that user's own process (see ``_proc_is_job_agent``)."""

    pid: int
    restarts: int


def _read_record(dfd: int, pidfile: str = PIDFILE) -> Optional[AgentRecord]:
    try:
        fd = os.open(pidfile, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        words = os.read(fd, 64).decode("ascii", "replace").split()
    finally:
        os.close(fd)
    if not words or not all(w.isdigit() for w in words[:2]) or not 1 < int(words[0]) < 1 << 22:
        return None
    return AgentRecord(int(words[0]), int(words[1]) if len(words) > 1 else 0)


def pidfile_text(restarts: int) -> str:
    return f"{os.getpid()} {int(restarts)}\n"


def agent_record(node: str, uid: int, job_id: str, environ: Optional[Mapping[str, str]] = None,
                 pidfile: str = PIDFILE) -> Optional[AgentRecord]:
    """The job's agent record on this node (read without following symlinks), or None; ``pidfile``
    WARM_PIDFILE: its warm interpreter's."""
    try:
        path = job_dir(node, uid, job_id, environ)
        ufd = _open_user_dir(node, uid, environ)
    except (OSError, ValueError):
        return None
    try:
        jfd = _open_dir(path, dir_fd=ufd)
    except OSError:
        return None
    finally:
        os.close(ufd)
    try:
        return _read_record(jfd, pidfile)
    finally:
        os.close(jfd)


def stop_agent(node: str, uid: int, job_id: str, environ: Optional[Mapping[str, str]] = None,
               pidfile: str = PIDFILE) -> Optional[int]:
    """SIGKILL the job's agent (``pidfile`` WARM_PIDFILE: its warm interpreter, whose forked ranks die
    with it) on this node if it still runs (its job was killed -9); the pid or None."""
    rec = agent_record(node, uid, job_id, environ, pidfile)
    if rec is None or not _proc_is_job_agent(rec.pid, uid, job_id):
        return None
    with contextlib.suppress(OSError):
        os.kill(rec.pid, signal.SIGKILL)
        return rec.pid
    return None


def remove_job(node: str, uid: int, job_id: str, environ: Optional[Mapping[str, str]] = None) -> bool:
    """Delete the job's folder on this node without following any symlink; True when one was removed."""
    try:
        job_dir(node, uid, job_id, environ)  # ValueError for a job id that is not one
        ufd = _open_user_dir(node, uid, environ)
    except (OSError, ValueError):
        return False
    try:
        st = os.stat(job_id, dir_fd=ufd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):  # a symlink or file in its place: unlink the name, never follow it
            os.unlink(job_id, dir_fd=ufd)
            return True
        _rmtree_at(ufd, job_id)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(ufd)


def _rmtree_at(dfd: int, name: str, depth: int = 0) -> None:
    """Remove ``name`` in the folder ``dfd`` and everything below it, by file descriptor: each folder is
    opened ``O_NOFOLLOW``, so a symlink swapped in at any moment is unlinked, never followed (Python 3.9
    has no ``shutil.rmtree(dir_fd=)``)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:  # a symlink, file, FIFO...: the name goes, its target is never touched
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dfd)
        return
    try:
        with os.scandir(fd) as entries:
            children = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
        for child, is_dir in children:
            if is_dir and depth < 16:
                _rmtree_at(fd, child, depth + 1)
            else:
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dfd)


def job_dirs(node: str, uid: int, environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """The job ids that have a folder under the user's memory folder on this node."""
    try:
        ufd = _open_user_dir(node, uid, environ)
    except (OSError, ValueError):
        return []
    try:
        return sorted(n for n in os.listdir(ufd) if _JOB_RE.match(n))
    finally:
        os.close(ufd)


#: States in which a job comes back (requeued): its copies are what its next run resumes from.
RESTART_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
OVER_STATES = frozenset({"GONE", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                         "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"})
SWEEP_LIMIT = 8  # other leftover job folders looked at per epilog (each costs one question to Slurm)


JobFacts = Tuple[str, int]  # (state, restart count) as Slurm tells them; state "GONE": Slurm forgot the job


def keep_for_restart(facts: Optional[JobFacts], run_restarts: Optional[int]) -> bool:
    """At a job's epilog on a node: keep its copies for the job's next run?

    Yes when Slurm has requeued it: PENDING again, or a restart count above the one of the run that
    wrote the copies (Slurm reports a requeued job COMPLETING until its epilogs end, like one that is
    over, so the count is what tells them apart), or when Slurm does not answer (freed at a later epilog
    once the job is over). Otherwise (completed, cancelled, failed, or a node leaving a hot-spare job
    that runs on) they are freed now."""
    if facts is None:
        return True
    state, restarts = facts
    if state in RESTART_STATES:
        return True
    return run_restarts is not None and restarts > run_restarts


def epilog_cleanup(node: str, uid: int, job_id: str, facts_of: Callable[[str], Optional[JobFacts]],
                   environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """The epilog's part: kill the job's agent, free the job's copies unless it was requeued, and free
    every user's leftovers of jobs that are over (``sweep_over``). ``facts_of(job)``: the
    job's (state, restart count), state ``GONE`` when Slurm no longer knows it, None when Slurm does not
    answer. Returns one line per action taken."""
    done = []
    rec = agent_record(node, uid, job_id, environ) or agent_record(node, uid, job_id, environ, WARM_PIDFILE)
    pid = stop_agent(node, uid, job_id, environ)
    if pid:
        done.append(f"killed memory-tier agent {pid} of job {job_id}")
    pid = stop_agent(node, uid, job_id, environ, WARM_PIDFILE)
    if pid:
        done.append(f"killed warm interpreter {pid} of job {job_id}")
    if job_id in job_dirs(node, uid, environ):
        facts = facts_of(job_id)
        if keep_for_restart(facts, rec.restarts if rec else None):
            done.append(f"kept memory-tier copies of job {job_id} for its next run ({facts})")
        elif remove_job(node, uid, job_id, environ):
            done.append(f"freed memory-tier copies of job {job_id} ({facts})")
    return done + sweep_over(node, facts_of, job_id, environ)


def sweep_over(node: str, facts_of: Callable[[str], Optional[JobFacts]], skip: str = "",
               environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """Free every user's copies on this node of jobs that are over (``skip``: the calling hook's own job).

    Run by the epilog, the prolog and the healthcheck: a job requeued onto other nodes leaves its copies
    on its old ones, and no epilog of its comes there again; without the prolog a later job would start
    beside them (the bench read a node holding a cancelled job's 4 copies next to the running job's 4),
    without the healthcheck an idle or drained node would hold them until some job ran there. A job
    Slurm does not answer about, or that may run again, is kept. One line per folder freed."""
    done = []
    others = [(u, j) for u in user_ids(node, environ) for j in job_dirs(node, u, environ) if j != skip]
    for owner, job in others[:SWEEP_LIMIT]:
        facts = facts_of(job)
        if facts is not None and facts[0] in OVER_STATES:  # a job that will not run again
            stop_agent(node, owner, job, environ)
            stop_agent(node, owner, job, environ, WARM_PIDFILE)
            if remove_job(node, owner, job, environ):
                done.append(f"freed memory-tier copies of job {job} ({facts[0]})")
    return done
