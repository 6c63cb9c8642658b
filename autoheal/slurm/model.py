"""What the Slurm adapter returns: nodes and jobs as plain dataclasses, and node-state parsing.

Slurm prints node states in several spellings across versions and tools: ``IDLE+DRAIN`` (scontrol),
``DOWN*`` (``*`` = not responding), ``drained``/``draining`` (sinfo %T), ``idle`` plus a ``state_flags``
list (22.05 JSON) or ``["IDLE", "DRAIN"]`` (23.02+ JSON). ``parse_state`` folds them all into one base
state and a set of flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Optional, Tuple

BASE_STATES = ("ALLOCATED", "COMPLETING", "DOWN", "ERROR", "FUTURE", "IDLE", "MIXED", "UNKNOWN")
# Suffix characters sinfo/scontrol append to a state name, and the flag each stands for.
_SUFFIX_FLAGS = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "%": "POWERING_DOWN",
                 "!": "POWER_DOWN", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED", "$": "MAINTENANCE",
                 "-": "PLANNED"}
_ALIASES = {"ALLOC": "ALLOCATED", "IDL": "IDLE", "MIX": "MIXED", "COMP": "COMPLETING", "UNK": "UNKNOWN",
            "DRNG": "DRAINING", "DRAIN": "DRAIN", "DRNG*": "DRAINING", "MAINT": "MAINTENANCE",
            "NOT_RESPONDING": "NOT_RESPONDING", "NO_RESPOND": "NOT_RESPONDING", "RESV": "RESERVED",
            "REBOOT": "REBOOT_REQUESTED"}


def parse_state(text: str, extra_flags: Iterable[str] = ()) -> Tuple[str, FrozenSet[str]]:
    """Split a Slurm node state into (base state, flags); unknown words become flags, never errors.

    >>> parse_state("IDLE+DRAIN")
    ('IDLE', frozenset({'DRAIN'}))
    >>> parse_state("DOWN*")
    ('DOWN', frozenset({'NOT_RESPONDING'}))
    """
    words: List[str] = []
    for part in str(text or "").replace(",", "+").split("+"):
        part = part.strip().upper()
        if part:
            words.append(part)
    words.extend(str(f).strip().upper() for f in extra_flags if str(f).strip())
    base = ""
    flags = set()
    for word in words:
        while word and word[-1] in _SUFFIX_FLAGS:
            flags.add(_SUFFIX_FLAGS[word[-1]])
            word = word[:-1]
        word = _ALIASES.get(word, word)
        if word == "DRAINED":  # sinfo's compound spelling: idle (or down) + drain
            base = base or "IDLE"
            flags.add("DRAIN")
        elif word == "DRAINING":
            base = base or "ALLOCATED"
            flags.add("DRAIN")
        elif word in BASE_STATES and not base:
            base = word
        elif word in BASE_STATES and word == "COMPLETING":
            flags.add("COMPLETING")
        elif word:
            flags.add(word)
    return base or "UNKNOWN", frozenset(flags)


@dataclass(frozen=True)
class Node:
    """One Slurm node as the adapter sees it."""

    name: str
    state: str  # base state: IDLE, MIXED, ALLOCATED, DOWN, ...
    flags: FrozenSet[str] = frozenset()  # DRAIN, COMPLETING, NOT_RESPONDING, FAIL, ...
    reason: str = ""
    reason_user: str = ""
    reason_time: Optional[int] = None  # epoch seconds
    gres: str = ""
    partitions: Tuple[str, ...] = ()
    cpus: int = 0
    address: str = ""  # NodeAddr: where other nodes reach it ("" when Slurm does not say)
    slurmd_start_time: Optional[int] = None  # epoch seconds its slurmd (re)started; None when not told

    @property
    def drain(self) -> bool:
        """DRAIN flag set (drained or draining)."""
        return "DRAIN" in self.flags

    @property
    def drained(self) -> bool:
        """Drained and empty: no job left on it."""
        return self.drain and self.state in ("IDLE", "DOWN") and "COMPLETING" not in self.flags

    @property
    def down(self) -> bool:
        return self.state == "DOWN" or "FAIL" in self.flags

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags

    @property
    def state_text(self) -> str:
        """Compound form like ``IDLE+DRAIN``."""
        return "+".join([self.state, *sorted(self.flags)])

    @property
    def gpu_count(self) -> int:
        """GPUs from ``Gres=gpu:8`` / ``gpu:h100:8(S:0-1)``; 0 when none."""
        for item in self.gres.split(","):
            parts = item.split("(")[0].split(":")
            if parts and parts[0] == "gpu" and len(parts) >= 2:
                try:
                    return int(parts[-1])
                except ValueError:
                    return 0
        return 0


@dataclass(frozen=True)
class Job:
    """One Slurm job (or array task)."""

    job_id: str  # "123", or "123_4" for an array task
    state: str  # RUNNING, PENDING, ...
    nodes: Tuple[str, ...] = ()
    name: str = ""
    user: str = ""
    comment: str = ""
    excluded_nodes: Tuple[str, ...] = ()
    requeue: bool = False
    restart_count: int = 0
    batch_host: str = ""
    end_time: Optional[int] = None
    state_reason: str = ""
    state_description: str = ""  # e.g. "job requeued in held state" (set by requeuehold, kept by release)
    priority: Optional[int] = None  # 0 while held
    array_job_id: Optional[str] = None
    array_task_id: Optional[str] = None
    raw_id: str = ""  # the numeric job id Slurm uses internally
    submit_line: str = ""  # the sbatch command line (JSON of 23.02+; empty on 22.05, which does not report it)
    command: str = ""  # the batch script's path as submitted
    eligible_time: Optional[int] = None  # epoch seconds; after a requeue: requeue time + cred_expire + 1
    start_time: Optional[int] = None  # epoch seconds of its allocation (JSON only; None from the text listings)

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def held(self) -> bool:
        """PENDING and held (priority 0 with a hold reason), by whoever held it."""
        return self.state == "PENDING" and (self.priority == 0 or self.state_reason in HOLD_REASONS)

    @property
    def requeue_held(self) -> bool:
        """Held by ``scontrol requeuehold`` and not held again since.

        requeuehold sets reason JobHeldUser with the description below (observed on 22.05 and 24.11, as
        root and as the job's user); an admin's later ``scontrol hold`` turns the reason into JobHeldAdmin
        while the description stays, and a plain ``scontrol hold`` leaves no such description."""
        return (self.held and self.state_reason == "JobHeldUser"
                and self.state_description.strip().lower() == REQUEUE_HELD_DESCRIPTION)


@dataclass(frozen=True)
class WarnSignal:
    """The warning a job asked for at submission: ``--signal=[{R|B}:]SIG[@SECS]``.

    Slurm keeps it only inside slurmctld (no squeue/scontrol field on 22.05 to 25.11): it is read back
    from the job's submit line and batch script (``autoheal.slurm.parse.requested_signal``)."""

    signal: str  # a name scancel takes: USR2, TERM, ... (a number when Python does not know it)
    seconds: int = 60  # Slurm's default when @secs is left out
    batch: bool = False  # B: only the batch shell; else every step but the batch shell

    @property
    def spec(self) -> str:
        """Back in sbatch's spelling: ``B:USR2@90``."""
        return f"{'B:' if self.batch else ''}{self.signal}@{self.seconds}"


@dataclass(frozen=True)
class JobUpdate:
    """The job fields autoheal changes (``SlurmAdapter.update_job``); None leaves a field as it is."""

    excluded_nodes: Optional[Tuple[str, ...]] = None  # ExcNodeList: Slurm takes it only while PENDING
    comment: Optional[str] = None  # Comment (``squeue -o %k``, sacct)
    nodes: Optional[Tuple[str, ...]] = None  # NodeList: shrink a RUNNING job to exactly these nodes
    node_count: Optional[Tuple[int, int]] = None  # NumNodes=min-max: what a requeued job asks for again

    def scontrol_fields(self) -> Dict[str, str]:
        """The ``Key=Value`` fields of ``scontrol update jobid=X`` for this update, in a fixed order."""
        out: Dict[str, str] = {}
        if self.excluded_nodes is not None:
            out["ExcNodeList"] = ",".join(self.excluded_nodes)
        if self.comment is not None:
            out["Comment"] = self.comment
        if self.nodes is not None:
            out["NodeList"] = ",".join(self.nodes)
        if self.node_count is not None:
            out["NumNodes"] = f"{self.node_count[0]}-{self.node_count[1]}"
        return out


#: The reasons Slurm gives a held job.
HOLD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})
#: ``state_description`` of a job held by ``scontrol requeuehold`` (slurmctld job_mgr.c).
REQUEUE_HELD_DESCRIPTION = "job requeued in held state"


@dataclass
class SlurmVersion:
    """A parsed ``scontrol --version`` (``slurm-wlm 22.05.8`` / ``slurm 24.11.5``)."""

    major: int
    minor: int
    patch: int = 0
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> SlurmVersion:
        import re

        m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
        if not m:
            from autoheal.errors import SlurmParseError

            raise SlurmParseError(f"cannot read a Slurm version from {text!r}")
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0), text.strip())

    def at_least(self, major: int, minor: int = 0) -> bool:
        return (self.major, self.minor) >= (major, minor)

    def __str__(self) -> str:
        return f"{self.major:02d}.{self.minor:02d}.{self.patch}"
