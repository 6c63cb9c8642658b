"""``autoheal guard``: the controller-side loop that finishes interrupted requeues (see guard.py)."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Optional

import click

from autoheal.cliutil import config_option, handle_errors, load_cfg, print_json
from autoheal.errors import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, SlurmUnavailable


@click.command("guard")
@click.option("--interval", type=click.FloatRange(0.5, 3600), default=2.0, show_default=True,
              help="Seconds between passes (one squeue, plus one node list when an autoheal job is pending).")
@click.option("--release-after", type=click.FloatRange(0, 3600), default=5.0, show_default=True,
              help="Seconds a job must stay held by the runner's requeue before the guard releases it (the "
                   "runner normally releases it itself within a second).")
@click.option("--prune-after", type=click.FloatRange(0, 86400), default=30.0, show_default=True,
              help="Seconds a node must look healthy before autoheal's exclusion of it is dropped from pending "
                   "jobs (a node can look healthy for a moment while slurmctld restarts).")
@click.option("--lost-prolog-after", type=click.FloatRange(1, 86400), default=60.0, show_default=True,
              help="Seconds a job must stay in Prolog, on a node whose slurmd restarted after the "
                   "allocation, before the guard requeues it (its prolog's end will never be reported; "
                   "PrologFlags=Alloc only). The guard looks every quarter of this, so it acts within 1.25x "
                   "it. Shorter: such a job waits less; the look lists every running job, so on a big "
                   "cluster keep it in minutes.")
@click.option("--lost-prolog-jobs", type=click.Choice(["all", "autoheal"]), default="all", show_default=True,
              help="Which jobs the lost-prolog rule looks at: every batch job (a plain sbatch job is caught "
                   "by a slurmd restart as much as autoheal's; it is requeued when requeueable, its comment "
                   "left as it is, and reported for an admin when not), or only the jobs of `autoheal "
                   "sbatch` and the jobs autoheal requeued.")
@click.option("--once", is_flag=True, help="Make one pass, print what was done, and exit (0 nothing left to do, "
              "1 a job could not be fixed, 2 slurmctld did not answer or config error). With --once, "
              "--release-after and --prune-after still count from the first sighting, so they act only "
              "when set to 0.")
@click.option("--textfile-dir", type=click.Path(file_okay=False), default=None,
              help="Write the guard's metrics (heartbeat, requeued jobs waiting to run) to "
                   "DIR/autoheal_guard.prom after every pass, for node-exporter's textfile collector; the "
                   "guard-down and requeued-job alerts read them.")
@click.option("--dry-run", is_flag=True, help="Plan and print; change nothing in Slurm.")
@click.option("--json", "as_json", is_flag=True, help="With --once: print the actions as JSON.")
@config_option
@handle_errors
def guard(interval: float, release_after: float, prune_after: float, lost_prolog_after: float,
          lost_prolog_jobs: str, once: bool, dry_run: bool, as_json: bool, textfile_dir: Optional[str],
          config_path: Optional[str]) -> None:
    """Release jobs the autoheal runner left held, and drop exclusions of repaired nodes.

    \b
    A job run by `autoheal sbatch` requeues itself after a node fault with requeuehold ->
    ExcNodeList -> release. Slurm kills the job's processes as soon as it is held; if the runner
    dies before its release (SIGKILL, slurmctld away too long), the job would stay held forever.
    The guard, running outside every job, finds such jobs by their comment (state=requeueing) and
    by Slurm's own "job requeued in held state", applies the recorded exclusions and releases them.
    Holds placed by users or admins are never touched. It also removes autoheal's exclusions of
    nodes that are healthy again, so a pending job never waits on a list that only grows, and
    asks slurmctld to schedule a job autoheal requeued as soon as it is eligible again, instead
    of at the next backfill cycle (an update with the same ExcNodeList; once per requeue). A job
    left in Prolog by a slurmd restart after its allocation (PrologFlags=Alloc) is requeued (its
    batch script never ran), or reported when it is not requeueable.

    \b
    Run one on the slurmctld host:   autoheal guard            (a daemon; stop with SIGTERM)
    See what it would do:            autoheal guard --once --dry-run
    """
    from autoheal.sbatch_helpers.guard import describe, pending_ids, run_forever

    g, notifier = _build(load_cfg(config_path), once, dry_run, release_after, prune_after, lost_prolog_after,
                         textfile_dir, lost_prolog_jobs)
    if once:
        try:
            results = g.pass_once()
        except SlurmUnavailable as exc:
            click.echo(f"autoheal guard: {exc}", err=True)
            sys.exit(EXIT_USAGE)
        if as_json:
            print_json({"ok": pending_ids(results) is None, "actions": [r.to_dict() for r in results]})
        else:
            for line in describe(results):
                click.echo(line)
        if notifier is not None:
            notifier.flush(5.0)
        sys.exit(EXIT_PROBLEM if pending_ids(results) else EXIT_OK)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    click.echo(f"autoheal guard: watching for held autoheal jobs every {interval:g}s "
               f"(release after {release_after:g}s){' [dry run]' if dry_run else ''}")
    sys.stdout.flush()
    from autoheal.sbatch_helpers.guard_metrics import GuardMetrics

    metrics = GuardMetrics(textfile_dir) if textfile_dir else None
    run_forever(g, interval, stopping.is_set, sleep=stopping.wait, metrics=metrics)
    if notifier is not None:
        notifier.flush(5.0)


def _build(cfg, once: bool, dry_run: bool, release_after: float, prune_after: float,  # type: ignore[no-untyped-def]
           lost_prolog_after: float, textfile_dir: Optional[str], lost_prolog_jobs: str = "all"):
    """The guard and its notifier (None with --dry-run, which records nothing)."""
    from autoheal.sbatch_helpers.guard import Guard, PrologJobs
    from autoheal.slurm import get_adapter

    journal = notifier = None
    if not dry_run:
        from autoheal.journal import Journal
        from autoheal.notify import Notifier

        journal = Journal.from_config(cfg)
        notifier = Notifier.from_config(cfg, journal)

    def say(text: str) -> None:
        click.echo(text, err=once)  # --once: stdout is the report

    g = Guard(get_adapter(cfg), journal=journal, notifier=notifier, release_after=release_after, dry_run=dry_run,
              prune_after=prune_after, lost_prolog_after=lost_prolog_after, say=say,
              intents=_intents(cfg, dry_run, say), list_running=bool(textfile_dir),
              prolog_jobs=PrologJobs(lost_prolog_jobs))
    return g, notifier

def _intents(cfg, dry_run: bool, say):  # type: ignore[no-untyped-def]
    """Where the guard keeps its requeue intents: ``guard/`` beside the journal (the guard writes there
    already); in memory with --dry-run, which acts on nothing."""
    from pathlib import Path

    from autoheal.sbatch_helpers.guard_intent import IntentStore

    return IntentStore(None if dry_run else Path(cfg.journal.path).parent / "guard", say=say)
