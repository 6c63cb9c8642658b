"""``autoheal lab soak``: the click command (loaded lazily by ``autoheal lab``)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from autoheal.cliutil import handle_errors, json_option, print_json
from autoheal.errors import EXIT_OK, EXIT_PROBLEM


def _duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text or "")
    if not m:
        raise click.BadParameter(f"{text!r}: use e.g. 90s, 30m or 1h")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


@click.command()
@click.option("--dir", "lab_dir", type=click.Path(file_okay=False), envvar="AUTOHEAL_LAB_DIR",
              help="Lab directory [env AUTOHEAL_LAB_DIR; default ~/.local/state/lab/autoheal_lab]. A lab up there is "
                   "restarted from a clean state.")
@click.option("--seed", default=1, show_default=True, type=int,
              help="Seed of the fault schedule: the same seed replays the same faults, targets and timing.")
@click.option("--faults", type=click.IntRange(0, 10000), help="How many faults to inject [default 30].")
@click.option("--duration", help="Or: how long to inject faults (90s, 30m, 1h); the count follows from the "
                                 "mean gap between faults.")
@click.option("--jobs", default=2, show_default=True, type=click.IntRange(1, 8),
              help="autoheal sbatch trainer jobs (the first on 2 nodes, the others on 1); a hot-spare trainer "
                   "(--spare-nodes 1: 2 active nodes + 1 spare), a submitit job, the array, the plain sbatch job "
                   "and the short jobs come on top (the lab's 4 nodes x 2 cores hold 2 trainers with them).")
@click.option("--kube/--no-kube", default=True, show_default=True,
              help="With a real kube-apiserver, autoheal sync and the spare pool (and their fault kinds).")
@click.option("--nodes", default=4, show_default=True, type=click.IntRange(2, 16), help="GPU nodes.")
@click.option("--spares", default=2, show_default=True, type=click.IntRange(0, 8), help="Spare nodes.")
@click.option("--gap", default="4-10", show_default=True, help="Seconds between faults, MIN-MAX (seeded).")
@click.option("--include", multiple=True, help="Draw only from these fault kinds (repeatable).")
@click.option("--exclude", multiple=True, help="Leave out these fault kinds (repeatable); see --list-kinds.")
@click.option("--settle", default=150.0, show_default=True, type=click.FloatRange(0, 3600),
              help="Seconds after the last fault for jobs to finish and nodes to come back.")
@click.option("--lemon-faults", default=3, show_default=True, type=click.IntRange(0, 1000),
              help="hooks.lemon_faults of the soak's lab (the product's default): a node with that many hardware "
                   "faults, each after a return to service, is drained a lemon; the bad-repair kind is judged "
                   "against it. 0: lemons off (bad repairs not judged).")
@click.option("--list-kinds", is_flag=True, help="List the fault kinds and exit.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False),
              help="Also draw a PNG timeline of nodes, jobs and faults (needs matplotlib).")
@json_option
@handle_errors
def soak(lab_dir, seed, faults, duration, jobs, kube, nodes, spares, gap, include, exclude, settle, lemon_faults,
         list_kinds, plot_file, as_json) -> None:
    """Seeded compound faults against the whole self-healing loop, invariants checked live.

    Starts a clean lab (4 GPU nodes x 4 fake GPUs + 2 spares; --kube: a real kube-apiserver, sync, spare
    pool), runs a workload (autoheal sbatch trainers on 2 and 1 nodes, a hot-spare trainer, a submitit
    Checkpointable job, an array, a plain sbatch job, a time-limit job, short jobs that come and go) and
    injects faults from a schedule derived from --seed: GPU XIDs 79/48/63/64/74/94/95, DBE, row-remap
    failure, GPU lost, thermal, NVLink, PCIe, flapping; kill -9 of slurmd, slurmctld, xid-watch, the sync
    (each restarted); API 5xx/429/slow windows; an admin draining a node, a cordon, a user cancelling or
    holding a job, a time limit. Single and overlapping (two nodes at once, a fault during a recovery, a
    fault on the replacement spare).

    \b
    Checked while it runs and at the end (each violation with evidence and the seed):
      no job stranded; admin drains and cordons untouched; no false drain; each fault acted on once;
      no lost work (trainer final state = an uninterrupted run's, resumed from the newest checkpoint;
      the same for the submitit job's result); a hot-spare swap counts as running again, once per fault;
      breaker and opt-out respected; journal whole and agreeing with job comments; every node in
      service or retired with an autoheal: reason; no process left after the lab goes down.

    \b
      autoheal lab soak --seed 7 --faults 15 --plot soak.png
      autoheal lab soak --seed 7 --faults 15 --exclude kill-slurmctld     # replay without one kind
      autoheal lab soak --duration 30m --json > soak.json

    Exit 0 zero violations; 1 a violation; 2 bad usage or the lab could not start.
    """
    from autoheal_lab.soak_plan import KINDS

    if list_kinds:
        for k in KINDS.values():
            click.echo(f"{k.name:<16} {k.group:<8} {'(kube) ' if k.needs_kube else ''}{k.doc}")
        return
    try:
        lo, hi = (float(x) for x in gap.split("-", 1))
        if not 0 < lo <= hi:
            raise ValueError
    except ValueError:
        raise click.BadParameter(f"{gap!r}: use MIN-MAX seconds, e.g. 4-10", param_hint="--gap") from None
    if faults is not None and duration:
        raise click.UsageError("give --faults or --duration, not both")
    if duration:
        faults = max(1, int(_duration(duration) / ((lo + hi) / 2)))
    elif faults is None:
        faults = 30
    from autoheal_lab.cluster import Lab
    from autoheal_lab.soak import Soak, SoakOptions, plot, render

    opts = SoakOptions(seed=seed, faults=faults, jobs=jobs, kube=kube, nodes=nodes, spares=spares, gap=(lo, hi),
                       include=list(include) or None, exclude=list(exclude), settle=settle,
                       lemon_faults=lemon_faults)
    try:
        runner = Soak(Lab(Path(lab_dir) if lab_dir else None), opts,
                      log=(lambda s: click.echo(s, err=True)))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    import signal

    # a soak stopped with SIGTERM (a timeout, a CI cancel) still takes its lab down (Soak.run's finally)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    report = runner.run()
    if plot_file:
        plot(report, plot_file)
    if as_json:
        print_json(report.to_dict())
    else:
        click.echo(render(report))
    sys.exit(EXIT_OK if report.ok else EXIT_PROBLEM)
