"""Benchmark of `autoheal sync` at 10,000 Slurm nodes and 10,000 slurmd pods.

Slurm side: ``MemorySlurm`` (a SlurmAdapter over a dict: one ``list_nodes()`` per pass, as the CLI/REST
backends do). Kubernetes side: ``MemoryKube`` (an in-memory adapter with resourceVersions) read through
watch-cache views, as the daemon reads its informer caches; so the figures are our planning and
bookkeeping cost, not HTTP or slurmctld time. Reported:
- initial convergence (10,000 pod condition writes) wall time,
- full resync CPU time of an idle pass (median of runs),
- API writes per idle resync (target 0),
- one Slurm change -> pod condition latency through the real daemon loop (p50/p95; target p95 <= 2 s),
- RSS (target <= 300 MB).

Run: python bench/bench_sync.py [--nodes 10000] [--samples 20] [--resync 1.0] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import threading
import time
from dataclasses import replace


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class CacheView:
    """What the daemon's informer caches give the reconciler: a synced snapshot, updated by our writes."""

    def __init__(self, store, key=lambda k: k):
        self.store, self.key, self.synced = store, key, True

    def snapshot(self):
        return {self.key(k): v for k, v in self.store.items()}

    def update(self, obj):
        pass  # MemoryKube's store already holds the written object


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--resync", type=float, default=1.0, help="sync.slurm_resync_seconds for the latency run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from autoheal.config.sync_section import SyncSection
    from autoheal.k8s_sync.daemon import SyncDaemon
    from autoheal.k8s_sync.engine import Reconciler
    from autoheal.slurm.model import Node
    from autoheal_lab.testing.kube import MemoryKube
    from autoheal_lab.testing.slurm import MemorySlurm

    rss0 = rss_mb()
    names = [f"gpu{i:05d}" for i in range(args.nodes)]
    slurm = MemorySlurm(Node(n, random.choice(["IDLE", "MIXED", "ALLOCATED"]), frozenset(), "", gres="gpu:8")
                        for n in names)
    kube = MemoryKube()
    labels = {"app.kubernetes.io/component": "slurmd"}
    for n in names:
        kube.add_node(f"k8s-{n}")
        kube.add_pod("slurm", f"slurmd-{n}", f"k8s-{n}", n, labels)
    rss_world = rss_mb()
    cfg = SyncSection(api_writes_per_second=1e6, api_write_burst=10 ** 6, slurm_resync_seconds=args.resync,
                      leader_election=False, events=False)
    nodes_view = CacheView(kube.nodes)
    pods_view = CacheView(kube.pods, key=lambda k: k[1])
    rec = Reconciler(slurm, kube, cfg, nodes_cache=nodes_view, pods_cache=pods_view)

    t0 = time.perf_counter()
    first = rec.run_pass()
    converge_s = time.perf_counter() - t0
    assert first.ok and len(first.applied) == args.nodes, first.summary()

    cpu, writes = [], []
    for _ in range(5):
        w0 = kube.writes
        c0 = time.process_time()
        res = rec.run_pass()
        cpu.append(time.process_time() - c0)
        writes.append(kube.writes - w0)
        assert res.ok
    # a health drain and a cordon on top: steady state stays write-free
    slurm.drain(names[1], "autoheal: xid 79: gpu 0")
    kube.patch_node(f"k8s-{names[2]}", {"spec": {"unschedulable": True}})
    rec.run_pass()
    w0 = kube.writes
    rec.run_pass()
    writes_after_changes = kube.writes - w0

    # latency through the real daemon loop
    daemon = SyncDaemon(slurm, kube, cfg, use_watch=False)
    daemon.reconciler.nodes_cache, daemon.reconciler.pods_cache = nodes_view, pods_view
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    lat = []
    rnd = random.Random(1)
    for i in range(args.samples):
        time.sleep(rnd.uniform(0, args.resync))  # changes land at random points of the resync cycle
        n = names[100 + i]
        with slurm.lock:
            slurm.nodes[n] = replace(slurm.nodes[n], state="DOWN", reason=f"bench {i}")
        start = time.perf_counter()
        deadline = start + 30
        key = ("slurm", f"slurmd-{n}")
        while time.perf_counter() < deadline:
            conds = kube.pods[key]["status"].get("conditions") or []
            if any(c["type"] == "SlurmNodeStateDown" for c in conds):
                break
            time.sleep(0.005)
        lat.append(time.perf_counter() - start)
    daemon.stop()
    thread.join(30)
    lat.sort()
    out = {
        "nodes": args.nodes, "pods": args.nodes, "kube_side": "in-memory adapter (MemoryKube) via cache views",
        "slurm_side": "MemorySlurm (SlurmAdapter)",
        "initial_converge_seconds": round(converge_s, 3), "initial_writes": len(first.applied),
        "idle_resync_cpu_seconds_median": round(statistics.median(cpu), 4),
        "idle_resync_cpu_seconds_max": round(max(cpu), 4),
        "api_writes_per_idle_resync": max(writes), "api_writes_idle_after_drain_and_cordon": writes_after_changes,
        "resync_seconds": args.resync,
        "slurm_change_to_pod_condition_p50_s": round(lat[len(lat) // 2], 3),
        "slurm_change_to_pod_condition_p95_s": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 3),
        "rss_mb_start": round(rss0, 1), "rss_mb_world_built": round(rss_world, 1),
        "rss_mb_end": round(rss_mb(), 1),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:45s} {v}")


if __name__ == "__main__":
    main()
