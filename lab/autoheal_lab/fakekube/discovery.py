"""Discovery documents: /api, /api/v1, /apis, /apis/<group>[/<version>], aggregated v2, /version.

Legacy (unaggregated) discovery is always served; when a client asks for
``as=APIGroupDiscoveryList`` (kubectl 1.26+ does) the aggregated v2 form is
served instead, with the matching Content-Type.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any, Dict, List

from .resources import STATUS_VERBS, ResourceType, ResourceTypes

AGGREGATED_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
AGGREGATED_V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"

VERSION_INFO = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-fakekube",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-12-11T00:00:00Z",
    "goVersion": "go1.23.3",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def _hash(rt: ResourceType) -> str:
    digest = hashlib.sha256(f"{rt.group}/{rt.version}/{rt.kind}".encode()).digest()
    return base64.b64encode(digest[:8]).decode()


def api_resource_list(types: ResourceTypes, group: str, version: str) -> Dict[str, Any]:
    resources: List[Dict[str, Any]] = []
    for rt in types.in_group_version(group, version):
        entry: Dict[str, Any] = {"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                                 "kind": rt.kind, "verbs": list(rt.verbs)}
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        entry["storageVersionHash"] = _hash(rt)
        resources.append(entry)
        if rt.status_subresource:
            resources.append({"name": f"{rt.plural}/status", "singularName": "", "namespaced": rt.namespaced,
                              "kind": rt.kind, "verbs": list(STATUS_VERBS)})
        for sub in rt.subresources:
            item: Dict[str, Any] = {"name": f"{rt.plural}/{sub.name}", "singularName": "",
                                    "namespaced": rt.namespaced}
            if sub.group:
                item["group"] = sub.group
            if sub.version:
                item["version"] = sub.version
            item.update({"kind": sub.kind, "verbs": list(sub.verbs)})
            resources.append(item)
    out: Dict[str, Any] = {"kind": "APIResourceList"}
    if group:
        out["apiVersion"] = "v1"
    out["groupVersion"] = f"{group}/{version}" if group else version
    out["resources"] = resources
    return out


def api_versions(server_address: str) -> Dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


def api_group(types: ResourceTypes, group: str) -> Dict[str, Any]:
    versions = types.groups()[group]
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": gvs, "preferredVersion": gvs[0]}


def api_group_list(types: ResourceTypes) -> Dict[str, Any]:
    groups = []
    for group in types.groups():
        if group:
            doc = api_group(types, group)
            del doc["kind"], doc["apiVersion"]
            groups.append(doc)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _aggregated_resource(rt: ResourceType) -> Dict[str, Any]:
    kind = {"group": rt.group, "version": rt.version, "kind": rt.kind}
    out: Dict[str, Any] = {"resource": rt.plural, "responseKind": kind,
                           "scope": "Namespaced" if rt.namespaced else "Cluster",
                           "singularResource": rt.singular, "verbs": list(rt.verbs)}
    if rt.short_names:
        out["shortNames"] = list(rt.short_names)
    if rt.categories:
        out["categories"] = list(rt.categories)
    subs = []
    if rt.status_subresource:
        subs.append({"subresource": "status", "responseKind": kind, "verbs": list(STATUS_VERBS)})
    for sub in rt.subresources:
        subs.append({"subresource": sub.name,
                     "responseKind": {"group": sub.group, "version": sub.version, "kind": sub.kind},
                     "verbs": list(sub.verbs)})
    if subs:
        out["subresources"] = subs
    return out


def aggregated(types: ResourceTypes, core: bool, version: str = "v2") -> Dict[str, Any]:
    """APIGroupDiscoveryList for /api (``core``) or /apis."""
    items = []
    for group, versions in types.groups().items():
        if bool(group) == core:
            continue
        items.append({"metadata": {"name": group, "creationTimestamp": None},
                      "versions": [{"version": v,
                                    "resources": [_aggregated_resource(rt) for rt in types.in_group_version(group, v)],
                                    "freshness": "Current"} for v in versions]})
    return {"kind": "APIGroupDiscoveryList", "apiVersion": f"apidiscovery.k8s.io/{version}", "metadata": {},
            "items": items}


# -- OpenAPI v3 (only what kubectl needs to see that fieldValidation is supported) -----------------

def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def openapi_v3_root(types: ResourceTypes) -> Dict[str, Any]:
    """``/openapi/v3``: one entry per group version; the hash changes with the set of types."""
    paths = {}
    for group, versions in types.groups().items():
        for version in versions:
            names = ",".join(rt.kind for rt in types.in_group_version(group, version))
            digest = hashlib.sha256(names.encode()).hexdigest()[:16].upper()
            paths[_gv_path(group, version)] = {"serverRelativeURL": f"/openapi/v3/{_gv_path(group, version)}"
                                                                    f"?hash={digest}"}
    return {"paths": paths}


def openapi_v3_group_version(types: ResourceTypes, group: str, version: str) -> Dict[str, Any]:
    """A skeleton spec: the item paths with their PATCH operation, GVK extension and query parameters.

    There are no schemas, so kubectl validates nothing client-side and computes apply patches from
    its compiled-in types (it falls back to them when the spec has no schema for a kind).
    """
    params = [{"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
              for name in ("dryRun", "fieldManager", "fieldValidation", "force", "pretty")]
    paths: Dict[str, Any] = {}
    for rt in types.in_group_version(group, version):
        base = "/" + _gv_path(group, version)
        item = f"{base}/namespaces/{{namespace}}/{rt.plural}/{{name}}" if rt.namespaced \
            else f"{base}/{rt.plural}/{{name}}"
        gvk = {"group": group, "version": version, "kind": rt.kind}
        paths[item] = {"patch": {"operationId": f"patch{rt.kind}", "parameters": params,
                                 "responses": {"200": {"description": "OK"}},
                                 "x-kubernetes-action": "patch", "x-kubernetes-group-version-kind": gvk}}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": VERSION_INFO["gitVersion"]},
            "paths": paths, "components": {"schemas": {}}}
