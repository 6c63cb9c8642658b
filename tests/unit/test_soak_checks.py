"""The soak's invariant checkers on hand-made snapshots: each rule fires on its bad case and only then."""

from __future__ import annotations

from autoheal.sbatch_helpers.examples.tiny_trainer import advance, expected_final_state
from autoheal_lab.soak_checks import (
    Injected,
    JobMeta,
    Monitor,
    Snapshot,
    check_trainer_output,
    node_in_service,
    percentiles,
)

SPARE = "autoheal: spare: held for replacement"


def _node(state="IDLE", drain=False, reason="", responding=True):
    return {"state": state, "drain": drain, "reason": reason, "responding": responding}


def _nodes(**over):
    base = {n: _node() for n in ("gpu1", "gpu2", "gpu3", "gpu4")}
    base["spare1"] = _node("IDLE+DRAIN", True, SPARE)
    base.update(over)
    return base


def _job(state="RUNNING", reason="None", nodes=("gpu1",), restarts=0, comment=""):
    return {"state": state, "reason": reason, "nodes": list(nodes), "restarts": restarts, "comment": comment,
            "held": reason.startswith("JobHeld")}


def _mon(**kw):
    jobs = [JobMeta("10", "trainer", opted_in=True, steps=5, nodes=1), JobMeta("11", "plain", nodes=1)]
    return Monitor(jobs, seed=42, spare_prefix="autoheal: spare", **kw)


def test_false_drain_fires_without_a_cause_and_not_with_one():
    m = _mon()
    v = m.observe(Snapshot(100.0, _nodes(gpu2=_node("IDLE+DRAIN", True, "autoheal: xid 79 on GPU 1")), {}))
    assert [x.invariant for x in v] == ["false-drain"] and v[0].evidence["seed"] == 42
    m = _mon()
    m.add_fault(Injected(1, "xid79", "gpu", 99.0, node="gpu2", gpu=1))
    assert m.observe(Snapshot(100.0, _nodes(gpu2=_node("IDLE+DRAIN", True, "autoheal: xid 79")), {})) == []
    # the spare's own hold and an admin's reason are not autoheal drains to explain
    assert m.observe(Snapshot(101.0, _nodes(gpu3=_node("IDLE+DRAIN", True, "admin: bios")), {})) == []


def test_false_drain_cause_expires_after_the_node_came_back():
    m = _mon(cause_linger=10.0)
    m.add_fault(Injected(1, "xid48", "gpu", 99.0, node="gpu2", gpu=1))
    m.observe(Snapshot(100.0, _nodes(gpu2=_node("IDLE+DRAIN", True, "autoheal: xid 48")), {}))
    m.observe(Snapshot(110.0, _nodes(), {}))  # back in service
    assert m.observe(Snapshot(115.0, _nodes(gpu2=_node("IDLE+DRAIN", True, "autoheal: xid 48 again")), {})) == []
    v = m.observe(Snapshot(200.0, _nodes(gpu2=_node("IDLE+DRAIN", True, "autoheal: something else")), {}))
    assert [x.invariant for x in v] == ["false-drain"]


def test_admin_drain_must_keep_its_reason_while_it_lasts():
    m = _mon()
    m.add_fault(Injected(1, "admin-drain", "people", 100.0, node="gpu3", reason="admin: bios update"))
    ok = _node("IDLE+DRAIN", True, "admin: bios update [root@2026-12-01T10:00:00]")
    assert m.observe(Snapshot(101.0, _nodes(gpu3=_node()), {})) == []  # within the 2 s it takes to apply
    assert m.observe(Snapshot(103.0, _nodes(gpu3=ok), {})) == []
    v = m.observe(Snapshot(104.0, _nodes(gpu3=_node("IDLE+DRAIN", True, "autoheal: xid 79")), {}))
    assert "admin-touched" in [x.invariant for x in v]
    m.faults[0].end = 105.0
    assert [x for x in m.observe(Snapshot(106.0, _nodes(), {})) if x.invariant == "admin-touched"] == []


def test_cordon_kept_and_breaker_limit():
    m = _mon(breaker_max=1)
    m.add_fault(Injected(1, "kubectl-cordon", "people", 100.0, node="gpu1"))
    kube = {n: {"unschedulable": False, "remediation": ""} for n in ("gpu1", "gpu2", "gpu3")}
    kube["gpu1"]["unschedulable"] = True
    assert m.observe(Snapshot(103.0, _nodes(), {}, kube=kube)) == []
    kube["gpu1"]["unschedulable"] = False
    kube["gpu2"]["remediation"] = kube["gpu3"]["remediation"] = "replacing"
    v = m.observe(Snapshot(104.0, _nodes(), {}, kube=kube))
    assert sorted(x.invariant for x in v) == ["admin-touched", "breaker"]


def test_opt_out_replacement_is_a_violation():
    m = _mon(opt_out_label="autoheal.io/opt-out=true")
    kube = {"gpu1": {"unschedulable": True, "remediation": "", "labels": {"autoheal.io/opt-out": "true"}}}
    v = m.observe(Snapshot(1.0, _nodes(), {}, kube=kube, replacements=[{"node": "gpu1", "name": "gpu1"}]))
    assert [x.invariant for x in v] == ["breaker"]


def test_held_job_is_stranded_after_the_grace_unless_the_user_held_it():
    m = _mon(held_grace=30.0)
    held = _job("PENDING", "JobHeldAdmin", nodes=())
    assert m.observe(Snapshot(100.0, _nodes(), {"10": held})) == []
    v = m.observe(Snapshot(140.0, _nodes(), {"10": held}))
    assert [x.invariant for x in v] == ["stranded"]
    m = _mon(held_grace=30.0)
    m.add_fault(Injected(1, "user-hold", "people", 99.0, job="11", end=150.0))
    user = _job("PENDING", "JobHeldUser", nodes=())
    m.observe(Snapshot(100.0, _nodes(), {"11": user}))
    assert m.observe(Snapshot(140.0, _nodes(), {"11": user})) == []


