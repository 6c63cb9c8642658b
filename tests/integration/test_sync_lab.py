"""autoheal sync against the lab: real Slurm (CLI adapter) and the real Kubernetes control plane (etcd +
kube-apiserver + kube-controller-manager) through the real kubernetes client (and the real kubectl for
cordon/uncordon when it is installed). API faults come from the lab's fault proxy in front of the real
server (autoheal_lab.apifaults); a 409 is the real server's own (a write that lost a race), and a 410 Gone
is the real server's answer to a watch from before its restart."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time

import pytest
from sync_helpers import core_api, k8s_name, pod_name, seed_api, sync_cfg

from autoheal.k8s_sync.daemon import SyncDaemon
from autoheal.k8s_sync.engine import Reconciler
from autoheal.k8s_sync.kube import KubeApi
from autoheal.reasons import strip_reason_suffix

pytest.importorskip("kubernetes")
from helpers import wait_for

HEALTH = "autoheal: xid 79: gpu 3 fell off the bus"


@pytest.fixture(scope="module")
def kube_env(plain_lab, tmp_path_factory):
    import os

    from autoheal_lab import controlplane
    from autoheal_lab.testing.realkube import RealKube

    why = controlplane.missing_toolchain()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to build the control plane: {why}")
        pytest.skip(why)
    d = tmp_path_factory.mktemp("kube")
    server = RealKube.start(d / "controlplane")
    kc = str(d / "kubeconfig")
    server.write_kubeconfig(kc)
    names = list(plain_lab.layout.nodes)
    seed_api(server, names)
    slurm = plain_lab.adapter(timeout=10)
    yield {"server": server, "kubeconfig": kc, "names": names, "slurm": slurm, "api": core_api(server),
           "lab": plain_lab, "dir": d}
    for n in names:  # leave the shared lab as we found it
        try:
            node = slurm.get_node(n)
            if node.drain and strip_reason_suffix(node.reason).startswith(("autoheal", "admin")):
                slurm.resume(n)
        except Exception:
            pass
    server.stop()


@pytest.fixture(scope="module")
def proxy_env(kube_env):
    """The same real server behind the lab's fault proxy (its client: the lab admin's certificate, which the
    proxy passes on by impersonation), for the test that injects API faults."""
    from autoheal_lab import apifaults

    proxy = apifaults.for_control_plane(kube_env["server"].cp).start()
    cp = kube_env["server"].cp
    pki = cp.root / "pki"
    kc = kube_env["dir"] / "proxy.kubeconfig"
    from autoheal_lab.controlplane import ADMIN_USER, kubeconfig_text

    kc.write_text(kubeconfig_text(proxy.url, pki / "ca.crt", pki / "admin.crt", pki / "admin.key", ADMIN_USER))
    yield dict(kube_env, kubeconfig=str(kc), proxy=proxy)
    proxy.stop()


def kube(env, **kw):
    return KubeApi.from_settings(env["kubeconfig"], timeout=kw.pop("timeout", 5.0))


def knode(env, n):
    return env["api"].api_client.sanitize_for_serialization(env["api"].read_node(k8s_name(n)))


def pod_conditions(env, n):
    pod = env["api"].read_namespaced_pod(pod_name(n), "slurm")
    return {c.type: c for c in (pod.status.conditions or [])}


def cordon(env, n, on=True):
    verb = "cordon" if on else "uncordon"
    if shutil.which("kubectl"):
        subprocess.run(["kubectl", "--kubeconfig", env["kubeconfig"], verb, k8s_name(n)], check=True,
                       capture_output=True, timeout=30)
    else:
        env["api"].patch_node(k8s_name(n), {"spec": {"unschedulable": on}})


def node_patches(server):
    """Node PATCHes the API server has answered (its audit log, whoever sent them)."""
    from autoheal_lab.realkube import parse_audit

    return len([r for r in parse_audit(server.cp.audit_log) if r["method"] == "PATCH" and "/nodes/" in r["path"]])


def writes(server):
    return [r for r in list(server.requests) if r["method"] in ("POST", "PUT", "PATCH", "DELETE")
            and "/leases" not in r["path"]]


def test_mirroring_both_directions(kube_env):
    env, slurm = kube_env, kube_env["slurm"]
    a, b, c = env["names"][:3]
    rec = Reconciler(slurm, kube(env), sync_cfg())
    assert rec.run_pass().ok
    conds = pod_conditions(env, a)
    assert conds["SlurmNodeStateIdle"].status == "True"

    # Slurm -> Kubernetes: an autoheal hardware drain becomes GPUHealthy=False + taint, then goes away
    slurm.drain(a, HEALTH)
    res = rec.run_pass()
    assert res.ok and not res.errors, res.errors
    k = knode(env, a)
    gh = [x for x in k["status"]["conditions"] if x["type"] == "GPUHealthy"][0]
    assert (gh["status"], gh["reason"]) == ("False", "XID79") and "gpu 3" in gh["message"]
    assert {"key": "autoheal.io/gpu-unhealthy", "value": "XID79", "effect": "NoSchedule"} in k["spec"]["taints"]
    assert pod_conditions(env, a)["SlurmNodeStateDrain"].message == HEALTH
    assert slurm.get_node(a).drain is not False  # untouched: still our health drain
    slurm.resume(a)
    assert rec.run_pass().ok
    k = knode(env, a)
    assert not [x for x in k["status"]["conditions"] if x["type"] == "GPUHealthy"]
    assert not k["spec"].get("taints")
    assert "SlurmNodeStateDrain" not in pod_conditions(env, a)

    # Kubernetes -> Slurm: cordon (kubectl) with a custom reason drains; uncordon resumes
    env["api"].patch_node(k8s_name(b),
                          {"metadata": {"annotations": {"autoheal.io/cordon-reason": "lent to inference"}}})
    cordon(env, b)
    assert rec.run_pass().ok
    node = slurm.get_node(b)
    assert node.drain and strip_reason_suffix(node.reason) == "autoheal: k8s: node cordoned: lent to inference"
    origin = knode(env, b)["metadata"]["annotations"]["autoheal.io/slurm-drain-origin"]
    assert origin == strip_reason_suffix(node.reason)
    assert "SlurmNodeStateDrain" in pod_conditions(env, b)  # mirrored in the same pass
    events = env["api"].list_namespaced_event("default").items  # Node events live in default
    assert any(e.reason == "AutohealSlurmDrain" and e.involved_object.name == k8s_name(b) for e in events)
    idle = rec.run_pass()
    assert idle.planned == [], [a.describe() for a in idle.planned]  # converged: an idle pass writes nothing
    cordon(env, b, on=False)
    assert rec.run_pass().ok
    assert not slurm.get_node(b).drain
    assert "autoheal.io/slurm-drain-origin" not in (knode(env, b)["metadata"].get("annotations") or {})

    # an admin drain is never touched, cordoned or not
    slurm.drain(c, "admin: psu swap")
    cordon(env, c)
    assert rec.run_pass().ok
    cordon(env, c, on=False)
    assert rec.run_pass().ok
    node = slurm.get_node(c)
    assert node.drain and strip_reason_suffix(node.reason) == "admin: psu swap"
    slurm.resume(c)
    assert rec.run_pass().ok


def _flip(slurm, a):
    """Make a Node change pending for ``a`` (taint on / off)."""
    slurm.resume(a) if slurm.get_node(a).drain else slurm.drain(a, HEALTH)


def _converged(rec):
    """No writes left (a node resumed a moment ago may still flip IDLE* -> IDLE once in Slurm, which is a
    real change to mirror; more than that would be ping-pong)."""
    idle = rec.run_pass()
    if idle.planned:
        idle = rec.run_pass()
    assert idle.planned == [], [a.describe() for a in idle.planned]


def _lose_a_race(env, rec, a):
    """A real 409: the pass's taint write (guarded by the Node's resourceVersion, as ``spec.taints`` is
    replaced whole) is held at the proxy while someone else writes the Node, so it reaches the server with
    a resourceVersion that is stale by then. (Its condition write, a strategic merge by type, is unguarded.)"""
    rule = env["proxy"].rules.add(method="PATCH", path_regex=rf"/nodes/{k8s_name(a)}$", latency_ms=1500, times=1)
    out = {}
    runner = threading.Thread(target=lambda: out.setdefault("res", rec.run_pass()))
    runner.start()
    wait_for(lambda: rule.hits == 1, 10, "the pass's Node write held at the proxy")
    env["api"].patch_node(k8s_name(a), {"metadata": {"labels": {"someone": f"else-{time.monotonic_ns()}"}}})
    runner.join(30)
    return out["res"]


def test_api_faults_are_reported_then_retried(proxy_env):
    env, slurm, proxy = proxy_env, proxy_env["slurm"], proxy_env["proxy"]
    a = env["names"][0]
    rec = Reconciler(slurm, kube(env), sync_cfg())
    rec.run_pass()
    try:
        for status in (409, 429, 500):
            _flip(slurm, a)
            if status == 409:
                res = _lose_a_race(env, rec, a)
                assert res.conflicts >= 1 and not res.errors, res.summary()
            else:  # what an overloaded server answers (429 with Retry-After, as its max-in-flight filter does)
                rule = proxy.rules.add(method="PATCH", path_regex=r"/nodes/", status=status, times=1,
                                       retry_after=1 if status == 429 else None)
                res = rec.run_pass()
                assert rule.hits == 1
                assert any(f"HTTP {status}" in e for e in res.errors), res.errors
            res = rec.run_pass()  # the fault is gone: the next pass completes the change
            assert res.ok and not res.errors
            _converged(rec)
        # a write that times out is reported like a 5xx and redone by the next pass (the slow server still
        # carries the first one out a moment later: the same change, so nothing is left to do)
        slow = Reconciler(slurm, kube(env, timeout=1.0), sync_cfg())
        _flip(slurm, a)
        patched = node_patches(env["server"])
        held = proxy.rules.add(method="PATCH", path_regex=r"/nodes/", latency_ms=2500, times=1)
        passed = proxy.rules.add(method="PATCH", path_regex=r"/nodes/")  # no fault: counts the others
        res = slow.run_pass()
        assert res.errors and not res.read_error, res.summary()
        # the held write has landed once the server has answered every Node PATCH the proxy passed on (its
        # audit log has a record of each); the next pass then races nothing still in flight
        wait_for(lambda: node_patches(env["server"]) >= patched + held.hits + passed.hits, 15,
                 "the server to answer the held write")
        proxy.rules.clear()
        assert slow.run_pass().ok
        _converged(slow)
        # a failed list read writes nothing at all
        proxy.rules.add(method="GET", path_regex=r"^/api/v1/nodes$", status=500, times=1)
        slurm.drain(a, HEALTH) if not slurm.get_node(a).drain else None
        before = len(writes(env["server"]))
        res = rec.run_pass()
        assert not res.ok and "500" in res.read_error
        assert len(writes(env["server"])) == before
    finally:
        proxy.rules.clear()
        if slurm.get_node(a).drain:
            slurm.resume(a)
        rec.run_pass()


def test_slurmctld_unreachable_changes_nothing(kube_env, tmp_path):
    env, server = kube_env, kube_env["server"]
    # the lab's own slurm.conf, but slurmctld "moved" to a port where nothing listens
    import re
    import socket

    from autoheal.slurm.cli_backend import CliSlurm

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free_port = sock.getsockname()[1]
    text = env["lab"].layout.slurm_conf.read_text()
    bogus = tmp_path / "slurm.conf"
    bogus.write_text(re.sub(r"(?im)^SlurmctldPort=\S+", f"SlurmctldPort={free_port}", text))
    dead = CliSlurm(slurm_conf=str(bogus), timeout=3, retries=0, env=dict(env["lab"].env, SLURM_CONF=str(bogus)))
    cordon(env, env["names"][1])
    try:
        before = len(writes(server))
        res = Reconciler(dead, kube(env), sync_cfg()).run_pass()
        assert not res.ok and res.read_error
        assert len(writes(server)) == before
    finally:
        cordon(env, env["names"][1], on=False)


def test_leader_failover_without_double_writes(kube_env):
    env, slurm = kube_env, kube_env["slurm"]
    a = env["names"][0]
    cfg = sync_cfg(lease_duration_seconds=3.0, slurm_resync_seconds=0.5, lease_name="failover-test")
    d1 = SyncDaemon(slurm, kube(env), cfg, ident="replica-1")
    t1 = threading.Thread(target=d1.run, daemon=True)
    t1.start()
    wait_for(lambda: d1.elector.is_leader(), 10, "replica-1 to lead")
    d2 = SyncDaemon(slurm, kube(env), cfg, ident="replica-2")
    t2 = threading.Thread(target=d2.run, daemon=True)
    t2.start()
    try:
        slurm.drain(a, HEALTH)
        wait_for(lambda: any(t["key"] == "autoheal.io/gpu-unhealthy"
                             for t in knode(env, a)["spec"].get("taints") or []), 10, "taint from the leader")
        wait_for(lambda: d2.passes >= 2, 10, "replica-2 passes")
        assert d1.reconciler.writes and not d2.reconciler.writes  # the follower never wrote
        # the leader crashes (no lease release): replica-2 takes over within the lease duration
        d1.release_on_stop = False
        d1.stop()
        t1.join(10)
        stopped_at = time.monotonic()
        writes_d1 = dict(d1.reconciler.writes)
        slurm.resume(a)
        wait_for(lambda: not (knode(env, a)["spec"].get("taints") or []), 15, "replica-2 to remove the taint")
        took = time.monotonic() - stopped_at
        assert took < cfg.lease_duration_seconds + 2 * cfg.slurm_resync_seconds + 2
        assert d2.reconciler.writes and d1.reconciler.writes == writes_d1
        lease = kube(env).get_lease("slurm", "failover-test")
        assert lease["spec"]["holderIdentity"] == "replica-2"
    finally:
        for d in (d1, d2):
            d.stop()
        t2.join(10)
        if slurm.get_node(a).drain:
            slurm.resume(a)


def test_watch_relists_after_410(kube_env):
    """A real 410 Gone: the API server restarted (its watch cache starts at the revision it found in etcd),
    and the informer resumes its watch from a resourceVersion from before that."""
    from autoheal.k8s_sync.informer import Informer
    from autoheal.k8s_sync.kube import Gone

    env = kube_env
    name = k8s_name(env["names"][0])
    k = KubeApi.from_settings(env["kubeconfig"], timeout=5.0)
    inf = Informer("nodes", k.list_nodes, k.watch_nodes, timeout=5)
    inf.relist()
    old_rv, relists = inf.rv, inf.relists
    env["api"].patch_node(name, {"metadata": {"labels": {"step": "before"}}})  # old_rv is history now
    env["server"].cp.restart("kube-apiserver")
    api = core_api(env["server"])  # a new connection to the restarted server
    for i in range(3):
        api.patch_node(name, {"metadata": {"labels": {"step": str(i)}}})
    with pytest.raises(Gone):
        next(iter(k.watch_nodes(old_rv, 5)))
    inf.rv = old_rv
    inf.start()
    try:
        wait_for(lambda: inf.relists > relists and inf.synced, 20, "relist after 410")
        wait_for(lambda: inf.snapshot()[name]["metadata"]["labels"]["step"] == "2", 10, "the relisted Node")
        api.patch_node(name, {"metadata": {"labels": {"step": "after"}}})
        wait_for(lambda: inf.snapshot()[name]["metadata"]["labels"]["step"] == "after", 10,
                 "watch event after the relist")
    finally:
        inf.stop()
        api.patch_node(name, {"metadata": {"labels": {"step": None}}})


class CountingSlurm:
    """The lab's real Slurm adapter, counting the drain/reason writes a pass makes."""

    def __init__(self, inner):
        self.inner = inner
        self.writes = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def drain(self, node, reason):
        self.writes.append(("drain", node, reason))
        return self.inner.drain(node, reason)

    def set_reason(self, node, reason):
        self.writes.append(("set_reason", node, reason))
        return self.inner.set_reason(node, reason)


