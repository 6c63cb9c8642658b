"""When a drill phase happened, decided from its evidence's own clock (pure; unit-tested without a lab).

The drill polls its sources one after another, so the moment a poll sees a phase can trail the phase
by seconds (a drain is seen only once the poll gets round to ``scontrol``). Each probe therefore
returns an ``Evidence`` carrying the time its source itself gives (the journal record's timestamp, the
trainer's own clock, Slurm's event time, a Kubernetes object's time) and the poll time is kept only as a
fall-back and a bound. ``stamp`` decides the phase's time:

- no evidence time: the poll time, marked ``polled``;
- a whole-second clock (Slurm, Kubernetes) says only "in [t, t+1)": what is left of that second once
  bounded by the phase's cause and the poll is kept, and its middle printed;
- evidence before the fault (or before the phase it follows) by more than its clock's resolution is
  clock skew or a record of something else: clamped to that bound, and said so;
- evidence after the poll that saw it is impossible (skew the other way): clamped to the poll time.

A polled time is only an upper bound (the phase happened at or before the poll), so it never pushes a
later phase forward; instead a phase whose own clock puts it earlier pulls its polled (or whole-second)
cause back to it: a cause cannot come after its effect (``stamp_all``). The phases thus stay ordered.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import List, Optional, Sequence


class Clock(str, enum.Enum):
    """Whose clock a phase's time comes from (printed next to it)."""

    INJECT = "lab inject"  # the drill's own clock when it wrote the fault
    JOURNAL = "journal"  # the autoheal journal record's timestamp (sub-second)
    TRAINER = "trainer clock"  # the trainer's own time= on its line (sub-second)
    SLURM = "slurm event time"  # StartTime, Reason=...[user@TIME]: whole seconds
    KUBE = "kubernetes object time"  # lastTransitionTime, creationTimestamp: whole seconds
    POLLED = "polled"  # no time of its own: when the drill's poll first saw it

    @property
    def resolution(self) -> float:
        """How coarse the clock is: its times are truncated to this many seconds."""
        return 1.0 if self in (Clock.SLURM, Clock.KUBE) else 0.0


POLLED_NOTE = "polled: the evidence carries no time of its own"


@dataclass(frozen=True)
class Evidence:
    """What a probe saw: the detail, and when the evidence itself says it happened (None: it does not say)."""

    detail: str
    time: Optional[float] = None
    clock: Clock = Clock.POLLED


@dataclass(frozen=True)
class Stamp:
    """A phase's decided time, the clock it came from, and what was adjusted (``note``; "" when nothing).
    ``lower``/``upper`` bound when it can have happened (None: ``at``): a polled phase is known only to
    have come after its cause and by its poll; a whole-second one somewhere in its second."""

    at: float
    clock: Clock
    note: str = ""
    uncertainty: float = 0.0  # +/- seconds (half of what a whole-second clock leaves open)
    lower: Optional[float] = None
    upper: Optional[float] = None

    @property
    def earliest(self) -> float:
        return self.at if self.lower is None else self.lower

    @property
    def latest(self) -> float:
        return self.at if self.upper is None else self.upper


def pick(candidates: Sequence[Optional[Evidence]]) -> Optional[Evidence]:
    """The most precise evidence that has a time (the first of equals: callers list their best source
    first); the first candidate given when none has a time; None when there is none at all."""
    given = [c for c in candidates if c is not None]
    timed = [c for c in given if c.time is not None and c.clock is not Clock.POLLED]
    if timed:
        return min(timed, key=lambda c: c.clock.resolution)
    return given[0] if given else None


def stamp(evidence: Evidence, polled_at: float, floor: float, floor_name: str = "the fault") -> Stamp:
    """The time of a phase seen by a poll at ``polled_at`` with ``evidence``; ``floor`` is the newest of
    the fault's time and the time of the phase it follows (``floor_name``): a phase cannot come before it."""
    if evidence.time is None or evidence.clock is Clock.POLLED:
        at = max(polled_at, floor)
        return Stamp(at, Clock.POLLED, POLLED_NOTE, lower=floor, upper=at)
    t, res, clock = evidence.time, evidence.clock.resolution, evidence.clock
    if t > polled_at:
        return Stamp(max(polled_at, floor), clock,
                     f"clock skew: the evidence says {t - polled_at:.3f} s after the poll that saw it; "
                     f"clamped to the poll time")
    if t + res < floor:
        return Stamp(floor, clock, f"clock skew: the evidence says {floor - t:.3f} s before {floor_name}; "
                                   f"clamped to it")
    if res:
        lo, hi = max(t, floor), min(t + res, polled_at)
        hi = max(hi, lo)
        note = f"whole-second clock: between {floor_name} and {t + res - floor:.3f} s after it" if t < floor else ""
        return Stamp((lo + hi) / 2, clock, note, uncertainty=(hi - lo) / 2, lower=lo, upper=hi)
    if t < floor:  # a sub-second clock cannot be excused by truncation
        return Stamp(floor, clock, f"clock skew: the evidence says {floor - t:.3f} s before {floor_name}; "
                                   f"clamped to it")
    return Stamp(t, clock)


@dataclass
class Observation:
    """One phase as the watch left it: what it saw, when its poll saw it, and which earlier phase
    (index in the same list) it follows."""

    name: str
    evidence: Optional[Evidence]
    polled_at: Optional[float]
    follows: Optional[int] = None


def stamp_all(fault_time: float, observations: List[Observation]) -> List[Optional[Stamp]]:
    """Every observed phase stamped in list order, each no earlier than the fault and than the nearest
    observed phase up its ``follows`` chain (a cause comes before it in the list; a cause never seen
    passes its own cause's bound on); None for a phase never observed."""
    out: List[Optional[Stamp]] = []
    for i, obs in enumerate(observations):
        if obs.evidence is None or obs.polled_at is None:
            out.append(None)
            continue
        floor, floor_name = fault_time, "the fault"
        cause = _seen_cause(observations, out, i)
        if cause is not None:
            st = out[cause]
            if st is not None and st.earliest > floor:
                floor, floor_name = st.earliest, repr(observations[cause].name)
        out.append(stamp(obs.evidence, obs.polled_at, floor, floor_name))
    for i in reversed(range(len(out))):  # effects pull their imprecise causes back (newest first: chains)
        j = _seen_cause(observations, out, i)
        if j is not None and out[i] is not None:
            out[j] = _no_later_than(out[j], out[i].latest, repr(observations[i].name))  # type: ignore[arg-type]
    return out


def _seen_cause(observations: List[Observation], out: List[Optional[Stamp]], i: int) -> Optional[int]:
    """The nearest stamped phase up ``observations[i]``'s ``follows`` chain (causes come first)."""
    cause = observations[i].follows
    while cause is not None and 0 <= cause < i and out[cause] is None:
        cause = observations[cause].follows
    return cause if cause is not None and 0 <= cause < i else None


def _no_later_than(st: Stamp, bound: float, effect: str) -> Stamp:
    """``st`` (a cause) bounded by the latest its effect can have happened; a sub-second stamp already
    bounds its effects (their floor), so only a polled or whole-second one moves."""
    if st.latest <= bound or (st.lower is None and st.upper is None):
        return st
    lo = st.earliest
    hi = max(lo, bound)
    if st.clock is Clock.POLLED:
        return Stamp(hi, st.clock, f"polled {st.at - hi:.3f} s later; no later than {effect}", lower=lo, upper=hi)
    return Stamp((lo + hi) / 2, st.clock, (st.note + "; " if st.note else "") + f"no later than {effect}",
                 uncertainty=(hi - lo) / 2, lower=lo, upper=hi)
