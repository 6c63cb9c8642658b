"""Lease leader election, the rate limiter and the watch cache's ordering rules (in memory, fake clocks)."""

from __future__ import annotations

from autoheal.k8s_sync.informer import Informer, newer_or_equal
from autoheal.k8s_sync.kube import Gone
from autoheal.k8s_sync.leader import LeaderElector
from autoheal.k8s_sync.memory import MemoryKube
from autoheal.k8s_sync.ratelimit import TokenBucket


class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def electors(kube, clock, duration=10.0):
    return [LeaderElector(kube, "slurm", "sync", ident, duration, wall=clock, mono=clock) for ident in ("a", "b")]


def test_one_leader_takeover_only_after_expiry_and_at_once_after_release():
    kube, clock = MemoryKube(), Clock()
    a, b = electors(kube, clock)
    assert a.try_acquire_or_renew() and a.is_leader()
    assert not b.try_acquire_or_renew() and not b.is_leader()
    clock.t += 9  # a stops renewing (crash); before expiry b must not take over
    assert not b.try_acquire_or_renew()
    assert not a.is_leader()  # a itself stops writing before the lease can expire (margin)
    clock.t += 2
    assert b.try_acquire_or_renew() and b.is_leader()
    assert kube.get_lease("slurm", "sync")["spec"]["leaseTransitions"] == 1
    assert not a.try_acquire_or_renew()  # a comes back: b holds a fresh lease
    b.release()
    assert a.try_acquire_or_renew()  # released: no need to wait for expiry


def test_racing_for_an_expired_lease_only_one_wins():
    kube, clock = MemoryKube(), Clock()
    a, b = electors(kube, clock)
    a.try_acquire_or_renew()
    clock.t += 20
    lease = kube.get_lease("slurm", "sync")
    orig_get = kube.get_lease
    kube.get_lease = lambda ns, n: lease  # both read the same expired version
    results = [b.try_acquire_or_renew(), LeaderElector(kube, "slurm", "sync", "c", 10, wall=clock,
                                                        mono=clock).try_acquire_or_renew()]
    kube.get_lease = orig_get
    assert results.count(True) == 1


def test_token_bucket_defers_beyond_burst_and_refills():
    clock = Clock(0.0)
    tb = TokenBucket(rate=2.0, burst=3, clock=clock)
    assert [tb.try_take() for _ in range(4)] == [True, True, True, False]
    clock.t += 1.0
    assert [tb.try_take() for _ in range(3)] == [True, True, False]


def test_cache_never_goes_back_to_an_older_version_and_relists_on_gone():
    assert newer_or_equal({"metadata": {"resourceVersion": "10"}}, {"metadata": {"resourceVersion": "9"}})
    assert not newer_or_equal({"metadata": {"resourceVersion": "8"}}, {"metadata": {"resourceVersion": "9"}})
    lists = []

    def lister():
        lists.append(1)
        return {"n": {"metadata": {"name": "n", "resourceVersion": str(10 * len(lists))}}}, str(10 * len(lists))

    calls = []

    def watcher(rv, timeout):
        calls.append(rv)
        if len(calls) == 1:
            raise Gone("too old", 410)
        inf._stop.set()
        yield "MODIFIED", {"metadata": {"name": "n", "resourceVersion": "5"}}  # older than the cache: ignored

    inf = Informer("nodes", lister, watcher)
    inf.run()
    assert len(lists) == 2 and calls == ["10", "20"]
    assert inf.snapshot()["n"]["metadata"]["resourceVersion"] == "20"
