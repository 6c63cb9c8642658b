"""Node replacement on the lab, end to end (issue 7): `lab inject --xid 79` on gpu1 -> xid-watch drains
-> autoheal sync (two replicas, the leader killed mid-flow) quarantines, cordons, asks for a
replacement (NodeReplacement) -> the spare pool brings spare1 up -> spare1 in service, gpu1 retired."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("kubernetes")

from autoheal.lab import kube as labkube  # noqa: E402
from autoheal.lab import procs  # noqa: E402
from helpers import wait_for


def api(handle):
    from kubernetes import client, config as kconfig

    cfg = client.Configuration()
    kconfig.load_kube_config(config_file=str(labkube.kubeconfig_path(handle.lab)), client_configuration=cfg)
    return client.ApiClient(cfg)


def remediation_state(core, node):
    from kubernetes.client import ApiException

    try:
        n = core.read_node(node)
    except ApiException as exc:
        return "gone" if exc.status == 404 else ""
    return (n.metadata.annotations or {}).get("autoheal.io/remediation-state", "")


def lease_holder_pid(handle):
    from kubernetes import client
    from kubernetes.client import ApiException

    try:
        lease = client.CoordinationV1Api(api(handle)).read_namespaced_lease("autoheal-sync", "slurm")
    except ApiException as exc:
        if exc.status == 404:  # no leader elected yet
            return None
        raise
    holder = lease.spec.holder_identity or ""
    return int(holder.rsplit("_", 1)[1]) if "_" in holder else None


def test_xid79_to_spare_in_service_with_leader_killed_mid_flow(lab_factory):
    from kubernetes import client

    handle = lab_factory(nodes=2, spares=1, hooks=True, xid_watch=True, kube=True, spare_delay=1.0)
    lab = handle.lab
    labkube.start_sync(lab, name="sync-2")  # a second replica: only the Lease holder writes
    core = client.CoreV1Api(api(handle))
    slurm = handle.adapter(timeout=10)
    wait_for(lambda: lease_holder_pid(handle), 20, "a sync leader")
    assert slurm.get_node("spare1").drain  # held out of service until it replaces a node

    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "autoheal.lab.cli", "inject", "--dir", str(lab.root), "--node",
                          "gpu1", "--gpu", "3", "--xid", "79"], env=handle.env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    wait_for(lambda: remediation_state(core, "gpu1") in ("quarantined", "draining"), 30, "gpu1 quarantined")
    # kill the leader without a goodbye (SIGKILL: the Lease is left to expire), mid-flow
    leader = lease_holder_pid(handle)
    recs = {r.pid: r for r in lab.records().values()}
    assert leader in recs and recs[leader].name in ("sync", "sync-2")
    os.kill(leader, signal.SIGKILL)
    wait_for(lambda: not procs.is_alive(recs[leader]), 10, "the leader to die")

    wait_for(lambda: remediation_state(core, "gpu1") in ("done", "gone"), 60, "gpu1 replaced")
    node = wait_for(lambda: (lambda n: n if not n.drain and n.state == "IDLE" else None)(slurm.get_node("spare1")),
                    20, "spare1 in service")
    elapsed = time.monotonic() - started
    old = slurm.get_node("gpu1")
    assert old.drain and old.reason.startswith("autoheal: retired: replaced by spare1")
    assert node.name == "spare1"
    assert core.read_node("spare1").metadata.name == "spare1"
    # the new leader continued where the old one stopped: one request, one quarantine, one Event each
    crs = client.CustomObjectsApi(api(handle)).list_namespaced_custom_object(
        "autoheal.io", "v1alpha1", "slurm", "nodereplacements")["items"]
    assert [c["metadata"]["name"] for c in crs] == ["gpu1"]
    events = [e.reason for e in core.list_namespaced_event("default").items]
    for reason in ("AutohealQuarantined", "AutohealReplacementRequested", "AutohealReplaced"):
        assert events.count(reason) == 1, events
    journal = [json.loads(line) for line in open(handle.layout.path("journal", "journal.jsonl"))]
    assert sum(1 for r in journal if r.get("event") == "remediation-done") == 1
    print(f"\nxid 79 -> spare1 in service: {elapsed:.1f}s (with a leader failover)")
