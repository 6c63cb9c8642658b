#!/usr/bin/env python3
"""Requeue-to-running time on the lab: Slurm defaults vs autoheal's slurm.conf fragment.

For each mode a fresh lab is started (hooks and xid-watch off, so only slurm.conf differs); each run
submits a requeueable batch job, waits until it runs, ``scontrol requeue``s it and measures until it
runs again. Prints the median per mode side by side (goal on 22.05: about 146 s -> under 30 s).

    python bench/bench_requeue.py --runs 3            # both modes, ~2.5 min per default run
    python bench/bench_requeue.py --runs 1 --mode fragment

Needs root and Slurm installed (like `autoheal lab up`). Every lab started is torn down by PID.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from autoheal.slurm_conf.fragment import lab_fragment
from autoheal_lab.cluster import Lab


def _run(argv: List[str], env: Dict[str, str], timeout: float = 20) -> str:
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout


def _job_field(job: str, env: Dict[str, str]) -> Dict[str, str]:
    out = _run(["scontrol", "-o", "show", "job", job], env)
    fields = {}
    for tok in out.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            fields[k] = v
    return fields


def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def measure_once(env: Dict[str, str], timeout: float) -> float:
    """Seconds from `scontrol requeue` until the job is RUNNING again."""
    job = _run(["sbatch", "--parsable", "--requeue", "-o", "/dev/null", "-J", "bench-requeue",
                "--wrap", "sleep 900"], env).strip().split(";")[0]
    try:
        _wait(lambda: _job_field(job, env).get("JobState") == "RUNNING", 60, f"job {job} to start")
        t0 = time.monotonic()
        _run(["scontrol", "requeue", job], env)

        def running_again() -> bool:
            f = _job_field(job, env)
            return f.get("JobState") == "RUNNING" and f.get("Restarts", "0") != "0"

        _wait(running_again, timeout, f"job {job} to run again after requeue")
        return time.monotonic() - t0
    finally:
        subprocess.run(["scancel", job], env=env, capture_output=True, timeout=20)


def bench_mode(mode: str, runs: int, base: Path, timeout: float) -> List[float]:
    """Start a lab for ``mode`` (defaults | fragment), measure ``runs`` requeues, tear it down."""
    root = (base / f"lab-{mode}").resolve()
    extra: List[str] = []
    if mode == "fragment":
        # AuthInfo must be merged with the lab's munge socket (slurm.conf keeps the last line of a key);
        # extra_conf comes after the fragment, so this line wins whatever the lab did with AuthInfo.
        sock = root / "munge" / "munge.socket.2"
        extra = [ln for ln in lab_fragment(existing={"AuthInfo": f"socket={sock}"}) if ln.startswith("AuthInfo=")]
    lab = Lab(root)
    times: List[float] = []
    try:
        lab.up(nodes=2, gpus=2, spares=0, slurm_defaults=(mode == "defaults"), hooks=False, xid_watch=False,
               extra_conf=extra, install=False)
        env = lab.slurm_env()
        for i in range(runs):
            dt = measure_once(env, timeout)
            times.append(dt)
            print(f"  {mode} run {i + 1}/{runs}: {dt:.1f} s", file=sys.stderr, flush=True)
    finally:
        lab.down()
    return times


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="requeues per mode (median reported) [3]")
    ap.add_argument("--mode", choices=("both", "defaults", "fragment"), default="both")
    ap.add_argument("--dir", type=Path, default=None, help="where to put the labs [a temp dir]")
    ap.add_argument("--timeout", type=float, default=400.0, help="max seconds per requeue [400]")
    ap.add_argument("--json", action="store_true", help="print results as JSON")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    base = args.dir or Path(tempfile.mkdtemp(prefix="autoheal-bench-"))
    modes = ["defaults", "fragment"] if args.mode == "both" else [args.mode]
    results = {m: bench_mode(m, args.runs, base, args.timeout) for m in modes}
    if args.json:
        print(json.dumps({m: {"runs": t, "median": statistics.median(t)} for m, t in results.items()}, indent=2))
        return 0
    print(f"requeue -> running again (median of {args.runs} run(s))")
    print(f"{'':10}" + "".join(f"{m:>14}" for m in modes))
    print(f"{'median s':10}" + "".join(f"{statistics.median(results[m]):>14.1f}" for m in modes))
    print(f"{'runs s':10}" + "".join(f"{','.join(f'{x:.0f}' for x in results[m]):>14}" for m in modes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
