"""Validation the real server applies to the objects we serve (the subset tests can trip on).

Each check returns field errors worded as in k8s.io/apimachinery ``field.ErrorList``;
the registry turns a non-empty list into a 422 Invalid ``Status``.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from .crds import validate_crd
from .errors import FieldError, field_error
from .resources import ResourceType
from .selectors import label_key_problem, label_value_problem

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
                 "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
                 "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
             "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
             "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
POD_UPDATE_FORBIDDEN = (
    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,"
    "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)")


def name_problem(rt: ResourceType, name: str) -> Optional[str]:
    if rt.plural == "namespaces":
        if len(name) > 63 or not _DNS1123_LABEL.match(name):
            return LABEL_MSG
        return None
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        return SUBDOMAIN_MSG
    return None


def validate_metadata(rt: ResourceType, obj: Dict[str, Any]) -> List[FieldError]:
    errs: List[FieldError] = []
    md = obj.get("metadata") or {}
    name = md.get("name", "")
    if not name:
        errs.append(field_error("metadata.name", "FieldValueRequired", detail="name or generateName is required"))
    else:
        problem = name_problem(rt, name)
        if problem:
            errs.append(field_error("metadata.name", "FieldValueInvalid", name, problem))
    for key, value in (md.get("labels") or {}).items():
        problem = label_key_problem(key)
        if problem:
            errs.append(field_error("metadata.labels", "FieldValueInvalid", key, problem))
        elif not isinstance(value, str) or label_value_problem(value):
            errs.append(field_error("metadata.labels", "FieldValueInvalid", value,
                                    label_value_problem(str(value)) or "must be a string"))
    for key in (md.get("annotations") or {}):
        problem = label_key_problem(key)
        if problem:
            errs.append(field_error("metadata.annotations", "FieldValueInvalid", key, problem))
    return errs


def _validate_pod(obj: Dict[str, Any]) -> List[FieldError]:
    errs: List[FieldError] = []
    containers = (obj.get("spec") or {}).get("containers")
    if not containers:
        return [field_error("spec.containers", "FieldValueRequired")]
    seen = set()
    for i, c in enumerate(containers):
        if not isinstance(c, dict):
            errs.append(field_error(f"spec.containers[{i}]", "FieldValueInvalid", c, "must be an object"))
            continue
        if not c.get("name"):
            errs.append(field_error(f"spec.containers[{i}].name", "FieldValueRequired"))
        elif c["name"] in seen:
            errs.append(field_error(f"spec.containers[{i}].name", "FieldValueDuplicate", c["name"]))
        seen.add(c.get("name"))
        if not c.get("image"):
            errs.append(field_error(f"spec.containers[{i}].image", "FieldValueRequired"))
    return errs


def _validate_node(obj: Dict[str, Any]) -> List[FieldError]:
    errs: List[FieldError] = []
    seen = set()
    for i, taint in enumerate((obj.get("spec") or {}).get("taints") or []):
        key, effect = taint.get("key", ""), taint.get("effect", "")
        if not key:
            errs.append(field_error(f"spec.taints[{i}].key", "FieldValueRequired"))
        elif label_key_problem(key):
            errs.append(field_error(f"spec.taints[{i}].key", "FieldValueInvalid", key, label_key_problem(key)))
        if taint.get("value") and label_value_problem(str(taint["value"])):
            errs.append(field_error(f"spec.taints[{i}].value", "FieldValueInvalid", taint["value"],
                                    label_value_problem(str(taint["value"]))))
        if not effect:
            errs.append(field_error(f"spec.taints[{i}].effect", "FieldValueRequired"))
        elif effect not in TAINT_EFFECTS:
            errs.append(field_error(f"spec.taints[{i}].effect", "FieldValueNotSupported", effect,
                                    "supported values: " + ", ".join(f'"{e}"' for e in TAINT_EFFECTS)))
        if (key, effect) in seen:
            errs.append(field_error(f"spec.taints[{i}]", "FieldValueDuplicate", taint,
                                    "taints must be unique by key and effect pair"))
        seen.add((key, effect))
    return errs


def _validate_pdb(obj: Dict[str, Any]) -> List[FieldError]:
    spec = obj.get("spec") or {}
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        return [field_error("spec", "FieldValueInvalid", spec, "minAvailable and maxUnavailable cannot be both set")]
    errs = []
    for name in ("minAvailable", "maxUnavailable"):
        value = spec.get(name)
        if isinstance(value, int) and value < 0:
            errs.append(field_error(f"spec.{name}", "FieldValueInvalid", value,
                                    "must be greater than or equal to 0"))
        elif isinstance(value, str) and not re.fullmatch(r"\d+%", value):
            errs.append(field_error(f"spec.{name}", "FieldValueInvalid", value,
                                    "a valid percent string must be a numeric string followed by an ending '%' "
                                    "(e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')"))
    return errs


def _validate_lease(obj: Dict[str, Any]) -> List[FieldError]:
    duration = (obj.get("spec") or {}).get("leaseDurationSeconds")
    if duration is not None and (not isinstance(duration, int) or duration <= 0):
        return [field_error("spec.leaseDurationSeconds", "FieldValueInvalid", duration, "must be greater than 0")]
    return []


def _validate_event(obj: Dict[str, Any]) -> List[FieldError]:
    """core/v1 Events: the involvedObject namespace rules and, for "new" events (eventTime set),
    the reporting fields (pkg/apis/core/validation/events.go, legacyValidateEvent)."""
    errs: List[FieldError] = []
    ns = (obj.get("metadata") or {}).get("namespace", "")
    involved_ns = (obj.get("involvedObject") or {}).get("namespace", "")
    mismatch = field_error("involvedObject.namespace", "FieldValueInvalid", involved_ns,
                           "does not match event.namespace")
    if not obj.get("eventTime"):
        if (not involved_ns and ns not in ("", "default")) or (involved_ns and involved_ns != ns):
            errs.append(mismatch)
        return errs
    if not involved_ns and ns not in ("default", "kube-system"):
        errs.append(mismatch)
    for name in ("reportingComponent", "reportingInstance", "action", "reason"):
        if not obj.get(name):
            errs.append(field_error(name, "FieldValueRequired"))
    return errs


_BY_KIND = {"Pod": _validate_pod, "Node": _validate_node, "PodDisruptionBudget": _validate_pdb,
            "Lease": _validate_lease, "CustomResourceDefinition": validate_crd, "Event": _validate_event}


def validate(rt: ResourceType, obj: Dict[str, Any]) -> List[FieldError]:
    check = _BY_KIND.get(rt.kind) if not rt.custom else None
    return validate_metadata(rt, obj) + (check(obj) if check else [])


def _without_mutable_pod_fields(spec: Dict[str, Any]) -> Dict[str, Any]:
    spec = dict(spec)
    for key in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"):
        spec.pop(key, None)
    for key in ("containers", "initContainers"):
        if isinstance(spec.get(key), list):
            spec[key] = [{k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c
                         for c in spec[key]]
    return spec


def validate_update(rt: ResourceType, old: Dict[str, Any], new: Dict[str, Any]) -> List[FieldError]:
    errs = validate(rt, new)
    old_uid = (old.get("metadata") or {}).get("uid")
    new_uid = (new.get("metadata") or {}).get("uid")
    if new_uid and old_uid and new_uid != old_uid:
        errs.append(field_error("metadata.uid", "FieldValueInvalid", new_uid, "field is immutable"))
    if rt.kind == "Pod" and not rt.custom:
        old_spec = _without_mutable_pod_fields(old.get("spec") or {})
        new_spec = _without_mutable_pod_fields(new.get("spec") or {})
        if old_spec != new_spec:
            errs.append(field_error("spec", "FieldValueForbidden", detail=POD_UPDATE_FORBIDDEN))
    return errs
