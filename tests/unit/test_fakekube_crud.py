"""CRUD, errors, status subresource and patch types, driven through the real kubernetes client."""

import json

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from autoheal_lab.fakekube.testing import fake_kube, fake_kube_config, kube_api_client, make_node, make_pod  # noqa: F401


@pytest.fixture
def core(fake_kube):  # noqa: F811
    return client.CoreV1Api(kube_api_client(fake_kube))


def _status(exc: ApiException) -> dict:
    return json.loads(exc.body)


def test_load_kube_config_and_list_nodes(fake_kube, fake_kube_config):  # noqa: F811
    fake_kube.store.add(make_node("gpu-1"))
    api_client = config.new_client_from_config(config_file=fake_kube_config)
    nodes = client.CoreV1Api(api_client).list_node()
    assert [n.metadata.name for n in nodes.items] == ["gpu-1"]
    assert nodes.metadata.resource_version
    assert fake_kube.requests[-1]["path"] == "/api/v1/nodes"


def test_create_get_list_delete_node(core):
    created = core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="gpu-1", labels={"a": "b"})))
    assert created.kind == "Node" and created.api_version == "v1"
    assert created.metadata.uid and created.metadata.creation_timestamp
    assert created.metadata.resource_version.isdigit()
    assert created.metadata.generation is None  # nodes have no generation on a real server
    got = core.read_node("gpu-1")
    assert got.metadata.resource_version == created.metadata.resource_version
    raw = core.list_node(_preload_content=False)  # the wire form
    body = json.loads(raw.data)
    assert body["kind"] == "NodeList" and body["apiVersion"] == "v1"
    assert body["metadata"]["resourceVersion"] == created.metadata.resource_version
    assert "kind" not in body["items"][0]  # typed list items carry no TypeMeta on the wire
    status = core.delete_node("gpu-1")  # this client version hands back the Status as a dict
    assert status["kind"] == "Status" and status["status"] == "Success"
    assert status["details"] == {"name": "gpu-1", "kind": "nodes", "uid": created.metadata.uid}
    with pytest.raises(ApiException) as exc:
        core.read_node("gpu-1")
    assert exc.value.status == 404


def test_not_found_status_object(core):
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod("nope", "default")
    body = _status(exc.value)
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": 'pods "nope" not found', "reason": "NotFound",
                    "details": {"name": "nope", "kind": "pods"}, "code": 404}


def test_create_existing_is_already_exists(core):
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="n")))
    with pytest.raises(ApiException) as exc:
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="n")))
    body = _status(exc.value)
    assert exc.value.status == 409 and body["reason"] == "AlreadyExists"
    assert body["message"] == 'nodes "n" already exists'


def test_stale_resource_version_put_and_patch_conflict(core):
    node = core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="n")))
    stale = node.metadata.resource_version
    node.metadata.labels = {"x": "1"}
    core.replace_node("n", node)
    node.metadata.labels = {"x": "2"}
    with pytest.raises(ApiException) as exc:
        core.replace_node("n", node)
    body = _status(exc.value)
    assert exc.value.status == 409 and body["reason"] == "Conflict"
    assert body["details"] == {"name": "n", "kind": "nodes"}
    assert "the object has been modified" in body["message"]
    with pytest.raises(ApiException) as exc:
        core.patch_node("n", {"metadata": {"resourceVersion": stale, "labels": {"y": "1"}}})
    assert exc.value.status == 409
    current = core.read_node("n").metadata.resource_version
    patched = core.patch_node("n", {"metadata": {"resourceVersion": current, "labels": {"y": "1"}}})
    assert patched.metadata.labels == {"x": "1", "y": "1"}


def test_put_without_resource_version_is_unconditional(core):
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="n")))
    out = core.replace_node("n", client.V1Node(metadata=client.V1ObjectMeta(name="n", labels={"k": "v"})))
    assert out.metadata.labels == {"k": "v"}


def test_noop_update_keeps_resource_version(core):
    node = core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="n", labels={"a": "1"})))
    again = core.patch_node("n", {"metadata": {"labels": {"a": "1"}}})
    assert again.metadata.resource_version == node.metadata.resource_version


def test_invalid_objects_are_422(core):
    with pytest.raises(ApiException) as exc:
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="Bad_Name")))
    body = _status(exc.value)
    assert exc.value.status == 422 and body["reason"] == "Invalid"
    assert body["details"]["kind"] == "Node" and body["details"]["causes"][0]["field"] == "metadata.name"
    assert body["message"].startswith('Node "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name"')
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="n")))
    with pytest.raises(ApiException) as exc:
        core.patch_node("n", {"spec": {"taints": [{"key": "gpu", "effect": "Sometimes"}]}})
    assert exc.value.status == 422
    assert _status(exc.value)["details"]["causes"][0]["field"] == "spec.taints[0].effect"


