"""``autoheal node list|drain|resume``: ownership-aware node changes for admins and demos."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import click

from autoheal.cliutil import config_option, handle_errors, json_option, print_json
from autoheal.errors import EXIT_OK, EXIT_PROBLEM

if TYPE_CHECKING:
    from autoheal.config import Config
    from autoheal.nodeops import Outcome
    from autoheal.slurm import SlurmAdapter


@click.group()
def node() -> None:
    """List nodes, or drain/resume them the way autoheal does (never touching an admin's drain)."""


def _slurm(config_path: Optional[str]) -> Tuple[Config, SlurmAdapter]:
    from autoheal.config import load_config
    from autoheal.slurm import get_adapter

    cfg = load_config(config_path)
    return cfg, get_adapter(cfg)


@node.command("list")
@click.option("--waiting", is_flag=True, help="Only the nodes waiting for a replacement (drained "
              "'autoheal: replace: ...'), with who acts and since when; exit 1 when there are any.")
@config_option
@json_option
@handle_errors
def list_nodes(waiting: bool, config_path: Optional[str], as_json: bool) -> None:
    """Every node with its state and reason; marks the drains that are autoheal's.

    \b
    A node drained 'autoheal: replace: ...' waits for a replacement: by
    autoheal sync where its remediate step runs, otherwise by a person, who
    repairs or replaces the machine, then runs `autoheal check --node N
    --clear-faults` and `autoheal node resume N`. `--waiting` lists those.
    """
    import time

    from autoheal import awaiting
    from autoheal.reasons import is_ours

    cfg, slurm = _slurm(config_path)
    nodes = slurm.list_nodes()
    who = awaiting.who_replaces(cfg)
    rows: List[Dict[str, Any]] = []
    for n in nodes:
        row: Dict[str, Any] = {"name": n.name, "state": n.state_text, "reason": n.reason, "ours": is_ours(n.reason),
               "gpus": n.gpu_count, "waiting_for": ""}
        if awaiting.awaiting_replacement(n, awaiting.replace_prefixes(cfg)):
            row.update(waiting_for=who, waiting_since=n.reason_time, next=awaiting.after_repair(n.name))
        if row["waiting_for"] or not waiting:
            rows.append(row)
    if as_json:
        print_json(rows)
    else:
        for r in rows:
            mark = "*" if r["ours"] else " "
            click.echo(f"{r['name']:<12} {r['state']:<28} {mark} {r['reason']}")
            if r["waiting_for"]:
                since = r.get("waiting_since")
                age = f" for {(time.time() - since) / 60:.0f} min" if since else ""
                click.echo(f"{'':<12} waiting{age} for a replacement by {r['waiting_for']}"
                           + (f"; {r['next']}" if r.get("next") else ""))
    if waiting:
        sys.exit(EXIT_PROBLEM if rows else EXIT_OK)


def _report(outcome: Outcome, as_json: bool, journal_cfg: Config) -> None:
    from autoheal.journal import Journal

    if outcome.changed:
        Journal.from_config(journal_cfg).record(outcome.action.split(":")[0], node=outcome.node, action=outcome.action,
                                                outcome=outcome.action, message=outcome.reason, source="cli",
                                                severity="action")
    if as_json:
        print_json(outcome.__dict__)
    else:
        verb = "would be " if outcome.dry_run else ""
        click.echo(f"{outcome.node}: {verb}{outcome.action}" + (f" ({outcome.reason})" if outcome.reason else ""))


@node.command("drain")
@click.argument("name")
@click.option("--reason", required=True, help="Why; stored as 'autoheal: admin: <reason>' (sanitised, "
              "bounded): a person's drain, never taken for a GPU fault (no GPUHealthy taint, no replacement).")
@click.option("--dry-run", is_flag=True, help="Show what would change; change nothing.")
@config_option
@json_option
@handle_errors
def drain(name: str, reason: str, dry_run: bool, config_path: Optional[str], as_json: bool) -> None:
    """Drain NAME with an autoheal reason, unless an admin already drained it (exit 1 then)."""
    from autoheal import nodeops
    from autoheal.reasons import admin_reason

    cfg, slurm = _slurm(config_path)
    outcome = nodeops.drain(slurm, name, admin_reason(reason), dry_run=dry_run)
    _report(outcome, as_json, cfg)
    sys.exit(EXIT_PROBLEM if outcome.action == nodeops.SKIPPED_FOREIGN else EXIT_OK)


@node.command("resume")
@click.argument("name")
@click.option("--dry-run", is_flag=True, help="Show what would change; change nothing.")
@config_option
@json_option
@handle_errors
def resume(name: str, dry_run: bool, config_path: Optional[str], as_json: bool) -> None:
    """Resume NAME only if autoheal drained it (an admin's drain is left alone: exit 1).

    Your resume is authoritative: the node's hooks forget the faults behind our drain and check its GPUs
    live, in full, before the next job (a GPU still bad drains the node again, with what is wrong now).
    `autoheal check --clear-faults` also forgets the recovery-ladder counts (after a repair by hand)."""
    from autoheal import nodeops

    cfg, slurm = _slurm(config_path)
    outcome = nodeops.resume(slurm, name, dry_run=dry_run)
    _report(outcome, as_json, cfg)
    sys.exit(EXIT_PROBLEM if outcome.action == nodeops.SKIPPED_NOT_OURS else EXIT_OK)


@node.command("history")
@click.argument("name")
@config_option
@json_option
@handle_errors
def history(name: str, config_path: Optional[str], as_json: bool) -> None:
    """NAME's fault history: every hardware fault (drain episode) and return to service, kept across
    reboots, resets, repairs and `autoheal check --clear-faults`; and how close it is to being a lemon
    (hooks.lemon_faults within hooks.lemon_window). Reads the node state (hooks.state_dir): run it on the
    node, or where that directory is shared.

    \b
    Examples:
      autoheal node history gpu2
      autoheal node history gpu2 --json
    """
    import time

    from autoheal.config import load_config
    from autoheal.hooks import lemon
    from autoheal.hooks.state import NodeState, expand

    cfg = load_config(config_path)
    h = cfg.hooks
    st = NodeState(expand(h.state_dir, name)).read()
    entries = lemon.history(st)
    now = time.time()
    recent = [e for e in entries if e.get("event") == "fault" and now - float(e.get("time", 0)) <= h.lemon_window]
    out = {"node": name, "history": entries, "faults_in_window": len(recent), "lemon_faults": h.lemon_faults,
           "lemon_window_seconds": h.lemon_window,
           "lemon": lemon.is_lemon((st.get("drain") or {}).get("reason"))}
    if as_json:
        print_json(out)
        return
    if not entries:
        click.echo(f"{name}: no fault on record")
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(e.get("time", 0))))
        if e.get("event") == "fault":
            click.echo(f"{when}  fault     {e.get('reason', '')}")
        else:
            click.echo(f"{when}  returned  {e.get('how', '')}")
    click.echo(f"{name}: {len(recent)} fault(s) in the last {lemon.window_text(h.lemon_window)}; a lemon at "
               f"{h.lemon_faults}" + (" (drained as a lemon now)" if out["lemon"] else ""))