def test_pending_unsatisfiable_only_counts_while_nodes_are_usable():
    m = _mon(pending_limit=60.0)
    pend = _job("PENDING", "ReqNodeNotAvail", nodes=(), comment="autoheal-runner restarts=1 excl=gpu1,gpu2")
    m.observe(Snapshot(100.0, _nodes(), {"10": pend}))
    assert [x.invariant for x in m.observe(Snapshot(170.0, _nodes(), {"10": pend}))] == ["stranded"]
    # every node drained: waiting is right
    m = _mon(pending_limit=60.0)
    drained = {n: _node("IDLE+DRAIN", True, "admin: x") for n in ("gpu1", "gpu2", "gpu3", "gpu4", "spare1")}
    m.observe(Snapshot(100.0, drained, {"10": pend}))
    assert m.observe(Snapshot(170.0, drained, {"10": pend})) == []


def _trainer_text(steps, every, crash_after=None, resume_from=None):
    lines, state = [], 0
    lines.append("autoheal-trainer: start step=0 resumed_from=none restart=0 host=gpu1 rank=0 world=1")
    step = 0
    stop = crash_after if crash_after is not None else steps
    while step < stop:
        state = advance(state, step)
        step += 1
        if step % every == 0 and step < steps:
            lines.append(f"autoheal-trainer: checkpoint saved step={step} path=/x")
    if crash_after is None:
        lines.append(f"autoheal-trainer: done step={steps} final_state={state}")
        return "\n".join(lines)
    start = resume_from
    lines.append(f"autoheal-trainer: start step={start} resumed_from=/x restart=1 host=gpu2 rank=0 world=1")
    state = 0
    for i in range(start):
        state = advance(state, i)
    for i in range(start, steps):
        state = advance(state, i)
    lines.append(f"autoheal-trainer: done step={steps} final_state={state}")
    return "\n".join(lines)


def test_trainer_output_checks():
    assert check_trainer_output(_trainer_text(30, 10), 30) == []
    assert check_trainer_output(_trainer_text(30, 10, crash_after=25, resume_from=20), 30) == []
    bad = check_trainer_output(_trainer_text(30, 10, crash_after=25, resume_from=10), 30)
    assert len(bad) == 1 and "newest checkpoint was 20" in bad[0][0]
    wrong = f"autoheal-trainer: done step=30 final_state={expected_final_state(30) + 1}"
    assert "uninterrupted" in check_trainer_output(wrong, 30)[0][0]
    assert check_trainer_output("autoheal-trainer: step=3", 30) == []  # not finished: nothing to say


def test_finish_end_state_journal_leaks_and_requeues():
    m = _mon()
    m.observe(Snapshot(100.0, _nodes(), {"10": _job(nodes=("gpu1",)), "11": _job(nodes=("gpu2",))}))
    m.add_fault(Injected(1, "xid79", "gpu", 101.0, node="gpu1", gpu=0))
    final = Snapshot(300.0, _nodes(gpu1=_node("IDLE+DRAIN", True, "autoheal: retired: replaced by spare1"),
                                   gpu4=_node("DOWN+DRAIN", True, "autoheal: xid 48"),
                                   spare1=_node()),
                     {"10": _job("COMPLETED", comment="autoheal-runner restarts=2 state=completed"),
                      "11": _job("PENDING", "JobHeldAdmin", nodes=())})
    v = m.finish(final, journal=[], journal_skipped=1, outputs={}, leaked=["slurmd -N gpu1 (pid 5)"])
    kinds = sorted({x.invariant for x in v})
    assert kinds == ["acted-twice", "end-state", "journal", "stranded"]
    texts = " | ".join(x.message for x in v)
    assert "gpu4 ends the soak" in texts and "gpu1 ends" not in texts and "restarted 2 times" in texts
    assert "no record" in texts and "torn" in texts


def test_resets_counted_against_injections():
    m = _mon()
    m.add_fault(Injected(1, "xid48", "gpu", 100.0, node="gpu1", gpu=2))
    rec = {"event": "remediation-step", "action": "reset-gpu", "node": "gpu1", "message": "reset GPU 2 of gpu1 for: x"}
    final = Snapshot(200.0, _nodes(), {})
    assert m.finish(final, [rec], 0, {}, []) == []
    v = m.finish(final, [rec, dict(rec)], 0, {}, [])
    assert [x.invariant for x in v] == ["acted-twice"]


def test_recovery_times_and_percentiles():
    m = _mon()
    m.observe(Snapshot(99.0, _nodes(), {"10": _job(nodes=("gpu1",))}))
    m.add_fault(Injected(1, "xid48", "gpu", 100.0, node="gpu1", gpu=0))
    m.observe(Snapshot(100.5, _nodes(gpu1=_node("IDLE+DRAIN", True, "autoheal: xid 48")),
                       {"10": _job("PENDING", "Resources", nodes=(), restarts=1)}))
    m.observe(Snapshot(104.0, _nodes(gpu1=_node("IDLE+DRAIN", True, "autoheal: xid 48")),
                       {"10": _job(nodes=("gpu2",), restarts=1)}))
    m.observe(Snapshot(110.0, _nodes(), {"10": _job(nodes=("gpu2",), restarts=1)}))
    rec = m.recovery()
    assert rec["fault_to_drain_s"]["p50"] == 0.5
    assert rec["fault_to_drain_xid_event_s"]["p50"] == 0.5 and rec["fault_to_drain_polled_s"]["n"] == 0
    assert rec["fault_to_job_running_again_s"]["p50"] == 4.0
    assert rec["fault_to_node_back_or_replaced_s"]["p50"] == 10.0
    m.note_drain_time(1, 0.2)
    assert m.recovery()["fault_to_drain_s"]["max"] == 0.2
    assert percentiles([]) == {"n": 0, "p50": None, "p95": None, "max": None}
    assert percentiles([float(i) for i in range(1, 101)])["p95"] == 95.0
    assert node_in_service(_node("MIXED")) and not node_in_service(_node("IDLE*", responding=False))


