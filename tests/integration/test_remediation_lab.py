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

from helpers import wait_for

from autoheal_lab import kube as labkube
from autoheal_lab import procs


def api(handle):
    from kubernetes import client
    from kubernetes import config as kconfig

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
    out = subprocess.run([sys.executable, "-m", "autoheal_lab.cli", "inject", "--dir", str(lab.root), "--node",
                          "gpu1", "--gpu", "3", "--xid", "79"], env=handle.env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    # issue 22: the sync acts on the hooks' replace rung, which the healthcheck writes once gpu1 is idle
    # (HealthCheckInterval=30 on the lab), never on the XID of xid-watch's drain alone
    wait_for(lambda: remediation_state(core, "gpu1") in ("quarantined", "draining"), 75, "gpu1 quarantined")
    assert slurm.get_node("gpu1").reason.startswith("autoheal: replace: xid 79")
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


# ---- issue 17: PDB refusals, opt-out lifted, the other replacement actions -----------------------------
XID79_REASON = "autoheal: replace: xid 79 on gpu 3: fell off the bus"  # the hooks' rung (issue 22)


def set_sync_config(lab, **values):
    """Set keys of the lab's autoheal.toml [sync] section (processes started afterwards read them)."""
    path = lab.layout().autoheal_conf
    lines = path.read_text().splitlines()
    start = lines.index("[sync]")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    body = [ln for ln in lines[start + 1:end] if ln.split("=")[0].strip() not in values]
    body = [ln for ln in body if ln.strip()] + [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines[:start + 1] + body + [""] + lines[end:]) + "\n")


def kube_lab(lab_factory, nodes=3, spares=2, **sync_values):
    """A lab with the Kubernetes side started on a [sync] config of the test's choosing."""
    handle = lab_factory(nodes=nodes, spares=spares)
    set_sync_config(handle.lab, breaker_max_percent=100.0, breaker_rearm_percent=34.0,
                    breaker_window_seconds=60.0, **sync_values)
    labkube.start(handle.lab, spare_delay=1.0)
    return handle


def scontrol_drain(handle, node, reason=XID79_REASON):
    handle.adapter(timeout=10).drain(node, reason)


def annotations(core, node):
    from kubernetes.client import ApiException

    try:
        return core.read_node(node).metadata.annotations or {}
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def api_writes(handle):
    """The lab API server's writes (method, path, status, user): the real server's audit log."""
    from autoheal_lab.realkube import audit_requests

    return audit_requests(handle.lab)


def refusals(handle, pod):
    return sum(1 for r in api_writes(handle) if r["method"] == "POST" and r["path"].endswith(f"/pods/{pod}/eviction")
               and r.get("status") == 429)


def workload_namespace(core, apps, ns="ml"):
    """A namespace for workload pods, its ``default`` ServiceAccount made (ServiceAccount admission refuses
    pods before that) and the ReplicaSet that owns its pods: the real garbage collector deletes a pod whose
    owner does not exist (no ReplicaSet controller runs here, so the ReplicaSet makes no pods itself)."""
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    wait_for(lambda: any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(ns).items),
             30, f"ServiceAccount {ns}/default")
    rs = apps.create_namespaced_replica_set(ns, {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"lab": "workload"}},
                 "template": {"metadata": {"labels": {"lab": "workload"}},
                              "spec": {"containers": [{"name": "c", "image": "inference:lab"}]}}}})
    return rs.metadata.uid


def workload_pod(core, name, node, labels, owner_uid):
    # bound to ``node``; the lab's kubelets post it Running and Ready (so PDBs count it healthy)
    core.create_namespaced_pod("ml", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {**labels, "lab": "workload"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                          "uid": owner_uid}]},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "inference:lab"}]}})
    wait_for(lambda: (lambda p: p.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in p.status.conditions or []))(
        core.read_namespaced_pod(name, "ml")), 20, f"pod ml/{name} running")


def spare_state(slurm, name):
    node = slurm.get_node(name)
    return node.state, sorted(node.flags)


