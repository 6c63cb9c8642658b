"""Hot spares inside the allocation (``autoheal sbatch --spare-nodes K``): the pure decisions.

The job is submitted with N+K nodes and ``--no-kill``. The runner runs the user's script so that its
``srun`` lines use the N *active* nodes and leave the K *spares* idle:

- the step environment describes the active nodes only (``SLURM_JOB_NODELIST``/``SLURM_NODELIST``,
  ``SLURM_JOB_NUM_NODES``/``SLURM_NNODES``, task counts scaled to N), which is what ``srun`` and the
  user's own code (rendezvous host = first node of ``SLURM_JOB_NODELIST``) read;
- a two-line ``srun`` shim first on ``PATH`` adds ``--exclude=<spares>``: Slurm has no input variable
  for a node list or an exclusion, and without it ``srun -N N`` may pick any N nodes of the allocation.

On a fault (the grace signal from xid-watch, or the step dying because a node died) :func:`judge` says
what to do: nothing (no bad node: today's path), drop bad idle spares (the step goes on), swap (the
step checkpoints and ends, the bad nodes leave the allocation with ``scontrol update JobId=..
NodeList=..``, a new step starts on the survivors plus spares), shrink (``--min-nodes``: no spare left,
the step restarts on fewer nodes), or requeue (spares used up, or the bad node is the batch host, which
cannot leave the allocation while the batch shell runs on it).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from autoheal.strenum import StrEnum

if TYPE_CHECKING:
    from autoheal.slurm.model import Node

NONE = "none"  # the comment's ``spares=`` value once every spare is in use (kept: it marks the job)
SHIM_NAME = "srun"
SPARES_FILE = "spare-nodes"


@dataclass(frozen=True)
class NodeSets:
    """Which nodes of the allocation run the user's steps, and which wait as hot spares."""

    active: Tuple[str, ...]
    spares: Tuple[str, ...]

    @property
    def all(self) -> Tuple[str, ...]:
        return self.active + self.spares


def initial_sets(nodes: Sequence[str], want_active: int, batch_host: str = "") -> NodeSets:
    """The first ``want_active`` nodes (the batch host first: it is where ``srun`` puts rank 0 anyway,
    and it cannot be swapped out) are active, the rest are spares."""
    ordered = ([batch_host] if batch_host in nodes else []) + [n for n in nodes if n != batch_host]
    n = max(1, min(want_active, len(ordered)))
    return NodeSets(tuple(ordered[:n]), tuple(ordered[n:]))


class DecisionKind(StrEnum):
    """What the runner does about a fault among a hot-spare job's nodes."""

    SWAP = "swap"  # lost active nodes replaced by idle spares, inside the allocation
    SHRINK = "shrink"  # an elastic job (--min-nodes) goes on with fewer active nodes
    DROP_SPARES = "drop-spares"  # only idle spares are bad: released, the step goes on
    REQUEUE = "requeue"  # too few spares (or the batch host lost): checkpoint and requeue
    NOTHING = "nothing"  # no node of the job is unhealthy or gone


SWAP, SHRINK, DROP_SPARES = DecisionKind.SWAP, DecisionKind.SHRINK, DecisionKind.DROP_SPARES
REQUEUE, NOTHING = DecisionKind.REQUEUE, DecisionKind.NOTHING


@dataclass(frozen=True)
class Decision:
    """What the runner does about a fault; ``after`` are the node sets once it is done."""

    kind: DecisionKind
    lost: Tuple[str, ...] = ()  # active nodes that are bad or already gone from the allocation
    drop: Tuple[str, ...] = ()  # nodes to remove from the allocation (still in it, bad)
    after: Optional[NodeSets] = None
    why: str = ""
    swapped_in: Tuple[str, ...] = field(default=())


def judge(sets: NodeSets, allocation: Iterable[str], unhealthy: Iterable[str], batch_host: str = "",
          min_active: int = 0) -> Decision:
    """Decide from the job's current allocation and the nodes Slurm calls unhealthy (drained, down, not
    responding). An active node missing from the allocation was removed by Slurm (``--no-kill`` after a
    node failure) and counts as lost. ``min_active`` (``--min-nodes``, an elastic job): with too few
    spares, go on with fewer active nodes as long as at least that many are left (SHRINK)."""
    alloc = set(allocation)
    sick = set(unhealthy)
    lost = tuple(n for n in sets.active if n not in alloc or n in sick)
    bad_spares = tuple(n for n in sets.spares if n not in alloc or n in sick)
    usable = tuple(n for n in sets.spares if n not in bad_spares)
    drop = tuple(n for n in lost + bad_spares if n in alloc)
    if not lost and not bad_spares:
        return Decision(NOTHING, why="no node of the job is unhealthy or gone")
    if batch_host and batch_host in lost + bad_spares:
        return Decision(REQUEUE, lost, drop, why=f"{batch_host} runs the batch shell and cannot leave the "
                        f"allocation")
    if not lost:
        return Decision(DROP_SPARES, (), drop, NodeSets(sets.active, usable),
                        why=f"idle spare(s) {','.join(bad_spares)} unhealthy: dropped, the step goes on")
    if len(usable) < len(lost):
        left = tuple(n for n in sets.active if n not in lost) + usable
        if min_active and len(left) >= min_active:
            return Decision(SHRINK, lost, drop, NodeSets(left, ()), swapped_in=usable,
                            why=f"{len(lost)} node(s) lost, {len(usable)} spare(s) left: elastic job goes on on "
                                f"{len(left)} node(s) (--min-nodes {min_active})")
        return Decision(REQUEUE, lost, drop, why=f"{len(lost)} node(s) lost, {len(usable)} healthy spare(s) "
                        f"left: spares used up")
    take = usable[:len(lost)]
    after = NodeSets(tuple(n for n in sets.active if n not in lost) + take, usable[len(lost):])
    return Decision(SWAP, lost, drop, after, why=f"{','.join(lost)} replaced by spare(s) {','.join(take)}",
                    swapped_in=take)


