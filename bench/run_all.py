"""Run every benchmark and print one table of figures (medians, percentiles, ratios). Asserts nothing.

    python bench/run_all.py [--drills 5] [--default-drills 5] [--repeat 20] [--quick] [--write-docs]

--write-docs: also write the table, with the date, the machine and the commit, into docs/benchmarks.md
between its `run_all` markers (the page's figures come from here, never typed by hand).

--quick: 1 drill per mode, 2 repeated drills and fewer repetitions elsewhere (about 6 minutes instead
of about 35). The drills with Slurm defaults are the slow part: each waits out the 121 s requeue delay.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- run_all: begin -->", "<!-- run_all: end -->"


def _bench_json(script: str, *args: str) -> dict:
    res = subprocess.run([sys.executable, str(HERE / script), "--json", *args], capture_output=True, text=True,
                         timeout=3600)
    if res.returncode != 0:
        return {"error": (res.stderr or res.stdout).strip().splitlines()[-1:]}
    return json.loads(res.stdout[res.stdout.index("{"):])


def _drills(runs: int, slurm_defaults: bool, hot_spare: bool = False) -> List[dict]:
    from autoheal_lab.cluster import Lab
    from autoheal_lab.drill import Drill

    out = []
    for _ in range(runs):
        lab = Lab(Path(tempfile.mkdtemp(prefix="autoheal-bench-drill-")))
        try:
            lab.up(nodes=3, gpus=8, spares=1, slurm_defaults=slurm_defaults, kube=True, install=False)
            rep = Drill(lab, phase_timeout=400, hot_spare=hot_spare).run()
            out.append({"ok": rep.ok, **rep.totals()})
        finally:
            lab.down()
    return out


def _median(rows: List[dict], key: str) -> Optional[float]:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(vals), 1) if vals else None


def _machine() -> str:
    """One line naming where the figures were taken: date, cores, memory, OS, Slurm, commit, load."""
    def run(*argv: str) -> str:
        try:
            res = subprocess.run(list(argv), capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return "?"
        return res.stdout.strip() or "?"
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    try:
        osname = platform.freedesktop_os_release().get("PRETTY_NAME", "?")
    except (AttributeError, OSError):  # Python < 3.10, or no os-release
        osname = "?"
    slurm = run("dpkg-query", "-W", "-f=${Version}", "slurm-client")
    commit = run("git", "-C", str(HERE), "rev-parse", "--short", "HEAD")
    return (f"{datetime.date.today().isoformat()}, {os.cpu_count()} cores / {mem_gib:.0f} GiB, {osname}, "
            f"Slurm {slurm}, commit {commit}, "
            f"load average at the end {os.getloadavg()[0]:.1f}")


def render_markdown(rows: List[tuple], command: str, machine: str) -> str:
    """The table as docs/benchmarks.md holds it between its markers."""
    lines = [f"`{command}` on {machine}, printed:", "", "| figure | value | target |", "|---|---|---|"]
    lines += [f"| {name} | {value} | {target} |" for name, value, target in rows]
    return "\n".join(lines)


def write_docs(page: Path, block: str) -> None:
    """Replace what lies between the markers of ``page`` with ``block``; the rest of the page is kept."""
    text = page.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"run_all: {page} has no '{BEGIN}' ... '{END}' markers to write between")
    head, rest = text.split(BEGIN, 1)
    page.write_text(head + BEGIN + "\n" + block + "\n" + END + rest.split(END, 1)[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drills", type=int, default=5, help="drills with the recommended slurm.conf [5]")
    ap.add_argument("--default-drills", type=int, default=5, help="drills with Slurm defaults [5]")
    ap.add_argument("--repeat", type=int, default=20, help="drills in a row in one lab directory [20]")
    ap.add_argument("--quick", action="store_true", help="1 drill per mode, 2 repeated, fewer repetitions")
    ap.add_argument("--write-docs", action="store_true", help=f"write the table into {DOCS.name} too")
    args = ap.parse_args()
    if args.quick:
        args.drills = args.default_drills = 1
        args.repeat = 2
    reps = "10" if args.quick else "30"

    rows = []  # (figure, value, target)
    frag = _drills(args.drills, False)
    dflt = _drills(args.default_drills, True)
    for label, data in (("recommended slurm.conf", frag), ("Slurm defaults", dflt)):
        n_ok = sum(1 for r in data if r["ok"])
        rows.append((f"drill ({label}): drills passed", f"{n_ok}/{len(data)}", "all"))
        rows.append((f"drill ({label}): fault -> drain, median s", _median(data, "fault_to_drain_s"), "<= 2"))
        rows.append((f"drill ({label}): fault -> job running again, median s",
                     _median(data, "fault_to_job_running_again_s"), "<= 30" if label.startswith("rec") else "-"))
        rows.append((f"drill ({label}): fault -> replacement in service, median s",
                     _median(data, "fault_to_replacement_in_service_s"), "-"))
    hot = _drills(args.drills, False, hot_spare=True)
    rows.append(("drill --hot-spare: drills passed", f"{sum(1 for r in hot if r['ok'])}/{len(hot)}", "all"))
    rows.append(("drill --hot-spare: fault -> trainer resumed (no requeue), median s",
                 _median(hot, "fault_to_trainer_resumed_s"), "<= 5"))
    rep = _bench_json("bench_drill_repeat.py", "--runs", str(args.repeat))
    again = rep.get("fault_to_job_running_again_s") or {}
    rows.append(("drill repeated in one directory: drills passed",
                 f"{rep['passed']}/{rep['runs']}" if "passed" in rep else rep.get("error"), "all"))
    rows.append(("drill repeated in one directory: fault -> running again p50 / p95 / max s",
                 f"{again.get('p50')} / {again.get('p95')} / {again.get('max')}", "p95 <= 20"))
    hooks = _bench_json("bench_hooks.py", "--runs", reps)
    for name in ("healthcheck", "prolog", "epilog"):
        rows.append((f"{name} wall time (process, 8 GPUs), median ms", hooks.get(name, hooks.get("error")), "<= 100"))
    startup = _bench_json("bench_hook_startup.py", "--runs", "10" if args.quick else "21")
    got = startup.get("results", {})
    base = next((b for b in ("LBNL NHC, 4 checks", "bash, 4 NHC-style checks") if b in got), "")
    for name in ("healthcheck", "prolog", "epilog"):
        ratio = round(got[name]["wall_ms"] / got[base]["wall_ms"], 2) if name in got and base else startup.get("error")
        rows.append((f"{name} wall time / {base or 'baseline'} (same run, interleaved)", ratio, "<= 1 (NHC)"))
    xid = _bench_json("bench_xid_drain.py", "--runs", "10" if args.quick else "20")
    rows.append(("XID -> DRAIN with xid-watch, p50 s", xid.get("p50_s", xid.get("error")), "-"))
    rows.append(("XID -> DRAIN with xid-watch, p95 s", xid.get("p95_s"), "<= 2"))
    sync = _bench_json("bench_sync.py", "--nodes", "10000", "--samples", "10" if args.quick else "20")
    rows.append(("sync @10,000 nodes: idle resync CPU, median s", sync.get("idle_resync_cpu_seconds_median",
                                                                          sync.get("error")), "-"))
    rows.append(("sync @10,000 nodes: API writes per idle resync", sync.get("api_writes_per_idle_resync"), "0"))
    lat = {k: v for k, v in sync.items() if "pod_condition" in k}
    for key, value in lat.items():
        rows.append((f"sync @10,000 nodes: {key}", value, "p95 <= 2 s"))
    rows.append(("sync @10,000 nodes: max RSS MB", sync.get("max_rss_mb"), "<= 300"))
    rem = _bench_json("bench_remediation.py", "--fleet", "500")
    off = rem.get("breaker_off", {})
    on = rem.get("breaker_on", {})
    rows.append(("500 nodes failing, breaker off: s until all cordoned", off.get("seconds", rem.get("error")), "<= 10"))
    rows.append(("500 nodes failing, breaker on: remediations started", on.get("started"), "<= limits (2)"))
    fo = _bench_json("bench_failover.py", "--durations", "5", "--runs", "1" if args.quick else "3",
                     "--modes", "after-renew", "release")
    for item in fo.get("failover", []):
        rows.append((f"sync leader failover, 5 s lease, {item['mode']}: takeover max s",
                     item["takeover"]["max"], "<= lease" if item["mode"] == "after-renew" else "~1"))
    if "error" in fo:
        rows.append(("sync leader failover", fo["error"], "-"))

    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'value':>12}  target")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value!s:>12}  {target}")
    if args.write_docs:
        command = "python bench/run_all.py " + " ".join(sys.argv[1:])
        write_docs(DOCS, render_markdown(rows, command.strip(), _machine()))
        print(f"written into {DOCS}")


if __name__ == "__main__":
    main()