def test_bad_bodies_are_400(fake_kube):  # noqa: F811
    import urllib.request

    def post(path, data, ctype="application/json"):
        req = urllib.request.Request(fake_kube.url + path, data=data, method="POST",
                                     headers={"Content-Type": ctype})
        try:
            urllib.request.urlopen(req)
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())
        raise AssertionError("expected an error")

    code, body = post("/api/v1/nodes", b"{not json")
    assert code == 400 and body["reason"] == "BadRequest"
    code, body = post("/api/v1/namespaces/default/pods", json.dumps(
        {"metadata": {"name": "p", "namespace": "other"}, "spec": {}}).encode())
    assert code == 400 and "does not match the namespace" in body["message"]
    code, body = post("/api/v1/namespaces/default/pods", json.dumps({"metadata": {"name": "p"}}).encode())
    assert code == 422 and body["details"]["causes"][0]["field"] == "spec.containers"
    code, body = post("/api/v1/namespaces/nowhere/configmaps", json.dumps({"metadata": {"name": "c"}}).encode())
    assert code == 404 and body["message"] == 'namespaces "nowhere" not found'


def test_generate_name(core):
    cm = core.create_namespaced_config_map("default", client.V1ConfigMap(
        metadata=client.V1ObjectMeta(generate_name="cm-"), data={"a": "1"}))
    assert cm.metadata.name.startswith("cm-") and len(cm.metadata.name) == 8


