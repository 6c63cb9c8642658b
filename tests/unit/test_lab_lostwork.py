"""Lost steps from the trainers' own output (autoheal_lab.lostwork)."""

from __future__ import annotations

from autoheal_lab.lostwork import lost_steps, resumes

T = "autoheal-trainer: "


def test_no_restart_no_figure():
    assert lost_steps(f"0: {T}start step=0 resumed_from=none\n0: {T}step=1\n") is None


def test_the_newest_step_any_rank_reached_minus_the_oldest_resume():
    text = "\n".join([
        f"0: {T}start step=0 resumed_from=none", f"1: {T}start step=0 resumed_from=none",
        f"0: {T}step=1", f"1: {T}step=1", f"0: {T}step=2", f"1: {T}step=2", f"0: {T}step=3",
        f"0: {T}checkpoint saved step=2 path=/c/ckpt-00000002",
        "slurmstepd: error: *** JOB 5 ON gpu1 CANCELLED ***",
        f"1: {T}start step=2 resumed_from=/c/ckpt-00000002", f"0: {T}start step=2 resumed_from=/c/ckpt-00000002",
        f"0: {T}step=3", f"1: {T}step=3",
    ])
    (r,) = resumes(text)
    assert r.before == {"0": 3, "1": 2} and r.resumed == {"0": 2, "1": 2}
    assert lost_steps(text) == 1


def test_ranks_resuming_from_different_copies_count_the_oldest():
    text = "\n".join([f"0: {T}step=9", f"1: {T}step=9", f"0: {T}start step=8", f"1: {T}start step=6",
                      f"0: {T}step=9"])
    assert lost_steps(text) == 3


def test_timestamps_and_unprefixed_lines_and_two_restarts():
    text = "\n".join([f"{T}start step=0", f"{T}step=1 time=100.5", f"{T}step=2 time=100.7", f"{T}start step=2",
                      f"{T}step=3 time=110.0", f"{T}step=4 time=110.2", f"{T}start step=0 reason=x", f"{T}step=1"])
    first, second = resumes(text)
    assert first.lost == 0 and first.last_step_time == 100.7
    assert second.before == {"": 4} and second.lost == 4 and second.last_step_time == 110.2


def test_other_lines_do_not_count():
    text = "\n".join([f"0: {T}step=5", f"0: {T}memory saved step=4 nodes=a,b", f"0: {T}signal received USR2 at step=5",
                      f"0: {T}preempted step=5 checkpoint=rank0 exit=99", f"0: {T}start step=5"])
    assert lost_steps(text) == 0
