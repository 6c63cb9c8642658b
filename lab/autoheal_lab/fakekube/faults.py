"""Fault injection: make chosen requests fail, stall or drop, from Python or over HTTP.

A rule matches on method and a regular expression searched in the request
path (``re.search``; anchor it with ``^``/``$`` when needed), optionally only
watch or only non-watch requests. A matching request first waits
``latency_ms``, then either gets an error ``Status`` with ``status`` (and the
reason the real server pairs with that code), has its connection dropped
(``disconnect``), or is served normally (latency only). ``skip`` lets the first
N matches through; ``times`` limits how many requests the rule hits (None:
every one). Rules are checked in the order they were added.
"""

from __future__ import annotations

import re
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from . import errors


@dataclass
class Fault:
    method: str = "*"
    path_regex: str = ".*"
    status: Optional[int] = None
    times: Optional[int] = None
    latency_ms: int = 0
    reason: Optional[str] = None
    message: Optional[str] = None
    retry_after: Optional[int] = None
    disconnect: bool = False
    watch: Optional[bool] = None
    skip: int = 0
    id: int = 0
    hits: int = 0
    _pattern: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.method = (self.method or "*").upper()
        self._pattern = re.compile(self.path_regex)
        if self.status is not None and not 100 <= int(self.status) <= 599:
            raise ValueError(f"status must be an HTTP code, got {self.status!r}")

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.hits >= self.times

    def to_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out.pop("_pattern", None)
        return out


FIELDS = {"method", "path_regex", "status", "times", "latency_ms", "reason", "message", "retry_after",
          "disconnect", "watch", "skip"}


class FaultInjector:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: List[Fault] = []
        self._next_id = 1

    def add(self, method: str = "*", path_regex: str = ".*", status: Optional[int] = None,
            times: Optional[int] = None, latency_ms: int = 0, **extra: Any) -> Fault:
        unknown = set(extra) - FIELDS
        if unknown:
            raise ValueError(f"unknown fault fields: {sorted(unknown)}")
        rule = Fault(method=method, path_regex=path_regex, status=status, times=times, latency_ms=latency_ms,
                     **extra)
        with self._lock:
            rule.id = self._next_id
            self._next_id += 1
            self._rules.append(rule)
        return rule

    def add_dict(self, spec: Dict[str, Any]) -> Fault:
        if not isinstance(spec, dict):
            raise ValueError("a fault is a JSON object")
        return self.add(**spec)

    def remove(self, fault_id: int) -> bool:
        with self._lock:
            before = len(self._rules)
            self._rules = [r for r in self._rules if r.id != fault_id]
            return len(self._rules) != before

    def clear(self) -> None:
        with self._lock:
            self._rules = []

    def rules(self) -> List[Fault]:
        with self._lock:
            return list(self._rules)

    def match(self, method: str, path: str, is_watch: bool = False) -> Optional[Fault]:
        """The first live rule for this request, counting the hit; None when nothing applies."""
        with self._lock:
            for rule in self._rules:
                if rule.exhausted:
                    continue
                if rule.method not in ("*", method.upper()):
                    continue
                if rule.watch is not None and rule.watch != is_watch:
                    continue
                if not rule._pattern.search(path):
                    continue
                if rule.skip > 0:
                    rule.skip -= 1
                    continue
                rule.hits += 1
                return rule
        return None


def _object_of(path: str) -> Tuple[str, str]:
    """(qualified resource, name) addressed by an API path, '' when not an object path."""
    segs = path.strip("/").split("/")
    if segs[:1] == ["api"]:
        group, rest = "", segs[2:]
    elif segs[:1] == ["apis"] and len(segs) > 2:
        group, rest = segs[1], segs[3:]
    else:
        return "", ""
    if rest[:1] == ["watch"]:
        rest = rest[1:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    resource = rest[0] if rest else ""
    if resource and group:
        resource = f"{resource}.{group}"
    return resource, rest[1] if len(rest) > 1 else ""


def fault_message(code: int, path: str) -> str:
    """A message shaped like the real one for this code, naming the object in ``path``."""
    resource, name = _object_of(path)
    resource = resource or "resource"
    if code == 409:
        return f'Operation cannot be fulfilled on {resource} "{name}": {errors.CONFLICT_MODIFIED}'
    if code == 404:
        return f'{resource} "{name}" not found'
    if code == 429:
        return "Too many requests, please try again later."
    if code == 500:
        return "Internal error occurred: injected fault"
    if code == 503:
        return "the server is currently unable to handle the request"
    if code == 504:
        return ("the server was unable to return a response in the time allotted, but may still be processing "
                "the request")
    return f"injected fault: HTTP {code}"
