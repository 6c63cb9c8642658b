"""Run in a fresh interpreter by tests/unit/test_memtier.py: one epilog's memory-tier step for job 77 (ended,
not requeued) on node n1, through the epilog's real context type and a real Slurm adapter type, then print
whether the tier's cleanup module and its base were imported (``True False`` ...). A separate module, not a
``-c`` string, so that mypy checks it against the product's types."""

from __future__ import annotations

import sys

from autoheal.hooks import jobhook
from autoheal.slurm.model import Job
from autoheal_lab.testing.hooks import hook_context
from autoheal_lab.testing.slurm import MemorySlurm


def main(state_dir: str) -> None:
    slurm = MemorySlurm(jobs=[Job("77", "COMPLETED", ("n1",))])
    ctx = hook_context(node="n1", source="epilog", state_dir=state_dir, slurm=slurm)
    jobhook._memory_tier(ctx, "77")
    print("autoheal.memtier_files" in sys.modules, "autoheal.memtier_base" in sys.modules)


if __name__ == "__main__":
    main(sys.argv[1])
