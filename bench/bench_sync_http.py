"""`autoheal sync` at fleet scale against the real Kubernetes API server, and in memory, side by side.

Both transports run the same scenario against the same in-memory Slurm (``MemorySlurm``, N nodes in
random IDLE/MIXED/ALLOCATED states) with the site's sync settings (leader election and Events on)
except the write rate limits, lifted so that the figures show throughput, not the token bucket (at
the default 20 writes/s the initial 10,000 pod condition writes take 500 s by design); the write pool
(``sync.api_write_concurrency``, ``--concurrency``) stays at its bound:

- ``real``: the lab's real control plane (etcd + kube-apiserver + kube-controller-manager built from Go
  modules, ``kube_world.RealWorld``) on loopback, N Nodes and N slurmd pods registered as kubelets would
  (Node ``gpuNNNNN`` Ready, pod ``slurm/slurmd-gpuNNNNN`` bound by ``spec.nodeName``, Running), the sync's
  Helm chart installed with ``helm``; the sync runs as a site runs it, with the chart ServiceAccount's
  token: ``SyncDaemon`` over ``KubeApi`` (the real ``kubernetes`` client), list + watch informers, the
  Lease. What the sync writes is read back through a second, admin ``KubeApi`` (its own watches, then a
  final list).
- ``memory``: ``MemoryKube`` read through cache views (as ``bench_sync.py``); the watch event that
  wakes the loop after a cordon is simulated (the bench wakes it).

Phases: initial list (real only) and first pass (N pod condition writes); idle reconcile passes; a Slurm
health drain of 1, 100 and 1000 nodes at once -> every drained node's pod condition SlurmNodeStateDrain,
Node condition GPUHealthy=False and NoSchedule taint visible (the mirror never cordons: cordoning is the
remediation step's, off by default and limited by its breaker to 2 nodes at a time); single cordons
(the strategic merge patch ``kubectl cordon`` sends) -> Slurm drain ``autoheal: k8s: node cordoned``
seen in the in-memory Slurm; requests issued; RSS of the sync (this process) and of kube-apiserver and
etcd. A final read-back checks every figure's subject.

Run: python bench/bench_sync_http.py [--nodes 10000] [--transport both|real|memory] [--drains 1,100,1000]
                                     [--cordons 20] [--resync 1.0] [--concurrency 8] [--workers 16] [--json]
``both`` runs each transport in a child process (so each RSS is its own) and prints them side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional

from bench_sync import CacheView  # the in-memory informer view, shared with the in-memory bench
from kube_world import RealWorld, cpu_seconds, proc_status

NAMESPACE = "slurm"
SELECTOR = "app.kubernetes.io/component=slurmd"
TAINT_KEY = "autoheal.io/gpu-unhealthy"
HEALTH = "GPUHealthy"
DRAIN_COND = "SlurmNodeStateDrain"
K8S_PREFIX = "autoheal: k8s: node cordoned"


def reset_peak_rss() -> None:
    """Reset VmHWM (Linux: writing 5 to clear_refs), so the peak excludes building the world."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def node_name(i: int) -> str:
    return f"gpu{i:05d}"


def health_reason(n: str) -> str:
    return f"autoheal: xid 79 on GPU 3 of {n} (0000:3b:00.0): fallen off the bus"


