"""The guard's requeue intents: what it was about to do, kept on disk until it is done and recorded.

A lost-prolog requeue is two writes to Slurm (``scontrol requeue``, then the comment ``guard=requeued``)
and a journal record. The requeue goes first, so the comment never claims a requeue that failed; but a
guard killed right after the requeue would leave the job requeued with no comment and no record, and
the next guard cannot tell that requeue from anyone else's. So before the requeue the guard writes an
intent (job, restart count, the comment to write), and removes it only when all is done. Each pass
looks at the intents left: a job whose restart count went up was requeued (finish: comment, record);
one that did not was not (drop the intent: the rule sees the job again, if it is still stuck); a job that
is gone is dropped. Killed at any instant, the next pass finishes the requeue or leaves it undone, and
never requeues twice (a requeued job is pending, not in Prolog).

Files are written whole (temporary file, fsync, rename); a file that cannot be read is dropped with a
message, never trusted. Without a directory (``--dry-run``, tests) the intents live in memory only.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from autoheal.slurm.model import Job

#: Slurm job ids as the guard names them: ``123`` or ``123_4`` (nothing that could leave the directory).
_JOB_ID = re.compile(r"^[0-9]+(?:_[0-9]+)?$")


@dataclass(frozen=True)
class RequeueIntent:
    """A lost-prolog requeue the guard is about to make (or made, and has not recorded yet)."""

    job_id: str
    restart_count: int  # the job's restart count before the requeue: a higher one means it happened
    comment: Optional[str]  # the comment to write after the requeue; None: leave the comment as it is
    why: str

    def file_name(self) -> str:
        return f"requeue-{self.job_id}-{self.restart_count}.json"


class IntentOutcome(Enum):
    """What a left-over intent means, given the job as Slurm shows it now."""

    REQUEUED = "requeued"  # the restart count went up: finish (comment, record)
    NOT_REQUEUED = "not-requeued"  # same run: the requeue never happened; drop (the rule looks again)
    GONE = "gone"  # Slurm no longer knows the job: drop


def outcome(intent: RequeueIntent, job: Optional[Job]) -> IntentOutcome:
    """Pure: the left-over ``intent`` judged by ``job`` (None: Slurm does not know it any more)."""
    if job is None:
        return IntentOutcome.GONE
    if job.restart_count > intent.restart_count:
        return IntentOutcome.REQUEUED
    return IntentOutcome.NOT_REQUEUED


class IntentStore:
    """Intents in ``directory`` (durable) or in memory (``directory`` None)."""

    def __init__(self, directory: Optional[Path] = None, say: Callable[[str], None] = print):
        self.directory = directory
        self.say = say
        self._memory: Dict[str, RequeueIntent] = {}

    def add(self, intent: RequeueIntent) -> None:
        """Record ``intent`` durably before acting on it; OSError when it cannot be (then do not act)."""
        if not _JOB_ID.match(intent.job_id):
            raise OSError(f"refusing a requeue intent for job id {intent.job_id!r}")
        self._memory[intent.file_name()] = intent
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.directory / intent.file_name()
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, json.dumps(asdict(intent)).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(self.directory)

    def drop(self, intent: RequeueIntent) -> None:
        self._memory.pop(intent.file_name(), None)
        if self.directory is None:
            return
        try:
            os.unlink(self.directory / intent.file_name())
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.say(f"autoheal guard: cannot remove the requeue intent of job {intent.job_id}: {exc}")

    def pending(self) -> List[RequeueIntent]:
        """Every intent left (read from the directory: a guard restarted since sees its predecessor's)."""
        if self.directory is None:
            return list(self._memory.values())
        out: List[RequeueIntent] = []
        for path, text in _read_dir(self.directory):
            intent = _parse(text)
            if intent is None or path.name != intent.file_name():
                self.say(f"autoheal guard: ignoring unreadable requeue intent {path}")
                _unlink_quietly(path)
                continue
            out.append(intent)
        return out


def _parse(text: str) -> Optional[RequeueIntent]:
    try:
        data = json.loads(text)
        intent = RequeueIntent(job_id=str(data["job_id"]), restart_count=int(data["restart_count"]),
                               comment=None if data["comment"] is None else str(data["comment"]),
                               why=str(data["why"]))
    except (ValueError, KeyError, TypeError):
        return None
    return intent if _JOB_ID.match(intent.job_id) else None


def _read_dir(directory: Path) -> List[Tuple[Path, str]]:
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if not (name.startswith("requeue-") and name.endswith(".json")):
            continue
        path = directory / name
        try:
            out.append((path, path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            out.append((path, ""))
    return out


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_dir(directory: Path) -> None:
    # the rename is durable only once the directory is: a power cut must not forget the intent
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
