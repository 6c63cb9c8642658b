"""The fake API server process: lifecycle, kubeconfig, the pieces tests reach for.

``FakeKubeServer`` runs a ``ThreadingHTTPServer`` on 127.0.0.1 in a background
thread. ``store`` is the :class:`~autoheal_lab.fakekube.registry.Registry`
(seed and inspect objects from Python), ``faults`` the
:class:`~autoheal_lab.fakekube.faults.FaultInjector`.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import deque
from http.server import ThreadingHTTPServer
from typing import Any, Callable, Deque, Dict, Iterable, Optional

from .faults import FaultInjector
from .handler import ApiHandler
from .registry import Registry
from .resources import NODE_REPLACEMENT, ResourceType, ResourceTypes, builtin_types
from .store import VersionedStore

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class FakeKubeServer:
    """A faithful-enough kube-apiserver for tests and the local lab (stdlib only)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 custom_resources: Iterable[ResourceType] = (NODE_REPLACEMENT,), history_window: int = 1000,
                 bookmark_interval: float = 60.0, max_watch_seconds: float = 1800.0,
                 pod_deletion_delay: float = 0.0, aggregated_discovery: bool = True,
                 token: str = "fake-token", require_token: bool = False,
                 clock: Callable[[], float] = time.time, request_log_size: int = 2000):
        if host not in LOOPBACK:
            raise ValueError(f"the fake API server only listens on loopback, not {host!r}")
        self.host = "127.0.0.1" if host == "localhost" else host
        self.port = port
        self.types = ResourceTypes(builtin_types() + tuple(custom_resources))
        self.store = Registry(self.types, VersionedStore(history_window), clock, pod_deletion_delay)
        self.store.seed_namespaces()
        self.faults = FaultInjector()
        self.bookmark_interval = bookmark_interval
        self.max_watch_seconds = max_watch_seconds
        self.aggregated_discovery = aggregated_discovery
        self.token = token
        self.require_token = require_token
        self.clock = clock
        self.requests: Deque[Dict[str, Any]] = deque(maxlen=request_log_size)
        self._httpd: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self._connections: set = set()
        self._conn_lock = threading.Lock()
        self.stopping = threading.Event()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeKubeServer:
        if self._httpd is not None:
            return self
        handler = type("BoundHandler", (ApiHandler,), {"app": self})
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        server_cls = type("Server", (ThreadingHTTPServer,), {"address_family": family,
                                                             "daemon_threads": True,
                                                             "allow_reuse_address": True})
        self.stopping.clear()
        self.store.store.reopen()
        self._httpd = server_cls((self.host, self.port), handler)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"fakekube-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """End watches, stop accepting, close open connections and wait for the serving thread."""
        if self._httpd is None:
            return
        self.stopping.set()
        self.store.store.close()
        self.store.cancel_timers()
        self._httpd.shutdown()
        with self._conn_lock:
            conns = list(self._connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> FakeKubeServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def write_kubeconfig(self, path: str, namespace: str = "default", context: str = "fakekube") -> str:
        """Write a kubeconfig (JSON, which is valid YAML) usable by kubectl and the python client."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": context, "user": {"token": self.token}}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context,
                                                        "namespace": namespace}}],
            "current-context": context,
            "preferences": {},
        }
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(config, fh, indent=2)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        return path

    def reset(self) -> None:
        """Forget faults and objects; recreate the default namespaces."""
        self.faults.clear()
        self.store.reset()

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._conn_lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)
