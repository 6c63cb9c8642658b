"""Discovery, tables, custom resources and the wire form of served objects."""

import json
import typing
import urllib.request

import pytest
from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException

from autoheal_lab.fakekube import FakeKubeServer
from autoheal_lab.fakekube.testing import fake_kube, kube_api_client, make_node, make_pod  # noqa: F401
from autoheal_lab.fakekube.zerofill import ZERO_FIELDS


def _get(server, path, accept="application/json"):
    req = urllib.request.Request(server.url + path, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


def test_core_discovery_lists_subresources(fake_kube):  # noqa: F811
    code, _, body = _get(fake_kube, "/api")
    assert code == 200 and json.loads(body)["versions"] == ["v1"]
    doc = json.loads(_get(fake_kube, "/api/v1")[2])
    assert doc["kind"] == "APIResourceList" and doc["groupVersion"] == "v1"
    by_name = {r["name"]: r for r in doc["resources"]}
    assert by_name["nodes"]["namespaced"] is False and by_name["nodes"]["shortNames"] == ["no"]
    assert by_name["pods"]["namespaced"] is True and "watch" in by_name["pods"]["verbs"]
    assert by_name["nodes/status"]["verbs"] == ["get", "patch", "update"]
    assert by_name["pods/status"]["kind"] == "Pod"
    assert by_name["pods/eviction"] == {"name": "pods/eviction", "singularName": "", "namespaced": True,
                                        "group": "policy", "version": "v1", "kind": "Eviction",
                                        "verbs": ["create"]}


def test_group_discovery_and_aggregated_form(fake_kube):  # noqa: F811
    groups = json.loads(_get(fake_kube, "/apis")[2])
    assert groups["kind"] == "APIGroupList"
    names = {g["name"]: g for g in groups["groups"]}
    assert {"policy", "coordination.k8s.io", "apps", "autoheal.io"} <= set(names)
    assert names["autoheal.io"]["preferredVersion"]["groupVersion"] == "autoheal.io/v1alpha1"
    policy = json.loads(_get(fake_kube, "/apis/policy/v1")[2])
    assert policy["apiVersion"] == "v1" and policy["resources"][0]["name"] == "poddisruptionbudgets"
    assert json.loads(_get(fake_kube, "/apis/policy")[2])["kind"] == "APIGroup"
    accept = ("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
              "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json")
    code, ctype, body = _get(fake_kube, "/api", accept)
    assert ctype == "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    core = json.loads(body)["items"][0]
    pods = next(r for r in core["versions"][0]["resources"] if r["resource"] == "pods")
    assert {"subresource": "eviction", "responseKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "verbs": ["create"]} in pods["subresources"]
    assert _get(fake_kube, "/apis/nope/v1")[0] == 404
    assert _get(fake_kube, "/api/v1/bogus")[0] == 404


def test_version_health_and_openapi(fake_kube):  # noqa: F811
    version = client.VersionApi(kube_api_client(fake_kube)).get_code()
    assert version.major == "1" and version.minor == "32"
    for path in ("/healthz", "/readyz", "/livez"):
        assert _get(fake_kube, path)[:3:2] == (200, b"ok")
    assert _get(fake_kube, "/openapi/v2")[0] == 404  # kubectl falls back to its compiled-in types
    root = json.loads(_get(fake_kube, "/openapi/v3")[2])["paths"]
    assert set(root) >= {"api/v1", "apis/policy/v1", "apis/autoheal.io/v1alpha1"}
    spec = json.loads(_get(fake_kube, root["api/v1"]["serverRelativeURL"])[2])
    patch = spec["paths"]["/api/v1/nodes/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {"group": "", "version": "v1", "kind": "Node"}
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]  # kubectl then validates server-side


def test_node_table_for_kubectl(fake_kube):  # noqa: F811
    fake_kube.store.add(make_node("gpu-1", labels={"node-role.kubernetes.io/worker": ""}, unschedulable=True))
    fake_kube.store.add(make_node("gpu-2", ready=False))
    code, ctype, body = _get(fake_kube, "/api/v1/nodes",
                             "application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
    table = json.loads(body)
    assert ctype.startswith("application/json;as=Table")
    assert [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0] == \
        ["Name", "Status", "Roles", "Age", "Version"]
    assert [r["cells"][:3] for r in table["rows"]] == [["gpu-1", "Ready,SchedulingDisabled", "worker"],
                                                       ["gpu-2", "NotReady", "<none>"]]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    pods = json.loads(_get(fake_kube, "/api/v1/pods?includeObject=Object",
                           "application/json;as=Table;v=v1;g=meta.k8s.io")[2])
    assert pods["rows"] == [] and pods["columnDefinitions"][1]["name"] == "Ready"


def test_dynamic_client_creates_custom_resource_from_template(fake_kube):  # noqa: F811
    dyn = dynamic.DynamicClient(kube_api_client(fake_kube))
    api = dyn.resources.get(api_version="autoheal.io/v1alpha1", kind="NodeReplacement")
    assert api.namespaced and api.name == "nodereplacements"
    template = {"apiVersion": "autoheal.io/v1alpha1", "kind": "NodeReplacement",
                "metadata": {"generateName": "replace-gpu-1-"},
                "spec": {"nodeName": "gpu-1", "reason": "XID 79"}, "status": {"phase": "ignored"}}
    created = api.create(body=template, namespace="default")
    assert created.metadata.name.startswith("replace-gpu-1-")
    assert created.metadata.generation == 1 and "status" not in created.to_dict()
    listed = api.get(namespace="default")
    assert listed.kind == "NodeReplacementList" and listed.items[0].kind == "NodeReplacement"
    nodes = dyn.resources.get(api_version="v1", kind="Node")
    assert nodes.get().kind == "NodeList"


def test_custom_objects_api_semantics(fake_kube):  # noqa: F811
    co = client.CustomObjectsApi(kube_api_client(fake_kube))
    args = ("autoheal.io", "v1alpha1", "default", "nodereplacements")
    obj = co.create_namespaced_custom_object(*args, {
        "apiVersion": "autoheal.io/v1alpha1", "kind": "NodeReplacement", "metadata": {"name": "r1"},
        "spec": {"nodeName": "gpu-1"}})
    out = co.patch_namespaced_custom_object_status(*args, "r1", {"status": {"phase": "Replacing"}})
    assert out["status"] == {"phase": "Replacing"} and out["metadata"]["generation"] == 1
    out = co.patch_namespaced_custom_object(*args, "r1", {"spec": {"nodeName": "gpu-2"}})
    assert out["metadata"]["generation"] == 2 and out["status"] == {"phase": "Replacing"}
    with pytest.raises(ApiException) as exc:
        co.patch_namespaced_custom_object(*args, "r1", {"spec": {}},
                                          _content_type="application/strategic-merge-patch+json")
    assert exc.value.status == 415
    body = dict(obj.items())
    body["metadata"] = {"name": "r1"}
    with pytest.raises(ApiException) as exc:
        co.replace_namespaced_custom_object(*args, "r1", body)  # no resourceVersion on a CR: 422
    assert exc.value.status == 422
    deleted = co.delete_namespaced_custom_object(*args, "r1")
    assert deleted["status"] == "Success" and deleted["details"]["group"] == "autoheal.io"


def test_configurable_custom_resource():
    from autoheal_lab.fakekube import custom_resource
    crd = custom_resource("example.com", "v1", "GpuRepair", "gpurepairs", namespaced=False)
    with FakeKubeServer(custom_resources=[crd]) as server:
        co = client.CustomObjectsApi(kube_api_client(server))
        co.create_cluster_custom_object("example.com", "v1", "gpurepairs", {
            "apiVersion": "example.com/v1", "kind": "GpuRepair", "metadata": {"name": "x"}})
        assert co.list_cluster_custom_object("example.com", "v1", "gpurepairs")["items"][0]["metadata"]["name"] == "x"
        assert _get(server, "/apis/autoheal.io/v1alpha1")[0] == 404


def test_served_objects_carry_go_zero_values(fake_kube):  # noqa: F811
    core = client.CoreV1Api(kube_api_client(fake_kube))
    fake_kube.store.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bare"},
                         "status": {"nodeInfo": {"kubeletVersion": "v1.32.0"}}})
    node = core.read_node("bare")  # the python client insists on every nodeInfo field
    assert node.status.node_info.boot_id == "" and node.status.daemon_endpoints.kubelet_endpoint.port == 0
    pod = make_pod("p", node="bare")
    del pod["status"]["containerStatuses"][0]["imageID"]
    fake_kube.store.add(pod)
    assert core.read_namespaced_pod("p", "default").status.container_statuses[0].image_id == ""


def _required_fields(model, parts):
    """The required JSON field names of the client model found at ``parts`` below ``model``."""
    for part in parts:
        if part == "[]":
            continue
        field = next(f for name, f in model.model_fields.items() if (f.serialization_alias or name) == part)
        ann = field.annotation
        while typing.get_args(ann):
            ann = next(a for a in typing.get_args(ann) if a is not type(None))
        model = ann
    return {f.serialization_alias or name for name, f in model.model_fields.items() if f.is_required()}


@pytest.mark.parametrize("kind,model", [("Node", client.V1Node), ("Pod", client.V1Pod),
                                        ("PodDisruptionBudget", client.V1PodDisruptionBudget),
                                        ("DaemonSet", client.V1DaemonSet)])
def test_zero_fields_match_the_client_models(kind, model):
    """Drift check: at each path the fake fills, every field the client requires is filled."""
    for path, fields in ZERO_FIELDS[kind].items():
        if not path:
            continue
        parts = []
        for part in path.split("."):
            parts.extend([part[:-2], "[]"] if part.endswith("[]") else [part])
        assert _required_fields(model, parts) <= set(fields), path


def test_crd_registration_serves_and_unserves_a_resource(fake_kube):  # noqa: F811
    api_client = kube_api_client(fake_kube)
    ext = client.ApiextensionsV1Api(api_client)
    crd = ext.create_custom_resource_definition({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "rebootnodes.example.com"},
        "spec": {"group": "example.com", "scope": "Cluster",
                 "names": {"kind": "RebootNode", "plural": "rebootnodes", "shortNames": ["rbn"]},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]}})
    assert crd.metadata.name == "rebootnodes.example.com"
    established = ext.read_custom_resource_definition("rebootnodes.example.com")
    assert {c.type: c.status for c in established.status.conditions} == {"NamesAccepted": "True",
                                                                         "Established": "True"}
    assert established.status.accepted_names.list_kind == "RebootNodeList"
    co = client.CustomObjectsApi(api_client)
    co.create_cluster_custom_object("example.com", "v1", "rebootnodes", {
        "apiVersion": "example.com/v1", "kind": "RebootNode", "metadata": {"name": "gpu-1"}, "spec": {}})
    out = co.patch_cluster_custom_object_status("example.com", "v1", "rebootnodes", "gpu-1",
                                                {"status": {"phase": "Done"}})
    assert out["status"] == {"phase": "Done"}
    assert any(g["name"] == "example.com" for g in json.loads(_get(fake_kube, "/apis")[2])["groups"])
    with pytest.raises(ApiException) as exc:
        ext.create_custom_resource_definition({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "wrong"}, "spec": {"group": "example.com", "scope": "Cluster",
                                                   "names": {"kind": "X", "plural": "xs"},
                                                   "versions": [{"name": "v1", "served": True, "storage": True}]}})
    assert exc.value.status == 422
    ext.delete_custom_resource_definition("rebootnodes.example.com")
    assert _get(fake_kube, "/apis/example.com/v1/rebootnodes")[0] == 404
    assert fake_kube.store.store.items("rebootnodes.example.com") == []


def test_protobuf_bodies_of_namespaces_and_configmaps():
    from autoheal_lab.fakekube.protobuf import decode_object

    def field(number, payload):
        return bytes([number << 3 | 2, len(payload)]) + payload

    meta = field(1, b"slurm") + field(11, field(1, b"team") + field(2, b"gpu")) + field(2, b"")
    ns = b"k8s\x00" + field(1, field(1, b"v1") + field(2, b"Namespace")) + field(2, field(1, meta))
    assert decode_object(ns) == {"apiVersion": "v1", "kind": "Namespace",
                                 "metadata": {"name": "slurm", "labels": {"team": "gpu"}}}
    cm_body = field(1, field(1, b"c")) + field(2, field(1, b"k") + field(2, b"v"))
    cm = b"k8s\x00" + field(1, field(1, b"v1") + field(2, b"ConfigMap")) + field(2, cm_body)
    assert decode_object(cm)["data"] == {"k": "v"}
    pod = b"k8s\x00" + field(1, field(1, b"v1") + field(2, b"Pod")) + field(2, b"")
    assert decode_object(pod) is None
