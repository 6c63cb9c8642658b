"""Records a job's runner leaves for root: written as the user, journalled by root as the user's text.

The job runner runs as the job's user. It must not need a site secret (the webhook URLs live in a
root-only file, ``notify.secrets_file``) nor a journal every user can write (anyone could forge a
record in it). So (issue 25, item 4) a runner that is not root appends its records, as JSON lines, to
its own file in a spool folder on the node (``journal.job_spool``, mode 1733 like /tmp without the
listing: every user may create a file, only its owner may change it), and the epilog, which Slurm runs
as root on the same node when the job's run ends (requeue, completion, cancel), moves them into the site
journal and posts them to the site webhooks. There every record is **the user's text**:

* it is taken only from a file the job's own uid owns (``fstat`` after an ``O_NOFOLLOW`` open), named
  after the job id Slurm gives the epilog, and read up to ``MAX_BYTES`` / ``MAX_RECORDS``;
* what identifies it comes from Slurm, not from the file: ``source`` is always ``job``, the job id is
  the epilog's (or that job's array form), the node one of the job's nodes (else the epilog's node),
  the host the epilog's; ``evidence.from_job`` names the job, uid and user; what the record claimed
  about itself otherwise (another source, event, node) is kept under ``evidence.claimed``;
* the event must look like one of the runner's (``job-...``), else it becomes ``job-record``; the
  message is sanitised and starts with ``[user <name>]``; notifications escape it like every other
  (``autoheal.notify``).

So a user can make records appear under their own job, marked as theirs, and nothing that passes for a
record of root's hooks, guard or sync. A runner running as root (root's own jobs, the lab) writes the
journal directly, as before.

Delivery is at least once: the epilog removes a file after journalling it; killed in between, the next
epilog of that job on the node journals it again.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from autoheal.reasons import sanitize

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:  # imported where a record is made: the epilog of a job that left none never loads them
    from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

    from autoheal.journal import Record

#: A job's records on one node; more is not the runner's (a few per run) and is dropped.
MAX_BYTES = 1 << 20
MAX_RECORDS = 500
#: Spool entries the epilog looks at (the files of finished jobs are removed by their epilogs).
MAX_SCAN = 20000
#: The claimed evidence kept per record (JSON characters).
MAX_EVIDENCE = 4096
SOURCE = "job"
_EVENT = re.compile(r"job-[a-z0-9][a-z0-9-]{0,47}")
_JOB_ID = re.compile(r"[0-9]+(_[0-9]+)?")
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _name_pattern(job: str) -> re.Pattern[str]:
    return re.compile(rf"{re.escape(job)}\.([0-9]+)(\.[0-9a-f]{{8}})?\.jsonl")


class JobOutbox:
    """The runner's side: append records to ``<spool>/<job>.<uid>.jsonl`` (never raises; says why once)."""

    def __init__(self, spool: Union[str, Path], job_id: str, say: Any = None):
        self.spool = Path(spool)
        self.job_id = job_id  # SLURM_JOB_ID: the id the epilog is given (an array task's own id)
        self.uid = os.geteuid()
        self.say = say or (lambda text: print(f"autoheal-runner: {text}", file=sys.stderr))
        self.path: Optional[Path] = None
        self._fd: Optional[int] = None
        self._broken = False

    def _open(self) -> Optional[int]:
        if self._broken:
            return None
        if self._fd is not None:
            return self._fd
        import secrets

        names = [f"{self.job_id}.{self.uid}.jsonl"] + [f"{self.job_id}.{self.uid}.{secrets.token_hex(4)}.jsonl"
                                                        for _ in range(3)]
        why = ""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        for i, name in enumerate(names):
            try:  # the later names are fresh: O_EXCL, so nobody's file or symlink is ever opened
                fd = os.open(self.spool / name, flags | (os.O_EXCL if i else 0), 0o600)
            except OSError as exc:
                why = exc.strerror or str(exc)
                if not self.spool.is_dir():
                    break  # no spool on this node (yet): nothing to try
                continue  # e.g. another user made this name first (EACCES, ELOOP): a name of our own
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == self.uid:
                self._fd, self.path = fd, self.spool / name
                return fd
            os.close(fd)  # someone else's file under our name: root would refuse it; take a fresh one
            why = "the name is taken by another user's file"
        self._broken = True
        self.say(f"warning: cannot keep this job's records for the site journal in {self.spool} ({why}); "
                 "they are only in this output")
        return None

    def record(self, event: str, strict: bool = False, **fields: Any) -> Optional[Record]:
        """Like :meth:`autoheal.journal.Journal.record`: the Record, or None when it could not be kept."""
        from autoheal.journal import Record

        rec = Record(event=event, **fields)
        rec.time = rec.time or time.time()
        fd = self._open()
        if fd is None:
            return None
        line = (rec.to_json() + "\n").encode()
        try:
            if os.fstat(fd).st_size + len(line) > MAX_BYTES:
                raise OSError(0, f"more than {MAX_BYTES} bytes of records")
            os.write(fd, line)
            os.fsync(fd)
        except OSError as exc:
            self._broken = True  # said once; the job's output has every record anyway
            self.say(f"warning: cannot keep this job's records in {self.path}: {exc.strerror or exc}")
            self.close()
            return None
        return rec

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# ---- root's side --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobIdentity:
    """What Slurm told the epilog about the job (trusted: slurmd sets it, not the user)."""

    job_id: str  # SLURM_JOB_ID
    uid: int
    user: str
    nodes: Sequence[str] = ()
    array_id: str = ""  # "<SLURM_ARRAY_JOB_ID>_<SLURM_ARRAY_TASK_ID>" when the job is an array task

    @classmethod
    def from_env(cls, env: Dict[str, str]) -> Optional[JobIdentity]:
        from autoheal.slurm.hostlist import expand

        job, uid = env.get("SLURM_JOB_ID", ""), env.get("SLURM_JOB_UID", "")
        if not job.isdigit() or not uid.isdigit():
            return None
        try:
            nodes = expand(env.get("SLURM_JOB_NODELIST", ""))
        except ValueError:
            nodes = []
        array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
        return cls(job, int(uid), sanitize(env.get("SLURM_JOB_USER", ""), 64) or f"uid {uid}", tuple(nodes),
                   f"{array}_{task}" if array.isdigit() and task.isdigit() else "")


