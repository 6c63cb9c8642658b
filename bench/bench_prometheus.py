"""Benchmark: fault -> firing alert on the lab with a real Prometheus, its and node-exporter's memory, and
`autoheal status` wall time on the lab.

A lab of ``--nodes`` GPU nodes, no spare (a node to replace stays drained, so nothing races the alert), the
Kubernetes side, and ``autoheal_lab.prometheus`` (Debian's prometheus + one prometheus-node-exporter per
node and one for the guard). Intervals: scrape 1 s, rule evaluation 1 s, every rule's ``for:`` 2 s (the
product's expressions and thresholds unchanged; AutohealXidWatchDown waits for a 30 s-old heartbeat by
design). Faults, in order: XID 79 on gpu1 (AutohealFleetDrainedShareHigh), SIGKILL of xid-watch on gpu2
(AutohealXidWatchDown), XID 79 on gpu3 (AutohealBreakerTripped). Latency = fault injected -> the alert
seen firing through /api/v1/alerts (polled every 0.2 s). RSS read from /proc at the end.

Run (root, Slurm installed): python bench/bench_prometheus.py [--nodes 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def wait(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise SystemExit(f"timed out after {timeout}s waiting for {what}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from autoheal_lab import prometheus as labprom
    from autoheal_lab.cluster import Lab

    root = Path(tempfile.mkdtemp(prefix="bench-prom-"))
    lab = Lab(root)
    out = {"nodes": args.nodes, "scrape_interval": labprom.SCRAPE_INTERVAL,
           "evaluation_interval": labprom.EVAL_INTERVAL, "for": labprom.LAB_FOR}
    try:
        lab.up(nodes=args.nodes, spares=0, kube=True, install=False)
        env = lab.slurm_env()
        base = labprom.start(lab)
        wait(lambda: len(labprom.query(base, "autoheal_xid_watch_heartbeat_timestamp_seconds")) == args.nodes, 30,
             "xid-watch heartbeats")
        wait(lambda: labprom.query(base, "autoheal_sync_fleet_nodes"), 30, "the sync's metrics")

        def inject(node):
            subprocess.run([sys.executable, "-m", "autoheal_lab.cli", "inject", "--dir", str(root), "--node", node,
                            "--gpu", "0", "--xid", "79"], env=env, capture_output=True, timeout=30, check=True)

        def timed(alert, fault, **labels):
            t = time.time()
            fault()
            wait(lambda: [a for a in labprom.firing(base, alert)
                          if all(a["labels"].get(k) == v for k, v in labels.items())], 120, alert)
            return round(time.time() - t, 1)

        out["drained_share_alert_s"] = timed("AutohealFleetDrainedShareHigh", lambda: inject("gpu1"))
        rec = lab.records()["xid-watch-gpu2"]
        t_kill = time.time()
        os.kill(rec.pid, signal.SIGKILL)
        out["breaker_alert_s"] = timed("AutohealBreakerTripped", lambda: inject(f"gpu{args.nodes}"))
        wait(lambda: [a for a in labprom.firing(base, "AutohealXidWatchDown") if a["labels"].get("node") == "gpu2"],
             120, "AutohealXidWatchDown")
        out["xid_watch_killed_alert_s"] = round(time.time() - t_kill, 1)
        rss = labprom.rss_kib(lab)
        out["prometheus_rss_mb"] = round(rss.get(labprom.PROM_PROC, 0) / 1024, 1)
        exp = [v for k, v in rss.items() if k.startswith("node-exporter-")]
        out["node_exporter_rss_mb_each"] = round(max(exp) / 1024, 1) if exp else 0
        out["node_exporters"] = len(exp)
        t = time.monotonic()
        subprocess.run([sys.executable, "-m", "autoheal.cli.main", "status", "--json", "--prometheus", base],
                       env=env, capture_output=True, timeout=120)
        out["status_wall_s"] = round(time.monotonic() - t, 2)
    finally:
        lab.down()
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"lab of {args.nodes} nodes; scrape {out['scrape_interval']}, evaluation {out['evaluation_interval']}, "
              f"for: {out['for']}")
        print(f"  XID 79 -> AutohealFleetDrainedShareHigh firing: {out['drained_share_alert_s']}s")
        print(f"  second XID 79 -> AutohealBreakerTripped firing: {out['breaker_alert_s']}s")
        print(f"  xid-watch SIGKILL -> AutohealXidWatchDown firing: {out['xid_watch_killed_alert_s']}s "
              f"(30 s heartbeat threshold by design)")
        print(f"  RSS: prometheus {out['prometheus_rss_mb']} MB, node-exporter {out['node_exporter_rss_mb_each']} MB "
              f"each (x{out['node_exporters']}, textfile collector only)")
        print(f"  autoheal status --json --prometheus on the lab: {out['status_wall_s']}s wall")


if __name__ == "__main__":
    main()
