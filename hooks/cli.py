"""Admin commands of the node side: ``autoheal check`` and ``autoheal xid-watch``."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Optional

import click

from autoheal.cliutil import config_option, handle_errors, json_option, print_json

if TYPE_CHECKING:
    from autoheal.hooks.context import Context


@click.command("check")
@click.option("--node", help="Node name [default: $SLURMD_NODENAME, else the short hostname].")
@click.option("--no-drain", is_flag=True, help="Only report: change nothing in Slurm.")
@click.option("--dry-run", is_flag=True, help="Show the drain/resume/repair that would happen, change nothing.")
@click.option("--verbose", "-v", is_flag=True, help="Also list checks that passed.")
@click.option("--clear-faults", is_flag=True, help="Do not check: forget the node's open faults and "
              "recovery-ladder counts (after a repair by hand), so the next fault starts at a GPU reset again.")
@click.option("--gpu", type=click.IntRange(0, 1023), help="With --clear-faults: only this GPU's faults and counts.")
@json_option
@config_option
@handle_errors
def check(node: Optional[str], no_drain: bool, dry_run: bool, verbose: bool, clear_faults: bool, gpu: Optional[int],
          as_json: bool, config_path: Optional[str]) -> None:
    """Run every GPU health check on this node now, as the healthcheck does.

    \b
    Reads NVML (bounded by hooks.nvml_timeout) and new kernel-log XIDs, then (unless --no-drain)
    drains the node on failure and resumes a drain of ours that is healthy again.
    Exit 0 healthy, 1 a check failed, 2 could not tell (NVML hung, slurmctld unreachable).

    \b
    Examples:
      autoheal check --no-drain            # what is wrong with this node?
      autoheal check --node gpu1 --json    # in the lab, for node gpu1
      autoheal check --clear-faults --gpu 3 --dry-run   # what would be forgotten
    """
    from autoheal.hooks.context import Context
    from autoheal.hooks.engine import health_pass

    if gpu is not None and not clear_faults:
        raise click.UsageError("--gpu only goes with --clear-faults")
    ctx = Context.load("check", node, config_path)
    if clear_faults:
        _clear(ctx, gpu, dry_run, as_json)
        return
    p = health_pass(ctx, drain=not no_drain, dry_run=dry_run)
    if as_json:
        print_json(p.to_dict(verbose))
    else:
        click.echo(p.summary())
        for a in p.actions:
            click.echo(f"  {a.kind}: {a.outcome} {a.reason}".rstrip())
        for e in p.errors:
            click.echo(f"  error: {e}", err=True)
    ctx.close()  # pending notifications get a bounded moment, never longer
    sys.stdout.flush()
    os._exit(p.exit_code)  # an NVML worker may be stuck in the driver


def _clear(ctx: Context, gpu: Optional[int], dry_run: bool, as_json: bool) -> None:
    from autoheal.hooks.clearing import clear_faults

    out = clear_faults(ctx, gpu=gpu, dry_run=dry_run)
    if as_json:
        print_json(out.to_dict())
        return
    verb = "would clear" if dry_run else "cleared"
    where = f"GPU {gpu} of {ctx.node}" if gpu is not None else ctx.node
    from autoheal.hooks.state import ladder_label

    click.echo(f"{where}: {verb} {len(out.faults)} open fault(s); ladder counts of: "
               f"{', '.join(ladder_label(k, ctx.node) for k in sorted(out.ladder)) or 'none'}")
    for f in out.faults:
        click.echo(f"  {f.get('reason', '')}")


@click.command("xid-watch")
@click.option("--node", help="Node name [default: $SLURMD_NODENAME, else the short hostname].")
@click.option("--no-nvml", is_flag=True, help="Follow the kernel log only.")
@click.option("--no-kernel-log", is_flag=True, help="Wait on NVML XID events only.")
@config_option
@handle_errors
def xid_watch(node: Optional[str], no_nvml: bool, no_kernel_log: bool, config_path: Optional[str]) -> None:
    """Watch for GPU XIDs and drain within seconds (long-running node daemon).

    \b
    Waits on NVML XID events and follows the kernel log (hooks.kernel_log). On a drain-class XID
    (policy table, hooks.xid_policy) it drains the node, then journals. Whoever drained the node
    for a GPU fault (xid-watch, healthcheck, prolog, epilog), every job still running on it gets its
    grace signal (hooks.grace_signal; `autoheal sbatch` jobs get hooks.runner_signal on the batch
    shell) and a requeue if it still runs after hooks.grace_seconds: once per job and fault, retried
    while slurmctld does not answer. Run it from systemd: hooks/systemd/autoheal-xid-watch.service.
    """
    from autoheal.hooks.xid_watch import main

    sys.exit(main(node, config_path, nvml=not no_nvml, kernel_log=not no_kernel_log))
