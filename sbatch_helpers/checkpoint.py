"""Crash-safe checkpoints that a requeued job can trust.

Layout of a checkpoint directory::

    <directory>/
        latest                      # one line: the name of the checkpoint saved last
        ckpt-00000042/
            payload.bin             # or any files a writer put there (sub-folders allowed)
            MANIFEST.json           # step, time, files with size and sha256, metadata
            COMPLETE                # written LAST; names the manifest's sha256
        .tmp-ckpt-00000043-1234-9f3a1c/   # a save in progress (or a leftover of a killed one)

Save protocol: write into ``.tmp-ckpt-<step>-<pid>-<random>``, fsync every file and folder, write the
manifest, then ``COMPLETE`` (each: unique temp file, fsync, rename, fsync), then publish the folder with
one rename to ``ckpt-<step>`` and fsync the parent; finally point ``latest`` at it. A writer killed at
any point leaves either the previous checkpoints untouched plus a leftover that loading ignores, or
the new checkpoint complete. Re-saving a step that exists swaps the two folders atomically
(``renameat2(RENAME_EXCHANGE)``; where the filesystem lacks it, the old copy is moved aside and put back
if publishing fails), so the newest valid checkpoint is never removed before its successor is in place.

Errors: a save that fails on the filesystem (ENOSPC, read-only, RLIMIT_FSIZE, a folder removed by
someone else...) raises :class:`CheckpointIOError` -- a :class:`CheckpointError` and an ``OSError`` with
its ``errno`` -- whose message is one line naming the path and the cause; the temporary folder is
removed and nothing older is touched. Once the rename published the checkpoint, the save succeeds:
failing to update ``latest`` (only a hint for pruning and humans) is logged, not raised. Temporary
names are unique per process, thread and call, so concurrent savers into one folder (threads,
processes, hosts sharing a file system) never rename each other's files.

Load: the newest checkpoint by step whose marker is present and whose manifest verifies (sizes only,
or sizes and sha256) wins; each newer candidate that was rejected is logged with its reason.

The high-level functions never raise on corrupt or hostile directory contents: they reject the
candidate and move on. ``load`` raises :class:`NoValidCheckpoint` with a one-line summary. Reading opens
regular files only (``O_NOFOLLOW | O_NONBLOCK``, then ``fstat``): a FIFO, socket, device or folder named
``latest``, ``COMPLETE``, ``MANIFEST.json`` or like a payload file makes its candidate invalid (logged)
instead of blocking the job runner forever in ``open()`` or ``read()``.

Fast tier (opt-in, ``memtier*.py``): :func:`memory_tier` keeps each rank's state in node memory and on a
peer node every K steps, next to these durable checkpoints every N; a restart takes the newest valid
copy of either (``memtier.resume_source``).

Owner: under ``autoheal sbatch`` every submission has a random token (``AUTOHEAL_SUBMIT_TOKEN``, the same
for every requeue of the job). A save records it with the job id as the manifest's ``owner``. Loading
refuses a checkpoint whose owner has this job's id but another token -- an earlier job that got the same
id, e.g. after the cluster's job ids were reset -- unless ``AUTOHEAL_ALLOW_FOREIGN_CHECKPOINT=1`` (or
``allow_foreign=True``). Checkpoints without an owner (older ones, code run outside autoheal sbatch) and
checkpoints of other job ids (a folder shared on purpose, e.g. one ``--checkpoint-dir`` for a chain of
jobs) load as before. Pruning never deletes such a foreign checkpoint, and a save never overwrites one:
it is kept under ``ckpt-<step>.foreign-<token>`` (a name loading ignores).

Users (issue 25, item 8; ``ckpt_trust.py``): the token and job id say which *job* saved a checkpoint, not
which *user*: both can be copied. Every save also records ``uid`` (the saver's effective uid), and
loading only accepts a checkpoint whose folder, manifest, marker and files are owned by a trusted uid
(root, this process's user, ``AUTOHEAL_CHECKPOINT_TRUSTED_UIDS``), whose recorded ``uid`` (when there is
one) is trusted, and whose folder lies on a path no other user can swap (every folder on it owned by a
trusted uid, none world-writable without the sticky bit). A manifest without ``uid`` (older releases)
loads when the owner checks pass.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import itertools
import json
import logging
import os
import re
import secrets
import shutil
import socket
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Mapping, Optional, Set, Tuple, Union

from autoheal.sbatch_helpers.ckpt_trust import TRUSTED_UIDS_ENV, file_problem, path_problem, trusted_uids
from autoheal.sbatch_helpers.progress import heartbeat_file, saving_at

log = logging.getLogger(__name__)

FORMAT = "autoheal-checkpoint/1"
PREFIX = "ckpt-"
STEP_DIGITS = 8
MANIFEST = "MANIFEST.json"
MARKER = "COMPLETE"
LATEST = "latest"
PAYLOAD = "payload.bin"
TMP_PREFIX = ".tmp-"
DEL_PREFIX = ".del-"
RESERVED = frozenset({MANIFEST, MARKER})
VERIFY_MODES = ("sha256", "size")

DEFAULT_STALE_AGE = 6 * 3600.0
DEFAULT_SHARD_TIMEOUT = 600.0
_MAX_MANIFEST_BYTES = 64 * 1024 * 1024
#: Environment (set by the script ``autoheal sbatch`` generates; see ``wrapper.py``).
TOKEN_ENV = "AUTOHEAL_SUBMIT_TOKEN"
ALLOW_FOREIGN_ENV = "AUTOHEAL_ALLOW_FOREIGN_CHECKPOINT"
TOKEN_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_TRUE = frozenset({"1", "true", "yes", "on"})
_NAME_RE = re.compile(r"^ckpt-(\d{%d,})$" % STEP_DIGITS)
_SHARD_RE = re.compile(r"^shard-(\d{5,})-of-(\d{5,})\.bin$")
_CHUNK = 1024 * 1024

Writer = Callable[[Any], None]
Payload = Union[bytes, bytearray, memoryview, Writer]


class CheckpointError(Exception):
    """A save could not complete, or an argument is invalid."""


class CheckpointIOError(CheckpointError, OSError):
    """A save failed on the filesystem. ``str()`` is one line naming the path and the cause; ``errno``
    and ``filename`` are the underlying OSError's (so ``except OSError`` code keeps working)."""

    def __init__(self, message: str, errno_: Optional[int] = None, filename: Optional[str] = None):
        if errno_ is None:
            OSError.__init__(self, message)
        else:
            OSError.__init__(self, errno_, message, filename)
        self.message = message

    def __str__(self) -> str:
        return self.message


class NoValidCheckpoint(CheckpointError):
    """No checkpoint in the directory passed validation; the message says what was found and why."""


class ShardTimeout(CheckpointError):
    """The designated rank gave up waiting for the other ranks' shards."""


