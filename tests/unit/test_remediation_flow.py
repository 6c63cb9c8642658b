"""The remediate step end to end on in-memory Slurm and Kubernetes: every state, opt-out, PDB, restarts
at every state, the circuit breaker, timeouts and API errors (issue 7)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sync_helpers import SLURMD_LABELS, k8s_name, memory_world, pod_name, sync_cfg

from autoheal.k8s_sync.engine import Reconciler
from autoheal.k8s_sync.kube import KubeError
from autoheal.k8s_sync.remediation import keys
from autoheal.slurm.model import Job, Node

STEPS = ["slurm-to-pods", "health-to-nodes", "nodes-to-slurm", "remediate"]
# the hooks' replace rung for XID 79 (policy replace): what the sync acts on (issue 22: never the XID alone)
XID79 = "autoheal: replace: xid 79 on gpu2: GPU has fallen off the bus"
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


def started(kube, name):
    """A remediation under way or ended (not waiting for the breaker, not none)."""
    return state(kube, name) not in ("", "waiting")


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
    slurm.jobs = {"7": Job("7", "RUNNING", ("n1",))}
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    r.run_pass()
    assert state(kube, "n1") == "quarantined"
    r.run_pass()  # the job still holds the node: nothing else happens
    assert state(kube, "n1") == "quarantined" and not kube.nodes[k8s_name("n1")]["spec"].get("unschedulable")
    slurm.jobs = {"7": Job("7", "PENDING", ())}  # requeued by the hooks
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
    started = [n for n in all_names if state(kube, n) not in ("", "waiting")]
    assert len(started) == 2  # exactly the allowed ones (2 concurrent, 25% of 12 = 3 per window)
    assert res.breaker["tripped"] and any("breaker tripped" in p for p in res.problems)
    assert sum("not started" in p for p in res.problems) == 8  # the rest reported
    # the rest wait, visibly on the Node; the trip's one record speaks for them (no Event each)
    assert [n for n in all_names if state(kube, n) == "waiting"] == [n for n in all_names[:10] if n not in started]
    reasons = [e["reason"] for e in kube.events]
    assert "AutohealBreakerTripped" in reasons and "AutohealRemediationWaiting" not in reasons
    for _ in range(3):
        r.run_pass()
    assert [n for n in all_names if state(kube, n) not in ("", "waiting")] == started
    assert {kube.nodes[k8s_name(n)]["metadata"]["annotations"][K["waiting-limit"]]
            for n in all_names[:10] if n not in started} == {"tripped"}
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
    # only the node still asking starts; the healed ones are not replayed (their waiting state is cleared)
    assert [n for n in all_names if state(kube, n)] == [waiting[0]] and state(kube, waiting[0]) == "quarantined"


def test_breaker_reset_by_hand_and_kept_across_restarts():
    from autoheal.k8s_sync.cli import breaker_reset_patch

    slurm, kube, cfg, clock = world(n=4, spares=0, breaker_max_percent=25, breaker_rearm_percent=10)
    for i in range(1, 4):
        slurm.drain(f"n{i}", XID79)
    recon(slurm, kube, cfg, clock).run_pass()
    res = recon(slurm, kube, cfg, clock).run_pass()  # a restarted daemon still sees the trip
    assert res.breaker["tripped"]
    kube.patch_configmap("slurm", "autoheal-sync-breaker", breaker_reset_patch())
    assert [n for n in ("n1", "n2", "n3") if started(kube, n)] == ["n1"]
    res = recon(slurm, kube, cfg, clock).run_pass()
    # re-armed: one more start within the limits (25% of 4 per window), then it trips again (75% drained)
    assert [n for n in ("n1", "n2", "n3") if started(kube, n)] == ["n1", "n2"] and res.breaker["tripped"]


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
    taints = kube.nodes[k8s_name("n1")]["spec"].get("taints", [])
    assert not any(t["key"] == "autoheal.io/gpu-unhealthy" for t in taints)


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


# ---- issue 17 item 1: eviction backoff, last attempt, failed is not final -----------------------------
def evict_attempts(kube, name):
    return sum(1 for e in kube.evict_log if e == name)


def counting_evictions(kube):
    """Record every eviction attempt (refused or not) on the MemoryKube."""
    kube.evict_log = []
    orig = kube.evict_pod

    def evict(namespace, name):
        kube.evict_log.append(name)
        return orig(namespace, name)

    kube.evict_pod = evict


def test_pdb_deleted_after_many_refusals_is_retried_before_the_deadline_and_node_replaced():
    """The issue's trace: after 5 refusals the next uncapped retry (16 s) lay beyond the 30 s drain
    timeout and the node failed although the PDB was gone. Capped by the time left, the retry happens at
    the deadline and the node is replaced."""
    slurm, kube, cfg, clock = world(remediation_drain_timeout_seconds=30)
    kube.add_workload_pod("inference", "guarded", k8s_name("n1"))
    kube.pdb_blocked.add(("inference", "guarded"))
    counting_evictions(kube)
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    run_to(r, kube, "n1", "draining")
    start = clock.t
    while clock.t - start < 16:  # a pass every 0.5 s for 16 s: refused at 0, 1, 3, 7 and 15 s
        r.run_pass()
        clock.t += 0.5
    assert evict_attempts(kube, "guarded") == 5
    kube.pdb_blocked.clear()  # the PDB is deleted
    while clock.t - start < 30:  # backing off, but never past the deadline
        r.run_pass()
        clock.t += 0.5
    assert evict_attempts(kube, "guarded") == 5
    r.run_pass()  # at the deadline (30 s): the retry, not a failure
    assert kube.evictions == [("inference", "guarded")] and evict_attempts(kube, "guarded") == 6
    clock.t += 0.5
    r.run_pass()
    assert state(kube, "n1") == "replacing", kube.nodes[k8s_name("n1")]["metadata"]["annotations"]
    provide_spare(slurm, kube)
    run_to(r, kube, "n1", "done")


def test_one_last_eviction_attempt_at_the_deadline_whatever_the_backoff():
    slurm, kube, cfg, clock = world(remediation_drain_timeout_seconds=30)
    kube.add_workload_pod("inference", "guarded", k8s_name("n1"))
    kube.pdb_blocked.add(("inference", "guarded"))
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    run_to(r, kube, "n1", "draining")
    r.run_pass()
    r.evict_backoff = {k: (9, clock.t + 3600, v[2]) for k, v in r.evict_backoff.items()}  # a stale long backoff
    kube.pdb_blocked.clear()
    clock.t += 31  # the daemon was away over the deadline: no pass saw it
    r.run_pass()  # the last attempt, forced, succeeds
    assert kube.evictions == [("inference", "guarded")]
    run_to(r, kube, "n1", "replacing")


def test_last_attempt_refused_fails_with_the_pods_named():
    slurm, kube, cfg, clock = world(remediation_drain_timeout_seconds=30)
    kube.add_workload_pod("inference", "guarded", k8s_name("n1"))
    kube.pdb_blocked.add(("inference", "guarded"))
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    run_to(r, kube, "n1", "draining")
    clock.t += 31
    r.run_pass()
    ann = kube.nodes[k8s_name("n1")]["metadata"]["annotations"]
    assert state(kube, "n1") == "draining" and ann[K["final-eviction"]]  # the last attempt is on record
    r2 = recon(slurm, kube, cfg, clock)  # a failover right after it: the new leader does not try again
    run_to(r2, kube, "n1", "failed")
    assert "inference/guarded" in kube.nodes[k8s_name("n1")]["metadata"]["annotations"][K["reason"]]
    assert K["final-eviction"] not in kube.nodes[k8s_name("n1")]["metadata"]["annotations"]


def test_an_eviction_that_succeeds_resets_the_backoff_of_the_nodes_other_pods():
    slurm, kube, cfg, clock = world(remediation_drain_timeout_seconds=300)
    kube.add_workload_pod("inference", "a", k8s_name("n1"))
    kube.pdb_blocked.add(("inference", "a"))
    counting_evictions(kube)
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    run_to(r, kube, "n1", "draining")
    for _ in range(5):
        r.run_pass()
        clock.t += 8
    tried = evict_attempts(kube, "a")
    r.run_pass()  # backing off (16 s): "a" is not tried
    assert evict_attempts(kube, "a") == tried
    kube.pdb_blocked.clear()  # the workload scaled: the PDB lets pods go now
    kube.add_workload_pod("inference", "b", k8s_name("n1"))  # a new pod is evicted at once: progress
    r.run_pass()
    assert ("inference", "b") in kube.evictions
    r.run_pass()  # no clock change: "a" no longer waits out its old backoff
    assert ("inference", "a") in kube.evictions


def fail_remediation(r, kube, clock, name="n1"):
    run_to(r, kube, name, "replacing")
    clock.t += 101
    run_to(r, kube, name, "failed")


def test_failed_remediation_is_retried_after_the_cooldown_until_attempts_run_out(tmp_path):
    from autoheal.journal import Journal

    slurm, kube, cfg, clock = world()
    cfg.remediation_retry_seconds, cfg.remediation_max_attempts = 50, 2
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock, journal=journal)
    fail_remediation(r, kube, clock)
    res = r.run_pass()
    assert state(kube, "n1") == "failed" and "automatic retry in" in res.remediations[k8s_name("n1")]["retry"]
    clock.t += 51
    r.run_pass()
    ann = kube.nodes[k8s_name("n1")]["metadata"]["annotations"]
    assert ann[K["state"]] == "quarantined" and ann[K["attempts"]] == "2"
    assert "AutohealRemediationRetry" in [e["reason"] for e in kube.events]
    assert [x.event for x in journal.read(node="n1")].count("remediation-retry") == 1
    fail_remediation(r, kube, clock)
    clock.t += 51
    res = r.run_pass()  # the second attempt was the last automatic one
    assert state(kube, "n1") == "failed" and "no automatic retry left" in res.remediations[k8s_name("n1")]["retry"]


def test_operator_retry_starts_a_failed_remediation_again_and_it_completes():
    from autoheal.k8s_sync.remediation import retry_patch

    slurm, kube, cfg, clock = world()
    cfg.remediation_max_attempts = 1  # no automatic retry
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    fail_remediation(r, kube, clock)
    clock.t += 10_000
    r.run_pass()
    assert state(kube, "n1") == "failed"
    node = kube.nodes[k8s_name("n1")]
    kube.patch_node(k8s_name("n1"), retry_patch(node, "autoheal.io", clock.t, "alice"), "merge")
    with pytest.raises(ValueError):  # not failed any more: nothing to retry
        retry_patch(kube.nodes[k8s_name("n1")], "autoheal.io", clock.t)
    r.run_pass()
    ann = kube.nodes[k8s_name("n1")]["metadata"]["annotations"]
    assert ann[K["state"]] == "quarantined" and ann[K["attempts"]] == "2" and K["retry-requested"] not in ann
    run_to(r, kube, "n1", "replacing")
    provide_spare(slurm, kube)
    run_to(r, kube, "n1", "done")


def test_retry_patch_is_refused_on_a_concurrent_write():
    from autoheal.k8s_sync.kube import Conflict
    from autoheal.k8s_sync.remediation import retry_patch

    slurm, kube, cfg, clock = world()
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    fail_remediation(r, kube, clock)
    body = retry_patch(kube.nodes[k8s_name("n1")], "autoheal.io", clock.t)
    kube.patch_node(k8s_name("n1"), {"metadata": {"labels": {"x": "y"}}}, "merge")  # someone wrote meanwhile
    with pytest.raises(Conflict):
        kube.patch_node(k8s_name("n1"), body, "merge")


# ---- issue 17 item 2: the opt-out is re-evaluated every pass; the label may sit on the Node ------------
def test_opt_out_lifted_when_the_pod_label_is_removed_and_shown_meanwhile():
    slurm, kube, cfg, clock = world()
    kube.add_workload_pod("inference", "keep-me", k8s_name("n1"), labels={"autoheal.io/auto-replace": "false"})
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    for _ in range(3):
        res = r.run_pass()
    assert state(kube, "n1") == "" and list(res.opted_out) == [k8s_name("n1")]
    assert any("needs a replacement but pod inference/keep-me" in p for p in res.problems)
    writes = kube.writes
    r.run_pass()
    assert kube.writes == writes  # reported, not rewritten every pass
    kube.other_pods[("inference", "keep-me")]["metadata"]["labels"] = {}
    res = r.run_pass()
    ann = kube.nodes[k8s_name("n1")]["metadata"]["annotations"]
    assert ann[K["state"]] == "quarantined" and K["opted-out"] not in ann and not res.opted_out
    assert any("opt-out lifted" in e["message"] for e in kube.events)
    run_to(r, kube, "n1", "replacing")


def test_opt_out_label_on_the_node_itself_vetoes_until_removed():
    slurm, kube, cfg, clock = world()
    kube.nodes[k8s_name("n1")]["metadata"]["labels"]["autoheal.io/auto-replace"] = "false"
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    for _ in range(3):
        res = r.run_pass()
    assert state(kube, "n1") == "" and not kube.nodes[k8s_name("n1")]["spec"].get("unschedulable")
    assert "Node k8s-n1 carries" in res.opted_out[k8s_name("n1")]["why"]
    assert [e["reason"] for e in kube.events].count("AutohealReplaceOptOut") == 1
    del kube.nodes[k8s_name("n1")]["metadata"]["labels"]["autoheal.io/auto-replace"]
    run_to(r, kube, "n1", "replacing")


def test_opt_out_lifted_while_the_breaker_is_full_clears_the_mark_and_waits():
    slurm, kube, cfg, clock = world(n=4, breaker_max_concurrent=1)
    kube.add_workload_pod("inference", "keep-me", k8s_name("n2"), labels={"autoheal.io/auto-replace": "false"})
    slurm.drain("n1", XID79)
    slurm.drain("n2", XID79)
    r = recon(slurm, kube, cfg, clock)
    r.run_pass()
    assert state(kube, "n1") == "quarantined"
    assert K["opted-out"] in kube.nodes[k8s_name("n2")]["metadata"]["annotations"]
    kube.other_pods[("inference", "keep-me")]["metadata"]["labels"] = {}
    res = r.run_pass()
    assert K["opted-out"] not in kube.nodes[k8s_name("n2")]["metadata"]["annotations"]
    assert state(kube, "n2") == "waiting"  # not started, and says so on the Node
    assert any("remediation of k8s-n2 (n2) not started" in p for p in res.problems)


# ---- issue 16 finding 8: a remediation that ends after the node is resumed cleans up after itself -------
def cordoned(kube, name):
    node = kube.nodes[k8s_name(name)]
    return bool(node["spec"].get("unschedulable")), (node["metadata"].get("annotations") or {}).get(
        "autoheal.io/cordoned-by")


def test_failed_then_resumed_uncordons_and_deletes_the_stale_request(tmp_path):
    from autoheal.journal import Journal

    slurm, kube, cfg, clock = world()
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock, journal=journal)
    fail_remediation(r, kube, clock)
    assert cordoned(kube, "n1") == (True, "autoheal") and len(kube.customs) == 1
    slurm.resume("n1")  # repaired by hand
    r.run_pass()
    node = kube.nodes[k8s_name("n1")]
    assert cordoned(kube, "n1") == (False, None)
    assert not [a for a in node["metadata"]["annotations"] if "remediation" in a or "replacement" in a]
    assert "autoheal.io/remediation" not in node["metadata"]["labels"]
    assert kube.customs == {}
    assert not slurm.nodes["n1"].drain  # the uncordon is ours: it never comes back as a k8s drain
    assert "AutohealRemediationCleared" in [e["reason"] for e in kube.events]
    assert "remediation-cleared" in [x.event for x in journal.read(node="n1")]
    writes = kube.writes
    r.run_pass()
    assert kube.writes == writes


def test_an_active_remediation_is_abandoned_when_the_node_is_resumed():
    slurm, kube, cfg, clock = world(replacement_action="label")
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    run_to(r, kube, "n1", "replacing")
    assert kube.nodes[k8s_name("n1")]["metadata"]["labels"]["autoheal.io/replace"] == "requested"
    slurm.resume("n1")
    r.run_pass()
    node = kube.nodes[k8s_name("n1")]
    assert state(kube, "n1") == "" and cordoned(kube, "n1") == (False, None)
    assert "autoheal.io/replace" not in node["metadata"]["labels"]
    assert "AutohealRemediationAbandoned" in [e["reason"] for e in kube.events]
    slurm.drain("n1", XID79)  # the next fault starts afresh
    r.run_pass()
    assert state(kube, "n1") == "quarantined"


def test_a_humans_cordon_is_never_undone():
    slurm, kube, cfg, clock = world()
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    fail_remediation(r, kube, clock)
    # a human cordons it too: kubectl cordon sets unschedulable; the mark shows whose cordon it is
    del kube.nodes[k8s_name("n1")]["metadata"]["annotations"]["autoheal.io/cordoned-by"]
    slurm.resume("n1")
    r.run_pass()
    assert kube.nodes[k8s_name("n1")]["spec"].get("unschedulable") and state(kube, "n1") == ""


def test_admin_drain_over_a_failed_remediation_clears_the_record_but_keeps_the_cordon():
    slurm, kube, cfg, clock = world()
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    fail_remediation(r, kube, clock)
    slurm.set_reason("n1", "admin: RMA ticket 42")
    r.run_pass()
    assert state(kube, "n1") == "" and cordoned(kube, "n1") == (True, "autoheal") and kube.customs == {}


# ---- issue 17 item 7: done only when the spare answers in Slurm ---------------------------------------
def test_done_only_once_the_resumed_spare_responds():
    slurm, kube, cfg, clock = world()
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    run_to(r, kube, "n1", "replacing")
    provide_spare(slurm, kube)
    r.run_pass()  # registered: resumed, not done yet
    assert state(kube, "n1") == "replacing" and not slurm.nodes["spare1"].drain
    # Slurm shows a just-resumed node `idle*` (not responding) for a while
    slurm.nodes["spare1"] = replace(slurm.nodes["spare1"], flags=frozenset({"NOT_RESPONDING"}))
    for _ in range(3):
        r.run_pass()
    assert state(kube, "n1") == "replacing"
    slurm.nodes["spare1"] = replace(slurm.nodes["spare1"], flags=frozenset())
    r.run_pass()
    assert state(kube, "n1") == "done" and slurm.nodes["n1"].reason == "autoheal: retired: replaced by spare1"


# ---- issue 17 item 7: breaker records filed under the nodes concerned --------------------------------
def test_breaker_records_are_filed_under_the_nodes_concerned(tmp_path):
    from autoheal.journal import Journal

    slurm, kube, cfg, clock = world(n=4, spares=0, breaker_max_percent=25, breaker_rearm_percent=10)
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    for i in range(1, 4):
        slurm.drain(f"n{i}", XID79)
    res = recon(slurm, kube, cfg, clock, journal=journal).run_pass()
    assert res.breaker["tripped"] and res.breaker["nodes"] == ["n1", "n2", "n3"]
    for n in ("n1", "n2", "n3"):
        assert [x.event for x in journal.read(node=n)].count("breaker-tripped") == 1
    assert not list(journal.read(node="n4"))
    data = kube.configmaps[("slurm", "autoheal-sync-breaker")]["data"]
    assert data["nodes"] == '["n1", "n2", "n3"]'


def test_metrics_count_states_opted_out_nodes_and_the_breaker():
    pytest.importorskip("prometheus_client")
    from autoheal.k8s_sync.metrics import Metrics

    slurm, kube, cfg, clock = world(n=4)
    kube.add_workload_pod("inference", "keep-me", k8s_name("n2"), labels={"autoheal.io/auto-replace": "false"})
    slurm.drain("n1", XID79)
    slurm.drain("n2", XID79)
    m = Metrics()
    r = recon(slurm, kube, cfg, clock, metrics=m)
    for _ in range(3):  # the summary shows the states read at the start of a pass
        r.run_pass()
    get = m.registry.get_sample_value
    assert get("autoheal_sync_remediation_opted_out") == 1
    assert get("autoheal_sync_remediations", {"state": "quarantined"}) == 0  # n1 moved on
    assert get("autoheal_sync_remediations", {"state": "draining"}) == 1
    assert get("autoheal_sync_breaker_tripped") == 0
    kube.other_pods[("inference", "keep-me")]["metadata"]["labels"] = {}
    r.run_pass()
    assert get("autoheal_sync_remediation_opted_out") == 0


def test_done_is_written_only_after_the_old_node_is_retired_in_slurm():
    """CI saw remediation-state=done while gpu1 still had its XID reason: the record went first and the
    Slurm retire after it. Killed in between, nothing would ever retire the node. Slurm goes first now."""
    from autoheal.errors import SlurmUnavailable

    slurm, kube, cfg, clock = world()
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    run_to(r, kube, "n1", "replacing")
    provide_spare(slurm, kube)
    real_drain, real_set = slurm.drain, slurm.set_reason

    def refuse_n1(real):
        def call(node, reason):
            if node == "n1" and "retired" in reason:
                raise SlurmUnavailable("slurmctld not answering (simulated)")
            return real(node, reason)
        return call

    slurm.drain, slurm.set_reason = refuse_n1(real_drain), refuse_n1(real_set)
    for _ in range(4):
        r.run_pass()
        assert state(kube, "n1") == "replacing" and "retired" not in slurm.nodes["n1"].reason
    slurm.drain, slurm.set_reason = real_drain, real_set
    run_to(r, kube, "n1", "done")
    assert slurm.nodes["n1"].reason == "autoheal: retired: replaced by spare1"


def test_breaker_share_counts_only_the_pool_a_node_that_left_it_is_not_affected():
    """Soak bench seed 1: "5 of 4 nodes (125%) in remediation or drained by autoheal": a remediation still
    `replacing` after its node left the pool (slurmd pod gone, spare registering) counted against the pool.
    It still counts against the concurrency limit."""
    slurm, kube, cfg, clock = world(n=4, spares=1, breaker_max_concurrent=2, breaker_max_percent=50,
                                    breaker_rearm_percent=10)
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    run_to(r, kube, "n1", "replacing")
    provide_spare(slurm, kube)
    slurm.nodes["spare1"] = replace(slurm.nodes["spare1"], flags=frozenset({"DRAIN", "NOT_RESPONDING"}))
    kube.pods.pop(("slurm", pod_name("n1")))  # the old machine's slurmd is gone: n1 left the pool
    for name in ("n2", "n3"):
        slurm.drain(name, XID79)
    res = r.run_pass()
    # pool: n2 n3 n4 spare1; out: n2 n3 = 50 %, not > 50 %: no trip (n1 counted too made it 75 %)
    assert not res.breaker["tripped"], res.breaker
    assert state(kube, "n1") == "replacing"
    # n1's remediation still holds one of the 2 concurrent slots: one of n2/n3 starts, not both
    assert [n for n in ("n2", "n3") if started(kube, n)] == ["n2"] and state(kube, "n3") == "waiting"
    slurm.drain("n4", XID79)
    res = r.run_pass()
    assert res.breaker["tripped"]  # n2 n3 n4 of 4 = 75 %
    why = kube.configmaps[("slurm", "autoheal-sync-breaker")]["data"]["why"]
    assert why.startswith("3 of 4 nodes (75%)"), why


def test_a_spare_drained_for_its_own_fault_just_after_its_resume_still_completes_the_replacement():
    """Soak seed 46688 (issue 22): spare1 replaced n1 (registered, resumed by the sync), and a fault on
    spare1 (XID 94/95 seconds later) drained it before the sync saw it in service. "Done" waited for a
    spare in service, so the remediation failed ("replacement never arrived within 90s"), although the
    old machine was gone: n1 kept `autoheal: replace: ...`, the soak's technician "repaired" the machine
    that had left, and n1 ended DOWN. A spare drained by the hooks for its own fault was in service:
    the replacement arrived; its fault is its own (a remediation of its own if it asks for one)."""
    slurm, kube, cfg, clock = world()
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    run_to(r, kube, "n1", "replacing")
    provide_spare(slurm, kube)
    r.run_pass()  # registered: resumed, not done yet
    assert not slurm.nodes["spare1"].drain
    slurm.drain("spare1", "autoheal: xid 95 on GPU 1 of spare1 (0000:3b:00.0): uncontained ECC error")
    r.run_pass()
    assert state(kube, "n1") == "done" and slurm.nodes["n1"].reason == "autoheal: retired: replaced by spare1"
    assert slurm.nodes["spare1"].reason.startswith("autoheal: xid 95")  # the spare's own drain is left alone


def test_a_spare_held_by_an_admin_before_it_took_jobs_is_still_waited_for():
    slurm, kube, cfg, clock = world()
    slurm.drain("n1", XID79)
    r = recon(slurm, kube, cfg, clock)
    run_to(r, kube, "n1", "replacing")
    provide_spare(slurm, kube)
    r.run_pass()
    slurm.drain("spare1", "bios update by bob")  # not a fault autoheal found: not proof it took jobs
    for _ in range(3):
        r.run_pass()
    assert state(kube, "n1") == "replacing"
