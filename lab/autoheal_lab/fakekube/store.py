"""Thread-safe object storage with one global resourceVersion, like etcd behind the API server.

Every write takes the next resourceVersion and appends an event to the history
of its resource; the history is a bounded window, so a watch that asks for a
resourceVersion older than the window gets ``TooOld`` (410 Gone on the wire),
as the real watch cache does. :meth:`VersionedStore.compact` drops all history
at once, like an etcd compaction.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from typing import Any, Deque, Dict, List, NamedTuple, Optional, Tuple

Obj = Dict[str, Any]
ObjKey = Tuple[str, str]  # (namespace, name); namespace is "" for cluster-scoped objects


class Event(NamedTuple):
    type: str  # ADDED, MODIFIED or DELETED
    rv: int
    obj: Obj  # the object after the change (for DELETED, the last state stamped with the deletion rv)
    prev: Optional[Obj]  # the object before the change (None for ADDED)


class TooOld(Exception):
    def __init__(self, requested: int, oldest: int):
        super().__init__(f"too old resource version: {requested} ({oldest})")
        self.requested = requested
        self.oldest = oldest


def meta(obj: Obj) -> Dict[str, Any]:
    return obj.setdefault("metadata", {})


def key_string(key: ObjKey) -> str:
    """The etcd-style key suffix (``ns/name`` or ``name``): lists are ordered by it."""
    return f"{key[0]}/{key[1]}" if key[0] else key[1]


def obj_key(obj: Obj) -> ObjKey:
    m = obj.get("metadata") or {}
    return (m.get("namespace") or "", m.get("name") or "")


class VersionedStore:
    def __init__(self, history_window: int = 1000, first_rv: int = 1):
        self.lock = threading.RLock()
        self._changed = threading.Condition(self.lock)
        self._rv = first_rv - 1
        self._objects: Dict[str, Dict[ObjKey, Obj]] = {}
        self._history: Dict[str, Deque[Event]] = {}
        self._expired: Dict[str, int] = {}
        self.history_window = history_window
        self.closed = False

    @property
    def current_rv(self) -> int:
        with self.lock:
            return self._rv

    def get(self, resource: str, namespace: str, name: str) -> Optional[Obj]:
        with self.lock:
            found = self._objects.get(resource, {}).get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def items(self, resource: str, namespace: Optional[str] = None) -> List[Obj]:
        """Copies of the objects in key order (namespace, name), as etcd returns them."""
        with self.lock:
            bucket = self._objects.get(resource, {})
            keys = sorted((k for k in bucket if namespace is None or k[0] == namespace), key=key_string)
            return [copy.deepcopy(bucket[k]) for k in keys]

    def expired_rv(self, resource: str) -> int:
        """Watches and continue tokens older than this resourceVersion get 410 Gone."""
        with self.lock:
            return self._expired.get(resource, 0)

    def resources(self) -> List[str]:
        with self.lock:
            return list(self._objects)

    def write(self, resource: str, obj: Obj) -> Obj:
        """Store ``obj`` under the next resourceVersion; ADDED or MODIFIED by whether it existed."""
        with self.lock:
            self._rv += 1
            stored = copy.deepcopy(obj)
            meta(stored)["resourceVersion"] = str(self._rv)
            bucket = self._objects.setdefault(resource, {})
            key = obj_key(stored)
            prev = bucket.get(key)
            bucket[key] = stored
            self._record(resource, Event("MODIFIED" if prev is not None else "ADDED", self._rv, stored, prev))
            return copy.deepcopy(stored)

    def remove(self, resource: str, namespace: str, name: str) -> Optional[Obj]:
        with self.lock:
            bucket = self._objects.get(resource, {})
            prev = bucket.pop((namespace, name), None)
            if prev is None:
                return None
            self._rv += 1
            last = copy.deepcopy(prev)
            meta(last)["resourceVersion"] = str(self._rv)
            self._record(resource, Event("DELETED", self._rv, last, prev))
            return copy.deepcopy(last)

    def _record(self, resource: str, event: Event) -> None:
        history = self._history.setdefault(resource, deque())
        history.append(event)
        while len(history) > self.history_window:
            self._expired[resource] = history.popleft().rv
        self._changed.notify_all()

    def events_after(self, resource: str, rv: int) -> List[Event]:
        """Events of ``resource`` with resourceVersion > ``rv``; TooOld if some were dropped."""
        with self.lock:
            expired = self._expired.get(resource, 0)
            if rv < expired:
                raise TooOld(rv, expired)
            history = self._history.get(resource, ())
            out: List[Event] = []
            for event in reversed(history):
                if event.rv <= rv:
                    break
                out.append(event)
            out.reverse()
            return out

    def wait(self, timeout: float) -> None:
        """Block (holding nothing) until some write happens, the store closes, or ``timeout``."""
        with self._changed:
            if not self.closed:
                self._changed.wait(timeout)

    def advance_to(self, rv: int) -> None:
        """Continue numbering after ``rv`` (a restored server never reuses resourceVersions)."""
        with self.lock:
            self._rv = max(self._rv, rv)

    def compact(self) -> int:
        """Forget all watch history (as etcd compaction does); returns the compacted revision."""
        with self.lock:
            for resource in set(self._history) | set(self._objects):
                self._history.pop(resource, None)
                self._expired[resource] = self._rv
            self._changed.notify_all()
            return self._rv

    def clear(self) -> None:
        """Delete every object (no events) and forget history; resourceVersions keep increasing."""
        with self.lock:
            self._objects.clear()
            self.compact()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self._changed.notify_all()

    def reopen(self) -> None:
        with self.lock:
            self.closed = False
