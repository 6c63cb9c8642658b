"""Watch semantics through kubernetes.watch.Watch: replay, bookmarks, selectors, 410 Gone, timeouts."""

import json
import threading
import time
import urllib.request

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from autoheal_lab.fakekube import FakeKubeServer
from autoheal_lab.fakekube.testing import fake_kube, kube_api_client, make_node, make_pod  # noqa: F401


@pytest.fixture
def core(fake_kube):  # noqa: F811
    return client.CoreV1Api(kube_api_client(fake_kube))


def _events(core, func, stop_after, **kwargs):
    w = watch.Watch()
    out = []
    for ev in w.stream(func, **kwargs):
        out.append((ev["type"], ev["raw_object"]))
        if len(out) >= stop_after:
            w.stop()
    return out


def test_watch_replays_events_after_resource_version(core, fake_kube):  # noqa: F811
    listed = core.list_node()
    fake_kube.store.add(make_node("a"))
    fake_kube.store.patch("nodes", "a", {"metadata": {"labels": {"x": "1"}}})
    fake_kube.store.delete("nodes", "a")
    events = _events(core, core.list_node, 3, resource_version=listed.metadata.resource_version,
                     timeout_seconds=5)
    assert [t for t, _ in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[1][1]["metadata"]["labels"]["x"] == "1"
    assert events[1][1]["kind"] == "Node" and events[1][1]["apiVersion"] == "v1"
    rvs = [int(o["metadata"]["resourceVersion"]) for _, o in events]
    assert rvs == sorted(rvs) and rvs[0] > int(listed.metadata.resource_version)


def test_watch_without_resource_version_sends_current_state_then_changes(core, fake_kube):  # noqa: F811
    fake_kube.store.add(make_node("a"))
    timer = threading.Timer(0.3, lambda: fake_kube.store.add(make_node("b")))
    timer.start()
    events = _events(core, core.list_node, 2, timeout_seconds=5)
    timer.join()
    assert [(t, o["metadata"]["name"]) for t, o in events] == [("ADDED", "a"), ("ADDED", "b")]


def test_watch_field_and_label_selectors_turn_transitions_into_added_and_deleted(core, fake_kube):  # noqa: F811
    fake_kube.store.add(make_pod("p", node="gpu-1", labels={"app": "x"}))
    rv = core.list_namespaced_pod("default").metadata.resource_version
    fake_kube.store.patch("pods", "p", {"metadata": {"labels": {"app": "y"}}}, namespace="default")
    fake_kube.store.patch("pods", "p", {"metadata": {"labels": {"app": "x"}}}, namespace="default")
    events = _events(core, core.list_namespaced_pod, 2, namespace="default", label_selector="app=x",
                     field_selector="spec.nodeName=gpu-1", resource_version=rv, timeout_seconds=5)
    assert [t for t, _ in events] == ["DELETED", "ADDED"]
    assert events[0][1]["metadata"]["labels"] == {"app": "x"}  # the last state that matched


def test_watch_ends_at_timeout_seconds(fake_kube, core):  # noqa: F811
    started = time.monotonic()
    resp = core.list_node(watch=True, timeout_seconds=1, _preload_content=False)
    assert resp.data == b""
    assert 0.9 < time.monotonic() - started < 3
    assert resp.headers["Transfer-Encoding"] == "chunked"


def test_bookmark_events(fake_kube, core):  # noqa: F811
    fake_kube.store.add(make_node("a"))
    rv = core.list_node().metadata.resource_version
    resp = core.list_node(watch=True, resource_version=rv, allow_watch_bookmarks=True, timeout_seconds=5,
                          _preload_content=False)
    first = json.loads(next(watch.watch.iter_resp_lines(resp)))
    resp.close()
    assert first == {"type": "BOOKMARK", "object": {"kind": "Node", "apiVersion": "v1", "metadata": {
        "resourceVersion": rv, "creationTimestamp": None}}}


def test_bookmark_through_watch_stream_updates_resource_version(core, fake_kube):  # noqa: F811
    w = watch.Watch()
    seen = []
    for ev in w.stream(core.list_node, allow_watch_bookmarks=True, timeout_seconds=3, resource_version="1"):
        seen.append(ev["type"])
        if ev["type"] == "BOOKMARK":
            w.stop()
    assert "BOOKMARK" in seen and w.resource_version is not None


def test_too_old_resource_version_is_an_error_event(core, fake_kube):  # noqa: F811
    fake_kube.store.add(make_node("a"))
    old = core.list_node().metadata.resource_version
    fake_kube.store.add(make_node("b"))
    fake_kube.store.store.compact()
    resp = core.list_node(watch=True, resource_version=old, timeout_seconds=2, _preload_content=False)
    first = json.loads(resp.data.decode().splitlines()[0])
    assert resp.status == 200
    assert first == {"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f"too old resource version: {old} ({fake_kube.store.store.current_rv})",
        "reason": "Expired", "code": 410}}
    w = watch.Watch()
    with pytest.raises(ApiException) as exc:
        for _ in w.stream(core.list_node, resource_version=old, timeout_seconds=2):
            pass
    assert exc.value.status == 410


