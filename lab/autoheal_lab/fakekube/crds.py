"""CustomResourceDefinitions: creating one starts serving its resource, deleting one stops it.

The fake registers each served version at once and reports the CRD Established
(the real apiextensions server takes a moment). The OpenAPI schema is not used:
no pruning, defaulting or validation of custom objects.
"""

from __future__ import annotations

from typing import Any, Dict, List

from .errors import FieldError, field_error
from .resources import ResourceType

Obj = Dict[str, Any]
CRD_KEY = "customresourcedefinitions.apiextensions.k8s.io"


def types_of(crd: Obj) -> List[ResourceType]:
    """The resource types a CRD serves (one per served version)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    out = []
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        out.append(ResourceType(
            group=spec.get("group", ""), version=version.get("name", ""), kind=names.get("kind", ""),
            plural=names.get("plural", ""), namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            short_names=tuple(names.get("shortNames") or ()), categories=tuple(names.get("categories") or ()),
            status_subresource="status" in (version.get("subresources") or {}), has_generation=True,
            allow_unconditional_update=False, custom=True))
    return out


def validate_crd(crd: Obj) -> List[FieldError]:
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    errs: List[FieldError] = []
    for path, value in (("spec.group", spec.get("group")), ("spec.names.kind", names.get("kind")),
                        ("spec.names.plural", names.get("plural"))):
        if not value:
            errs.append(field_error(path, "FieldValueRequired"))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        errs.append(field_error("spec.scope", "FieldValueNotSupported", spec.get("scope"),
                                'supported values: "Cluster", "Namespaced"'))
    versions = spec.get("versions") or []
    if not versions:
        errs.append(field_error("spec.versions", "FieldValueRequired"))
    elif sum(1 for v in versions if v.get("storage")) != 1:
        errs.append(field_error("spec.versions", "FieldValueInvalid", [v.get("name") for v in versions],
                                "must have exactly one version marked as storage version"))
    name = (crd.get("metadata") or {}).get("name", "")
    if names.get("plural") and spec.get("group") and name != f"{names['plural']}.{spec['group']}":
        errs.append(field_error("metadata.name", "FieldValueInvalid", name,
                                'must be spec.names.plural+"."+spec.group'))
    return errs


def established_status(crd: Obj, now: str) -> Obj:
    spec = crd.get("spec") or {}
    names = dict(spec.get("names") or {})
    names.setdefault("singular", names.get("kind", "").lower())
    names.setdefault("listKind", names.get("kind", "") + "List")
    old = {c.get("type"): c for c in (crd.get("status") or {}).get("conditions") or []}

    def cond(kind: str, reason: str, message: str) -> Obj:
        since = old[kind]["lastTransitionTime"] if old.get(kind, {}).get("status") == "True" else now
        return {"type": kind, "status": "True", "lastTransitionTime": since, "reason": reason, "message": message}

    return {"conditions": [cond("NamesAccepted", "NoConflicts", "no conflicts found"),
                           cond("Established", "InitialNamesAccepted", "the initial names have been accepted")],
            "acceptedNames": names,
            "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")]}
