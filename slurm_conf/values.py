"""Reading values the way ``scontrol show config`` prints them (pure functions)."""

from __future__ import annotations

import math
import re
from typing import Dict, List, Optional

NULLS = {"", "(null)", "none", "(null type)", "n/a"}
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")


def is_null(value: Optional[str]) -> bool:
    """True for absent / ``(null)`` / empty values."""
    return value is None or value.strip().lower() in NULLS


def number(value: Optional[str]) -> Optional[float]:
    """``"30 sec"`` -> 30.0, ``"65534"`` -> 65534.0, ``INFINITE``/``UNLIMITED`` -> inf; None if unreadable."""
    if value is None:
        return None
    text = value.strip()
    if text.upper() in ("INFINITE", "UNLIMITED"):
        return math.inf
    m = _NUMBER.match(text)
    return float(m.group(1)) if m else None


def items(value: Optional[str]) -> List[str]:
    """A comma list (``"Alloc,Contain"``, ``"socket=/x,cred_expire=10"``) as stripped items; [] if null."""
    if is_null(value):
        return []
    return [i.strip() for i in str(value).split(",") if i.strip()]


def item_names(value: Optional[str]) -> List[str]:
    """Lower-cased item names (before any ``=``)."""
    return [i.split("=", 1)[0].strip().lower() for i in items(value)]


def item_values(value: Optional[str]) -> Dict[str, str]:
    """``"socket=/x,cred_expire=10"`` -> {"socket": "/x", "cred_expire": "10"} (names lower-cased)."""
    out: Dict[str, str] = {}
    for it in items(value):
        name, _, val = it.partition("=")
        out[name.strip().lower()] = val.strip()
    return out


def merge_items(existing: Optional[str], additions: List[str]) -> str:
    """Merge comma-list items: an addition replaces an existing item of the same name, others are kept
    in order (``merge_items("socket=/x", ["cred_expire=10"])`` -> ``"socket=/x,cred_expire=10"``)."""
    result = items(existing)
    for add in additions:
        name = add.split("=", 1)[0].strip().lower()
        for i, old in enumerate(result):
            if old.split("=", 1)[0].strip().lower() == name:
                result[i] = add
                break
        else:
            result.append(add)
    return ",".join(result)
