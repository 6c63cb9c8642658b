"""A click group that imports each subcommand only when it is invoked (or listed for --help).

Compute-node hooks and ``autoheal check`` must start fast; importing every part (and kubernetes)
for each invocation would cost hundreds of milliseconds.

Other distributions add subcommands through the ``autoheal.commands`` entry-point group (the lab,
``slurm-autoheal-lab``, adds ``autoheal lab``). Entry points are read only for a command that is not
built in, or to list the commands for --help: a built-in command never scans them.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any, Dict, List, Optional

import click

#: The entry-point group through which other distributions add ``autoheal`` subcommands.
PLUGIN_GROUP = "autoheal.commands"


def plugin_commands(group: str = PLUGIN_GROUP) -> Dict[str, str]:
    """Installed subcommands of other distributions: name -> ``"module:attribute"``."""
    from importlib import metadata

    if sys.version_info >= (3, 10):
        selected = metadata.entry_points(group=group)
    else:  # 3.9: a dict of groups
        selected = metadata.entry_points().get(group, [])
    return {ep.name: ep.value for ep in selected}


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _load(target: str) -> click.Command:
    module_name, attr = target.split(":")
    cmd = getattr(importlib.import_module(module_name), attr)
    if not isinstance(cmd, click.Command):
        raise click.ClickException(f"{module_name}:{attr} is not a click command")
    return cmd


class LazyGroup(click.Group):
    """``lazy_commands`` maps a built-in command name to ``"package.module:attribute"``;
    ``optional_commands`` maps the name of a command another distribution provides (through
    ``PLUGIN_GROUP``) to that distribution, so that asking for it without it installed is a usage
    error (exit 2) that names what to install."""

    def __init__(self, *args: Any, lazy_commands: Optional[Dict[str, str]] = None,
                 optional_commands: Optional[Dict[str, str]] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})
        self.optional_commands = dict(optional_commands or {})

    def list_commands(self, ctx: click.Context) -> List[str]:
        lazy = [name for name, target in self.lazy_commands.items() if _module_exists(target.split(":")[0])]
        return sorted(set(super().list_commands(ctx)) | set(lazy) | set(plugin_commands()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        if cmd_name in self.lazy_commands:
            target = self.lazy_commands[cmd_name]
            return _load(target) if _module_exists(target.split(":")[0]) else None
        builtin = super().get_command(ctx, cmd_name)
        if builtin is not None:
            return builtin
        return self.plugin_command(cmd_name)

    def plugin_command(self, cmd_name: str) -> Optional[click.Command]:
        """The command another distribution adds under ``cmd_name``; None when no distribution does
        (click then says "No such command"), a usage error naming the distribution to install when
        ``cmd_name`` is one of ``optional_commands``."""
        target = plugin_commands().get(cmd_name)
        if target is not None:
            try:
                return _load(target)
            except ImportError as exc:
                raise click.ClickException(f"autoheal {cmd_name}: cannot load {target} "
                                           f"(from the {PLUGIN_GROUP} entry point): {exc}") from exc
        dist = self.optional_commands.get(cmd_name)
        if dist is not None:
            raise click.UsageError(f"'autoheal {cmd_name}' needs the {dist} distribution, which is not "
                                   f"installed here: pip install {dist} (./dev setup installs it)")
        return None
