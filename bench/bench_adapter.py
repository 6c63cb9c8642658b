"""Slurm adapter call latency on a lab cluster: list all nodes, get one node, drain+resume one.

Usage: python bench/bench_adapter.py [--runs 30] [--dir DIR]
Starts a throwaway lab (3 nodes, no hooks) unless --dir names one that is up; prints medians and p95.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def _time(fn, runs):
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(0.95 * (len(samples) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--dir", help="an existing lab directory")
    args = ap.parse_args()
    from autoheal.slurm.cli_backend import CliSlurm
    from autoheal.slurm.rest_backend import RestSlurm
    from autoheal_lab.cluster import Lab

    own = args.dir is None
    lab = Lab(Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="autoheal-bench-")))
    if own:
        lab.up(hooks=False, xid_watch=False, install=False)
    try:
        cli = CliSlurm(env=lab.slurm_env())
        info = lab.start_slurmrestd("local")
        rest = RestSlurm(info["url"])
        print(f"Slurm {cli.version()}, {len(cli.list_nodes())} nodes, {args.runs} runs each (ms)")
        print(f"{'call':<34}{'median':>10}{'p95':>10}")
        rows = [
            ("cli list_nodes (1 call, all nodes)", lambda: cli.list_nodes()),
            ("cli get_node", lambda: cli.get_node("gpu1")),
            ("cli list_jobs", lambda: cli.list_jobs()),
            ("cli drain + resume", lambda: (cli.drain("gpu1", "autoheal: bench"), cli.resume("gpu1"))),
            ("rest list_nodes (local auth)", lambda: rest.list_nodes()),
        ]
        for name, fn in rows:
            med, p95 = _time(fn, args.runs)
            print(f"{name:<34}{med:>10.1f}{p95:>10.1f}")
    finally:
        if own:
            lab.down()


if __name__ == "__main__":
    main()
