"""hang.py's decisions (issue 23 §2): end a blocked step at once, never a healthy one that is slow."""

from __future__ import annotations

from autoheal.sbatch_helpers import hang
from autoheal.sbatch_helpers.hang import HangOptions, Verdict, decide, observe, start, within_backstop
from autoheal.sbatch_helpers.progress import Heartbeat

OPTS = HangOptions(hang_after_fault=10, watchdog=300, backstop=None)


def beat(rank, step, t, phase="step"):
    return Heartbeat(rank=rank, step=step, time=t, phase=phase)


def training(ranks=2, steps=5, every=1.0, t0=0.0, tracker=None):
    """A tracker after ``steps`` steps of ``ranks`` ranks, one heartbeat each ``every`` seconds."""
    tr = tracker or start({}, t0)
    for i in range(steps):
        now = t0 + (i + 1) * every
        tr = observe(tr, {r: beat(r, i, 1000 + now) for r in range(ranks)}, now)
    return tr


def test_within_backstop_is_half_the_hooks_grace():
    assert within_backstop(10, 10) == 5
    assert within_backstop(10, 120) == 10
    assert within_backstop(10, None) == 10
    assert within_backstop(10, 0) == 10  # xid-watch requeues at once: no window to stay inside


def test_blocked_ranks_after_a_fault_are_ended_after_hang_after_fault():
    tr = training(steps=5)  # last progress at t=5
    fault = 6.0
    assert decide(tr, 15.9, fault, OPTS).verdict == Verdict.WAIT
    d = decide(tr, 16.0, fault, OPTS)
    assert d.verdict == Verdict.HUNG_AFTER_FAULT and d.end and d.quiet == 10.0
    assert "last step 4" in d.why


def test_ranks_still_advancing_after_a_fault_are_waited_for():
    tr = training(steps=5)
    fault = 5.5
    for i in range(5, 30):  # they go on for 25 s (finishing their step, then saving in small parts)
        tr = observe(tr, {0: beat(0, i, 1000.0 + i)}, i + 1.0)
        assert decide(tr, i + 1.5, fault, OPTS).verdict == Verdict.WAIT
    assert decide(tr, 30 + 10, fault, OPTS).verdict == Verdict.HUNG_AFTER_FAULT


def test_a_hung_step_is_ended_inside_the_hooks_backstop():
    tr = training(steps=5)
    opts = HangOptions(hang_after_fault=10, backstop=10)  # the lab: xid-watch's grace 10 s
    assert decide(tr, 6 + 4.9, 6.0, opts).verdict == Verdict.WAIT
    assert decide(tr, 6 + 5.0, 6.0, opts).verdict == Verdict.HUNG_AFTER_FAULT


def test_a_rank_saving_after_the_fault_is_waited_for_and_a_stale_mark_is_not():
    tr = training(steps=5)
    tr = observe(tr, {0: beat(0, 5, 1006, "saving")}, 6.5)
    assert decide(tr, 6.0 + 100, 6.0, OPTS).verdict == Verdict.WAIT  # a long save
    opts = HangOptions(hang_after_fault=10, saving_max=60)
    d = decide(tr, 6.5 + 60, 6.0, opts)   # a mark left by a rank killed -9 mid-save
    assert d.verdict == Verdict.HUNG_AFTER_FAULT


def test_a_saving_mark_of_an_earlier_run_is_not_a_save_in_progress():
    tr = start({0: beat(0, 40, 900, "saving"), 1: beat(1, 40, 900)}, 0.0)
    assert hang.saving_ranks(tr, 1.0, 1800) == ()
    assert decide(tr, 11.0, 1.0, OPTS).verdict == Verdict.HUNG_AFTER_FAULT


def test_the_saving_mark_cleared_is_progress():
    tr = training(steps=5)
    tr = observe(tr, {0: beat(0, 5, 1006, "saving")}, 7.0)
    tr = observe(tr, {0: beat(0, 5, 1030, "saved")}, 30.0)
    assert decide(tr, 39.9, 6.0, OPTS).verdict == Verdict.WAIT
    assert decide(tr, 40.0, 6.0, OPTS).verdict == Verdict.HUNG_AFTER_FAULT


def test_a_job_without_heartbeats_is_never_judged():
    tr = start({}, 0.0)
    assert decide(tr, 1e6, None, OPTS).verdict == Verdict.WAIT
    assert decide(tr, 1e6, 10.0, OPTS).verdict == Verdict.WAIT  # after a fault: the grace as before


def test_a_job_that_only_saves_is_not_judged_by_the_watchdog():
    tr = start({0: beat(0, 100, 900, "saved")}, 0.0)
    tr = observe(tr, {0: beat(0, 200, 1000, "saving")}, 100.0)
    tr = observe(tr, {0: beat(0, 200, 1010, "saved")}, 110.0)
    assert decide(tr, 110 + 3000, None, OPTS).verdict == Verdict.WAIT
    # after a fault it is judged once it showed progress after the fault (it saved, then went quiet)
    assert decide(tr, 200.0, 150.0, OPTS).verdict == Verdict.WAIT
    tr = observe(tr, {0: beat(0, 210, 1160, "saved")}, 160.0)
    assert decide(tr, 170.0, 150.0, OPTS).verdict == Verdict.HUNG_AFTER_FAULT


def test_watchdog_ends_a_step_with_no_progress_and_no_fault():
    tr = training(steps=5)
    assert decide(tr, 5 + 299, None, OPTS).verdict == Verdict.WAIT
    d = decide(tr, 5 + 300, None, OPTS)
    assert d.verdict == Verdict.WATCHDOG and "since the last heartbeat" in d.why