def test_comment_must_agree_with_the_journal_on_how_a_job_ended():
    m = _mon()
    rec = {"event": "job-completed", "job_ids": ["10"], "node": "gpu1"}
    stale = Snapshot(300.0, _nodes(), {"10": _job("COMPLETED", comment="autoheal-runner nodes=gpu1 state=running")})
    v = m.finish(stale, [rec], 0, {})
    assert [x.invariant for x in v] == ["journal"] and "state=running" in v[0].message
    m = _mon()
    good = Snapshot(300.0, _nodes(), {"10": _job("COMPLETED", comment="autoheal-runner nodes=gpu1 state=completed")})
    assert m.finish(good, [rec], 0, {}) == []


def test_a_node_still_within_its_recovery_bound_is_recovering_not_stuck():
    m = _mon()
    m.add_fault(Injected(1, "ecc-dbe", "gpu", 250.0, node="gpu3", gpu=2))
    final = Snapshot(300.0, _nodes(gpu3=_node("IDLE+DRAIN", True, "autoheal: xid 48 on GPU 2 of gpu3")), {})
    assert m.finish(final, [], 0, {}, recovery_bound=125.0) == []
    assert m.recovering and m.recovering[0].startswith("gpu3 (50 s")
    rebooting = Snapshot(300.0, _nodes(gpu3=_node("IDLE+NOT_RESPONDING", responding=False)), {})
    assert m.finish(rebooting, [], 0, {}, recovery_bound=125.0) == []
    someone = Snapshot(300.0, _nodes(gpu3=_node("IDLE+DRAIN", True, "Duplicate jobid")), {})
    assert [v.invariant for v in m.finish(someone, [], 0, {}, recovery_bound=125.0)] == ["end-state"]
    m = _mon()
    m.add_fault(Injected(1, "ecc-dbe", "gpu", 100.0, node="gpu3", gpu=2))
    assert [v.invariant for v in m.finish(final, [], 0, {}, recovery_bound=125.0)] == ["end-state"]


# ---- the on-call admin and the breaker ----------------------------------------------------------------

from autoheal_lab.soak_checks import OnCall  # noqa: E402


def test_on_call_is_paged_once_per_trip_and_acts_after_its_delay():
    oc = OnCall([40.0, 70.0])
    assert oc.observe(100.0, None) is None and oc.trips == []
    trip = oc.observe(105.0, 103.5, "3 of 4 nodes (75%) > 50%")
    assert trip.n == 1 and trip.start == 103.5 and trip.due == 145.0 and oc.current is trip
    assert oc.observe(106.0, 103.5) is None and len(oc.trips) == 1  # the same trip: one page
    assert oc.due(144.9) is None
    assert oc.due(145.0) is trip and oc.due(146.0) is None  # acted on once
    assert oc.waiting(120.0) and not oc.waiting(103.0)
    oc.observe(147.0, None)  # a snapshot between their look and their reset does not close it
    assert oc.current is trip
    oc.did_reset(trip, 150.0)
    assert oc.current is None and not oc.waiting(150.0) and oc.waiting(149.9)
    assert oc.observe(149.5, 103.5) is None  # a snapshot started before the reset landed: not a new trip
    # the sync trips it again: a new page with the next planned delay
    again = oc.observe(160.0, 158.0, "3 of 4")
    assert again.n == 2 and again.delay == 70.0 and again.due == 230.0
    s = oc.summary()
    assert (s["trips"], s["resets"], s["rearmed_by_itself"], s["open_at_end"]) == (2, 1, 0, 1)
    assert s["tripped_to_reset_s"]["p50"] == 46.5 and s["episodes"][0]["reset"] == 150.0


def test_on_call_finds_the_breaker_armed_again_or_gives_up_and_tries_later():
    oc = OnCall([30.0])
    t1 = oc.observe(10.0, 10.0)
    oc.observe(20.0, None)  # re-armed by itself before they acted
    assert t1.rearmed == 20.0 and oc.current is None and oc.due(100.0) is None
    t2 = oc.observe(50.0, 49.0)
    assert oc.due(80.0) is t2
    oc.looked(t2, 81.0, still_tripped=False)  # `autoheal sync breaker` says armed: nothing to reset
    assert t2.rearmed == 81.0 and t2.reset is None
    t3 = oc.observe(90.0, 90.0)
    assert oc.due(120.0) is t3
    oc.gave_up(t3)  # the API refused for two minutes: they look again one delay later
    assert oc.due(121.0) is None and oc.due(150.0) is t3
    s = oc.summary()
    assert (s["trips"], s["resets"], s["rearmed_by_itself"]) == (3, 0, 2)
    assert oc.overlaps(0.0, 15.0) and not oc.overlaps(21.0, 48.0)


def _breaker(at=None, why=""):
    return {"tripped_at": at, "why": why}


def test_blocked_nodes_and_jobs_wait_for_a_human_only_while_the_trip_is_open():
    replace = _node("IDLE+DRAIN", True, "autoheal: replace: xid 79 on GPU 0")
    blocked = _nodes(gpu1=replace, gpu2=replace, gpu3=replace, gpu4=replace)
    pend = _job("PENDING", "Resources", nodes=())

    def run(reset: bool):
        m = _mon()
        for i, n in enumerate(("gpu1", "gpu2", "gpu3", "gpu4")):
            m.add_fault(Injected(i + 1, "xid79", "gpu", 10.0, node=n, gpu=0))
        m.observe(Snapshot(20.0, blocked, {"10": pend}, kube={}, breaker=_breaker(19.0, "4 of 4")))
        trip = m.oncall.due(200.0)
        if reset:
            m.oncall.did_reset(trip, 201.0)
        final = Snapshot(300.0, blocked, {"10": pend, "11": _job("PENDING", "Resources", nodes=())}, kube={},
                         breaker=_breaker(None))
        m.observe(final)
        return m, m.finish(final, [], 0, {}, awaiting_ok=True)

    m, v = run(reset=False)  # still tripped at the end: the on-call has not acted yet
    assert v == [] and len(m.waiting_human) == 6, m.waiting_human
    m, v = run(reset=True)  # reset, and nothing moved since: autoheal's bounds apply again
    assert sorted({x.invariant for x in v}) == ["end-state", "stranded"] and m.waiting_human == []


