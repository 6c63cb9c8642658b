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
from autoheal_lab.testing.hooks import hook_context


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

    from test_hooks_jobside import FakeCtld

    import autoheal.hooks.gather as G
    from autoheal.config.hooks_section import HooksSection

    out = tmp_path / "tf"
    h = HooksSection(state_dir=str(tmp_path), kernel_log="", textfile_dir=str(out), dcgm_mapping_dir="",
                     xid_watch_health_poll=1.0)
    ctx = hook_context(h, source="xid-watch", slurm=FakeCtld())
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
    from test_hooks_jobside import FakeCtld

    from autoheal.config.hooks_section import HooksSection

    out = tmp_path / "tf"
    h = HooksSection(state_dir=str(tmp_path), kernel_log="", textfile_dir=str(out), dcgm_mapping_dir="",
                     grace_seconds=10.0)
    ctx = hook_context(h, source="xid-watch", slurm=FakeCtld())
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


# ---- hot-spare swaps and fault -> running again (the guard's textfile) ---------------------------------------

from autoheal.sbatch_helpers import fault_metrics as FM  # noqa: E402

XID79_GPU1 = "autoheal: xid 79 on GPU 0 of gpu1 (0000:3b:00.0): fallen off the bus"


def drained(name, reason=XID79_GPU1, stamp=900):
    return Node(name, "IDLE", frozenset({"DRAIN"}), reason=reason, reason_time=stamp)


def hot(jid, active, spares, swaps="", restarts=0, state="RUNNING"):
    comment = f"autoheal-runner restarts={restarts} nodes={active} state=running spares={spares}" + \
        (f" swaps={swaps}" if swaps else "")
    return Job(jid, state, comment=comment, restart_count=restarts, eligible_time=800 if state == "PENDING" else None)


def test_swap_results_come_from_what_changed_between_two_looks():
    v = FM.HotSpareView.of
    before = v(hot("7", "gpu1,gpu2", "gpu3"))
    assert before == FM.HotSpareView(0, ("gpu1", "gpu2"), ("gpu3",), 0)
    assert FM.HotSpareView.of(Job("8", "RUNNING", comment="autoheal-runner state=running nodes=a")) is None
    swapped = FM.judge_change(before, v(hot("7", "gpu2,gpu3", "none", "1")), False, set())
    assert swapped == [FM.SwapSeen(FM.SwapResult.SWAPPED, ("gpu1",))]
    shrunk = FM.judge_change(v(hot("7", "gpu1,gpu2", "none")), v(hot("7", "gpu2", "none", "1")), False, set())
    assert shrunk == [FM.SwapSeen(FM.SwapResult.SHRUNK, ("gpu1",))]
    dropped = FM.judge_change(before, v(hot("7", "gpu1,gpu2", "none")), False, set())
    assert dropped == [FM.SwapSeen(FM.SwapResult.SPARE_DROPPED, ("gpu3",))]
    assert FM.judge_change(before, before, False, set()) == []
    # requeued: only while one of its nodes is drained by autoheal for a fault (a user's own requeue is not)
    after = v(hot("7", "gpu1,gpu2", "gpu3", restarts=1, state="PENDING"))
    assert FM.judge_change(before, after, True, {"gpu2"}) == [FM.SwapSeen(FM.SwapResult.REQUEUED, ("gpu2",))]
    assert FM.judge_change(before, after, True, {"gpu9"}) == []


def test_hot_spare_watch_counts_each_change_once_and_forgets_jobs_gone():
    w = FM.HotSpareWatch()
    nothing = lambda: set()  # noqa: E731
    assert w.update([hot("7", "gpu1,gpu2", "gpu3")], [], nothing) == []  # first sight: a baseline only
    got = w.update([hot("7", "gpu2,gpu3", "none", "1")], [], nothing)
    assert [s.result for s in got] == [FM.SwapResult.SWAPPED]
    assert w.update([hot("7", "gpu2,gpu3", "none", "1")], [], nothing) == []  # the same again: nothing new
    asked = []
    got = w.update([], [hot("7", "gpu2,gpu3", "none", "1", restarts=1, state="PENDING")],
                   lambda: asked.append(1) or {"gpu3"})
    assert [s.result for s in got] == [FM.SwapResult.REQUEUED] and asked == [1]
    assert w.seen == {}  # pending: no baseline kept; seen running again, it starts a new one
    assert w.update([], [hot("7", "gpu2,gpu3", "none", "1", restarts=1, state="PENDING")], nothing) == []


def test_fault_time_is_slurms_stamp_of_autohealss_fault_drain_never_a_preswap_or_an_admins():
    nodes = {"gpu1": drained("gpu1", stamp=900), "gpu2": drained("gpu2", "maintenance", 800),
             "gpu3": drained("gpu3", "autoheal: pre-emptive swap: ecc rising on GPU 1 of gpu3", 700),
             "gpu4": Node("gpu4", "IDLE")}
    assert FM.fault_time(["gpu1", "gpu2", "gpu3", "gpu4", "gone"], nodes) == 900.0
    assert FM.fault_time(["gpu2", "gpu3", "gpu4"], nodes) is None
    assert FM.faulty_nodes(nodes) == {"gpu1"}
    # where a job's comment says its fault was: the runner's cause and exclusions, xid-watch's requeue note
    assert FM.fault_nodes("autoheal-runner restarts=1 last=autoheal-drain@gpu1 excl=gpu1,gpu5 state=requeued") == \
        ["gpu1", "gpu5"]
    assert FM.fault_nodes("autoheal: requeued after replace: " + XID79_GPU1[len("autoheal: "):]) == ["gpu1"]
    assert FM.fault_nodes("my own words about gpu1") == [] and FM.fault_nodes("autoheal-runner state=running") == []