def test_main_resource_ignores_status_and_status_subresource_only_status(core):
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="n"), status=client.V1NodeStatus(
        conditions=[client.V1NodeCondition(type="Ready", status="True")])))
    out = core.patch_node("n", {"spec": {"unschedulable": True},
                                "status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert out.spec.unschedulable is True
    assert out.status.conditions[0].status == "True"
    out = core.patch_node_status("n", {"metadata": {"labels": {"sneaky": "1"}}, "spec": {"unschedulable": False},
                                       "status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert out.status.conditions[0].status == "False"
    assert out.spec.unschedulable is True and not out.metadata.labels
    node = core.read_node("n")
    node.status.conditions[0].status = "Unknown"
    node.spec.unschedulable = False
    out = core.replace_node_status("n", node)
    assert out.status.conditions[0].status == "Unknown" and out.spec.unschedulable is True


def test_pod_status_subresource_and_create_resets_status(core):
    pod = make_pod("p", node="gpu-1")
    created = core.create_namespaced_pod("default", pod)
    assert created.status.phase == "Pending"  # the API server owns status on create
    assert created.spec.restart_policy == "Always"  # defaulted
    out = core.patch_namespaced_pod_status("p", "default", {"status": {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    assert out.status.phase == "Running"
    out = core.patch_namespaced_pod_status("p", "default", {"status": {
        "conditions": [{"type": "PodScheduled", "status": "True"}]}})
    assert {c.type for c in out.status.conditions} == {"Ready", "PodScheduled"}
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", "default", {"spec": {"nodeName": "gpu-2"}})
    assert exc.value.status == 422 and "pod updates may not change fields" in _status(exc.value)["message"]


def test_three_patch_types(core):
    core.create_node(client.V1Node(
        metadata=client.V1ObjectMeta(name="n", labels={"a": "1"}),
        spec=client.V1NodeSpec(taints=[client.V1Taint(key="t1", effect="NoSchedule"),
                                       client.V1Taint(key="t2", effect="NoExecute")]),
        status=client.V1NodeStatus(conditions=[client.V1NodeCondition(type="Ready", status="True"),
                                               client.V1NodeCondition(type="DiskPressure", status="False")])))
    # strategic merge (the client's default for dict bodies): conditions merge by type
    out = core.patch_node_status("n", {"status": {"conditions": [{"type": "GpuXid", "status": "True"}]}})
    assert [c.type for c in out.status.conditions] == ["Ready", "DiskPressure", "GpuXid"]
    # strategic merge: taints are replaced whole
    out = core.patch_node("n", {"spec": {"taints": [{"key": "t3", "effect": "NoSchedule"}]}})
    assert [t.key for t in out.spec.taints] == ["t3"]
    # JSON merge patch: lists replaced, null deletes
    out = core.patch_node_status("n", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
                                 _content_type="application/merge-patch+json")
    assert [c.type for c in out.status.conditions] == ["Ready"]
    out = core.patch_node("n", {"metadata": {"labels": {"a": None, "b": "2"}}},
                          _content_type="application/merge-patch+json")
    assert out.metadata.labels == {"b": "2"}
    # JSON patch (a list body), with pointer escaping
    out = core.patch_node("n", [{"op": "add", "path": "/metadata/labels/example.com~1role", "value": "gpu"},
                                {"op": "remove", "path": "/spec/taints"}])
    assert out.metadata.labels == {"b": "2", "example.com/role": "gpu"}
    assert out.spec.taints is None
    with pytest.raises(ApiException) as exc:
        core.patch_node("n", [{"op": "test", "path": "/metadata/labels/b", "value": "9"}])
    assert exc.value.status == 422


def test_apply_patch_is_unsupported_media_type(core):
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="n")))
    with pytest.raises(ApiException) as exc:
        core.patch_node("n", {"metadata": {"labels": {"a": "b"}}}, field_manager="t",
                        _content_type="application/apply-patch+yaml")
    assert exc.value.status == 415 and _status(exc.value)["reason"] == "UnsupportedMediaType"


def test_selectors_and_pagination(core, fake_kube):  # noqa: F811
    for i in range(5):
        fake_kube.store.add(make_pod(f"p{i}", node="gpu-1" if i % 2 else "gpu-2",
                                     labels={"app": "slurmd" if i < 3 else "other", "i": str(i)},
                                     phase="Running" if i != 4 else "Succeeded"))
    names = lambda lst: [p.metadata.name for p in lst.items]  # noqa: E731
    assert names(core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-1")) == ["p1", "p3"]
    assert names(core.list_namespaced_pod("default", label_selector="app=slurmd,i!=0")) == ["p1", "p2"]
    assert names(core.list_namespaced_pod("default", label_selector="i in (3,4)")) == ["p3", "p4"]
    assert names(core.list_namespaced_pod("default", label_selector="!missing,app notin (slurmd)")) == ["p3", "p4"]
    assert names(core.list_namespaced_pod("default", field_selector="status.phase=Succeeded")) == ["p4"]
    assert names(core.list_namespaced_pod("kube-system")) == []
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_pod("default", field_selector="spec.bogus=1")
    assert exc.value.status == 400 and "field label not supported" in _status(exc.value)["message"]
    page = core.list_namespaced_pod("default", limit=2)
    assert names(page) == ["p0", "p1"] and page.metadata.remaining_item_count == 3
    page2 = core.list_namespaced_pod("default", limit=2, _continue=page.metadata._continue)
    page3 = core.list_namespaced_pod("default", limit=2, _continue=page2.metadata._continue)
    assert names(page2) == ["p2", "p3"] and names(page3) == ["p4"] and not page3.metadata._continue
    fake_kube.store.add(make_pod("later", node="gpu-1"))
    fake_kube.store.store.compact()  # like an etcd compaction past the token's revision
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_pod("default", limit=2, _continue=page.metadata._continue)
    assert exc.value.status == 410 and _status(exc.value)["reason"] == "Expired"


def test_delete_options_and_pod_delete_returns_pod(core, fake_kube):  # noqa: F811
    fake_kube.store.add(make_pod("p", node="gpu-1"))
    out = core.delete_namespaced_pod("p", "default", grace_period_seconds=0, propagation_policy="Background",
                                     body=client.V1DeleteOptions(grace_period_seconds=0))
    assert out.kind == "Pod" and out.metadata.name == "p"
    fake_kube.store.add(make_pod("q", node="gpu-1"))
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_pod("q", "default", body=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid="not-the-uid")))
    assert exc.value.status == 409 and "Precondition failed" in _status(exc.value)["message"]


def test_finalizers_hold_deletion(core):
    core.create_namespaced_config_map("default", client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="c", finalizers=["example.com/hold"])))
    core.delete_namespaced_config_map("c", "default")
    held = core.read_namespaced_config_map("c", "default")
    assert held.metadata.deletion_timestamp is not None
    core.patch_namespaced_config_map("c", "default", {"metadata": {"finalizers": None}},
                                     _content_type="application/merge-patch+json")
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map("c", "default")
    assert exc.value.status == 404


def test_graceful_pod_deletion_with_kubelet_delay():
    import time

    from autoheal_lab.fakekube import FakeKubeServer
    with FakeKubeServer(pod_deletion_delay=0.3) as server:
        core = client.CoreV1Api(kube_api_client(server))
        server.store.add(make_pod("p", node="gpu-1"))
        out = core.delete_namespaced_pod("p", "default")
        assert out.metadata.deletion_timestamp is not None
        assert core.read_namespaced_pod("p", "default").metadata.deletion_grace_period_seconds == 30
        deadline = time.time() + 5
        while server.store.find("pods", "p", "default") is not None and time.time() < deadline:
            time.sleep(0.05)
        assert server.store.find("pods", "p", "default") is None


def test_node_delete_and_namespace_cascade(core, fake_kube):  # noqa: F811
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team")))
    ns = core.read_namespace("team")
    assert ns.status.phase == "Active" and ns.metadata.labels["kubernetes.io/metadata.name"] == "team"
    core.create_namespaced_config_map("team", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c")))
    core.delete_namespace("team")
    assert fake_kube.store.find("configmaps", "c", "team") is None
    with pytest.raises(ApiException) as exc:
        core.delete_namespace("default")
    assert exc.value.status == 403


def test_owner_references_are_garbage_collected(core, fake_kube):  # noqa: F811
    owner = core.create_namespaced_config_map("default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="o")))
    ref = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="o", uid=owner.metadata.uid)
    core.create_namespaced_config_map("default", client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="d", owner_references=[ref])))
    core.delete_namespaced_config_map("o", "default")
    assert fake_kube.store.find("configmaps", "d", "default") is None


