"""Issue 27: a remediation the breaker's start share (or its concurrency limit) holds back waits visibly
(state ``waiting`` on the Node with why and until when, one Event, one journal record, a metric), and
starts by itself when the limit allows, oldest request first, an order kept across sync restarts."""

from __future__ import annotations

import pytest
from sync_helpers import k8s_name
from test_remediation_flow import XID79, K, recon, started, state, world

from autoheal.k8s_sync.remediation import Breaker, Limit, start_capacity, wait_for

WINDOW = 3600.0


def ann(kube, name):
    return kube.nodes[k8s_name(name)]["metadata"].get("annotations") or {}


def two_starts_used(slurm, kube, cfg, clock):
    """The soak's seed 4242: two nodes were replaced (here: started, then healed and resumed) within the
    window, so the share (50 % of 4 = 2 starts per hour) is used up while nothing else is affected."""
    r = recon(slurm, kube, cfg, clock)
    for name in ("n1", "n2"):
        slurm.drain(name, XID79)
        r.run_pass()
        assert state(kube, name) == "quarantined"
        clock.t += 100
    for name in ("n1", "n2"):
        slurm.resume(name)
    r.run_pass()
    assert not state(kube, "n1") and not state(kube, "n2")
    return r


def test_start_share_reached_the_node_waits_visibly_then_starts_by_itself(tmp_path):
    from autoheal.journal import Journal

    slurm, kube, cfg, clock = world(n=4, spares=0, breaker_max_concurrent=3, breaker_max_percent=50,
                                    breaker_window_seconds=WINDOW)
    first_start = clock.t
    two_starts_used(slurm, kube, cfg, clock)
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    slurm.drain("n4", XID79)
    asked = clock.t
    for _ in range(5):  # several passes: said once, not every pass
        r = recon(slurm, kube, cfg, clock, journal=journal)
        res = r.run_pass()
        assert res.ok, res.errors
        clock.t += 30
    a = ann(kube, "n4")
    assert state(kube, "n4") == "waiting"
    assert kube.nodes[k8s_name("n4")]["metadata"]["labels"][K["label"]] == "waiting"
    assert a[K["waiting-limit"]] == "start-share" and float(a[K["since"]]) == asked
    assert float(a[K["waiting-until"]]) == first_start + WINDOW  # the first start of the window expires
    assert "2 of 2 starts allowed per 3600s window" in a[K["reason"]]
    events = [e for e in kube.events if e["reason"] == "AutohealRemediationWaiting"]
    assert len(events) == 1 and "k8s-n4" in events[0]["message"]
    assert [x.event for x in journal.read(node="n4")] == ["remediation-waiting"]
    assert res.remediations[k8s_name("n4")]["state"] == "waiting"
    assert res.remediations[k8s_name("n4")]["until"] == first_start + WINDOW
    assert not res.breaker["tripped"]  # 1 of 4 affected: the share of starts, not a trip
    # the limit allows: it starts by itself, and says how long it waited
    clock.t = first_start + WINDOW + 1
    recon(slurm, kube, cfg, clock, journal=journal).run_pass()
    assert state(kube, "n4") == "quarantined"
    assert K["waiting-until"] not in ann(kube, "n4") and K["waiting-limit"] not in ann(kube, "n4")
    quarantined = [e for e in kube.events if e["reason"] == "AutohealQuarantined" and "k8s-n4" in e["message"]]
    assert len(quarantined) == 1 and "after waiting" in quarantined[0]["message"]
    assert [x.event for x in journal.read(node="n4")] == ["remediation-waiting", "remediation"]


