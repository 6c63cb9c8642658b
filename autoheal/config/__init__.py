"""The autoheal config: one TOML file, typed sections, validated with errors that name the key.

Where it comes from, first match wins: ``--config`` / an explicit path, ``$AUTOHEAL_CONFIG``,
``/etc/autoheal/autoheal.toml``. A missing default file means "all defaults"; a missing file that was
named explicitly is an error.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from autoheal.config.core_sections import JournalSection, NotifySection, SlurmSection
from autoheal.config.hooks_section import HooksSection
from autoheal.config.sbatch_section import SbatchSection
from autoheal.config.sync_section import SyncSection
from autoheal.config.schema import describe, from_mapping, setting, to_mapping
from autoheal.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.9/3.10 compute nodes
    import tomli as tomllib

DEFAULT_PATH = "/etc/autoheal/autoheal.toml"
ENV_VAR = "AUTOHEAL_CONFIG"

__all__ = ["Config", "ConfigError", "load_config", "parse_config", "config_path", "to_mapping", "describe",
           "DEFAULT_PATH", "ENV_VAR"]


@dataclass
class Config:
    """The whole configuration; each table of the TOML file is one section."""

    slurm: SlurmSection = setting(default_factory=SlurmSection, doc="Slurm access.")
    journal: JournalSection = setting(default_factory=JournalSection, doc="Remediation journal.")
    notify: NotifySection = setting(default_factory=NotifySection, doc="Webhook notifications.")
    hooks: HooksSection = setting(default_factory=HooksSection, doc="Node-side checks and hooks.")
    sbatch: SbatchSection = setting(default_factory=SbatchSection, doc="autoheal sbatch defaults.")
    sync: SyncSection = setting(default_factory=SyncSection, doc="Slurm <-> Kubernetes sync and remediation.")
    source: Optional[str] = setting(None, doc="Path the config was read from (set by the loader; "
                                    "not a key of the file).")


def config_path(explicit: Union[str, Path, None] = None) -> tuple[Path, bool]:
    """Which file to read, and whether it was asked for explicitly (then it must exist)."""
    if explicit:
        return Path(explicit), True
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env), True
    return Path(DEFAULT_PATH), False


def parse_config(text: str, source: str = "<string>") -> Config:
    """Parse and validate TOML text into a Config (errors are ConfigError, one line, naming ``source``)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    if "source" in data:
        raise ConfigError(f"{source}: unknown key 'source'")
    try:
        cfg = from_mapping(Config, data)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    cfg.source = source
    return cfg


def load_config(explicit: Union[str, Path, None] = None) -> Config:
    """Load the effective config (see module docstring for the search order)."""
    path, required = config_path(explicit)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if required:
            raise ConfigError(f"{path}: config file not found") from None
        return Config()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    return parse_config(text, str(path))
