"""Researcher side: `autoheal sbatch`, the job runner, the checkpoint API, and `autoheal guard`."""

from autoheal.sbatch_helpers.progress import report_progress

__all__ = ["report_progress"]
