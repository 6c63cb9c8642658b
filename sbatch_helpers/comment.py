"""The runner's record in the job comment, and which nodes a requeued job is kept away from.

Shared by the runner (inside the job) and ``autoheal guard`` (outside it): both read and write the
same ``autoheal-runner key=value ... | user comment`` text, so it is defined once, here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Mapping, Sequence

from autoheal.reasons import COMMENT_SEPARATOR, MAX_COMMENT_LEN, sanitize
from autoheal.reasons import RUNNER_MARKER as MARKER

if TYPE_CHECKING:
    from autoheal.slurm.model import Node

__all__ = ["COMMENT_FIELDS", "CommentState", "Exclusions", "is_runner_comment", "merged_exclusions",
           "node_unhealthy", "plan_exclusions", "split_nodes"]


def is_runner_comment(comment: str) -> bool:
    """The job runs under ``autoheal sbatch`` (its comment starts with the runner marker)."""
    return (comment or "").strip().startswith(MARKER)


def split_nodes(text: str) -> List[str]:
    """``a,b`` -> [a, b]; empty parts dropped."""
    return [n for n in (text or "").split(",") if n]


_FIELD = re.compile(r"\b(\w+)=(\S*)")  # \b: a long word without "=" is scanned once, not from every letter
#: Keys after the marker, in the order they are written (``restarts`` comes first, as a number).
COMMENT_FIELDS = ("last", "step", "resumed", "nodes", "state", "excl", "guard", "spares", "swaps")
_WORD = re.compile(r"[\s|]+")


@dataclass
class CommentState:
    """What the runner keeps in the job comment, after the ``autoheal-runner`` marker.

    ``restarts``/``last``/``step``: the latest restart (its number, cause label and the checkpoint step it
    resumes from); ``resumed``: the step the current run started from (``none``); ``nodes``: the current
    run's nodes; ``state``: running, requeueing (intent written before the hold: the guard may finish
    it), requeued, requeue-failed, completed, failed, cancelled, max-restarts, no-progress; ``excl``: the
    nodes autoheal added to the job's ExcNodeList (the rest of the list is the user's own); ``guard``:
    what ``autoheal guard`` last did for the job (``released``, ``pruned``). Hot-spare jobs
    (``--spare-nodes``) add ``spares`` (the idle spares, ``none`` once all are in use; the key marks such
    a job for xid-watch) and ``swaps`` (how many swaps this run made, the last as ``gpu2>gpu3``); their
    ``nodes`` are the active nodes.
    """

    restarts: int = 0
    last: str = ""
    step: str = ""
    resumed: str = ""
    nodes: str = ""
    state: str = ""
    excl: str = ""
    guard: str = ""
    spares: str = ""
    swaps: str = ""
    user_comment: str = ""

    @classmethod
    def parse(cls, comment: str) -> CommentState:
        text = comment or ""
        head, sep, user = text.partition(COMMENT_SEPARATOR.strip())
        st = cls(user_comment=user.strip() if sep else "")
        if not head.strip().startswith(MARKER):
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


def merged_exclusions(user_excluded: Sequence[str], failed: Sequence[str]) -> List[str]:
    """The user's own exclusions first, then the failed nodes; no duplicates."""
    out: List[str] = []
    for name in list(user_excluded) + list(failed):
        if name and name not in out:
            out.append(name)
    return out


def node_unhealthy(node: Node) -> bool:
    """A node a requeued job should stay away from: drained, down or not responding."""
    return bool(node.drain or node.down or not node.responding)


@dataclass(frozen=True)
class Exclusions:
    """The job's ExcNodeList split by owner: the user's own list is never changed."""

    user: List[str]
    ours: List[str]

    @property
    def full(self) -> List[str]:
        return merged_exclusions(self.user, self.ours)


def plan_exclusions(current: Sequence[str], ours_before: Sequence[str], failed: Sequence[str],
                    node_states: Mapping[str, Node]) -> Exclusions:
    """Exclusions for the next run: the user's own kept; ours pruned to nodes still unhealthy, plus
    ``failed``. A node we excluded earlier that is healthy again (resumed, repaired) is dropped, so
    the list never grows without bound and never keeps a job off a fleet that has recovered. A node
    whose state is unknown (not in ``node_states``) is kept: pruning must not guess."""
    mine = set(ours_before)
    user = [n for n in current if n and n not in mine]
    kept = [n for n in ours_before if n and (n not in node_states or node_unhealthy(node_states[n]))]
    return Exclusions(user=user, ours=merged_exclusions(kept, [n for n in failed if n not in user]))