@dataclass
class Collected:
    """The records found for one job, ready to journal, and the files to remove once they are."""

    records: List[Record] = field(default_factory=list)
    files: List[Path] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)


def ensure_spool(spool: Union[str, Path]) -> Optional[str]:
    """Make the spool folder (root, 1733) if it is missing; why it cannot be used, or None."""
    path = Path(spool)
    try:
        if not path.exists() and not path.is_symlink():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            path.mkdir(mode=0o700)
            os.chmod(path, 0o1733)  # the mode, whatever the umask
        st = os.lstat(path)
    except OSError as exc:
        return f"job spool {path}: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode):
        return f"job spool {path} is not a folder"
    if st.st_uid != 0:
        return f"job spool {path} is owned by uid {st.st_uid}, not root: not read"
    return None


def collect(spool: Union[str, Path], ident: JobIdentity, local_node: str) -> Collected:
    """Read the job's files in ``spool`` as untrusted text (see the module docstring)."""
    out = Collected()
    problem = ensure_spool(spool)
    if problem:
        out.problems.append(problem)
        return out
    pattern = _name_pattern(ident.job_id)
    names: List[str] = []
    try:  # bounded: a spool a user filled with files must not hold up the epilog
        with os.scandir(spool) as entries:
            for seen, entry in enumerate(entries):
                if seen >= MAX_SCAN:
                    out.problems.append(f"job spool {spool}: more than {MAX_SCAN} files; the rest not looked at")
                    break
                if pattern.fullmatch(entry.name):
                    names.append(entry.name)
    except OSError as exc:
        out.problems.append(f"job spool {spool}: {exc.strerror or exc}")
        return out
    names.sort()
    budget = MAX_RECORDS
    for name in names:
        path = Path(spool) / name
        out.files.append(path)  # removed after journalling, whatever it held
        m = pattern.fullmatch(name)
        try:
            fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            out.problems.append(f"{name}: {exc.strerror or exc}")
            continue
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                out.problems.append(f"{name}: not a regular file; ignored")
                continue
            if st.st_uid != ident.uid:
                out.problems.append(f"{name}: owned by uid {st.st_uid}, not by job {ident.job_id}'s user "
                                    f"(uid {ident.uid}); ignored")
                continue
            if m is not None and int(m.group(1)) != ident.uid:
                out.problems.append(f"{name}: named for uid {m.group(1)}, not for job {ident.job_id}'s user "
                                    f"(uid {ident.uid}); ignored")
                continue
            data = fh.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            out.problems.append(f"{name}: more than {MAX_BYTES} bytes; the rest ignored")
            data = data[:MAX_BYTES]
        for line in data.decode("utf-8", "replace").splitlines():
            if not line.strip():
                continue
            if budget <= 0:
                out.problems.append(f"{name}: more than {MAX_RECORDS} records; the rest ignored")
                break
            rec = untrusted_record(line, ident, local_node)
            if rec is not None:
                out.records.append(rec)
                budget -= 1
    return out


def untrusted_record(line: str, ident: JobIdentity, local_node: str) -> Optional[Record]:
    """The site-journal record for one line a job wrote (None when the line is not a record)."""
    from autoheal.journal import SEVERITIES, Record

    try:
        claimed = Record.from_dict(json.loads(line))
    except (ValueError, RecursionError):
        return None
    event = claimed.event if _EVENT.fullmatch(claimed.event) else "job-record"
    job = ident.job_id
    if claimed.job_ids and claimed.job_ids[0] in (ident.job_id, ident.array_id) and _JOB_ID.fullmatch(
            claimed.job_ids[0]):
        job = claimed.job_ids[0]
    node = claimed.node if claimed.node and claimed.node in ident.nodes else local_node
    kept: Dict[str, Any] = {}
    for name, value, ours in (("event", claimed.event, event), ("node", claimed.node, node),
                              ("source", claimed.source, SOURCE), ("host", claimed.host, "")):
        if value and value != ours:
            kept[name] = sanitize(value, 200)
    try:
        evidence_text = json.dumps(claimed.evidence, sort_keys=True, default=str)
    except (ValueError, TypeError, RecursionError):
        evidence_text = ""
    if evidence_text and evidence_text != "{}":
        kept["evidence"] = claimed.evidence if len(evidence_text) <= MAX_EVIDENCE else \
            {"dropped": f"{len(evidence_text)} characters, more than {MAX_EVIDENCE}"}
    import socket

    now = time.time()
    when = claimed.time if now - 90 * 86400 < claimed.time <= now + 60 else now
    return Record(event=event, node=node, job_ids=[job], action=sanitize(claimed.action, 60),
                  outcome=sanitize(claimed.outcome, 60), check="",
                  message=f"[user {ident.user}] {sanitize(claimed.message, 1500)}",
                  severity=claimed.severity if claimed.severity in SEVERITIES else "info", source=SOURCE,
                  time=when, host=socket.gethostname(),
                  evidence={"from_job": {"job": job, "uid": ident.uid, "user": ident.user}, "claimed": kept})


def remove(files: Iterable[Path]) -> None:
    for path in files:
        try:
            os.unlink(path)
        except OSError:
            pass
