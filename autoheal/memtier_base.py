"""Where the peer-memory checkpoint tier keeps its folders on a node (``autoheal/memtier_files.py`` has the
layout and root's cleanup, and re-exports these).

Its own small module because the epilog of every job asks ``user_ids`` first and imports the cleanup only
when a memory folder exists: most jobs never use the tier, and the epilog's start is paid on every node
after every job.
"""

from __future__ import annotations

import os
import re
import stat

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from pathlib import Path  # pathlib only for callers that want a Path: the epilog's look goes without
    from typing import List, Mapping, Optional

BASE_ENV = "AUTOHEAL_MEMTIER_BASE"
DEFAULT_BASE = "/dev/shm"
USER_DIR_PREFIX = "autoheal-memtier-"
_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def base_dir(node: str, environ: Optional[Mapping[str, str]] = None) -> Path:
    """The node's memory folder (``/dev/shm`` unless ``AUTOHEAL_MEMTIER_BASE`` says otherwise)."""
    from pathlib import Path

    return Path(_base(node, environ))


def base_path(node: str, environ: Optional[Mapping[str, str]] = None) -> str:
    """``base_dir`` as a string, for callers that start fast without pathlib (``autoheal-warm``)."""
    return _base(node, environ)


def _base(node: str, environ: Optional[Mapping[str, str]]) -> str:
    env = os.environ if environ is None else environ
    template = env.get(BASE_ENV, "").strip() or DEFAULT_BASE
    if "{node}" in template:
        if not _NODE_RE.match(node or ""):
            raise ValueError(f"node name {node!r} is not usable in a path")
        template = template.replace("{node}", node)
    return template


def user_dir(node: str, uid: int, environ: Optional[Mapping[str, str]] = None) -> Path:
    return base_dir(node, environ) / f"{USER_DIR_PREFIX}{int(uid)}"


def user_ids(node: str, environ: Optional[Mapping[str, str]] = None) -> List[int]:
    """The uids that have a memory folder on this node (one listing of ``/dev/shm``): a folder that is
    not owned by the uid its name says is another user's, planted in the world-writable ``/dev/shm`` (a
    user may name a folder for anyone), and is never one (``owns``)."""
    try:
        base = _base(node, environ)
        names = os.listdir(base)
    except (OSError, ValueError):
        return []
    cut = len(USER_DIR_PREFIX)
    return sorted(uid for uid in (int(n[cut:]) for n in names if n.startswith(USER_DIR_PREFIX) and n[cut:].isdigit())
                  if owns(base, uid))


def owns(base: str, uid: int) -> bool:
    """``<base>/autoheal-memtier-<uid>`` is a folder (no symlink) owned by ``uid``: only then is what it
    holds that user's word, about that user's own jobs and processes."""
    try:
        st = os.stat(os.path.join(base, f"{USER_DIR_PREFIX}{int(uid)}"), follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid
