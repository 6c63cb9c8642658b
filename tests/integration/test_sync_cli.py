"""`autoheal sync` as users run it: --once --dry-run/--json, `sync status`, and the daemon process with
/healthz, /readyz, /metrics, JSON logs and a clean SIGTERM stop (stopped by PID)."""

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

from sync_helpers import core_api, k8s_name, seed_fake_api

pytest.importorskip("kubernetes")
from autoheal.lab.fakekube.server import FakeKubeServer  # noqa: E402

AUTOHEAL = [sys.executable, "-m", "autoheal.cli.main"]


@pytest.fixture(scope="module")
def cli_env(plain_lab, tmp_path_factory):
    server = FakeKubeServer().start()
    d = tmp_path_factory.mktemp("synccli")
    kc = server.write_kubeconfig(str(d / "kubeconfig"))
    seed_fake_api(server, plain_lab.layout.nodes)
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
    p = run(["sync", "--once"], cli_env["env"])
    assert p.returncode == 0, p.stderr + p.stdout
    st = run(["sync", "status", "--json"], cli_env["env"])
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
