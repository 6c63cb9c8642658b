"""The sync bench's harness at small scale on the real control plane, for correctness only (never timings):
etcd + kube-apiserver + kube-controller-manager built from Go modules, 200 Nodes + 200 slurmd pods
registered as kubelets would, the chart installed with helm, `SyncDaemon` over the real `kubernetes`
client with the chart ServiceAccount's token (list + watch, Lease, Events, the write pool) against an
in-memory Slurm; every health drain must come back through the API as the pod condition, the Node
condition and the taint, and every cordon must drain its Slurm node with autoheal's k8s reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("kubernetes")
BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_sync_http.py"


@pytest.fixture(scope="module")
def toolchain():
    from autoheal_lab import controlplane

    why = controlplane.missing_toolchain()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to build the control plane: {why}")
        pytest.skip(why)
    controlplane.ensure_binaries()


def test_real_api_server_harness_mirrors_every_drain_and_cordon(toolchain):
    proc = subprocess.run([sys.executable, str(BENCH), "--transport", "real", "--nodes", "200", "--drains", "1,20",
                           "--cordons", "5", "--resync", "0.5", "--timeout", "90", "--workers", "4", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    res = json.loads(proc.stdout)["real"]
    assert res["problems"] == []
    assert res["kube_side"].startswith("real kube-apiserver v1.")
    assert res["first_pass_writes"] == 200  # one pod condition write per slurmd pod
    assert res["idle_pass_writes_max"] == 0  # nothing rewritten once in sync
    assert res["drain_1_visible"] == 1 and res["drain_20_visible"] == 20
    # read back with the admin's client after the fact: all 21 drained nodes carry the pod condition (with
    # the node's own reason), GPUHealthy=False (XID79) and the NoSchedule taint; no other Node is tainted
    assert res["readback_drained_total"] == 21 and res["readback_drained_ok"] == 21
    assert res["readback_tainted_nodes"] == 21 and res["readback_untouched_tainted"] == 0
    # every cordon drained its Slurm node with "autoheal: k8s: node cordoned", and stayed cordoned
    assert res["cordons_mirrored"] == 5 and res["readback_cordons_drained_in_slurm"] == 5
    assert res["readback_cordoned_nodes"] == 5
    assert res["total_requests"]["watch_nodes"] >= 1 and res["total_requests"]["list_pods"] >= 1
    # the sync ran as the chart's ServiceAccount: no pass failed on a refused (403) call
    assert res["pass_errors"] == 0, res["pass_error_samples"]
    assert res["kube_apiserver_max_rss_mb"] > 0 and res["etcd_max_rss_mb"] > 0