def test_history_window_expires_old_versions():
    with FakeKubeServer(history_window=3) as server:
        core = client.CoreV1Api(kube_api_client(server))
        rv = core.list_node().metadata.resource_version
        for i in range(5):
            server.store.add(make_node(f"n{i}"))
        resp = core.list_node(watch=True, resource_version=rv, timeout_seconds=1, _preload_content=False)
        assert json.loads(resp.data.decode().splitlines()[0])["object"]["code"] == 410


def test_watch_single_object_legacy_path_and_namespace_scope(fake_kube, core):  # noqa: F811
    fake_kube.store.add(make_pod("p", node="n"))
    fake_kube.store.add(make_pod("q", node="n", namespace="kube-system"))
    fake_kube.store.add(make_pod("p2", node="n"))
    with urllib.request.urlopen(fake_kube.url + "/api/v1/watch/namespaces/default/pods/p?timeoutSeconds=5") as resp:
        first = json.loads(resp.readline())
    assert first["type"] == "ADDED" and first["object"]["metadata"]["name"] == "p"
    url = fake_kube.url + "/api/v1/watch/namespaces/default/pods?timeoutSeconds=5"
    with urllib.request.urlopen(url) as resp:
        names = [json.loads(resp.readline())["object"]["metadata"]["name"] for _ in range(2)]
    assert names == ["p", "p2"]


def test_send_initial_events_ends_with_annotated_bookmark(fake_kube):  # noqa: F811
    fake_kube.store.add(make_node("a"))
    url = (fake_kube.url + "/api/v1/nodes?watch=1&sendInitialEvents=true&allowWatchBookmarks=true"
           "&resourceVersionMatch=NotOlderThan&timeoutSeconds=5")
    with urllib.request.urlopen(url) as resp:
        events = [json.loads(resp.readline()) for _ in range(2)]
    assert events[0]["type"] == "ADDED"
    assert events[1]["type"] == "BOOKMARK"
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_stop_ends_open_watches_promptly():
    server = FakeKubeServer().start()
    core = client.CoreV1Api(kube_api_client(server))
    resp = core.list_node(watch=True, _preload_content=False)
    started = time.monotonic()
    server.stop()
    resp.read()  # returns once the server closed the stream
    assert time.monotonic() - started < 3


def test_future_resource_version_waits_then_times_out(fake_kube, core):  # noqa: F811
    future = str(fake_kube.store.store.current_rv + 1)

    def later():
        fake_kube.store.add(make_node("late"))  # makes revision `future` exist
        fake_kube.store.add(make_node("later"))  # the first change after it
    threading.Timer(0.2, later).start()
    events = _events(core, core.list_node, 1, resource_version=future, timeout_seconds=5)
    assert events[0][1]["metadata"]["name"] == "later"
    far = str(fake_kube.store.store.current_rv + 100)
    started = time.monotonic()
    resp = core.list_node(watch=True, resource_version=far, timeout_seconds=10, _preload_content=False)
    error = json.loads(resp.data.decode().splitlines()[0])
    assert 2.5 < time.monotonic() - started < 6
    assert error["type"] == "ERROR" and error["object"]["code"] == 504
    assert error["object"]["message"].startswith(f"Too large resource version: {far}")
