"""The remediate step end to end on in-memory Slurm and Kubernetes: every state, opt-out, PDB, restarts
at every state, the circuit breaker, timeouts and API errors (issue 7)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoheal.k8s_sync.engine import Reconciler
from autoheal.k8s_sync.kube import KubeError
from autoheal.k8s_sync.remediation import keys
from autoheal.slurm.model import Job, Node
from sync_helpers import SLURMD_LABELS, k8s_name, memory_world, pod_name, sync_cfg

STEPS = ["slurm-to-pods", "health-to-nodes", "nodes-to-slurm", "remediate"]
XID79 = "autoheal: xid 79 on gpu2: GPU has fallen off the bus"
K = keys("autoheal.io")


class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def world(n=4, spares=1, **cfg_kw):
    names = [f"n{i}" for i in range(1, n + 1)]
    slurm, kube = memory_world(names)
    for i in range(1, spares + 1):
        slurm.nodes[f"spare{i}"] = Node(f"spare{i}", "DOWN", frozenset({"DRAIN", "NOT_RESPONDING"}),
                                        "autoheal: spare: held in the spare pool")
    kw = dict(enabled_steps=STEPS, replacement_action="custom-resource", remediation_grace_seconds=100,
              remediation_drain_timeout_seconds=100, remediation_replace_timeout_seconds=100,
              breaker_max_concurrent=2, breaker_max_percent=50, breaker_rearm_percent=10,
              breaker_cooldown_seconds=60)
    kw.update(cfg_kw)
    cfg = sync_cfg(**kw)
    clock = Clock()
    return slurm, kube, cfg, clock


def recon(slurm, kube, cfg, clock, **kw):
    return Reconciler(slurm, kube, cfg, clock=clock, **kw)


def state(kube, name):
    return (kube.nodes[k8s_name(name)]["metadata"].get("annotations") or {}).get(K["state"], "")


def provide_spare(slurm, kube, old="n1", spare="spare1", via_cr=True):
    """What the spare pool does: spare slurmd registers (still drained), Node + slurmd pod, status."""
    n = slurm.nodes[spare]
    slurm.nodes[spare] = replace(n, state="IDLE", flags=frozenset({"DRAIN"}))
    kube.add_node(k8s_name(spare))
    kube.add_pod("slurm", pod_name(spare), k8s_name(spare), spare, SLURMD_LABELS)
    if via_cr:
        kube.customs[("nodereplacements", "slurm", k8s_name(old))]["status"] = {"replacementNode": k8s_name(spare)}
    else:
        kube.nodes[k8s_name(old)]["metadata"]["annotations"][K["replacement"]] = k8s_name(spare)


def run_to(r, kube, name, want, passes=10):
    seen = []
    for _ in range(passes):
        res = r.run_pass()
        assert res.ok, res.errors
        seen.append(state(kube, name))
        if seen[-1] == want:
            return seen
    raise AssertionError(f"never reached {want}: {seen}")


def test_full_flow_from_xid79_to_spare_in_service():
    slurm, kube, cfg, clock = world()
    kube.add_workload_pod("inference", "llm-0", k8s_name("n1"))
    kube.add_workload_pod("kube-system", "dcgm-exporter", k8s_name("n1"), owner_kind="DaemonSet")
    slurm.jobs = [Job("7", "RUNNING", ("n1",))]
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    r.run_pass()
    assert state(kube, "n1") == "quarantined"
    r.run_pass()  # the job still holds the node: nothing else happens
    assert state(kube, "n1") == "quarantined" and not kube.nodes[k8s_name("n1")]["spec"].get("unschedulable")
    slurm.jobs = [Job("7", "PENDING", ())]  # requeued by the hooks
    run_to(r, kube, "n1", "draining")
    node = kube.nodes[k8s_name("n1")]
    assert node["spec"]["unschedulable"] and node["metadata"]["annotations"]["autoheal.io/cordoned-by"] == "autoheal"
    run_to(r, kube, "n1", "replacing")
    assert kube.evictions == [("inference", "llm-0")]  # not the DaemonSet pod, not slurmd
    cr = kube.customs[("nodereplacements", "slurm", k8s_name("n1"))]
    assert cr["spec"] == {"nodeName": k8s_name("n1"), "slurmNode": "n1", "reason": XID79}
    assert slurm.nodes["n1"].drain and "DRAIN" in slurm.nodes["n1"].flags  # cordon is ours: no k8s re-drain
    r.run_pass()
    assert state(kube, "n1") == "replacing"
    provide_spare(slurm, kube)
    run_to(r, kube, "n1", "done")
    assert not slurm.nodes["spare1"].drain and slurm.nodes["spare1"].state == "IDLE"
    assert slurm.nodes["n1"].drain and slurm.nodes["n1"].reason == "autoheal: retired: replaced by spare1"
    reasons = [e["reason"] for e in kube.events]
    for ev in ("AutohealQuarantined", "AutohealCordoned", "AutohealReplacementRequested", "AutohealReplaced"):
        assert ev in reasons
    writes = kube.writes
    for _ in range(3):  # done is terminal: nothing is repeated
        r.run_pass()
    assert kube.writes == writes and len(kube.customs) == 1 and kube.evictions == [("inference", "llm-0")]


def test_dry_run_shows_every_action_and_writes_nothing():
    slurm, kube, cfg, clock = world()
    slurm.drain("n1", XID79)
    writes = kube.writes
    res = recon(slurm, kube, cfg, clock, dry_run=True).run_pass()
    assert kube.writes == writes
    assert any("quarantined" in a.describe() for a in res.planned)


def test_opt_out_label_is_reported_once_and_nothing_happens():
    slurm, kube, cfg, clock = world()
    kube.add_workload_pod("inference", "keep-me", k8s_name("n1"), labels={"autoheal.io/auto-replace": "false"})
    slurm.drain("n1", "autoheal: replace: xid 79 on gpu1 kept failing after reset and reboot")
    r = recon(slurm, kube, cfg, clock)
    for _ in range(3):
        r.run_pass()
    assert state(kube, "n1") == "" and not kube.nodes[k8s_name("n1")]["spec"].get("unschedulable")
    assert [e["reason"] for e in kube.events].count("AutohealReplaceOptOut") == 1
    assert "keep-me" in kube.nodes[k8s_name("n1")]["metadata"]["annotations"][K["opted-out"]]
    assert kube.evictions == [] and kube.customs == {}


def test_pdb_blocking_eviction_backs_off_then_fails_with_reason():
    slurm, kube, cfg, clock = world()
    kube.add_workload_pod("inference", "guarded", k8s_name("n1"))
    kube.pdb_blocked.add(("inference", "guarded"))
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    run_to(r, kube, "n1", "draining")
    res = r.run_pass()
    assert any("refused" in p for p in res.problems) and not res.errors
    res = r.run_pass()  # backing off: no second eviction attempt right away
    assert res.deferred >= 1
    clock.t += 101
    run_to(r, kube, "n1", "failed")
    ann = kube.nodes[k8s_name("n1")]["metadata"]["annotations"]
    assert "eviction" in ann[K["reason"]] and "AutohealRemediationFailed" in [e["reason"] for e in kube.events]
    assert kube.customs == {}


def test_replacement_that_never_arrives_fails_with_reason_and_heals_clear_it():
    slurm, kube, cfg, clock = world()
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    run_to(r, kube, "n1", "replacing")
    clock.t += 101
    run_to(r, kube, "n1", "failed")
    assert "never arrived" in kube.nodes[k8s_name("n1")]["metadata"]["annotations"][K["reason"]]
    slurm.resume("n1")  # repaired by hand and resumed: the record is cleared, a new fault starts fresh
    r.run_pass()
    assert state(kube, "n1") == ""


@pytest.mark.parametrize("crash_in", ["quarantined", "draining", "replacing"])
def test_daemon_killed_at_every_state_and_restarted_repeats_nothing(crash_in):
    slurm, kube, cfg, clock = world()
    kube.add_workload_pod("inference", "llm-0", k8s_name("n1"))
    slurm.drain("n1", XID79)
    run_to(recon(slurm, kube, cfg, clock), kube, "n1", crash_in)
    r2 = recon(slurm, kube, cfg, clock)  # a new process: no memory but the annotations
    run_to(r2, kube, "n1", "replacing")
    provide_spare(slurm, kube)
    run_to(recon(slurm, kube, cfg, clock), kube, "n1", "done")
    assert kube.evictions == [("inference", "llm-0")] and len(kube.customs) == 1
    starts = [e for e in kube.events if e["reason"] == "AutohealQuarantined"]
    assert len(starts) == 1


def test_lost_request_after_state_write_is_reissued():
    slurm, kube, cfg, clock = world()
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    kube.fail["create_custom"] = KubeError("create: HTTP 500", 500)
    run_to(r, kube, "n1", "replacing")  # the state was written, the request failed
    assert kube.customs == {}
    del kube.fail["create_custom"]
    r.run_pass()
    assert len(kube.customs) == 1


def test_breaker_10_of_12_failing_remediates_exactly_the_allowed_ones_and_rearms():
    slurm, kube, cfg, clock = world(n=12, spares=0, breaker_max_concurrent=2, breaker_max_percent=25,
                                    breaker_rearm_percent=10, breaker_cooldown_seconds=60)
    for i in range(1, 11):
        slurm.drain(f"n{i}", XID79)
    r = recon(slurm, kube, cfg, clock)
    res = r.run_pass()
    all_names = [f"n{i}" for i in range(1, 13)]
    started = [n for n in all_names if state(kube, n)]
    assert len(started) == 2  # exactly the allowed ones (2 concurrent, 25% of 12 = 3 per window)
    assert res.breaker["tripped"] and any("breaker tripped" in p for p in res.problems)
    assert sum("not started" in p for p in res.problems) == 8  # the rest reported
    assert "AutohealBreakerTripped" in [e["reason"] for e in kube.events]
    for _ in range(3):
        r.run_pass()
    assert [n for n in all_names if state(kube, n)] == started
    # the glitch passes: the hooks resume all but one waiting node; the cooldown ends
    waiting = [n for n in all_names[:10] if n not in started]
    for n in waiting[1:]:
        slurm.resume(n)
    clock.t += 61
    res = r.run_pass()
    assert res.breaker["tripped"]  # hysteresis: 3 of 12 (25%) still affected > re-arm level 10%
    for n in started:  # the two remediations end and their nodes are repaired by hand
        kube.nodes[k8s_name(n)]["metadata"]["annotations"][K["state"]] = "failed"
        slurm.resume(n)
    res = r.run_pass()
    assert not res.breaker["tripped"]
    assert "AutohealBreakerRearmed" in [e["reason"] for e in kube.events]
    assert not kube.configmaps[("slurm", "autoheal-sync-breaker")]["data"].get("trippedAt")
    # only the node still asking starts; the healed ones are not replayed
    assert [n for n in all_names if state(kube, n)] == [waiting[0]]


def test_breaker_reset_by_hand_and_kept_across_restarts():
    from autoheal.k8s_sync.cli import breaker_reset_patch

    slurm, kube, cfg, clock = world(n=4, spares=0, breaker_max_percent=25, breaker_rearm_percent=10)
    for i in range(1, 4):
        slurm.drain(f"n{i}", XID79)
    recon(slurm, kube, cfg, clock).run_pass()
    res = recon(slurm, kube, cfg, clock).run_pass()  # a restarted daemon still sees the trip
    assert res.breaker["tripped"]
    kube.patch_configmap("slurm", "autoheal-sync-breaker", breaker_reset_patch())
    assert [n for n in ("n1", "n2", "n3") if state(kube, n)] == ["n1"]
    res = recon(slurm, kube, cfg, clock).run_pass()
    # re-armed: one more start within the limits (25% of 4 per window), then it trips again (75% drained)
    assert [n for n in ("n1", "n2", "n3") if state(kube, n)] == ["n1", "n2"] and res.breaker["tripped"]


def test_failed_reads_change_nothing():
    slurm, kube, cfg, clock = world()
    slurm.drain("n1", XID79)
    kube.fail["get_configmap"] = KubeError("get: HTTP 500", 500)
    writes = kube.writes
    res = recon(slurm, kube, cfg, clock).run_pass()
    assert not res.ok and kube.writes == writes
    del kube.fail["get_configmap"]
    kube.fail["list_node_pods"] = KubeError("list: timeout", 0)
    res = recon(slurm, kube, cfg, clock).run_pass()
    assert not res.ok and kube.writes == writes and state(kube, "n1") == ""


def test_api_errors_mid_flow_retry_next_pass():
    slurm, kube, cfg, clock = world()
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    kube.fail["patch_node"] = KubeError("patch: HTTP 500", 500)
    res = r.run_pass()
    assert res.errors and state(kube, "n1") == ""
    del kube.fail["patch_node"]
    run_to(r, kube, "n1", "replacing")


@pytest.mark.parametrize("action", ["label", "delete-node"])
def test_other_request_actions(action):
    slurm, kube, cfg, clock = world(replacement_action=action)
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    for _ in range(5):
        r.run_pass()
    if action == "label":
        node = kube.nodes[k8s_name("n1")]
        assert node["metadata"]["labels"]["autoheal.io/replace"] == "requested"
        assert state(kube, "n1") == "replacing"
        provide_spare(slurm, kube, via_cr=False)
        run_to(r, kube, "n1", "done")
        assert not slurm.nodes["spare1"].drain
    else:
        assert kube.deleted_nodes == [k8s_name("n1")]
        assert slurm.nodes["n1"].reason == "autoheal: retired: Node deleted for replacement"


def test_k8s_drain_replaced_by_health_drain_then_redrained_after_resume():
    """Ping-pong guard: a GPU fault on a node drained for a cordon takes over the reason (health ->
    GPUHealthy=False + taint, no k8s resume); after the hooks resume it, the cordon drains it again."""
    slurm, kube, cfg, clock = world(enabled_steps=STEPS[:3])
    kube.nodes[k8s_name("n1")]["spec"]["unschedulable"] = True
    r = recon(slurm, kube, cfg, clock)
    r.run_pass()
    assert slurm.nodes["n1"].reason.startswith("autoheal: k8s: node cordoned")
    slurm.set_reason("n1", "autoheal: ecc-dbe on gpu 3")  # the node side replaced it
    r.run_pass()
    node = kube.nodes[k8s_name("n1")]
    assert any(c["type"] == "GPUHealthy" and c["status"] == "False" for c in node["status"]["conditions"])
    assert any(t["key"] == "autoheal.io/gpu-unhealthy" for t in node["spec"].get("taints", []))
    assert slurm.nodes["n1"].drain and slurm.nodes["n1"].reason == "autoheal: ecc-dbe on gpu 3"
    slurm.resume("n1")  # the hooks found it healthy again
    r.run_pass()
    assert slurm.nodes["n1"].drain and slurm.nodes["n1"].reason.startswith("autoheal: k8s: node cordoned")
    r.run_pass()
    assert not any(t["key"] == "autoheal.io/gpu-unhealthy" for t in kube.nodes[k8s_name("n1")]["spec"].get("taints", []))


def test_webhook_action_posts_once_survives_restart_and_retries_on_error():
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    got, answers = [], [500]

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            code = answers.pop(0) if answers else 200
            body = json.dumps({"replacementNode": k8s_name("spare1")}).encode() if code == 200 else b"{}"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/replace"
        slurm, kube, cfg, clock = world(replacement_action="webhook", replacement_webhook=url)
        slurm.drain("n1", XID79)
        r = recon(slurm, kube, cfg, clock)
        for _ in range(6):
            r.run_pass()
        # the first POST got a 500: not recorded as requested, so it was sent again, and accepted
        assert len(got) == 2 and got[0] == got[1]
        assert {k: got[1][k] for k in ("node", "slurm_node", "reason")} == {
            "node": k8s_name("n1"), "slurm_node": "n1", "reason": XID79}
        assert got[1]["idempotency_key"].startswith(k8s_name("n1"))
        ann = kube.nodes[k8s_name("n1")]["metadata"]["annotations"]
        assert ann[K["requested"]] and ann[K["replacement"]] == k8s_name("spare1")
        assert state(kube, "n1") == "replacing"
        # a restarted daemon does not POST again
        r2 = recon(slurm, kube, cfg, clock)
        for _ in range(3):
            r2.run_pass()
        assert len(got) == 2
        provide_spare(slurm, kube, via_cr=False)
        run_to(r2, kube, "n1", "done")
        assert not slurm.nodes["spare1"].drain
    finally:
        srv.shutdown()
        srv.server_close()
