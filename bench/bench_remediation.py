"""Benchmark of node remediation (issue 7).

1. ``--fleet N`` (default 500) simulated nodes failing at once (in-memory Slurm and Kubernetes behind
   the adapter interfaces, the real reconciler passes):
   - breaker off (limits at 100%, N concurrent): time until every node is cordoned (target <= 10 s;
     NVSentinel reports 55 s for 500);
   - breaker on (2 concurrent, 25%): nothing beyond its limits (started == allowed, none cordoned beyond).
2. ``--lab-runs K`` (default 0: skipped; needs root and Slurm): on a lab with --kube, fault (``lab inject
   --xid 79``) -> replacement Slurm node in service (IDLE, not drained, responding) and -> remediation
   ``done``, medians of K runs (a fresh lab each); also whether the spare responded when ``done`` was
   first seen (it must: issue 17 item 7).

Run: python bench/bench_remediation.py [--fleet 500] [--lab-runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

# the hooks' replace rung: what the sync acts on (the node side owns the decision, issue 22 section 2)
XID79 = "autoheal: replace: xid 79 on GPU 3 of gpu2 (0000:3b:00.0): fallen off the bus"


def fleet(n, breaker_on):
    from sync_helpers import k8s_name, memory_world, sync_cfg

    from autoheal.k8s_sync.engine import Reconciler

    names = [f"n{i:04d}" for i in range(n)]
    slurm, kube = memory_world(names)
    limits = dict(breaker_max_concurrent=2, breaker_max_percent=25.0) if breaker_on else \
        dict(breaker_max_concurrent=100000, breaker_max_percent=100.0, breaker_rearm_percent=100.0)
    cfg = sync_cfg(enabled_steps=["slurm-to-pods", "health-to-nodes", "nodes-to-slurm", "remediate"],
                   replacement_action="custom-resource", **limits)
    rec = Reconciler(slurm, kube, cfg)
    rec.run_pass()  # converged before the storm
    for n_ in names:
        slurm.drain(n_, XID79)
    t0 = time.perf_counter()
    passes = 0
    cordoned = 0
    while passes < 20:
        rec.run_pass()
        passes += 1
        cordoned = sum(1 for x in names if kube.nodes[k8s_name(x)]["spec"].get("unschedulable"))
        if cordoned == n or (breaker_on and passes >= 5):
            break
    seconds = time.perf_counter() - t0
    started = sum(1 for x in names if (kube.nodes[k8s_name(x)]["metadata"].get("annotations") or {})
                  .get("autoheal.io/remediation-state"))
    return {"nodes": n, "breaker": breaker_on, "passes": passes, "seconds": round(seconds, 3),
            "cordoned": cordoned, "started": started, "replacement_requests": len(kube.customs)}


def lab_run():
    from kubernetes import client
    from kubernetes import config as kconfig

    from autoheal_lab import kube as labkube
    from autoheal_lab.cluster import Lab

    root = Path(tempfile.mkdtemp(prefix="bench-remed-"))
    lab = Lab(root)
    lab.up(nodes=2, spares=1, hooks=True, xid_watch=True, install=False, kube=True, spare_delay=1.0)
    try:
        cfg = client.Configuration()
        kconfig.load_kube_config(config_file=str(labkube.kubeconfig_path(lab)), client_configuration=cfg)
        from autoheal.slurm.cli_backend import CliSlurm

        slurm = CliSlurm(slurm_conf=str(lab.layout().slurm_conf), env=lab.slurm_env(), timeout=10)
        core = client.CoreV1Api(client.ApiClient(cfg))
        time.sleep(1.0)  # let the sync leader settle
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "autoheal_lab.cli", "inject", "--dir", str(root), "--node", "gpu1",
                        "--gpu", "3", "--xid", "79"], env=lab.slurm_env(), check=True, capture_output=True,
                       timeout=30)
        deadline = t0 + 120
        out = {}
        while time.monotonic() < deadline and len(out) < 3:
            n = slurm.get_node("spare1")
            serving = not n.drain and n.state == "IDLE" and "NOT_RESPONDING" not in n.flags
            if serving and "in_service" not in out:
                out["in_service"] = time.monotonic() - t0
            if "done" not in out:
                try:
                    st = (core.read_node("gpu1").metadata.annotations or {}).get("autoheal.io/remediation-state")
                except client.ApiException as exc:
                    st = "done" if exc.status == 404 else None  # the spare pool deletes it once done
                if st == "done":
                    out["done"] = time.monotonic() - t0
                    out["responding_at_done"] = serving
            time.sleep(0.1)
        if len(out) < 3:
            raise RuntimeError(f"spare1 never came into service / gpu1 never done: {out}")
        return out
    finally:
        lab.down()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fleet", type=int, default=500)
    p.add_argument("--lab-runs", type=int, default=0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    out = {"breaker_off": fleet(a.fleet, False), "breaker_on": fleet(a.fleet, True)}
    if a.lab_runs:
        runs = [lab_run() for _ in range(a.lab_runs)]
        out["lab_fault_to_spare_in_service_s"] = {"median": round(statistics.median(r["in_service"] for r in runs), 2),
                                                  "runs": [round(r["in_service"], 2) for r in runs]}
        out["lab_fault_to_done_s"] = {"median": round(statistics.median(r["done"] for r in runs), 2),
                                      "runs": [round(r["done"], 2) for r in runs],
                                      "spare_responding_at_done": [r["responding_at_done"] for r in runs]}
    if a.json:
        print(json.dumps(out, indent=2))
        return
    off, on = out["breaker_off"], out["breaker_on"]
    print(f"{off['nodes']} nodes failing at once, breaker off: all {off['cordoned']} cordoned in "
          f"{off['seconds']:.2f}s ({off['passes']} passes; target <= 10 s)")
    print(f"breaker on (2 concurrent, 25%): {on['started']} started, {on['cordoned']} cordoned, "
          f"{on['replacement_requests']} replacement requests after {on['passes']} passes")
    if "lab_fault_to_spare_in_service_s" in out:
        r = out["lab_fault_to_spare_in_service_s"]
        d = out["lab_fault_to_done_s"]
        print(f"lab: xid 79 -> spare in service: median {r['median']}s over {r['runs']}; -> remediation done: "
              f"median {d['median']}s over {d['runs']}; spare responding when done: {d['spare_responding_at_done']}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
