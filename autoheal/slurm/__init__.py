"""The Slurm adapter: one interface (``SlurmAdapter``), three backends (cli, rest, pyslurm)."""

from __future__ import annotations

from autoheal.slurm.base import SlurmAdapter
from autoheal.slurm.model import Job, Node, SlurmVersion, parse_state

__all__ = ["SlurmAdapter", "Job", "Node", "SlurmVersion", "parse_state", "get_adapter"]


def get_adapter(config=None) -> SlurmAdapter:
    """The backend the config asks for (``[slurm] backend``); imports only what that backend needs."""
    if config is None:
        from autoheal.config import load_config

        config = load_config()
    section = config.slurm
    if section.backend == "rest":
        from autoheal.slurm.rest_backend import RestSlurm

        return RestSlurm.from_config(section)
    if section.backend == "pyslurm":
        from autoheal.slurm.pyslurm_backend import PyslurmSlurm

        return PyslurmSlurm.from_config(section)
    from autoheal.slurm.cli_backend import CliSlurm

    return CliSlurm.from_config(section)
