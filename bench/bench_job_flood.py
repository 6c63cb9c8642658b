"""Job listings with and without a job flood (issue 25, item 5), on a lab cluster.

Usage: python bench/bench_job_flood.py [--flood 10000] [--runs 5] [--json]

Starts a throwaway lab (3 nodes, no hooks; MaxJobCount raised), runs one job on gpu1, times the look-ups
the guard (pending jobs), xid-watch (jobs on a node, one job) and the sync's remediation (jobs holding
nodes) make, then submits the flood (held jobs as nobody, 4.3 kB of user text each: lab/autoheal_lab/flood.py)
and times them again. "before" is what every look-up did until this change: `squeue --json` of the whole
cluster (22.05's JSON ignores the filters) parsed and filtered in Python. Prints medians (s); asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def _median(fn, runs):
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flood", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from autoheal.slurm import parse
    from autoheal.slurm.base import filter_jobs
    from autoheal.slurm.cli_backend import CliSlurm
    from autoheal_lab import flood
    from autoheal_lab.cluster import Lab

    root = Path(tempfile.mkdtemp(prefix="autoheal-bench-flood-"))
    root.chmod(0o755)  # the flood user must read slurm.conf and reach munged, as any cluster user can
    lab = Lab(root)
    lab.up(hooks=False, xid_watch=False, install=False, extra_conf=flood.FLOOD_CONF)
    out: dict = {"flood_jobs": args.flood}
    try:
        env = lab.slurm_env()
        cli = CliSlurm(env=env, timeout=300, retries=0)
        job = subprocess.run(["sbatch", "--parsable", "-w", "gpu1", "-o", "/dev/null", "--wrap", "sleep 3600"], env=env,
                             capture_output=True, text=True, timeout=60, cwd="/tmp").stdout.strip()
        deadline = time.monotonic() + 60
        while not cli.get_job(job).running and time.monotonic() < deadline:
            time.sleep(0.5)

        def before(node=None, states=None):
            return filter_jobs(parse.jobs_from_json(cli.run("squeue", "--json"), "squeue --json"), node, states)

        def before_get():
            return [j for j in before() if j.job_id == job]

        rows = [
            ("guard: pending jobs", lambda: before(states=["PENDING"]), lambda: cli.list_jobs(states=["PENDING"])),
            ("xid-watch: jobs on gpu1", lambda: before(node="gpu1"), lambda: cli.list_jobs(node="gpu1")),
            ("xid-watch: one job", before_get, lambda: cli.get_job(job)),
            ("sync: jobs holding nodes", lambda: before(states=["RUNNING", "COMPLETING", "CONFIGURING"]),
             lambda: cli.list_jobs(states=["RUNNING", "COMPLETING", "CONFIGURING"])),
        ]
        for phase in ("quiet", "flood"):
            if phase == "flood":
                t0 = time.perf_counter()
                flood.submit(env, args.flood)
                out["flood_submit_seconds"] = round(time.perf_counter() - t0, 1)
                size = len(cli.run("squeue", "--json"))
                out["squeue_json_bytes"] = size
            for name, old, new in rows:
                out[f"{phase}: {name}: before"] = round(_median(old, args.runs), 3)
                out[f"{phase}: {name}: now"] = round(_median(new, args.runs), 3)
        out["bench_max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    finally:
        flood.cancel(lab.slurm_env())
        lab.down()
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"Slurm {cli.version()}; flood: {args.flood} held jobs in {out.get('flood_submit_seconds')} s, "
          f"squeue --json {out.get('squeue_json_bytes', 0) / 1e6:.0f} MB; medians of {args.runs} (s)")
    print(f"{'look-up':<30}{'quiet before':>13}{'quiet now':>11}{'flood before':>14}{'flood now':>11}")
    for name, _old, _new in rows:
        print(f"{name:<30}{out[f'quiet: {name}: before']:>13.3f}{out[f'quiet: {name}: now']:>11.3f}"
              f"{out[f'flood: {name}: before']:>14.3f}{out[f'flood: {name}: now']:>11.3f}")


if __name__ == "__main__":
    main()
