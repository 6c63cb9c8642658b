"""Replace a file atomically without trusting the directory's other users.

A fixed temporary name (``.name.tmp``) opened with a plain ``open(..., "w")`` follows a symlink another
user planted under that name, and root then writes wherever it points (issue 25 item 8: xid-watch's
textfile in the node-exporter directory). Here the temporary file gets a random name, created with
O_CREAT|O_EXCL|O_NOFOLLOW (what ``tempfile.mkstemp`` does; not imported: the hooks start fast), is
written and fsync'd, given its final mode, and renamed over the target: a name planted in advance is
never opened, and the rename replaces a planted symlink itself, never what it points to.
"""

from __future__ import annotations

import contextlib
import os

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Tuple, Union

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _mkstemp(directory: str, name: str) -> Tuple[int, str]:
    """A new file ``directory/.name.<random>.tmp``, mode 0600, that did not exist before (O_EXCL)."""
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, _CREATE, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{directory}: no free temporary name for {name}")


def write_atomic(path: Union[str, Path], data: bytes, mode: int = 0o644, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` (in an existing directory) through a fresh temporary file and a rename.
    On any error the temporary file is removed and the error raised; ``path`` keeps its old content."""
    path = os.fspath(path)  # os.path, not pathlib: the hooks write their state with this (start-up time)
    fd, tmp = _mkstemp(os.path.dirname(path), os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)  # mkstemp makes it 0600; readers (node-exporter) need the mode
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
