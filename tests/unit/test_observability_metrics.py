"""The metrics the alert rules and the dashboard read: the fleet buckets (autoheal.fleet) and the sync's
gauges of them, xid-watch's textfile heartbeat and fault -> drain histogram, the guard's textfile."""

from __future__ import annotations

import time

import pytest
from test_xid_watch_poll import judge, read_ok, sample

from autoheal import fleet
from autoheal.hooks import state as S
from autoheal.hooks import xid_watch as X
from autoheal.sbatch_helpers import guard_metrics as GM
from autoheal.slurm.model import Job, Node


def test_fleet_buckets_follow_the_reason_owner_never_an_admins_drain():
    nodes = [Node("a", "IDLE"), Node("b", "IDLE", frozenset({"DRAIN"}), reason="autoheal: xid 79 on GPU 0 of b: x"),
             Node("c", "IDLE", frozenset({"DRAIN"}), reason="maintenance [root@12:00]"),
             Node("d", "DOWN", reason="Not responding"),
             Node("e", "IDLE", frozenset({"DRAIN"}), reason="autoheal: retired: replaced by spare1"),
             Node("f", "IDLE", frozenset({"DRAIN"}), reason="autoheal: spare: held for the spare pool"),
             Node("g", "MIXED", frozenset({"DRAIN"}), reason="autoheal: replace: xid 79 on GPU 0 of g: y")]
    assert fleet.counts(nodes) == {"in-service": 1, "drained-autoheal": 2, "drained-other": 2, "retired": 1,
                                   "spare": 1}
    assert fleet.counts([]) == dict.fromkeys(fleet.BUCKETS, 0)


def test_sync_metrics_export_fleet_buckets_and_remediation_ages_against_their_bounds():
    pytest.importorskip("prometheus_client")
    from test_remediation_flow import XID79, recon, world

    from autoheal.k8s_sync.metrics import Metrics

    slurm, kube, cfg, clock = world(n=4)
    slurm.drain("n1", XID79)
    m = Metrics()
    r = recon(slurm, kube, cfg, clock, metrics=m)
    for _ in range(2):
        r.run_pass()
    get = m.registry.get_sample_value
    assert get("autoheal_sync_fleet_nodes", {"state": "drained-autoheal"}) == 1
    assert get("autoheal_sync_fleet_nodes", {"state": "in-service"}) == 3
    assert get("autoheal_sync_remediation_bound_seconds", {"state": "quarantined"}) == cfg.remediation_grace_seconds
    assert get("autoheal_sync_remediation_bound_seconds", {"state": "replacing"}) == \
        cfg.remediation_replace_timeout_seconds
    states = {s.labels["state"] for s in m.registry.collect() for s in s.samples
              if s.name == "autoheal_sync_remediation_oldest_seconds"}
    assert states == {"waiting", "quarantined", "draining", "drained", "replacing", "done", "failed"}
    # a wait on the breaker's start share ends within its window: longer is the stuck-remediation alert's
    assert get("autoheal_sync_remediation_bound_seconds", {"state": "waiting"}) == cfg.breaker_window_seconds
    # no node or job name ever becomes a label
    labels = {k for metric in m.registry.collect() for s in metric.samples for k in s.labels}
    assert labels <= {"state", "result", "kind", "le", "limit"}  # limit: the breaker's few limits (waiting)


def test_histogram_in_the_node_counters_is_cumulative_with_every_bucket():
    st: dict = {}
    S.observe(st, "fault_to_drain_seconds", 0.3)
    S.observe(st, "fault_to_drain_seconds", 7.0)
    c = st["counters"]
    assert c['fault_to_drain_seconds_bucket{le="0.25"}'] == 0
    assert c['fault_to_drain_seconds_bucket{le="0.5"}'] == 1
    assert c['fault_to_drain_seconds_bucket{le="10"}'] == 2 and c['fault_to_drain_seconds_bucket{le="+Inf"}'] == 2
    assert c["fault_to_drain_seconds_count"] == 2 and c["fault_to_drain_seconds_sum"] == pytest.approx(7.3)


