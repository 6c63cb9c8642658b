"""Benchmark of `autoheal sync` leader failover (issue 17 item 5).

Two SyncDaemon replicas (watch caches, Lease election, the real Kubernetes client) against the lab's real
control plane (etcd + kube-apiserver + kube-controller-manager, ``autoheal_lab.controlplane``, built once per
machine), real coordination.k8s.io/v1 Leases, Slurm in memory. The leader is stopped without releasing the Lease (what a
SIGKILL or a lost machine does to the Lease) and a Slurm change is made at that instant; measured:

- ``takeover``: crash -> the other replica holds the Lease;
- ``first write``: crash -> the other replica has written the change (the taint on the Node).

Modes: ``after-renew`` crashes right after a renewal (the worst case: the whole lease must run out),
``random`` at a random point of the renew period, ``release`` is a clean shutdown (the Lease is handed
over). The bound (docs/platform-guide.md): lease duration after the last renewal, plus a poll's round
trips, plus the first pass. Prints figures; asserts nothing.

Run: python bench/bench_failover.py [--durations 2 5] [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

HEALTH = "autoheal: xid 79: gpu 3 fell off the bus"
NODES = ["n1", "n2", "n3", "n4"]


def _wait(pred, timeout: float, step: float = 0.005) -> float:
    """Poll ``pred``; the monotonic time it first held (raises after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return time.monotonic()
        time.sleep(step)
    raise TimeoutError("condition not reached")


def one_run(server, kubeconfig: str, duration: float, mode: str, run: int) -> dict:
    from sync_helpers import k8s_name, sync_cfg

    from autoheal.k8s_sync.daemon import SyncDaemon
    from autoheal.k8s_sync.kube import KubeApi
    from autoheal.slurm.model import Node
    from autoheal_lab.testing.slurm import MemorySlurm

    slurm = MemorySlurm(Node(n, "IDLE", frozenset(), "", gres="gpu:8") for n in NODES)
    cfg = sync_cfg(lease_duration_seconds=duration, slurm_resync_seconds=0.5,
                   lease_name=f"bench-{mode}-{duration:g}-{run}")
    daemons = [SyncDaemon(slurm, KubeApi.from_settings(kubeconfig, timeout=5.0), cfg, ident=f"r{i}")
               for i in (1, 2)]
    threads = [threading.Thread(target=d.run, daemon=True) for d in daemons]
    d1, d2 = daemons
    target = k8s_name(NODES[run % len(NODES)])
    probe = KubeApi.from_settings(kubeconfig, timeout=5.0)

    def tainted() -> bool:
        nodes, _ = probe.list_nodes()
        return any(t.get("key") == "autoheal.io/gpu-unhealthy" for t in
                   ((nodes.get(target) or {}).get("spec") or {}).get("taints") or [])

    try:
        threads[0].start()
        _wait(lambda: d1.elector.is_leader(), 20)
        threads[1].start()
        _wait(lambda: d2.passes >= 2, 20)
        if mode == "after-renew":
            renewed = d1.elector._renewed_at
            _wait(lambda: d1.elector._renewed_at != renewed, 2 * duration)
        elif mode == "random":
            time.sleep(random.uniform(0, duration / 3))
        d1.release_on_stop = mode == "release"
        d1.stop()
        crashed = time.monotonic()
        slurm.drain(target.replace("k8s-", ""), HEALTH)
        threads[0].join(10)
        lead = _wait(lambda: d2.elector.is_leader(), 4 * duration + 10, 0.002)
        wrote = _wait(tainted, 4 * duration + 10, 0.01)
        return {"takeover": lead - crashed, "first_write": wrote - crashed}
    finally:
        for d in daemons:
            d.stop()
        for t in threads:
            if t.is_alive():
                t.join(10)
        slurm.resume(target.replace("k8s-", ""))


def summarise(rows):
    out = {}
    for key in ("takeover", "first_write"):
        vals = sorted(r[key] for r in rows)
        out[key] = {"min": round(vals[0], 2), "median": round(statistics.median(vals), 2),
                    "max": round(vals[-1], 2)}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--durations", type=float, nargs="+", default=[2.0, 5.0], help="lease durations (s)")
    p.add_argument("--runs", type=int, default=5, help="runs per duration and mode")
    p.add_argument("--modes", nargs="+", default=["after-renew", "random", "release"],
                   choices=["after-renew", "random", "release"])
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    from sync_helpers import seed_fake_api

    from autoheal_lab import controlplane
    from autoheal_lab.testing.realkube import RealKube

    why = controlplane.missing_toolchain()
    if why:
        print(f"bench_failover: {why}", file=sys.stderr)
        return 2
    results = []
    tmp = Path(tempfile.mkdtemp(prefix="autoheal-bench-failover-"))
    server = RealKube.start(tmp / "controlplane")
    try:
        kc = server.write_kubeconfig(str(tmp / "kubeconfig"))
        seed_fake_api(server, NODES)
        server_version = server.api_client().call_api("GET", f"{server.url}/version").read().decode()
        server_version = json.loads(server_version).get("gitVersion", "")
        if not args.json:
            print(f"kube-apiserver {server_version} (real control plane, {tmp})", flush=True)
        for duration in args.durations:
            for mode in args.modes:
                rows = [one_run(server, kc, duration, mode, i) for i in range(args.runs)]
                results.append({"lease_duration": duration, "mode": mode, "runs": len(rows), **summarise(rows)})
                if not args.json:
                    s = results[-1]
                    print(f"lease {duration:>4g}s  {mode:<11}  takeover min/median/max "
                          f"{s['takeover']['min']:.2f}/{s['takeover']['median']:.2f}/{s['takeover']['max']:.2f}s  "
                          f"first write {s['first_write']['min']:.2f}/{s['first_write']['median']:.2f}/"
                          f"{s['first_write']['max']:.2f}s  (n={len(rows)})", flush=True)
    finally:
        server.stop()
    if args.json:
        print(json.dumps({"failover": results, "server": server_version}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
