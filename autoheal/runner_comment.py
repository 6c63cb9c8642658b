"""The runner's record in the job comment of an ``autoheal sbatch`` job, as one typed value.

``autoheal-runner key=value ... | user comment``: the runner and ``autoheal guard`` (sbatch_helpers) write
and read it, the hooks read it (is the runner up? is it a hot-spare job?). One model and one parser, here
in the core beside the marker (``autoheal.reasons.RUNNER_MARKER``), so no part parses the text its own way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from autoheal.reasons import COMMENT_SEPARATOR, MAX_COMMENT_LEN, sanitize
from autoheal.reasons import RUNNER_MARKER as MARKER
from autoheal.strenum import StrEnum

__all__ = ["COMMENT_FIELDS", "CommentState", "RunnerState", "is_runner_comment"]


class RunnerState(StrEnum):
    """``state=`` in the comment: where the runner is with the job (``CommentState.state``'s words)."""

    RUNNING = "running"
    REQUEUEING = "requeueing"  # the intent, written before the hold: the guard may finish it
    REQUEUED = "requeued"
    REQUEUE_FAILED = "requeue-failed"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    MAX_RESTARTS = "max-restarts"
    NO_PROGRESS = "no-progress"


def is_runner_comment(comment: str) -> bool:
    """The job runs under ``autoheal sbatch`` (its comment starts with the runner marker)."""
    return (comment or "").strip().startswith(MARKER)


_FIELD = re.compile(r"\b(\w+)=(\S*)")  # \b: a long word without "=" is scanned once, not from every letter
#: Keys after the marker, in the order they are written (``restarts`` comes first, as a number).
COMMENT_FIELDS = ("last", "step", "resumed", "reached", "nodes", "state", "excl", "guard", "spares", "swaps")
_WORD = re.compile(r"[\s|]+")


@dataclass
class CommentState:
    """What the runner keeps in the job comment, after the ``autoheal-runner`` marker.

    ``restarts``/``last``/``step``: the latest restart (its number, cause label and the checkpoint step it
    resumes from); ``resumed``: the step the current run started from (``none``); ``reached``: written at a
    requeue by the runner, the furthest step the ranks' heartbeats reached since that resume (``none``: no
    record changed; absent: not known, e.g. a requeue the runner did not live to record), which lets the
    next run tell a job hit by two faults within one checkpoint interval from one that cannot get past
    its resume point; ``nodes``: the current run's nodes; ``state``: running, requeueing (intent written
    before the hold: the guard may finish it), requeued, requeue-failed, completed, failed, cancelled,
    max-restarts, no-progress; ``excl``: the nodes autoheal added to the job's ExcNodeList (the rest of
    the list is the user's own); ``guard``: what ``autoheal guard`` last did for the job (``released``,
    ``pruned``). Hot-spare jobs (``--spare-nodes``) add ``spares`` (the idle spares, ``none`` once all
    are in use; the key marks such a job for xid-watch) and ``swaps`` (how many swaps this run made, the
    last as ``gpu2>gpu3``); their ``nodes`` are the active nodes.
    """

    restarts: int = 0
    last: str = ""
    step: str = ""
    resumed: str = ""
    reached: str = ""
    nodes: str = ""
    state: str = ""
    excl: str = ""
    guard: str = ""
    spares: str = ""
    swaps: str = ""
    user_comment: str = ""

    @property
    def runner_state(self) -> Optional[RunnerState]:
        """``state`` as the enum; None when absent or a word this release does not know."""
        try:
            return RunnerState(self.state) if self.state else None
        except ValueError:
            return None

    @property
    def hot_spare(self) -> bool:
        """A hot-spare job (``autoheal sbatch --spare-nodes``): the comment has ``spares=``."""
        return bool(self.spares)

    @classmethod
    def parse(cls, comment: str, marker: str = MARKER) -> CommentState:
        """The state in a job comment; all empty (the text as the user's) when it is no runner comment.
        ``marker``: the hooks' ``hooks.runner_comment`` (a site may have changed it)."""
        text = comment or ""
        head, sep, user = text.partition(COMMENT_SEPARATOR.strip())
        st = cls(user_comment=user.strip() if sep else "")
        if not (marker and head.strip().startswith(marker)):
            return cls(user_comment=text.strip())
        for key, value in _FIELD.findall(head):
            if key == "restarts":
                st.restarts = int(value) if value.isdigit() else 0
            elif key in COMMENT_FIELDS:
                setattr(st, key, value)
        return st

    def render(self) -> str:
        parts = [MARKER]
        if self.restarts:
            parts.append(f"restarts={self.restarts}")
        for key in COMMENT_FIELDS:
            value = getattr(self, key)
            if value not in ("", None):
                parts.append(f"{key}={_WORD.sub('_', str(value))}")
        text = " ".join(parts)
        if self.user_comment:
            text += COMMENT_SEPARATOR + self.user_comment
        return sanitize(text, MAX_COMMENT_LEN)
