"""Prometheus metrics and the /metrics, /healthz, /readyz HTTP server of ``autoheal sync``.

/healthz: the process is alive and its loop ran recently. /readyz: Slurm and Kubernetes were read
successfully in the last few resync periods (a follower is ready too: it keeps warm caches).
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Optional

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

    def observe_remediation(self, res: PassResult) -> None:
        """After a pass that read both sides with the remediate step enabled."""
        if res.read_error:
            return
        from autoheal.k8s_sync.remediation import STATES

        counts = dict.fromkeys(STATES, 0)
        for r in res.remediations.values():
            counts[r["state"]] = counts.get(r["state"], 0) + 1
        for st, n in counts.items():
            self.remediations.labels(st).set(n)
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


class HealthServer:
    """Serves /metrics, /healthz and /readyz on ``address:port`` (port 0: pick one) in a thread."""

    def __init__(self, metrics: Metrics, address: str, port: int, resync: float):
        self.metrics = metrics
        self.resync = resync
        outer = self

        class Handler(BaseHTTPRequestHandler):
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

        self.httpd = ThreadingHTTPServer((address, port), Handler)
        self.httpd.daemon_threads = True
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
