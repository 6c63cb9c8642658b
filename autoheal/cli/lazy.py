"""A click group that imports each subcommand only when it is invoked (or listed for --help).

Compute-node hooks and ``autoheal check`` must start fast; importing every part (and kubernetes)
for each invocation would cost hundreds of milliseconds.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Dict, List, Optional

import click


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


class LazyGroup(click.Group):
    """``lazy_commands`` maps a command name to ``"package.module:attribute"``."""

    def __init__(self, *args: Any, lazy_commands: Optional[Dict[str, str]] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})

    def list_commands(self, ctx: click.Context) -> List[str]:
        lazy = [name for name, target in self.lazy_commands.items() if _module_exists(target.split(":")[0])]
        return sorted(set(super().list_commands(ctx)) | set(lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        if cmd_name in self.lazy_commands:
            module_name, attr = self.lazy_commands[cmd_name].split(":")
            if not _module_exists(module_name):
                return None
            module = importlib.import_module(module_name)
            cmd = getattr(module, attr)
            if not isinstance(cmd, click.Command):
                raise click.ClickException(f"{module_name}:{attr} is not a click command")
            return cmd
        return super().get_command(ctx, cmd_name)
