"""The node's own memory, shared by healthcheck, prolog, epilog and xid-watch.

One JSON file (``<state_dir>/state.json``) changed under an exclusive flock (``locks/state.lock``: a
0600 file in a 0700 directory, so no other user can hold it: ``autoheal.lockfile``) and replaced
atomically (a fresh temporary name, ``autoheal.atomicfile``), so concurrent hooks never lose each
other's updates and a crash never leaves half a file. It holds: the kernel-log cursor (XIDs seen),
recent XIDs (dedupe across sources), the last check result, consecutive passes, the drain we made, open
faults, recovery-ladder counts and xid-watch counters and its job-side work (pending drain, fault
episode, per-job actions).

Its shape is the typed records below (``NodeStateData`` and the records it holds: TypedDicts, so the
file stays the JSON it always was and a record is a plain dict at run time, with mypy checking every
key). ``load`` and ``dump`` are the one way in and out: ``load`` reads today's files and the older
layouts (``_upgrade``), and a file that is not JSON is a ``StateCorrupt``, kept aside, never silently
overwritten.

A state dir that cannot be written (read-only, full, lock held by a stuck hook, a path Python refuses)
is the hooks' own trouble, never a reason to fail Slurm: with ``fallback=True`` the store keeps working
on an in-memory copy, says so in ``trouble``, and writes the copy back once the disk takes it again.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os

from autoheal.errors import AutohealError
from autoheal.lazyre import LazyPattern
from autoheal.records import cast

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Any, ContextManager, Dict, Iterator, List, Optional, Tuple, TypedDict, Union

    from autoheal.hooks.checks import ResultDict
    from autoheal.hooks.ladder import Rung
    from autoheal.hooks.xids import CursorDict


STATE_FILE = "state.json"
#: Where a state file that is not JSON (a disk error, a hand edit) is kept for its admin when the hooks
#: start over from an empty state: its bytes are never simply overwritten (0600: it may hold anything).
CORRUPT_FILE = "state.json.corrupt"
VERSION = 1


def expand(path: str, node: str) -> str:
    """Expand ``{node}`` in a configured path."""
    return path.replace("{node}", node) if path else path


# ---- the records -----------------------------------------------------------------------------------
# total=False: a record written by an older hook may lack a field, and the hooks add fields to a record
# as it moves on (a job action's signalled_at, an XID's dups); readers use .get() with a default.
# They exist for mypy only (defined under TYPE_CHECKING): at run time a record is the plain dict json made,
# and building 13 TypedDict classes cost every hook process 1.5-10 ms (measured 2026-12-02, this machine
# under load), a hot path that runs on every node every HealthCheckInterval (issue 24 section 6).

if TYPE_CHECKING:
    class RecentXid(TypedDict, total=False):
        """An XID judged lately (dedupe across the NVML and kernel-log sources)."""

        xid: int
        gpu: Optional[int]
        pci: str
        time: float
        sources: List[str]
        app_pending: bool  # an application XID NVML told first: the kernel log's copy names the process
        dups: int
        noted: float

    class LastResult(TypedDict, total=False):
        time: float
        status: str
        source: str
        results: List[ResultDict]  # of the results that were not OK

    class LastPass(TypedDict, total=False):
        time: float
        boot_id: str
        usec: int

    class Drain(TypedDict, total=False):
        """The drain WE made (never someone else's)."""

        reason: str
        time: float
        source: str
        check: str
        action: str
        gpu: Optional[int]
        preswap: str  # the sign a pre-emptive swap drained for (hooks.preswap)
        opened: float  # when the node was drained for this fault episode (kept across rewordings)

    class Fault(TypedDict, total=False):
        """An open fault awaiting a repair rung (one per check and GPU)."""

        check: str
        gpu: Optional[int]
        action: str
        reason: str
        since: float
        evidence: Dict[str, Any]  # the check's evidence (CheckResult.evidence)
        count: int
        noted: float

    class RebootRequest(TypedDict, total=False):
        boot_id: str
        time: float

    class HistoryEntry(TypedDict, total=False):
        """One entry of the lemon history (hooks.lemon): a ``fault`` or a ``returned``."""

        time: float
        event: str
        check: str
        xid: Optional[int]
        gpu: Optional[int]
        reason: str
        how: str

    class PendingDrain(TypedDict, total=False):
        """A drain slurmctld did not take yet: retried until it does."""

        failure: ResultDict
        since: float
        tries: int
        next_try: float

    class Episode(TypedDict, total=False):
        """The node is drained for a hardware fault: its jobs get their grace signal and requeue once."""

        id: str
        since: float
        reason: str
        under_foreign: ResultDict  # our fault kept behind someone else's drain
        under_foreign_at: float  # when it was first kept behind it
        drain_opened: float  # the ``opened`` of the drain record it was opened for (absent: none on record)

    class RequeueFault(TypedDict, total=False):
        """A "requeue"-policy XID whose jobs are still to be found (``jobs`` None: all on the node)."""

        id: str
        reason: str
        since: float
        jobs: Optional[List[str]]

    class JobAction(TypedDict, total=False):
        """Once per job and fault: its grace signal, then its requeue."""

        job: str
        fault: str
        stage: str  # a Stage
        runner: Optional[bool]
        note: str
        detail: str
        created: float
        deadline: Optional[float]
        tries: int
        next_try: float
        outcome: str
        hot_spare: bool
        signalled_at: float
        fallback: bool
        grace_end: float
        requested: Any  # the signal the job asked for (WarnSignal fields), or None
        requeue_tried: float

    class PolledFault(TypedDict, total=False):
        """A hard fault xid-watch's health poll acted on (one detection record per fault, not per poll)."""

        check: str
        gpu: Optional[int]
        reason: str
        since: float

    class AppJob(TypedDict, total=False):
        """A job's application XIDs on this node (hooks.xid_jobs): counts per XID, those it was told of."""

        xids: Dict[str, int]
        told: List[int]
        first: float
        last: float

    class NodeStateData(TypedDict):
        """The whole file; ``load`` fills in every key."""

        version: int
        kmsg: CursorDict                            # LogCursor.to_dict()
        recent_xids: List[RecentXid]
        app_xids: Dict[str, List[float]]            # gpu -> times of ignored (application) XIDs
        last_result: Optional[LastResult]
        last_pass: Optional[LastPass]
        passes: int                                 # consecutive passing healthchecks
        unknown_runs: Dict[str, int]                # gpu -> consecutive runs it could not be read
        drain: Optional[Drain]
        faults: List[Fault]
        ladder: Dict[str, Dict[str, List[float]]]   # "gpu3"/"node" -> {rung: [times]}
        gpu_pci: Dict[str, int]                     # "0000:3b:00" -> index (kept for GPUs that are lost now)
        counters: Dict[str, float]                  # xid-watch counters for the textfile exporter
        job_baseline: Dict[str, Dict[str, int]]     # job id -> {gpu: ecc dbe} (prolog -> epilog)
        repaired: Dict[str, float]                  # "gpu3"/"node" -> last repair (ends the XID dedupe window)
        foreign_noted: Dict[str, str]               # fault key -> foreign reason already journalled as "skipped"
        polled_faults: Dict[str, PolledFault]       # "<check>:<gpu>" -> hard fault xid-watch's health poll acted on
        app_jobs: Dict[str, AppJob]                 # job -> its application XIDs (hooks.xid_jobs)
        history: List[HistoryEntry]                 # faults and returns to service, kept across repairs
        reboot_requested: Optional[RebootRequest]   # the reboot we asked for, until the node is back
        # xid-watch's job side (autoheal.hooks.jobside)
        pending_drain: Optional[PendingDrain]
        episode: Optional[Episode]
        requeue_faults: List[RequeueFault]
        job_actions: Dict[str, JobAction]           # "<job>@<fault id>" -> its action

def empty() -> NodeStateData:
    return {"version": VERSION, "kmsg": {}, "recent_xids": [], "app_xids": {}, "last_result": None,
            "last_pass": None, "passes": 0, "unknown_runs": {}, "drain": None, "faults": [], "ladder": {},
            "gpu_pci": {}, "counters": {}, "job_baseline": {}, "repaired": {}, "foreign_noted": {},
            "polled_faults": {}, "app_jobs": {}, "history": [], "reboot_requested": None, "pending_drain": None,
            "episode": None, "requeue_faults": [], "job_actions": {}}


# ---- the one load and save -------------------------------------------------------------------------

class StateCorrupt(AutohealError, ValueError):
    """The state file is not a JSON object, or not one of the node state's shape (a disk error, a hand edit
    gone wrong, a hostile write; see ``_check_shape`` and ``_upgrade``). A CLI reading the state
    (``autoheal node history``) says so in one line and exits 2 (could not tell)."""


def load(raw: Union[bytes, str], where: str = STATE_FILE) -> NodeStateData:
    """The state a file's bytes hold: today's layout and the older ones, every key present (missing ones
    empty, unknown ones kept). Raises StateCorrupt when the bytes are not a JSON object of that shape."""
    try:
        data = json.loads(raw)
    except ValueError as exc:  # UnicodeDecodeError is one too
        raise StateCorrupt(f"{where}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise StateCorrupt(f"{where}: not a JSON object but {type(data).__name__}")
    state = empty()
    cast("Dict[str, Any]", state).update(data)
    _check_shape(cast("Dict[str, Any]", state), where)
    _upgrade(cast("Dict[str, Any]", state), where)
    return state


def dump(state: NodeStateData) -> bytes:
    return json.dumps(state, sort_keys=True, default=str).encode()


#: The container each top-level key holds (None allowed where ``empty()`` has None), and, for the lists
#: and maps of records, that every element is a record (a JSON object). Checked by ``load``: a file whose
#: shape is wrong (a disk error, a hand edit, a hostile write) is a ``StateCorrupt`` (kept aside, said),
#: never a TypeError in some hook later, on every run, with the file never replaced.
_SHAPE: Dict[str, Tuple[type, bool]] = {
    "kmsg": (dict, False), "recent_xids": (list, True), "app_xids": (dict, False), "last_result": (dict, False),
    "last_pass": (dict, False), "unknown_runs": (dict, False), "drain": (dict, False), "faults": (list, True),
    "ladder": (dict, True), "gpu_pci": (dict, False), "counters": (dict, False), "job_baseline": (dict, True),
    "repaired": (dict, False), "foreign_noted": (dict, False), "polled_faults": (dict, True),
    "app_jobs": (dict, True), "history": (list, True), "reboot_requested": (dict, False),
    "pending_drain": (dict, False), "episode": (dict, False), "requeue_faults": (list, True),
    "job_actions": (dict, True),
}
#: The records whose whole value may be None (the others are a list or a map, None read as empty).
_OPTIONAL = frozenset({"last_result", "last_pass", "drain", "reboot_requested", "pending_drain", "episode"})


def _check_shape(st: Dict[str, Any], where: str) -> None:
    """Raise StateCorrupt unless every known top-level key holds its kind of value (see ``_SHAPE``); a
    null list or map reads as empty. Unknown keys are kept as they are (a newer hook's)."""
    for key, (kind, of_records) in _SHAPE.items():
        val: Any = st.get(key)
        if val is None:
            if key not in _OPTIONAL:
                st[key] = kind()
            continue
        if not isinstance(val, kind):
            raise StateCorrupt(f"{where}: {key} is a {type(val).__name__}, not a {kind.__name__}")
        if of_records:
            got: Any = st[key]  # (mypy narrowed ``val`` to object above)
            items: List[Any] = list(got.values()) if isinstance(got, dict) else list(got)
            if not all(isinstance(v, dict) for v in items):
                raise StateCorrupt(f"{where}: {key} holds a value that is not a record")
    for key in ("version", "passes"):
        if not _is_number(st.get(key)):
            raise StateCorrupt(f"{where}: {key} is {_show(st.get(key))}, not a number")
    _check_numbers(st, where)


def _check_numbers(st: Dict[str, Any], where: str) -> None:
    """Raise StateCorrupt when a record (one level down: a fault, a job action, the drain, the kernel-log
    cursor, ...) holds something other than a number or null in a field the hooks read as a number."""
    for key, (_kind, of_records) in _SHAPE.items():
        val: Any = st.get(key)
        if not val or not (of_records or key in _OPTIONAL or key == "kmsg"):
            continue
        records: List[Any] = (list(val.values()) if isinstance(val, dict) else val) if of_records else [val]
        for rec in records:
            for name in _NUMBERS.intersection(rec):
                if rec[name] is not None and not _is_number(rec[name]):
                    raise StateCorrupt(f"{where}: {key}: {name} is {_show(rec[name])}, not a number")


#: Fields of the records that the hooks read as numbers (``float(rec.get("time", 0))``): present, each is a
#: number or null, so a hand edit or a torn value is a StateCorrupt at the load, not a ValueError later.
_NUMBERS = frozenset({"time", "since", "deadline", "next_try", "created", "signalled_at", "grace_end", "tries",
                      "count", "noted", "dups", "opened", "drain_opened", "under_foreign_at", "usec", "max_seq",
                      "inode", "offset", "first", "last", "requeue_tried"})


def _is_number(val: Any) -> bool:
    """A finite JSON number of a sane size (never a bool, a string, inf or a 400-digit integer)."""
    if isinstance(val, bool) or not isinstance(val, (int, float)):
        return False
    return abs(val) < 1e18 if isinstance(val, int) else val == val and abs(val) < 1e18


def _show(val: Any) -> str:
    """A value for a one-line error: its type and at most 40 characters of it."""
    return f"{type(val).__name__} {json.dumps(val, default=str)[:40]}"


#: A Slurm job id as xid-watch keyed it: ``1234``, or ``1234_5`` for an array task.
_LEGACY_JOB = LazyPattern(r"[0-9]{1,12}(?:_[0-9]{1,8})?")


def _legacy_field(job: str, info: Dict[str, Any], key: str, ok: Any, where: str) -> Any:
    """Field ``key`` of an old ``requeues`` entry, when ``ok(value)``; else StateCorrupt."""
    val = info.get(key)
    if not ok(val):
        raise StateCorrupt(f"{where}: old requeues entry of job {job[:40]!r}: {key} is {_show(val)}")
    return val


def _upgrade(st: Dict[str, Any], where: str = STATE_FILE) -> None:
    """Older layouts, read into today's. An xid-watch before the job side kept its pending requeues in
    ``requeues`` ({job: {xid, gpu, note, deadline}}): each becomes a job action in its grace stage, under a
    requeue fault of its own, so the requeue still comes at that deadline after an upgrade. An entry with
    odd values (a job id that is no Slurm job id, a deadline that is no finite number, a note that is no
    text, an entry that is no record) makes the file a StateCorrupt: kept aside and said, never a
    traceback, never a requeue of a job nobody named."""
    old = st.pop("requeues", None)
    if not old:
        return
    if not isinstance(old, dict):
        raise StateCorrupt(f"{where}: old requeues is {_show(old)}, not a record")
    from autoheal.hooks.jobside import GRACE, requeue_note  # only for an old file: the hooks start fast

    actions = st["job_actions"]
    for job, info in old.items():
        if not _LEGACY_JOB.fullmatch(job) or not isinstance(info, dict):
            raise StateCorrupt(f"{where}: old requeues entry {job[:40]!r} is {_show(info)}")
        xid = _legacy_field(job, info, "xid", lambda v: v is None or (_is_number(v) and isinstance(v, int)), where)
        gpu = _legacy_field(job, info, "gpu", lambda v: v is None or (_is_number(v) and isinstance(v, int)), where)
        note = _legacy_field(job, info, "note", lambda v: v is None or isinstance(v, str), where) or ""
        deadline = float(_legacy_field(job, info, "deadline", lambda v: v is None or _is_number(v), where) or 0)
        fid = f"legacy-{xid}-{gpu}"
        key = f"{job}@{fid}"
        if key in actions:
            continue
        actions[key] = {"job": job, "fault": fid, "stage": GRACE, "runner": None,
                        "note": requeue_note(note), "detail": "", "created": deadline,
                        "deadline": deadline, "tries": 0, "next_try": 0.0, "outcome": ""}
        st["requeue_faults"].append({"id": fid, "reason": "", "since": 0, "jobs": [job]})


class NodeState:
    """``with NodeState(dir).locked() as st:`` read-modify-write; ``.read()`` for a snapshot.

    ``fallback``: when the state cannot be locked or written, keep going on an in-memory copy (``read``
    returns it) instead of raising, and record why in ``trouble``. The next locked write that works
    merges the copy into what is on disk then: the top-level keys this process changed since it fell
    back win, everything else another process wrote meanwhile is kept. Hooks use it so that their own
    trouble never turns into a Slurm failure, and a long-running xid-watch never loses an XID to it.

    A corrupt file (``StateCorrupt``): ``read`` raises it without ``fallback``; with it, the hooks go on
    from an empty state and say so in ``trouble``, and the first locked write keeps the file's bytes in
    ``CORRUPT_FILE`` before it replaces it."""

    def __init__(self, state_dir: str, lock_timeout: float = 10.0, fallback: bool = False):
        # os.path, not pathlib: pathlib brings urllib.parse and ipaddress into every hook (issue 24 §6)
        self.dir = os.fspath(state_dir)
        self.path = os.path.join(self.dir, STATE_FILE)
        self.lock_timeout = lock_timeout
        self.fallback = fallback
        self.trouble = ""  # why the last locked() could not persist, or the corrupt file it replaced; "" if none
        self._unsaved: Optional[NodeStateData] = None  # our view while the disk does not take it
        self._base: Dict[str, Any] = {}  # what the disk held when we fell back (to tell our changes)
        self._replaced = ""  # the corrupt file this store replaced, if it did (told in every ``trouble``)
        self._corrupt_why = ""  # what was wrong with it (StateCorrupt's words, for the one-line report)

    def read(self) -> NodeStateData:
        if self._unsaved is not None:
            return copy.deepcopy(self._unsaved)
        state, corrupt = self._read_disk()
        if corrupt is not None:
            self.trouble = f"state {self.path} is corrupt ({self._corrupt_why}): going on from an empty state"
        return state

    def _read_disk(self) -> Tuple[NodeStateData, Optional[bytes]]:
        """The state on disk and, when the file is corrupt and ``fallback`` is on, its bytes (to keep)."""
        try:
            raw = _read_nofollow(self.path)
        except FileNotFoundError:
            return empty(), None
        except (OSError, ValueError):  # unreadable (ValueError: a NUL in the path): as before, an empty
            return empty(), None        # state (the lock or the write then says why it fails)
        try:
            return load(raw, str(self.path)), None
        except StateCorrupt as exc:
            if not self.fallback:
                raise
            self._corrupt_why = str(exc).replace(f"{self.path}: ", "", 1)
            return empty(), raw

    @contextlib.contextmanager
    def locked(self, timeout: Optional[float] = None) -> Iterator[NodeStateData]:
        timeout = self.lock_timeout if timeout is None else timeout
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(_flock(self.dir, "state.lock", timeout, "held"))
        except (OSError, ValueError, TimeoutError) as exc:  # ValueError: a NUL in the path
            stack.close()
            if not self.fallback:
                raise
            state = self.read()
            before = copy.deepcopy(state)
            yield state
            self._keep(state, before, f"state dir {self.dir}: {_why(exc)}")
            return
        with stack:
            state, corrupt = self._read_disk()
            if self._unsaved is not None:
                changed = {k: v for k, v in self._unsaved.items() if self._base.get(k) != v}
                cast("Dict[str, Any]", state).update(changed)
            before = copy.deepcopy(state) if self.fallback else empty()
            yield state
            try:
                if corrupt is not None:  # kept for its admin before the write replaces it
                    self._write_file(CORRUPT_FILE, corrupt, 0o600)
                self._write(state)
            except (OSError, ValueError) as exc:
                if not self.fallback:
                    raise
                self._keep(state, before, f"state {self.path}: cannot write: {_why(exc)}")
                return
            self._unsaved = None
            self._base = {}
            if corrupt is not None:  # said by this process's report (a hook's run) that replaced it
                self._replaced = (f"state {self.path} was corrupt ({self._corrupt_why}): kept as "
                                  f"{os.path.join(self.dir, CORRUPT_FILE)}, "
                                  f"started over from an empty state")
            self.trouble = self._replaced

    def _keep(self, state: NodeStateData, before: NodeStateData, why: str) -> None:
        if self._unsaved is None:
            self._base = dict(before)
        self._unsaved = copy.deepcopy(state)
        self.trouble = why

    @contextlib.contextmanager
    def pass_lock(self, timeout: float) -> Iterator[None]:
        """Serialise whole health passes (observe, drain, repair, resume) on this node.

        Slurm's HealthCheckProgram, ``autoheal check`` and a test may run at the same time; without this
        two passes could both see a fault, both reset the GPU, and the second would count the first's
        reset as a recurrence and escalate to a reboot. Raises TimeoutError after ``timeout`` seconds."""
        with _flock(self.dir, "pass.lock", timeout, "another health pass has run for over"):
            yield

    def _write(self, state: NodeStateData) -> None:
        # a full disk fails the write or the fsync: write_atomic leaves no temporary file behind. 0644:
        # `autoheal status` and admins read it; only root writes it (the directory is root's)
        self._write_file(STATE_FILE, dump(state), 0o644)

    def _write_file(self, name: str, data: bytes, mode: int) -> None:
        from autoheal.atomicfile import write_atomic

        write_atomic(os.path.join(self.dir, name), data, mode=mode)


def _read_nofollow(path: str) -> bytes:
    """The file's bytes; a symlink planted under its name is refused (ELOOP, an OSError: read as an empty
    state, and the write then replaces the link itself), so its target's bytes are never read, nor kept
    as a corrupt state."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def _why(exc: BaseException) -> str:
    """One line for an OS error (``Read-only file system``) or a timeout."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


# ---- pure helpers over the state dict --------------------------------------------------------------

def seen_recently(state: NodeStateData, xid: int, gpu: Optional[int], pci: str, now: float,
                  window: float) -> bool:
    """True when the same XID on the same GPU was handled within ``window`` seconds and no repair of
    that GPU (or of the node) came in between: a fault back after a repair is a new fault."""
    return recent_xid(state, xid, gpu, pci, now, window) is not None


#: Seconds within which the other source's report of one XID arrives (the driver writes the NVML event and
#: the kernel-log record at the same moment; xid-watch reads both within a poll). Such a copy is the same
#: XID even when a repair came in between: seen in the soak, an NVML XID 48 at .800, a reset of that GPU
#: for an earlier fault at .953, the kernel-log copy at .972 judged "back after a repair" (a ladder climb).
COMPANION_SECONDS = 5.0


def recent_xid(state: NodeStateData, xid: int, gpu: Optional[int], pci: str, now: float,
               window: float, source: str = "") -> Optional[RecentXid]:
    """The remembered XID this one duplicates (see ``seen_recently``), or None. ``source``: where this
    one was read (nvml, kmsg, file); the other source's copy of an XID judged just before a repair is
    still that XID (``COMPANION_SECONDS``)."""
    for r in reversed(state.get("recent_xids", [])):
        if r.get("xid") != xid or now - float(r.get("time", 0)) > window:
            continue
        same = ((gpu is not None and r.get("gpu") == gpu) or (pci and r.get("pci") == pci)
                or (gpu is None and not pci and r.get("gpu") is None and not r.get("pci")))
        if not same:
            continue
        if float(r.get("time", 0)) < repaired_at(state, r.get("gpu") if r.get("gpu") is not None else gpu):
            if source and r.get("sources") and source not in r["sources"] \
                    and now - float(r.get("time", 0)) <= COMPANION_SECONDS:
                return r  # the other source's copy of the XID judged before the repair
            continue  # judged before the last repair: that window is closed
        return r
    return None


def mark_repaired(state: NodeStateData, gpu: Optional[int], now: float) -> None:
    """A repair of ``gpu`` (None: the whole node: reboot, resume, admin clear) ends its XID dedupe window."""
    state.setdefault("repaired", {})[ladder_key(gpu)] = now


def repaired_at(state: NodeStateData, gpu: Optional[int]) -> float:
    """When ``gpu`` (or the node as a whole) was last repaired; 0 when never."""
    rep = state.get("repaired") or {}
    times = [float(rep.get("node", 0) or 0)]
    if gpu is not None:
        times.append(float(rep.get(ladder_key(gpu), 0) or 0))
    return max(times)


def remember_xid(state: NodeStateData, xid: int, gpu: Optional[int], pci: str, now: float,
                 keep: float = 86400.0, source: str = "") -> None:
    recent = [r for r in state.get("recent_xids", []) if now - float(r.get("time", 0)) <= keep]
    recent.append({"xid": xid, "gpu": gpu, "pci": pci, "time": now, "sources": [source] if source else []})
    state["recent_xids"] = recent[-500:]


def count_app_xid(state: NodeStateData, gpu: Optional[int], now: float, window: float) -> int:
    """Record one application XID on ``gpu`` and return how many fell within the window."""
    key = str(gpu)
    times = [t for t in state.setdefault("app_xids", {}).get(key, []) if now - t <= window]
    times.append(now)
    state["app_xids"][key] = times[-1000:]
    return len(times)


def bump(state: NodeStateData, counter: str, amount: float = 1) -> None:
    c = state.setdefault("counters", {})
    c[counter] = c.get(counter, 0) + amount


#: Buckets (seconds) of the node-side latency histograms in the textfile (fault -> drain).
LATENCY_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def observe(state: NodeStateData, name: str, value: float, buckets: Tuple[float, ...] = LATENCY_BUCKETS) -> None:
    """Add ``value`` to the cumulative histogram ``name`` in the counters (``_bucket{le=..}``, ``_sum``,
    ``_count``: the Prometheus histogram layout, so histogram_quantile() reads the textfile directly)."""
    for le in buckets:  # every bucket exists from the first observation on (0 where the value is above it)
        bump(state, f'{name}_bucket{{le="{le:g}"}}', 1 if value <= le else 0)
    bump(state, f'{name}_bucket{{le="+Inf"}}')
    bump(state, f"{name}_sum", round(value, 6))
    bump(state, f"{name}_count")


def ladder_key(gpu: Optional[int]) -> str:
    return "node" if gpu is None else f"gpu{gpu}"


def ladder_label(key: str, node: str) -> str:
    """A ladder key for people: ``gpu3`` -> ``GPU 3 of gpu2`` (never a bare ``gpu3``, which reads as a node
    name), ``node`` -> ``gpu2 as a whole``."""
    if key.startswith("gpu") and key[3:].isdigit():
        return f"GPU {key[3:]} of {node}"
    return f"{node} as a whole" if key == "node" else key


def ladder_count(state: NodeStateData, gpu: Optional[int], rung: Rung, now: float, window: float) -> int:
    times = state.get("ladder", {}).get(ladder_key(gpu), {}).get(rung, [])
    return sum(1 for t in times if now - float(t) <= window)


def record_rung(state: NodeStateData, gpu: Optional[int], rung: Rung, now: float) -> None:
    ent = state.setdefault("ladder", {}).setdefault(ladder_key(gpu), {})
    ent.setdefault(rung, []).append(now)
    ent[rung] = ent[rung][-50:]


def open_fault(state: NodeStateData, fault: Fault) -> None:
    """Add a fault awaiting repair (one per check and GPU)."""
    faults = state.setdefault("faults", [])
    for f in faults:
        if f.get("check") == fault.get("check") and f.get("gpu") == fault.get("gpu"):
            f.update({k: v for k, v in fault.items() if k != "since"})  # type: ignore[typeddict-item]
            return
    faults.append(fault)


def _flock(directory: str, name: str, timeout: float, what: str) -> ContextManager[None]:
    """An exclusive lock ``directory/locks/name`` only this user can take, polled until ``timeout``
    (then TimeoutError)."""
    from autoheal.lockfile import exclusive

    return exclusive(directory, name, timeout, what)