def test_job_running_again_is_split_by_whether_a_trip_was_open():
    m = _mon()
    m.observe(Snapshot(99.0, _nodes(), {"10": _job(nodes=("gpu1",))}))
    m.add_fault(Injected(1, "xid79", "gpu", 100.0, node="gpu1", gpu=0))
    m.observe(Snapshot(110.0, _nodes(), {"10": _job(nodes=("gpu2",), restarts=1)}))
    m.observe(Snapshot(120.0, _nodes(), {"10": _job(nodes=("gpu2",), restarts=1)}, kube={},
                       breaker=_breaker(118.0)))
    m.add_fault(Injected(2, "xid48", "gpu", 121.0, node="gpu2", gpu=1))
    m.observe(Snapshot(150.0, _nodes(), {"10": _job(nodes=("gpu3",), restarts=2)}))
    r = m.recovery()
    assert r["fault_to_job_running_again_s"]["n"] == 2
    assert r["fault_to_job_running_again_no_trip_s"] == {"n": 1, "p50": 10.0, "p95": 10.0, "max": 10.0}


def test_a_technician_repairs_in_place_only_nodes_waiting_on_an_empty_pool():
    from autoheal_lab.soak_checks import awaiting_replacement

    replace = _node("IDLE+DRAIN", True, "autoheal: replace: xid 79 on GPU 0 [autoheal@2026-12-01T10:00:00]")
    req = [{"node": "gpu2", "name": "r1"}]
    with_spare = Snapshot(10.0, _nodes(gpu2=replace, gpu3=replace), {}, kube={}, replacements=req)
    assert awaiting_replacement(with_spare, "autoheal: spare") == []  # the pool will give spare1
    empty = _nodes(gpu2=replace, gpu3=replace, spare1=_node("ALLOCATED"))
    assert awaiting_replacement(Snapshot(10.0, empty, {}, kube={}, replacements=req)) == ["gpu2"]  # gpu3: not asked
    assert awaiting_replacement(Snapshot(10.0, empty, {}, kube=None, replacements=req)) == []

    m = Monitor([JobMeta("10", "trainer", opted_in=True, steps=5, nodes=1)], oncall_delays=[50.0],
                repair_delays=[60.0, 100.0])
    m.observe(Snapshot(10.0, empty, {}, kube={}, replacements=req))
    m.observe(Snapshot(20.0, empty, {}, kube={}, replacements=req + [{"node": "gpu3", "name": "r2"}]))
    oc = m.oncall
    assert oc.awaiting_technician() == ["gpu2", "gpu3"]
    assert oc.repairs_due(69.0) == [] and oc.repairs_due(70.0) == ["gpu2"] and oc.repairs_due(71.0) == []
    assert oc.repairs_due(120.0) == ["gpu3"]  # its own (second) planned delay, from its own wait
    oc.repaired("gpu2", 75.0, "resumed")
    oc.repaired("gpu3", 125.0, "left alone: skipped-not-ours")
    assert oc.awaiting_technician() == [] and oc.summary()["repairs"] == 1
    # a node replaced after all before the technician came is forgotten
    oc.observe_awaiting(200.0, ["gpu4"])
    oc.observe_awaiting(201.0, [])
    assert oc.awaiting_technician() == [] and oc.repairs_due(1000.0) == []


def test_a_trip_closed_by_mistake_pages_again_when_a_later_snapshot_still_shows_it():
    oc = OnCall([30.0, 40.0])
    t1 = oc.observe(10.0, 9.0)
    assert oc.due(40.0) is t1
    oc.looked(t1, 45.0, still_tripped=False)  # what they read said armed (an API error misread as armed)
    assert oc.observe(44.0, 9.0) is None  # a snapshot that started before they looked: nothing new
    t2 = oc.observe(46.0, 9.0)  # still tripped after they closed it: it never ended
    assert t2 is not None and t2.n == 2 and t2.start == 45.0 and t2.due == 86.0
    assert oc.waiting(45.5) and oc.observe(47.0, 9.0) is None
    assert oc.due(86.0) is t2
    oc.did_reset(t2, 90.0)
    assert oc.observe(89.0, 9.0) is None and oc.current is None


def test_the_on_call_resumes_slurm_own_duplicate_jobid_drain_and_until_then_it_waits_for_a_human():
    dup = _node("IDLE+DRAIN", True, "Duplicate jobid")
    m = Monitor([JobMeta("10", "plain", nodes=1)], oncall_delays=[40.0])
    m.observe(Snapshot(100.0, _nodes(gpu2=dup, gpu3=_node("IDLE+DRAIN", True, "admin: bios")), {}))
    oc = m.oncall
    assert oc.awaiting_oncall() == ["gpu2"]  # an admin's own drain is theirs, not a page
    assert oc.resumes_due(139.0) == [] and oc.resumes_due(140.0) == ["gpu2"] and oc.resumes_due(141.0) == []
    # at the end, before they acted, the node waits for a human (not an end-state violation)
    assert m.finish(Snapshot(141.0, _nodes(gpu2=dup), {}), [], 0, {}) == []
    assert m.waiting_human and "Duplicate jobid" in m.waiting_human[0]
    oc.resumed("gpu2", 142.0, "resumed")
    assert oc.awaiting_oncall() == [] and oc.summary()["slurm_drains_resumed"] == 1
    m2 = Monitor([JobMeta("10", "plain", nodes=1)], oncall_delays=[40.0])
    m2.observe(Snapshot(100.0, _nodes(gpu2=dup), {}))
    m2.oncall.resumed("gpu2", 142.0, "resumed")  # resumed, and Slurm drained it again: a new page
    m2.observe(Snapshot(150.0, _nodes(gpu2=dup), {}))
    assert m2.oncall.awaiting_oncall() == ["gpu2"] and m2.oncall.resumes_due(189.0) == []