@dataclass(frozen=True)
class Rejection:
    """Why one candidate (a checkpoint name, or ``latest``) was not used."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


def _fault(point: str) -> None:
    """Test hook called at each step of the save protocol; tests replace it to kill the writer."""


# ---------------------------------------------------------------- names


def checkpoint_name(step: int) -> str:
    """``ckpt-00000042`` for step 42."""
    return f"{PREFIX}{_check_step(step):0{STEP_DIGITS}d}"


def parse_name(name: str) -> Optional[int]:
    """The step of a canonical checkpoint name, or None for names that are not ours."""
    m = _NAME_RE.match(name)
    if not m:
        return None
    step = int(m.group(1))
    return step if checkpoint_name(step) == name else None


def checkpoint_step(path: Union[str, os.PathLike[str]]) -> int:
    """The step of a checkpoint directory (or of a file inside one); ValueError if it is not one."""
    p = Path(path)
    for candidate in (p, p.parent):
        step = parse_name(candidate.name)
        if step is not None:
            return step
    raise ValueError(f"not a checkpoint path (expected .../{PREFIX}<{STEP_DIGITS} digits>): {path}")


def _check_step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"step must be a non-negative int, got {step!r}")
    return step


def _check_verify(verify: str) -> str:
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
    return verify


def _launched(env: Mapping[str, str]) -> bool:
    """Started by a per-process launcher (torchrun, accelerate, deepspeed): it sets ``LOCAL_RANK`` and its
    own ``RANK``/``WORLD_SIZE``, while every worker of one srun task shares that task's SLURM_PROCID."""
    return env.get("LOCAL_RANK", "").strip().isdigit()


def env_rank(environ: Optional[Mapping[str, str]] = None) -> int:
    """This process's rank: ``SLURM_PROCID``, else ``RANK``, else 0; under a launcher (``LOCAL_RANK``
    set, e.g. torchrun) its ``RANK`` first."""
    env = os.environ if environ is None else environ
    keys = ("RANK", "SLURM_PROCID") if _launched(env) else ("SLURM_PROCID", "RANK")
    for key in keys:
        value = env.get(key, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def env_world_size(environ: Optional[Mapping[str, str]] = None) -> int:
    """Number of ranks: ``SLURM_NTASKS``, else ``WORLD_SIZE``, else 1; under a launcher its
    ``WORLD_SIZE`` first."""
    env = os.environ if environ is None else environ
    keys = ("WORLD_SIZE", "SLURM_NTASKS") if _launched(env) else ("SLURM_NTASKS", "WORLD_SIZE")
    for key in keys:
        value = env.get(key, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


# ---------------------------------------------------------------- owner: which job wrote a checkpoint


def env_job_id(environ: Optional[Mapping[str, str]] = None) -> str:
    """``123``, or ``123_4`` for an array task (as the job runner names the job); "" outside Slurm."""
    env = os.environ if environ is None else environ
    array, task = env.get("SLURM_ARRAY_JOB_ID", "").strip(), env.get("SLURM_ARRAY_TASK_ID", "").strip()
    if array and task:
        return f"{array}_{task}"
    return (env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "").strip()


@dataclass(frozen=True)
class Owner:
    """Who wrote a checkpoint: the Slurm job id and the token of the ``autoheal sbatch`` submission."""

    job_id: str
    token: str

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> Optional[Owner]:
        """This process's owner: ``AUTOHEAL_SUBMIT_TOKEN`` plus the job id; None without a token."""
        env = os.environ if environ is None else environ
        token = env.get(TOKEN_ENV, "").strip()
        if not token:
            return None
        if not TOKEN_PATTERN.match(token):
            log.warning("ignoring %s=%r: not a submission token; checkpoint owners are not recorded or checked",
                        TOKEN_ENV, token[:80])
            return None
        return cls(job_id=env_job_id(env), token=token)

    @classmethod
    def from_json(cls, doc: Any) -> Optional[Owner]:
        if isinstance(doc, dict) and isinstance(doc.get("token"), str) and isinstance(doc.get("job_id"), str):
            return cls(job_id=doc["job_id"], token=doc["token"])
        return None

    def to_json(self) -> Dict[str, str]:
        return {"job_id": self.job_id, "token": self.token}

    def __str__(self) -> str:
        return f"job {self.job_id or '?'} (submission {self.token})"


def foreign_reason(recorded: Optional[Owner], expected: Optional[Owner]) -> Optional[str]:
    """Why a checkpoint written by ``recorded`` is another job's, for ``expected``; None when it may be
    resumed.

    Foreign: the same job id with another submission token -- an earlier job that got this id. Not
    foreign: an unknown owner on either side (older checkpoints, code run outside autoheal sbatch), the
    same token (any run of this job), or another job id (a folder several jobs share on purpose, e.g. a
    fixed --checkpoint-dir for a chain of jobs: the ids never collide there by accident).
    """
    if recorded is None or expected is None or recorded.token == expected.token:
        return None
    if recorded.job_id and recorded.job_id == expected.job_id:
        return (f"written by an earlier {recorded}, not by this {expected}: another job's state; "
                f"resume it only with --allow-foreign-checkpoint ({ALLOW_FOREIGN_ENV}=1)")
    return None


def env_allow_foreign(environ: Optional[Mapping[str, str]] = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ALLOW_FOREIGN_ENV, "").strip().lower() in _TRUE


_FROM_ENV: Any = object()  # default of the owner arguments: Owner.from_env(environ)


# ---------------------------------------------------------------- opening files that may be hostile

# O_NONBLOCK: opening a FIFO for reading with no writer returns at once instead of blocking, and a
# read from it would return at once too (we never get that far: fstat says it is no regular file).
_O_READ = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
           | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))


class NotRegularFile(OSError):
    """A name we would read is a FIFO, socket, device, folder or symlink, not a regular file."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def _open_regular(path: Union[str, os.PathLike[str]]) -> int:
    """A read-only fd of the regular file ``path``; NotRegularFile for anything else (never opened when
    lstat already tells, so no device open() side effects), FileNotFoundError when missing."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(errno.EINVAL, f"is {_kind(st.st_mode)}, not a regular file", str(path))
    fd = os.open(path, _O_READ)
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise NotRegularFile(errno.EINVAL, "was replaced while being opened", str(path))
        return fd
    except BaseException:
        os.close(fd)
        raise


def _read_regular(path: Union[str, os.PathLike[str]], limit: Optional[int] = None) -> bytes:
    """Up to ``limit`` bytes (all without one) of the regular file ``path``; see :func:`_open_regular`."""
    fd = _open_regular(path)
    with open(fd, "rb", closefd=True) as f:
        return f.read() if limit is None else f.read(limit)


def _problem(exc: OSError) -> str:
    """Why a file could not be read, for a rejection reason."""
    if isinstance(exc, NotRegularFile):
        return exc.strerror or str(exc)
    if isinstance(exc, FileNotFoundError):
        return "missing"
    return f"unreadable ({exc.strerror or exc})"


# ---------------------------------------------------------------- turning OSError into one-line CheckpointIOError


def _show(path: Union[str, os.PathLike[str], None]) -> str:
    """A path for a one-line message (repr when it holds control characters)."""
    text = os.fsdecode(path) if path is not None else "?"
    return repr(text) if any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in text) else text


