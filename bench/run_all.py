"""Run every benchmark and print one table of figures (medians, percentiles, ratios). Asserts nothing.

    python bench/run_all.py [--drills 5] [--default-drills 5] [--repeat 20] [--quick] [--write-docs]
                            [--tiers | --tiers-json FILE] [--tiers-only]

--write-docs: also write the table, with the date, the machine and the commit, into docs/benchmarks.md
between its `run_all` markers (the page's figures come from here, never typed by hand).

--tiers: also run the checkpoint-tiers matrix (bench_ckpt_tiers.py: 2 trainers x 2 paths x 2 tiers x 4
faults, about an hour on the 2-core lab host; root, and torch for its torch half); its targets join the
table and, with --write-docs, its rows go between the `bench_ckpt_tiers` markers of docs/benchmarks.md
and its costs between those of docs/researcher-guide.md. --tiers-json FILE: the same from a saved
`bench_ckpt_tiers.py --json` output (a run of its own, e.g. in the background) instead of running it.
--tiers-only: nothing else (the main table is left as it is).

--quick: 1 drill per mode, 2 repeated drills and fewer repetitions elsewhere (about 6 minutes instead
of about 35). The drills with Slurm defaults are the slow part: each waits out the 121 s requeue delay.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
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
GUIDE = HERE.parent / "docs" / "researcher-guide.md"
BEGIN, END = "<!-- run_all: begin -->", "<!-- run_all: end -->"
TIERS = "bench_ckpt_tiers"  # the checkpoint-tiers blocks' marker name


def markers(name: str) -> tuple:
    return f"<!-- {name}: begin -->", f"<!-- {name}: end -->"


def _bench_json(script: str, *args: str, timeout: float = 3600) -> dict:
    res = subprocess.run([sys.executable, str(HERE / script), "--json", *args], capture_output=True, text=True,
                         timeout=timeout)
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


def _machine(load: Optional[str] = None, commit: Optional[str] = None) -> str:
    """One line naming where the figures were taken: date, cores, memory, OS, Slurm, commit, load
    (``load``: what to say of it instead of the load average now; ``commit``: the one a bench recorded)."""
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
    commit = commit or run("git", "-C", str(HERE), "rev-parse", "--short", "HEAD")
    return (f"{datetime.date.today().isoformat()}, {os.cpu_count()} cores / {mem_gib:.0f} GiB, {osname}, "
            f"Slurm {slurm}, commit {commit}, "
            f"{load or f'load average at the end {os.getloadavg()[0]:.1f}'}")


def render_markdown(rows: List[tuple], command: str, machine: str) -> str:
    """The table as docs/benchmarks.md holds it between its markers."""
    lines = [f"`{command}` on {machine}, printed:", "", "| figure | value | target |", "|---|---|---|"]
    lines += [f"| {name} | {value} | {target} |" for name, value, target in rows]
    return "\n".join(lines)


def write_docs(page: Path, block: str, name: str = "run_all") -> None:
    """Replace what lies between the ``name`` markers of ``page`` with ``block``; the rest of the page is kept."""
    begin, end = markers(name)
    text = page.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"run_all: {page} has no '{begin}' ... '{end}' markers to write between")
    head, rest = text.split(begin, 1)
    page.write_text(head + begin + "\n" + block + "\n" + end + rest.split(end, 1)[1])


def _tiers_module():
    """bench_ckpt_tiers.py, whose renderers print its rows (imported late: it pulls in the lab)."""
    import importlib.util

    if str(HERE) not in sys.path:  # its own imports (bench_requeue_resume) come from bench/
        sys.path.insert(0, str(HERE))
    spec = importlib.util.spec_from_file_location("bench_ckpt_tiers", HERE / "bench_ckpt_tiers.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)  # its dataclass looks its module up while it is defined
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _span(values: List[float], unit: str = "") -> str:
    """``a``, or ``a-b`` for a range of figures (unit appended)."""
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return (f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}") + unit


def tiers_rows(doc: dict) -> List[tuple]:
    """The tiers bench's targets as rows of the main table: (figure, value, target)."""
    out = []
    for t in doc.get("targets", []):
        worst = "-" if t["worst"] is None else f"{t['worst']:g} {t['unit']}"
        verdict = "met" if t["met"] else f"not met: {len(t['missed'])} of {t['cases']}"
        out.append((f"checkpoint tiers ({t['cases']} cases): {t['name']}, max", f"{worst} ({verdict})",
                    f"<= {t['limit']:g} {t['unit']}"))
    if "error" in doc:
        out.append(("checkpoint tiers", doc["error"], "-"))
    return out


