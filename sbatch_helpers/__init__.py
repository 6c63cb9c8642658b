"""Researcher side: `autoheal sbatch`, the job runner, the checkpoint API, and `autoheal guard`."""

from autoheal.sbatch_helpers.progress import heartbeat, report_progress, saving

__all__ = ["heartbeat", "report_progress", "saving"]
