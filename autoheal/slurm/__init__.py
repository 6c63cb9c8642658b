"""The Slurm adapter: one interface (``SlurmAdapter``), three backends (cli, rest, pyslurm)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Any, List, Optional, Tuple

    from autoheal.config import Config
    from autoheal.config.core_sections import SlurmSection
    from autoheal.slurm.base import SlurmAdapter
    from autoheal.slurm.model import Job, Node, SlurmVersion, parse_state

__all__ = ["Job", "Node", "SlurmAdapter", "SlurmVersion", "backend_notes", "get_adapter", "parse_state"]
_FROM_MODEL = ("Job", "Node", "SlurmVersion", "parse_state")


def __getattr__(name: str) -> Any:
    """The package's re-exports, imported on first use (PEP 562): a module of the package used alone (the
    epilog's ``hostlist`` for the job's node list) must not bring the adapter and the Slurm model with it,
    5 ms of every epilog's start (issue 24 section 6)."""
    if name == "SlurmAdapter":
        from autoheal.slurm.base import SlurmAdapter

        return SlurmAdapter
    if name in _FROM_MODEL:
        from autoheal.slurm import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def backend_notes(section: SlurmSection, scontrol_found: Optional[bool] = None) -> List[Tuple[str, str]]:
    """What the configured backend cannot do by itself, as (level, text) lines for `config validate`.

    Static (no call to Slurm): level "note" when another route covers it, "error" when a part that
    needs the call would fail. ``scontrol_found``: whether scontrol is installed (looked up if None)."""
    if scontrol_found is None:
        from autoheal.slurm.binaries import maybe_binary

        scontrol_found = bool(maybe_binary("scontrol", section.bin_dir))
    notes = []
    if section.backend == "rest":
        if scontrol_found:
            notes.append(("note", "slurm.backend = 'rest': requeue, reboot, a job's batch script (its --signal), "
                                  "its GPU indices, job accounting (sacct) and `scontrol show config` go through "
                                  "scontrol/sacct (slurmrestd has no call for them); on Slurm 22.05/23.02 (API "
                                  "v0.0.38/39) every write does"))
        else:
            notes.append(("error", "slurm.backend = 'rest' and scontrol is not installed here: job requeues "
                                   "(the runner, xid-watch), reading a job's own --signal, the reboot rung and "
                                   "`autoheal doctor` cannot work; install slurm-client or set slurm.bin_dir"))
    elif section.backend == "pyslurm":
        notes.append(("note", "slurm.backend = 'pyslurm': the reboot rung is not available (pyslurm has no "
                              "reboot call); the ladder goes from reset to replace"))
        notes.append(("note", "slurm.backend = 'pyslurm': the runner reads no job accounting (sacct) to name "
                              "a restart's cause; it goes by its own job comment and the node reasons"))
    return notes


def get_adapter(config: Optional[Config] = None, timeout: Optional[float] = None,
                retries: Optional[int] = None) -> SlurmAdapter:
    """The backend the config asks for (``[slurm] backend``); imports only what that backend needs.
    ``timeout``/``retries`` replace the section's (the node hooks' own, shorter limits)."""
    if config is None:
        from autoheal.config import load_config

        config = load_config()
    section = config.slurm
    if timeout is not None or retries is not None:
        from dataclasses import replace

        section = replace(section, timeout=section.timeout if timeout is None else timeout,
                          retries=section.retries if retries is None else retries)
    if section.backend == "rest":
        from autoheal.slurm.rest_backend import RestSlurm

        return RestSlurm.from_config(section)
    if section.backend == "pyslurm":
        from autoheal.slurm.pyslurm_backend import PyslurmSlurm

        return PyslurmSlurm.from_config(section)
    from autoheal.slurm.cli_backend import CliSlurm

    return CliSlurm.from_config(section)
