"""The real Kubernetes side of ``bench_sync_http.py``: the lab's control plane (etcd, kube-apiserver,
kube-controller-manager built from Go modules, ``autoheal_lab.controlplane``), N Nodes and N slurmd pods
registered as kubelets would, the sync's Helm chart installed with the real ``helm``, and the sync's
client holding the chart ServiceAccount's token (so every call it makes passes real RBAC).

Seeding runs in a child process (``python kube_world.py --seed ...``), so the bench process, whose RSS is
the sync's, never held the seeding's objects; it registers ``--workers`` nodes at a time (a real fleet's
kubelets register in parallel too): per node create the Node with its Ready status (as a kubelet
registers), drop the not-ready taint the API server's admission put on it (the node-lifecycle
controller's part), create the slurmd pod bound by ``spec.nodeName`` and post its Running status (a
create ignores a pod's status). 4 requests per node.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import subprocess
import sys
import time
import types
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional

NAMESPACE = "slurm"


def node_name(i: int) -> str:
    return f"gpu{i:05d}"


def proc_status(pid: Any = "self") -> Dict[str, float]:
    """VmRSS and VmHWM (peak) of a process, in MB."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out[line.split(":")[0]] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out


def cpu_seconds(pid: Any = "self") -> float:
    """User + system CPU seconds of a process (all its threads)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


# ---- seeding (the child process) -------------------------------------------------------------------------
def _register(api: Any, i: int) -> None:
    from autoheal_lab.kube import node_obj, slurmd_pod
    from autoheal_lab.kubelet import ready_node_status, running_pod_status, without_not_ready_taint

    name = node_name(i)
    node = {**node_obj(name), **ready_node_status()}  # a kubelet registers its Node with its status
    created = api._raw("create_node", api.core.create_node, node)
    api.patch_node(name, without_not_ready_taint(created), "merge")
    pod = slurmd_pod(name)
    pod.pop("status", None)  # a create ignores status: the kubelet posts it
    api._raw("create_pod", api.core.create_namespaced_pod, NAMESPACE, pod)
    api.patch_pod_status(NAMESPACE, pod["metadata"]["name"], running_pod_status(pod))


def seed(kubeconfig: str, n: int, workers: int) -> Dict[str, Any]:
    """Register ``n`` Nodes and slurmd pods, ``workers`` nodes at a time; their figures."""
    from autoheal.k8s_sync.kube import KubeApi, load_client_config

    api = KubeApi(load_client_config(kubeconfig), 30.0, connections=workers + 2)
    t0 = time.perf_counter()
    done = 0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(lambda i: _register(api, i), range(n)):
            done += 1
            if done % 2000 == 0:
                print(f"kube_world: {done}/{n} nodes registered ({time.perf_counter() - t0:.0f} s)",
                      file=sys.stderr, flush=True)
    secs = time.perf_counter() - t0
    return {"seconds": round(secs, 1), "requests": sum(api.calls.values()), "workers": workers,
            "requests_per_second": round(sum(api.calls.values()) / secs, 1), "client_cpu_seconds":
            round(cpu_seconds(), 1)}


# ---- the world (the bench process) ----------------------------------------------------------------------
class RealWorld:
    """The control plane, its N Nodes + N pods, the chart, and the sync's and the bench's clients."""

    transport = "real"

    def __init__(self, n: int, cfg: Any, tmp: str, slurm: Any, workers: int = 16) -> None:
        from autoheal_lab import controlplane
        from autoheal_lab.cluster import _free_ports

        self.slurm = slurm
        root = Path(tmp)
        bindir = controlplane.ensure_binaries(progress=lambda line: print(line, file=sys.stderr, flush=True))
        t0 = time.perf_counter()
        self.cp = controlplane.start(bindir, root / "controlplane", _free_ports(3))
        start_s = time.perf_counter() - t0
        try:
            self._setup(n, cfg, root, bindir, workers, start_s)
        except BaseException:
            self.cp.stop()
            raise

    def _setup(self, n: int, cfg: Any, root: Path, bindir: Path, workers: int, start_s: float) -> None:
        from autoheal.k8s_sync.cli import kube_connections
        from autoheal.k8s_sync.daemon import SyncDaemon
        from autoheal.k8s_sync.kube import KubeApi, load_client_config
        from autoheal_lab import realkube

        self.kubeconfig = str(self.cp.kubeconfig)
        self.reader = KubeApi(load_client_config(self.kubeconfig), cfg.request_timeout_seconds, connections=8)
        core = self.reader.core
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        realkube.wait_default_service_account(self.reader.api_client, NAMESPACE, 60)
        fake_lab = types.SimpleNamespace(root=root)
        (root / "kube").mkdir(exist_ok=True)
        res = realkube.helm(fake_lab, bindir, "install", realkube.RELEASE, str(realkube.CHART), "--namespace",
                            NAMESPACE, "--kubeconfig", self.kubeconfig, "--set", "replicas=0",
                            "--set", "remediation.enabled=false", "--set", "nodesToSlurm=true")
        if res.returncode != 0:
            raise RuntimeError(f"helm install failed: {res.stderr.strip()[-500:]}")
        sync_kc = realkube.write_sync_kubeconfig(fake_lab, self.reader.api_client, self.cp.server, self.cp.ca)
        t1 = time.perf_counter()
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--seed", self.kubeconfig, "--nodes",
                               str(n), "--workers", str(workers)], capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"seeding failed: {proc.stderr.strip()[-1500:]}")
        seeded = json.loads(proc.stdout)
        self.kube = KubeApi(load_client_config(str(sync_kc)), cfg.request_timeout_seconds,
                            connections=kube_connections(cfg))
        self.daemon = SyncDaemon(self.slurm, self.kube, cfg)
        self.setup = {
            "kube_side": (f"real kube-apiserver {self.server_version()} + etcd + kube-controller-manager "
                          f"({self.cp.server}), TLS, RBAC; the sync as the chart's ServiceAccount "
                          f"(helm install), real kubernetes client, list+watch, Lease, "
                          f"api_write_concurrency {cfg.api_write_concurrency}"),
            "objects_loaded_by": (f"a child process registering {workers} nodes at a time as kubelets would "
                                  f"(Node, its status, not-ready taint removed, slurmd pod, its status): "
                                  f"{seeded['requests']} requests in {seeded['seconds']} s "
                                  f"({seeded['requests_per_second']}/s)"),
            "control_plane_start_seconds": round(start_s, 1), "seed_seconds": seeded["seconds"],
            "seed_requests_per_second": seeded["requests_per_second"],
            "setup_seconds": round(time.perf_counter() - t1, 1)}

    # ---- what the bench reads ----------------------------------------------------------------------
    def server_version(self) -> str:
        return str(self._get("/version", json_answer=True).get("gitVersion", "?"))

    def _get(self, path: str, json_answer: bool = False) -> Any:
        pki = self.cp.root / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        with urllib.request.urlopen(self.cp.server + path, timeout=30, context=ctx) as resp:
            data = resp.read().decode()
        return json.loads(data) if json_answer else data

    def requests(self) -> Dict[str, int]:
        return dict(self.kube.calls)

    def _pids(self) -> Dict[str, int]:
        return {r.name: r.pid for r in self.cp.records}

    def server_cpu(self) -> Optional[float]:
        """CPU seconds of kube-apiserver + etcd."""
        pids = self._pids()
        return sum(cpu_seconds(pids[k]) for k in ("kube-apiserver", "etcd"))

    def server_patch_ms(self, since: Optional[Dict[str, float]] = None) -> Any:
        """The API server's own PATCH handling time (apiserver_request_duration_seconds, /metrics): the
        sum and count so far, or, given an earlier reading, the mean per PATCH since then in ms."""
        total, count = 0.0, 0.0
        pat = re.compile(r'^apiserver_request_duration_seconds_(sum|count)\{[^}]*verb="PATCH"[^}]*\} (\S+)$')
        for line in self._get("/metrics").splitlines():
            m = pat.match(line)
            if m:
                if m.group(1) == "sum":
                    total += float(m.group(2))
                else:
                    count += float(m.group(2))
        now = {"sum": total, "count": count}
        if since is None:
            return now
        n = now["count"] - since["count"]
        return round(1000 * (now["sum"] - since["sum"]) / n, 2) if n else None

    def server_list_ms(self) -> Dict[str, float]:
        return {}

    def synced(self) -> bool:
        return bool(self.daemon.nodes_cache and self.daemon.nodes_cache.synced and self.daemon.pods_cache
                    and self.daemon.pods_cache.synced)

    def server_rss(self) -> Dict[str, float]:
        out = {}
        for name, pid in self._pids().items():
            st = proc_status(pid)
            key = name.replace("-", "_")
            out[f"{key}_rss_mb"] = round(st.get("VmRSS", 0), 1)
            out[f"{key}_max_rss_mb"] = round(st.get("VmHWM", 0), 1)
        return out

    def close(self) -> Dict[str, Any]:
        out = self.server_rss()
        self.cp.stop()
        return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="seed a control plane with N Nodes and slurmd pods")
    ap.add_argument("--seed", required=True, metavar="KUBECONFIG")
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--workers", type=int, default=16)
    args = ap.parse_args(argv)
    print(json.dumps(seed(args.seed, args.nodes, args.workers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