def test_a_job_waiting_its_turn_in_a_moving_queue_is_not_stranded():
    m = _mon(pending_limit=30.0)
    m.jobs["12"] = JobMeta("12", "short", nodes=1)
    pend = _job("PENDING", "ReqNodeNotAvail", nodes=())
    busy = _nodes(gpu1=_node("ALLOCATED"), gpu2=_node("ALLOCATED"), gpu3=_node("ALLOCATED"),
                  gpu4=_node("MIXED"))
    # another job of the workload starts on a node it could use every 20 s: the backlog moves
    for i, t in enumerate(range(100, 200, 10)):
        jobs = {"11": pend, "12": _job(nodes=("gpu4",)) if i % 2 else pend}
        assert m.observe(Snapshot(float(t), busy, jobs)) == [], t
    # nothing starts any more: 30 s later it is stranded
    v = []
    for t in range(200, 240, 10):
        v += m.observe(Snapshot(float(t), busy, {"11": pend, "12": _job(nodes=("gpu4",))}))
    assert [x.invariant for x in v] == ["stranded"] and "job 11" in v[0].message


def test_the_loop_figure_leaves_out_the_time_no_node_the_job_could_use_was_free():
    """A requeued job that waits for a free node waits for the queue, not for the loop: the ``_loop_s``
    figure takes that time off (idle nodes it excludes do not count; a gap in the snapshots is not
    counted as queue time)."""
    m = _mon()
    busy = _nodes(gpu1=_node("IDLE+DRAIN", True, "autoheal: xid 79"), gpu2=_node("ALLOCATED"),
                  gpu3=_node("MIXED"), gpu4=_node("IDLE"))
    excl = "autoheal-runner restarts=1 excl=gpu1,gpu4"
    m.observe(Snapshot(99.0, _nodes(), {"10": _job(nodes=("gpu1",))}))
    m.add_fault(Injected(1, "xid79", "gpu", 100.0, node="gpu1", gpu=0))
    for t in range(101, 121):  # gpu4 idle but excluded: no node for it
        m.observe(Snapshot(float(t), busy, {"10": _job("PENDING", "Resources", (), 0, excl)}))
    free = dict(busy, gpu3=_node("IDLE"))
    for t in range(121, 126):  # gpu3 free: the loop's own time (requeue delay, scheduling)
        m.observe(Snapshot(float(t), free, {"10": _job("PENDING", "BeginTime", (), 0, excl)}))
    m.observe(Snapshot(126.0, free, {"10": _job(nodes=("gpu3",), restarts=1, comment=excl)}))
    r = m.recovery()
    assert r["fault_to_job_running_again_no_trip_s"]["p50"] == 26.0
    assert r["fault_to_job_running_again_loop_s"] == {"n": 1, "p50": 5.0, "p95": 5.0, "max": 5.0}
    m = _mon()  # no snapshot for 20 s (slurmctld down): that time stays in the figure
    m.observe(Snapshot(99.0, _nodes(), {"10": _job(nodes=("gpu1",))}))
    m.add_fault(Injected(1, "xid79", "gpu", 100.0, node="gpu1", gpu=0))
    m.observe(Snapshot(101.0, busy, {"10": _job("PENDING", "Resources", (), 0, excl)}))
    m.observe(Snapshot(121.0, busy, {"10": _job("PENDING", "Resources", (), 0, excl)}))
    m.observe(Snapshot(122.0, free, {"10": _job(nodes=("gpu3",), restarts=1, comment=excl)}))
    assert m.recovery()["fault_to_job_running_again_loop_s"]["p50"] == 20.0  # 22 s less the 2 s before 101


def test_per_fault_figures_say_what_the_node_was_doing_when_the_fault_came():
    m = _mon()
    m.observe(Snapshot(99.0, _nodes(gpu2=_node("IDLE+DRAIN", True, "admin: bios [root@2026-12-01T10:00:00]")),
                       {"10": _job(nodes=("gpu1",))}))
    m.add_fault(Injected(1, "xid79", "gpu", 100.0, node="gpu1", gpu=0))
    m.add_fault(Injected(2, "xid48", "gpu", 100.0, node="gpu2", gpu=0))
    m.observe(Snapshot(101.0, _nodes(gpu1=_node("IDLE+DRAIN", True, "autoheal: xid 79"),
                                      gpu2=_node("IDLE+DRAIN", True, "admin: bios")), {"10": _job("PENDING")}))
    m.observe(Snapshot(113.0, _nodes(gpu1=_node("IDLE+DRAIN", True, "autoheal: xid 79"),
                                      gpu2=_node("IDLE+DRAIN", True, "admin: bios")),
                       {"10": _job(nodes=("gpu3",), restarts=1)}))
    pf = m.per_fault()
    assert pf[1] == {"kind": "xid79", "node": "gpu1", "node_before": "IDLE", "drain_s": 1.0,
                     "job_running_again_s": [13.0], "job_running_again_loop_s": [13.0]}
    assert pf[2] == {"kind": "xid48", "node": "gpu2", "node_before": "IDLE+DRAIN admin: bios"}  # not ours to drain


def test_the_xid_drain_bound_is_judged_on_nodes_autoheal_had_to_drain():
    """An XID on a node an admin had drained drains only when the admin resumes it (autoheal never takes
    over their drain): that wait is not the loop's, and stays out of the in-service figure."""
    m = _mon()
    m.observe(Snapshot(99.0, _nodes(gpu2=_node("IDLE+DRAIN", True, "admin: bios")), {}))
    m.add_fault(Injected(1, "xid79", "gpu", 100.0, node="gpu1", gpu=0))
    m.add_fault(Injected(2, "xid79", "gpu", 100.0, node="gpu2", gpu=0))
    m.observe(Snapshot(100.5, _nodes(gpu1=_node("IDLE+DRAIN", True, "autoheal: xid 79"),
                                      gpu2=_node("IDLE+DRAIN", True, "admin: bios")), {}))
    m.observe(Snapshot(160.0, _nodes(gpu1=_node("IDLE+DRAIN", True, "autoheal: xid 79"),
                                      gpu2=_node("IDLE+DRAIN", True, "autoheal: xid 79")), {}))
    r = m.recovery()
    assert r["fault_to_drain_xid_event_s"]["n"] == 2 and r["fault_to_drain_xid_event_s"]["max"] == 60.0
    assert r["fault_to_drain_xid_event_in_service_s"] == {"n": 1, "p50": 0.5, "p95": 0.5, "max": 0.5}


