"""The long soak: `autoheal lab soak` with many faults on several seeds; prints the reliability table.

    python bench/bench_soak.py [--faults 200] [--seeds 1,2,3] [--no-kube] [--dir DIR] [--json]
                               [--exclude KIND ...]

Each seed is the real command (`autoheal lab soak --seed S --faults N --json`, a process of its own, one
at a time in one lab directory). Figures come from each soak's JSON: violations per invariant, recovery
percentiles (fault -> drain, fault -> job running again, fault -> node back or replaced). Goal (issue
12): zero violations; fault -> job running again p95 <= 20 s. "loop" is fault -> job running again for
the waits with no breaker trip in them, less the time no idle node the job could use was free (the
queue): the loop's own part. The table also counts the remediation
breaker's trips, the on-call's resets and the technician's repairs in place (docs/soak.md).
200 faults at the default 4-10 s gap take about 27 minutes per seed on 2 cores. Each soak's JSON is kept
in DIR.runs/ (violations carry their evidence and the seed to replay), its progress log next to it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_soak(lab_dir: Path, seed: int, faults: int, kube: bool, exclude, save: Path, timeout: float) -> dict:
    argv = [sys.executable, "-m", "autoheal.cli.main", "lab", "soak", "--dir", str(lab_dir), "--seed", str(seed),
            "--faults", str(faults), "--json", "--kube" if kube else "--no-kube"]
    for kind in exclude:
        argv += ["--exclude", kind]
    t0 = time.monotonic()
    log = save.with_suffix(".log")  # the soak's progress (faults, on-call, violations) as it runs
    with open(log, "w") as err_f:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err_f, text=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()  # SIGTERM: the soak takes its lab down
            proc.communicate(timeout=120)
            return {"seed": seed, "ok": False, "why": f"soak did not end within {timeout:.0f} s",
                    "wall_s": round(time.monotonic() - t0, 1)}
    res = subprocess.CompletedProcess(argv, proc.returncode, out, log.read_text(errors="replace"))
    save.write_text(res.stdout + ("\n--- stderr ---\n" + res.stderr if res.stderr else ""))
    try:
        data = json.loads(res.stdout[res.stdout.index("{"):])
    except ValueError:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:] or ["no output"]
        return {"seed": seed, "ok": False, "why": " | ".join(tail), "wall_s": round(time.monotonic() - t0, 1)}
    data["exit_code"] = res.returncode
    return data


def _fmt(p: dict) -> str:
    if not p or not p.get("n"):
        return "      -       -"
    return f"{p['p50']:7.1f} {p['p95']:7.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", type=int, default=200)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--no-kube", action="store_true")
    ap.add_argument("--exclude", action="append", default=[])
    ap.add_argument("--dir", help="lab directory [a new temporary one]")
    ap.add_argument("--json", action="store_true", help="print the per-seed JSON summaries instead of the table")
    ap.add_argument("--timeout", type=float, default=4 * 3600.0, help="seconds per seed before giving up")
    args = ap.parse_args()
    lab_dir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-soak-")) / "lab"
    runs_dir = Path(str(lab_dir) + ".runs")
    runs_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in [int(s) for s in args.seeds.split(",") if s.strip()]:
        data = one_soak(lab_dir, seed, args.faults, not args.no_kube, args.exclude, runs_dir / f"seed-{seed}.json",
                        args.timeout)
        rows.append(data)
        print(f"seed {seed}: {'ok' if data.get('ok') else 'FAILED'} "
              f"({len(data.get('violations') or [])} violation(s), {data.get('wall_seconds', data.get('wall_s'))} s)",
              file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps([{k: r.get(k) for k in ("seed", "ok", "recovery", "violations", "counts", "wall_seconds",
                                                  "why")} for r in rows], indent=2, default=str))
        return 0 if all(r.get("ok") for r in rows) else 1
    print(f"autoheal lab soak: {args.faults} faults per seed, kube={'off' if args.no_kube else 'on'}"
          + (f", excluded: {', '.join(args.exclude)}" if args.exclude else ""))
    print(f"{'seed':>5} {'faults':>6} {'viol.':>5} | {'drain p50':>9} {'p95':>7} | {'job again p50':>13} {'p95':>7} | "
          f"{'loop p50':>8} {'p95':>7} | {'node back p50':>13} {'p95':>7} | "
          f"{'trips':>5} {'resets':>6} {'repairs':>7} | {'wall s':>7}")
    for r in rows:
        rec = r.get("recovery") or {}
        b = r.get("breaker") or {}  # trips, resets by the on-call, repairs in place by the technician
        print(f"{r['seed']:>5} {len(r.get('injected') or []):>6} {len(r.get('violations') or []):>5} | "
              f"  {_fmt(rec.get('fault_to_drain_s'))} |       {_fmt(rec.get('fault_to_job_running_again_s'))} | "
              f" {_fmt(rec.get('fault_to_job_running_again_loop_s'))} | "
              f"      {_fmt(rec.get('fault_to_node_back_or_replaced_s'))} | {b.get('trips', '-'):>5} "
              f"{b.get('resets', '-'):>6} {b.get('repairs', '-'):>7} | {r.get('wall_seconds', r.get('wall_s', '-')):>7}"
              + (f"  ({r['why']})" if r.get("why") else ""))
    by_inv = {}
    for r in rows:
        for v in r.get("violations") or []:
            by_inv[v["invariant"]] = by_inv.get(v["invariant"], 0) + 1
    print("violations by invariant: " + (", ".join(f"{k} {n}" for k, n in sorted(by_inv.items())) or "none"))
    print(f"per-seed JSON (evidence, replay seed): {runs_dir}")
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
