"""Clean start of a lab directory: forget the cluster state an earlier lab left behind.

A lab reused without this finishes the previous run's story: slurmctld recovers its old jobs and
drains, ``autoheal sync`` completes an old remediation (retires a node, uses up the spare), the hooks
re-read old XIDs from the kernel logs, and the spare pool thinks its spares are taken. ``autoheal lab
up`` therefore empties these directories first, unless ``--keep-state``.

Only directories with these fixed names directly under a directory that already holds a lab
(``lab.json``) are emptied. Every path is resolved first: a state directory that is a symlink leading
out of the lab directory is refused (nothing is deleted), and symlinks met inside are unlinked, never
followed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import List

from autoheal.errors import AutohealError

#: What a run leaves behind, each a directory under the lab root:
#: Slurm (StateSaveLocation, slurmd spool, pid files and sockets), autoheal (journal, per-node hook
#: state, node-exporter textfiles, dcgm job mapping), the fake hardware (GPU state and XID events,
#: kernel logs), Kubernetes (the control plane's etcd data and certificates, kubeconfig, the spare pool's
#: spares-used.json) and the drills (job output and checkpoint dirs).
STATE_DIRS = ("state", "spool", "run", "journal", "nodestate", "metrics", "dcgm", "gpus", "kmsg", "kube", "drill")
#: Kept: configuration (etc/, with a hand-edited autoheal.toml), munge's key, logs, the fake NVML build,
#: hook wrappers and device placeholders. None of it carries cluster state.
MARKER = "lab.json"


class UnsafeCleanup(AutohealError):
    """Cleaning would touch something outside the lab directory: nothing was deleted."""


def _inside(path: Path, root: Path) -> bool:
    return path != root and root in path.parents


def plan(root: Path) -> List[Path]:
    """The resolved state directories to empty under ``root``; raises UnsafeCleanup before anything is
    deleted when one of them leads outside ``root``. Empty when ``root`` holds no lab."""
    root = Path(root).resolve()
    if root == Path(root.anchor):
        raise UnsafeCleanup(f"{root}: refusing to clean the filesystem root as a lab directory")
    marker = root / MARKER
    if marker.is_symlink() or not marker.is_file():
        return []  # no lab here (or a planted marker): nothing of ours to clean
    out = []
    for name in STATE_DIRS:
        path = root / name
        if not (path.exists() or path.is_symlink()):
            continue
        target = path.resolve()
        if not _inside(target, root):
            raise UnsafeCleanup(f"{path} leads to {target}, outside the lab directory {root}: refusing to clean "
                                f"it (remove the link, or keep the state with --keep-state)")
        out.append(target)
    return out


def empty_dir(path: Path) -> None:
    """Remove everything inside ``path`` (kept itself): files and symlinks are unlinked (a symlink's target
    is never touched), directories removed with ``shutil.rmtree`` (which does not follow symlinks)."""
    if not path.is_dir():
        path.unlink()
        return
    for entry in os.scandir(path):
        p = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(p)
        else:
            p.unlink()


def clean(root: Path) -> List[str]:
    """Empty the lab's state directories under ``root``; returns the paths emptied."""
    targets = plan(root)
    for target in targets:
        empty_dir(target)
    return [str(t) for t in targets]
