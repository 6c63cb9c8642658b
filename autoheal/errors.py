"""Typed errors shared by every part, and the exit codes the CLIs map them to.

Exit codes follow the project convention: 0 ok, 1 problem found, 2 usage or config error / could not check.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2


class AutohealError(Exception):
    """Base of every error we raise on purpose; ``str(err)`` is one line for the user."""

    exit_code = EXIT_USAGE


class ConfigError(AutohealError):
    """The config file is missing, malformed or has a bad key or value."""


class SlurmError(AutohealError):
    """A Slurm command or API call failed (non-zero exit, refused request)."""


class SlurmUnavailable(SlurmError):
    """slurmctld (or slurmrestd) could not be reached or did not answer in time.

    Callers treat this as "unknown": never as a reason to drain.
    """


class SlurmNotFound(SlurmError):
    """A node or job named in a request does not exist."""


class SlurmParseError(SlurmError):
    """Slurm answered, but with output we cannot parse (garbage, truncated, unknown layout)."""


class JournalError(AutohealError):
    """The journal could not be written or read."""


# ---- typed outcomes of job writes: callers decide on these, never on the words of a message -------------


class SlurmJobNotPending(SlurmError):
    """The request needs a PENDING job (ExcNodeList update, release) but the job is running or done."""


class SlurmJobAlreadyPending(SlurmError):
    """A requeue found the job already PENDING: it was requeued meanwhile (same outcome as ours)."""


class SlurmJobFinished(SlurmError):
    """The job is already completing or completed: nothing left to signal, requeue or update."""


class SlurmRequeueDisabled(SlurmError):
    """The job was submitted with --no-requeue (or JobRequeue=0): Slurm refuses to requeue it."""


class SlurmJobBusy(SlurmError):
    """Slurm refused for now ("Job can not be altered now, try again later"): retry after a pause."""


class SlurmNotSupported(SlurmError):
    """The chosen backend cannot do this call (e.g. a slurmrestd API version without the endpoint)."""