def test_hostile_cordon_reasons_are_written_once_by_real_scontrol(kube_env):
    """Issue 16 finding 9: reasons scontrol changes on the way (trailing quote, ` Comment=`, `[x@y]`,
    control characters, over-long text) are written once, not rewritten every pass."""
    from autoheal.k8s_sync import names

    env = kube_env
    b = env["names"][1]
    slurm = CountingSlurm(env["slurm"])
    rec = Reconciler(slurm, kube(env), sync_cfg())
    tricky = ['lent to inference"', "ticket Comment=INC-7 Extra=x", "owner [bob@lab]", "tab\there\x01ctl",
              "y" * 400, 'say "hi" [a@2026-01-01T00:00:00]"']
    try:
        for detail in tricky:
            env["api"].patch_node(k8s_name(b), {"metadata": {"annotations": {"autoheal.io/cordon-reason": detail}}})
            cordon(env, b)
            slurm.writes.clear()
            for _ in range(3):
                assert rec.run_pass().ok
            want = names.k8s_reason("node cordoned", detail)
            assert [w[0] for w in slurm.writes] in (["drain"], ["set_reason"]), (detail, slurm.writes)
            node = slurm.get_node(b)  # `scontrol show node -o`
            listed = {n.name: n for n in slurm.list_nodes()}[b]  # sinfo --json / scontrol --json
            assert node.drain and strip_reason_suffix(node.reason) == want, (detail, node.reason)
            assert strip_reason_suffix(listed.reason).rstrip() == want, (detail, listed.reason)
            # nothing more for this node (the shared lab's other nodes may change state meanwhile: a job of
            # another test ending made gpu1 IDLE in one CI run, and its pod condition followed)
            assert [a for a in rec.run_pass().planned if b == a.slurm_node or a.target in (b, k8s_name(b))] == []
        cordon(env, b, on=False)
        assert rec.run_pass().ok
        assert not slurm.get_node(b).drain
    finally:
        cordon(env, b, on=False)
        env["api"].patch_node(k8s_name(b), {"metadata": {"annotations": {"autoheal.io/cordon-reason": None}}})
        rec.run_pass()


