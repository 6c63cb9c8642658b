"""List + watch caches of Nodes and slurmd pods (the client-go informer pattern, small).

``start()`` lists once (remembering the list's resourceVersion) and then watches from it in a thread;
each watch request ends after ``timeout`` seconds and is re-opened from the last resourceVersion seen
(BOOKMARK events move it forward); a 410 Gone means we fell too far behind: relist. Any other error
marks the cache unsynced (``synced`` False: the daemon skips passes, fail closed) and relists with backoff.
Objects the daemon itself wrote are put in with ``update()`` so the next pass sees its own write even
before the watch event arrives (no double writes); older events never overwrite newer objects.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from autoheal.k8s_sync.kube import Gone, KubeError

log = logging.getLogger("autoheal.sync")


Obj = Dict[str, Any]


def slim_node(obj: Obj) -> Obj:
    """What the sync's steps read of a Node: metadata, spec (cordon, taints) and status.conditions. A real
    Node's status also holds its images, addresses, capacity and node info (kilobytes per Node, 10,000
    Nodes in the cache). A step that reads more of a cached Node adds it here (the tests plan with slim
    and full objects alike)."""
    status = obj.get("status") or {}
    return {**{k: v for k, v in obj.items() if k != "status"},
            "status": {"conditions": status["conditions"]} if "conditions" in status else {}}


def slim_pod(obj: Obj) -> Obj:
    """What the sync's steps read of a slurmd pod: metadata, spec.nodeName and spec.hostname (the
    mapping), status.phase and status.conditions. Containers, volumes, tolerations and container
    statuses are three quarters of a real pod's memory (16 kB parsed, measured on kube-apiserver 1.37)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    out = {k: v for k, v in obj.items() if k not in ("spec", "status")}
    out["spec"] = {k: spec[k] for k in ("nodeName", "hostname") if k in spec}
    out["status"] = {k: status[k] for k in ("phase", "conditions") if k in status}
    return out


def _rv(obj: Dict[str, Any]) -> Optional[int]:
    text = (obj.get("metadata") or {}).get("resourceVersion") or ""
    return int(text) if text.isdigit() else None


def newer_or_equal(new: Dict[str, Any], old: Optional[Dict[str, Any]]) -> bool:
    """resourceVersions are opaque strings; compare them as numbers only when both are numbers."""
    if old is None:
        return True
    a, b = _rv(new), _rv(old)
    return a is None or b is None or a >= b


class Informer:
    """A cache of one kind of object, kept current by list + watch."""

    def __init__(self, kind: str, lister: Callable[[], Tuple[Dict[str, Dict[str, Any]], str]],
                 watcher: Callable[[str, int], Iterator[Tuple[str, Dict[str, Any]]]],
                 timeout: int = 300, on_change: Optional[Callable[[], None]] = None,
                 transform: Optional[Callable[[Obj], Obj]] = None):
        """``transform``: what of each object the cache keeps (``slim_node``, ``slim_pod``); applied to
        watch events and our own writes' answers (the lister applies it to each page of its list)."""
        self.kind = kind
        self.transform = transform
        self.lister, self.watcher = lister, watcher
        self.timeout = timeout
        self.on_change = on_change
        self.items: Dict[str, Dict[str, Any]] = {}
        self.rv = ""
        self.synced = False
        self.relists = 0
        self.errors = 0
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def snapshot(self) -> Dict[str, Dict[str, Any]]:
        with self.lock:
            return dict(self.items)  # objects are replaced, never mutated in place: a shallow copy is safe

    def update(self, obj: Dict[str, Any]) -> Dict[str, Any]:
        """Put in an object our own write returned; returns it as the cache keeps it."""
        if self.transform is not None:
            obj = self.transform(obj)
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return obj
        with self.lock:
            if newer_or_equal(obj, self.items.get(name)):
                self.items[name] = obj
        return obj

    def relist(self) -> None:
        items, rv = self.lister()
        with self.lock:
            self.items, self.rv, self.synced = items, rv, True
        self.relists += 1
        if self.on_change:
            self.on_change()

    def _apply(self, etype: str, obj: Dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion"):
            self.rv = meta["resourceVersion"]
        if etype == "BOOKMARK":
            return
        name = meta.get("name", "")
        if self.transform is not None and etype != "DELETED":
            obj = self.transform(obj)
        with self.lock:
            if etype == "DELETED":
                self.items.pop(name, None)
            elif newer_or_equal(obj, self.items.get(name)):
                self.items[name] = obj
        if self.on_change:
            self.on_change()

    def run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                if not self.synced:
                    self.relist()
                for etype, obj in self.watcher(self.rv, self.timeout):
                    self._apply(etype, obj)
                    if self._stop.is_set():
                        return
                backoff = 0.2
            except Gone:
                log.info("watch %s: resourceVersion %s too old (410); relisting", self.kind, self.rv)
                self.synced = False
            except KubeError as exc:
                self.errors += 1
                self.synced = False
                log.warning("watch %s failed: %s; relisting in %.1fs", self.kind, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(10.0, backoff * 2)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"watch-{self.kind}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        # The watch thread may sit in a long read: it is a daemon thread and exits at its next event
        # or watch timeout; nothing it does after stop() is acted upon.
        self._stop.set()