def test_a_job_waiting_its_turn_at_the_end_is_not_stranded():
    """Bench seed 1: a short job pending for Resources at the end, behind trainers given one more settle
    period, with every node in service and busy. Pending with a satisfiable request is an allowed end
    (invariant 1); pending with no usable node, or held by nobody, is not."""
    m = _mon()
    busy = _nodes(gpu1=_node("ALLOCATED"), gpu2=_node("ALLOCATED"), gpu3=_node("MIXED"), gpu4=_node("ALLOCATED"))
    final = Snapshot(500.0, busy, {"10": _job(nodes=("gpu1",)), "11": _job("PENDING", "Resources", ())})
    m.observe(final)
    assert m.finish(final, [], 0, {}) == [] and m.queued_at_end == ["job 11 (Resources)"]
    m = _mon()  # ReqNodeNotAvail (retired nodes drained in the partition) while the queue moves: its turn too
    m.observe(Snapshot(400.0, busy, {"10": _job(nodes=("gpu1",)), "11": _job("PENDING", "ReqNodeNotAvail", ())}))
    final = Snapshot(500.0, busy, {"10": _job(nodes=("gpu1",)), "11": _job("PENDING", "ReqNodeNotAvail", ())})
    m.observe(final)
    assert m.finish(final, [], 0, {}) == [] and m.queued_at_end == ["job 11 (ReqNodeNotAvail)"]
    m = _mon()  # the same, not moving for longer than the pending limit: stranded
    m.observe(Snapshot(100.0, busy, {"10": _job(nodes=("gpu1",)), "11": _job("PENDING", "ReqNodeNotAvail", ())}))
    final = Snapshot(500.0, busy, {"10": _job(nodes=("gpu1",)), "11": _job("PENDING", "ReqNodeNotAvail", ())})
    assert "stranded" in [v.invariant for v in m.observe(final)]
    m = _mon()
    excluded = _job("PENDING", "Resources", (), comment="x excl=gpu1,gpu2,gpu3,gpu4")
    final = Snapshot(500.0, busy, {"10": _job(nodes=("gpu1",)), "11": excluded})
    m.observe(final)
    assert [v.invariant for v in m.finish(final, [], 0, {})] == ["stranded"]


def test_drain_figures_count_only_the_kinds_autoheal_drains_for():
    """Bench seed 1: an XID 94 (requeue the job, no drain) on a node in service "drained" 102 s later,
    when another fault of the node did: that is not its drain time."""
    m = _mon()
    m.observe(Snapshot(99.0, _nodes(), {}))
    m.add_fault(Injected(1, "xid94", "gpu", 100.0, node="gpu1", gpu=0))
    m.add_fault(Injected(2, "xid79", "gpu", 200.0, node="gpu2", gpu=0))
    m.observe(Snapshot(200.5, _nodes(gpu2=_node("IDLE+DRAIN", True, "autoheal: xid 79")), {}))
    m.observe(Snapshot(202.0, _nodes(gpu1=_node("IDLE+DRAIN", True, "autoheal: thermal"),
                                      gpu2=_node("IDLE+DRAIN", True, "autoheal: xid 79")), {}))
    r = m.recovery()
    assert r["fault_to_drain_s"] == {"n": 1, "p50": 0.5, "p95": 0.5, "max": 0.5}
    assert r["fault_to_drain_xid_event_in_service_s"]["n"] == 1


def test_a_job_slurm_forgot_before_the_end_is_judged_as_last_seen():
    """slurmctld forgets a job MinJobAge (300 s) after it ended: the bench's submitit job was missing from
    every seed's final squeue and escaped the final-state checks. It is judged as last seen."""
    m = _mon()
    m.observe(Snapshot(100.0, _nodes(), {"10": _job("FAILED", comment="autoheal-runner restarts=0 state=running"),
                                         "11": _job(nodes=("gpu2",))}))
    final = Snapshot(500.0, _nodes(), {"11": _job("COMPLETED", nodes=("gpu2",))})
    v = m.finish(final, [], 0, {})
    assert [x.invariant for x in v] == ["stranded"] and "opted-in job 10 ended FAILED" in v[0].message
    assert final.jobs["10"]["purged"] is True


# ---- issue 27: a node waiting visibly on a configured breaker limit -------------------------------------
GPU4_REPLACE = "autoheal: replace: xid 79 on GPU 0 of gpu4 (0000:1b:00.0): fallen off the bus"


def _kube_waiting(since, until, limit="start-share"):
    base = {n: {"unschedulable": False, "remediation": "", "labels": {}} for n in ("gpu1", "gpu2", "gpu3", "gpu4")}
    base["gpu4"] = {"unschedulable": False, "remediation": "waiting", "labels": {}, "since": str(int(since)),
                    "waiting_limit": limit, "waiting_until": str(int(until)) if until else ""}
    return base


def _seed_4242_end(kube, t=400.0, wait_bound=3600.0):
    """Seed 4242 at 25 faults: gpu4's replacement was refused by the start share (2 of 2 starts in the
    hour used by gpu1 and gpu2) and the soak ended with it drained `autoheal: replace: ...`."""
    m = _mon(wait_bound=wait_bound)
    m.add_fault(Injected(1, "xid79", "gpu", 100.0, node="gpu4", gpu=0))
    nodes = _nodes(gpu4=_node("IDLE+DRAIN", True, GPU4_REPLACE))
    m.observe(Snapshot(110.0, nodes, {}, kube=kube))
    final = Snapshot(t, nodes, {"10": _job("COMPLETED"), "11": _job("COMPLETED")}, kube=kube)
    m.observe(final)
    return m, m.finish(final, [], 0, {}, awaiting_ok=True, recovery_bound=125.0)