class CutOffKube:
    """One replica's connection to the API server: ``cut`` makes its Lease calls time out (a partition
    between this replica and the API server) while other calls still go through, so the test can see
    whether the replica goes on writing. Writes are logged with the monotonic time they were made."""

    LEASE = ("get_lease", "create_lease", "replace_lease")
    WRITES = ("patch_node", "patch_node_status", "patch_pod_status", "create_event")

    def __init__(self, inner):
        self.inner = inner
        self.cut = False
        self.writes = []

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name in self.LEASE:
            def lease_call(*args, **kwargs):
                if self.cut:
                    from autoheal.k8s_sync.kube import KubeError

                    raise KubeError(f"{name}: timed out (partitioned from the API server)", 0)
                return attr(*args, **kwargs)
            return lease_call
        if name in self.WRITES:
            def write(*args, **kwargs):
                self.writes.append((time.monotonic(), name))
                return attr(*args, **kwargs)
            return write
        return attr


def test_a_replica_that_cannot_renew_its_lease_stops_writing_before_the_other_takes_over(kube_env):
    """Issue 17: the leader loses the API server for its Lease (not for its writes): it must stop acting
    as leader on its own, before the other replica may take over, and never write after that."""
    env, slurm = kube_env, kube_env["slurm"]
    a = env["names"][0]
    cfg = sync_cfg(lease_duration_seconds=3.0, slurm_resync_seconds=0.5, lease_name="partition-test")
    k1 = CutOffKube(kube(env))
    d1 = SyncDaemon(slurm, k1, cfg, ident="replica-1")
    d2 = SyncDaemon(slurm, kube(env), cfg, ident="replica-2")
    threads = [threading.Thread(target=d.run, daemon=True) for d in (d1, d2)]
    threads[0].start()
    wait_for(lambda: d1.elector.is_leader(), 10, "replica-1 to lead")
    threads[1].start()
    wait_for(lambda: d2.passes >= 2, 10, "replica-2 following")
    stop = threading.Event()

    def churn():  # a Slurm change every 0.4 s keeps the leader writing (taint on, taint off)
        while not stop.is_set():
            slurm.resume(a) if slurm.get_node(a).drain else slurm.drain(a, HEALTH)
            stop.wait(0.4)

    churner = threading.Thread(target=churn, daemon=True)
    try:
        churner.start()
        wait_for(lambda: len(k1.writes) >= 2, 10, "replica-1 writing")
        k1.cut = True
        lost = wait_for(lambda: not d1.elector.is_leader() and time.monotonic(), 10, "replica-1 to step down")
        took = wait_for(lambda: d2.elector.is_leader() and time.monotonic(), 10, "replica-2 to take over")
        wait_for(lambda: d2.reconciler.writes, 10, "replica-2 writing")
        # replica-1 keeps running its loop meanwhile: two more passes of it, so "no late write" is seen
        # over passes it made as a follower, not over a loop that had not come round yet
        passes = d1.passes
        wait_for(lambda: d1.passes >= passes + 2, 10, "replica-1 to pass twice more")
        assert lost < took  # it stood down on its own, before the Lease could expire for the other
        late = [w for w in k1.writes if w[0] >= took]  # never two writers
        assert not late, late
        assert d1.passes > 0 and threads[0].is_alive() and not d1.elector.is_leader()
        k1.cut = False  # the partition heals: replica-2 keeps the Lease, replica-1 follows
        # replica-1 has read the Lease again (it names the holder it saw) in a round begun after the heal
        rounds = d1.elector.rounds
        wait_for(lambda: d1.elector.holder == "replica-2" and d1.elector.rounds >= rounds + 2, 15,
                 "replica-1 to read the Lease after the partition healed")
        assert not d1.elector.is_leader() and d2.elector.is_leader()
        assert kube(env).get_lease("slurm", "partition-test")["spec"]["holderIdentity"] == "replica-2"
    finally:
        stop.set()
        churner.join(5)
        for d in (d1, d2):
            d.stop()
        for t in threads:
            t.join(10)
        if slurm.get_node(a).drain:
            slurm.resume(a)