def test_guard_times_fault_to_running_for_the_requeue_and_the_hot_spare_path(tmp_path):
    m = GM.GuardMetrics(str(tmp_path))
    nodes = [drained("gpu1", stamp=900), Node("gpu2", "IDLE"), Node("gpu3", "IDLE")]
    lists = []

    def list_nodes():
        lists.append(1)
        return nodes
    plain = job("5", "autoheal: requeued after " + XID79_GPU1[len("autoheal: "):], 950)
    m.observe_jobs([plain], [hot("7", "gpu1,gpu2", "gpu3")], 960.0, None, list_nodes)
    assert lists == [1]  # one read of the nodes for the pass, however many jobs need it
    running = {"5": job("5", plain.comment, None, state="RUNNING")}
    m.observe_jobs([], [hot("7", "gpu2,gpu3", "none", "1")], 1000.0, running.get, list_nodes)
    got = read_prom(tmp_path / GM.METRICS_FILE) if m.write() is None else {}
    assert got['autoheal_guard_hot_spare_swaps_total{result="swapped"}'] == 1
    assert got['autoheal_guard_hot_spare_swaps_total{result="requeued"}'] == 0
    f2r = "autoheal_guard_fault_to_running_seconds"
    assert got[f'{f2r}_count{{path="requeue"}}'] == 1 and got[f'{f2r}_sum{{path="requeue"}}'] == 100.0
    assert got[f'{f2r}_count{{path="hot-spare"}}'] == 1 and got[f'{f2r}_bucket{{path="hot-spare",le="120"}}'] == 1
    assert got[f'{f2r}_bucket{{path="hot-spare",le="60"}}'] == 0
    assert got["autoheal_guard_requeued_eligible_to_running_seconds_count"] == 1  # 50 s, as before
    # bounded labels: a result, a path, a bucket; never a job or a node
    labels = {kv.split("=")[0] for k in got if "{" in k for kv in k[k.index("{") + 1:-1].split(",")}
    assert labels <= {"result", "path", "le", "kind"}


def test_guard_metrics_read_no_nodes_while_no_job_needs_them(tmp_path):
    m = GM.GuardMetrics(str(tmp_path))
    m.observe_jobs([], [Job("1", "RUNNING", comment="mine")], 10.0, None, lambda: pytest.fail("read nodes"))
    text = m.render()
    assert 'autoheal_guard_hot_spare_swaps_total{result="spare-dropped"} 0' in text
    assert 'autoheal_guard_fault_to_running_seconds_count{path="hot-spare"} 0' in text


def test_guard_loop_writes_a_swap_it_saw_between_two_passes_and_survives_slurm_failing_the_look(tmp_path):
    """The guard's loop (run_forever with --textfile-dir): a hot-spare job's runner swaps gpu1 for gpu3
    between two passes, seen in the one job list of each pass; in the third pass the nodes cannot be read
    for a requeued job's fault time, which costs only that observation."""
    from dataclasses import replace

    from autoheal.errors import SlurmUnavailable
    from autoheal.sbatch_helpers.guard import Guard, run_forever
    from autoheal_lab.testing.slurm import MemorySlurm

    slurm = MemorySlurm([drained("gpu1", stamp=900), Node("gpu2", "MIXED"), Node("gpu3", "MIXED")],
                        [replace(hot("7", "gpu1,gpu2", "gpu3"), nodes=("gpu1", "gpu2", "gpu3"))])
    said, passes = [], []

    def pause(_s):
        passes.append(1)
        if len(passes) == 1:  # the runner's swap: the comment first, then the allocation
            slurm.jobs["7"] = replace(hot("7", "gpu2,gpu3", "none", "1"), nodes=("gpu2", "gpu3"))
        if len(passes) == 2:  # requeued after another fault, and the nodes cannot be read for its time
            slurm.jobs["8"] = job("8", "autoheal: requeued after " + XID79_GPU1[len("autoheal: "):], 990)
            slurm.before = second_node_list_fails
    node_lists = []

    def second_node_list_fails(op, _args):  # the pass's own read of the nodes answers, the metrics' does not
        if op == "list_nodes":
            node_lists.append(op)
            if len(node_lists) == 2:
                raise SlurmUnavailable("away")
    m = GM.GuardMetrics(str(tmp_path))
    run_forever(Guard(slurm, clock=lambda: 1000.0, say=said.append), 1.0, lambda: len(passes) >= 3, sleep=pause,
                metrics=m)
    got = read_prom(tmp_path / GM.METRICS_FILE)
    assert got['autoheal_guard_hot_spare_swaps_total{result="swapped"}'] == 1
    assert got['autoheal_guard_fault_to_running_seconds_count{path="hot-spare"}'] == 1
    assert got['autoheal_guard_fault_to_running_seconds_sum{path="hot-spare"}'] == 100.0
    assert got["autoheal_guard_up"] == 0 and got['autoheal_guard_passes_total{result="ok"}'] == 3
    assert any("metrics:" in s for s in said), said
    assert slurm.count("list_jobs") == 3  # one list of pending and running jobs per pass
    assert got['autoheal_guard_fault_to_running_seconds_count{path="requeue"}'] == 0  # its time was lost
