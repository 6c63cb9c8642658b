"""`autoheal lab drill` N times in a row in ONE lab directory: pass count, fault -> job running again.

    python bench/bench_drill_repeat.py [--runs 20] [--plain] [--no-kube] [--dir DIR] [--json]

Each run is the real command (`autoheal lab drill --dir DIR --json`, a process of its own), so every
drill brings the lab up in the directory the previous one used and tore down: what a user re-running
`./dev drill` gets. Figures come from each drill's own JSON (phases stamped from the evidence).
Target: every run passes, fault -> job running again p95 <= 20 s. Prints figures only; each drill's
JSON is kept in DIR.runs/ (a failed drill's phases say what they last saw, with log tails).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional


def percentile(values: List[float], q: float) -> Optional[float]:
    """Nearest-rank percentile (no interpolation: a value that was measured)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100.0 * len(ordered)) - 1)]


def one_drill(lab_dir: Path, plain: bool, no_kube: bool, timeout: float, save: Optional[Path] = None) -> dict:
    """One `autoheal lab drill` process; its JSON (phases, and the log tails of a failed drill) is kept in
    ``save`` because the next drill's clean start empties the lab's drill folder."""
    argv = [sys.executable, "-m", "autoheal.cli.main", "lab", "drill", "--dir", str(lab_dir), "--json",
            "--timeout", str(timeout), *(["--plain"] if plain else []), *(["--no-kube"] if no_kube else [])]
    t0 = time.monotonic()
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 600)
    except subprocess.TimeoutExpired:
        return {"ok": False, "exit_code": None, "wall_s": round(time.monotonic() - t0, 1), "why": "drill hung"}
    out = {"exit_code": res.returncode, "wall_s": round(time.monotonic() - t0, 1)}
    if save is not None:
        save.write_text(res.stdout + ("\n--- stderr ---\n" + res.stderr if res.stderr else ""))
    try:
        data = json.loads(res.stdout[res.stdout.index("{"):])
    except ValueError:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        return {**out, "ok": False, "why": tail[0]}
    bad = [f"{p['phase']}: {p['status']} ({p.get('why') or p.get('detail') or '-'})" for p in data.get("phases", [])
           if p["status"] not in ("observed", "skipped")]
    return {**out, "ok": bool(data.get("ok")) and res.returncode == 0, **data.get("totals", {}),
            "why": "; ".join(bad) or data.get("error", "")}


def measure(runs: int, lab_dir: Path, plain: bool = False, no_kube: bool = False, timeout: float = 240.0,
            progress=None) -> dict:
    rows = []
    saved = Path(f"{lab_dir}.runs")  # beside the lab directory: a clean start never empties it
    saved.mkdir(parents=True, exist_ok=True)
    for i in range(runs):
        row = one_drill(lab_dir, plain, no_kube, timeout, saved / f"drill-{i + 1}.json")
        rows.append(row)
        if progress:
            progress(i + 1, row)
    again = [r["fault_to_job_running_again_s"] for r in rows if r.get("ok") and r.get("fault_to_job_running_again_s")
             is not None]
    drain = [r["fault_to_drain_s"] for r in rows if r.get("ok") and r.get("fault_to_drain_s") is not None]

    def r3(v):
        return None if v is None else round(v, 2)

    return {"dir": str(lab_dir), "saved": str(saved), "runs": runs, "passed": sum(1 for r in rows if r.get("ok")),
            "plain": plain, "kube": not no_kube,
            "fault_to_job_running_again_s": {"p50": r3(statistics.median(again)) if again else None,
                                             "p95": r3(percentile(again, 95)), "max": r3(max(again, default=None))},
            "fault_to_drain_s": {"p50": r3(statistics.median(drain)) if drain else None,
                                 "p95": r3(percentile(drain, 95))},
            "drill_wall_s_median": r3(statistics.median([r["wall_s"] for r in rows])) if rows else None,
            "failures": [{"run": i + 1, "exit_code": r["exit_code"], "why": r.get("why", "")}
                         for i, r in enumerate(rows) if not r.get("ok")],
            "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20, help="drills in a row [20]")
    ap.add_argument("--plain", action="store_true", help="drill a job submitted with plain sbatch")
    ap.add_argument("--no-kube", action="store_true", help="leave the Kubernetes side out")
    ap.add_argument("--dir", type=Path, help="lab directory, reused by every run [a new temporary one]")
    ap.add_argument("--timeout", type=float, default=240.0, help="each drill's --timeout for its phases [240]")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    lab_dir = args.dir or Path(tempfile.mkdtemp(prefix="autoheal-bench-repeat-")) / "lab"

    def progress(i, row):
        if not args.json:
            again = row.get("fault_to_job_running_again_s")
            print(f"drill {i}/{args.runs}: {'passed' if row.get('ok') else 'FAILED (exit %s)' % row['exit_code']}"
                  f"  fault -> running again {again if again is not None else 'n/a'} s  wall {row['wall_s']} s"
                  + (f"  {row['why']}" if not row.get("ok") else ""), flush=True)

    res = measure(args.runs, lab_dir, args.plain, args.no_kube, args.timeout, progress)
    if args.json:
        print(json.dumps({k: v for k, v in res.items() if k != "rows"}))
        return
    a = res["fault_to_job_running_again_s"]
    print(f"{res['passed']}/{res['runs']} drills passed in one directory ({res['dir']}; "
          f"{'plain sbatch' if args.plain else 'autoheal sbatch'}, {'with' if res['kube'] else 'no'} Kubernetes)")
    print(f"fault -> job running again: p50 {a['p50']} s  p95 {a['p95']} s  max {a['max']} s  (target: all pass, "
          f"p95 <= 20 s)")
    print(f"fault -> drain: p50 {res['fault_to_drain_s']['p50']} s  p95 {res['fault_to_drain_s']['p95']} s;  "
          f"one drill (up, run, down): median {res['drill_wall_s_median']} s")


if __name__ == "__main__":
    main()
