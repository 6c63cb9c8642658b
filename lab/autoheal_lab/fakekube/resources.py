"""Resource types the fake API server serves, as the real kube-apiserver declares them.

Each :class:`ResourceType` carries what the generic machinery needs: URL names,
scope, discovery data, the storage strategy knobs (status subresource,
generation, whether DELETE answers with the object) and the strategic merge
patch schema (which lists merge by which key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, Mapping, Optional, Tuple

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
STATUS_VERBS = ("get", "patch", "update")

# Strategic merge patch schema values (see patch.strategic_merge_patch).
PRIMITIVE = "primitive"  # list of scalars merged as a set (patchStrategy:"merge" on []string)
REPLACE = "replace"  # map replaced whole (patchStrategy:"replace")


def merge_key(name: str) -> str:
    """Schema value for a list of maps merged by ``name`` (patchStrategy:"merge" patchMergeKey)."""
    return "key:" + name


OBJECT_META_SCHEMA = {
    "metadata.ownerReferences": merge_key("uid"),
    "metadata.finalizers": PRIMITIVE,
}


def _container_schema(prefix: str) -> Dict[str, str]:
    out = {}
    for c in ("containers", "initContainers", "ephemeralContainers"):
        base = f"{prefix}.{c}"
        out[base] = merge_key("name")
        out[base + ".env"] = merge_key("name")
        out[base + ".ports"] = merge_key("containerPort")
        out[base + ".volumeMounts"] = merge_key("mountPath")
        out[base + ".volumeDevices"] = merge_key("devicePath")
        out[base + ".resizePolicy"] = "atomic"
    return out


def pod_spec_schema(prefix: str) -> Dict[str, str]:
    """SMP schema of a PodSpec found at ``prefix`` (``spec`` or ``spec.template.spec``)."""
    out = _container_schema(prefix)
    out[f"{prefix}.volumes"] = merge_key("name")
    out[f"{prefix}.imagePullSecrets"] = merge_key("name")
    out[f"{prefix}.hostAliases"] = merge_key("ip")
    out[f"{prefix}.resourceClaims"] = merge_key("name")
    out[f"{prefix}.schedulingGates"] = merge_key("name")
    return out


@dataclass(frozen=True)
class Subresource:
    """An extra subresource listed in discovery (``pods/eviction``)."""

    name: str
    kind: str
    verbs: Tuple[str, ...]
    group: str = ""
    version: str = ""


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    short_names: Tuple[str, ...] = ()
    categories: Tuple[str, ...] = ()
    status_subresource: bool = False
    has_generation: bool = False
    return_deleted_object: bool = False
    allow_unconditional_update: bool = True
    custom: bool = False  # served like a CRD: no strategic merge patch, unstructured lists
    smp_schema: Mapping[str, str] = field(default_factory=dict)
    field_selectors: Tuple[str, ...] = ()
    subresources: Tuple[Subresource, ...] = ()
    verbs: Tuple[str, ...] = ALL_VERBS

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> str:
        return self.api_version

    @property
    def key(self) -> str:
        """The qualified resource name, ``pods`` or ``leases.coordination.k8s.io``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    @property
    def qualified_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def supported_fields(self) -> Tuple[str, ...]:
        base = ("metadata.name", "metadata.namespace") if self.namespaced else ("metadata.name",)
        return base + self.field_selectors

    def schema(self) -> Mapping[str, str]:
        merged = dict(OBJECT_META_SCHEMA)
        merged.update(self.smp_schema)
        return merged


def custom_resource(group: str, version: str, kind: str, plural: str, namespaced: bool = True,
                    short_names: Iterable[str] = (), status_subresource: bool = True) -> ResourceType:
    """A resource served the way the apiextensions server serves a CRD's version."""
    return ResourceType(group=group, version=version, kind=kind, plural=plural, namespaced=namespaced,
                        short_names=tuple(short_names), status_subresource=status_subresource,
                        has_generation=True, allow_unconditional_update=False, custom=True,
                        categories=())


NODE_REPLACEMENT = custom_resource("autoheal.io", "v1alpha1", "NodeReplacement", "nodereplacements",
                                   short_names=("nrep",))

_POD_FIELDS = ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
               "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName")
_EVENT_FIELDS = ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                 "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                 "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type")


def _workload(kind: str, plural: str, short: str) -> ResourceType:
    schema = pod_spec_schema("spec.template.spec")
    schema["status.conditions"] = merge_key("type")
    return ResourceType("apps", "v1", kind, plural, True, short_names=(short,), categories=("all",),
                        status_subresource=True, has_generation=True, smp_schema=schema)