def pct(values: List[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def pod_drained(pod: Optional[Dict[str, Any]], reason: str) -> bool:
    for c in ((pod or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == DRAIN_COND and c.get("status") == "True" and c.get("message") == reason:
            return True
    return False


def node_unhealthy(node: Optional[Dict[str, Any]]) -> bool:
    st = (node or {}).get("status") or {}
    cond = any(c.get("type") == HEALTH and c.get("status") == "False" and c.get("reason") == "XID79"
               for c in st.get("conditions") or [])
    taint = any(t.get("key") == TAINT_KEY and t.get("effect") == "NoSchedule"
                for t in ((node or {}).get("spec") or {}).get("taints") or [])
    return cond and taint


def make_cfg(resync: float, concurrency: int = 8) -> Any:
    from autoheal.config.sync_section import SyncSection

    cfg = SyncSection(api_writes_per_second=10000.0, api_write_burst=100000, slurm_writes_per_second=10000.0,
                      slurm_write_burst=100000, slurm_resync_seconds=resync, metrics_port=0,
                      api_write_concurrency=concurrency)
    cfg.validate()
    return cfg


def make_slurm(n: int) -> Any:
    from autoheal.slurm.model import Node
    from autoheal_lab.testing.slurm import MemorySlurm

    rnd = random.Random(1)
    return MemorySlurm(Node(node_name(i), rnd.choice(["IDLE", "MIXED", "ALLOCATED"]), frozenset(), "", gres="gpu:8")
                       for i in range(n))


class PassLog:
    """Wraps the reconciler's run_pass to record each pass (wall, CPU of the loop thread, writes)."""

    def __init__(self, rec: Any) -> None:
        self.passes: List[Dict[str, Any]] = []
        self.cond = threading.Condition()
        orig = rec.run_pass

        def timed() -> Any:
            w0, c0 = time.perf_counter(), time.thread_time()
            res = orig()
            entry = {"start": w0, "end": time.perf_counter(), "wall": time.perf_counter() - w0,
                     "cpu": time.thread_time() - c0, "applied": len(res.applied), "ok": res.ok, "leader": res.leader,
                     "errors": list(res.errors)[:3], "read_error": res.read_error}
            with self.cond:
                self.passes.append(entry)
                self.cond.notify_all()
            return res

        rec.run_pass = timed

    def wait(self, pred: Callable[[Dict[str, Any]], bool], after: int, timeout: float) -> Optional[int]:
        """Index of the first pass >= ``after`` satisfying ``pred`` (None on timeout)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i in range(after, len(self.passes)):
                    if pred(self.passes[i]):
                        return i
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(min(left, 0.5))


# ---- the two worlds -------------------------------------------------------------------------------
class MemoryWorld:
    transport = "memory"

    def __init__(self, n: int, cfg: Any) -> None:
        from autoheal.k8s_sync.daemon import SyncDaemon
        from autoheal_lab.testing.kube import MemoryKube

        self.slurm = make_slurm(n)
        self.kube = MemoryKube()
        labels = {"app.kubernetes.io/component": "slurmd", "app.kubernetes.io/name": "slurmd"}
        for i in range(n):
            self.kube.add_node(node_name(i))
            self.kube.add_pod(NAMESPACE, f"slurmd-{node_name(i)}", node_name(i), node_name(i), labels)
        self.daemon = SyncDaemon(self.slurm, self.kube, cfg, use_watch=False)
        self.daemon.reconciler.nodes_cache = CacheView(self.kube.nodes)
        self.daemon.reconciler.pods_cache = CacheView(self.kube.pods, key=lambda k: k[1])
        self.setup: Dict[str, Any] = {"kube_side": "MemoryKube (in-memory adapter) via cache views"}
        self._instrument()

    def requests(self) -> Dict[str, int]:
        return {"writes": self.kube.writes}

    def server_cpu(self) -> Optional[float]:
        return None

    def server_patch_ms(self, since: Any = None) -> Optional[float]:
        return None

    def server_list_ms(self) -> Dict[str, float]:
        return {}

    def synced(self) -> bool:
        return True

    def _instrument(self) -> None:
        """Check a watched node right after each write to its pod or Node lands (O(1) per write, in
        the writer's thread): polling 1,000 objects from another thread would take the GIL from the
        sync loop and slow what it measures."""
        self._want: set = set()
        self._seen: Dict[str, float] = {}
        kube = self.kube

        def check(n: str) -> None:
            if n in self._want and n not in self._seen:
                pod = kube.pods.get((NAMESPACE, f"slurmd-{n}"))
                if pod_drained(pod, health_reason(n)) and node_unhealthy(kube.nodes.get(n)):
                    self._seen[n] = time.perf_counter()

        def wrap(method: str, name_of: Callable[..., str]) -> None:
            orig = getattr(kube, method)

            def call(*args: Any, **kwargs: Any) -> Any:
                res = orig(*args, **kwargs)
                check(name_of(*args))
                return res
            setattr(kube, method, call)

        wrap("patch_pod_status", lambda ns, name, *rest: name[len("slurmd-"):])
        wrap("patch_node_status", lambda name, *rest: name)
        wrap("patch_node", lambda name, *rest: name)

    def watch_for(self, names: List[str]) -> Callable[[], Dict[str, float]]:
        self._want, self._seen = set(names), {}
        return lambda: dict(self._seen)

    def cordon(self, n: str) -> None:
        self.kube.patch_node(n, {"spec": {"unschedulable": True}})
        self.daemon._wake.set()  # what the nodes informer's watch event does

    def read_back(self) -> Dict[str, Any]:
        with self.kube.lock:
            pods = {k[1]: v for k, v in self.kube.pods.items()}
            nodes = dict(self.kube.nodes)
        return {"pods": pods, "nodes": nodes}

    def close(self) -> Dict[str, Any]:
        return {}


class HttpWorld(RealWorld):
    """The real control plane (``kube_world.RealWorld``) plus what the scenario reads through the bench's
    own (admin) client: watches of the drained objects, cordons, the final list."""

    def __init__(self, n: int, cfg: Any, tmp: str, workers: int) -> None:
        super().__init__(n, cfg, tmp, make_slurm(n), workers)

    def _current_rv(self) -> str:
        resp = self.reader.core.list_node(limit=1, _preload_content=False, _request_timeout=10)
        return json.loads(resp.data)["metadata"]["resourceVersion"]

    def watch_for(self, names: List[str]) -> Callable[[], Dict[str, float]]:
        """Watch Nodes and slurmd pods through the reader client from now on; a drained node is seen
        once both its pod and its Node show what the sync wrote."""
        want = set(names)
        rv = self._current_rv()
        seen: Dict[str, float] = {}  # node -> perf_counter time both objects were first seen mirrored
        pods: Dict[str, Any] = {}
        nodes: Dict[str, Any] = {}
        lock = threading.Lock()
        stop = threading.Event()

        def check(n: str) -> None:
            if n not in seen and pod_drained(pods.get(n), health_reason(n)) and node_unhealthy(nodes.get(n)):
                seen[n] = time.perf_counter()

        def run(kind: str) -> None:
            cur = rv
            while not stop.is_set() and len(seen) < len(want):
                it = self.reader.watch_pods(NAMESPACE, SELECTOR, cur, 30) if kind == "pods" \
                    else self.reader.watch_nodes(cur, 30)
                for etype, obj in it:
                    meta = obj.get("metadata") or {}
                    cur = meta.get("resourceVersion") or cur
                    name = meta.get("name", "")
                    if kind == "pods":
                        name = ((obj.get("spec") or {}).get("hostname")) or ""
                    if etype in ("ADDED", "MODIFIED") and name in want:
                        with lock:
                            (pods if kind == "pods" else nodes)[name] = obj
                            check(name)
                    if stop.is_set() or len(seen) >= len(want):
                        break

        threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in ("pods", "nodes")]
        for t in threads:
            t.start()

        def poll() -> Dict[str, float]:
            with lock:
                out = dict(seen)
            if len(out) >= len(want):
                stop.set()
            return out
        poll.stop = stop  # type: ignore[attr-defined]
        return poll

    def cordon(self, n: str) -> None:
        # kubectl cordon: a strategic merge patch of spec.unschedulable
        self.reader.patch_node(n, {"spec": {"unschedulable": True}})

    def read_back(self) -> Dict[str, Any]:
        pods, _ = self.reader.list_pods(NAMESPACE, SELECTOR)
        nodes, _ = self.reader.list_nodes()
        return {"pods": pods, "nodes": nodes}


# ---- the scenario ---------------------------------------------------------------------------------
def diff(after: Dict[str, int], before: Dict[str, int]) -> Dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in sorted(after.items()) if v - before.get(k, 0)}


def total(d: Dict[str, int]) -> int:
    return sum(d.values())


def run(transport: str, n: int, drains: List[int], cordons: int, resync: float, idle_passes: int = 5,
        timeout: float = 600.0, concurrency: int = 8, workers: int = 16) -> Dict[str, Any]:
    cfg = make_cfg(resync, concurrency)
    rss0 = proc_status().get("VmRSS", 0)
    tmp = tempfile.mkdtemp(prefix="bench-sync-http-")
    try:
        world: Any = MemoryWorld(n, cfg) if transport == "memory" else HttpWorld(n, cfg, tmp, workers)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    out: Dict[str, Any] = {"transport": transport, "nodes": n, "pods": n, **world.setup}
    reset_peak_rss()  # the peak from here on: the sync daemon, its caches, the in-memory Slurm
    out["load_average_start"] = [round(x, 1) for x in os.getloadavg()]
    daemon = world.daemon
    log = PassLog(daemon.reconciler)
    thread = threading.Thread(target=daemon.run, name="sync-loop", daemon=True)
    problems: List[str] = []
    try:
        req0 = world.requests()
        cpu0, scpu0 = cpu_seconds(), world.server_cpu()
        t0 = time.perf_counter()
        thread.start()
        # ---- initial list and first pass
        while not world.synced() and time.perf_counter() - t0 < timeout:
            time.sleep(0.01)
        out["initial_list_seconds"] = round(time.perf_counter() - t0, 3) if transport == "real" else None
        out["initial_list_server_ms"] = world.server_list_ms()
        first = log.wait(lambda p: p["ok"] and p["leader"], 0, timeout)
        if first is None:
            raise RuntimeError(f"no successful first pass as the leader: {log.passes[-1:] or 'none'}")
        out["passes_before_leading"] = first
        p = log.passes[first]
        out["first_pass_seconds"] = round(p["wall"], 3)
        out["first_pass_writes"] = p["applied"]
        quiet = log.wait(lambda p: p["ok"] and p["applied"] == 0, first + 1, timeout)
        if quiet is None:
            raise RuntimeError("never converged after the first pass")
        out["start_to_converged_seconds"] = round(log.passes[quiet]["start"] - t0, 3)
        out["initial_requests"] = diff(world.requests(), req0)
        out["initial_sync_cpu_seconds"] = round(cpu_seconds() - cpu0, 2)
        if scpu0 is not None:
            out["initial_server_cpu_seconds"] = round(world.server_cpu() - scpu0, 2)
        # ---- steady state
        req1 = world.requests()
        idle_start = len(log.passes)
        last = log.wait(lambda p: True, idle_start + idle_passes - 1, timeout)
        idle = log.passes[idle_start:(last or idle_start) + 1]
        out["idle_pass_wall_seconds_median"] = round(statistics.median(x["wall"] for x in idle), 3)
        out["idle_pass_cpu_seconds_median"] = round(statistics.median(x["cpu"] for x in idle), 3)
        out["idle_pass_writes_max"] = max(x["applied"] for x in idle)
        out["idle_requests_per_pass"] = round(total(diff(world.requests(), req1)) / max(1, len(idle)), 2)
        out["idle_requests"] = diff(world.requests(), req1)
        # ---- Slurm drains of N nodes at once -> pod condition + Node condition and taint
        base = 100
        rnd = random.Random(2)
        drained: List[str] = []
        for count in drains:
            names = [node_name(i) for i in range(base, base + count)]
            base += count
            poll = world.watch_for(names)
            time.sleep(rnd.uniform(0, resync))  # the drain lands at a random point of the resync cycle
            reqd = world.requests()
            cpud, scpud = cpu_seconds(), world.server_cpu()
            patch0 = world.server_patch_ms()
            start = time.perf_counter()
            with world.slurm.lock:  # all at once, as one Slurm read sees them
                for name in names:
                    node = world.slurm.nodes[name]
                    world.slurm.nodes[name] = replace(node, flags=node.flags | {"DRAIN"}, reason=health_reason(name))
            seen: Dict[str, float] = {}
            while time.perf_counter() - start < timeout:
                seen = poll()
                if len(seen) >= count:
                    break
                time.sleep(0.005)
            stop = getattr(poll, "stop", None)
            if stop is not None:
                stop.set()
            lat = [t - start for t in seen.values()]
            drained += names
            out[f"drain_{count}_all_visible_seconds"] = round(max(lat), 3) if len(lat) == count else None
            out[f"drain_{count}_p50_seconds"] = round(pct(lat, 0.5), 3) if lat else None
            out[f"drain_{count}_visible"] = len(lat)
            if len(lat) < count:
                problems.append(f"drain of {count}: only {len(lat)} visible within {timeout:.0f}s")
            log.wait(lambda p: p["ok"] and p["applied"] == 0, len(log.passes), timeout)
            out[f"drain_{count}_requests"] = total(diff(world.requests(), reqd))  # until a quiet pass
            out[f"drain_{count}_sync_cpu_seconds"] = round(cpu_seconds() - cpud, 2)
            if scpud is not None:
                out[f"drain_{count}_server_cpu_seconds"] = round(world.server_cpu() - scpud, 2)
                out[f"drain_{count}_server_patch_ms_mean"] = world.server_patch_ms(patch0)
        # ---- cordons -> Slurm drains
        lat = []
        reqc = world.requests()
        cordoned = []
        for i in range(cordons):
            name = node_name(base + i)
            time.sleep(rnd.uniform(0, resync))  # at a random point of the resync cycle
            start = time.perf_counter()
            world.cordon(name)
            while time.perf_counter() - start < 60:
                node = world.slurm.nodes[name]
                if "DRAIN" in node.flags and node.reason.startswith(K8S_PREFIX):
                    lat.append(time.perf_counter() - start)
                    break
                time.sleep(0.001)
            cordoned.append(name)
        out["cordon_to_slurm_drain_p50_seconds"] = round(pct(lat, 0.5), 3) if lat else None
        out["cordon_to_slurm_drain_p95_seconds"] = round(pct(lat, 0.95), 3) if lat else None
        out["cordons_mirrored"] = len(lat)
        log.wait(lambda p: p["ok"] and p["applied"] == 0, len(log.passes), timeout)
        out["cordon_requests"] = diff(world.requests(), reqc)
        st = proc_status()
        out["sync_process_rss_mb"] = round(st.get("VmRSS", 0), 1)
        out["sync_process_peak_rss_mb"] = round(st.get("VmHWM", 0), 1)
        # ---- read back everything through the client
        back = world.read_back()
        bad = [n for n in drained
               if not (pod_drained(back["pods"].get(f"slurmd-{n}"), health_reason(n))
                       and node_unhealthy(back["nodes"].get(n)))]
        tainted = sorted(k for k, v in back["nodes"].items()
                         if any(t.get("key") == TAINT_KEY for t in (v.get("spec") or {}).get("taints") or []))
        out["readback_drained_ok"] = len(drained) - len(bad)
        out["readback_drained_total"] = len(drained)
        out["readback_tainted_nodes"] = len(tainted)
        out["readback_untouched_tainted"] = len(set(tainted) - set(drained))
        slurm_bad = [n for n in cordoned if not (world.slurm.nodes[n].reason.startswith(K8S_PREFIX))]
        out["readback_cordons_drained_in_slurm"] = len(cordoned) - len(slurm_bad)
        out["readback_cordoned_nodes"] = sum(1 for n in cordoned
                                             if ((back["nodes"].get(n) or {}).get("spec") or {}).get("unschedulable"))
        out["total_requests"] = diff(world.requests(), req0)
        out["passes"] = len(log.passes)
        out["relists"] = {c.kind: c.relists for c in (daemon.nodes_cache, daemon.pods_cache) if c is not None}
        out["pass_errors"] = sum(1 for p in log.passes if p["errors"] or not p["ok"])
        out["first_passes"] = [{k: x[k] for k in ("ok", "leader", "applied", "errors", "read_error")}
                               for x in log.passes[:3]]
        out["pass_error_samples"] = [p["errors"] or [p["read_error"]] for p in log.passes
                                     if p["errors"] or not p["ok"]][:3]
        if bad:
            problems.append(f"{len(bad)} drained nodes not mirrored, e.g. {bad[:3]}")
    finally:
        daemon.stop()
        thread.join(30)
        out.update(world.close())
        shutil.rmtree(tmp, ignore_errors=True)
        out["sync_process_rss_mb_start"] = round(rss0, 1)
        out["load_average_end"] = [round(x, 1) for x in os.getloadavg()]
    out["problems"] = problems
    return out


# ---- output ---------------------------------------------------------------------------------------
ROWS = [
    ("initial list of Nodes + pods (informers synced)", "initial_list_seconds", "s"),
    ("first pass: pod condition writes", "first_pass_writes", ""),
    ("first pass wall time", "first_pass_seconds", "s"),
    ("start -> converged (first quiet pass begins)", "start_to_converged_seconds", "s"),
    ("  CPU: sync process / API server process", "initial_cpu", ""),
    ("idle reconcile pass, wall (median)", "idle_pass_wall_seconds_median", "s"),
    ("idle reconcile pass, CPU of the loop thread (median)", "idle_pass_cpu_seconds_median", "s"),
    ("writes per idle pass (max)", "idle_pass_writes_max", ""),
    ("API requests per idle pass", "idle_requests_per_pass", ""),
]


def rows_for(drains: List[int]) -> List[Any]:
    rows = list(ROWS)
    for c in drains:
        rows += [(f"Slurm drain of {c} -> pod condition + Node condition/taint, all visible",
                  f"drain_{c}_all_visible_seconds", "s"),
                 (f"  same, p50 over the {c} nodes", f"drain_{c}_p50_seconds", "s"),
                 ("  requests the sync issued for it (until a quiet pass)", f"drain_{c}_requests", ""),
                 ("  CPU: sync process / API server process", f"drain_{c}_cpu", ""),
                 ("  API server's own time per PATCH (mean, its /metrics)", f"drain_{c}_server_patch_ms_mean",
                  "ms")]
    rows += [("cordon -> Slurm drain p50", "cordon_to_slurm_drain_p50_seconds", "s"),
             ("cordon -> Slurm drain p95", "cordon_to_slurm_drain_p95_seconds", "s"),
             ("cordons mirrored to Slurm", "cordons_mirrored", ""),
             ("read back: drained nodes mirrored / drained", "readback", ""),
             ("sync process peak RSS (daemon, caches, in-memory Slurm; world built before)",
              "sync_process_peak_rss_mb", "MB"),
             ("sync process RSS at the end (before the read-back)", "sync_process_rss_mb", "MB"),
             ("kube-apiserver max RSS / at the end", "apiserver_rss", "MB"),
             ("etcd max RSS / at the end", "etcd_rss", "MB")]
    return rows


def fmt(res: Optional[Dict[str, Any]], key: str, unit: str) -> str:
    if res is None:
        return "-"
    if key.endswith("_cpu"):
        sync = res.get(key.replace("_cpu", "_sync_cpu_seconds"))
        server = res.get(key.replace("_cpu", "_server_cpu_seconds"))
        return f"{sync} s" + (f" / {server} s" if server is not None else "")
    if key in ("apiserver_rss", "etcd_rss"):
        name = "kube_apiserver" if key == "apiserver_rss" else "etcd"
        return f"{res.get(name + '_max_rss_mb')} / {res.get(name + '_rss_mb')} MB" if name + "_rss_mb" in res else "-"
    if key == "readback":
        return f"{res.get('readback_drained_ok')}/{res.get('readback_drained_total')}"
    v = res.get(key)
    if v is None:
        return "n/a"
    return f"{v} {unit}".strip()


def table(results: Dict[str, Dict[str, Any]], drains: List[int]) -> str:
    mem, http = results.get("memory"), results.get("real")
    n = (http or mem or {}).get("nodes", 0)
    lines = [f"| figure at {n:,} nodes + {n:,} pods | in memory | real API server |", "|---|---|---|"]
    for label, key, unit in rows_for(drains):
        lines.append(f"| {label} | {fmt(mem, key, unit)} | {fmt(http, key, unit)} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--transport", choices=("both", "real", "memory"), default="both")
    ap.add_argument("--drains", default="1,100,1000", help="comma-separated sizes of simultaneous Slurm drains")
    ap.add_argument("--cordons", type=int, default=20, help="single cordons to time")
    ap.add_argument("--resync", type=float, default=1.0, help="sync.slurm_resync_seconds")
    ap.add_argument("--timeout", type=float, default=600.0, help="bound of every wait (seconds)")
    ap.add_argument("--concurrency", type=int, default=8, help="sync.api_write_concurrency (the write pool)")
    ap.add_argument("--workers", type=int, default=16, help="nodes registered at a time when seeding")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    drains = [int(x) for x in args.drains.split(",") if x.strip()]
    if any(c < 1 for c in drains) or args.nodes < 100 + sum(drains) + args.cordons:
        ap.error("--nodes too small for the drains and cordons asked for")
    results: Dict[str, Dict[str, Any]] = {}
    if args.transport == "both":
        for transport in ("memory", "real"):
            argv = [sys.executable, os.path.abspath(__file__), "--transport", transport, "--nodes", str(args.nodes),
                    "--drains", args.drains, "--cordons", str(args.cordons), "--resync", str(args.resync),
                    "--timeout", str(args.timeout), "--concurrency", str(args.concurrency), "--workers",
                    str(args.workers), "--json"]
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout * 6)
            if proc.returncode not in (0, 1) or not proc.stdout.strip():
                print(proc.stderr[-3000:], file=sys.stderr)
                return 1
            results[transport] = json.loads(proc.stdout)[transport]
    else:
        results[args.transport] = run(args.transport, args.nodes, drains, args.cordons, args.resync,
                                      timeout=args.timeout, concurrency=args.concurrency, workers=args.workers)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(table(results, drains))
        for t, res in results.items():
            print(f"\n{t}: {res.get('kube_side')}")
            for k in ("objects_loaded_by", "control_plane_start_seconds", "setup_seconds",
                      "kube_controller_manager_max_rss_mb"):
                if k in res:
                    print(f"  {k}: {res[k]}")
            if res.get("initial_list_server_ms"):
                print(f"  server time answering the initial lists (ms): {res['initial_list_server_ms']}")
            print(f"  requests, initial: {res.get('initial_requests')}")
            print(f"  requests, idle passes: {res.get('idle_requests')}")
            print(f"  requests, cordons: {res.get('cordon_requests')}")
            print(f"  relists: {res.get('relists')}, passes: {res.get('passes')}, passes with errors: "
                  f"{res.get('pass_errors')}, nodes tainted: {res.get('readback_tainted_nodes')} "
                  f"(not drained: {res.get('readback_untouched_tainted')})")
            for errs in res.get("pass_error_samples") or []:
                print(f"  pass with errors: {errs}")
            print(f"  load average at start / end: {res.get('load_average_start')} / {res.get('load_average_end')}")
            for p in res.get("problems") or []:
                print(f"  PROBLEM: {p}")
    return 1 if any(r.get("problems") for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
