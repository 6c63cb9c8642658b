"""Hang detection for the job runner (issue 23 §2): pure decisions from the ranks' heartbeats.

On real hardware a fault does not politely end the job: a rank whose GPU fell off the bus fails or hangs,
its peers block in their next collective until NCCL's timeout (10 min by default), and a Python signal
handler does not run while the main thread is inside such a C call. Waiting the whole grace window for
ranks that cannot answer wastes it; with no fault signal at all (a node's slurmd killed, an NVLink hang
with no XID) the job would hang until the time limit. The runner feeds what it reads
(``progress.read_heartbeats``) into a :class:`Tracker` and asks :func:`decide`:

- After a fault signal: ranks still advancing or saving (a fresh ``saving`` mark) are waited for, up
  to the runner's grace; a step with no rank progress for ``hang_after_fault`` seconds since the fault
  (or since its last progress) is ended at once. The hooks requeue the job themselves
  ``hooks.grace_seconds`` after their signal; a hung step is ended within half of that
  (:func:`within_backstop`), or Slurm's KillWait would be spent on the blocked ranks.
- No fault known: no progress for ``watchdog`` seconds ends the step (0: off).

Never a healthy step that is merely slow:

- A save is marked (``saving``); the mark is trusted for ``saving_max`` seconds after the runner first
  saw it (a rank killed -9 mid-save leaves it behind).
- The first step of a run (loading, compiling, the first collective) is given ``first_step_factor``
  times the watchdog, counted from the step's start, until some rank's step number advances.
- A step is given at least ``slow_factor`` times the longest time one training step took, so a job
  whose steps take minutes is not judged by a limit meant for sub-second steps. That time is measured
  from the heartbeat records' own times (one rank's two records: one clock, whatever the skew between
  nodes), per step (a rank that went from step 10 to 30 between two reads took a twentieth each): the
  runner reads only every ``HEARTBEAT_POLL`` seconds, and the gap between its reads put a floor of
  twice that under every limit (``--hang-after-fault 1`` was "limit 4.09277s" on 0.1 s steps).
- The watchdog judges only jobs that write per-step heartbeats (``heartbeat()``, phase ``step``) now
  or in an earlier run: a job whose only records come from its saves, or that writes none, is never
  ended for being quiet. After a fault such a job is judged only once it showed progress after the
  fault (it saved, then went quiet).

Progress is a change of a rank's record as the runner sees it, timed by the runner's own clock: ranks
on other nodes have other clocks. A record's own time serves only to measure how long that rank's
steps take (above); a rank's clock stepped back (a negative difference) is measured by the runner's.
The same rule gives how far a run got (``Tracker.reached``): the furthest step among the records seen to
change, which the runner records at a requeue for its no-progress rule (``runner.no_progress``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, Mapping, Optional, Tuple

from autoheal.sbatch_helpers.progress import PHASE_SAVING, PHASE_STEP, Heartbeat
from autoheal.strenum import StrEnum

DEFAULT_HANG_AFTER_FAULT = 10.0
#: NVIDIA Resiliency Extension's rank heartbeat default; well under NCCL's 600 s collective timeout.
DEFAULT_WATCHDOG = 300.0
DEFAULT_SAVING_MAX = 1800.0


class Verdict(StrEnum):
    WAIT = "wait"
    HUNG_AFTER_FAULT = "hung-after-fault"
    WATCHDOG = "watchdog"


@dataclass(frozen=True)
class HangOptions:
    """``hang_after_fault``: seconds of no progress after a fault signal before the step is ended.
    ``watchdog``: seconds of no progress with no fault known (0: off). ``backstop``: the hooks' own
    grace (``hooks.grace_seconds``; None or 0: none known)."""

    hang_after_fault: float = DEFAULT_HANG_AFTER_FAULT
    watchdog: float = DEFAULT_WATCHDOG
    backstop: Optional[float] = None
    saving_max: float = DEFAULT_SAVING_MAX
    first_step_factor: float = 2.0
    slow_factor: float = 2.0


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    why: str
    quiet: float = 0.0  # seconds without progress that the verdict is based on

    @property
    def end(self) -> bool:
        return self.verdict != Verdict.WAIT


@dataclass(frozen=True)
class StepMark:
    """A rank's current training step as first seen this step: its number, the record's own time and
    the runner's clock when it was read."""

    step: int
    time: float
    seen_at: float


@dataclass(frozen=True)
class Tracker:
    """What the runner saw of one step's heartbeats (times on the runner's monotonic clock)."""

    started: float
    baseline: Mapping[int, Heartbeat] = field(default_factory=dict)  # present when the step started
    seen: Mapping[int, Heartbeat] = field(default_factory=dict)      # the latest record per rank
    changed: Mapping[int, float] = field(default_factory=dict)       # when each rank's record changed
    first_step: Mapping[int, int] = field(default_factory=dict)      # each rank's first step number
    last_progress: Optional[float] = None
    last_phase: str = ""          # phase of the record that made the last progress
    advanced: bool = False        # some rank's step number went up this step
    trains: bool = False          # the job writes per-step heartbeats (now or in an earlier run)
    slowest: float = 0.0          # the longest time one training step took, after each rank's first
    marks: Mapping[int, StepMark] = field(default_factory=dict)  # each rank's current training step
    #: the furthest step among the records seen to change this step (never a baseline's: an earlier
    #: run's record says how far that run got, not this one); None while nothing changed
    reached: Optional[int] = None


def within_backstop(seconds: float, backstop: Optional[float]) -> float:
    """``seconds``, but no more than half the hooks' grace: the runner ends a hung step well before
    xid-watch requeues the job itself. A backstop of 0 (xid-watch requeues at once) or None bounds
    nothing: there is no window left to stay inside."""
    if backstop is None or backstop <= 0:
        return seconds
    return min(seconds, backstop / 2.0)


