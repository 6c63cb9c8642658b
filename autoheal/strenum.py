"""``StrEnum``: the base of autoheal's closed sets of words (check verdicts, actions, rungs, guard kinds).

A member is a ``str`` equal to its value, and prints, formats and serialises as that value on every
Python autoheal supports (3.9+; Python 3.12 changed ``format()`` of a plain ``(str, Enum)`` to
``Class.MEMBER``), so JSON output, journal lines and messages stay exactly what the free strings wrote.
"""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """A ``str`` enum whose ``str()`` and ``format()`` are its value (``enum.StrEnum`` is 3.11+)."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(str.__str__(self), format_spec)
