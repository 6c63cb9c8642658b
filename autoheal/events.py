"""The names of the journal's records (``Record.event``): a closed set, so a typo fails at import time.

Every part writes its records under one of these names (the hooks, the sbatch runner and guard, the
sync, the CLI, notify). Reading stays open: ``Record.event`` is the text of the line, and a journal
written by an older or newer release keeps names this one does not know (``Event.of`` is None for them).
"""

from __future__ import annotations

from autoheal.strenum import StrEnum

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Optional


class Event(StrEnum):
    """What a journal record is about; the value is the word in ``journal.jsonl`` and ``autoheal events``."""

    # the node side (hooks, xid-watch)
    DETECTION = "detection"
    DRAIN = "drain"
    RESUME = "resume"
    REQUEUE = "requeue"
    SIGNAL = "signal"
    RETRY = "retry"
    ERROR = "error"
    REMEDIATION_STEP = "remediation-step"
    LEMON = "lemon"
    CLEAR_FAULTS = "clear-faults"
    APP_XID = "app-xid"
    AWAITING_REPLACEMENT = "awaiting-replacement"
    # the job side (autoheal sbatch's runner: ``job-<its final state>`` among them)
    JOB_RESTART = "job-restart"
    JOB_REQUEUE = "job-requeue"
    JOB_REQUEUE_FAILED = "job-requeue-failed"
    JOB_CANCELLED = "job-cancelled"
    JOB_COMPLETED = "job-completed"
    JOB_FAILED = "job-failed"
    JOB_MAX_RESTARTS = "job-max-restarts"
    JOB_NO_PROGRESS = "job-no-progress"
    JOB_PRESWAP_PENDING = "job-preswap-pending"
    JOB_SPARE_DROPPED = "job-spare-dropped"
    JOB_HOT_SWAP = "job-hot-swap"
    JOB_HOT_SWAP_REDONE = "job-hot-swap-redone"
    JOB_HANG = "job-hang"
    GUARD_RELEASE = "guard-release"
    GUARD_PRUNE = "guard-prune"
    GUARD_REQUEUE = "guard-requeue"
    GUARD_STRANDED = "guard-stranded"
    # the CLI (``autoheal node drain/resume``: nodeops outcomes) and notify
    DRAINED = "drained"
    RESUMED = "resumed"
    REASON_UPDATED = "reason-updated"
    NOTIFY_FAILED = "notify-failed"
    # the sync (``autoheal sync``): its Slurm writes (``slurm-<kind>`` without the prefix), remediation
    SET_REASON = "set-reason"
    RETIRE = "retire"
    REMEDIATION = "remediation"
    REMEDIATION_ABANDONED = "remediation-abandoned"
    REMEDIATION_CLEARED = "remediation-cleared"
    REMEDIATION_RETRY = "remediation-retry"
    REMEDIATION_RETRY_REQUESTED = "remediation-retry-requested"
    REMEDIATION_DONE = "remediation-done"
    REMEDIATION_FAILED = "remediation-failed"
    REMEDIATION_OPT_OUT = "remediation-opt-out"
    REMEDIATION_OPT_OUT_LIFTED = "remediation-opt-out-lifted"
    REMEDIATION_WAITING = "remediation-waiting"
    REMEDIATION_CAPACITY_LOW = "remediation-capacity-low"
    BREAKER_TRIPPED = "breaker-tripped"
    BREAKER_REARMED = "breaker-rearmed"
    BREAKER_RESET = "breaker-reset"

    @classmethod
    def of(cls, name: str) -> Optional[Event]:
        """The event a record read back names; None for a name this release does not write."""
        try:
            return cls(name)
        except ValueError:
            return None
