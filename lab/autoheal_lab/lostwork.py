"""Lost steps, measured from the trainers' own output (pure text parsing).

The example trainers print ``start step=S ...`` when a run begins (S: the step it resumed from) and
``step=N`` after each step (``srun -l`` puts ``<rank>: `` in front). A resume is a block of start lines
after steps were printed; the steps lost to it are the newest step any rank had completed before it
minus the oldest step a rank resumed from: the work computed before the fault that had to be done again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

_LINE = re.compile(r"^(?:(\d+): )?autoheal-trainer: (start step=(\d+)|step=(\d+))(?:\s|$)(?:.*?time=([\d.]+))?")


@dataclass
class Resume:
    """One restart of the training: where each rank was, where each started again."""

    before: Dict[str, int]  # rank ("" without srun -l) -> last step completed before the restart
    resumed: Dict[str, int] = field(default_factory=dict)  # rank -> step it started from
    last_step_time: Optional[float] = None  # the trainer's own clock at its last step before (--timestamps)

    @property
    def lost(self) -> int:
        return max(0, max(self.before.values()) - min(self.resumed.values()))


def resumes(text: str) -> List[Resume]:
    """Every restart in one job's output, oldest first."""
    out: List[Resume] = []
    last: Dict[str, int] = {}
    last_time: Optional[float] = None
    current: Optional[Resume] = None  # the start block being read
    stepped = False  # a step line since the last start block
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        rank = m.group(1) or ""
        if m.group(3) is not None:
            if stepped:
                current = Resume(before=dict(last), last_step_time=last_time)
                out.append(current)
                stepped = False
            if current is not None:
                current.resumed.setdefault(rank, int(m.group(3)))
        else:
            stepped = True
            current = None
            last[rank] = int(m.group(4))
            last_time = float(m.group(5)) if m.group(5) else last_time
    return out


def lost_steps(text: str) -> Optional[int]:
    """The steps lost to the first restart in ``text`` (None: no restart yet)."""
    found = resumes(text)
    return found[0].lost if found else None
