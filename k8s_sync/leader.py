"""Leader election with a coordination.k8s.io/v1 Lease (the client-go algorithm, hand-written).

A candidate takes the Lease when it is free or its holder has not renewed for ``leaseDurationSeconds``;
the holder renews every ``duration / 3`` (every ``POLL`` after a failed renewal). Every update is
a PUT carrying the resourceVersion it read, so two candidates racing for an expired lease cannot both win
(the loser gets 409). The holder stops acting as leader as soon as it has failed to renew for
``duration - margin`` by its own monotonic clock, before any other replica may take over: at most one
replica writes at any time.

Failover bound: a follower polls every ``POLL`` (``min(duration / 5, 1 s)``: a released lease is taken
within a second) and wakes right when the lease it saw expires
(``renewTime + duration``), so after the holder's last renewal it takes over within ``duration`` plus
one poll's round trips (plus any clock difference between the two hosts, since ``renewTime`` is the
holder's clock), then runs its first pass at once. Measured by bench/bench_failover.py.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any, Callable, Dict, Optional

from autoheal.k8s_sync.kube import KubeClient, KubeError

#: Longest poll period of a follower (and of a holder whose renewal failed), in seconds.
MAX_POLL = 1.0


def _fmt(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: Optional[str]) -> Optional[float]:
    if not text:
        return None
    try:
        text = text.replace("Z", "+00:00")
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def lease_expired(lease: Dict[str, Any], now: float) -> bool:
    """True when the Lease's holder has not renewed within its duration (or it has no holder)."""
    spec = lease.get("spec") or {}
    if not spec.get("holderIdentity"):
        return True
    renew = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    return renew is None or now > renew + duration


class LeaderElector:
    """Acquire and renew a Lease for ``identity``; ``is_leader()`` is safe to call before each write."""

    def __init__(self, kube: KubeClient, namespace: str, name: str, identity: str, duration: float = 15.0,
                 wall: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic,
                 on_change: Optional[Callable[[bool], None]] = None):
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.duration = float(duration)
        self.wall, self.mono = wall, mono
        self.on_change = on_change
        self._renewed_at: Optional[float] = None  # monotonic time of our last successful renewal
        self._leader = False
        self.holder = ""
        self.transitions = 0
        self.last_error = ""
        self.rounds = 0
        #: wall-clock time at which the lease we last saw held by another replica expires
        self._expires_at: Optional[float] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def margin(self) -> float:
        return min(2.0, self.duration / 5)

    def is_leader(self) -> bool:
        if not self._leader or self._renewed_at is None:
            return False
        return self.mono() - self._renewed_at < self.duration - self.margin

    def _set(self, leader: bool) -> None:
        if leader != self._leader:
            self._leader = leader
            if self.on_change:
                self.on_change(leader)

    def try_acquire_or_renew(self) -> bool:
        """One round of the algorithm; True when we hold the lease afterwards."""
        started = self.mono()
        now = self.wall()
        try:
            return self._round(started, now)
        finally:
            # counted once the round is over: the daemon's first pass waits for it (rounds > 0), and
            # a pass that ran while the first round was still in flight ran as a follower, writing nothing
            self.rounds += 1

    def _round(self, started: float, now: float) -> bool:
        try:
            lease = self.kube.get_lease(self.namespace, self.name)
            spec = {"holderIdentity": self.identity, "leaseDurationSeconds": round(self.duration),
                    "renewTime": _fmt(now)}
            if lease is None:
                spec.update(acquireTime=_fmt(now), leaseTransitions=0)
                self.kube.create_lease(self.namespace, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                                        "metadata": {"name": self.name,
                                                                     "namespace": self.namespace},
                                                        "spec": spec})
            else:
                cur = lease.get("spec") or {}
                self.holder = cur.get("holderIdentity") or ""
                if self.holder != self.identity and not lease_expired(lease, now):
                    renew = _parse(cur.get("renewTime")) or _parse(cur.get("acquireTime"))
                    self._expires_at = renew + float(cur.get("leaseDurationSeconds") or 0) if renew else None
                    self._set(False)
                    return False
                if self.holder == self.identity:
                    spec["acquireTime"] = cur.get("acquireTime") or _fmt(now)
                    spec["leaseTransitions"] = int(cur.get("leaseTransitions") or 0)
                else:
                    spec["acquireTime"] = _fmt(now)
                    spec["leaseTransitions"] = int(cur.get("leaseTransitions") or 0) + 1
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace,
                                     "resourceVersion": (lease.get("metadata") or {}).get("resourceVersion")},
                        "spec": spec}
                self.kube.replace_lease(self.namespace, self.name, body)
        except KubeError as exc:  # 409 (someone else won), 5xx, timeouts: not leader this round
            self.last_error = str(exc)
            if not self.is_leader():
                self._set(False)
            return self.is_leader()
        if not self._leader:
            self.transitions += 1
        self.holder = self.identity
        # Count the lease from when we *started* the request: the server's view can only be newer.
        self._renewed_at = started
        self._expires_at = None
        self.last_error = ""
        self._set(True)
        return True

    def release(self) -> None:
        """Give the lease up on clean shutdown so the other replica takes over at once."""
        if not self._leader:
            return
        self._set(False)
        try:
            lease = self.kube.get_lease(self.namespace, self.name)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                lease["spec"]["leaseDurationSeconds"] = 1
                self.kube.replace_lease(self.namespace, self.name, lease)
        except KubeError:
            pass

    def next_wait(self) -> float:
        """Seconds until the next round: renew every duration/3 while renewals succeed; otherwise poll
        every min(duration/5, MAX_POLL), and wake right when the lease we saw held by another expires
        (failover within the lease duration instead of the lease duration plus a poll period)."""
        if self._leader and not self.last_error:
            return self.duration / 3
        wait = min(self.duration / 5, MAX_POLL)
        if self._expires_at is not None:
            wait = min(wait, max(0.05, self._expires_at - self.wall() + 0.05))
        return wait

    def run(self, retry_period: Optional[float] = None) -> None:
        """Renew/acquire in a loop until ``stop()`` (see ``next_wait``)."""
        while not self._stop.is_set():
            self.try_acquire_or_renew()
            self._stop.wait(retry_period or self.next_wait())

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="lease", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if release:
            self.release()
        else:
            self._set(False)
