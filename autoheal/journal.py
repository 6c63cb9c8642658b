"""The remediation journal: an append-only JSON-lines record of every detection and action.

One line per record, written with O_APPEND as one ``write`` under an exclusive lock and fsync'd, so
concurrent writers (healthcheck, xid-watch, the job runner, the sync daemon) never interleave and a crash
never loses an acknowledged record. The lock is ``locks/<journal name>.lock`` beside the journal (0600 in
a 0700 directory of the writers' user, ``autoheal.lockfile``): the journal itself is world-readable, and a
lock on it any user could hold would make every writer wait. A lock that stays held for ``LOCK_TIMEOUT``
(a writer stopped mid-append) or that cannot be used (its directory belongs to another user) costs the
lock, never the record: the line is written without it (one O_APPEND write, which a local file system
keeps whole and after every other writer's line) and a warning says so. A journal that cannot be written
is reported (``JournalError``, or ``None`` from ``record(..., strict=False)``) and never stops the caller's
real work. The journal is opened with O_NOFOLLOW: a symlink planted at its path is refused, not followed.
Readers skip lines that are not records (torn, garbage, wrong field types) and ``read_all`` counts them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple, Union

from autoheal.errors import JournalError
from autoheal.reasons import sanitize

if TYPE_CHECKING:
    from autoheal.config import Config

SEVERITIES = ("info", "action", "error")
#: Seconds a writer waits for the journal lock (other writers hold it for one write and fsync); then it
#: writes without it.
LOCK_TIMEOUT = 5.0


@dataclass
class Record:
    """One journal entry."""

    event: str  # e.g. detection, drain, resume, requeue, signal, notify-failed, remediation-step
    node: str = ""
    job_ids: List[str] = field(default_factory=list)
    check: str = ""
    evidence: Dict[str, Any] = field(default_factory=dict)
    action: str = ""
    outcome: str = ""
    message: str = ""
    severity: str = "info"
    source: str = ""
    time: float = 0.0
    host: str = ""

    def to_dict(self) -> Dict[str, Any]:
        """The fields as a dict (shallow: ``asdict`` would recurse into evidence, and a circular or very
        deep one would raise)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    def to_json(self) -> str:
        data = self.to_dict()
        data["message"] = sanitize(self.message, 2000)
        try:
            return json.dumps(data, sort_keys=True, default=str)
        except (ValueError, TypeError, RecursionError) as exc:  # circular or absurdly deep evidence
            # keep the record (what happened, where, to which jobs); lose only the evidence
            data["evidence"] = {"unserialisable": sanitize(f"{type(exc).__name__}: {exc}", 200)}
            return json.dumps(data, sort_keys=True, default=str)

    @classmethod
    def from_dict(cls, data: Any) -> Record:
        """A record from one decoded journal line. ValueError when it is not one: not an object, no
        ``event``, or a known field of the wrong type (a damaged line, or one written by something
        else); unknown fields are ignored (written by a newer release)."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        known: Dict[str, Any] = {}
        for name, value in data.items():
            if name in _STR_FIELDS:
                if not isinstance(value, str):
                    raise ValueError(f"{name} is not a string")
            elif name == "job_ids":
                if not isinstance(value, list) or not all(
                        isinstance(j, str) or (isinstance(j, int) and not isinstance(j, bool)) for j in value):
                    raise ValueError("job_ids is not a list of job ids")
                value = [str(j) for j in value]
            elif name == "evidence":
                if not isinstance(value, dict) or _deeper_than(value, MAX_EVIDENCE_DEPTH):
                    raise ValueError("evidence is not an object of reasonable depth")
            elif name == "time":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise ValueError("time is not a number")
                value = float(value)
            else:
                continue
            known[name] = value
        if not known.get("event"):
            raise ValueError("no event")
        return cls(**known)


_STR_FIELDS = ("event", "node", "check", "action", "outcome", "message", "severity", "source", "host")
#: Evidence we write is a few levels deep; a line nested near the decoder's limit is not ours, and
#: printing it again (``events --json``) would exhaust the stack.
MAX_EVIDENCE_DEPTH = 32


def _deeper_than(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return False


@dataclass
class ReadResult:
    """What :meth:`Journal.read_all` found: the matching records, and how many lines were skipped."""

    records: List[Record]
    #: Lines that are not a record: torn by a crash, garbage, or valid JSON with wrong field types.
    skipped: int = 0
    #: 1-based number of the first skipped line (0: none), to look at it.
    first_skipped: int = 0
    #: Readable records in the file, before the filters.
    readable: int = 0


class Journal:
    """Append and read the journal at ``path``."""

    def __init__(self, path: Union[str, Path], fsync: bool = True, lock_timeout: float = LOCK_TIMEOUT):
        self.path = Path(path)
        self.fsync = fsync
        self.lock_timeout = lock_timeout

    @classmethod
    def from_config(cls, config: Config) -> Journal:
        return cls(config.journal.path, config.journal.fsync)

    def append(self, rec: Record) -> Record:
        """Write one record durably; JournalError (one line) when the file cannot be written."""
        _normalise(rec)
        line = (rec.to_json() + "\n").encode()  # ASCII: json.dumps escapes everything else
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
                         | os.O_NOFOLLOW, 0o644)
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
            raise JournalError(f"journal {self.path}: cannot open for writing: "
                               f"{getattr(exc, 'strerror', None) or exc}") from None
        lock = contextlib.ExitStack()
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device would block or swallow records
                raise JournalError(f"journal {self.path}: not a regular file")
            lock = self._lock()
            # A crash may have left a torn last line: start ours on a fresh line so it stays readable.
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line
            written = os.write(fd, line)
            if written != len(line):
                raise JournalError(f"journal {self.path}: short write ({written} of {len(line)} bytes)")
            if self.fsync:
                os.fsync(fd)
        except OSError as exc:
            raise JournalError(f"journal {self.path}: write failed: {exc.strerror}") from None
        finally:
            lock.close()
            os.close(fd)
        return rec

    def lock_path(self) -> Path:
        """The journal's lock file (``locks/<name>.lock`` beside it)."""
        from autoheal.lockfile import lock_path

        return lock_path(self.path.parent, self.path.name + ".lock")

    def _lock(self) -> contextlib.ExitStack:
        """The exclusive lock, waiting at most ``lock_timeout``. A writer stopped (SIGSTOP, a hung NFS
        server) while holding it, or a lock directory this user may not use, must cost neither the hook
        nor the record: without the lock the record is still written, as one O_APPEND write, with a
        warning (what the lock adds is only the torn-line repair's view of the last byte)."""
        from autoheal.lockfile import exclusive

        stack = contextlib.ExitStack()
        try:
            stack.enter_context(exclusive(self.path.parent, self.path.name + ".lock", self.lock_timeout,
                                          "locked by another writer for"))
        except (OSError, ValueError) as exc:  # LockTimeout and LockDirError are OSErrors
            why = getattr(exc, "strerror", None) or str(exc)
            print(f"autoheal: warning: journal {self.path}: lock: {why}; record written without the lock",
                  file=sys.stderr)
        return stack

    def record(self, event: str, strict: bool = False, **fields: Any) -> Optional[Record]:
        """Build and append a record. With ``strict=False`` a failure is printed to stderr and None is
        returned (the caller's work must go on); with ``strict=True`` it raises JournalError."""
        rec = Record(event=event, **fields)
        try:
            return self.append(rec)
        except JournalError as exc:
            if strict:
                raise
            print(f"autoheal: warning: {exc}", file=sys.stderr)
            return None

    def read(self, node: Optional[str] = None, job: Optional[str] = None, since: Optional[float] = None,
             events: Optional[List[str]] = None) -> Iterator[Record]:
        """Records in file order, filtered; a line that is not a record (torn by a crash, garbage, wrong
        field types) is skipped, not fatal. :meth:`read_all` also counts them."""
        for _lineno, rec in self._lines():
            if rec is not None and _matches(rec, node, job, since, events):
                yield rec

    def read_all(self, node: Optional[str] = None, job: Optional[str] = None, since: Optional[float] = None,
                 events: Optional[List[str]] = None) -> ReadResult:
        """Like :meth:`read`, as a list, with the number of skipped lines."""
        out = ReadResult(records=[])
        for lineno, rec in self._lines():
            if rec is None:
                out.skipped += 1
                out.first_skipped = out.first_skipped or lineno
                continue
            out.readable += 1
            if _matches(rec, node, job, since, events):
                out.records.append(rec)
        return out

    def _lines(self) -> Iterator[Tuple[int, Optional[Record]]]:
        """(line number, Record or None when the line is not one) for every non-blank line."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise JournalError(f"journal {self.path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise JournalError(f"journal {self.path}: cannot read: Is a directory")
            if not stat.S_ISREG(mode):  # reading a FIFO would wait for a writer forever
                raise JournalError(f"journal {self.path}: cannot read: not a regular file")
        except BaseException:
            os.close(fd)
            raise
        with open(fd, encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    yield lineno, Record.from_dict(json.loads(line))
                except (ValueError, RecursionError):  # not JSON, not a record, or nested past the stack
                    yield lineno, None


def _normalise(rec: Record) -> None:
    """Make ``rec`` what readers accept (``Record.from_dict``), whatever a caller passed: what we write we
    must be able to read back, or ``autoheal events`` would skip our own records."""
    for name in _STR_FIELDS:
        value = getattr(rec, name)
        if not isinstance(value, str):
            setattr(rec, name, "" if value is None else str(value))
    if not isinstance(rec.job_ids, list) or not all(isinstance(j, str) for j in rec.job_ids):
        ids = rec.job_ids if isinstance(rec.job_ids, (list, tuple, set)) else [] if rec.job_ids is None \
            else [rec.job_ids]
        rec.job_ids = [str(j) for j in ids]
    if not isinstance(rec.evidence, dict):
        rec.evidence = {} if rec.evidence is None else {"value": rec.evidence}
    elif _deeper_than(rec.evidence, MAX_EVIDENCE_DEPTH):
        rec.evidence = {"unserialisable": f"evidence nested deeper than {MAX_EVIDENCE_DEPTH} levels"}
    if isinstance(rec.time, bool) or not isinstance(rec.time, (int, float)) or not math.isfinite(rec.time) \
            or not rec.time:
        rec.time = time.time()
    if not rec.event:
        rec.event = "unknown"
    if not rec.host:
        rec.host = socket.gethostname()
    if rec.severity not in SEVERITIES:
        rec.severity = "info"


def _matches(rec: Record, node: Optional[str], job: Optional[str], since: Optional[float],
             events: Optional[List[str]]) -> bool:
    if node and rec.node != node:
        return False
    if job and str(job) not in rec.job_ids:
        return False
    if since is not None and rec.time < since:
        return False
    return not (events and rec.event not in events)