def test_waiting_nodes_start_in_the_order_they_asked_across_restarts():
    slurm, kube, cfg, clock = world(n=6, spares=0, breaker_max_concurrent=5, breaker_max_percent=34,
                                    breaker_window_seconds=WINDOW)
    first_start = clock.t
    two_starts_used(slurm, kube, cfg, clock)  # 34 % of 6 = 2 starts per window, both used
    # n5 asks first, n3 later: the queue is by time of asking, not by name
    slurm.drain("n5", XID79)
    recon(slurm, kube, cfg, clock).run_pass()
    clock.t += 50
    slurm.drain("n3", XID79)
    recon(slurm, kube, cfg, clock).run_pass()  # every pass a new daemon: the order lives on the Nodes
    assert state(kube, "n5") == state(kube, "n3") == "waiting"
    assert float(ann(kube, "n5")[K["waiting-until"]]) == first_start + WINDOW
    assert float(ann(kube, "n3")[K["waiting-until"]]) == first_start + 100 + WINDOW  # second in line
    clock.t = first_start + WINDOW + 1  # one slot frees: the older request goes
    recon(slurm, kube, cfg, clock).run_pass()
    assert state(kube, "n5") == "quarantined" and state(kube, "n3") == "waiting"
    assert float(ann(kube, "n3")[K["waiting-until"]]) == first_start + 100 + WINDOW
    clock.t = first_start + 100 + WINDOW + 1
    recon(slurm, kube, cfg, clock).run_pass()
    assert state(kube, "n3") == "quarantined"


def test_concurrency_limit_waits_and_the_next_starts_when_one_ends():
    slurm, kube, cfg, clock = world(n=8, spares=0, breaker_max_concurrent=1, breaker_max_percent=50)
    slurm.drain("n2", XID79)
    r = recon(slurm, kube, cfg, clock)
    r.run_pass()
    clock.t += 10
    slurm.drain("n1", XID79)
    r.run_pass()
    assert started(kube, "n2") and state(kube, "n1") == "waiting"
    assert ann(kube, "n1")[K["waiting-limit"]] == "concurrency" and K["waiting-until"] not in ann(kube, "n1")
    slurm.resume("n2")  # n2's remediation ends (abandoned): the slot is free
    r.run_pass()
    r.run_pass()
    assert started(kube, "n1")


def test_a_waiting_node_that_heals_or_is_opted_out_leaves_the_queue():
    slurm, kube, cfg, clock = world(n=8, spares=0, breaker_max_concurrent=1, breaker_max_percent=50)
    for name in ("n1", "n2", "n3"):
        slurm.drain(name, XID79)
    r = recon(slurm, kube, cfg, clock)
    r.run_pass()
    assert [state(kube, n) for n in ("n1", "n2", "n3")] == ["quarantined", "waiting", "waiting"]
    slurm.resume("n2")  # healed while waiting: the record goes, nothing starts for it
    kube.nodes[k8s_name("n3")]["metadata"]["labels"]["autoheal.io/auto-replace"] = "false"
    r.run_pass()
    assert state(kube, "n2") == "" and K["waiting-limit"] not in ann(kube, "n2")
    assert state(kube, "n3") == "" and K["opted-out"] in ann(kube, "n3")


def test_waiting_metric_counts_nodes_per_limit_and_the_oldest_wait():
    pytest.importorskip("prometheus_client")
    from autoheal.k8s_sync.metrics import Metrics

    slurm, kube, cfg, clock = world(n=8, spares=0, breaker_max_concurrent=1, breaker_max_percent=50)
    slurm.drain("n1", XID79)
    slurm.drain("n2", XID79)
    m = Metrics()
    r = recon(slurm, kube, cfg, clock, metrics=m)
    r.run_pass()
    clock.t += 40
    r.run_pass()
    get = m.registry.get_sample_value
    assert get("autoheal_sync_remediation_waiting", {"limit": "concurrency"}) == 1
    assert get("autoheal_sync_remediation_waiting", {"limit": "start-share"}) == 0
    assert get("autoheal_sync_remediation_waiting_oldest_seconds") == 40
    assert get("autoheal_sync_remediations", {"state": "waiting"}) == 1