def read_prom(path):
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, val = line.rsplit(" ", 1)
            out[key] = float(val)
    return out


def test_xid_watch_textfile_counts_the_health_polls_and_when_the_last_began(tmp_path, monkeypatch):
    """A healthy poll writes nothing to the node state; the textfile still shows that polls happen (a
    stalled poll thread is visible, and lab tests wait for polls that read a changed GPU)."""
    import threading
    from types import SimpleNamespace

    from test_hooks_jobside import FakeCtld

    import autoheal.hooks.gather as G
    from autoheal.config.hooks_section import HooksSection

    out = tmp_path / "tf"
    h = HooksSection(state_dir=str(tmp_path), kernel_log="", textfile_dir=str(out), dcgm_mapping_dir="",
                     xid_watch_health_poll=1.0)
    ctx = SimpleNamespace(node="n1", hooks=h, store=S.NodeState(str(tmp_path)), slurm=FakeCtld(),
                          source="xid-watch", path=lambda t: t, close=lambda *a: None,
                          record=lambda event, **kw: None)
    monkeypatch.setattr(G, "gather", lambda node, budget=0.0, cheap=False: sample())
    watch = X.XidWatch(ctx)
    watch.write_metrics()
    assert read_prom(out / X.METRICS_FILE)['autoheal_xid_watch_health_polls_total{node="n1"}'] == 0
    t0 = time.time()
    poller = threading.Thread(target=watch.health_loop, daemon=True)
    poller.start()
    deadline = time.monotonic() + 30
    while watch.health_polls < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.stop()
    poller.join(10)
    watch._metrics_dirty = True
    watch.write_metrics()
    got = read_prom(out / X.METRICS_FILE)
    assert got['autoheal_xid_watch_health_polls_total{node="n1"}'] >= 2
    assert t0 < got['autoheal_xid_watch_health_poll_started_timestamp_seconds{node="n1"}'] <= time.time()
    assert S.NodeState(str(tmp_path)).read().get("counters", {}) == {}  # healthy polls wrote nothing


def test_xid_watch_textfile_beats_while_idle_says_up_0_at_a_clean_stop_and_times_fault_to_drain(tmp_path):
    from types import SimpleNamespace

    from test_hooks_jobside import FakeCtld

    from autoheal.config.hooks_section import HooksSection

    out = tmp_path / "tf"
    h = HooksSection(state_dir=str(tmp_path), kernel_log="", textfile_dir=str(out), dcgm_mapping_dir="",
                     grace_seconds=10.0)
    ctx = SimpleNamespace(node="n1", hooks=h, store=S.NodeState(str(tmp_path)), slurm=FakeCtld(),
                          source="xid-watch", path=lambda t: t, close=lambda *a: None,
                          record=lambda event, **kw: None)
    watch = X.XidWatch(ctx)
    watch.write_metrics()
    first = read_prom(out / X.METRICS_FILE)
    assert first['autoheal_xid_watch_up{node="n1"}'] == 1
    beat = first['autoheal_xid_watch_heartbeat_timestamp_seconds{node="n1"}']
    assert abs(beat - time.time()) < 5
    # the fault -> drain histogram is there at zero before any drain (rate() sees the first one)
    assert first['autoheal_xid_watch_fault_to_drain_seconds_count{node="n1"}'] == 0
    assert first['autoheal_xid_watch_fault_to_drain_seconds_bucket{node="n1",le="+Inf"}'] == 0
    watch.write_metrics()  # nothing changed and the beat is not due: the file is left alone
    assert read_prom(out / X.METRICS_FILE)['autoheal_xid_watch_heartbeat_timestamp_seconds{node="n1"}'] == beat
    watch._metrics_written -= X.HEARTBEAT_SECONDS  # the beat is due: rewritten though nothing changed
    time.sleep(0.01)
    watch.write_metrics()
    assert read_prom(out / X.METRICS_FILE)['autoheal_xid_watch_heartbeat_timestamp_seconds{node="n1"}'] > beat
    # a fault the poll drains for: the drain is timed from the fault
    ctx.slurm.add_job("7")
    bad = sample((1, "ecc_dbe_volatile", 1))
    watch.handle_poll(judge(bad), read_ok(bad))
    watch.write_metrics()
    got = read_prom(out / X.METRICS_FILE)
    assert got['autoheal_xid_watch_fault_to_drain_seconds_count{node="n1"}'] == 1
    assert got['autoheal_xid_watch_fault_to_drain_seconds_bucket{node="n1",le="+Inf"}'] == 1
    assert got['autoheal_xid_watch_drains_total{node="n1"}'] == 1
    watch.write_metrics(up=False)
    assert read_prom(out / X.METRICS_FILE)['autoheal_xid_watch_up{node="n1"}'] == 0