def builtin_types() -> Tuple[ResourceType, ...]:
    pod_schema = pod_spec_schema("spec")
    pod_schema.update({
        "status.conditions": merge_key("type"),
        "status.podIPs": merge_key("ip"),
        "status.hostIPs": merge_key("ip"),
        "status.resourceClaimStatuses": merge_key("name"),
    })
    return (
        ResourceType("", "v1", "Namespace", "namespaces", False, short_names=("ns",),
                     status_subresource=True, field_selectors=("status.phase",)),
        ResourceType("", "v1", "Node", "nodes", False, short_names=("no",), status_subresource=True,
                     field_selectors=("spec.unschedulable",),
                     smp_schema={"spec.podCIDRs": PRIMITIVE,
                                 "status.conditions": merge_key("type"),
                                 "status.addresses": merge_key("type")}),
        ResourceType("", "v1", "Pod", "pods", True, short_names=("po",), categories=("all",),
                     status_subresource=True, return_deleted_object=True, smp_schema=pod_schema,
                     field_selectors=_POD_FIELDS,
                     subresources=(Subresource("eviction", "Eviction", ("create",), "policy", "v1"),)),
        ResourceType("", "v1", "Event", "events", True, short_names=("ev",), field_selectors=_EVENT_FIELDS),
        ResourceType("", "v1", "ConfigMap", "configmaps", True, short_names=("cm",)),
        ResourceType("", "v1", "Secret", "secrets", True, field_selectors=("type",)),
        ResourceType("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", True,
                     short_names=("pdb",), status_subresource=True, has_generation=True,
                     smp_schema={"spec.selector": REPLACE, "status.conditions": merge_key("type")}),
        ResourceType("coordination.k8s.io", "v1", "Lease", "leases", True),
        _workload("DaemonSet", "daemonsets", "ds"),
        _workload("Deployment", "deployments", "deploy"),
        _workload("ReplicaSet", "replicasets", "rs"),
        # stored only (no controllers, no RBAC enforcement): enough to apply deploy manifests
        ResourceType("", "v1", "ServiceAccount", "serviceaccounts", True, short_names=("sa",)),
        ResourceType("", "v1", "Service", "services", True, short_names=("svc",), categories=("all",),
                     status_subresource=True, return_deleted_object=True,
                     smp_schema={"spec.ports": merge_key("port")}),
        ResourceType("rbac.authorization.k8s.io", "v1", "Role", "roles", True),
        ResourceType("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True),
        ResourceType("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
        ResourceType("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False),
        ResourceType("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False,
                     short_names=("crd", "crds"), status_subresource=True, has_generation=True),
    )


class ResourceTypes:
    """The set of served resource types, looked up by URL parts or by apiVersion/kind."""

    def __init__(self, types: Iterable[ResourceType]):
        self._types: Dict[Tuple[str, str, str], ResourceType] = {}
        for rt in types:
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        types = dict(self._types)  # copy-on-write: readers never see a dict being resized
        types[(rt.group, rt.version, rt.plural)] = rt
        self._types = types

    def remove(self, rt: ResourceType) -> None:
        types = dict(self._types)
        types.pop((rt.group, rt.version, rt.plural), None)
        self._types = types

    def all(self) -> Tuple[ResourceType, ...]:
        return tuple(self._types.values())

    def by_url(self, group: str, version: str, plural: str) -> Optional[ResourceType]:
        return self._types.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> Optional[ResourceType]:
        for rt in self._types.values():
            if rt.api_version == api_version and rt.kind == kind:
                return rt
        return None

    def lookup(self, name: str) -> ResourceType:
        """Find a type by plural, kind, short name or ``plural.group`` (for tests and tools)."""
        if isinstance(name, ResourceType):
            return name
        wanted = name.lower()
        for rt in self._types.values():
            names = {rt.plural, rt.singular, rt.kind.lower(), rt.key, *rt.short_names}
            if wanted in names:
                return rt
        raise KeyError(f"unknown resource {name!r}")

    def groups(self) -> Dict[str, Tuple[str, ...]]:
        """Group name -> versions, in first-registered order; core group is ``""``."""
        out: Dict[str, list] = {}
        for rt in self._types.values():
            versions = out.setdefault(rt.group, [])
            if rt.version not in versions:
                versions.append(rt.version)
        return {g: tuple(v) for g, v in out.items()}

    def in_group_version(self, group: str, version: str) -> Tuple[ResourceType, ...]:
        return tuple(rt for rt in self._types.values() if rt.group == group and rt.version == version)