def test_a_node_waiting_visibly_on_the_start_share_is_waiting_not_stranded():
    m, v = _seed_4242_end(_kube_waiting(105.0, 50.0 + 3600.0))
    assert v == [] and len(m.waiting_limit) == 1 and "start-share" in m.waiting_limit[0], m.waiting_limit


def test_invisible_waiting_stays_an_end_state_violation():
    kube = _kube_waiting(105.0, 0.0)
    kube["gpu4"] = {"unschedulable": False, "remediation": "", "labels": {}}  # what main did: nothing shown
    m, v = _seed_4242_end(kube)
    assert [x.invariant for x in v] == ["end-state"] and m.waiting_limit == []


def test_a_visible_wait_longer_than_the_limit_allows_is_stranded():
    m, v = _seed_4242_end(_kube_waiting(105.0, 50.0 + 3600.0), t=105.0 + 3600.0 + 30.0)
    assert sorted({x.invariant for x in v} | {x.invariant for x in m.violations}) == ["end-state", "stranded"]
    m = _mon(wait_bound=600.0)  # an until beyond the window is a wrong promise
    m.add_fault(Injected(1, "xid79", "gpu", 100.0, node="gpu4", gpu=0))
    m.observe(Snapshot(110.0, _nodes(gpu4=_node("IDLE+DRAIN", True, GPU4_REPLACE)), {},
                       kube=_kube_waiting(105.0, 105.0 + 3600.0)))
    assert [x.invariant for x in m.violations] == ["stranded"] and "until" in m.violations[0].message


def test_a_job_pending_for_lack_of_nodes_while_one_waits_on_a_limit_is_waiting():
    kube = _kube_waiting(105.0, 50.0 + 3600.0)
    m = _mon(wait_bound=3600.0)
    down = _node("IDLE+DRAIN", True, GPU4_REPLACE)
    nodes = _nodes(gpu1=_node("IDLE+DRAIN", True, "admin: maintenance"), gpu2=down, gpu3=down, gpu4=down)
    final = Snapshot(400.0, nodes, {"10": _job("COMPLETED"), "11": _job("PENDING", "Resources", nodes=())},
                     kube=kube)
    v = m.finish(final, [], 0, {}, awaiting_ok=True)
    assert "stranded" not in {x.invariant for x in v}
    assert any(x.startswith("job 11") for x in m.waiting_limit), m.waiting_limit


def test_without_a_bound_a_limit_wait_is_not_accepted():
    m, v = _seed_4242_end(_kube_waiting(105.0, 50.0 + 3600.0), wait_bound=None)
    assert {x.invariant for x in m.violations} == {"stranded", "end-state"}


# ---- issue 27: without Kubernetes a node waiting for a replacement waits for the technician ------------
def _slurm_only_end(told: bool, repaired: bool):
    """Seed 5150 --no-kube: every GPU node ended at the replace rung and every job pending (44 stranded)."""
    m = _mon(slurm_only=True, repair_delays=(90.0,))
    m.add_fault(Injected(1, "xid79", "gpu", 100.0, node="gpu4", gpu=0))
    down = _node("IDLE+DRAIN", True, GPU4_REPLACE)
    nodes = _nodes(gpu1=down, gpu2=down, gpu3=down, gpu4=down)
    m.observe(Snapshot(110.0, nodes, {"10": _job("PENDING", "ReqNodeNotAvail", nodes=())}))
    assert m.oncall.awaiting_technician() == ["gpu1", "gpu2", "gpu3", "gpu4"]
    assert m.oncall.repairs_due(150.0) == [] and len(m.oncall.repairs_due(201.0)) == 4
    if repaired:
        for n in ("gpu1", "gpu2", "gpu3", "gpu4"):
            m.oncall.repaired(n, 230.0, "resumed")
        nodes = _nodes()
    journal = [{"event": "awaiting-replacement", "node": n, "time": 105.0} for n in ("gpu1", "gpu2", "gpu3", "gpu4")
               if told]
    final = Snapshot(400.0, nodes, {"10": _job("PENDING", "ReqNodeNotAvail", nodes=()) if not repaired
                                    else _job("COMPLETED"), "11": _job("COMPLETED")})
    m.observe(final)
    return m, m.finish(final, journal, 0, {}, awaiting_ok=True)


def test_slurm_only_nodes_wait_for_the_technician_visibly():
    m, v = _slurm_only_end(told=True, repaired=False)  # the technician has not come yet: waiting for a human
    assert v == [] and any(x.startswith("job 10") for x in m.waiting_human), m.waiting_human
    m, v = _slurm_only_end(told=True, repaired=True)
    assert v == [] and m.oncall.summary()["repairs"] == 4


def test_slurm_only_wait_nobody_was_told_of_is_stranded():
    m, v = _slurm_only_end(told=False, repaired=True)
    assert [x.invariant for x in v] == ["stranded"] * 4 and all("nobody was told" in x.message for x in v)


def test_an_admin_drain_slurmctld_lost_is_not_autoheal_touching_it_until_the_admin_looked_again():
    """Seed 60613 at 60 faults: the admin drained gpu1 at 22:17:45.5, slurmctld was killed 15.5 s later and
    came back with gpu1 UNKNOWN and no reason ("Recovered state of 6 nodes"): `admin-touched`, although
    nobody but Slurm had changed it. Lost to slurmctld until the admin has looked again; after that, and
    for any drain no kill could have lost, the rule holds."""
    m = _mon()
    drain = Injected(25, "admin-drain", "people", 100.0, node="gpu1", reason="admin: soak maintenance 25")
    m.add_fault(drain)
    m.add_fault(Injected(27, "kill-slurmctld", "process", 115.5))
    lost = _nodes(gpu1=_node("UNKNOWN+NOT_RESPONDING", False, "", responding=False))
    drain.lost_until = float("inf")  # the runner: a drain that kill may have lost, the admin looks again
    assert m.observe(Snapshot(130.0, lost, {})) == []
    drain.lost_until = 160.0  # the admin looked and drained it again
    back = _nodes(gpu1=_node("IDLE+DRAIN", True, "admin: soak maintenance 25"))
    assert m.observe(Snapshot(161.0, back, {})) == []
    assert [v.invariant for v in m.observe(Snapshot(170.0, lost, {}))] == ["admin-touched"]


