"""Benchmark the Slurm entry points: healthcheck wall time (whole process, 8 fake GPUs) and the
prolog's added latency. Prints medians; nothing is asserted. Needs gcc + nvidia-nvml-dev (fake NVML).

    python bench/bench_hooks.py [--runs 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def measure(runs: int = 30) -> dict:
    """Median wall time (ms) of each Slurm entry point as a whole process, and of a bare interpreter."""
    from autoheal_lab import fakenvml
    from autoheal_lab.fakenvml import state as gstate

    tmp = Path(tempfile.mkdtemp(prefix="bench-hooks-"))
    fakenvml.build_library(tmp / "lib")
    gstate.write_state(tmp / "n1.state", gstate.default_state("n1", 8))
    (tmp / "n1.kmsg").touch()
    (tmp / "ah.toml").write_text(f'[journal]\npath = "{tmp}/journal.jsonl"\n'
                                 f'[hooks]\nstate_dir = "{tmp}/state/{{node}}"\n'
                                 f'kernel_log = "{tmp}/{{node}}.kmsg"\nexpected_gpus = 8\ndcgm_mapping_dir = ""\n')
    env = dict(os.environ, AUTOHEAL_CONFIG=str(tmp / "ah.toml"), LD_LIBRARY_PATH=str(tmp / "lib"),
               AUTOHEAL_FAKE_NVML_STATE=str(tmp / "n1.state"), SLURMD_NODENAME="n1", SLURM_JOB_ID="1")
    out = {}
    for name, argv in (("python -c pass", [sys.executable, "-c", "pass"]),
                       ("healthcheck", [sys.executable, "-m", "autoheal.hooks.healthcheck"]),
                       ("prolog", [sys.executable, "-m", "autoheal.hooks.prolog"]),
                       ("epilog", [sys.executable, "-m", "autoheal.hooks.epilog"])):
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
            times.append(time.perf_counter() - t0)
            if res.returncode != 0:
                raise SystemExit(f"{name}: exit {res.returncode}: {res.stderr.strip()[:200]}")
        out[name] = round(statistics.median(times) * 1000, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = measure(args.runs)
    if args.json:
        print(json.dumps(res))
        return
    for name, ms in res.items():
        target = "" if name.startswith("python") else f"  (target <= 100 ms; ratio {ms / 100:.2f})"
        print(f"{name:<16} median {ms:6.1f} ms{target}")


if __name__ == "__main__":
    main()
