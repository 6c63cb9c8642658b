"""A job's allocation time from ``scontrol -o show job ID`` (the text listings of 22.05 do not give it).

The line holds user text (JobName, Command, WorkDir, Comment, StdOut...) before and after StartTime, and a
user may put ``StartTime=...`` in any of it. So every ``StartTime=`` that starts a field is read, and the
value counts only when they all agree: a forged one that disagrees makes the answer None ("unknown"),
and one that agrees changes nothing. The guard never acts on an unknown start time, so the most a user
gets by forging is that the guard leaves their own job alone.
"""

from __future__ import annotations

import re
import time
from typing import Optional

_START = re.compile(r"(?:^|\s)StartTime=(\S*)")


def _epoch(value: str) -> Optional[int]:
    """``2026-12-03T05:00:00`` (local time, as scontrol prints it) -> epoch seconds; None for Unknown/None."""
    try:
        return int(time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def start_time_from_show_job(text: str) -> Optional[int]:
    """The StartTime of ``scontrol -o show job ID`` output, or None when it is unknown or ambiguous."""
    values = {m.group(1) for m in _START.finditer(text or "")}
    if len(values) != 1:
        return None
    return _epoch(values.pop())
