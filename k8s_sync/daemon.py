"""The ``autoheal sync`` daemon: watch caches, leader election, a pass every resync period (or sooner
when a watched object changes), metrics server, clean shutdown on SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from typing import TYPE_CHECKING, Optional

from autoheal.k8s_sync.engine import Reconciler
from autoheal.k8s_sync.informer import Informer, slim_node, slim_pod
from autoheal.k8s_sync.leader import LeaderElector

if TYPE_CHECKING:
    from autoheal.config.sync_section import SyncSection
    from autoheal.journal import Journal
    from autoheal.k8s_sync.kube import KubeClient
    from autoheal.k8s_sync.metrics import Metrics
    from autoheal.notify import Notifier
    from autoheal.slurm.base import SlurmAdapter

log = logging.getLogger("autoheal.sync")


def identity() -> str:
    """This replica's Lease identity: the pod name (HOSTNAME in Kubernetes) plus the PID."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}"


class SyncDaemon:
    """Wires caches, elector, reconciler and metrics together; ``run()`` blocks until ``stop()``."""

    def __init__(self, slurm: SlurmAdapter, kube: KubeClient, cfg: SyncSection, *, dry_run: bool = False,
                 metrics: Optional[Metrics] = None, journal: Optional[Journal] = None,
                 ident: Optional[str] = None, use_watch: bool = True, notifier: Optional[Notifier] = None) -> None:
        self.cfg = cfg
        self.kube = kube
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.nodes_cache = self.pods_cache = None
        if use_watch:
            # the caches keep what the steps read of each object (``slim_node``, ``slim_pod``), page by page
            self.nodes_cache = Informer("nodes", lambda: kube.list_nodes(transform=slim_node), kube.watch_nodes,
                                        cfg.watch_timeout_seconds, on_change=self._wake.set, transform=slim_node)
            if cfg.mapping == "pod":
                self.pods_cache = Informer(
                    "pods", lambda: kube.list_pods(cfg.namespace, cfg.pod_selector, transform=slim_pod),
                    lambda rv, t: kube.watch_pods(cfg.namespace, cfg.pod_selector, rv, t),
                    cfg.watch_timeout_seconds, on_change=self._wake.set, transform=slim_pod)
        self.elector = None
        # A dry run never takes the Lease: it must not keep the real replicas from writing.
        if cfg.leader_election and not dry_run:
            self.elector = LeaderElector(kube, cfg.namespace, cfg.lease_name, ident or identity(),
                                         cfg.lease_duration_seconds, on_change=self._on_leader)
        self.metrics = metrics
        self.reconciler = Reconciler(slurm, kube, cfg, dry_run=dry_run, leader=self.elector,
                                     nodes_cache=self.nodes_cache, pods_cache=self.pods_cache,
                                     journal=journal, metrics=metrics, notifier=notifier)
        self.reconciler.slurm_max_age = max(0.0, cfg.slurm_resync_seconds - 0.05)
        self.passes = 0
        #: False simulates a crash in tests: the Lease is left to expire instead of being handed over.
        self.release_on_stop = True

    def _on_leader(self, leader: bool) -> None:
        log.info("leadership %s", "acquired" if leader else "lost",
                 extra={"identity": self.elector.identity if self.elector else ""})
        if self.metrics is not None:
            self.metrics.leader.set(1 if leader else 0)
        if leader:  # a new leader acts on a fresh Slurm read, not on one a follower's pass cached
            self.reconciler._slurm_cache = None
        self._wake.set()

    def start_background(self) -> None:
        for cache in (self.nodes_cache, self.pods_cache):
            if cache is not None:
                cache.start()
        if self.elector is not None:
            self.elector.start()

    def wait_synced(self, timeout: float) -> bool:
        """Wait (bounded) for the first list of every cache and the first lease round."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stop.is_set():
            caches = [c for c in (self.nodes_cache, self.pods_cache) if c is not None]
            lease_done = self.elector is None or self.elector.rounds > 0
            if all(c.synced for c in caches) and lease_done:
                return True
            self._stop.wait(0.05)
        return False

    def run(self, max_passes: Optional[int] = None) -> None:
        self.start_background()
        self.wait_synced(self.cfg.request_timeout_seconds)
        # Watch events wake the loop early, but never more often than every 0.2 s (event storms).
        min_gap = min(0.2, self.cfg.slurm_resync_seconds)
        while not self._stop.is_set():
            # cleared before the pass: a wake-up (watch event, leadership acquired) that arrives during
            # the pass or the gap is kept and starts the next pass at once, never waits a resync period
            self._wake.clear()
            res = self.reconciler.run_pass()
            self.passes += 1
            if max_passes is not None and self.passes >= max_passes:
                break
            self._stop.wait(min_gap)
            wait = 0.2 if res.deferred else self.cfg.slurm_resync_seconds
            self._wake.wait(wait)
        self.shutdown(release=self.release_on_stop)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def shutdown(self, release: bool = True) -> None:
        for cache in (self.nodes_cache, self.pods_cache):
            if cache is not None:
                cache.stop()
        if self.elector is not None:
            self.elector.stop(release=release)

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