def test_events_and_secrets(core):
    ev = core.create_namespaced_event("default", client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="gpu-1.x"), reason="NodeRemediated", message="drained",
        involved_object=client.V1ObjectReference(kind="Node", name="gpu-1"), type="Warning"))
    assert ev.reason == "NodeRemediated"
    found = core.list_namespaced_event("default", field_selector="involvedObject.name=gpu-1,reason=NodeRemediated")
    assert [e.metadata.name for e in found.items] == ["gpu-1.x"]
    secret = core.create_namespaced_secret("default", client.V1Secret(metadata=client.V1ObjectMeta(name="s"),
                                                                      string_data={"a": "b"}))
    assert secret.type == "Opaque"


def test_dry_run_does_not_persist(core, fake_kube):  # noqa: F811
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="n")), dry_run="All")
    assert fake_kube.store.find("nodes", "n") is None


def test_concurrent_read_modify_write_is_atomic(fake_kube):  # noqa: F811
    """Many writers with optimistic concurrency: every increment lands exactly once."""
    import threading
    fake_kube.store.add(make_node("n"))
    core = client.CoreV1Api(kube_api_client(fake_kube))
    conflicts = []

    def worker():
        api = client.CoreV1Api(kube_api_client(fake_kube))
        for _ in range(10):
            while True:
                node = api.read_node("n")
                count = int((node.metadata.annotations or {}).get("count", "0"))
                node.metadata.annotations = {"count": str(count + 1)}
                try:
                    api.replace_node("n", node)
                    break
                except ApiException as exc:
                    assert exc.status == 409
                    conflicts.append(1)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert core.read_node("n").metadata.annotations["count"] == "60"


def test_bearer_token_required_when_asked():
    from autoheal_lab.fakekube import FakeKubeServer
    with FakeKubeServer(require_token=True, token="s3cret") as server:
        ok = client.CoreV1Api(kube_api_client(server))
        assert ok.list_node().items == []
        cfg = client.Configuration()
        cfg.host = server.url
        with pytest.raises(ApiException) as exc:
            client.CoreV1Api(client.ApiClient(cfg)).list_node()
        assert exc.value.status == 401


def test_event_namespace_rules(core):
    node_ref = client.V1ObjectReference(kind="Node", name="gpu-1")
    with pytest.raises(ApiException) as exc:  # a cluster-scoped object's legacy event lives in "default"
        core.create_namespaced_event("kube-system", client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="e1"), involved_object=node_ref, reason="R"))
    assert exc.value.status == 422
    assert json.loads(exc.value.body)["details"]["causes"] == [{
        "reason": "FieldValueInvalid", "message": 'Invalid value: "": does not match event.namespace',
        "field": "involvedObject.namespace"}]
    import datetime
    now = datetime.datetime.now(datetime.timezone.utc)
    ev = core.create_namespaced_event("kube-system", client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="e2"), involved_object=node_ref, reason="R", event_time=now,
        reporting_component="autoheal", reporting_instance="autoheal-0", action="Drain"))
    assert ev.event_time is not None
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_event("default", client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="e3"), involved_object=node_ref, reason="R", event_time=now))
    assert exc.value.status == 422 and "reportingComponent: Required value" in exc.value.body