def job(jid, comment, eligible, restart=1, state="PENDING", reason="", desc="", prio=None):
    return Job(jid, state, comment=comment, restart_count=restart, eligible_time=eligible, state_reason=reason,
               state_description=desc, priority=prio)


def test_guard_counts_only_requeued_eligible_jobs_autoheal_owns():
    now = 10_000.0
    jobs = [job("1", "autoheal-runner state=requeued", now - 100),
            job("2", "autoheal: requeued after xid 79 on GPU 0 of n1", now - 700),
            job("3", "autoheal-runner state=requeued", now - 5000, restart=0),  # never requeued
            job("4", "my own comment", now - 5000),  # not ours
            job("5", "autoheal-runner state=requeued", now - 9000, reason="JobHeldAdmin", prio=0),  # an admin's
            job("6", "autoheal-runner", now - 9000, state="RUNNING")]
    w = GM.requeued_waiting(jobs, now)
    assert (w.jobs, w.oldest_seconds) == (2, 700.0)


def test_guard_textfile_has_heartbeat_and_bounded_labels(tmp_path):
    m = GM.GuardMetrics(str(tmp_path))
    m.observe("ok", ["release", "schedule", "nonsense"], GM.RequeuedWait(2, 42.0))
    m.observe("slurm-unavailable")
    assert m.write() is None
    got = read_prom(tmp_path / GM.METRICS_FILE)
    assert got["autoheal_guard_up"] == 1 and abs(got["autoheal_guard_heartbeat_timestamp_seconds"] - time.time()) < 5
    assert got['autoheal_guard_actions_total{kind="release"}'] == 1
    assert got['autoheal_guard_passes_total{result="slurm-unavailable"}'] == 1
    assert got["autoheal_guard_requeued_jobs_waiting"] == 2 and got["autoheal_guard_requeued_oldest_wait_seconds"] == 42
    assert not any("nonsense" in k for k in got)
    m.write(up=False)
    assert read_prom(tmp_path / GM.METRICS_FILE)["autoheal_guard_up"] == 0
    assert [p.name for p in tmp_path.iterdir()] == [GM.METRICS_FILE]  # no temp file left


def test_guard_times_eligible_to_running_of_requeued_jobs_only_when_they_run_again():
    ra = GM.RunAgain()
    now = 1000.0
    runner = "autoheal-runner state=requeued"
    ra.update([job("1", runner, now - 3), job("2", runner, now - 3), job("3", "not ours", now - 3)], now, None)
    assert set(ra.tracked) == {("1", 1), ("2", 1)}
    later = {"1": job("1", runner, None, state="RUNNING"), "2": job("2", runner, None, state="CANCELLED")}
    ra.update([], now + 7, lambda jid: later[jid])
    assert ra.count == 1 and ra.total == 10.0 and ra.buckets[10.0] == 1 and ra.buckets[5.0] == 0
    assert ra.tracked == {}
    lines = ra.lines("x")
    assert 'x_bucket{le="+Inf"} 1' in lines and "x_count 1" in lines
