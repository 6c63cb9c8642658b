"""Slurm hostlist expressions (``gpu[1-3,7],spare1``) without calling ``scontrol show hostnames``."""

from __future__ import annotations

import re

from autoheal.errors import SlurmParseError

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import List

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(expr: str) -> List[str]:
    parts: List[str] = []
    depth = 0
    cur: List[str] = []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SlurmParseError(f"unbalanced ']' in hostlist {expr!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise SlurmParseError(f"unbalanced '[' in hostlist {expr!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def expand(expr: str) -> List[str]:
    """``gpu[1-2,5]`` -> ``['gpu1', 'gpu2', 'gpu5']``; zero padding kept (``n[01-02]``)."""
    if not expr or expr in ("(null)", "None", "N/A"):
        return []
    out: List[str] = []
    for item in _split_top(expr):
        m = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", item)
        if not m:
            out.append(item)
            continue
        prefix, ranges, rest = m.groups()
        for r in ranges.split(","):
            rm = _RANGE.match(r.strip())
            if not rm:
                raise SlurmParseError(f"bad range {r!r} in hostlist {expr!r}")
            lo, hi = rm.group(1), rm.group(2) or rm.group(1)
            if int(hi) < int(lo):
                raise SlurmParseError(f"reversed range {r!r} in hostlist {expr!r}")
            width = len(lo) if lo.startswith("0") else 0
            if int(hi) - int(lo) > 100000:
                raise SlurmParseError(f"range {r!r} in hostlist {expr!r} is implausibly large")
            for i in range(int(lo), int(hi) + 1):
                for tail in expand(rest) if "[" in rest else [rest]:
                    out.append(f"{prefix}{str(i).zfill(width)}{tail}")
    return out