def wait_done_and_spare_responding(core, slurm, old, timeout=60):
    """Wait for `done` (or the Node already deleted by the pool) and check that the spare that replaced
    ``old`` answered in Slurm *at that moment*: done means it takes jobs (issue 17 item 7: a spare used to
    show idle*, not responding, for seconds after done). Returns the spare's name."""
    import re

    state = wait_for(lambda: (lambda a: "gone" if a is None else (a.get("autoheal.io/remediation-state") or "")
                              )(annotations(core, old)) in ("done", "gone") and "ok", timeout, f"{old} done")
    assert state
    at_done = {n.name: n for n in slurm.list_nodes()}
    reason = wait_for(lambda: re.search(r"replaced by (\S+)", slurm.get_node(old).reason), 10, f"{old} retired")
    spare = reason.group(1)
    node = at_done[spare]
    assert not node.drain and "NOT_RESPONDING" not in node.flags and node.state in ("IDLE", "MIXED", "ALLOCATED"), \
        (spare, node.state, node.flags)
    return spare


def test_pdb_deleted_after_many_refusals_and_opt_out_lifted(lab_factory):
    """Issue 17 items 1 and 2 on the lab. gpu1: a maxUnavailable=0 PDB and a minAvailable=1 PDB refuse
    evictions (a third pod, under a minAvailable PDB with room, goes at once); after 5+ refusals, when the
    uncapped backoff's next retry would lie past the drain timeout, the PDBs are deleted: the capped retry
    at the deadline evicts them and gpu1 is replaced. gpu2: a pod opts out; removing its label starts
    the replacement."""
    from kubernetes import client

    handle = kube_lab(lab_factory, remediation_drain_timeout_seconds=25.0)
    core = client.CoreV1Api(api(handle))
    policy = client.PolicyV1Api(api(handle))
    slurm = handle.adapter(timeout=10)
    owner = workload_namespace(core, client.AppsV1Api(api(handle)))
    workload_pod(core, "guarded", "gpu1", {"app": "guarded"}, owner)
    workload_pod(core, "minb", "gpu1", {"app": "minb"}, owner)
    workload_pod(core, "mina-1", "gpu1", {"app": "mina"}, owner)
    workload_pod(core, "mina-2", "gpu3", {"app": "mina"}, owner)
    workload_pod(core, "keep", "gpu2", {"app": "keep", "autoheal.io/auto-replace": "false"}, owner)
    for name, spec in (("guarded", {"maxUnavailable": 0}), ("minb", {"minAvailable": 1}),
                       ("mina", {"minAvailable": 1})):
        policy.create_namespaced_pod_disruption_budget("ml", {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
            "spec": {**spec, "selector": {"matchLabels": {"app": name}}}})
    wait_for(lambda: lease_holder_pid(handle), 20, "a sync leader")
    scontrol_drain(handle, "gpu1")
    scontrol_drain(handle, "gpu2")

    wait_for(lambda: (annotations(core, "gpu2") or {}).get("autoheal.io/remediation-opted-out"), 30,
             "gpu2 opted out")
    wait_for(lambda: refusals(handle, "guarded") >= 5 and refusals(handle, "minb") >= 5, 40, "5 refusals each")
    ann = annotations(core, "gpu1")
    assert ann["autoheal.io/remediation-state"] == "draining", ann  # not failed: the deadline is still ahead
    assert [p.metadata.name for p in core.list_namespaced_pod("ml").items if p.spec.node_name == "gpu1"] == [
        "guarded", "minb"]  # mina-1 went at once: its minAvailable PDB had room (mina-2 on gpu3)
    for name in ("guarded", "minb"):  # the PDBs go away (the workload moved elsewhere)
        policy.delete_namespaced_pod_disruption_budget(name, "ml")
    assert (annotations(core, "gpu2") or {}).get("autoheal.io/remediation-state", "") == ""
    core.patch_namespaced_pod("keep", "ml", {"metadata": {"labels": {"autoheal.io/auto-replace": None}}})

    spares = {wait_done_and_spare_responding(core, slurm, "gpu1"), wait_done_and_spare_responding(core, slurm, "gpu2")}
    assert spares == {"spare1", "spare2"}
    events = [e.reason for e in core.list_namespaced_event("default").items]
    assert "AutohealRemediationFailed" not in events, events
    assert events.count("AutohealReplaceOptOut") == 1
    lifted = [e for e in core.list_namespaced_event("default").items
              if e.reason == "AutohealQuarantined" and e.involved_object.name == "gpu2"]
    assert lifted and "opt-out lifted" in lifted[0].message
    assert {r["path"].rsplit("/", 2)[-2] for r in api_writes(handle) if r["path"].endswith("/eviction")
            and r.get("status") in (200, 201)} >= {"guarded", "minb", "mina-1"}


