"""DCGM exporter job mapping: ``<dir>/<gpu index>`` files holding the ids of jobs using that GPU.

The prolog adds the job to its GPUs' files, the epilog removes it. GPU indices come from
SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES when Slurm sets them, else from ``scontrol -d show job``
(``GRES=gpu:2(IDX:0-1)``) with a short timeout: the prolog must never block on slurmctld.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
from typing import Dict, List, Mapping, Optional

_IDX_RE = re.compile(r"\(IDX:([0-9,\-]+)\)")


def parse_indices(text: str) -> List[int]:
    """``0-1,4`` -> [0, 1, 4]; anything malformed -> []."""
    out: List[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
        except ValueError:
            return []
    return sorted(set(i for i in out if 0 <= i < 1024))


def indices_from_show_job(text: str, node: str) -> List[int]:
    """GPU indices of ``node`` in ``scontrol -d show job`` output (``Nodes=gpu1 ... GRES=gpu:2(IDX:0-1)``)."""
    from autoheal.slurm.hostlist import expand

    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("Nodes=") or "IDX:" not in line:
            continue
        names = line.split()[0].split("=", 1)[1]
        try:
            if node not in expand(names):
                continue
        except Exception:
            continue
        m = _IDX_RE.search(line)
        if m:
            return parse_indices(m.group(1))
    return []


def job_gpus(env: Mapping[str, str], node: str, slurm_bin: str, timeout: float,
             slurm_env: Optional[Dict[str, str]] = None) -> List[int]:
    """The job's GPU indices on this node ([] when nobody can say within ``timeout``)."""
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
        res = subprocess.run([slurm_bin, "-d", "show", "job", job], capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL, env=slurm_env)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return indices_from_show_job(res.stdout, node) if res.returncode == 0 else []


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
