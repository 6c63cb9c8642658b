"""``autoheal config show|validate``."""

from __future__ import annotations

import sys
from typing import Any, Optional

import click

from autoheal.cliutil import config_option, handle_errors, json_option, print_json
from autoheal.errors import EXIT_OK, EXIT_USAGE


@click.group()
def config() -> None:
    """Show or validate the autoheal configuration (TOML)."""


@config.command("show")
@config_option
@json_option
@click.option("--docs", is_flag=True, help="List every setting with its default and what it does.")
@handle_errors
def show(config_path: Optional[str], as_json: bool, docs: bool) -> None:
    """Print the effective config (file values over defaults)."""
    from autoheal.config import Config, describe, load_config, to_mapping

    if docs:
        rows = describe(Config)
        if as_json:
            print_json([{"key": k, "doc": d, "default": v} for k, v, d in [(r[0], r[2], r[1]) for r in rows]])
        else:
            for key, doc, default in rows:
                click.echo(f"{key} = {default!r}\n    {doc}")
        return
    cfg = load_config(config_path, secrets=False)  # what notify.secrets_file holds is never printed
    data = to_mapping(cfg)
    if as_json:
        print_json(data)
        return
    click.echo(f"# effective config (source: {cfg.source or 'built-in defaults'})")
    click.echo(f"# not shown: the secrets in notify.secrets_file ({cfg.notify.secrets_file})")
    for section, values in data.items():
        if not isinstance(values, dict):
            continue
        click.echo(f"[{section}]")
        for key, value in values.items():
            click.echo(f"{key} = {_toml(value)}")
        click.echo("")


def _toml(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return '""  # unset'
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


@config.command("validate")
@click.argument("file", type=click.Path(dir_okay=False))
@json_option
@handle_errors
def validate(file: str, as_json: bool) -> None:
    """Check FILE: exit 0 when valid, 2 with a one-line reason when not.

    Also says what the chosen Slurm backend cannot do by itself (e.g. slurmrestd has no requeue call:
    autoheal then uses scontrol for it); a part that could not work at all is an error (exit 2)."""
    from autoheal.config import load_config
    from autoheal.slurm import backend_notes

    cfg = load_config(file)
    notes = backend_notes(cfg.slurm) + [("warning", text) for text in cfg.sync.deprecations()]
    ok = not any(level == "error" for level, _ in notes)
    if as_json:
        print_json({"ok": ok, "file": file, "notes": [{"level": lv, "text": t} for lv, t in notes]})
    else:
        for level, text in notes:
            click.echo(f"{file}: {level}: {text}", err=level == "error")
        if ok:
            click.echo(f"{file}: ok")
    sys.exit(EXIT_OK if ok else EXIT_USAGE)