def test_watchdog_zero_is_off():
    tr = training(steps=5)
    assert decide(tr, 1e6, None, HangOptions(watchdog=0)).verdict == Verdict.WAIT


def test_a_long_first_step_is_not_a_hang():
    # heartbeat at the top of the loop: step 0 is announced, then compiling takes 9 minutes
    tr = observe(start({}, 0.0), {0: beat(0, 0, 1000), 1: beat(1, 0, 1000)}, 5.0)
    assert decide(tr, 9 * 60.0, None, OPTS).verdict == Verdict.WAIT
    tr = observe(tr, {0: beat(0, 1, 1545), 1: beat(1, 1, 1545)}, 545.0)
    assert tr.advanced and tr.slowest == 0.0  # the first step's time is no measure of the others
    assert decide(tr, 545 + 299, None, OPTS).verdict == Verdict.WAIT
    assert decide(tr, 545 + 300, None, OPTS).verdict == Verdict.WATCHDOG


def test_the_first_step_of_a_restart_counts_from_the_step_start():
    earlier = {0: beat(0, 40, 500), 1: beat(1, 40, 500)}   # heartbeats of the run before the requeue
    tr = start(earlier, 0.0)
    assert tr.trains and not tr.advanced
    assert decide(tr, 599.0, None, OPTS).verdict == Verdict.WAIT   # loading, compiling: 2 x watchdog
    d = decide(tr, 600.0, None, OPTS)
    assert d.verdict == Verdict.WATCHDOG and "since the step started" in d.why


def test_slow_steps_get_twice_their_longest_gap():
    tr = training(steps=4, every=400.0)   # 400 s per step, longer than the watchdog
    assert tr.slowest == 400.0
    assert decide(tr, 1600 + 799, None, OPTS).verdict == Verdict.WAIT
    assert decide(tr, 1600 + 800, None, OPTS).verdict == Verdict.WATCHDOG
    # after a fault too, but never past the backstop
    assert decide(tr, 1601 + 799, 1601.0, OPTS).verdict == Verdict.WAIT
    assert decide(tr, 1601 + 60, 1601.0, HangOptions(backstop=120)).verdict == Verdict.HUNG_AFTER_FAULT


def test_a_long_save_with_no_fault_is_never_ended_by_the_watchdog():
    tr = training(steps=5)
    tr = observe(tr, {0: beat(0, 5, 1006, "saving"), 1: beat(1, 5, 1006, "saving")}, 6.0)
    assert decide(tr, 6 + 1700, None, OPTS).verdict == Verdict.WAIT   # a 28-minute save
    tr = observe(tr, {0: beat(0, 5, 2706, "saved"), 1: beat(1, 5, 2706, "saved")}, 1706.0)
    assert tr.slowest == 1.0  # the save is no step: it does not stretch the limit
    assert decide(tr, 1706 + 299, None, OPTS).verdict == Verdict.WAIT
    assert decide(tr, 1706 + 300, None, OPTS).verdict == Verdict.WATCHDOG


def test_one_rank_advancing_is_progress_of_the_step():
    tr = training(ranks=4, steps=3)
    for i in range(3, 400):
        tr = observe(tr, {0: beat(0, i, 1000.0 + i)}, float(i))
    assert decide(tr, 400.0, None, OPTS).verdict == Verdict.WAIT


def test_an_unchanged_record_is_no_progress_and_a_vanished_file_keeps_the_last():
    tr = training(steps=3)
    same = dict(tr.seen)
    assert observe(tr, same, 100.0) is tr
    assert observe(tr, {}, 100.0) is tr
    assert hang.last_steps(tr) == {0: 2, 1: 2}


def polled(step_seconds, poll=2.0, reads=5, ranks=2):
    """A tracker as the runner builds it: read every ``poll`` seconds (its clock, from 0) while the ranks
    take ``step_seconds`` per step (their records' own clock, from 5000: another node's)."""
    tr = start({}, 0.0)
    for k in range(1, reads + 1):
        now = k * poll
        step = int(now / step_seconds)
        tr = observe(tr, {r: beat(r, step, 5000 + step * step_seconds) for r in range(ranks)}, now)
    return tr


def test_a_one_second_hang_after_fault_is_honoured_on_fast_steps():
    # the tiers bench: 0.1 s steps, --hang-after-fault 1, read every 2 s; the limit was 4.09 s (twice the
    # runner's polling gap), now 1 s: the steps' own time (0.1 s) doubled is below it
    tr = polled(0.1)
    assert abs(tr.slowest - 0.1) < 1e-6
    opts = HangOptions(hang_after_fault=1, watchdog=300)
    fault = 10.2
    assert decide(tr, fault + 0.9, fault, opts).verdict == Verdict.WAIT
    d = decide(tr, fault + 1.0, fault, opts)
    assert d.verdict == Verdict.HUNG_AFTER_FAULT and "(limit 1s)" in d.why


def test_steps_slower_than_the_polling_are_measured_by_their_records():
    tr = polled(3.0, poll=2.0, reads=10)  # one step per 3 s, read every 2 s: some reads see none
    assert abs(tr.slowest - 3.0) < 1e-6
    d = decide(tr, 20.0 + 5.9, 20.0, HangOptions(hang_after_fault=1))
    assert d.verdict == Verdict.WAIT and "of 6s" in d.why  # twice the step's time, not the 1 s asked


def test_a_rank_clock_stepped_back_is_measured_by_the_runners_clock():
    tr = observe(start({}, 0.0), {0: beat(0, 0, 5000)}, 1.0)
    tr = observe(tr, {0: beat(0, 1, 5001)}, 2.0)
    tr = observe(tr, {0: beat(0, 2, 4000)}, 5.0)  # NTP stepped the node's clock back
    assert tr.slowest == 3.0
