"""The soak's seeded fault schedule: replayable, covering, overlapping, honest about its pool."""

from __future__ import annotations

import pytest

from autoheal_lab.soak_plan import GPU_KINDS, KINDS, REPLACEMENT, kinds_for, make_schedule

NODES = ["gpu1", "gpu2", "gpu3", "gpu4"]


def test_same_seed_same_schedule_other_seed_other_schedule():
    a = make_schedule(7, 40, NODES, 4, spares=2).to_dict()
    b = make_schedule(7, 40, NODES, 4, spares=2).to_dict()
    c = make_schedule(8, 40, NODES, 4, spares=2).to_dict()
    assert a == b
    assert a != c
    assert a["seed"] == 7 and len(a["faults"]) == 40


def test_every_kind_once_before_any_repeats():
    s = make_schedule(3, len(KINDS), NODES, 8, spares=2)
    assert sorted(f.kind for f in s.faults) == sorted(KINDS)
    s2 = make_schedule(3, len(KINDS) + 5, NODES, 8)
    first = [f.kind for f in s2.faults][:len(KINDS)]
    assert sorted(first) == sorted(KINDS)


def test_targets_and_times_are_sane():
    s = make_schedule(11, 200, NODES, 4, spares=2)
    last = 0.0
    for f in s.faults:
        spec = KINDS[f.kind]
        assert f.at >= last - 0.001 or f.overlap in ("pair", "during-recovery")
        last = max(last, f.at)
        if spec.group == "gpu":
            assert 0 <= f.gpu < 4
            assert f.node in NODES or (f.node == REPLACEMENT and f.fallback in NODES)
        else:
            assert f.gpu is None
        if spec.clears_after:
            lo, hi = spec.clears_after
            assert lo <= f.duration <= hi
        else:
            assert f.duration == 0.0
    assert s.span >= s.faults[-1].at


def test_overlaps_are_planned():
    s = make_schedule(5, 200, NODES, 4, spares=2)
    kinds = {f.overlap for f in s.faults}
    assert {"single", "pair", "during-recovery", "on-replacement"} <= kinds
    for prev, f in zip(s.faults, s.faults[1:]):
        if f.overlap == "pair":
            assert f.at == prev.at and f.node != prev.node
        if f.overlap == "during-recovery":
            assert f.node == prev.node and 1.0 <= f.at - prev.at <= 3.0


def test_no_kube_leaves_out_kubernetes_faults_and_unknown_kinds_raise():
    pool = kinds_for(kube=False)
    assert "kubectl-cordon" not in pool and "api-5xx" not in pool and "kill-sync" not in pool
    assert "xid79" in pool
    s = make_schedule(1, 60, NODES, 4, kube=False)
    assert not any(KINDS[f.kind].needs_kube for f in s.faults)
    with pytest.raises(ValueError, match="unknown fault kind"):
        kinds_for(True, exclude=["xid80"])
    with pytest.raises(ValueError):
        make_schedule(1, 5, NODES, 4, include=["kill-sync"], kube=False)


def test_include_and_exclude():
    s = make_schedule(2, 30, NODES, 4, include=list(GPU_KINDS), exclude=["flapping"])
    assert {f.kind for f in s.faults} <= set(GPU_KINDS) - {"flapping"}
    assert make_schedule(2, 0, NODES, 4).faults == []


def test_on_call_delays_are_seeded_bounded_and_leave_the_faults_alone():
    a = make_schedule(7, 40, NODES, 4, spares=2)
    b = make_schedule(7, 40, NODES, 4, spares=2)
    c = make_schedule(8, 40, NODES, 4, spares=2)
    assert a.oncall == b.oncall and a.oncall != c.oncall
    assert len(a.oncall) == 40 and all(30.0 <= d <= 90.0 for d in a.oncall)
    assert a.to_dict()["oncall"] == a.oncall
    # a stream of its own: other on-call bounds, the very same faults
    d = make_schedule(7, 40, NODES, 4, spares=2, oncall=(5.0, 6.0))
    assert d.faults == a.faults and all(5.0 <= x <= 6.0 for x in d.oncall)
    # the n-th trip gets the n-th delay, reused in order past the end
    assert a.oncall_delay(0) == a.oncall[0] and a.oncall_delay(41) == a.oncall[1]
    assert make_schedule(7, 0, NODES, 4).oncall_delay(3) > 0
    with pytest.raises(ValueError):
        make_schedule(7, 5, NODES, 4, oncall=(9.0, 3.0))


def test_hot_spare_targets_change_only_targets_and_start_with_the_first_draining_gpu_fault():
    from autoheal_lab.soak_plan import HOT_SPARE

    for seed in (5, 12, 40):
        plain = make_schedule(seed, 60, NODES, 4, spares=2)
        hot = make_schedule(seed, 60, NODES, 4, spares=2, hot_spare=True)
        assert [(f.kind, f.at, f.gpu, f.duration) for f in plain.faults] == \
            [(f.kind, f.at, f.gpu, f.duration) for f in hot.faults]
        aimed = [f for f in hot.faults if f.node == HOT_SPARE]
        first_drain = next(f for f in hot.faults if KINDS[f.kind].drains and KINDS[f.kind].group == "gpu"
                           and f.overlap in ("single", "on-hot-spare-job"))
        assert aimed and aimed[0].id == first_drain.id, (seed, aimed)
        for f in aimed:
            assert f.fallback in NODES
            assert f.overlap == "during-recovery" or (KINDS[f.kind].drains and f.overlap == "on-hot-spare-job")
        # every other fault keeps its planned node
        assert all(p.node == h.node for p, h in zip(plain.faults, hot.faults) if h.node != HOT_SPARE)


def test_bucket_kinds_draw_their_xids_from_the_catalog():
    from autoheal.hooks.xid_catalog import default_policy, entry

    s = make_schedule(5, 60, NODES, 8, include=["xid-app", "xid-ignore", "xid-reset"])
    seen = {}
    for f in s.faults:
        e = entry(f.xid)
        assert e is not None and e.immediate == KINDS[f.kind].bucket and e.applies_to("H100"), f
        seen.setdefault(f.kind, set()).add(f.xid)
        assert (default_policy(f.xid) in ("reset",)) is KINDS[f.kind].drains, f
    assert all(len(v) > 1 for v in seen.values()), seen  # not one XID per bucket: the bucket is drawn from
    assert make_schedule(5, 60, NODES, 8, include=["xid-app", "xid-ignore", "xid-reset"]).to_dict() == s.to_dict()
