"""The lab's Kubernetes side across slurmctld restarts: the spare's reason is the sync's, a spare in
service stays in service and out of the breaker's count (issue 16 finding 10), a spare that takes over
runs xid-watch and the hooks like every node (finding 2c), and the sync's metrics can be scraped (issue
17 item 6)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request

import pytest

pytest.importorskip("kubernetes")

from click.testing import CliRunner
from helpers import node_state, wait_for

from autoheal.reasons import strip_reason_suffix
from autoheal_lab import kube as labkube
from autoheal_lab import procs
from autoheal_lab.cli import lab as lab_cli

# what the lab's slurm.conf gave a spare before finding 10 was fixed; the sync did not recognise it
OLD_SPARE_REASON = "autoheal: spare pool: held out of service until a replacement is requested"


def _scrape(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.read().decode()
    except OSError:
        return ""


def _passes(url: str) -> float:
    m = re.search(r'^autoheal_sync_passes_total\{result="ok"\} (\S+)$', _scrape(url), re.M)
    return float(m.group(1)) if m else -1.0


def _autoheal(handle, *args):
    return subprocess.run([sys.executable, "-m", "autoheal.cli.main", *args], env=handle.env, capture_output=True,
                          text=True, timeout=60, cwd="/tmp")


def _status(handle) -> dict:
    res = CliRunner().invoke(lab_cli, ["status", "--dir", str(handle.root), "--json"])
    return json.loads(res.output)


def _kube_node(handle, name):
    from kubernetes import client, config
    from kubernetes.client import ApiException

    core = client.CoreV1Api(config.new_client_from_config(config_file=str(labkube.kubeconfig_path(handle.lab))))
    try:
        return core.read_node(name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_spare_survives_slurmctld_restarts_runs_xid_watch_and_sync_metrics_scrape(lab_factory):
    handle = lab_factory(nodes=2, gpus=2, spares=1, hooks=True, xid_watch=True, kube=True, spare_delay=1.0)
    lab, slurm = handle.lab, handle.adapter(timeout=10)
    prefix = handle.config().sync.spare_reason_prefix.strip()

    # the sync's metrics: a loopback URL in `lab status` (text and --json), and it answers
    url = _status(handle)["metrics"]["sync"]
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url), url
    assert f"metrics of sync: {url}" in CliRunner().invoke(lab_cli, ["status", "--dir", str(handle.root)]).output
    wait_for(lambda: _passes(url) >= 1, 30, "a sync pass counted in /metrics")

    # a held spare keeps a reason the sync recognises across a slurmctld restart...
    lab.restart_slurmctld()
    spare = slurm.get_node("spare1")
    assert spare.drain and strip_reason_suffix(spare.reason).startswith(prefix), spare.reason
    # ...so the sync resumes it when it replaces gpu1 (it resumes only reasons with that prefix)
    res = CliRunner().invoke(lab_cli, ["inject", "--dir", str(handle.root), "--node", "gpu1", "--gpu", "1",
                                       "--xid", "79"])
    assert res.exit_code == 0, res.output
    wait_for(lambda: (lambda n: not n.drain and n.responding and n.state == "IDLE")(slurm.get_node("spare1")),
             90, "spare1 in service")
    wait_for(lambda: _kube_node(handle, "gpu1") is None, 60, "gpu1's Node retired")
    recs = lab.records()
    assert procs.is_alive(recs["xid-watch-spare1"]) and procs.is_alive(recs["slurmd-spare1"])
    assert "xid-watch-gpu1" not in recs and "slurmd-gpu1" not in recs  # the retired machine is gone

    def health_passes():  # the hooks (slurm.conf's HealthCheckProgram) run on the spare too
        return node_state(handle.layout.root, "spare1")["passes"]

    wait_for(lambda: health_passes() >= 1, 45, "a health check pass on spare1")

    # a breaker that counting the spare would trip: 1 of the 2 mapped nodes is 50% > 40%
    conf = handle.layout.autoheal_conf
    conf.write_text(re.sub(r"(?m)^breaker_max_percent = .*$", "breaker_max_percent = 40.0", conf.read_text()))
    labkube.start_sync(lab)
    url = _status(handle)["metrics"]["sync"]
    wait_for(lambda: re.search(r"^autoheal_sync_leader 1\.0$", _scrape(url), re.M), 30, "the new sync to lead")
    # slurmctld restarted with the spare in service: it used to go back to DRAIN (slurm.conf's State=)
    lab.restart_slurmctld()
    spare = slurm.get_node("spare1")
    assert not spare.drain, f"spare1 drained again by a slurmctld restart: {spare.reason}"
    done = _passes(url) + 3
    wait_for(lambda: _passes(url) >= done, 60, "three sync passes after the restart")
    breaker = _autoheal(handle, "sync", "breaker", "--json")
    assert breaker.returncode == 0 and json.loads(breaker.stdout)["tripped"] is False, breaker.stdout
    assert not slurm.get_node("spare1").drain

    # (the reason slurm.conf used to give a spare, OLD_SPARE_REASON, was once counted by the breaker; since
    # one test decides what a health drain is, autoheal.reasons.is_health_drain, no spare reason is one)
    from autoheal.reasons import is_health_drain

    assert not is_health_drain(OLD_SPARE_REASON)

    # the spare runs xid-watch: an XID on it is detected and drained within seconds (not by the
    # 30 s health check)
    res = CliRunner().invoke(lab_cli, ["inject", "--dir", str(handle.root), "--node", "spare1", "--gpu", "0",
                                       "--xid", "79"])
    assert res.exit_code == 0, res.output
    from autoheal.journal import Journal

    journal = Journal(handle.layout.path("journal", "journal.jsonl"))
    det = wait_for(lambda: [r for r in journal.read(node="spare1", events=["detection"]) if r.source == "xid-watch"],
                   15, "xid-watch on spare1 to detect the XID")
    assert "xid 79" in det[0].message
    node = wait_for(lambda: (lambda n: n if n.drain else None)(slurm.get_node("spare1")), 15, "spare1 drained")
    assert "xid 79" in node.reason
