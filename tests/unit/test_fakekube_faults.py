"""Fault injection (Python API and the /_fake admin endpoints) and the command-line server."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from autoheal_lab.fakekube.testing import fake_kube, kube_api_client, make_node  # noqa: F401


@pytest.fixture
def core(fake_kube):  # noqa: F811
    return client.CoreV1Api(kube_api_client(fake_kube))


def _admin(server, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as resp:
        return resp.status, json.loads(resp.read())


def test_python_fault_conflict_times_then_success(core, fake_kube):  # noqa: F811
    fake_kube.store.add(make_node("n"))
    fake_kube.faults.add(method="PATCH", path_regex=r"^/api/v1/nodes/[^/]+$", status=409, times=2)
    for _ in range(2):
        with pytest.raises(ApiException) as exc:
            core.patch_node("n", {"metadata": {"labels": {"a": "b"}}})
        body = json.loads(exc.value.body)
        assert exc.value.status == 409 and body["reason"] == "Conflict"
        assert body["message"].startswith('Operation cannot be fulfilled on nodes "n"')
    assert core.patch_node("n", {"metadata": {"labels": {"a": "b"}}}).metadata.labels["a"] == "b"
    assert core.read_node("n")  # GETs were never affected
    assert fake_kube.faults.rules()[0].hits == 2


def test_too_many_requests_carries_retry_after(core, fake_kube):  # noqa: F811
    # PATCH: urllib3 would honour Retry-After and retry a GET by itself, as against a real server
    fake_kube.store.add(make_node("n"))
    fake_kube.faults.add(method="PATCH", path_regex="/api/v1/nodes", status=429, retry_after=3, times=1)
    with pytest.raises(ApiException) as exc:
        core.patch_node("n", {"metadata": {"labels": {"a": "b"}}})
    assert exc.value.status == 429 and exc.value.headers["Retry-After"] == "3"
    assert json.loads(exc.value.body)["details"]["retryAfterSeconds"] == 3


def test_latency_skip_and_server_errors(core, fake_kube):  # noqa: F811
    fake_kube.faults.add(method="GET", path_regex="/api/v1/nodes$", latency_ms=300, times=1)
    started = time.monotonic()
    core.list_node()
    assert time.monotonic() - started >= 0.3
    fake_kube.faults.add(method="GET", path_regex="/api/v1/namespaces$", status=500, skip=1, times=1)
    core.list_namespace()
    with pytest.raises(ApiException) as exc:
        core.list_namespace()
    assert exc.value.status == 500 and json.loads(exc.value.body)["reason"] == "InternalError"
    core.list_namespace()


def test_disconnect_and_watch_only_rules(core, fake_kube):  # noqa: F811
    rule = fake_kube.faults.add(path_regex="/api/v1/nodes", watch=True, disconnect=True)
    core.list_node()  # not a watch: served
    with pytest.raises(Exception):  # noqa: B017  urllib3 retries a dropped GET, then gives up: its type varies
        core.list_node(watch=True, timeout_seconds=1, _request_timeout=3, _preload_content=False).read()
    assert rule.hits >= 2
    fake_kube.faults.remove(rule.id)
    assert core.list_node(watch=True, timeout_seconds=1, _preload_content=False).read() == b""


def test_admin_endpoints(fake_kube, core):  # noqa: F811
    code, body = _admin(fake_kube, "POST", "/_fake/faults",
                        {"method": "PATCH", "path_regex": "/api/v1/nodes/.*", "status": 503, "times": 1})
    assert code == 201 and body["faults"][0]["id"] >= 1
    assert _admin(fake_kube, "GET", "/_fake/faults")[1]["faults"][0]["status"] == 503
    fake_kube.store.add(make_node("n"))
    with pytest.raises(ApiException) as exc:
        core.patch_node("n", {"metadata": {"labels": {"a": "b"}}})
    assert exc.value.status == 503 and json.loads(exc.value.body)["reason"] == "ServiceUnavailable"
    code, _ = _admin(fake_kube, "POST", "/_fake/faults", [{"status": 500, "times": 5}])
    assert code == 201
    _admin(fake_kube, "DELETE", "/_fake/faults")
    assert _admin(fake_kube, "GET", "/_fake/faults")[1]["faults"] == []
    _admin(fake_kube, "POST", "/_fake/objects", {"items": [make_node("m")]})
    assert {o["metadata"]["name"] for o in _admin(fake_kube, "GET", "/_fake/objects")[1]["items"]
            if o["kind"] == "Node"} == {"n", "m"}
    assert any(r["path"] == "/api/v1/nodes/n" for r in _admin(fake_kube, "GET", "/_fake/requests")[1]["requests"])
    _admin(fake_kube, "POST", "/_fake/reset")
    assert core.list_node().items == []
    assert {ns.metadata.name for ns in core.list_namespace().items} >= {"default", "kube-system"}
    with pytest.raises(urllib.error.HTTPError) as err:
        _admin(fake_kube, "POST", "/_fake/faults", {"bogus": 1})
    assert err.value.code == 400


def test_bad_fault_specs_are_refused(fake_kube):  # noqa: F811
    with pytest.raises(ValueError):
        fake_kube.faults.add(status=42)
    with pytest.raises(ValueError):
        fake_kube.faults.add(nonsense=True)


def test_only_loopback():
    from autoheal_lab.fakekube import FakeKubeServer
    with pytest.raises(ValueError):
        FakeKubeServer(host="0.0.0.0")


def test_cli_serves_writes_kubeconfig_and_saves_state_on_sigterm(tmp_path):
    kubeconfig, state = tmp_path / "kc", tmp_path / "state.json"
    state.write_text(json.dumps({"items": [make_node("persisted")]}))
    proc = subprocess.Popen([sys.executable, "-m", "autoheal_lab.fakekube", "--port", "0", "--kubeconfig",
                             str(kubeconfig), "--state-file", str(state)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        config = json.loads(kubeconfig.read_text())
        assert config["clusters"][0]["cluster"]["server"] == url
        assert oct(os.stat(kubeconfig).st_mode & 0o777) == "0o600"
        from kubernetes import config as kconfig
        core = client.CoreV1Api(kconfig.new_client_from_config(config_file=str(kubeconfig)))
        assert [n.metadata.name for n in core.list_node().items] == ["persisted"]
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="added")))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    saved = json.loads(state.read_text())
    assert {o["metadata"]["name"] for o in saved["items"] if o["kind"] == "Node"} == {"persisted", "added"}
    assert int(saved["resourceVersion"]) > 1  # a restart continues numbering after it