_UNIFORM = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def _scaled_per_node(value: str, nodes: int) -> Optional[str]:
    """``1(x3)`` -> ``1(x2)`` for 2 nodes; None when the value is not uniform across nodes."""
    m = _UNIFORM.fullmatch((value or "").strip())
    if not m:
        return None
    return m.group(1) if nodes == 1 else f"{m.group(1)}(x{nodes})"


def step_env(base: Mapping[str, str], sets: NodeSets, shim_dir: str = "", real_srun: str = "") -> Dict[str, str]:
    """The user's script's environment: Slurm's job variables describing the active nodes only, the
    node sets for the user (``AUTOHEAL_ACTIVE_NODES``, ``AUTOHEAL_SPARE_NODES``) and the srun shim."""
    env = dict(base)
    n = len(sets.active)
    hosts = ",".join(sets.active)
    for key in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        env[key] = hosts
    for key in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        env[key] = str(n)
    for key in ("SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE"):
        if key in env:
            scaled = _scaled_per_node(env[key], n)
            if scaled is None:
                env.pop(key)  # not uniform: better unset than wrong
            else:
                env[key] = scaled
    per_node = (env.get("SLURM_NTASKS_PER_NODE") or "").strip()
    if not per_node.isdigit():
        m = _UNIFORM.fullmatch((env.get("SLURM_TASKS_PER_NODE") or "").strip())
        per_node = m.group(1) if m else ""
    if per_node.isdigit() and ("SLURM_NTASKS" in env or "SLURM_NPROCS" in env):
        env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(int(per_node) * n)
    env["AUTOHEAL_ACTIVE_NODES"] = hosts
    env["AUTOHEAL_SPARE_NODES"] = ",".join(sets.spares)
    if shim_dir and real_srun:
        env["AUTOHEAL_REAL_SRUN"] = real_srun
        env["AUTOHEAL_SPARES_FILE"] = str(Path(shim_dir) / SPARES_FILE)
        env["PATH"] = shim_dir + os.pathsep + env.get("PATH", "")
    return env


SHIM = """#!/bin/sh
# autoheal sbatch --spare-nodes: this job's steps run on its active nodes; the idle hot spares
# (one line in $AUTOHEAL_SPARES_FILE, kept current by the job runner) are excluded.
spares=$(cat "$AUTOHEAL_SPARES_FILE" 2>/dev/null)
if [ -n "$spares" ]; then
    exec "$AUTOHEAL_REAL_SRUN" --exclude="$spares" "$@"
fi
exec "$AUTOHEAL_REAL_SRUN" "$@"
"""


def find_srun(path: str) -> str:
    """The real srun on ``path`` (the shim directory is never on it yet)."""
    return shutil.which("srun", path=path) or ""


def write_shim(shim_dir: Path, spares: Sequence[str]) -> None:
    """The srun shim and the spares file it reads (rewritten atomically on every change)."""
    shim_dir.mkdir(parents=True, exist_ok=True)
    shim = shim_dir / SHIM_NAME
    if not shim.exists():
        shim.write_text(SHIM)
        shim.chmod(0o755)
    write_spares(shim_dir, spares)


def write_spares(shim_dir: Path, spares: Sequence[str]) -> None:
    tmp = shim_dir / (SPARES_FILE + ".tmp")
    tmp.write_text(",".join(spares) + "\n")
    os.replace(tmp, shim_dir / SPARES_FILE)


def comment_spares(spares: Sequence[str]) -> str:
    """The comment's ``spares=`` value: the idle spares, or ``none`` (the key marks a hot-spare job)."""
    return ",".join(spares) or NONE


def preswap_targets(sets: NodeSets, nodes: Iterable[Node], batch_host: str = "") -> List[Tuple[str, str]]:
    """Active nodes (never the batch host) the health check drained for a pre-emptive swap, with the
    reason: ``[("gpu2", "autoheal: pre-emptive swap: row remap pending on GPU 0 of gpu2")]``."""
    from autoheal.reasons import is_preswap, strip_reason_suffix

    out = []
    for n in nodes:
        if n.name in sets.active and n.name != batch_host and (n.drain or n.down) and is_preswap(n.reason):
            out.append((n.name, strip_reason_suffix(n.reason)))
    return sorted(out, key=lambda t: sets.active.index(t[0]))


def checkpoint_taken(at_notice: str, now: str) -> bool:
    """A new checkpoint (or progress mark) since the pre-emptive drain was noticed."""
    return now not in ("", "none") and now != at_notice


def preswap_only(node: Node) -> bool:
    """Drained for a pre-emptive swap and otherwise fine: not a fault (the runner swaps it at a
    checkpoint, a fault on another node does not count it as lost)."""
    from autoheal.reasons import is_preswap

    return bool(node.drain and not node.down and node.responding and is_preswap(node.reason))
