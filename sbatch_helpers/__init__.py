"""Researcher side: `autoheal sbatch`, the job runner, the checkpoint API, and `autoheal guard`."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autoheal.sbatch_helpers.progress import heartbeat, report_progress, saving

__all__ = ["heartbeat", "report_progress", "saving"]


def __getattr__(name: str) -> Any:
    """``heartbeat``, ``report_progress`` and ``saving``, imported on first use (PEP 562): importing any
    module of this package (``autoheal-warm``, which a restarted rank starts through, the runner) does not
    pay for ``progress`` and its imports (120 ms at load 5 on the lab VM)."""
    if name in __all__:
        from autoheal.sbatch_helpers import progress

        return getattr(progress, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
