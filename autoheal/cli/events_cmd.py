"""``autoheal events``: read the remediation journal."""

from __future__ import annotations

import re
import sys
import time
from typing import Optional

import click

from autoheal.cliutil import config_option, handle_errors, json_option, print_json
from autoheal.errors import EXIT_OK, EXIT_PROBLEM, ConfigError


def parse_since(text: str, now: float) -> float:
    """``10m``, ``2h``, ``1d``, ``90s`` ago, or an epoch number, or an ISO date/time."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if m:
        return now - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if value == value and abs(value) != float("inf"):
            return value
    from datetime import datetime

    try:
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):
        raise ConfigError(f"--since: {text!r} is not a duration (10m, 2h, 1d), an epoch time or an ISO date") from None


def _stamp(t: float) -> str:
    """Local time of a record; a time no calendar can show (a damaged line) is printed as it is."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return f"{t:.0f}"


def _clean(text: str) -> str:
    """One printable line: a record written by something else must not move the cursor or recolour the
    terminal (escape sequences) or fake extra records (newlines)."""
    return "".join(ch if ch.isprintable() else " " for ch in text)


@click.command()
@click.option("--node", help="Only records about this node.")
@click.option("--job", help="Only records naming this job id.")
@click.option("--since", help="Only records newer than this: 10m, 2h, 1d, an epoch time or an ISO date.")
@click.option("--journal", "journal_path", type=click.Path(dir_okay=False), help="Journal file (default from config).")
@config_option
@json_option
@handle_errors
def events(node: Optional[str], job: Optional[str], since: Optional[str], journal_path: Optional[str],
           config_path: Optional[str], as_json: bool) -> None:
    """What autoheal saw and did: detections, drains, resumes, requeues, notifications.

    Lines that are not records (torn by a crash, garbage, wrong field types) are skipped and counted:
    a warning on stderr and "skipped" in --json. Exit 0, or 1 when the journal has lines but not one
    of them is a record.
    """
    from autoheal.journal import Journal

    if journal_path:
        journal = Journal(journal_path)
    else:
        from autoheal.config import load_config

        journal = Journal.from_config(load_config(config_path))
    cutoff = parse_since(since, time.time()) if since else None
    result = journal.read_all(node=node, job=job, since=cutoff)
    unreadable = bool(result.skipped) and not result.readable
    if result.skipped:
        click.echo(f"autoheal: warning: {_clean(str(journal.path))}: skipped {result.skipped} line(s) that are "
                   f"not journal records (first: line {result.first_skipped})", err=True)
    if as_json:
        print_json({"events": [r.to_dict() for r in result.records], "skipped": result.skipped,
                    "journal": str(journal.path)})
    elif not result.records:
        click.echo(f"no events in {_clean(str(journal.path))}"
                   + (" matching the filters" if (node or job or since) else ""))
    else:
        for r in result.records:
            jobs = f" jobs={','.join(r.job_ids)}" if r.job_ids else ""
            check = f" [{r.check}]" if r.check else ""
            outcome = f" -> {r.outcome}" if r.outcome else ""
            click.echo(_clean(f"{_stamp(r.time)} {r.node or r.host:<10} {r.event}{check}{jobs} "
                              f"{r.message}{outcome}".rstrip()))
    sys.exit(EXIT_PROBLEM if unreadable else EXIT_OK)
