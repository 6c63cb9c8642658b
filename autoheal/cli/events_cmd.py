"""``autoheal events``: read the remediation journal."""

from __future__ import annotations

import re
import time

import click

from autoheal.cliutil import config_option, handle_errors, json_option, print_json
from autoheal.errors import ConfigError


def parse_since(text: str, now: float) -> float:
    """``10m``, ``2h``, ``1d``, ``90s`` ago, or an epoch number, or an ISO date/time."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if m:
        return now - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    from datetime import datetime

    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ConfigError(f"--since: {text!r} is not a duration (10m, 2h, 1d), an epoch time or an ISO date") from None


@click.command()
@click.option("--node", help="Only records about this node.")
@click.option("--job", help="Only records naming this job id.")
@click.option("--since", help="Only records newer than this: 10m, 2h, 1d, an epoch time or an ISO date.")
@click.option("--journal", "journal_path", type=click.Path(dir_okay=False), help="Journal file (default from config).")
@config_option
@json_option
@handle_errors
def events(node, job, since, journal_path, config_path, as_json: bool) -> None:
    """What autoheal saw and did: detections, drains, resumes, requeues, notifications."""
    from autoheal.journal import Journal

    if journal_path:
        journal = Journal(journal_path)
    else:
        from autoheal.config import load_config

        journal = Journal.from_config(load_config(config_path))
    cutoff = parse_since(since, time.time()) if since else None
    recs = list(journal.read(node=node, job=job, since=cutoff))
    if as_json:
        print_json([r.__dict__ for r in recs])
        return
    if not recs:
        click.echo(f"no events in {journal.path}" + (" matching the filters" if (node or job or since) else ""))
        return
    for r in recs:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.time))
        jobs = f" jobs={','.join(r.job_ids)}" if r.job_ids else ""
        check = f" [{r.check}]" if r.check else ""
        outcome = f" -> {r.outcome}" if r.outcome else ""
        click.echo(f"{stamp} {r.node or r.host:<10} {r.event}{check}{jobs} {r.message}{outcome}".rstrip())
