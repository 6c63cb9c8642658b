"""Job listings with and without a job flood (issues 25 and 28), on a lab cluster: squeue's JSON next to
its text listing, for every look-up autoheal makes.

Usage: python bench/bench_job_flood.py [--flood 10000] [--runs 3] [--json]

Starts a throwaway lab (3 nodes, no hooks; MaxJobCount raised), runs one job on gpu1, times the look-ups
the guard (pending jobs), xid-watch (jobs on a node, one job) and the sync's remediation (jobs holding
nodes) make, then submits the flood (held jobs as nobody, 4.3 kB of user text each: lab/autoheal_lab/flood.py)
and times them again. Each look-up three ways, parsed into Jobs and filtered as the adapter does:

- ``json``: ``squeue --json`` with the look-up's filters (22.05's JSON ignores them: the whole cluster);
- ``text``: the token-delimited ``squeue -o``/``-O`` listings with the same filters (``squeue_text``);
- ``adapter``: what ``CliSlurm`` does on this version (one of the two).

Prints medians (s) of ``--runs`` calls and the bytes each format printed for the flooded pending list;
asserts nothing. A call that takes longer than 300 s counts as 300 (the adapter's limit is 3-10 s).
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

CALL_LIMIT = 300.0


def _median(fn, runs):
    from autoheal.errors import SlurmUnavailable

    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        try:
            fn()
        except SlurmUnavailable:  # no answer within CALL_LIMIT: the sample is the limit
            pass
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _lookups(cli, job):
    """(name, json read, text read, adapter read) for each look-up."""
    from autoheal.slurm import parse
    from autoheal.slurm.base import filter_jobs

    def as_json(node=None, states=None, job_ids=None):
        args = ["--json", *cli._filters(node, states, job_ids)]
        return filter_jobs(parse.jobs_from_json(cli.run("squeue", *args), "squeue --json"), node, states)

    def as_text(node=None, states=None, job_ids=None):
        return filter_jobs(cli._text_jobs(cli._filters(node, states, job_ids) or ["--states=all"]), node, states)

    holding = ["RUNNING", "COMPLETING", "CONFIGURING"]
    return [
        ("guard: pending jobs", lambda: as_json(states=["PENDING"]), lambda: as_text(states=["PENDING"]),
         lambda: cli.list_jobs(states=["PENDING"])),
        ("xid-watch: jobs on gpu1", lambda: as_json(node="gpu1"), lambda: as_text(node="gpu1"),
         lambda: cli.list_jobs(node="gpu1")),
        ("xid-watch: one job", lambda: as_json(job_ids=[job]), lambda: as_text(job_ids=[job]),
         lambda: cli.get_job(job)),
        ("sync: jobs holding nodes", lambda: as_json(states=holding), lambda: as_text(states=holding),
         lambda: cli.list_jobs(states=holding)),
    ]


def _sizes(cli, out):
    from autoheal.slurm import squeue_text

    pending = ["--states=PENDING"]
    out["flood: pending: json bytes"] = len(cli.run("squeue", "--json", *pending))
    token = squeue_text.new_token()
    out["flood: pending: text bytes"] = (len(cli.run("squeue", "-h", *pending, "-o", squeue_text.o_format(token)))
                                         + len(cli.run("squeue", "-h", *pending, "-O", squeue_text.cap_format(token))))


def _measure(lab, args, out):
    from autoheal.slurm.cli_backend import CliSlurm
    from autoheal_lab import flood

    env = lab.slurm_env()
    cli = CliSlurm(env=env, timeout=CALL_LIMIT, retries=0)
    out["slurm"] = str(cli.version())
    job = subprocess.run(["sbatch", "--parsable", "-w", "gpu1", "-o", "/dev/null", "--wrap", "sleep 3600"], env=env,
                         capture_output=True, text=True, timeout=60, cwd="/tmp").stdout.strip()
    deadline = time.monotonic() + 60
    while not cli.get_job(job).running and time.monotonic() < deadline:
        time.sleep(0.5)
    rows = _lookups(cli, job)
    for phase in ("quiet", "flood"):
        if phase == "flood":
            t0 = time.perf_counter()
            flood.submit(env, args.flood)
            out["flood_submit_seconds"] = round(time.perf_counter() - t0, 1)
            _sizes(cli, out)
        for name, *reads in rows:
            for kind, fn in zip(("json", "text", "adapter"), reads):
                out[f"{phase}: {name}: {kind}"] = round(_median(fn, args.runs), 3)
    return [name for name, *_ in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flood", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from autoheal_lab import flood
    from autoheal_lab.cluster import Lab

    root = Path(tempfile.mkdtemp(prefix="autoheal-bench-flood-"))
    root.chmod(0o755)  # the flood user must read slurm.conf and reach munged, as any cluster user can
    lab = Lab(root)
    lab.up(hooks=False, xid_watch=False, install=False, extra_conf=flood.FLOOD_CONF)
    out: dict = {"flood_jobs": args.flood, "runs": args.runs}
    try:
        names = _measure(lab, args, out)
        out["bench_max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    finally:
        flood.cancel(lab.slurm_env())
        lab.down()
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"Slurm {out['slurm']}; flood: {args.flood} held jobs in {out.get('flood_submit_seconds')} s; pending list "
          f"printed: json {out['flood: pending: json bytes'] / 1e6:.1f} MB, text "
          f"{out['flood: pending: text bytes'] / 1e6:.1f} MB; medians of {args.runs} (s)")
    head = "".join(f"{p + ' ' + k:>15}" for p in ("quiet", "flood") for k in ("json", "text", "adapter"))
    print(f"{'look-up':<26}{head}")
    for name in names:
        cells = "".join(f"{out[f'{p}: {name}: {k}']:>15.3f}" for p in ("quiet", "flood")
                        for k in ("json", "text", "adapter"))
        print(f"{name:<26}{cells}")


if __name__ == "__main__":
    main()
