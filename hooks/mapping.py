"""DCGM exporter job mapping: ``<dir>/<gpu index>`` files holding the ids of jobs using that GPU.

The prolog adds the job to its GPUs' files, the epilog removes it. The files are read by dcgm-exporter
(any user may read them), so they are not their own lock: updates are serialised by
``<state_dir>/locks/dcgm-mapping.lock`` (``autoheal.lockfile``: only root can open it), waited for at
most ``timeout`` seconds: the prolog and epilog delay every job. A lock that stays held (a stuck hook)
or cannot be opened (a read-only or full state dir) costs the lock, not the mapping: the update is made
without it and the trouble returned for the hook to report (without the lock, two prologs updating the
same GPU's file at the same instant may lose one's update; neither leaves half a file). Each file is
replaced atomically (``autoheal.atomicfile``: a fresh temporary name, O_EXCL|O_NOFOLLOW), so
dcgm-exporter never reads half a file and a symlink planted in the directory is replaced, never written
through. GPU indices come from
SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES when Slurm sets them, else from the Slurm adapter (``scontrol -d
show job``: ``GRES=gpu:2(IDX:0-1)``) with a short timeout: the prolog must never block on slurmctld.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import List, Mapping, Optional, Tuple

    from autoheal.slurm.base import SlurmAdapter

__all__ = ["add_job", "indices_from_show_job", "job_gpus", "parse_indices", "remove_job"]


# Slurm's parsers, imported when called: ``autoheal.slurm.parse`` brings the Slurm model with it (6 ms of
# every prolog's and epilog's start, measured 2026-12-03), and most runs never parse a GPU list (the
# epilog only removes the job; a prolog without a mapping dir writes nothing).
def parse_indices(text: str) -> List[int]:
    """``autoheal.slurm.parse.gpu_indices``: ``0,2-3`` -> [0, 2, 3]; anything malformed -> []."""
    from autoheal.slurm.parse import gpu_indices

    return gpu_indices(text)


def indices_from_show_job(text: str, node: str) -> List[int]:
    """``autoheal.slurm.parse.job_gpus_from_show_job``: the GPU indices ``scontrol show job -d`` gives."""
    from autoheal.slurm.parse import job_gpus_from_show_job

    return job_gpus_from_show_job(text, node)


def job_gpus(env: Mapping[str, str], node: str, slurm: SlurmAdapter, timeout: float) -> List[int]:
    """The job's GPU indices on this node ([] when nobody can say within ``timeout``); ``slurm`` is the
    Slurm adapter, asked only when the environment does not say."""
    from autoheal.errors import SlurmError

    for key in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
        val = env.get(key, "")
        if val and all(c.isdigit() or c in ",-" for c in val):
            got = parse_indices(val)
            if got:
                return got
    job = env.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return []
    try:
        return slurm.job_gpus(job, node, timeout=timeout)
    except SlurmError:
        return []


#: The lock of the mapping directory, in the node state dir's ``locks``.
LOCK_NAME = "dcgm-mapping.lock"
#: Default seconds an update waits for the lock (another prolog or epilog holds it for a few file writes).
LOCK_TIMEOUT = 2.0


def _update(path: str, job: str, add: bool) -> None:
    from autoheal.atomicfile import write_atomic

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ELOOP):  # ELOOP: a symlink planted there, replaced below
            raise
        text = ""
    else:
        with os.fdopen(fd, encoding="utf-8", errors="replace") as fh:
            text = fh.read(1 << 20) if stat.S_ISREG(os.fstat(fd).st_mode) else ""
    jobs = [ln.strip() for ln in text.splitlines() if ln.strip()]
    jobs = [j for j in jobs if j != job] + ([job] if add else [])
    write_atomic(path, "".join(j + "\n" for j in jobs).encode(), mode=0o644, fsync=False)


def _lock(lock_base: str, timeout: Optional[float]) -> Tuple[contextlib.ExitStack, str]:
    """The mapping lock (held until the returned stack is closed), or an empty stack and why not."""
    from autoheal.lockfile import exclusive

    stack = contextlib.ExitStack()
    wait = LOCK_TIMEOUT if timeout is None else timeout
    try:
        stack.enter_context(exclusive(lock_base, LOCK_NAME, wait, "held by another prolog or epilog for"))
    except (OSError, ValueError) as exc:  # LockTimeout, LockDirError, a read-only or full state dir
        return stack, f"lock: {getattr(exc, 'strerror', None) or exc}; updated without it"
    return stack, ""


def add_job(mapping_dir: str, job: str, gpus: List[int], lock_base: str, timeout: Optional[float] = None) -> str:
    """Add ``job`` to the files of ``gpus``, under the lock in ``lock_base`` (the node state dir), waiting
    at most ``timeout`` (default ``LOCK_TIMEOUT``) seconds for it. Returns "" or the lock's trouble (the
    update was made all the same); OSError when a file cannot be written."""
    os.makedirs(mapping_dir, exist_ok=True)
    lock, trouble = _lock(lock_base, timeout)
    with lock:
        for g in gpus:
            _update(os.path.join(mapping_dir, str(int(g))), job, True)
    return trouble


def remove_job(mapping_dir: str, job: str, lock_base: str, timeout: Optional[float] = None) -> str:
    """Remove ``job`` from every GPU file (the epilog may not know the GPUs any more); returns as
    ``add_job``."""
    try:
        names = os.listdir(mapping_dir)
    except OSError:
        return ""
    lock, trouble = _lock(lock_base, timeout)
    with lock:
        for name in names:
            if name.replace(".", "").isdigit():  # "<gpu>" (and "<gpu>.<instance>"), never our temporaries
                _update(os.path.join(mapping_dir, name), job, False)
    return trouble