def _cause(exc: OSError) -> str:
    """``No space left on device (ENOSPC)``."""
    text = exc.strerror or str(exc) or type(exc).__name__
    code = errno.errorcode.get(exc.errno) if isinstance(exc.errno, int) else None
    return f"{text} ({code})" if code else text


@contextlib.contextmanager
def _io(what: str, path: Union[str, os.PathLike[str]]) -> Iterator[None]:
    """Run a filesystem operation; its OSError becomes CheckpointIOError("<what> <path>: <cause>")."""
    try:
        yield
    except CheckpointError:
        raise
    except OSError as exc:
        raise CheckpointIOError(f"{what} {_show(path)}: {_cause(exc)}", exc.errno, os.fsdecode(path)) from exc


@contextlib.contextmanager
def _not_saved(step: int, directory: Path, writing_into: Optional[Path] = None) -> Iterator[None]:
    """Prefix any filesystem failure of a save with what was not saved where."""
    head = f"checkpoint step {step} not saved in {_show(directory)}"
    try:
        yield
    except CheckpointIOError as exc:
        raise CheckpointIOError(f"{head}: {exc.message}", exc.errno, exc.filename) from (exc.__cause__ or exc)
    except CheckpointError:
        raise
    except OSError as exc:  # e.g. from the caller's own writes into the temporary folder
        if exc.filename:
            where = f"{_show(exc.filename)}: "
        else:  # e.g. write() of the caller's open file: name the folder it was writing into
            where = f"writing into {_show(writing_into)}: " if writing_into else ""
        raise CheckpointIOError(f"{head}: {where}{_cause(exc)}", exc.errno,
                                os.fsdecode(exc.filename) if exc.filename else None) from exc


_CALLS = itertools.count()


def _unique() -> str:
    """A suffix no other process, thread or call uses: the counter makes it unique within the process
    (24 random bits alone repeated within 1000 calls 3 % of the time), the random part across hosts
    sharing a folder, where pids repeat."""
    return f"{os.getpid()}-{secrets.token_hex(3)}-{next(_CALLS)}"


# ---------------------------------------------------------------- durable file operations

_O_CREATE = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))