def test_a_lemon_waiting_on_an_empty_pool_gets_the_technician_too():
    """Soak seed 46688 (lemons on): gpu3 and gpu4 became lemons once both spares were used; only
    `autoheal: replace:` nodes got a technician, so the lemons stayed out for good and the jobs waited."""
    from autoheal_lab.soak_checks import awaiting_replacement

    lemon = _node("IDLE+DRAIN", True, "autoheal: lemon: 3 faults in 7 d (xid 48, 109, 64)")
    req = [{"node": "gpu3", "name": "r1"}, {"node": "gpu4", "name": "r2"}]
    nodes = _nodes(gpu3=lemon, gpu4=_node("IDLE+DRAIN", True, "autoheal: xid 48 on GPU 1 of gpu4"),
                   spare1=_node("ALLOCATED"))
    assert awaiting_replacement(Snapshot(10.0, nodes, {}, kube={}, replacements=req)) == ["gpu3"]


def test_a_bad_repairs_defect_raised_again_is_a_cause_however_late():
    """Soak seed 43585: gpu4's bad repair was back in service (its fault resolved), the defect was raised
    again minutes later and the lemon drain it caused read as a false drain. Raised again, the fault is
    open again (Monitor.reopen, called by the soak on each re-injection)."""
    lemon = _node("IDLE+DRAIN", True, "autoheal: lemon: 3 faults in 7 d (xid 48, 95, 95)")
    for reopened in (False, True):
        m = Monitor([])
        m.observe(Snapshot(1.0, _nodes(), {}))
        f = Injected(7, "bad-repair", "gpu", 2.0, node="gpu4", gpu=2)
        m.add_fault(f)
        m.observe(Snapshot(3.0, _nodes(gpu4=_node("IDLE+DRAIN", True, "autoheal: xid 95 on GPU 2 of gpu4")), {}))
        m.observe(Snapshot(60.0, _nodes(), {}))  # back in service: resolved
        if reopened:
            m.reopen(f.id)
        m.observe(Snapshot(300.0, _nodes(gpu4=lemon), {}))  # raised again, long after cause_linger
        assert [v.invariant for v in m.violations if v.invariant == "false-drain"] == ([] if reopened else
                                                                                        ["false-drain"])


def test_a_job_waiting_for_a_lost_prolog_is_stranded_though_slurm_says_running():
    """Seed 12: job 4 allocated gpu1 140 ms before its slurmd was killed; RUNNING with reason Prolog on a
    working gpu1 until the end, which "ends the soak RUNNING" accepted. A prolog may take a while; one that
    has not ended after the pending limit never will."""
    m = _mon(pending_limit=30.0)
    busy = _nodes(gpu1=_node("MIXED"))
    for t in range(100, 131, 10):  # a prolog within the limit, then its batch script runs
        assert m.observe(Snapshot(float(t), busy, {"10": _job("RUNNING", "Prolog", ("gpu1",))})) == [], t
    assert m.observe(Snapshot(131.0, busy, {"10": _job(nodes=("gpu1",))})) == []
    v = []
    for t in range(140, 190, 10):  # a new run in Prolog: its clock starts again, and runs out
        v += m.observe(Snapshot(float(t), busy, {"10": _job("RUNNING", "Prolog", ("gpu1",), 1)}))
    assert [x.invariant for x in v] == ["stranded"] and "job 10" in v[0].message and "prolog" in v[0].message


def test_a_job_whose_prolog_met_a_bad_repairs_defect_raised_again_was_requeued_for_it():
    """Soak seed 32703: job 4 was requeued off gpu4 for its XID 64 (restart 1). Minutes later spare2, a
    bad repair, came back from its reboot; Slurm started job 4 there 17 ms later, the defect was raised
    again, the job's prolog saw the XID 95 and failed, and Slurm requeued it (restart 2). The allocation
    lasted 1.3 s, between snapshots, and the defect's cause was only looked for at its first injection:
    "job 4 restarted 2 times but only 1 fault(s) hit its nodes". Its prolog's record says where it was."""
    prolog = {"time": 300.4, "source": "prolog", "event": "detection", "node": "spare2", "job_ids": ["10"],
              "message": "xid 95 on GPU 0 of spare2 (0000:1b:00.0): uncontained ECC error"}
    done = Snapshot(400.0, _nodes(), {"10": _job("COMPLETED", nodes=("gpu4",), restarts=2,
                                                  comment="autoheal-runner restarts=2 state=completed")})
    for journal, reopened, want in (([prolog], True, []), ([], True, ["acted-twice"]),
                                    ([prolog], False, ["acted-twice"])):
        m = _mon()
        m.add_fault(Injected(7, "bad-repair", "gpu", 50.0, node="spare2", gpu=0))
        m.observe(Snapshot(100.0, _nodes(), {"10": _job(nodes=("gpu4",))}))
        m.add_fault(Injected(8, "xid64", "gpu", 101.0, node="gpu4", gpu=3))
        m.observe(Snapshot(102.0, _nodes(gpu4=_node("IDLE+DRAIN", True, "autoheal: xid 64")),
                           {"10": _job("PENDING", "BeginTime", nodes=(), restarts=1)}))
        if reopened:  # spare2 back in service at 300: the defect again, as the soak's BadRepair raises it
            m.faults[0].count += 1
            m.reopen(7, 300.0)
        v = m.finish(done, journal, 0, {}, [])
        assert [x.invariant for x in v if x.invariant == "acted-twice"] == want, (journal, reopened, v)
