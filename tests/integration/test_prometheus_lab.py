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

from helpers import rfc3339, wait_for

from autoheal_lab import procs
from autoheal_lab import prometheus as labprom


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
    out = subprocess.run([sys.executable, "-m", "autoheal_lab.cli", "inject", "--dir", str(handle.lab.root),
                          "--node", node, "--gpu", str(gpu), "--xid", str(xid)], env=handle.env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def submit_sleeper(handle):
    """A plain requeueable job (no runner): xid-watch requeues it after its grace when its node drains.
    Returns (job id, the file its script touches once it runs: its prolog is over)."""
    started = handle.lab.root / "sleeper-started"
    out = subprocess.run(["sbatch", "--parsable", "--requeue", "-N1", "-o", "/dev/null", "--wrap",
                          f"touch {started}; exec sleep 900"],
                         env=handle.env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0], started


def running_on(handle, job_id):
    job = handle.adapter(timeout=10).get_job(job_id)
    return job.nodes[0] if job.state == "RUNNING" and job.nodes else None


def wait_firing(base, alert, timeout, **labels):
    def found():
        return [a for a in labprom.firing(base, alert)
                if all(a["labels"].get(k) == v for k, v in labels.items())]
    return wait_for(found, timeout, f"{alert} {labels} firing", step=0.2)


def wait_evaluated_on_fresh_scrapes(base, since, scrapes=2, timeout=60):
    """Wait until Prometheus has scraped every target ``scrapes`` times after ``since`` (its last scrape
    that many intervals later: scrapes are at a fixed period) and every rule group was evaluated after
    those scrapes (the timestamps Prometheus itself reports on /targets and /rules)."""
    interval = float(labprom.SCRAPE_INTERVAL.rstrip("s"))

    def done():
        targets = labprom.api(base, "targets")["activeTargets"]
        last = [rfc3339(t["lastScrape"]) for t in targets if t.get("health") == "up"]
        if not last or len(last) != len(targets) or min(last) < since + (scrapes - 1) * interval:
            return None
        groups = labprom.api(base, "rules")["groups"]
        evaluated = [rfc3339(g["lastEvaluation"]) for g in groups]
        return bool(groups) and min(evaluated) > max(last) and min(evaluated)

    return wait_for(done, timeout, f"{scrapes} scrapes of every target after {since:.3f} and a rule evaluation",
                    step=0.2)


def test_faults_on_the_lab_fire_their_alerts(prom_lab):
    base, lab = prom_lab.prom, prom_lab.lab
    # every target answers, and a healthy lab pages nobody
    wait_for(lambda: (lambda t: len(t) == 5 and all(x["health"] == "up" for x in t))(
        labprom.api(base, "targets")["activeTargets"]), 30, "5 targets up (sync, 3 nodes, controller)")
    wait_for(lambda: labprom.query(base, "autoheal_guard_heartbeat_timestamp_seconds"), 20, "the guard's heartbeat")
    wait_for(lambda: len(labprom.query(base, "autoheal_xid_watch_heartbeat_timestamp_seconds")) == 3, 20,
             "3 xid-watch heartbeats")
    wait_for(lambda: labprom.query(base, "autoheal_sync_fleet_nodes"), 30, "the sync's fleet gauges")
    # the rules evaluated on two fresh scrapes of every target (a rate() needs two samples; an alert
    # would show pending from its first evaluation on), not "a few seconds, if Prometheus kept up"
    wait_evaluated_on_fresh_scrapes(base, time.time())
    quiet = {a["labels"]["alertname"] for a in labprom.api(base, "alerts")["alerts"]}
    assert not quiet, f"alerts on a healthy lab: {quiet}"

    # a job on the node that will fail: xid-watch requeues it, it runs again elsewhere (dashboard, status)
    prom_lab.job, started = submit_sleeper(prom_lab)
    first = wait_for(lambda: running_on(prom_lab, prom_lab.job), 60, "the job running")
    # its script runs: the prolog is over (an XID during the prolog fails it, and Slurm requeues the job
    # itself, "Prolog launch failure": not the path this lab times; seen on a loaded CI machine)
    wait_for(started.exists, 60, "the job's script started")
    second, third = [n for n in ("gpu1", "gpu2", "gpu3") if n != first]

    # a node drained by autoheal: 1 of 3 (33 %) is above the 20 % of the rule
    t0 = time.time()
    inject_xid(prom_lab, first)
    wait_firing(base, "AutohealFleetDrainedShareHigh", 60)
    prom_lab.faults["drained share"] = time.time() - t0

    # xid-watch killed on a second node (no goodbye: its textfile keeps saying up 1, only the heartbeat ages)
    rec = lab.records()[f"xid-watch-{second}"]
    t1 = time.time()
    os.kill(rec.pid, signal.SIGKILL)
    wait_for(lambda: not procs.is_alive(rec), 10, "xid-watch-gpu2 dead")

    # a second replace-class fault: 2 of 3 nodes to remediate is above the lab's breaker_max_percent (50)
    t2 = time.time()
    inject_xid(prom_lab, third)
    wait_firing(base, "AutohealBreakerTripped", 90)
    prom_lab.faults["breaker trip"] = time.time() - t2

    alerts = wait_firing(base, "AutohealXidWatchDown", 90, node=second)
    prom_lab.faults["xid-watch killed"] = time.time() - t1
    down = {a["labels"]["node"] for a in labprom.firing(base, "AutohealXidWatchDown")}
    assert down == {second}, down  # the live daemons on the other two keep beating
    prom_lab.nodes = (first, second, third)
    assert alerts[0]["annotations"]["runbook"].startswith("xid-watch stopped")
    for name in ("AutohealGuardDown", "AutohealSyncNoLeader", "AutohealSyncNoSuccessfulPass"):
        assert not labprom.firing(base, name), name
    print("\nfault -> firing alert on the lab (scrape 1s, evaluation 1s, for: 2s): "
          + ", ".join(f"{k} {v:.1f}s" for k, v in prom_lab.faults.items()))


def test_every_dashboard_panel_returns_data_after_the_faults(prom_lab):
    """After the faults above (and the job requeued off its node running again, timed from its fault and
    from its EligibleTime), every PromQL of the dashboard, as Grafana would send it, returns at least one
    series from the lab's Prometheus, and every panel at least one number (a NaN-only panel shows nothing).
    The hot-spare swap counts are zero here (no hot-spare job on this lab); a real swap is counted in
    test_hotspare_lab.py."""
    import json
    import math

    base = prom_lab.prom
    assert getattr(prom_lab, "nodes", None), "needs test_faults_on_the_lab_fire_their_alerts first"
    # the job left its failed node and runs again; the guard timed it (its textfile, scraped)
    wait_for(lambda: (lambda n: n and n != prom_lab.nodes[0])(running_on(prom_lab, prom_lab.job)), 120,
             "the requeued job running again")
    wait_for(lambda: labprom.query(base, "autoheal_guard_requeued_eligible_to_running_seconds_count > 0"), 30,
             "the guard's eligible -> running observation")
    # and from the fault: slurmctld's stamp of xid-watch's drain of its node -> running again elsewhere
    wait_for(lambda: labprom.query(base, 'autoheal_guard_fault_to_running_seconds_count{path="requeue"} > 0'), 30,
             "the guard's fault -> running observation")
    wait_evaluated_on_fresh_scrapes(base, time.time())  # two more samples of every series for the rate()s
    empty, blank = [], []
    for panel in json.loads(labprom.product_file("autoheal-dashboard.json").read_text())["panels"]:
        numbers = []
        for t in panel["targets"]:
            result = labprom.query(base, labprom.grafana_promql(t["expr"]))
            if not result:
                empty.append(f"{panel['title']} [{t['refId']}]: {t['expr']}")
            numbers += [float(r["value"][1]) for r in result]
        if not any(math.isfinite(v) for v in numbers):
            blank.append(panel["title"])
    assert not empty, "queries without data:\n" + "\n".join(empty)
    assert not blank, f"panels with no finite value: {blank}"


def run_status(handle, *args, timeout=60):
    t = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "autoheal.cli.main", "status", *args], env=handle.env,
                         capture_output=True, text=True, timeout=timeout)
    return out, time.monotonic() - t