def _fsync_dir(path: Path) -> None:
    try:  # O_DIRECTORY: a FIFO in the folder's place fails with ENOTDIR instead of blocking
        fd = os.open(str(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # some network filesystems refuse fsync on directories
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _write_durable(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file of our own (O_EXCL, unique name), fsync, rename, fsync
    the folder. The temp file is removed when anything fails."""
    tmp = path.parent / f".{path.name}.tmp-{_unique()}"
    with _io("writing", tmp):
        fd = os.open(tmp, _O_CREATE, 0o644)
    try:
        with _io("writing", tmp):
            with open(fd, "wb", closefd=True) as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        with _io("renaming to", path):
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with _io("syncing the folder", path.parent):
        _fsync_dir(path.parent)


def _write_payload(path: Path, payload: Payload) -> None:
    if not isinstance(payload, (bytes, bytearray, memoryview)) and not callable(payload):
        raise CheckpointError(
            f"payload must be bytes or a callable taking a binary file, got {type(payload).__name__}"
        )
    with _io("creating", path):
        fd = os.open(path, _O_CREATE, 0o644)
    with _io("writing", path):  # also the OSError of a callable (e.g. torch.save hitting ENOSPC)
        with open(fd, "wb", closefd=True) as f:
            if callable(payload):
                payload(f)
            else:
                f.write(payload)
            f.flush()
            os.fsync(f.fileno())


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2_fn: Any = None


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE). False where the C library or the
    filesystem cannot (the caller then falls back); OSError for a real failure."""
    global _renameat2_fn
    if _renameat2_fn is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
            _renameat2_fn = fn
        except (OSError, AttributeError, TypeError):
            _renameat2_fn = False
    if not _renameat2_fn:
        return False
    if _renameat2_fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fsdecode(b))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(_open_regular(path), "rb", closefd=True) as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _safe_relpath(name: object) -> bool:
    if not isinstance(name, str) or not name or "\x00" in name or "\\" in name:
        return False
    if name.startswith("/"):
        return False
    parts = name.split("/")
    return all(p not in ("", ".", "..") for p in parts)


def _newest_mtime(path: Path) -> float:
    newest = path.lstat().st_mtime
    if path.is_symlink():
        return newest
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            try:
                newest = max(newest, os.lstat(os.path.join(root, n)).st_mtime)
            except OSError:
                pass
    return newest


def _remove_tree(path: Path) -> None:
    """shutil.rmtree that never raises (its ignore_errors does not cover every call, e.g. fstat)."""
    with contextlib.suppress(OSError):
        shutil.rmtree(path, ignore_errors=True)


def _rmtree(path: Path) -> None:
    """Rename out of the way first, so a half-deleted checkpoint never keeps a valid-looking name."""
    target = path
    if not path.name.startswith((TMP_PREFIX, DEL_PREFIX)):
        target = path.parent / f"{DEL_PREFIX}{path.name}-{_unique()}"
        try:
            os.rename(path, target)
        except OSError:
            target = path
    if target.is_dir() and not target.is_symlink():
        _remove_tree(target)
    else:
        with contextlib.suppress(OSError):
            target.unlink()


# ---------------------------------------------------------------- reading and verifying


class Checkpoint:
    """A checkpoint that passed verification."""

    def __init__(self, path: Path, manifest: Dict[str, Any]):
        self.path = path
        self.manifest = manifest
        self.step: int = manifest["step"]
        md = manifest.get("metadata")
        self.metadata: Dict[str, Any] = md if isinstance(md, dict) else {}
        #: who saved it (None for checkpoints saved outside autoheal sbatch or by older versions)
        self.owner: Optional[Owner] = Owner.from_json(manifest.get("owner"))
        uid = manifest.get("uid")
        #: the uid that saved it (None: saved by an older release; its files' owners were checked instead)
        self.uid: Optional[int] = uid if isinstance(uid, int) and not isinstance(uid, bool) else None

    def __repr__(self) -> str:
        return f"Checkpoint(step={self.step}, path={str(self.path)!r})"

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def files(self) -> List[str]:
        """Names (relative, '/'-separated) of the files the manifest lists."""
        return sorted(self.manifest["files"])

    def file(self, name: str) -> Path:
        """Path of a listed file; KeyError for a name the manifest does not list."""
        if name not in self.manifest["files"]:
            raise KeyError(f"{name!r} is not in checkpoint {self.name} (files: {', '.join(self.files)})")
        return self.path / name

    def read_bytes(self, name: str = PAYLOAD) -> bytes:
        """Contents of a listed file (regular files only: a FIFO put there since verification raises
        NotRegularFile instead of blocking)."""
        return _read_regular(self.file(name))

    def shard_names(self) -> List[str]:
        return sorted(n for n in self.manifest["files"] if _SHARD_RE.match(n))

    def read_shard(self, rank: int) -> bytes:
        for n in self.shard_names():
            m = _SHARD_RE.match(n)
            if m is not None and int(m.group(1)) == rank:
                return self.read_bytes(n)
        raise KeyError(f"checkpoint {self.name} has no shard for rank {rank}")


def verify_checkpoint(path: Union[str, os.PathLike[str]], verify: str = "sha256", *,
                      uids: Optional[FrozenSet[int]] = None) -> Union[Checkpoint, Rejection]:
    """Check one checkpoint directory; return it as a :class:`Checkpoint` or a :class:`Rejection`.

    ``uids``: who may own its folder and files and be its recorded ``uid`` (default
    :func:`~autoheal.sbatch_helpers.ckpt_trust.trusted_uids`: root, this process's user, and
    ``AUTOHEAL_CHECKPOINT_TRUSTED_UIDS``). Never raises on bad contents (only on a bad ``verify`` argument).
    """
    _check_verify(verify)
    path = Path(path)
    name = path.name
    try:
        return _verify(path, verify, trusted_uids() if uids is None else uids)
    except _Reject as r:
        return Rejection(name, str(r))
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RuntimeError) as exc:
        return Rejection(name, f"unreadable: {type(exc).__name__}: {exc}")


class _Reject(Exception):
    pass


def _untrusted(path: Path, uids: FrozenSet[int], st: Optional[os.stat_result] = None) -> None:
    """Reject when ``path`` (lstat'ed now unless ``st`` is given) is owned by an untrusted uid."""
    if st is None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return  # the caller's own read says "missing"
    problem = file_problem(str(path), st, uids)
    if problem:
        raise _Reject(f"{problem}: another user's files are never resumed (set {TRUSTED_UIDS_ENV} to trust them)")


def _verify(path: Path, verify: str, uids: FrozenSet[int]) -> Checkpoint:
    """Every check, in the order its rejection is reported: the folder, the marker and the manifest it
    seals, the manifest's claims, then each file it lists."""
    step = _check_folder(path, uids)
    manifest = _sealed_manifest(path)
    _check_claims(manifest, step, uids)
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise _Reject(f"{MANIFEST} has no file list")
    for fname, info in sorted(files.items()):
        _check_file(path, fname, info, verify, uids)
    return Checkpoint(path, manifest)


def _check_folder(path: Path, uids: FrozenSet[int]) -> int:
    """The step a checkpoint folder's name gives, once it is a real folder of a trusted user."""
    step = parse_name(path.name)
    if step is None:
        raise _Reject(f"not a checkpoint name ({PREFIX}<{STEP_DIGITS} digits>)")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise _Reject("missing") from None
    if stat.S_ISLNK(st.st_mode):
        raise _Reject("is a symlink, not a checkpoint directory")
    if not stat.S_ISDIR(st.st_mode):
        raise _Reject("not a directory" if stat.S_ISREG(st.st_mode) else f"is {_kind(st.st_mode)}, not a directory")
    _untrusted(path, uids, st)
    _untrusted(path / MARKER, uids)
    _untrusted(path / MANIFEST, uids)
    return step


def _sealed_manifest(path: Path) -> Dict[str, Any]:
    """The manifest, once the marker (written last) names its exact bytes: a torn save has no marker,
    and a manifest changed after the save no longer matches it."""
    try:
        marker_raw = _read_regular(path / MARKER, 4096)
    except OSError as exc:
        what = _problem(exc)
        raise _Reject(f"marker {MARKER} {what}{' (torn or unfinished save)' if what == 'missing' else ''}") from None
    try:
        fd = _open_regular(path / MANIFEST)
    except OSError as exc:
        raise _Reject(f"{MANIFEST} {_problem(exc)}") from None
    with open(fd, "rb", closefd=True) as f:
        if os.fstat(fd).st_size > _MAX_MANIFEST_BYTES:
            raise _Reject(f"{MANIFEST} too large")
        raw = f.read(_MAX_MANIFEST_BYTES + 1)
    try:
        marker_doc = json.loads(marker_raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise _Reject(f"marker {MARKER} is not valid JSON") from None
    if not isinstance(marker_doc, dict) or marker_doc.get("manifest_sha256") != hashlib.sha256(raw).hexdigest():
        raise _Reject(f"marker {MARKER} does not match {MANIFEST} (manifest changed or corrupt)")
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise _Reject(f"{MANIFEST} is not valid JSON") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _Reject(f"{MANIFEST} is not an {FORMAT} manifest")
    return manifest


def _check_claims(manifest: Dict[str, Any], step: int, uids: FrozenSet[int]) -> None:
    """The manifest's step is the folder's, and it was saved by a trusted user."""
    if manifest.get("step") != step or isinstance(manifest.get("step"), bool):
        raise _Reject(f"{MANIFEST} step {manifest.get('step')!r} does not match the directory name")
    saved_by = manifest.get("uid")
    if saved_by is not None and (isinstance(saved_by, bool) or not isinstance(saved_by, int)):
        raise _Reject(f"{MANIFEST} uid {saved_by!r} is not a uid")
    if saved_by is not None and saved_by not in uids:
        raise _Reject(f"saved by uid {saved_by}, not by this job's user or root: another user's checkpoint is "
                      f"never resumed (set {TRUSTED_UIDS_ENV} to trust them)")


def _check_file(path: Path, fname: str, info: object, verify: str, uids: FrozenSet[int]) -> None:
    """One file the manifest lists: a safe name inside the folder, a regular file of a trusted user, of
    the recorded size (and, with ``verify="sha256"``, the recorded digest)."""
    if not _safe_relpath(fname) or fname in RESERVED:
        raise _Reject(f"{MANIFEST} lists an unsafe file name {fname!r}")
    if not isinstance(info, dict):
        raise _Reject(f"{MANIFEST} entry for {fname} is malformed")
    size, digest = info.get("size"), info.get("sha256")
    if isinstance(size, bool) or not isinstance(size, int) or not isinstance(digest, str):
        raise _Reject(f"{MANIFEST} entry for {fname} is malformed")
    fpath = _inside(path, fname, uids)
    try:
        fst = os.lstat(fpath)
    except FileNotFoundError:
        raise _Reject(f"{fname} missing") from None
    if stat.S_ISLNK(fst.st_mode):
        raise _Reject(f"{fname} is a symlink (points outside the checkpoint)")
    if not stat.S_ISREG(fst.st_mode):
        raise _Reject(f"{fname} is {_kind(fst.st_mode)}, not a regular file")
    _untrusted(fpath, uids, fst)
    if fst.st_size != size:
        raise _Reject(f"{fname} size {fst.st_size} != {size} in manifest (truncated or overwritten)")
    if verify == "sha256" and _sha256(fpath) != digest:
        raise _Reject(f"{fname} sha256 mismatch (corrupt)")


def _inside(root: Path, relpath: str, uids: Optional[FrozenSet[int]] = None) -> Path:
    """``root/relpath`` after checking that every folder on the way is a real folder (no symlink out)."""
    cur = root
    for part in relpath.split("/")[:-1]:
        cur = cur / part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            raise _Reject(f"{relpath} missing") from None
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            raise _Reject(f"{relpath} points outside the checkpoint (through the symlink {part})")
        if not stat.S_ISDIR(mode):
            raise _Reject(f"{relpath} missing ({part} is {_kind(mode)})")
        if uids is not None:
            _untrusted(cur, uids, st)
    return root / relpath


def read_latest_pointer(directory: Union[str, os.PathLike[str]]) -> Optional[str]:
    """The checkpoint name in ``latest``, or None when absent, not a regular file or not one of our names."""
    try:
        text = _read_regular(Path(directory) / LATEST, 256).decode("utf-8", "replace").strip()
    except OSError:
        return None
    return text if parse_name(text) is not None else None


# ---------------------------------------------------------------- the manager


def _inventory(tmp: Path) -> Dict[str, Dict[str, Any]]:
    """Every file a save wrote into ``tmp``: fsynced, with its size and sha256 (folders fsynced too).
    Regular files and folders only: a symlink or FIFO someone made there fails the save."""
    files = {}

    def walk_error(exc: OSError) -> None:
        raise exc

    for root, dirs, names in os.walk(tmp, onerror=walk_error):
        rootp = Path(root)
        for n in dirs + names:
            if (rootp / n).is_symlink():
                raise CheckpointError(f"symlinks are not supported in a checkpoint: {rootp / n}")
        for n in names:
            fpath = rootp / n
            rel = fpath.relative_to(tmp).as_posix()
            if rel in RESERVED:
                raise CheckpointError(f"{rel} is a reserved name in a checkpoint")
            try:  # regular files only: opening a FIFO someone made in the folder would block forever
                fd = _open_regular(fpath)
            except NotRegularFile as exc:
                raise CheckpointError(f"{rel} in the checkpoint {exc.strerror}; a checkpoint holds "
                                      f"regular files and folders only") from None
            with _io("syncing", fpath):
                try:
                    os.fsync(fd)
                    size = os.fstat(fd).st_size
                finally:
                    os.close(fd)
                files[rel] = {"size": size, "sha256": _sha256(fpath)}
        with _io("syncing the folder", rootp):
            _fsync_dir(rootp)
    return files


class CheckpointManager:
    """Save, prune and load checkpoints in one directory.

    ``rank``: this process's rank (default from ``SLURM_PROCID``/``RANK``, else 0). Only rank 0 — the
    designated rank — writes manifests, markers and the ``latest`` pointer; other ranks may only
    contribute shards through :meth:`save_shard`.
    ``keep``: how many valid checkpoints to keep (None or 0: keep all).
    ``verify``: default check for loading, ``"sha256"`` (full) or ``"size"`` (fast).
    ``stale_age``: seconds after which an unfinished save's leftovers may be deleted.
    ``owner``: recorded in every save and checked on loading (see the module docstring); default
    :meth:`Owner.from_env` of ``environ``; None records and checks nothing.
    ``allow_foreign``: also load checkpoints of an earlier job with the same id; default from
    ``AUTOHEAL_ALLOW_FOREIGN_CHECKPOINT``.
    ``trusted``: the uids whose checkpoints may be loaded, and who may own the folders on the way to
    ``directory`` (see ``ckpt_trust``); default root, this process's user and
    ``AUTOHEAL_CHECKPOINT_TRUSTED_UIDS``.
    """

    def __init__(
        self,
        directory: Union[str, os.PathLike[str]],
        keep: Optional[int] = 3,
        rank: Optional[int] = None,
        *,
        verify: str = "sha256",
        world_size: Optional[int] = None,
        stale_age: float = DEFAULT_STALE_AGE,
        shard_timeout: float = DEFAULT_SHARD_TIMEOUT,
        session: Optional[str] = None,
        owner: Optional[Owner] = _FROM_ENV,
        allow_foreign: Optional[bool] = None,
        environ: Optional[Mapping[str, str]] = None,
        trusted: Optional[FrozenSet[int]] = None,
    ):
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 0):
            raise ValueError(f"keep must be a non-negative int or None, got {keep!r}")
        self.directory = Path(directory)
        self.keep = keep or None
        self.rank = env_rank(environ) if rank is None else int(rank)
        self.world_size = env_world_size(environ) if world_size is None else int(world_size)
        self.verify = _check_verify(verify)
        self.stale_age = float(stale_age)
        self.shard_timeout = float(shard_timeout)
        self.session = _session_token(environ) if session is None else _sanitize(session)
        self.owner: Optional[Owner] = Owner.from_env(environ) if owner is _FROM_ENV else owner
        if self.owner is not None and not isinstance(self.owner, Owner):
            raise TypeError(f"owner must be an Owner or None, got {type(owner).__name__}")
        self.allow_foreign = env_allow_foreign(environ) if allow_foreign is None else bool(allow_foreign)
        self.trusted: FrozenSet[int] = trusted_uids(environ) if trusted is None else frozenset(trusted)
        self.rejections: List[Rejection] = []
        self._writing: Set[str] = set()
        self._environ = environ

    def _heartbeat_file(self) -> Optional[Path]:
        """This rank's heartbeat file under ``autoheal sbatch`` (None outside): every save marks the rank
        as saving there, so the runner's hang detection never judges a long save a hang."""
        return heartbeat_file(os.environ if self._environ is None else self._environ, self.rank)

    def __repr__(self) -> str:
        return f"CheckpointManager({str(self.directory)!r}, keep={self.keep}, rank={self.rank})"

    @property
    def is_primary(self) -> bool:
        return self.rank == 0

    # ---- saving

    def save(
        self,
        step: int,
        payload: Union[Payload, Mapping[str, Payload]],
        metadata: Optional[Dict[str, Any]] = None,
        *,
        filename: str = PAYLOAD,
    ) -> Path:
        """Save ``payload`` as checkpoint ``step`` and return its final path.

        ``payload``: bytes, a callable given a binary file opened for writing (e.g.
        ``lambda f: torch.save(state, f)``), or a mapping of file names to either.
        """
        items = dict(payload) if isinstance(payload, Mapping) else {filename: payload}
        for name in items:
            if not _safe_relpath(name) or name in RESERVED:
                raise CheckpointError(f"invalid payload file name {name!r}")
        with self.saving(step, metadata) as tmp:
            for name, data in items.items():
                target = tmp / name
                with _io("creating", target.parent):
                    target.parent.mkdir(parents=True, exist_ok=True)
                _write_payload(target, data)
                _fault("payload-written")
        return self.directory / checkpoint_name(step)

    @contextlib.contextmanager
    def saving(self, step: int, metadata: Optional[Dict[str, Any]] = None) -> Iterator[Path]:
        """Yield a temporary folder to write files into; on success publish it as checkpoint ``step``.

        On an exception the temporary folder is deleted and nothing is published; an OSError (also one
        raised by the caller's own writes into the folder) becomes :class:`CheckpointIOError`.
        """
        self._require_primary("saving()")
        _check_step(step)
        meta_json = _metadata_json(metadata)
        with _not_saved(step, self.directory):
            self._ensure_directory()
            tmp = self._make_tmp(step)
        self._writing.add(tmp.name)
        try:
            with saving_at(self._heartbeat_file(), step), _not_saved(step, self.directory, writing_into=tmp):
                _fault("tmp-created")
                yield tmp
                self._publish(step, tmp, meta_json)
        except BaseException:
            _remove_tree(tmp)  # never masks the error being raised
            raise
        finally:
            self._writing.discard(tmp.name)

    def _ensure_directory(self) -> None:
        with _io("creating the checkpoint folder", self.directory):
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except FileExistsError:  # exists, but is no folder (a file, a FIFO, a dangling symlink)
                raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory") from None

    def save_shard(
        self,
        step: int,
        data: Payload,
        rank: Optional[int] = None,
        *,
        world_size: Optional[int] = None,
        metadata: Optional[Dict[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> Path:
        """Write this rank's shard of checkpoint ``step``.

        Every rank calls it. Non-designated ranks write their shard into a shared staging folder and
        return the shard's path. Rank 0 writes its shard, waits up to ``timeout`` seconds for all
        ``world_size`` shards, then publishes the checkpoint (manifest, marker, pointer) and returns
        its final path; it raises :class:`ShardTimeout` (publishing nothing) if shards are missing.
        The staging folder is ``.tmp-ckpt-<step>-shards-<session>``: the session defaults to the
        job id and restart count, so shards left by an earlier run of the job are never mixed in.
        """
        _check_step(step)
        rank = self.rank if rank is None else int(rank)
        world = self.world_size if world_size is None else int(world_size)
        if not 0 <= rank < world:
            raise CheckpointError(f"rank {rank} is outside world_size {world}")
        meta_json = _metadata_json(metadata) if rank == 0 else None
        with saving_at(self._heartbeat_file(), step):
            return self._save_shard(step, data, rank, world, meta_json, timeout)

    def _save_shard(self, step: int, data: Payload, rank: int, world: int, meta_json: Optional[str],
                    timeout: Optional[float]) -> Path:
        staging = self.directory / f"{TMP_PREFIX}{checkpoint_name(step)}-shards-{self.session}"
        shard = staging / _shard_name(rank, world)
        with _not_saved(step, self.directory):
            self._ensure_directory()
            with _io("creating", staging):
                staging.mkdir(exist_ok=True)
            part = staging / f".{shard.name}.part-{_unique()}"
            try:
                _write_payload(part, data)
                with _io("renaming to", shard):
                    os.replace(part, shard)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(part)
                raise
            with _io("syncing the folder", staging):
                _fsync_dir(staging)
            _fault("shard-written")
        if rank != 0:
            return shard
        assert meta_json is not None  # built on rank 0
        self._writing.add(staging.name)
        try:
            with _not_saved(step, self.directory):
                self._wait_for_shards(staging, world, self.shard_timeout if timeout is None else timeout)
                wanted = {_shard_name(r, world) for r in range(world)}
                with _io("listing", staging):
                    leftovers = [n for n in os.listdir(staging) if n not in wanted]
                for n in leftovers:  # part-files of a rank that died, shards of another world size
                    _rmtree(staging / n)
                self._publish(step, staging, meta_json, extra={"world_size": world})
        finally:
            self._writing.discard(staging.name)
        return self.directory / checkpoint_name(step)

    def _wait_for_shards(self, staging: Path, world: int, timeout: float) -> None:
        wanted = {_shard_name(r, world) for r in range(world)}
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            with _io("listing", staging):
                missing = wanted - set(os.listdir(staging))
            if not missing:
                return
            if time.monotonic() >= deadline:
                ranks = sorted(int(m.group(1)) for m in map(_SHARD_RE.match, missing) if m is not None)
                raise ShardTimeout(
                    f"checkpoint {staging.name}: timed out after {timeout:g}s waiting for shards of ranks "
                    f"{ranks} (have {world - len(missing)}/{world}); nothing published"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _require_primary(self, what: str) -> None:
        if not self.is_primary:
            raise CheckpointError(
                f"{what} is for the designated rank 0 only (this is rank {self.rank}); "
                f"other ranks contribute with save_shard()"
            )

    def _make_tmp(self, step: int) -> Path:
        base = f"{TMP_PREFIX}{checkpoint_name(step)}"
        for _ in range(100):
            tmp = self.directory / f"{base}-{_unique()}"
            try:
                with _io("creating", tmp):
                    tmp.mkdir()
                return tmp
            except CheckpointIOError as exc:
                if exc.errno != errno.EEXIST:
                    raise
        raise CheckpointError(f"cannot create a temporary folder {base}-* in {_show(self.directory)}")

    def _publish(self, step: int, tmp: Path, meta_json: str, extra: Optional[Dict[str, Any]] = None) -> None:
        """Seal the complete temporary folder ``tmp`` (manifest, then marker) and publish it as ``step``."""
        files = _inventory(tmp)
        if not files:
            raise CheckpointError(f"nothing was written into the checkpoint for step {step}")
        self._seal(tmp, step, self._manifest(step, files, meta_json, extra))
        name = checkpoint_name(step)
        final = self.directory / name
        self._install(tmp, final)  # the one step that publishes: before it nothing, after it all
        self._after_publish(final, name)

    def _manifest(self, step: int, files: Dict[str, Dict[str, Any]], meta_json: str,
                  extra: Optional[Dict[str, Any]]) -> bytes:
        now = time.time()
        manifest = {
            "format": FORMAT,
            "step": step,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            "unix_time": now,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "files": files,
            "metadata": json.loads(meta_json),
        }
        if self.owner is not None:
            manifest["owner"] = self.owner.to_json()
        manifest["uid"] = os.geteuid()  # who saved it; loading checks it (and the files' owners)
        manifest.update(extra or {})
        return (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()

    @staticmethod
    def _seal(tmp: Path, step: int, raw: bytes) -> None:
        """The manifest, then the marker naming its sha256 (written last: a folder without it is torn)."""
        _write_durable(tmp / MANIFEST, raw)
        _fault("manifest-written")
        marker = {"step": step, "manifest_sha256": hashlib.sha256(raw).hexdigest()}
        _write_durable(tmp / MARKER, json.dumps(marker).encode() + b"\n")
        _fault("marker-written")

    def _after_publish(self, final: Path, name: str) -> None:
        """Published. What follows makes it durable and findable faster; a failure is logged, not raised
        (the caller must not think the checkpoint is lost when it is there and valid)."""
        try:
            _fsync_dir(self.directory)
            _fault("renamed")
        except OSError as exc:
            log.warning("checkpoint %s saved, but syncing %s failed: %s", final, self.directory, _cause(exc))
        try:
            _write_durable(self.directory / LATEST, (name + "\n").encode())
            _fault("pointer-written")
        except OSError as exc:
            log.warning("checkpoint %s saved, but the pointer %s was not updated (loading does not need it): %s",
                        final, _show(self.directory / LATEST), exc)
        log.info("checkpoint saved: %s", final)
        try:
            self.prune()
        except OSError as exc:  # pruning is housekeeping: never fail a save over it
            log.warning("checkpoint pruning in %s failed: %s", self.directory, exc)

    def _install(self, tmp: Path, final: Path) -> None:
        """Rename the complete ``tmp`` to ``final``. An existing ``final`` (a re-save of the step, or a
        concurrent saver of the same step) is replaced without a moment where the step is missing.

        Other savers and pruners work in the same folder at the same time: whatever vanished or
        appeared between two calls sends us round again (bounded).
        """
        busy = (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR)
        with _io("publishing", final):
            for _ in range(20):
                try:
                    os.rename(tmp, final)  # final absent (or an empty folder): atomic
                    return
                except OSError as exc:
                    if exc.errno not in busy:
                        raise
                try:
                    if self._replace(tmp, final):
                        return
                except FileNotFoundError:  # final went away meanwhile (pruned, moved): plain rename again
                    continue
            raise OSError(errno.EBUSY, "other savers keep changing it", os.fsdecode(final))

    def _replace(self, tmp: Path, final: Path) -> bool:
        """One attempt to put ``tmp`` in the place of an existing ``final``; False: try again."""
        st = os.lstat(final)
        is_dir = stat.S_ISDIR(st.st_mode)
        if is_dir and st.st_uid not in self.trusted:
            # another user's folder under this name (a shared folder): not ours to replace or delete
            keep_as = self.directory / f"{final.name}.foreign-uid{st.st_uid}-{secrets.token_hex(2)}"
            os.rename(final, keep_as)
            log.warning("checkpoint %s belongs to uid %d; kept as %s", final, st.st_uid, keep_as.name)
            return False
        other = verify_checkpoint(final, "size", uids=self.trusted) if is_dir else None
        reason = self.foreign_reason(other) if isinstance(other, Checkpoint) else None
        # another job's checkpoint: never overwritten; kept under a name loading ignores
        if reason and isinstance(other, Checkpoint) and other.owner is not None:
            keep_as = self.directory / f"{final.name}.foreign-{_sanitize(other.owner.token)}-{secrets.token_hex(2)}"
            os.rename(final, keep_as)
            log.warning("checkpoint %s was %s; kept as %s", final, reason.split(":")[0], keep_as.name)
            return False  # final is free now: the plain rename publishes ours
        if is_dir and _exchange(tmp, final):
            _remove_tree(tmp)  # tmp now holds the old copy
            return True
        # Not a folder (never a valid checkpoint), or no atomic exchange on this filesystem: move the old
        # one aside, publish, and put it back if publishing fails.
        aside = self.directory / f"{DEL_PREFIX}{final.name}-{_unique()}"
        os.rename(final, aside)
        try:
            os.rename(tmp, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.rename(aside, final)
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):  # another saver published meanwhile
                _rmtree(aside)
                return False
            raise
        _rmtree(aside)
        return True

    # ---- pruning

    def prune(self, now: Optional[float] = None) -> List[Path]:
        """Delete surplus checkpoints and stale leftovers; return the deleted paths.

        Keeps the newest ``keep`` checkpoints that verify (by size), the one ``latest`` names, and
        anything this manager is writing. Checkpoints failing verification and temporary folders are
        deleted only once older than ``stale_age``. Deletes oldest first.
        """
        if not self.is_primary or not self.directory.is_dir():
            return []
        now = time.time() if now is None else now
        pointer = read_latest_pointer(self.directory)
        names = os.listdir(self.directory)
        ckpts = sorted(((step, n) for n in names if (step := parse_name(n)) is not None), reverse=True)
        doomed: List[Tuple[int, Path]] = []
        valid_seen = 0
        for step, name in ckpts:
            path = self.directory / name
            try:
                st = os.lstat(path)
            except OSError:
                continue
            # not something we made (a symlink), or another user's: leave it alone
            if stat.S_ISLNK(st.st_mode) or st.st_uid not in self.trusted:
                continue
            found = verify_checkpoint(path, "size", uids=self.trusted)
            ok = isinstance(found, Checkpoint)
            # another job's: neither ours to count nor to delete
            if isinstance(found, Checkpoint) and self.foreign_reason(found):
                continue
            if name == pointer:
                valid_seen += ok
                continue
            if ok:
                valid_seen += 1
                if self.keep is None or valid_seen <= self.keep:
                    continue
                doomed.append((step, path))
            elif self._is_stale(path, now):
                doomed.append((step, path))
        for n in names:
            if n.startswith((TMP_PREFIX, DEL_PREFIX, f".{LATEST}.tmp-")) and n not in self._writing:
                path = self.directory / n
                if n.startswith(DEL_PREFIX) or self._is_stale(path, now):
                    doomed.append((-1, path))
        doomed.sort(key=lambda t: t[0])
        for _, path in doomed:
            log.info("checkpoint pruning: deleting %s", path)
            _rmtree(path)
        return [p for _, p in doomed]

    def _is_stale(self, path: Path, now: float) -> bool:
        try:
            return now - _newest_mtime(path) > self.stale_age
        except OSError:
            return False

    # ---- loading

    def checkpoints(self) -> List[int]:
        """Steps of the folders named like checkpoints (valid or not), oldest first."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        return sorted(s for s in (parse_name(n) for n in names) if s is not None)

    def latest_valid(self, verify: Optional[str] = None) -> Optional[Checkpoint]:
        """The newest checkpoint (by step) that verifies, or None.

        The reasons newer candidates were rejected are logged and kept in :attr:`rejections`.
        """
        verify = _check_verify(verify or self.verify)
        self.rejections = []
        if self._unsafe_directory():
            return None
        pointer_problem = self._pointer_problem()
        if pointer_problem:
            self._reject(pointer_problem)
        for step in reversed(self.checkpoints()):
            result = self._checked(verify_checkpoint(self.directory / checkpoint_name(step), verify,
                                                     uids=self.trusted))
            if isinstance(result, Checkpoint):
                return result
            self._reject(result)
        return None

    def _unsafe_directory(self) -> bool:
        """Reject (and say why) when another user could swap the folder or one on its path."""
        problem = path_problem(self.directory, self.trusted)
        if problem:
            self._reject(Rejection(str(self.directory), f"not resumed: {problem}"))
        return bool(problem)

    def foreign_reason(self, ckpt: Checkpoint) -> Optional[str]:
        """Why ``ckpt`` must not be resumed by this job (see :func:`foreign_reason`); None if it may
        (also always with ``allow_foreign``)."""
        return None if self.allow_foreign else foreign_reason(ckpt.owner, self.owner)

    def _checked(self, result: Union[Checkpoint, Rejection]) -> Union[Checkpoint, Rejection]:
        if isinstance(result, Checkpoint):
            reason = self.foreign_reason(result)
            if reason:
                return Rejection(result.name, reason)
        return result

    def load(self, step: Optional[int] = None, verify: Optional[str] = None) -> Checkpoint:
        """The checkpoint for ``step`` (default: :meth:`latest_valid`); raise NoValidCheckpoint."""
        verify = _check_verify(verify or self.verify)
        if step is None:
            found = self.latest_valid(verify)
        else:
            self.rejections = []
            found = None
            if not self._unsafe_directory():
                result = self._checked(verify_checkpoint(self.directory / checkpoint_name(step), verify,
                                                         uids=self.trusted))
                found = result if isinstance(result, Checkpoint) else None
                if not isinstance(result, Checkpoint):
                    self._reject(result)
        if found is None:
            raise NoValidCheckpoint(self._summary(step))
        return found

    def _pointer_problem(self) -> Optional[Rejection]:
        path = self.directory / LATEST
        try:
            text = _read_regular(path, 256).decode("utf-8", "replace").strip()
        except FileNotFoundError:
            return None
        except NotADirectoryError:  # the checkpoint folder itself is not a folder
            return None
        except OSError as exc:
            return Rejection(LATEST, f"{_problem(exc)}; ignored")
        if parse_name(text) is None:
            return Rejection(LATEST, f"names {text[:60]!r}, not a checkpoint in this directory; ignored")
        if not (self.directory / text).is_dir():
            return Rejection(LATEST, f"names missing {text}; ignored")
        return None

    def _reject(self, rejection: Rejection) -> None:
        self.rejections.append(rejection)
        log.warning("checkpoint rejected in %s: %s", self.directory, rejection)

    def _summary(self, step: Optional[int]) -> str:
        where = f"no valid checkpoint{'' if step is None else f' for step {step}'} in {self.directory}"
        if not self.directory.is_dir():
            return f"{where}: directory does not exist"
        n = len(self.checkpoints()) if step is None else 1
        found = f"found no {PREFIX}* folders" if n == 0 else f"rejected {n} candidate(s)"
        return "; ".join([f"{where}: {found}"] + [str(r) for r in self.rejections])


def _shard_name(rank: int, world: int) -> str:
    return f"shard-{rank:05d}-of-{world:05d}.bin"


def _sanitize(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(text))[:64] or "local"


def _session_token(environ: Optional[Mapping[str, str]] = None) -> str:
    env = os.environ if environ is None else environ
    # the submission token too: a job that got an earlier job's id must not pick up its leftover shards
    parts = [env.get(k, "") for k in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "AUTOHEAL_RESTART_COUNT", TOKEN_ENV)]
    return _sanitize(".".join(p for p in parts if p)) if any(parts) else "local"


def _metadata_json(metadata: Optional[Dict[str, Any]]) -> str:
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise CheckpointError(f"metadata must be a dict, got {type(metadata).__name__}")
    try:
        return json.dumps(metadata, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"metadata must be JSON-serialisable: {exc}") from None


# ---------------------------------------------------------------- runner-facing helpers


def find_resume_point(directory: Union[str, os.PathLike[str], None], verify: str = "size", *,
                      owner: Optional[Owner] = _FROM_ENV, allow_foreign: Optional[bool] = None,
                      environ: Optional[Mapping[str, str]] = None,
                      rejections: Optional[List[Rejection]] = None,
                      trusted: Optional[FrozenSet[int]] = None) -> Optional[Path]:
    """Path of the newest valid checkpoint in ``directory`` (size check by default) that this job may
    resume, or None.

    ``owner``/``allow_foreign``/``environ``: as for :class:`CheckpointManager` (default: from the
    environment, i.e. ``AUTOHEAL_SUBMIT_TOKEN``, the job id and ``AUTOHEAL_ALLOW_FOREIGN_CHECKPOINT``).
    ``rejections``: a list that gets a :class:`Rejection` (``str()``: one line) for every newer candidate
    skipped -- torn, corrupt, not a regular file, or another job's.
    Never raises: used by the job runner to set ``AUTOHEAL_RESUME_FROM``.
    """
    if not directory:
        return None
    try:
        mgr = CheckpointManager(directory, keep=None, rank=0, verify=verify, owner=owner,
                                allow_foreign=allow_foreign, environ=environ, trusted=trusted)
        found = mgr.latest_valid()
        if rejections is not None:
            rejections.extend(mgr.rejections)
    except Exception as exc:  # the runner must start the job whatever the folder holds
        log.warning("find_resume_point(%s) failed: %s", directory, exc)
        return None
    return found.path if found else None


def open_checkpoint(path: Union[str, os.PathLike[str]], verify: str = "sha256", *, owner: Optional[Owner] = _FROM_ENV,
                    allow_foreign: Optional[bool] = None, environ: Optional[Mapping[str, str]] = None,
                    trusted: Optional[FrozenSet[int]] = None) -> Checkpoint:
    """Verify one checkpoint folder given by path (e.g. ``AUTOHEAL_RESUME_FROM``); NoValidCheckpoint if bad,
    another job's or another user's, or on a path another user controls (checks as for
    :class:`CheckpointManager`)."""
    uids = trusted_uids(environ) if trusted is None else frozenset(trusted)
    problem = path_problem(path, uids)
    result = Rejection(Path(path).name, problem) if problem else verify_checkpoint(path, verify, uids=uids)
    if isinstance(result, Checkpoint):
        expected = Owner.from_env(environ) if owner is _FROM_ENV else owner
        allowed = env_allow_foreign(environ) if allow_foreign is None else allow_foreign
        reason = None if allowed else foreign_reason(result.owner, expected)
        if reason:
            result = Rejection(result.name, reason)
    if isinstance(result, Rejection):
        raise NoValidCheckpoint(f"checkpoint {path} rejected: {result.reason}")
    return result


def memory_tier(environ: Optional[Mapping[str, str]] = None) -> Any:
    """The peer-memory tier for this rank (``memtier.MemoryTier``: ``save(step, bytes)`` every K steps,
    ``newest()`` on a restart), or None when the job runs without it (submitted without
    ``AUTOHEAL_MEMORY_TIER=1``). Imported here only when called: jobs without the tier pay nothing."""
    from autoheal.sbatch_helpers.memtier import MemoryTier

    return MemoryTier.from_env(environ)


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m autoheal.sbatch_helpers.checkpoint resume-point DIR [--verify size|sha256]``.

    Prints the resume path and exits 0, or prints nothing and exits 1 when there is none.
    ``step PATH`` prints the step of a checkpoint path (exit 2 if it is not one).
    """
    import argparse

    p = argparse.ArgumentParser(prog="autoheal-checkpoint", description="checkpoint helpers for job scripts")
    sub = p.add_subparsers(dest="cmd", required=True)
    rp = sub.add_parser("resume-point", help="print the newest valid checkpoint path")
    rp.add_argument("directory")
    rp.add_argument("--verify", choices=VERIFY_MODES, default="size")
    rp.add_argument("--allow-foreign", action="store_true", default=None,
                    help=f"also an earlier job's checkpoint with this job id (default: ${ALLOW_FOREIGN_ENV})")
    sp = sub.add_parser("step", help="print the step of a checkpoint path")
    sp.add_argument("path")
    args = p.parse_args(argv)
    if args.cmd == "step":
        try:
            print(checkpoint_step(args.path))
        except ValueError as exc:
            print(f"autoheal-checkpoint: {exc}", file=sys.stderr)
            return 2
        return 0
    rejections: List[Rejection] = []
    found = find_resume_point(args.directory, args.verify, allow_foreign=args.allow_foreign, rejections=rejections)
    for r in rejections:
        print(f"autoheal-checkpoint: skipped {r}", file=sys.stderr)
    if found is None:
        return 1
    print(found)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
