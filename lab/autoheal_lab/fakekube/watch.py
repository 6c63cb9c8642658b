"""Watch streams over the store history, with the filtering rules of the real watch cache.

An object that starts matching the selectors arrives as ADDED, one that stops
matching as DELETED (carrying its previous content and the new resourceVersion).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Optional

from .store import Event, Obj, TooOld, VersionedStore

WatchEvent = Dict[str, Any]  # {"type": ..., "object": ...}
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class Watcher:
    """One watch: ``start()`` gives the first events, ``next(timeout)`` the following ones.

    ``matches`` decides whether an object belongs to the watch (namespace,
    label and field selectors); ``decorate`` puts kind/apiVersion on objects.
    """

    def __init__(self, store: VersionedStore, resource: str, matches: Callable[[Obj], bool],
                 decorate: Callable[[Obj], Obj], bookmark_kind: Dict[str, str], typed: bool = True):
        self.store = store
        self.resource = resource
        self.matches = matches
        self.decorate = decorate
        self.bookmark_kind = bookmark_kind
        self.typed = typed  # built-in types serialize an empty creationTimestamp as null
        self.pos = 0
        self.ended = False

    def start(self, resource_version: Optional[str], send_initial_events: bool = False,
              allow_bookmarks: bool = False) -> List[WatchEvent]:
        """Initial events. Raises TooOld when ``resource_version`` is out of the history window."""
        with self.store.lock:
            if resource_version in (None, "", "0") or send_initial_events:
                self.pos = self.store.current_rv
                out = [{"type": "ADDED", "object": self.decorate(o)}
                       for o in self.store.items(self.resource) if self.matches(o)]
                if send_initial_events and allow_bookmarks:
                    out.append(self.bookmark({INITIAL_EVENTS_END: "true"}))
                return out
            self.pos = int(resource_version)
            return self._convert(self.store.events_after(self.resource, self.pos))

    def next(self, timeout: float) -> Optional[List[WatchEvent]]:
        """Events after the last delivered one, waiting up to ``timeout``; None when the stream must end.

        A watcher that fell behind the history window ends without an error, as
        the real server terminates slow watchers; the client then re-watches.
        """
        if self.store.closed:
            return None
        try:
            events = self.store.events_after(self.resource, self.pos)
            if not events:
                self.store.wait(timeout)
                if self.store.closed:
                    return None
                events = self.store.events_after(self.resource, self.pos)
        except TooOld:
            self.ended = True
            return None
        return self._convert(events)

    def bookmark(self, annotations: Optional[Dict[str, str]] = None) -> WatchEvent:
        with self.store.lock:
            # every event of this resource up to the current revision has been delivered
            if not self.store.events_after(self.resource, self.pos):
                self.pos = max(self.pos, self.store.current_rv)
        md: Dict[str, Any] = {"resourceVersion": str(self.pos)}
        obj: Dict[str, Any] = dict(self.bookmark_kind)
        if self.typed:
            md["creationTimestamp"] = None
        if annotations:
            md["annotations"] = dict(annotations)
        obj["metadata"] = md
        return {"type": "BOOKMARK", "object": obj}

    def _convert(self, events: List[Event]) -> List[WatchEvent]:
        out: List[WatchEvent] = []
        for ev in events:
            self.pos = ev.rv
            converted = convert_event(ev, self.matches)
            if converted is not None:
                kind, obj = converted
                out.append({"type": kind, "object": self.decorate(obj)})
        return out


def convert_event(ev: Event, matches: Callable[[Obj], bool]):
    """The event a filtered watcher sees, or None; see the module docstring."""
    cur = matches(ev.obj)
    if ev.type == "ADDED":
        return ("ADDED", ev.obj) if cur else None
    if ev.type == "DELETED":
        return ("DELETED", ev.obj) if cur else None
    old = ev.prev is not None and matches(ev.prev)
    if cur and old:
        return ("MODIFIED", ev.obj)
    if cur:
        return ("ADDED", ev.obj)
    if old:
        gone = copy.deepcopy(ev.prev)
        gone.setdefault("metadata", {})["resourceVersion"] = str(ev.rv)
        return ("DELETED", gone)
    return None
