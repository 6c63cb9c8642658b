"""Prometheus metrics and the /metrics, /healthz, /readyz HTTP server of ``autoheal sync``.

/healthz: the process is alive and its loop ran recently. /readyz: Slurm and Kubernetes were read
successfully in the last few resync periods (a follower is ready too: it keeps warm caches).
"""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

if TYPE_CHECKING:
    from autoheal.k8s_sync.engine import PassResult, Reconciler


class Metrics:
    """The daemon's metrics in their own registry (several daemons can live in one test process)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.passes = Counter("autoheal_sync_passes_total", "Reconcile passes", ["result"], registry=r)
        self.pass_seconds = Histogram("autoheal_sync_pass_seconds", "Duration of a reconcile pass",
                                      buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10), registry=r)
        self.writes = Counter("autoheal_sync_writes_total", "Writes to Slurm and Kubernetes", ["kind"], registry=r)
        self.deferred = Counter("autoheal_sync_deferred_writes_total", "Writes deferred by rate limits or "
                                "backoff", registry=r)
        self.conflicts = Counter("autoheal_sync_conflicts_total", "409 Conflicts (retried next pass)", registry=r)
        self.errors = Counter("autoheal_sync_errors_total", "Failed writes and steps", registry=r)
        self.leader = Gauge("autoheal_sync_leader", "1 while this replica holds the Lease", registry=r)
        self.nodes = Gauge("autoheal_sync_slurm_nodes", "Slurm nodes seen in the last pass", registry=r)
        self.mapped = Gauge("autoheal_sync_mapped_nodes", "Slurm nodes bound to a Kubernetes Node/pod",
                            registry=r)
        self.problems = Gauge("autoheal_sync_problems", "Mapping and safety problems in the last pass",
                              registry=r)
        self.last_success = Gauge("autoheal_sync_last_success_timestamp_seconds", "End of the last pass "
                                  "that read both sides", registry=r)
        # remediation (step "remediate"): nodes per state, nodes vetoed by the opt-out label, the breaker
        self.remediations = Gauge("autoheal_sync_remediations", "Nodes per remediation state", ["state"],
                                  registry=r)
        self.opted_out = Gauge("autoheal_sync_remediation_opted_out", "Nodes that need a replacement but "
                               "carry the opt-out label (Node or pod): replace them by hand", registry=r)
        self.breaker_tripped = Gauge("autoheal_sync_breaker_tripped", "1 while the remediation circuit "
                                     "breaker is tripped", registry=r)
        # what the on-call's alerts and dashboard read (k8s_sync/deploy/chart/autoheal-sync/files/):
        # every label set is bounded (a fixed list of buckets or states), never a node or job name
        self.fleet = Gauge("autoheal_sync_fleet_nodes", "Slurm nodes per bucket of autoheal.fleet (in-service, "
                           "drained-autoheal, drained-other, retired, spare)", ["state"], registry=r)
        self.remediation_oldest = Gauge("autoheal_sync_remediation_oldest_seconds", "Seconds the node longest "
                                        "in each remediation state has been in it (0: none)", ["state"],
                                        registry=r)
        self.remediation_bound = Gauge("autoheal_sync_remediation_bound_seconds", "How long a node may stay in "
                                       "each remediation state before the sync acts on its own (the configured "
                                       "timeout); the stuck-remediation alert compares the oldest with it",
                                       ["state"], registry=r)
        self.last_ok = 0.0
        self.last_loop = time.monotonic()

    def observe_pass(self, res: PassResult, reconciler: Reconciler) -> None:
        self.last_loop = time.monotonic()
        self.passes.labels("ok" if res.ok else ("read-error" if res.read_error else "error")).inc()
        self.pass_seconds.observe(res.seconds)
        for a in res.applied:
            self.writes.labels(a.kind).inc()
        if res.deferred:
            self.deferred.inc(res.deferred)
        if res.conflicts:
            self.conflicts.inc(res.conflicts)
        if res.errors:
            self.errors.inc(len(res.errors))
        self.leader.set(1 if res.leader else 0)
        self.problems.set(len(res.problems))
        if not res.read_error:
            self.nodes.set(res.nodes)
            self.mapped.set(res.mapped)
            self.last_success.set(time.time())
            self.last_ok = time.monotonic()
            self._observe_fleet(reconciler)

    def _observe_fleet(self, reconciler: Reconciler) -> None:
        """Nodes per bucket from the Slurm nodes the pass just read (the reconciler's cache)."""
        from autoheal import fleet

        cache = getattr(reconciler, "_slurm_cache", None)
        if not cache:
            return
        cfg = getattr(reconciler, "cfg", None)
        prefix = getattr(cfg, "spare_reason_prefix", "autoheal: spare:")
        for state, n in fleet.counts(cache[1].values(), prefix).items():
            self.fleet.labels(state).set(n)
        if cfg is not None and "remediate" in getattr(cfg, "enabled_steps", ()):
            for state, bound in remediation_bounds(cfg).items():
                self.remediation_bound.labels(state).set(bound)

    def observe_remediation(self, res: PassResult) -> None:
        """After a pass that read both sides with the remediate step enabled."""
        if res.read_error:
            return
        from autoheal.k8s_sync.remediation import STATES

        counts = dict.fromkeys(STATES, 0)
        oldest = dict.fromkeys(STATES, 0.0)
        now = time.time()
        for r in res.remediations.values():
            st = r["state"]
            if st not in counts:  # a state this release does not know: keep the label set bounded
                continue
            counts[st] += 1
            since = float(r.get("since") or 0)
            if since > 0:
                oldest[st] = max(oldest[st], now - since)
        for st, n in counts.items():
            self.remediations.labels(st).set(n)
            self.remediation_oldest.labels(st).set(round(oldest[st], 1))
        self.opted_out.set(len(res.opted_out))
        self.breaker_tripped.set(1 if (res.breaker or {}).get("tripped") else 0)

    def observe_waiting(self, res: PassResult, now: float) -> None:
        """Remediations wanted but held back by a breaker limit (state ``waiting``): how many per limit,
        and how long the oldest has waited (an alert on it catches a queue that does not move)."""
        if res.read_error:
            return
        if not hasattr(self, "waiting"):  # created on first use: one place for everything waiting adds
            from prometheus_client import Gauge

            self.waiting = Gauge("autoheal_sync_remediation_waiting", "Nodes that need a replacement and wait "
                                 "for a circuit-breaker limit (start share, concurrency, trip)", ["limit"],
                                 registry=self.registry)
            self.waiting_oldest = Gauge("autoheal_sync_remediation_waiting_oldest_seconds", "How long the "
                                        "longest-waiting remediation has waited (0: none waits)",
                                        registry=self.registry)
        from autoheal.k8s_sync.remediation import Limit

        rows = [r for r in res.remediations.values() if r.get("state") == "waiting"]
        for limit in Limit:
            self.waiting.labels(str(limit)).set(sum(1 for r in rows if r.get("limit") == str(limit)))
        self.waiting_oldest.set(max((now - float(r.get("since") or now) for r in rows), default=0.0))

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def remediation_bounds(cfg: Any) -> Dict[str, float]:
    """State -> seconds the remediation state machine lets a node stay in it before it moves on by itself
    (``remediation.next_step``: fails it, or retries a failed one). A node older than its bound means the
    machine is not moving (no leader, every pass failing, a bug): the alert's business. ``done`` has none."""
    drain = float(cfg.remediation_drain_timeout_seconds)
    # waiting on a breaker limit: a start-share wait ends within one window (the soak's bound too); longer
    # means the queue is not moving
    return {"waiting": float(cfg.breaker_window_seconds),
            "quarantined": float(cfg.remediation_grace_seconds), "draining": drain, "drained": drain,
            "replacing": float(cfg.remediation_replace_timeout_seconds),
            "failed": float(cfg.remediation_retry_seconds)}



#: Connections served at once; more are closed as they arrive (a client cannot pile up threads).
MAX_CONNECTIONS = 32


class _BoundedServer(ThreadingHTTPServer):
    """One thread per connection, at most ``MAX_CONNECTIONS`` of them."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 2 * MAX_CONNECTIONS  # listen backlog (socketserver's default is 5)

    def __init__(self, addr: Tuple[str, int], handler: Any) -> None:
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(addr, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class HealthServer:
    """Serves /metrics, /healthz and /readyz on ``address:port`` (port 0: pick one) in a thread.

    Reads are bounded: a client has ``read_timeout`` seconds in all to send its request line and headers
    (a per-read socket timeout alone lets a client trickle a byte a second for ever), and at most
    ``MAX_CONNECTIONS`` connections are served at once. HTTP/1.0: one request per connection."""

    def __init__(self, metrics: Metrics, address: str, port: int, resync: float, read_timeout: float = 5.0):
        self.metrics = metrics
        self.resync = resync
        outer = self

        class Handler(BaseHTTPRequestHandler):
            timeout = read_timeout  # each read, and (below) the whole request

            def setup(self) -> None:
                super().setup()
                self._cutoff = threading.Timer(read_timeout, self._cut)
                self._cutoff.daemon = True
                self._cutoff.start()

            def _cut(self) -> None:
                try:  # wakes the handler's blocked read: it sees EOF and the connection is closed
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            def parse_request(self) -> bool:
                ok = super().parse_request()
                self._cutoff.cancel()  # the request is in: writing the answer is not bounded by it
                return ok

            def finish(self) -> None:
                self._cutoff.cancel()
                super().finish()

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/metrics":
                    body, code, ctype = outer.metrics.render(), 200, "text/plain; version=0.0.4"
                elif path == "/healthz":
                    ok = time.monotonic() - outer.metrics.last_loop < max(60.0, 10 * outer.resync)
                    body, code, ctype = (b"ok\n" if ok else b"loop stalled\n"), (200 if ok else 503), "text/plain"
                elif path == "/readyz":
                    ok = bool(outer.metrics.last_ok) and time.monotonic() - outer.metrics.last_ok < max(
                        30.0, 5 * outer.resync)
                    body, code, ctype = (b"ok\n" if ok else b"not ready: no successful read yet/lately\n"), \
                        (200 if ok else 503), "text/plain"
                else:
                    body, code, ctype = b"not found\n", 404, "text/plain"
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # access logs would drown the structured log
                pass

        self.httpd = _BoundedServer((address, port), Handler)
        self.port = self.httpd.server_address[1]
        self.thread: Optional[threading.Thread] = None

    def start(self) -> HealthServer:
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                       name="metrics", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
