"""Shared CLI plumbing for the CLI layer and the parts' commands: --json/--config options, printing,
and the error envelope.

Exit codes: 0 ok, 1 problem found, 2 usage/config error or could not check.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, cast

import click

from autoheal.errors import EXIT_USAGE, AutohealError

if TYPE_CHECKING:
    from autoheal.config import Config

F = TypeVar("F", bound=Callable[..., Any])


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(fn)


def config_option(fn: F) -> F:
    return click.option("--config", "config_path", envvar="AUTOHEAL_CONFIG", type=click.Path(dir_okay=False),
                        help="autoheal config file [env AUTOHEAL_CONFIG; default /etc/autoheal/autoheal.toml].")(fn)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def handle_errors(fn: F) -> F:
    """Turn our typed errors into one line on stderr (or a JSON envelope) and their exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AutohealError as exc:
            if kwargs.get("as_json"):
                print_json({"ok": False, "error": str(exc), "type": type(exc).__name__})
            click.echo(f"autoheal: error: {exc}", err=True)
            sys.exit(getattr(exc, "exit_code", EXIT_USAGE))

    return cast(F, wrapper)


def load_cfg(config_path: Optional[str]) -> Config:
    """Load the config or exit 2 with the one-line reason."""
    from autoheal.config import load_config

    return load_config(config_path)
