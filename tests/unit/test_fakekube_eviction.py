"""pods/eviction with PodDisruptionBudgets, through the kubernetes client."""

import json

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from autoheal_lab.fakekube.testing import fake_kube, kube_api_client, make_pdb, make_pod  # noqa: F401


@pytest.fixture
def apis(fake_kube):  # noqa: F811
    api_client = kube_api_client(fake_kube)
    return client.CoreV1Api(api_client), client.PolicyV1Api(api_client)


def _evict(core, name, namespace="default"):
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace),
                             delete_options=client.V1DeleteOptions(grace_period_seconds=5))
    return core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False)


def test_eviction_without_pdb_deletes_the_pod(apis, fake_kube):  # noqa: F811
    core, _ = apis
    fake_kube.store.add(make_pod("p", node="gpu-1"))
    resp = _evict(core, "p")
    assert resp.status == 201
    assert json.loads(resp.data) == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                     "code": 201}
    assert fake_kube.store.find("pods", "p", "default") is None


def test_pdb_blocks_eviction_with_429_and_real_message(apis, fake_kube):  # noqa: F811
    core, policy = apis
    fake_kube.store.add(make_pod("busy", node="gpu-1", labels={"app": "slurmd"}))
    fake_kube.store.add(make_pdb("slurmd", {"app": "slurmd"}, max_unavailable=0))
    pdb = policy.read_namespaced_pod_disruption_budget("slurmd", "default")
    assert (pdb.status.current_healthy, pdb.status.desired_healthy, pdb.status.expected_pods,
            pdb.status.disruptions_allowed) == (1, 1, 1, 0)
    assert pdb.status.observed_generation == pdb.metadata.generation == 1
    with pytest.raises(ApiException) as exc:
        _evict(core, "busy")
    body = json.loads(exc.value.body)
    assert exc.value.status == 429
    assert body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [{"reason": "DisruptionBudget", "message":
                                          "The disruption budget slurmd needs 1 healthy pods and has 1 currently"}]
    assert fake_kube.store.find("pods", "busy", "default") is not None


def test_min_available_allows_one_then_blocks(apis, fake_kube):  # noqa: F811
    core, policy = apis
    for i in range(3):
        fake_kube.store.add(make_pod(f"w{i}", node="gpu-1", labels={"app": "w"}))
    fake_kube.store.add(make_pod("sick", node="gpu-1", labels={"app": "w"}, ready=False))
    fake_kube.store.add(make_pdb("w", {"app": "w"}, min_available=2))
    status = policy.read_namespaced_pod_disruption_budget("w", "default").status
    assert (status.current_healthy, status.desired_healthy, status.expected_pods, status.disruptions_allowed) == \
        (3, 2, 4, 1)
    _evict(core, "sick")  # an unready pod may go while the budget is met
    _evict(core, "w0")
    status = policy.read_namespaced_pod_disruption_budget("w", "default").status
    assert (status.current_healthy, status.disruptions_allowed) == (2, 0)
    assert status.conditions[0].type == "DisruptionAllowed" and status.conditions[0].status == "False"
    with pytest.raises(ApiException) as exc:
        _evict(core, "w1")
    assert exc.value.status == 429


def test_percentages_and_terminal_pods(apis, fake_kube):  # noqa: F811
    core, policy = apis
    for i in range(4):
        fake_kube.store.add(make_pod(f"p{i}", node="gpu-1", labels={"app": "p"}))
    fake_kube.store.add(make_pod("done", node="gpu-1", labels={"app": "p"}, phase="Succeeded", ready=False))
    fake_kube.store.add(make_pdb("p", {"app": "p"}, max_unavailable="25%"))
    status = policy.read_namespaced_pod_disruption_budget("p", "default").status
    assert (status.expected_pods, status.desired_healthy, status.disruptions_allowed) == (5, 3, 1)
    _evict(core, "done")  # terminal pods ignore the budget
    assert fake_kube.store.find("pods", "done", "default") is None


def test_two_pdbs_is_a_500_and_missing_pod_404(apis, fake_kube):  # noqa: F811
    core, _ = apis
    fake_kube.store.add(make_pod("p", node="gpu-1", labels={"app": "x"}))
    fake_kube.store.add(make_pdb("a", {"app": "x"}, min_available=0))
    fake_kube.store.add(make_pdb("b", {"app": "x"}, min_available=0))
    with pytest.raises(ApiException) as exc:
        _evict(core, "p")
    assert exc.value.status == 500
    assert "more than one PodDisruptionBudget" in json.loads(exc.value.body)["message"]
    with pytest.raises(ApiException) as exc:
        _evict(core, "ghost")
    assert exc.value.status == 404


def test_eviction_name_mismatch_is_400(apis, fake_kube):  # noqa: F811
    core, _ = apis
    fake_kube.store.add(make_pod("p", node="gpu-1"))
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name="other", namespace="default"))
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("p", "default", body)
    assert exc.value.status == 400


def test_pdb_spec_change_bumps_generation_and_recomputes(apis, fake_kube):  # noqa: F811
    _, policy = apis
    fake_kube.store.add(make_pod("p", node="gpu-1", labels={"app": "x"}))
    policy.create_namespaced_pod_disruption_budget("default", client.V1PodDisruptionBudget(
        metadata=client.V1ObjectMeta(name="x"), spec=client.V1PodDisruptionBudgetSpec(
            max_unavailable=0, selector=client.V1LabelSelector(match_labels={"app": "x"}))))
    out = policy.patch_namespaced_pod_disruption_budget("x", "default", {"spec": {"maxUnavailable": 1}},
                                                        _content_type="application/merge-patch+json")
    assert out.metadata.generation == 2
    status = policy.read_namespaced_pod_disruption_budget("x", "default").status
    assert status.observed_generation == 2 and status.disruptions_allowed == 1