def test_wait_for_arithmetic():
    b = Breaker(max_concurrent=5, max_percent=50, window_seconds=WINDOW, starts=[100.0, 200.0])
    w = wait_for(b, 0, 4, 300.0, 0)
    assert (w.limit, w.until) == (Limit.START_SHARE, 100.0 + WINDOW)
    assert wait_for(b, 0, 4, 300.0, 1).until == 200.0 + WINDOW
    assert wait_for(b, 0, 4, 300.0, 2).until == 200.0 + WINDOW  # beyond the starts recorded: no earlier
    assert start_capacity(25, 3) == 0
    w = wait_for(Breaker(max_percent=25), 0, 3, 300.0, 0)
    assert w.limit is Limit.START_SHARE and w.until == 0 and "allows no start at all" in w.why
    tripped = Breaker(max_percent=50, cooldown_seconds=900, tripped_at=1000.0, why="3 of 4")
    assert wait_for(tripped, 0, 4, 1100.0, 0) == wait_for(tripped, 0, 4, 1100.0, 3)
    assert wait_for(tripped, 0, 4, 1100.0, 0).until == 1900.0


# ---- small-pool sanity: the breaker's arithmetic against the expected failure rate -----------------------
def test_capacity_arithmetic_of_small_pools():
    from autoheal.config.sync_section import SyncSection

    lab = SyncSection(breaker_max_percent=50, breaker_window_seconds=3600, breaker_max_concurrent=2)
    cap = lab.replacement_capacity(4)
    assert (cap.per_window, cap.per_day, cap.warning) == (2, 48.0, "")
    assert "50% x 4 nodes = 2 start(s) per 3600s window" in cap.arithmetic
    none = SyncSection(breaker_max_percent=25).replacement_capacity(3)  # floor(0.75) = 0: never
    assert none.per_window == 0 and "no replacement start at all" in none.warning
    slow = SyncSection(breaker_max_percent=25, breaker_window_seconds=7 * 86400,
                       expected_failure_percent_per_day=5).replacement_capacity(8)
    assert slow.per_window == 2 and slow.per_day < slow.expected_per_day and "fewer replacements" in slow.warning
    assert SyncSection().replacement_capacity(0).warning == ""  # nothing mapped yet: nothing to say


def test_sync_warns_once_when_the_limits_let_no_replacement_through(tmp_path):
    from autoheal.journal import Journal

    slurm, kube, cfg, clock = world(n=3, spares=0, breaker_max_percent=25)
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    r = recon(slurm, kube, cfg, clock, journal=journal)
    for _ in range(3):
        res = r.run_pass()
    assert "no replacement start at all" in res.capacity["warning"] and res.capacity["pool"] == 3
    assert [x.event for x in journal.read()] == ["remediation-capacity-low"]
    slurm2, kube2, cfg2, clock2 = world(n=4, spares=0, breaker_max_percent=50)
    journal2 = Journal(tmp_path / "j2.jsonl", fsync=False)
    res = recon(slurm2, kube2, cfg2, clock2, journal=journal2).run_pass()
    assert res.capacity["warning"] == "" and list(journal2.read()) == []


def test_a_node_that_began_waiting_in_a_trip_is_told_once_when_a_limit_of_its_own_holds_it(tmp_path):
    from autoheal.journal import Journal

    slurm, kube, cfg, clock = world(n=4, spares=0, breaker_max_concurrent=1, breaker_max_percent=50,
                                    breaker_rearm_percent=10, breaker_cooldown_seconds=60)
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    for name in ("n1", "n2", "n3"):
        slurm.drain(name, XID79)
    r = recon(slurm, kube, cfg, clock, journal=journal)
    res = r.run_pass()  # 3 of 4 > 50 %: trips; n1 starts, n2 and n3 wait quietly
    assert res.breaker["tripped"] and [state(kube, n) for n in ("n2", "n3")] == ["waiting", "waiting"]
    assert not [x for x in journal.read() if x.event == "remediation-waiting"]
    slurm.resume("n3")  # healed; the trip is reset by hand, n1 still holds the one concurrent slot
    from autoheal.k8s_sync.cli import breaker_reset_patch

    kube.patch_configmap("slurm", "autoheal-sync-breaker", breaker_reset_patch())
    for _ in range(3):
        r.run_pass()
    assert state(kube, "n2") == "waiting" and ann(kube, "n2")[K["waiting-limit"]] == "concurrency"
    assert [x.event for x in journal.read(node="n2")] == ["breaker-tripped", "remediation-waiting"]