class ReplacementProvider:
    """A webhook replacement provider on the lab: answers POSTs with ``{"replacementNode": spare}`` and
    brings the spare up as a cloud would (its slurmd, its Node and slurmd pod)."""

    def __init__(self, lab, core, spare):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.posts = []
        outer = self

        class Hook(BaseHTTPRequestHandler):
            def do_POST(self):
                outer.posts.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                if len(outer.posts) == 1:
                    threading.Thread(target=outer.provision, daemon=True).start()
                body = json.dumps({"replacementNode": spare}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.lab, self.core, self.spare = lab, core, spare
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/replace"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def provision(self):
        self.lab.start_slurmd(self.spare)
        self.core.create_node(labkube.node_obj(self.spare))
        self.core.create_namespaced_pod(labkube.NAMESPACE, labkube.slurmd_pod(self.spare))

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def test_label_webhook_and_delete_node_actions_on_the_lab(lab_factory):
    """Issue 17 "also untested": the three other replacement actions against the lab's `autoheal sync`
    process, one after the other on one lab: `label` (fulfilled by the spare pool), `webhook` (a provider
    answering the POST) and `delete-node` (the Node goes, the Slurm node is retired)."""
    from kubernetes import client

    handle = kube_lab(lab_factory, replacement_action="label")
    lab = handle.lab
    core = client.CoreV1Api(api(handle))
    slurm = handle.adapter(timeout=10)
    wait_for(lambda: lease_holder_pid(handle), 20, "a sync leader")

    scontrol_drain(handle, "gpu1")
    wait_for(lambda: (core.read_node("gpu1").metadata.labels or {}).get("autoheal.io/replace") == "requested", 30,
             "the replacement label on gpu1")
    assert wait_done_and_spare_responding(core, slurm, "gpu1") == "spare1"

    provider = ReplacementProvider(lab, core, "spare2")
    try:
        set_sync_config(lab, replacement_action="webhook", replacement_webhook=provider.url)
        labkube.start_sync(lab)  # restarted on the new config (the old one hands the Lease over)
        scontrol_drain(handle, "gpu2")
        assert wait_done_and_spare_responding(core, slurm, "gpu2") == "spare2"
        assert len(provider.posts) == 1, provider.posts
        post = provider.posts[0]
        assert (post["node"], post["slurm_node"], post["reason"]) == ("gpu2", "gpu2", XID79_REASON)
        assert post["idempotency_key"].startswith("gpu2-")
        ann = annotations(core, "gpu2")
        assert ann["autoheal.io/replacement-node"] == "spare2" and ann["autoheal.io/replacement-requested"]
    finally:
        provider.stop()

    set_sync_config(lab, replacement_action="delete-node")
    # as a site would: `helm upgrade` with the new action, whose RBAC adds Node delete (granted per feature)
    from autoheal_lab import controlplane, realkube

    realkube.install_chart(lab, controlplane.cached_bindir(), labkube.kubeconfig_path(lab))
    labkube.start_sync(lab)
    scontrol_drain(handle, "gpu3")
    wait_for(lambda: annotations(core, "gpu3") is None, 40, "Node gpu3 deleted for replacement")
    node = slurm.get_node("gpu3")
    assert node.drain and node.reason.startswith("autoheal: retired: Node deleted for replacement"), node.reason
    requested = [e.involved_object.name for e in core.list_namespaced_event("default").items
                 if e.reason == "AutohealReplacementRequested"]
    assert sorted(requested) == ["gpu1", "gpu2", "gpu3"], requested
