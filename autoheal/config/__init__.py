"""The autoheal config: one TOML file, typed sections, validated with errors that name the key.

Where it comes from, first match wins: ``--config`` / an explicit path, ``$AUTOHEAL_CONFIG``,
``/etc/autoheal/autoheal.toml``. A missing default file means "all defaults"; a missing file that was
named explicitly is an error.
"""

from __future__ import annotations

import os
import stat
import sys

from autoheal.config.core_sections import JournalSection, NotifySection, SlurmSection
from autoheal.config.hooks_section import HooksSection
from autoheal.config.sbatch_section import SbatchSection
from autoheal.config.schema import describe, from_mapping, setting, to_mapping
from autoheal.config.sync_section import SyncSection
from autoheal.errors import ConfigError
from autoheal.records import record

# typing, pathlib and tomllib are imported only where used: a hook that finds a valid snapshot
# (autoheal.config.snapshot) parses no TOML, and none of them is on its path (issue 24 section 6)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Optional, Tuple, Union

DEFAULT_PATH = "/etc/autoheal/autoheal.toml"
ENV_VAR = "AUTOHEAL_CONFIG"

__all__ = [
    "DEFAULT_PATH",
    "ENV_VAR",
    "Config",
    "ConfigError",
    "config_path",
    "describe",
    "load_config",
    "parse_config",
    "to_mapping",
]


@record
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


def config_path(explicit: Union[str, Path, None] = None) -> Tuple[Path, bool]:
    """Which file to read, and whether it was asked for explicitly (then it must exist)."""
    from pathlib import Path

    path, required = _config_path(explicit)
    return Path(path), required


def _config_path(explicit: Union[str, Path, None]) -> Tuple[str, bool]:
    if explicit:
        return os.fspath(explicit), True
    env = os.environ.get(ENV_VAR)
    if env:
        return env, True
    return DEFAULT_PATH, False


def parse_config(text: str, source: str = "<string>") -> Config:
    """Parse and validate TOML text into a Config.

    Every failure is a one-line ``ConfigError`` naming ``source`` and what is wrong: this runs inside
    every Slurm prolog, epilog and health check, where a traceback would fail the hook and drain the
    node for the wrong reason.
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.9/3.10 compute nodes
        import tomli as tomllib

    try:
        data = tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError is a ValueError; nesting hits the stack
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ConfigError(_one_line(f"{source}: not valid TOML: {why}")) from None
    if "source" in data:
        raise ConfigError(_one_line(f"{source}: unknown key 'source'"))
    try:
        cfg: Config = from_mapping(Config, data)
    except ConfigError as exc:
        raise ConfigError(_one_line(f"{source}: {exc}")) from None
    except Exception as exc:  # a validator bug: still one line naming the file, never a traceback
        raise ConfigError(_one_line(f"{source}: cannot validate ({type(exc).__name__}: {exc})")) from exc
    cfg.source = source
    return cfg


#: A config is a few kilobytes; anything this large is not one (and would cost every hook).
MAX_BYTES = 1 << 20


def load_config(explicit: Union[str, Path, None] = None, *, secrets: bool = True, snapshot: bool = False) -> Config:
    """Load the effective config (see module docstring for the search order).

    ``secrets``: also read ``notify.secrets_file`` (``autoheal.config.secrets``) when this process may;
    the job runner passes False: it never needs a site secret. ``snapshot``: use a trusted snapshot of
    this very file when there is one, and leave one after a parse (``autoheal.config.snapshot``: the
    hooks, which run on every node every few minutes)."""
    from autoheal.config.secrets import merge_secrets

    path, required = _config_path(explicit)
    cfg = None
    if snapshot:
        from autoheal.config import snapshot as snap

        cfg = snap.load(path)
    if cfg is None:
        try:
            text, data = _read_config(path)
        except FileNotFoundError:
            if required:
                raise ConfigError(_one_line(f"{path}: config file not found")) from None
            cfg = Config()
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(_one_line(f"{path}: cannot read config: {exc}")) from None
        else:
            cfg = parse_config(text, path)
            if snapshot:
                snap.write(cfg, data)
    if secrets:
        merge_secrets(cfg, snapshot=snapshot)
    return cfg


def _read_regular_file(path: Union[str, Path]) -> str:
    """The file's text; a FIFO or device (which could block the hook forever), a directory or a file over
    MAX_BYTES is refused (OSError/ValueError)."""
    return _read_config(path)[0]


def _read_config(path: Union[str, Path]) -> Tuple[str, bytes]:
    """``_read_regular_file``'s text and the very bytes it was decoded from (a snapshot's key is their
    length and checksum: the key of what was parsed, not of what a later ``stat`` says)."""
    data = _read_config_bytes(path)
    return data.decode("utf-8-sig"), data  # a BOM from a Windows editor is not an error in the file


def _read_config_bytes(path: Union[str, Path]) -> bytes:
    """The config file's bytes; a FIFO or device (which could block the hook forever), a directory or a
    file over MAX_BYTES is refused (OSError/ValueError). The ``open`` also makes an NFS client revalidate
    the file (close-to-open), which a path ``stat`` served from its attribute cache does not."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_BYTES:
            raise ValueError(f"{st.st_size} bytes; a config is at most {MAX_BYTES}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise ValueError(f"more than {MAX_BYTES} bytes; not a config file")
    return data


def _one_line(text: str, limit: int = 1000) -> str:
    """Escape control characters (a file name or value may hold a newline) and bound the length."""
    out = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
    return out if len(out) <= limit else out[: limit - 3] + "..."