def render_tiers(doc: dict, machine: str) -> str:
    """The tiers block of docs/benchmarks.md: where and when, then the bench's rows and targets as printed."""
    mod = _tiers_module()
    rows = doc["rows"]
    targets = [mod.Target(**{k: v for k, v in t.items() if k != "met"}) for t in doc["targets"]]
    argv = " ".join(doc.get("argv") or [])
    command = f"python bench/bench_ckpt_tiers.py {argv}".strip()
    aborted = f" (aborted: {doc['aborted']})" if doc.get("aborted") else ""
    lines = [f"`{command}` from {doc['started']} to {doc['ended']} on {machine}, torch "
             f"{doc.get('torch') or 'absent'}; {len(rows)} case(s){aborted}. As printed:", "", "```text"]
    lines += [mod.render_row(r) for r in rows]
    lines += [mod.render_targets(rows, targets), "```"]
    return "\n".join(lines)


def render_tier_costs(doc: dict) -> str:
    """The measured costs of the memory tier as docs/researcher-guide.md states them, from the same run."""
    rows = [r for r in doc["rows"] if not r.get("error")]
    mem = [r for r in rows if r["tier"] == "memory" and r.get("save_ms_p50") is not None]
    p50 = [r["save_ms_p50"] for r in mem]
    p95 = [r["save_ms_p95"] for r in mem]
    state = max((r["state_mb"] for r in mem), default="-")
    shm = [r["memory_per_node_mb"] for r in mem if r.get("memory_per_node_mb")]
    peak = [r["memory_peak_mb"] for r in mem if r.get("memory_peak_mb")]
    other = max((r.get("memory_other_jobs_mb") or 0.0 for r in mem), default=0.0)
    per_mb = [round(r["save_ms_p50"] / r["state_mb"], 1) for r in mem if r.get("state_mb")]

    def lost(trainer: str, path: str, tier: str) -> str:
        return _span([r["lost_steps"] for r in rows if (r["trainer"], r["path"], r["tier"]) == (trainer, path, tier)])

    def resumed(trainer: str, gpu_fault: bool) -> str:  # a GPU fault is signalled; a killed node is not
        return _span([r["fault_to_resumed_s"] for r in rows
                      if (r["trainer"], r["path"], r["tier"]) == (trainer, "hotspare", "memory")
                      and (r["fault"] != "node-killed") == gpu_fault], " s")

    budget_ms = 50.0  # 5 % of a 1 s step (the guide's example): K = ceil(t_save / (budget * t_step))
    k_p50 = math.ceil(max(p50) / budget_ms) if p50 else "-"
    k_p95 = math.ceil(max(p95) / budget_ms) if p95 else "-"
    faults = ", ".join(sorted({r["fault"] for r in rows}))
    lines = [f"Measured by `bench/bench_ckpt_tiers.py` ({doc['started'][:10]}, {len(doc['rows'])} case(s), faults: "
             f"{faults}; load at its start and end: `{doc['uptime_start'].split('load average: ')[-1]}`, "
             f"`{doc['uptime_end'].split('load average: ')[-1]}`; [the rows](benchmarks.md#checkpoint-tiers)):",
             "",
             f"- the torch MLP's state (model + Adam): {state} MB; memory per node with K={doc['k']} and the default "
             f"2 copies (2 x the node's rank + its ring predecessor's), the job's copies read before the fault: "
             f"median {statistics.median(shm) if shm else '-'} MB ({_span(shm, ' MB')} over {len(shm)} runs)"
             + (f"; at the peak, with a save in flight: {max(peak)} MB" if peak else "")
             + (f"; other jobs' copies not yet freed on a node: up to {other} MB" if other else "") + ";",
             f"- time per save of that state: p50 {_span(p50, ' ms')}, p95 {_span(p95, ' ms')} over {len(mem)} "
             f"runs ({_span(per_mb, ' ms')} per MB at p50);",
             f"- K for a 5 % budget with 1 s steps, from the slowest run's p50 / p95: K = {k_p50} / {k_p95};",
             f"- lost steps with a hot spare, memory tier vs durable only (N={doc['n']}): tiny "
             f"{lost('tiny', 'hotspare', 'memory')} vs {lost('tiny', 'hotspare', 'durable')}, torch "
             f"{lost('torch', 'hotspare', 'memory')} vs {lost('torch', 'hotspare', 'durable')}; after a requeue "
             f"with the memory tier: tiny {lost('tiny', 'requeue', 'memory')}, torch "
             f"{lost('torch', 'requeue', 'memory')};",
             f"- fault -> training resumed, hot spare + memory tier, a GPU fault (XID 79, ECC, NVLink): tiny "
             f"{resumed('tiny', True)}, torch {resumed('torch', True)}; a killed node: tiny "
             f"{resumed('tiny', False)}, torch {resumed('torch', False)}."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drills", type=int, default=5, help="drills with the recommended slurm.conf [5]")
    ap.add_argument("--default-drills", type=int, default=5, help="drills with Slurm defaults [5]")
    ap.add_argument("--repeat", type=int, default=20, help="drills in a row in one lab directory [20]")
    ap.add_argument("--quick", action="store_true", help="1 drill per mode, 2 repeated, fewer repetitions")
    ap.add_argument("--write-docs", action="store_true", help=f"write the table into {DOCS.name} too")
    ap.add_argument("--tiers", action="store_true", help="also run the checkpoint-tiers matrix (about an hour)")
    ap.add_argument("--tiers-json", type=Path, metavar="FILE",
                    help="the checkpoint-tiers figures from a saved `bench_ckpt_tiers.py --json` output")
    ap.add_argument("--tiers-only", action="store_true",
                    help="only the checkpoint tiers (with --tiers or --tiers-json)")
    args = ap.parse_args()
    if args.tiers_only and not (args.tiers or args.tiers_json):
        ap.error("--tiers-only needs --tiers or --tiers-json")
    if args.quick:
        args.drills = args.default_drills = 1
        args.repeat = 2
    tiers = None
    if args.tiers_json:
        tiers = json.loads(args.tiers_json.read_text())
    elif args.tiers:
        tiers = _bench_json("bench_ckpt_tiers.py", timeout=3 * 3600)
    rows = [] if args.tiers_only else _rows(args)
    if tiers is not None:
        rows += tiers_rows(tiers)

    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'value':>12}  target")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value!s:>12}  {target}")
    if args.write_docs:
        command = "python bench/run_all.py " + " ".join(sys.argv[1:])
        if not args.tiers_only:
            write_docs(DOCS, render_markdown(rows, command.strip(), _machine()))
        if tiers is not None and "rows" in tiers:
            load = f"`uptime` at its start: `{tiers['uptime_start']}`, at its end: `{tiers['uptime_end']}`"
            write_docs(DOCS, render_tiers(tiers, _machine(load, tiers.get("commit"))), TIERS)
            write_docs(GUIDE, render_tier_costs(tiers), TIERS)
            print(f"written into {GUIDE}")
        print(f"written into {DOCS}")


def _rows(args: argparse.Namespace) -> List[tuple]:
    """Every bench but the checkpoint tiers: (figure, value, target)."""
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
    return rows


if __name__ == "__main__":
    main()
