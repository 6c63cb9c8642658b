"""What a minute of `autoheal guard` passes costs Slurm, listing the running jobs every pass or once per look.

Usage: python bench/bench_guard_pass.py [--nodes 6] [--jobs 12] [--passes 60] [--json]

Starts a throwaway lab (no hooks), runs ``--jobs`` one-CPU jobs carrying 1 kB comments (as a trainer's
runner comment and a user's text may), and times ``--passes`` guard passes on the real CLI adapter, the
clock advanced 2 s a pass (the default ``--interval``): "before" lists pending, running and configuring jobs
on every pass (what the guard did until the lost-prolog look was made periodic; the same as
``list_running``, kept for ``--textfile-dir``), "after" the pending jobs every pass and the running ones
every 15 s. Prints the wall time of Slurm calls per simulated minute and the squeue runs; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path


def _passes(cli, passes: int, list_running: bool) -> dict:
    from autoheal.sbatch_helpers.guard import Guard

    runs = {"squeue": 0}
    real_run = cli.run

    def counting(tool, *args, **kw):
        runs[tool] = runs.get(tool, 0) + 1
        return real_run(tool, *args, **kw)

    cli.run = counting
    clock = [time.time()]
    guard = Guard(cli, clock=lambda: clock[0], say=lambda s: None, list_running=list_running)
    guard.pass_once()  # reads the config once (PrologFlags): not part of the steady state
    runs.clear()
    runs["squeue"] = 0
    t = time.perf_counter()
    for _ in range(passes):
        guard.pass_once()
        clock[0] += 2.0
    wall = time.perf_counter() - t
    cli.run = real_run
    minutes = passes * 2.0 / 60
    return {"seconds_per_minute": round(wall / minutes, 3), "squeue_runs_per_minute": round(runs["squeue"] / minutes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--passes", type=int, default=60)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from autoheal.slurm.cli_backend import CliSlurm
    from autoheal_lab.cluster import Lab

    root = Path(tempfile.mkdtemp(prefix="autoheal-bench-guard-"))
    lab = Lab(root)
    lab.up(nodes=args.nodes, hooks=False, xid_watch=False, install=False)
    out: dict = {"nodes": args.nodes, "jobs": args.jobs}
    try:
        env = lab.slurm_env()
        cli = CliSlurm(env=env, timeout=60, retries=0)
        for i in range(args.jobs):
            res = subprocess.run(["sbatch", "-n1", "-o", "/dev/null", "--comment", f"{i} " + "x" * 1000, "--wrap",
                                  "sleep 3600"], env=env, capture_output=True, text=True, timeout=60, cwd="/tmp")
            if res.returncode != 0:
                raise SystemExit(f"sbatch: {res.stderr.strip()[:200]}")
        deadline = time.monotonic() + 120
        while len(cli.list_jobs(states=["RUNNING"])) < args.jobs and time.monotonic() < deadline:
            time.sleep(1)
        out["running"] = len(cli.list_jobs(states=["RUNNING"]))
        out["slurm"] = str(cli.version())
        out["before"] = _passes(cli, args.passes, list_running=True)
        out["after"] = _passes(cli, args.passes, list_running=False)
    finally:
        subprocess.run(["scancel", "--user=root"], env=lab.slurm_env(), capture_output=True, timeout=60)
        lab.down()
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"Slurm {out['slurm']}; {out['running']} running jobs (1 kB comments) on {args.nodes} nodes; "
          f"{args.passes} passes, 2 s apart")
    for phase in ("before", "after"):
        print(f"{phase:<8}{out[phase]['seconds_per_minute']:>8.3f} s of Slurm calls per minute, "
              f"{out[phase]['squeue_runs_per_minute']:>4} squeue runs per minute")


if __name__ == "__main__":
    main()
