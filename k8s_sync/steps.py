"""The sync's reconcile steps, declared in one list (as Slinky's ``syncSteps := []SyncStep{...}``).

Each step reads the pass's ``Context`` and returns a ``StepResult`` (its actions and problems); none
registers itself on import and none writes into the context, so this list is the whole of what a pass can
do. ``sync.enabled_steps`` picks from it by name, in its own order; the config's list of known names
(``autoheal.config.sync_section.STEPS``: the core cannot import this part) is checked against this one
by a unit test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Tuple

from autoheal.k8s_sync import plan as P
from autoheal.k8s_sync import remediate_step

if TYPE_CHECKING:
    from autoheal.config.sync_section import SyncSection


@dataclass(frozen=True)
class SyncStep:
    name: str
    run: Callable[[P.Context], P.StepResult]
    #: only mirrors Slurm into Kubernetes: re-run after the pass's own Slurm writes (one resync sooner)
    mirror: bool = False
    #: its runs of object patches may go through the write pool (``writepool``). Remediation's writes stay
    #: one at a time: few per pass, and its flows order writes across objects (cordon, evict, replace).
    pooled: bool = False


SYNC_STEPS: List[SyncStep] = [
    SyncStep("slurm-to-pods", P.slurm_to_pods, mirror=True, pooled=True),
    SyncStep("health-to-nodes", P.health_to_nodes, mirror=True, pooled=True),
    SyncStep("nodes-to-slurm", P.nodes_to_slurm, pooled=True),
    SyncStep(remediate_step.STEP, remediate_step.remediate),
]

_BY_NAME: Dict[str, SyncStep] = {step.name: step for step in SYNC_STEPS}


def named(name: str) -> SyncStep:
    """The step called ``name`` (KeyError: there is none)."""
    return _BY_NAME[name]


def enabled(names: Iterable[str]) -> List[SyncStep]:
    """The steps ``names`` (``sync.enabled_steps``) asks for, in its order; unknown names are skipped
    (config validation refuses them)."""
    return [_BY_NAME[name] for name in names if name in _BY_NAME]


def plan(snap: P.Snapshot, cfg: SyncSection) -> Tuple[Dict[str, List[P.Action]], List[str]]:
    """All enabled steps' actions for one snapshot (step name -> actions) and the mapping's and the
    steps' problems, without writing anything (what a pass would do; the engine applies step by step)."""
    ctx = P.make_context(snap, cfg)
    out: Dict[str, List[P.Action]] = {}
    problems = list(ctx.mapping_problems)
    for step in enabled(cfg.enabled_steps):
        result = step.run(ctx)
        out[step.name] = result.actions
        problems += result.problems
    return out, problems
