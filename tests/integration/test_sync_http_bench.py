"""The HTTP sync bench's harness at small scale, for correctness only (never timings): the lab's fake
API server process seeded with 200 Nodes + 200 slurmd pods, `SyncDaemon` over the real `kubernetes`
client (list + watch, Lease, Events) against an in-memory Slurm; every health drain must come back
through the API as the pod condition, the Node condition and the taint, and every cordon must drain
its Slurm node with autoheal's k8s reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("kubernetes")
BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_sync_http.py"


def test_http_harness_mirrors_every_drain_and_cordon():
    proc = subprocess.run([sys.executable, str(BENCH), "--transport", "http", "--nodes", "200", "--drains", "1,20",
                           "--cordons", "5", "--resync", "0.5", "--timeout", "60", "--json"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    res = json.loads(proc.stdout)["http"]
    assert res["problems"] == []
    assert res["first_pass_writes"] == 200  # one pod condition write per slurmd pod
    assert res["idle_pass_writes_max"] == 0  # nothing rewritten once in sync
    assert res["drain_1_visible"] == 1 and res["drain_20_visible"] == 20
    # read back with the client after the fact: all 21 drained nodes carry the pod condition (with the
    # node's own reason), GPUHealthy=False (XID79) and the NoSchedule taint; no other Node is tainted
    assert res["readback_drained_total"] == 21 and res["readback_drained_ok"] == 21
    assert res["readback_tainted_nodes"] == 21 and res["readback_untouched_tainted"] == 0
    # every cordon drained its Slurm node with "autoheal: k8s: node cordoned", and stayed cordoned
    assert res["cordons_mirrored"] == 5 and res["readback_cordons_drained_in_slurm"] == 5
    assert res["readback_cordoned_nodes"] == 5
    assert res["total_requests"]["watch_nodes"] >= 1 and res["total_requests"]["list_pods"] >= 1
