"""DCGM exporter job mapping: ``<dir>/<gpu index>`` files holding the ids of jobs using that GPU.

The prolog adds the job to its GPUs' files, the epilog removes it. GPU indices come from
SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES when Slurm sets them, else from the Slurm adapter (``scontrol -d
show job``: ``GRES=gpu:2(IDX:0-1)``) with a short timeout: the prolog must never block on slurmctld.
"""

from __future__ import annotations

import fcntl
import os
from typing import TYPE_CHECKING, List, Mapping

from autoheal.slurm.parse import gpu_indices as parse_indices
from autoheal.slurm.parse import job_gpus_from_show_job as indices_from_show_job

if TYPE_CHECKING:
    from autoheal.slurm.base import SlurmAdapter

__all__ = ["add_job", "indices_from_show_job", "job_gpus", "parse_indices", "remove_job"]


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


def _update(path: str, job: str, add: bool) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with os.fdopen(os.dup(fd), "r+", encoding="utf-8") as fh:
            jobs = [ln.strip() for ln in fh.read().splitlines() if ln.strip()]
            jobs = [j for j in jobs if j != job] + ([job] if add else [])
            fh.seek(0)
            fh.truncate()
            fh.write("".join(j + "\n" for j in jobs))
    finally:
        os.close(fd)


def add_job(mapping_dir: str, job: str, gpus: List[int]) -> None:
    os.makedirs(mapping_dir, exist_ok=True)
    for g in gpus:
        _update(os.path.join(mapping_dir, str(int(g))), job, True)


def remove_job(mapping_dir: str, job: str) -> None:
    """Remove ``job`` from every GPU file (the epilog may not know the GPUs any more)."""
    try:
        names = os.listdir(mapping_dir)
    except OSError:
        return
    for name in names:
        if name.replace(".", "").isdigit():
            _update(os.path.join(mapping_dir, name), job, False)