def test_autoheal_status_on_the_lab_and_with_the_api_server_gone(prom_lab):
    """`autoheal status` after the faults: both drained nodes with their rung and remediation state, the
    tripped breaker, the job xid-watch requeued, the dead xid-watch and the live guard and leader; then
    with the Kubernetes API server stopped it says so and still shows Slurm (exit 1 both times)."""
    import json

    first, second, third = prom_lab.nodes
    out, took = run_status(prom_lab, "--json", "--prometheus", prom_lab.prom)
    assert out.returncode == 1, out.stdout + out.stderr
    rep = json.loads(out.stdout)
    assert all(s["state"] == "ok" for s in rep["sources"]), rep["sources"]
    drained = {d["node"]: d for d in rep["drained"]}
    assert set(drained) == {first, third}
    assert all(d["rung"] == "replace" and d["reason"].startswith("autoheal: replace: xid 79") for d in drained.values())
    assert any(d["remediation"] for d in drained.values()), drained
    assert rep["breaker"]["tripped"]
    assert any(j["job"] == prom_lab.job and j["what"] == "requeued by xid-watch" for j in rep["jobs"]), rep["jobs"]
    comps = {c["name"]: c for c in rep["components"]}
    assert comps["sync leader"]["state"] == "ok" and comps["guard"]["state"] == "ok"
    assert comps["xid-watch"]["state"] == "problem" and second in comps["xid-watch"]["detail"]
    assert any(p.startswith("remediation breaker tripped") for p in rep["problems"])
    assert any(p.startswith(f"xid-watch on {second} (silent") for p in rep["problems"])
    text, took_text = run_status(prom_lab, "--prometheus", prom_lab.prom)
    assert text.returncode == 1 and f"xid-watch on {second}" in text.stdout and "TRIPPED" in text.stdout

    from autoheal_lab.controlplane import APISERVER

    api = prom_lab.lab.records()[APISERVER]
    procs.stop(api)
    gone, took_gone = run_status(prom_lab, "--json", "--prometheus", prom_lab.prom)
    assert gone.returncode == 1, gone.stderr
    rep = json.loads(gone.stdout)
    src = {s["name"]: s for s in rep["sources"]}
    assert src["kubernetes"]["state"] == "error" and src["slurm"]["state"] == "ok"
    assert {d["node"] for d in rep["drained"]} == {first, third}  # Slurm still shown
    print(f"\nautoheal status wall time on the lab: {took:.2f}s (--json), {took_text:.2f}s (screen), "
          f"{took_gone:.2f}s with the API server gone")
