"""coordination.k8s.io/v1 Leases: renewals with PUT, 409 on stale resourceVersion, the client's elector."""

import datetime
import json
import threading
import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from autoheal_lab.fakekube.testing import fake_kube, kube_api_client  # noqa: F401


@pytest.fixture
def coord(fake_kube):  # noqa: F811
    return client.CoordinationV1Api(kube_api_client(fake_kube))


@pytest.fixture
def default_client(fake_kube):  # noqa: F811
    """LeaseLock builds its API object from the default configuration."""
    previous = client.Configuration.get_default_copy()
    cfg = client.Configuration()
    cfg.host = fake_kube.url
    client.Configuration.set_default(cfg)
    yield
    client.Configuration.set_default(previous)


def _now():
    return datetime.datetime.now(datetime.timezone.utc)


def test_lease_renewal_with_put_and_conflict(coord):
    lease = coord.create_namespaced_lease("kube-system", client.V1Lease(
        metadata=client.V1ObjectMeta(name="autoheal"),
        spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15, acquire_time=_now(),
                                renew_time=_now())))
    assert lease.metadata.resource_version and lease.spec.holder_identity == "a"
    stale = coord.read_namespaced_lease("autoheal", "kube-system")
    lease.spec.renew_time = _now()
    renewed = coord.replace_namespaced_lease("autoheal", "kube-system", lease)
    assert int(renewed.metadata.resource_version) > int(lease.metadata.resource_version)
    stale.spec.holder_identity = "b"
    with pytest.raises(ApiException) as exc:
        coord.replace_namespaced_lease("autoheal", "kube-system", stale)
    assert exc.value.status == 409
    assert json.loads(exc.value.body)["message"].startswith(
        'Operation cannot be fulfilled on leases.coordination.k8s.io "autoheal"')
    with pytest.raises(ApiException) as exc:
        coord.create_namespaced_lease("kube-system", client.V1Lease(
            metadata=client.V1ObjectMeta(name="bad"), spec=client.V1LeaseSpec(lease_duration_seconds=0)))
    assert exc.value.status == 422


def test_lease_lock_two_candidates(default_client, fake_kube):  # noqa: F811
    record = LeaderElectionRecord("a", "15", str(datetime.datetime.now()), str(datetime.datetime.now()))
    lock_a, lock_b = LeaseLock("el", "default", "a"), LeaseLock("el", "default", "b")
    assert lock_a.get("el", "default")[0] is False  # 404 -> not found
    assert lock_a.create("el", "default", record)
    assert lock_b.create("el", "default", record) is False  # AlreadyExists
    found, current = lock_b.get("el", "default")
    assert found and current.holder_identity == "a"
    record.renew_time = str(datetime.datetime.now())
    assert lock_a.update("el", "default", record)
    theirs = LeaderElectionRecord("b", "15", record.acquire_time, record.renew_time)
    assert lock_b.update("el", "default", theirs) is False  # stale resourceVersion -> 409
    assert fake_kube.store.get("leases", "el", "default")["spec"]["holderIdentity"] == "a"


def test_leader_election_acquires_and_renews(default_client, fake_kube):  # noqa: F811
    renewals = []
    led = threading.Event()

    def lead():
        led.set()
        deadline = time.time() + 2.5
        while time.time() < deadline:
            lease = fake_kube.store.find("leases", "elector", "default")
            if lease:
                renewals.append(lease["spec"]["renewTime"])
            time.sleep(0.2)
        raise RuntimeError("stop leading")  # the elector stops renewing when the callback raises

    cfg = electionconfig.Config(LeaseLock("elector", "default", "me"), lease_duration=4, renew_deadline=3,
                                retry_period=1, onstarted_leading=lead, onstopped_leading=lambda: None)
    thread = threading.Thread(target=leaderelection.LeaderElection(cfg).run, daemon=True)
    thread.start()
    assert led.wait(5)
    thread.join(10)
    lease = fake_kube.store.get("leases", "elector", "default")
    assert lease["spec"]["holderIdentity"] == "me" and lease["spec"]["leaseDurationSeconds"] == 4
    assert len(set(renewals)) >= 2  # renewTime moved while leading
