"""Exclusive locks that only the writers' own user can take, with bounded waits.

``flock`` needs nothing but an open descriptor, and a read-only one will do: a lock file any user can
open (0644, or one in a directory they can read) is a lock any user can hold forever, and the root-run
hooks then wait behind them (issue 25 item 2). So every lock file lives in a ``locks`` directory beside
the data it guards, created mode 0700 and owned by the writer (root on a node), the lock files mode 0600
in it, opened with O_NOFOLLOW: nobody else can open them, so nobody else can lock them.

A ``locks`` directory that exists but belongs to another user, or is a symlink, is refused
(``LockDirError``), never used; one of ours with looser modes is tightened. Waits are bounded: after
``timeout`` seconds ``LockTimeout`` (a TimeoutError) says who waited for what, and the caller decides
what its work does without the lock (each caller says so where it takes one).

Lock files of older releases (``state.lock``, ``pass.lock`` in the state dir; the journal file itself)
are no longer locked: a descriptor a user opened on one of them before the upgrade locks nothing now.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from pathlib import Path  # pathlib only where a caller wants a Path: the hooks lock without it
    from typing import Iterator, Union

#: The directory, beside the guarded data, that holds its lock files.
LOCK_DIR = "locks"


class LockTimeout(TimeoutError):
    """The lock stayed held by another process for the whole wait."""


class LockDirError(PermissionError):
    """The lock directory cannot be trusted (another user's, a symlink, not a directory)."""


def private_dir(path: Union[str, Path]) -> Path:
    """``path`` as a directory only this user can enter: created mode 0700, or checked (a directory, not a
    symlink, owned by us; group and other access removed when we own it). LockDirError otherwise."""
    from pathlib import Path

    return Path(_private_dir(os.fspath(path)))


def _private_dir(path: str) -> str:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise LockDirError(f"{path}: not a directory of ours (a symlink or a file): refusing to lock in it")
    if st.st_uid != os.geteuid():
        raise LockDirError(f"{path}: owned by uid {st.st_uid}, not by uid {os.geteuid()}: refusing to lock in it")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def lock_path(base: Union[str, Path], name: str) -> Path:
    """Where the lock ``name`` guarding data in the directory ``base`` lives (``base/locks/name``)."""
    from pathlib import Path

    return Path(base) / LOCK_DIR / name


@contextlib.contextmanager
def exclusive(base: Union[str, Path], name: str, timeout: float, what: str = "held by another process for") \
        -> Iterator[None]:
    """Hold the exclusive lock ``name`` of the directory ``base`` (created, with ``base/locks``, when
    missing), waiting at most ``timeout`` seconds: then LockTimeout ``"<lock>: <what> <timeout>s"``.
    OSError (LockDirError among them) when the lock cannot be opened at all."""
    os.makedirs(base, exist_ok=True)
    path = os.path.join(_private_dir(os.path.join(base, LOCK_DIR)), name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            # not ours, or opened up: someone swapped the directory under us; another user may hold it
            raise LockDirError(f"{path}: owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}, "
                               f"not ours (uid {os.geteuid()}, 600): refusing it")
        deadline = time.monotonic() + timeout
        pause = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"{path}: {what} {timeout:g}s") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
        yield
    finally:
        os.close(fd)
