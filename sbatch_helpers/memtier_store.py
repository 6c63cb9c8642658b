"""One node's copies of a job's rank states, in node memory (``autoheal/memtier_files.py`` has the layout).

Only the node's agent writes here. A copy is published like a durable checkpoint, at memory speed: a
temporary file of our own (``O_EXCL | O_NOFOLLOW``), then one ``rename`` to ``r<rank>-s<step>.copy``; a
reader never sees half a copy under a copy's name, and every read is verified again (``memtier_wire``)
in case someone else wrote there. The folder is opened once, without following symlinks, and must be
the job's user's and private (0700): another user's folder in its place disables the tier, never
leaks the state into it.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from autoheal import memtier_files
from autoheal.sbatch_helpers import memtier_wire as wire

_COPY_RE = re.compile(r"^r(\d{5,})-s(\d{8,})\.copy$")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class StoreError(Exception):
    """The node's memory folder cannot be used; one line saying why."""


def copy_name(rank: int, step: int) -> str:
    return f"r{rank:05d}-s{step:08d}.copy"


def parse_copy_name(name: str) -> Optional[tuple]:
    m = _COPY_RE.match(name)
    if not m:
        return None
    rank, step = int(m.group(1)), int(m.group(2))
    return (rank, step) if copy_name(rank, step) == name else None


def _private_dir(path: Path, parent_fd: Optional[int]) -> int:
    """Create (0700) or open the folder ``path``; it must be ours, private, and no symlink."""
    name = path.name if parent_fd is not None else str(path)
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        raise StoreError(f"{path}: {exc.strerror} (a symlink or file in place of the memory folder?)") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        os.close(fd)
        raise StoreError(f"{path} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}; "
                         f"the memory tier needs its own private folder")
    return fd


class CopyStore:
    """The job's copies on this node: ``keep`` newest per rank."""

    def __init__(self, directory: Path, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = directory
        self.keep = keep
        base = os.open(str(directory.parent.parent), _DIR_FLAGS)  # /dev/shm (or the lab node's memory)
        try:
            ufd = _private_dir(directory.parent, base)
        finally:
            os.close(base)
        try:
            self.fd = _private_dir(directory, ufd)
        finally:
            os.close(ufd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def write_pidfile(self, restarts: int, name: str = memtier_files.PIDFILE) -> None:
        """For the epilog: this agent's pid and the job's restart count of this run (``name``: another
        process of the job that the epilog ends, e.g. the warm interpreter's ``warm.pid``)."""
        self._publish(name, memtier_files.pidfile_text(restarts).encode())

    def _publish(self, name: str, data: Union[bytes, bytearray]) -> None:
        tmp = f".tmp-{name}-{os.getpid()}-{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=self.fd)
        try:
            with open(fd, "wb", closefd=True) as f:
                f.write(data)
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise

    def put(self, rank: int, step: int, frame: Union[bytes, bytearray]) -> None:
        """Publish one verified copy and drop the rank's surplus ones (oldest first)."""
        self._publish(copy_name(rank, step), frame)
        for old in wire.surplus(self.steps().get(rank, []), self.keep):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(copy_name(rank, old), dir_fd=self.fd)

    def steps(self) -> Dict[int, List[int]]:
        """Steps held per rank (by name; the contents are verified on reading)."""
        held: Dict[int, List[int]] = {}
        for name in os.listdir(self.fd):
            parsed = parse_copy_name(name)
            if parsed:
                held.setdefault(parsed[0], []).append(parsed[1])
        return {r: sorted(s) for r, s in held.items()}

    def read(self, rank: int, step: int, limit: int) -> bytes:
        """The raw copy (regular files only; never blocks on a FIFO someone put there)."""
        fd = os.open(copy_name(rank, step), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=self.fd)
        with open(fd, "rb", closefd=True) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise wire.FrameError(f"{copy_name(rank, step)} is not a regular file of ours")
            if st.st_size > limit + wire.PREFIX.size + wire.MAX_HEADER + wire.MAC_BYTES:
                raise wire.FrameError(f"{copy_name(rank, step)} is too large")
            return f.read()

    def newest(self, rank: int, key: bytes, job_id: str, limit: int,
               only: Optional[int] = None) -> Optional[Tuple[wire.Frame, bytes]]:
        """The newest copy of ``rank`` here (of step ``only`` if given) that verifies; torn or foreign ones
        are skipped (and deleted)."""
        for step in reversed(self.steps().get(rank, [])):
            if only is not None and step != only:
                continue
            try:
                raw = self.read(rank, step, limit)
                frame = wire.read_frame(wire.reader_of(raw), key, limit)
                info = wire.copy_info(frame, job_id, rank)
                if info.step != step:
                    raise wire.FrameError(f"holds step {info.step}, named step {step}")
                return frame, raw
            except (OSError, wire.FrameError):
                with contextlib.suppress(OSError):
                    os.unlink(copy_name(rank, step), dir_fd=self.fd)
        return None
