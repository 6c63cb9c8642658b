"""Lease leader election, the rate limiter and the watch cache's ordering rules (in memory, fake clocks)."""

from __future__ import annotations

from autoheal.k8s_sync.informer import Informer, newer_or_equal
from autoheal.k8s_sync.kube import Gone
from autoheal.k8s_sync.leader import LeaderElector
from autoheal.k8s_sync.ratelimit import TokenBucket
from autoheal_lab.testing.kube import MemoryKube


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


def test_follower_wakes_when_the_lease_it_saw_expires():
    kube, clock = MemoryKube(), Clock()
    a, b = electors(kube, clock)
    a.try_acquire_or_renew()
    assert a.next_wait() == 10 / 3
    clock.t += 9.5  # a renewed at t0; it expires at t0 + 10
    assert not b.try_acquire_or_renew()
    assert abs(b.next_wait() - 0.55) < 1e-6  # not the 1 s poll period: right after the expiry
    clock.t += 0.55
    assert b.try_acquire_or_renew()  # failover = the lease duration after a's last renewal
    clock.t += 0.1
    assert not a.try_acquire_or_renew() and a.next_wait() <= 1.0


def test_a_replica_that_cannot_renew_stops_leading_before_another_can_take_over():
    from autoheal.k8s_sync.kube import KubeError

    kube, clock = MemoryKube(), Clock()
    changes = []
    a = LeaderElector(kube, "slurm", "sync", "a", 10.0, wall=clock, mono=clock, on_change=changes.append)
    b = LeaderElector(kube, "slurm", "sync", "b", 10.0, wall=clock, mono=clock)
    assert a.try_acquire_or_renew() and changes == [True]

    def unreachable(*args, **kwargs):
        raise KubeError("replace_lease: timed out", 0)

    kube.replace_lease = unreachable  # a is cut off from the API server
    clock.t += 3.4
    assert a.try_acquire_or_renew() and a.is_leader()  # still within its lease
    assert a.next_wait() == 1.0  # a failed renewal is retried sooner
    clock.t += 4.7  # 8.1 s after the last renewal: past duration - margin (8 s)
    assert not a.is_leader()  # every write checks this: a writes nothing from here on
    assert not a.try_acquire_or_renew() and changes == [True, False]
    assert not b.try_acquire_or_renew()  # the lease has not expired for anyone else yet
    del kube.replace_lease
    clock.t += 2.0
    assert b.try_acquire_or_renew() and b.is_leader() and not a.is_leader()


def test_a_wake_up_during_a_pass_is_not_lost():
    """Leadership acquired (or a watch event) while a pass runs starts the next pass at once, not one
    resync period later (it used to be cleared after the pass)."""
    import threading

    from helpers import wait_for
    from sync_helpers import sync_cfg

    from autoheal.k8s_sync.daemon import SyncDaemon
    from autoheal_lab.testing.slurm import MemorySlurm

    d = SyncDaemon(MemorySlurm(), MemoryKube(), sync_cfg(slurm_resync_seconds=600.0, leader_election=False),
                   use_watch=False)
    calls = []
    real = d.reconciler.run_pass

    def run_pass():
        calls.append(1)
        if len(calls) == 1:
            d._wake.set()  # e.g. _on_leader during the first pass
        return real()

    d.reconciler.run_pass = run_pass
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    try:
        wait_for(lambda: len(calls) >= 2, 30, "the second pass, long before the 600 s resync")
    finally:
        d.stop()
        t.join(10)


def test_the_first_pass_waits_for_the_end_of_the_first_lease_round():
    """`wait_synced` waits for the first lease round; the round used to count itself when it *started*,
    so the first pass could run while the Lease request was in flight: as a follower, writing nothing
    (seen once in three runs of bench/bench_sync_http.py at 200 nodes)."""
    import threading

    from helpers import wait_for
    from sync_helpers import sync_cfg

    from autoheal.k8s_sync.daemon import SyncDaemon
    from autoheal_lab.testing.slurm import MemorySlurm

    kube = MemoryKube()
    release = threading.Event()
    real_get = kube.get_lease

    def slow_get_lease(namespace, name):
        release.wait(10)
        return real_get(namespace, name)

    kube.get_lease = slow_get_lease
    d = SyncDaemon(MemorySlurm(), kube, sync_cfg(leader_election=True), use_watch=False, ident="a")
    d.start_background()
    try:
        assert wait_for(lambda: d.elector.rounds == 0 and not release.is_set(), 1)
        assert not d.wait_synced(0.3)  # the round is still in flight: not synced yet
        release.set()
        assert d.wait_synced(5)
        assert d.elector.is_leader()  # so the first pass writes
    finally:
        release.set()
        d.shutdown()
