"""Benchmark the Slurm entry points: healthcheck wall time (whole process, 8 fake GPUs) and the
prolog's added latency. Prints medians; nothing is asserted. Needs gcc + nvidia-nvml-dev (fake NVML).

    python bench/bench_hooks.py [--runs 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    from autoheal.lab import fakenvml
    from autoheal.lab.fakenvml import state as gstate

    tmp = Path(tempfile.mkdtemp(prefix="bench-hooks-"))
    fakenvml.build_library(tmp / "lib")
    gstate.write_state(tmp / "n1.state", gstate.default_state("n1", 8))
    (tmp / "n1.kmsg").touch()
    (tmp / "ah.toml").write_text(f'[journal]\npath = "{tmp}/journal.jsonl"\n[hooks]\nstate_dir = "{tmp}/state/{{node}}"\n'
                                 f'kernel_log = "{tmp}/{{node}}.kmsg"\nexpected_gpus = 8\ndcgm_mapping_dir = ""\n')
    env = dict(os.environ, AUTOHEAL_CONFIG=str(tmp / "ah.toml"), LD_LIBRARY_PATH=str(tmp / "lib"),
               AUTOHEAL_FAKE_NVML_STATE=str(tmp / "n1.state"), SLURMD_NODENAME="n1", SLURM_JOB_ID="1")
    base = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        base.append(time.perf_counter() - t0)
    print(f"python -c pass                 median {statistics.median(base) * 1000:6.1f} ms")
    for module in ("autoheal.hooks.healthcheck", "autoheal.hooks.prolog", "autoheal.hooks.epilog"):
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            if res.returncode != 0:
                print(f"{module}: exit {res.returncode}: {res.stderr.strip()[:200]}")
                break
        med = statistics.median(times)
        print(f"{module:30s} median {med * 1000:6.1f} ms  (target <= 100 ms; ratio {med / 0.1:.2f})")


if __name__ == "__main__":
    main()
