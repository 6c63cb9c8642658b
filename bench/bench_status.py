"""Benchmark of `autoheal status` against an in-memory 10,000-node fleet (target: under 2 s).

Slurm: ``MemorySlurm`` with ``--nodes`` nodes (``--drained`` of them drained by autoheal, 1 % by an admin)
and a job per ten nodes; Kubernetes: ``MemoryKube`` with a Node per Slurm node, remediation annotations on
the drained ones, the leader Lease and the breaker ConfigMap; the journal: a real file with ``--records``
records of the last hour; xid-watch heartbeats: a real textfile per node in a temporary folder (what
status reads without --prometheus). Timed: gather (every source) + build + render, the whole command's
work minus process start and imports (measured separately: `python -m autoheal.cli.main status --help`).
The figures are autoheal's own cost, not slurmctld's or the API server's.

Run: python bench/bench_status.py [--nodes 10000] [--drained 300] [--records 2000] [--runs 5] [--json]
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


def build_world(root: Path, n: int, drained: int, records: int):
    from autoheal.config import parse_config
    from autoheal.journal import Journal
    from autoheal.slurm.model import Job, Node
    from autoheal_lab.testing.kube import MemoryKube
    from autoheal_lab.testing.slurm import MemorySlurm

    now = time.time()
    nodes, jobs = [], []
    for i in range(n):
        name = f"gpu{i:05d}"
        if i < drained:
            nodes.append(Node(name, "IDLE", frozenset({"DRAIN"}), reason=f"autoheal: replace: xid 79 on GPU 0 of "
                              f"{name} (0000:1b:00.0): fallen off the bus", reason_time=int(now - 600)))
        elif i % 100 == 99:
            nodes.append(Node(name, "IDLE", frozenset({"DRAIN"}), reason="maintenance"))
        else:
            nodes.append(Node(name, "ALLOCATED" if i % 2 else "IDLE"))
        if i % 10 == 0:
            jobs.append(Job(str(1000 + i), "RUNNING", nodes=(name,)))
    slurm = MemorySlurm(nodes, jobs)
    kube = MemoryKube()
    for node in nodes:
        kube.add_node(node.name)
    for node in nodes[:drained]:
        kube.nodes[node.name]["metadata"]["annotations"].update({
            "autoheal.io/remediation-state": "replacing", "autoheal.io/remediation-since": str(int(now - 300)),
            "autoheal.io/remediation-slurm-node": node.name})
    kube.leases[("slurm", "autoheal-sync")] = {"metadata": {"name": "autoheal-sync"}, "spec": {
        "holderIdentity": "sync_1", "leaseDurationSeconds": 15,
        "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(now))}}
    journal = Journal(root / "journal.jsonl", fsync=False)
    for i in range(records):
        journal.record("requeue", node=nodes[i % n].name, job_ids=[str(1000 + 10 * (i % (n // 10)))],
                       outcome="requeued", message="bench", time=now - 3000 + i)
    tf = root / "tf"
    for node in nodes:
        d = tf / node.name
        d.mkdir(parents=True)
        (d / "autoheal_xid_watch.prom").write_text(
            f'autoheal_xid_watch_up{{node="{node.name}"}} 1\n'
            f'autoheal_xid_watch_heartbeat_timestamp_seconds{{node="{node.name}"}} {now:.3f}\n')
    guard = root / "guard"
    guard.mkdir()
    (guard / "autoheal_guard.prom").write_text(f"autoheal_guard_up 1\nautoheal_guard_heartbeat_timestamp_seconds "
                                               f"{now:.3f}\n")
    cfg = parse_config(f'[journal]\npath = "{root / "journal.jsonl"}"\n[hooks]\ntextfile_dir = "{tf}/{{node}}"\n')
    return cfg, slurm, kube, journal, str(guard)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--drained", type=int, default=300)
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from autoheal.cli import status_cmd as SC
    from autoheal.cli.status_model import build, render

    with tempfile.TemporaryDirectory() as tmp:
        cfg, slurm, kube, journal, guard = build_world(Path(tmp), args.nodes, args.drained, args.records)
        walls, text_len, problems = [], 0, -1
        for _ in range(args.runs):
            t = time.perf_counter()
            rep = build(SC.gather(cfg, slurm, kube, journal, None, guard))
            text = render(rep)
            walls.append(time.perf_counter() - t)
            text_len, problems = len(text.splitlines()), len(rep.problems)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autoheal.cli.main", "status", "--help"], capture_output=True, timeout=60)
    startup = time.perf_counter() - t
    out = {"nodes": args.nodes, "drained": args.drained, "records": args.records, "runs": args.runs,
           "wall_median_s": round(statistics.median(walls), 3), "wall_max_s": round(max(walls), 3),
           "process_start_s": round(startup, 3), "screen_lines": text_len, "problems": problems}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"autoheal status, in-memory fleet of {args.nodes} nodes ({args.drained} drained by autoheal, "
              f"{args.records} journal records): median {out['wall_median_s']}s, max {out['wall_max_s']}s over "
              f"{args.runs} runs (+ {out['process_start_s']}s process start and imports); {text_len} screen lines, "
              f"{problems} problems")


if __name__ == "__main__":
    main()
