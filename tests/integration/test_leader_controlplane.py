"""The sync's Lease election against the real kube-apiserver (coordination.k8s.io/v1).

Regression (issue 21): the kubernetes client 37's generated methods validate a dict body into its model
classes, which read a Lease's MicroTime strings into datetimes and write them back with ``isoformat()``:
``2027-01-15T08:00:00+00:00`` when the microseconds are 0, without the 6 fraction digits MicroTime needs,
and the real server answered 400. Every renewal made on a whole microsecond second failed (one in a
million by chance; each one a lost renewal). The adapter now sends Lease bodies as the JSON it words."""

from __future__ import annotations

import pytest

from autoheal.k8s_sync.kube import KubeApi
from autoheal.k8s_sync.leader import LeaderElector

pytest.importorskip("kubernetes")

WHOLE_SECOND = 1_800_000_000.0  # 2027-01-15T08:00:00.000000Z: microsecond 0
NAME1, NAME2 = "whole-second", "takeover"


@pytest.fixture(scope="module")
def kube(control_plane):
    from kubernetes import client
    from kubernetes import config as kconfig

    cfg = client.Configuration()
    kconfig.load_kube_config(config_file=str(control_plane.kubeconfig), client_configuration=cfg)
    try:
        client.CoreV1Api(client.ApiClient(cfg)).create_namespace({"metadata": {"name": "lease-test"}})
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    return KubeApi.from_settings(str(control_plane.kubeconfig), timeout=10.0)


def test_a_lease_taken_and_renewed_on_a_whole_second_is_accepted(kube):
    clock = [WHOLE_SECOND]
    el = LeaderElector(kube, "lease-test", NAME1, "replica-1", duration=15.0, wall=lambda: clock[0])
    assert el.try_acquire_or_renew(), el.last_error  # create: acquireTime and renewTime at .000000
    lease = kube.get_lease("lease-test", NAME1)
    assert lease["spec"]["renewTime"] == "2027-01-15T08:00:00.000000Z"
    clock[0] = WHOLE_SECOND + 5.0
    assert el.try_acquire_or_renew(), el.last_error  # renew: a PUT carrying both times
    lease = kube.get_lease("lease-test", NAME1)
    assert (lease["spec"]["renewTime"], lease["spec"]["acquireTime"]) == \
        ("2027-01-15T08:00:05.000000Z", "2027-01-15T08:00:00.000000Z")
    assert lease["spec"]["holderIdentity"] == "replica-1"
    el.release()  # the Lease as the server served it, sent back
    assert kube.get_lease("lease-test", NAME1)["spec"]["holderIdentity"] in ("", None)


def test_another_replica_takes_over_a_lease_on_a_whole_second(kube):
    clock = [WHOLE_SECOND + 100.0]
    first = LeaderElector(kube, "lease-test", NAME2, "replica-1", duration=15.0, wall=lambda: clock[0])
    assert first.try_acquire_or_renew(), first.last_error
    second = LeaderElector(kube, "lease-test", NAME2, "replica-2", duration=15.0, wall=lambda: clock[0])
    assert not second.try_acquire_or_renew()  # held, not expired
    clock[0] += 20.0  # the holder stopped renewing: expired
    assert second.try_acquire_or_renew(), second.last_error
    spec = kube.get_lease("lease-test", NAME2)["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("replica-2", 1)
