"""A real Prometheus on the lab (issue 26): it scrapes the sync's /metrics and a node-exporter per node
(xid-watch's textfile) and the guard's, evaluates the product's alert rules (``for:`` shortened to
seconds, expressions unchanged), and the faults driven here show up as firing alerts read from its HTTP
API: a node drained by autoheal (XID 79), xid-watch killed (SIGKILL: only its stale heartbeat tells),
the breaker tripped by a second replace-class fault. Then every dashboard panel's PromQL returns data,
and `autoheal status` reads the same lab.

The lab has no spare (spares=0): a node to replace stays drained by autoheal, waiting, so an alert that
needs a few seconds is not raced by a fast replacement."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("kubernetes")
pytest.importorskip("yaml")

from helpers import wait_for

from autoheal.lab import procs
from autoheal.lab import prometheus as labprom


def _need_prometheus():
    missing = [b for b in ("prometheus", "prometheus-node-exporter") if not shutil.which(b)]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI must install {' '.join(missing)} (./dev test does)")
        pytest.skip(f"{', '.join(missing)} not installed (apt-get install prometheus prometheus-node-exporter)")


@pytest.fixture(scope="module")
def prom_lab(tmp_path_factory):
    _need_prometheus()
    from conftest import _start

    handle = _start(tmp_path_factory.mktemp("promlab"), nodes=3, spares=0, hooks=True, xid_watch=True, kube=True)
    try:
        handle.prom = labprom.start(handle.lab)
        handle.faults = {}
        yield handle
    finally:
        handle.lab.down()


def inject_xid(handle, node, xid=79, gpu=0):
    out = subprocess.run([sys.executable, "-m", "autoheal.lab.cli", "inject", "--dir", str(handle.lab.root),
                          "--node", node, "--gpu", str(gpu), "--xid", str(xid)], env=handle.env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def wait_firing(base, alert, timeout, **labels):
    def found():
        return [a for a in labprom.firing(base, alert)
                if all(a["labels"].get(k) == v for k, v in labels.items())]
    return wait_for(found, timeout, f"{alert} {labels} firing", step=0.2)


def test_faults_on_the_lab_fire_their_alerts(prom_lab):
    base, lab = prom_lab.prom, prom_lab.lab
    # every target answers, and a healthy lab pages nobody
    wait_for(lambda: (lambda t: len(t) == 5 and all(x["health"] == "up" for x in t))(
        labprom.api(base, "targets")["activeTargets"]), 30, "5 targets up (sync, 3 nodes, controller)")
    wait_for(lambda: labprom.query(base, "autoheal_guard_heartbeat_timestamp_seconds"), 20, "the guard's heartbeat")
    wait_for(lambda: len(labprom.query(base, "autoheal_xid_watch_heartbeat_timestamp_seconds")) == 3, 20,
             "3 xid-watch heartbeats")
    wait_for(lambda: labprom.query(base, "autoheal_sync_fleet_nodes"), 30, "the sync's fleet gauges")
    time.sleep(3)  # a few evaluations of the healthy lab
    quiet = {a["labels"]["alertname"] for a in labprom.api(base, "alerts")["alerts"]}
    assert not quiet, f"alerts on a healthy lab: {quiet}"

    # a node drained by autoheal: 1 of 3 (33 %) is above the 20 % of the rule
    t0 = time.time()
    inject_xid(prom_lab, "gpu1")
    wait_firing(base, "AutohealFleetDrainedShareHigh", 60)
    prom_lab.faults["drained share"] = time.time() - t0

    # xid-watch killed on gpu2 (no goodbye: its textfile keeps saying up 1, only the heartbeat ages)
    rec = lab.records()["xid-watch-gpu2"]
    t1 = time.time()
    os.kill(rec.pid, signal.SIGKILL)
    wait_for(lambda: not procs.is_alive(rec), 10, "xid-watch-gpu2 dead")

    # a second replace-class fault: 2 of 3 nodes to remediate is above the lab's breaker_max_percent (50)
    t2 = time.time()
    inject_xid(prom_lab, "gpu3")
    wait_firing(base, "AutohealBreakerTripped", 90)
    prom_lab.faults["breaker trip"] = time.time() - t2

    alerts = wait_firing(base, "AutohealXidWatchDown", 90, node="gpu2")
    prom_lab.faults["xid-watch killed"] = time.time() - t1
    down = {a["labels"]["node"] for a in labprom.firing(base, "AutohealXidWatchDown")}
    assert down == {"gpu2"}, down  # the live daemons on gpu1 and gpu3 keep beating
    assert alerts[0]["annotations"]["runbook"].startswith("xid-watch stopped")
    for name in ("AutohealGuardDown", "AutohealSyncNoLeader", "AutohealSyncNoSuccessfulPass"):
        assert not labprom.firing(base, name), name
    print("\nfault -> firing alert on the lab (scrape 1s, evaluation 1s, for: 2s): "
          + ", ".join(f"{k} {v:.1f}s" for k, v in prom_lab.faults.items()))
