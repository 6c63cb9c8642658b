"""The runner's record in the job comment, and which nodes a requeued job is kept away from.

Shared by the runner (inside the job) and ``autoheal guard`` (outside it): both read and write the
same ``autoheal-runner key=value ... | user comment`` text, modelled once in the core
(``autoheal.runner_comment``, which the hooks read too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Mapping, Sequence

from autoheal.reasons import RUNNER_MARKER as MARKER  # noqa: F401  (the marker, for this part's users)

# the model lives in the core (the hooks read it too); the runner and the guard import it from here
from autoheal.runner_comment import COMMENT_FIELDS, CommentState, RunnerState, is_runner_comment

if TYPE_CHECKING:
    from autoheal.slurm.model import Node

__all__ = ["COMMENT_FIELDS", "CommentState", "Exclusions", "RunnerState", "is_runner_comment", "merged_exclusions",
           "node_unhealthy", "plan_exclusions", "split_nodes"]


def split_nodes(text: str) -> List[str]:
    """``a,b`` -> [a, b]; empty parts dropped."""
    return [n for n in (text or "").split(",") if n]


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