def start(beats: Mapping[int, Heartbeat], now: float) -> Tracker:
    """A step starts: what is there already is an earlier run's (or step's), not progress."""
    return Tracker(started=now, baseline=dict(beats), seen=dict(beats),
                   trains=any(b.phase == PHASE_STEP for b in beats.values()))


def observe(tracker: Tracker, beats: Mapping[int, Heartbeat], now: float) -> Tracker:
    """The tracker after reading ``beats`` at ``now``. A rank whose file vanished keeps its last record."""
    fresh = {rank: beat for rank, beat in beats.items() if tracker.seen.get(rank) != beat}
    if not fresh:
        return tracker
    seen, changed, first = dict(tracker.seen), dict(tracker.changed), dict(tracker.first_step)
    marks = dict(tracker.marks)
    advanced, slowest = tracker.advanced, tracker.slowest
    training = any(b.phase == PHASE_STEP for b in fresh.values())
    reached = max([b.step for b in fresh.values()] + ([] if tracker.reached is None else [tracker.reached]))
    for rank, beat in fresh.items():
        seen[rank], changed[rank] = beat, now
        first.setdefault(rank, beat.step)
        advanced = advanced or beat.step > first[rank]
        mark = marks.get(rank)
        if beat.phase != PHASE_STEP:
            marks.pop(rank, None)  # a save between two steps is no step: not measured with them
        elif mark is None or beat.step < mark.step:
            marks[rank] = StepMark(beat.step, beat.time, now)
        elif beat.step > mark.step:
            if mark.step > first[rank]:  # the first step's time (loading, compiling) is no measure
                slowest = max(slowest, step_time(mark, beat, now))
            marks[rank] = StepMark(beat.step, beat.time, now)
    return replace(tracker, seen=seen, changed=changed, first_step=first, last_progress=now,
                   last_phase=PHASE_STEP if training else next(iter(fresh.values())).phase,
                   advanced=advanced, trains=tracker.trains or training, slowest=slowest, marks=marks,
                   reached=reached)


def step_time(mark: StepMark, beat: Heartbeat, now: float) -> float:
    """Seconds per step from ``mark`` to ``beat`` (a later step of the same rank), by the rank's own
    record times; by the runner's clock when the rank's went back. A rank's clock stepped forward only
    lengthens the limit (a healthy step is never ended for it; the hooks' backstop still bounds it)."""
    elapsed = beat.time - mark.time
    if elapsed <= 0:
        elapsed = now - mark.seen_at
    return max(0.0, elapsed) / (beat.step - mark.step)


def saving_ranks(tracker: Tracker, now: float, saving_max: float) -> Tuple[int, ...]:
    """Ranks whose ``saving`` mark appeared this step and is younger than ``saving_max``."""
    return tuple(sorted(rank for rank, beat in tracker.seen.items()
                        if beat.phase == PHASE_SAVING and rank in tracker.changed
                        and now - tracker.changed[rank] < saving_max))


def decide(tracker: Tracker, now: float, fault_at: Optional[float], opts: HangOptions) -> Decision:
    """Keep waiting, or end the step: hung after the fault (``fault_at``: when the runner got the grace
    signal, None when no fault is known) or stopped by the watchdog."""
    saving = saving_ranks(tracker, now, opts.saving_max)
    if saving:
        return Decision(Verdict.WAIT, f"rank(s) {_ranks(saving)} saving a checkpoint")
    slow = opts.slow_factor * tracker.slowest
    if fault_at is not None:
        since_fault = tracker.last_progress is not None and tracker.last_progress >= fault_at
        if not (tracker.trains or since_fault):
            return Decision(Verdict.WAIT, "no heartbeats to judge by: waiting the grace")
        limit = within_backstop(max(opts.hang_after_fault, slow), opts.backstop)
        quiet = now - max(fault_at, tracker.last_progress if tracker.last_progress is not None else tracker.started)
        if quiet >= limit:
            return Decision(Verdict.HUNG_AFTER_FAULT, f"no rank progressed for {quiet:.1f}s after the fault signal "
                            f"(limit {limit:g}s){_last(tracker)}", quiet)
        return Decision(Verdict.WAIT, f"quiet {quiet:.1f}s of {limit:g}s after the fault", quiet)
    if opts.watchdog <= 0 or not tracker.trains:
        return Decision(Verdict.WAIT, "watchdog off" if opts.watchdog <= 0 else "no per-step heartbeats")
    if not tracker.advanced:
        limit, since, what = opts.watchdog * opts.first_step_factor, tracker.started, "since the step started"
    else:
        assert tracker.last_progress is not None  # advanced implies a change was seen
        limit, since, what = max(opts.watchdog, slow), tracker.last_progress, "since the last heartbeat"
    quiet = now - since
    if quiet >= limit:
        return Decision(Verdict.WATCHDOG, f"no rank progressed for {quiet:.0f}s {what} (limit {limit:g}s)"
                        f"{_last(tracker)}", quiet)
    return Decision(Verdict.WAIT, f"quiet {quiet:.1f}s of {limit:g}s", quiet)


def last_steps(tracker: Tracker) -> Dict[int, int]:
    """Each rank's last step seen this step (for the records: how far training got)."""
    return {rank: beat.step for rank, beat in sorted(tracker.seen.items()) if rank in tracker.changed}


def _ranks(ranks: Tuple[int, ...]) -> str:
    shown = ",".join(str(r) for r in ranks[:8])
    return shown + (f",... ({len(ranks)})" if len(ranks) > 8 else "")


def _last(tracker: Tracker) -> str:
    steps = last_steps(tracker)
    return f"; last step {max(steps.values())}" if steps else ""
