"""The remediation journal: an append-only JSON-lines record of every detection and action.

One line per record, written with O_APPEND under an exclusive flock and fsync'd, so concurrent writers
(healthcheck, xid-watch, the job runner, the sync daemon) never interleave and a crash never loses an
acknowledged record. A journal that cannot be written is reported (``JournalError``, or ``None`` from
``record(..., strict=False)``) and never stops the caller's real work.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Union

from autoheal.errors import JournalError
from autoheal.reasons import sanitize

SEVERITIES = ("info", "action", "error")


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

    def to_json(self) -> str:
        data = asdict(self)
        data["message"] = sanitize(self.message, 2000)
        return json.dumps(data, sort_keys=True, default=str)

    @classmethod
    def from_dict(cls, data: dict) -> "Record":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


class Journal:
    """Append and read the journal at ``path``."""

    def __init__(self, path: Union[str, Path], fsync: bool = True):
        self.path = Path(path)
        self.fsync = fsync

    @classmethod
    def from_config(cls, config) -> "Journal":
        return cls(config.journal.path, config.journal.fsync)

    def append(self, rec: Record) -> Record:
        """Write one record durably; JournalError (one line) when the file cannot be written."""
        if not rec.time:
            rec.time = time.time()
        if not rec.host:
            rec.host = socket.gethostname()
        if rec.severity not in SEVERITIES:
            rec.severity = "info"
        line = (rec.to_json() + "\n").encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise JournalError(f"journal {self.path}: cannot open for writing: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
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
            os.close(fd)
        return rec

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
        """Records in file order, filtered; a corrupt line (torn by a crash) is skipped, not fatal."""
        try:
            fh = open(self.path, "r", encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return
        except OSError as exc:
            raise JournalError(f"journal {self.path}: cannot read: {exc.strerror}") from None
        with fh:
            for line in fh:
                try:
                    data = json.loads(line)
                    if not isinstance(data, dict):
                        continue
                    rec = Record.from_dict(data)
                except (ValueError, TypeError):
                    continue
                if node and rec.node != node:
                    continue
                if job and str(job) not in [str(j) for j in rec.job_ids]:
                    continue
                if since is not None and rec.time < since:
                    continue
                if events and rec.event not in events:
                    continue
                yield rec
