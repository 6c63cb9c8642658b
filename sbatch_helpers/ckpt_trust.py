"""Whose files a checkpoint is: the uid checks behind resuming one (issue 25, item 8).

Resuming a checkpoint runs its contents (a pickle is code), so a checkpoint must be one this job's user
(or root) wrote, in a place nobody else can swap. The manifest's own ``owner``/``uid`` fields are only
claims anyone can copy; what counts is the file system:

* **the path**: every directory from ``/`` to the checkpoint folder (as written, and after resolving
  symlinks) is owned by root or by a trusted uid, and none is writable by everyone without the sticky
  bit. A job submitted from ``/tmp`` puts its checkpoints in ``/tmp/autoheal-checkpoints/...``: another
  user who created ``/tmp/autoheal-checkpoints`` first owns that folder and could rename the job's
  folder away and put theirs in its place; that path is refused. A symlink on the path must be owned by
  a trusted uid too (in a sticky folder only its owner can replace it).
* **the checkpoint**: its folder, manifest, marker and every file it lists are owned by a trusted uid.
* **the recorded uid** (``uid`` in the manifest, written by every save since this release) is a
  trusted one. A manifest without it (saved by an older release) is accepted when the two checks above
  pass: its files can only have been written by this user or root, and refusing it would lose every
  checkpoint saved before the upgrade.

Trusted uids: root, the effective uid of the process, and the uids listed (comma-separated) in
``AUTOHEAL_CHECKPOINT_TRUSTED_UIDS`` (a teammate whose checkpoints you mean to resume).
"""

from __future__ import annotations

import os
import stat
from typing import FrozenSet, Mapping, Optional, Union

TRUSTED_UIDS_ENV = "AUTOHEAL_CHECKPOINT_TRUSTED_UIDS"
#: Symlinks followed on one path before it is refused (a loop, or an absurd chain).
_MAX_LINKS = 40


def trusted_uids(environ: Optional[Mapping[str, str]] = None, euid: Optional[int] = None) -> FrozenSet[int]:
    """Root, ``euid`` (default: this process's) and the uids of ``AUTOHEAL_CHECKPOINT_TRUSTED_UIDS``."""
    env = os.environ if environ is None else environ
    uids = {0, os.geteuid() if euid is None else euid}
    for part in env.get(TRUSTED_UIDS_ENV, "").split(","):
        part = part.strip()
        if part.isdigit():
            uids.add(int(part))
    return frozenset(uids)


def _owner_problem(what: str, st: os.stat_result, uids: FrozenSet[int]) -> Optional[str]:
    if st.st_uid not in uids:
        return f"{what} is owned by uid {st.st_uid}, not by this job's user or root"
    return None


def _dir_problem(path: str, st: os.stat_result, uids: FrozenSet[int]) -> Optional[str]:
    problem = _owner_problem(f"folder {path}", st, uids)
    if problem:
        return problem
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        return f"folder {path} is writable by every user and has no sticky bit (anyone can swap what is in it)"
    return None


def path_problem(path: Union[str, os.PathLike[str]], uids: FrozenSet[int]) -> Optional[str]:
    """Why ``path`` (a checkpoint folder, or a checkpoint inside one) is not safe to resume from, or None.

    Only the parts of the path that exist are checked (a folder not made yet holds nothing to resume).
    """
    return _walk(os.path.abspath(os.fspath(path)), uids, [0])


def _walk(path: str, uids: FrozenSet[int], links: list) -> Optional[str]:
    cur = "/"
    parts = [p for p in path.split("/") if p]
    try:
        st = os.lstat(cur)
    except OSError as exc:
        return f"cannot check {cur}: {exc.strerror}"
    problem = _dir_problem(cur, st, uids)
    if problem:
        return problem
    for i, part in enumerate(parts):
        nxt = os.path.join(cur, part)
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"cannot check {nxt}: {exc.strerror}"
        if stat.S_ISLNK(st.st_mode):
            problem = _owner_problem(f"symlink {nxt}", st, uids)
            if problem:
                return problem
            links[0] += 1
            if links[0] > _MAX_LINKS:
                return f"too many symlinks on the path {path}"
            try:
                target = os.readlink(nxt)
            except OSError as exc:
                return f"cannot read symlink {nxt}: {exc.strerror}"
            rest = "/".join(parts[i + 1:])
            resolved = os.path.normpath(os.path.join(cur, target, rest) if rest else os.path.join(cur, target))
            return _walk(resolved, uids, links)
        if stat.S_ISDIR(st.st_mode):
            problem = _dir_problem(nxt, st, uids)
        else:  # the last part may be a file (a checkpoint's payload); its owner still counts
            problem = _owner_problem(nxt, st, uids)
        if problem:
            return problem
        cur = nxt
    return None


def file_problem(path: str, st: os.stat_result, uids: FrozenSet[int]) -> Optional[str]:
    """Why one file or folder of a checkpoint (already ``lstat``'ed) is not trusted, or None."""
    return _owner_problem(os.path.basename(path) or path, st, uids)
