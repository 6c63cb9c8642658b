"""`autoheal sync` as users run it: --once --dry-run/--json, `sync status`, and the daemon process with
/healthz, /readyz, /metrics, JSON logs and a clean SIGTERM stop (stopped by PID). Against the real
control plane (etcd + kube-apiserver + kube-controller-manager); `requests` are its audit log's writes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from sync_helpers import core_api, k8s_name, seed_api

pytest.importorskip("kubernetes")
from autoheal_lab import controlplane
from autoheal_lab.testing.realkube import RealKube

AUTOHEAL = [sys.executable, "-m", "autoheal.cli.main"]


@pytest.fixture(scope="module")
def cli_env(plain_lab, tmp_path_factory):
    why = controlplane.missing_toolchain()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to build the control plane: {why}")
        pytest.skip(why)
    d = tmp_path_factory.mktemp("synccli")
    server = RealKube.start(d / "controlplane")
    kc = server.write_kubeconfig(str(d / "kubeconfig"))
    # the lab's sync requests replacements as NodeReplacements: the chart's CRD (the fake served it unasked)
    from kubernetes import utils

    from autoheal_lab import realkube

    utils.create_from_yaml(server.api_client(), str(realkube.CHART / "crds" / "nodereplacements.autoheal.io.yaml"))
    realkube.wait_crds(server.api_client(), realkube.CHART_CRDS, 60)
    seed_api(server, plain_lab.layout.nodes)
    env = dict(plain_lab.env, KUBECONFIG=kc, AUTOHEAL_CONFIG=str(plain_lab.layout.autoheal_conf))
    yield {"server": server, "env": env, "names": list(plain_lab.layout.nodes), "api": core_api(server),
           "slurm": plain_lab.adapter()}
    server.stop()


def run(args, env, timeout=60):
    return subprocess.run(AUTOHEAL + args, env=env, capture_output=True, text=True, timeout=timeout)


def test_once_dry_run_writes_nothing_then_once_converges(cli_env):
    server = cli_env["server"]
    before = [r for r in list(server.requests) if r["method"] != "GET"]
    p = run(["sync", "--once", "--dry-run", "--json"], cli_env["env"])
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["dry_run"] and data["mapped"] == len(cli_env["names"])
    assert any("SlurmNodeStateIdle" in json.dumps(x) or "pod-status" in x for x in data["planned"])
    assert [r for r in list(server.requests) if r["method"] != "GET"] == before
    # Slurm may change a node between the sync and the status (a freshly started slurmd goes IDLE* ->
    # IDLE once; seen in CI): then one more pass must converge, never an ever-growing plan.
    for _ in range(3):
        p = run(["sync", "--once"], cli_env["env"])
        assert p.returncode == 0, p.stderr + p.stdout
        st = run(["sync", "status", "--json"], cli_env["env"])
        if st.returncode == 0:
            break
        assert len(json.loads(st.stdout)["planned"]) <= 1, st.stdout
    assert st.returncode == 0, st.stdout + st.stderr  # in sync now
    assert json.loads(st.stdout)["planned"] == []


def test_bad_kubeconfig_is_a_one_line_usage_error(cli_env, tmp_path):
    env = dict(cli_env["env"], KUBECONFIG=str(tmp_path / "missing"))
    p = run(["sync", "--once"], env)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "Kubernetes credentials" in p.stderr


def test_daemon_process_serves_health_and_metrics_and_stops_on_sigterm(cli_env, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(cli_env["env"])
    errf = open(tmp_path / "stderr", "w")
    proc = subprocess.Popen(AUTOHEAL + ["sync", "--metrics-port", str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=errf)
    try:
        deadline = time.monotonic() + 30
        ready = False
        while time.monotonic() < deadline and not ready:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                    ready = r.status == 200
            except OSError:
                time.sleep(0.1)
        assert ready, open(tmp_path / "stderr").read()[-2000:]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            assert r.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
        assert "autoheal_sync_passes_total" in text and "autoheal_sync_leader 1.0" in text
        # the daemon reacts to a cordon through its watch
        name = cli_env["names"][-1]
        cli_env["api"].patch_node(k8s_name(name), {"spec": {"unschedulable": True}})
        slurm = cli_env["slurm"]
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not slurm.get_node(name).drain:
            time.sleep(0.1)
        assert slurm.get_node(name).drain
        cli_env["api"].patch_node(k8s_name(name), {"spec": {"unschedulable": False}})
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and slurm.get_node(name).drain:
            time.sleep(0.1)
        assert not slurm.get_node(name).drain
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            rc = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            rc = None
        errf.close()
    assert rc == 0
    lines = [json.loads(x) for x in open(tmp_path / "stderr").read().splitlines() if x.startswith("{")]
    assert lines and all("level" in x and "message" in x for x in lines)
    assert any("leadership acquired" in x["message"] for x in lines)


def _journal(cli_env):
    from autoheal.config import load_config
    from autoheal.journal import Journal

    return Journal.from_config(load_config(cli_env["env"]["AUTOHEAL_CONFIG"]))


def test_remediation_retry_command(cli_env):
    """Issue 17 item 1: `autoheal sync remediation retry NODE` (--dry-run, --json) starts a failed
    remediation again: the failed state is cleared (attempts kept), with an Event and a journal record."""
    api, env = cli_env["api"], cli_env["env"]
    name = cli_env["names"][0]
    kname = k8s_name(name)
    failed = {"autoheal.io/remediation-state": "failed", "autoheal.io/remediation-since": "1000",
              "autoheal.io/remediation-attempts": "3", "autoheal.io/remediation-slurm-node": name,
              "autoheal.io/remediation-reason": "eviction of 1 pods (ml/x) blocked for 30s (PodDisruptionBudget?)"}
    api.patch_node(kname, {"metadata": {"annotations": failed, "labels": {"autoheal.io/remediation": "failed"}}})
    try:
        p = run(["sync", "remediation", "--json"], env)
        assert p.returncode == 1 and json.loads(p.stdout)["remediations"][0]["state"] == "failed", p.stdout
        p = run(["sync", "remediation", "retry", name, "--dry-run", "--json"], env)  # by Slurm name
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["node"] == kname and json.loads(p.stdout)["dry_run"]
        assert api.read_node(kname).metadata.annotations["autoheal.io/remediation-state"] == "failed"
        p = run(["sync", "remediation", "retry", kname], env)
        assert p.returncode == 0, p.stderr
        ann = api.read_node(kname).metadata.annotations
        assert "autoheal.io/remediation-state" not in ann and ann["autoheal.io/remediation-attempts"] == "3"
        assert ann["autoheal.io/remediation-retry-requested"]
        assert "autoheal.io/remediation" not in (api.read_node(kname).metadata.labels or {})
        events = [e for e in api.list_namespaced_event("default").items
                  if e.reason == "AutohealRemediationRetryRequested"]
        assert events and events[-1].involved_object.name == kname
        recs = [r for r in _journal(cli_env).read(node=name) if r.event == "remediation-retry-requested"]
        assert recs and "PodDisruptionBudget" in recs[-1].message
        p = run(["sync", "remediation", "retry", kname], env)  # not failed any more
        assert p.returncode == 1 and "not failed" in p.stderr and p.stderr.strip().count("\n") == 0
        p = run(["sync", "remediation", "retry", "no-such-node"], env)
        assert p.returncode == 2 and "no-such-node" in p.stderr
    finally:
        cleared = dict.fromkeys([*failed, "autoheal.io/remediation-retry-requested"])
        api.patch_node(kname, {"metadata": {"annotations": cleared, "labels": {"autoheal.io/remediation": None}}})


def test_breaker_reset_writes_an_event_and_journal_records_under_the_nodes(cli_env):
    api, env = cli_env["api"], cli_env["env"]
    a, b = cli_env["names"][:2]
    api.create_namespaced_config_map("slurm", {"metadata": {"name": "autoheal-sync-breaker"}, "data": {
        "trippedAt": "1000.0", "starts": "[]", "why": "2 of 3 nodes (67%) > 50%", "nodes": json.dumps([a, b])}})
    try:
        p = run(["sync", "breaker", "reset", "--dry-run", "--json"], env)
        assert p.returncode == 0 and json.loads(p.stdout)["tripped"], p.stdout + p.stderr
        assert api.read_namespaced_config_map("autoheal-sync-breaker", "slurm").data.get("trippedAt")
        p = run(["sync", "breaker", "reset"], env)
        assert p.returncode == 0, p.stderr
        assert not (api.read_namespaced_config_map("autoheal-sync-breaker", "slurm").data or {}).get("trippedAt")
        events = [e for e in api.list_namespaced_event("slurm").items if e.reason == "AutohealBreakerReset"]
        assert events and events[-1].involved_object.name == "autoheal-sync-breaker"
        for n in (a, b):  # `autoheal events --node` finds it
            out = run(["events", "--node", n], env)
            assert "breaker-reset" in out.stdout, out.stdout + out.stderr
    finally:
        api.delete_namespaced_config_map("autoheal-sync-breaker", "slurm")


def test_status_shows_nodes_opted_out_of_replacement(cli_env):
    """Issue 17 item 2: an opted-out node that still needs a replacement is shown (exit 1), not hidden."""
    api, env, slurm = cli_env["api"], cli_env["env"], cli_env["slurm"]
    name = cli_env["names"][2]
    kname = k8s_name(name)
    slurm.drain(name, "autoheal: replace: xid 79 on gpu 3: fell off the bus")  # the hooks' replace rung
    api.patch_node(kname, {"metadata": {"labels": {"autoheal.io/auto-replace": "false"}}})
    try:
        p = run(["sync", "status", "--json"], env)
        data = json.loads(p.stdout)
        assert p.returncode == 1 and list(data["opted_out"]) == [kname], p.stdout
        assert "Node " + kname + " carries autoheal.io/auto-replace=false" in data["opted_out"][kname]["why"]
        p = run(["sync", "status"], env)
        assert f"opted out: {kname} (Slurm {name}) needs a replacement" in p.stdout
    finally:
        api.patch_node(kname, {"metadata": {"labels": {"autoheal.io/auto-replace": None}}})
        slurm.resume(name)


def test_waiting_remediations_are_shown_oldest_first(cli_env):
    """Issue 27: the queue of remediations the breaker holds back, in `sync remediation` and `sync breaker`
    (the order they start in: by when they asked)."""
    api, env = cli_env["api"], cli_env["env"]
    a, b = cli_env["names"][:2]
    marks = {}
    for name, since, until in ((a, "2000", "5600"), (b, "1000", "4600")):
        marks[name] = {"autoheal.io/remediation-state": "waiting", "autoheal.io/remediation-since": since,
                       "autoheal.io/remediation-attempts": "0", "autoheal.io/remediation-slurm-node": name,
                       "autoheal.io/remediation-waiting-limit": "start-share",
                       "autoheal.io/remediation-waiting-until": until,
                       "autoheal.io/remediation-reason": "2 of 2 starts allowed per 3600s window already made"}
        api.patch_node(k8s_name(name), {"metadata": {"annotations": marks[name],
                                                     "labels": {"autoheal.io/remediation": "waiting"}}})
    try:
        p = run(["sync", "remediation", "--json"], env)
        rows = {r["node"]: r for r in json.loads(p.stdout)["remediations"]}
        assert p.returncode == 0 and rows[k8s_name(a)]["state"] == "waiting", p.stdout
        assert rows[k8s_name(a)]["limit"] == "start-share" and rows[k8s_name(a)]["until"] == 5600.0
        p = run(["sync", "breaker", "--json"], env)
        data = json.loads(p.stdout)
        assert [r["slurm_node"] for r in data["waiting"]] == [b, a], p.stdout  # b asked first
        p = run(["sync", "breaker"], env)
        assert f"waiting: {k8s_name(b)}" in p.stdout and "until 1970-01-01T01:16:40Z" in p.stdout, p.stdout
    finally:
        for name in (a, b):
            api.patch_node(k8s_name(name), {"metadata": {"annotations": dict.fromkeys(marks[name]),
                                                         "labels": {"autoheal.io/remediation": None}}})
