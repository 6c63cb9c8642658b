"""The adapter's write hot path (issue 21, the 1,000-node drain): pod and Node patches and Events go
straight to the client's connection pool with its credentials, and the client's credential refresh
hook, which the kubeconfig loaders make run before every request, runs at most once a second."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("kubernetes")

from autoheal.k8s_sync import kube as K


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Config:
    refresh_api_key_hook = None


def test_the_refresh_hook_runs_at_most_once_per_interval():
    calls = []
    clock = Clock()
    hook = K.throttled_refresh(lambda cfg: calls.append(clock.now), every=1.0, clock=clock)
    cfg = Config()
    for t in (100.0, 100.2, 100.9, 101.0, 101.5, 103.0):
        clock.now = t
        hook(cfg)
    assert calls == [100.0, 101.0, 103.0]


def test_a_loader_hook_that_reinstalls_itself_stays_behind_the_throttle():
    """kubernetes.config's hooks set ``refresh_api_key_hook`` to a new closure each time they run."""
    calls = []
    clock = Clock()
    cfg = Config()

    def loader_hook(configuration):
        calls.append(clock.now)
        configuration.refresh_api_key_hook = loader_hook2  # what KubeConfigLoader._set_config does

    def loader_hook2(configuration):
        calls.append(("second", clock.now))
        configuration.refresh_api_key_hook = loader_hook2

    throttled = K.throttled_refresh(loader_hook, every=1.0, clock=clock)
    cfg.refresh_api_key_hook = throttled
    cfg.refresh_api_key_hook(cfg)
    assert cfg.refresh_api_key_hook is throttled
    clock.now += 0.5
    cfg.refresh_api_key_hook(cfg)
    clock.now += 0.6
    cfg.refresh_api_key_hook(cfg)
    assert calls == [100.0, ("second", 101.1)] and cfg.refresh_api_key_hook is throttled


def test_a_hook_that_failed_runs_again_on_the_next_request():
    clock = Clock()
    attempts = []

    def flaky(configuration):
        attempts.append(clock.now)
        if len(attempts) == 1:
            raise OSError("token file not there yet")

    hook = K.throttled_refresh(flaky, every=1.0, clock=clock)
    with pytest.raises(OSError):
        hook(Config())
    hook(Config())
    assert attempts == [100.0, 100.0]


class Answer:
    def __init__(self, status: int, body: dict, headers=None) -> None:
        self.status, self.reason = status, "x"
        self.data = json.dumps(body).encode()
        self.headers = headers or {}


class Pool:
    def __init__(self, answer) -> None:
        self.answer = answer
        self.sent = []

    def request(self, method, url, **kw):
        self.sent.append((method, url, kw))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def api(answer) -> K.KubeApi:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:1"
    cfg.api_key = {"BearerToken": "tok"}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    kube = K.KubeApi(cfg)
    kube.api_client.rest_client.pool_manager = Pool(answer)
    return kube


def test_a_pod_status_patch_goes_to_the_status_subresource_with_the_credentials():
    pod = {"metadata": {"name": "slurmd-a", "resourceVersion": "8", "managedFields": [{"manager": "kubelet"}]},
           "status": {"conditions": [{"type": "SlurmNodeStateDrain", "status": "True"}]}}
    kube = api(Answer(200, pod))
    body = {"status": {"conditions": [{"type": "SlurmNodeStateDrain", "status": "True"}]}}
    got = kube.patch_pod_status("slurm", "slurmd-a", body)
    method, url, kw = kube.api_client.rest_client.pool_manager.sent[0]
    assert (method, url) == ("PATCH", "https://127.0.0.1:1/api/v1/namespaces/slurm/pods/slurmd-a/status")
    assert {k.lower(): v for k, v in kw["headers"].items()}["authorization"] == "Bearer tok"
    assert kw["headers"]["Content-Type"] == "application/strategic-merge-patch+json"
    assert json.loads(kw["body"]) == body
    assert got["metadata"] == {"name": "slurmd-a", "resourceVersion": "8"}  # managedFields dropped
    assert kube.calls == {"patch_pod_status": 1}


@pytest.mark.parametrize("call, url", [
    (lambda k: k.patch_node("gpu1", {"spec": {}}, "merge"), "https://127.0.0.1:1/api/v1/nodes/gpu1"),
    (lambda k: k.patch_node_status("gpu1", {"status": {}}), "https://127.0.0.1:1/api/v1/nodes/gpu1/status"),
    (lambda k: k.create_event("slurm", {"metadata": {"name": "gpu1", "uid": "u"}}, "R", "m"),
     "https://127.0.0.1:1/api/v1/namespaces/default/events"),
])
def test_node_patches_and_events_go_where_the_generated_methods_sent_them(call, url):
    kube = api(Answer(201, {"metadata": {"name": "x"}}))
    call(kube)
    assert kube.api_client.rest_client.pool_manager.sent[0][1] == url


def test_answers_that_are_errors_are_classified_as_before():
    conflict = {"kind": "Status", "message": "the object has been modified", "code": 409}
    with pytest.raises(K.Conflict, match="patch_node: HTTP 409: the object has been modified"):
        api(Answer(409, conflict)).patch_node("gpu1", {"spec": {}})
    with pytest.raises(K.KubeError) as err:
        api(Answer(429, {"message": "slow down"}, {"Retry-After": "3"})).patch_node_status("gpu1", {"status": {}})
    assert (err.value.status, err.value.retry_after) == (429, 3.0)
    with pytest.raises(K.NotFound):
        api(Answer(404, {"message": "not found"})).patch_pod_status("slurm", "gone", {"status": {}})


def test_no_answer_is_a_kube_error_without_status():
    import urllib3

    with pytest.raises(K.KubeError) as err:
        api(urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out")).patch_node("gpu1", {"spec": {}})
    assert err.value.status == 0 and "ReadTimeoutError" in str(err.value)
