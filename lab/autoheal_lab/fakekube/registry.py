"""REST semantics of the API server over the versioned store, without HTTP.

``Registry`` is what the HTTP handler calls and what tests use to seed and
inspect state (``FakeKubeServer.store``). Every verb raises :class:`ApiError`
exactly where the real server answers with an error ``Status``.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import random
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from . import crds, disruption, errors, strategy
from .errors import ApiError, status_object
from .patch import PatchError, apply_patch
from .resources import ResourceType, ResourceTypes
from .selectors import SelectorError, field_selector_matches, labels_of, parse_field_selector, parse_label_selector
from .store import Obj, VersionedStore, key_string, obj_key
from .validation import validate, validate_update
from .watch import Watcher
from .zerofill import fill_zero_values

Resource = Union[str, ResourceType]
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
PROTECTED_NAMESPACES = ("default", "kube-system", "kube-public")
_GENERATE_CHARS = "bcdfghjklmnpqrstvwxz2456789"
SERVER_META = ("creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds")


def rfc3339(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


class Registry:
    def __init__(self, types: ResourceTypes, store: Optional[VersionedStore] = None,
                 clock: Callable[[], float] = time.time, pod_deletion_delay: float = 0.0):
        self.types = types
        self.store = store or VersionedStore()
        self.clock = clock
        self.pod_deletion_delay = pod_deletion_delay
        self._timers: List[threading.Timer] = []
        self._crd_types: Dict[Tuple[str, str, str], ResourceType] = {}

    # -- helpers -----------------------------------------------------------------------------

    def resolve(self, resource: Resource) -> ResourceType:
        return resource if isinstance(resource, ResourceType) else self.types.lookup(resource)

    def now(self) -> str:
        return rfc3339(self.clock())

    @staticmethod
    def decorate(rt: ResourceType, obj: Obj) -> Obj:
        """The object as served: kind, apiVersion, metadata, spec, ..., status."""
        out = {"kind": rt.kind, "apiVersion": rt.api_version}
        for key in ("metadata", "spec"):
            if key in obj:
                out[key] = obj[key]
        out.update({k: v for k, v in obj.items() if k not in ("kind", "apiVersion", "status")})
        if "status" in obj:
            out["status"] = obj["status"]
        return out

    def _namespace(self, rt: ResourceType, namespace: Optional[str], body_meta: Optional[Dict] = None) -> str:
        if not rt.namespaced:
            return ""
        return namespace or (body_meta or {}).get("namespace") or "default"

    def _decode(self, rt: ResourceType, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request(f"the object provided is unrecognized (must be of type {rt.kind}): "
                                     f"{type(body).__name__}")
        kind, api_version = body.get("kind"), body.get("apiVersion")
        if rt.custom and (not kind or not api_version):
            raise errors.bad_request(f"Object 'Kind' is missing in '{json.dumps(body)[:200]}'"
                                     if not kind else "Object 'apiVersion' is missing")
        if kind and kind != rt.kind:
            raise errors.bad_request(f'{kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                                     f"no kind \"{kind}\" is registered for version \"{rt.api_version}\"")
        if api_version and api_version != rt.api_version:
            raise errors.bad_request(f"the API version in the data ({api_version}) does not match the expected "
                                     f"API version ({rt.api_version})")
        obj = copy.deepcopy(body)
        obj.pop("kind", None)
        obj.pop("apiVersion", None)
        md = obj.setdefault("metadata", {})
        if not isinstance(md, dict):
            raise errors.bad_request("metadata must be an object")
        return obj

    def _check_namespace_matches(self, rt: ResourceType, ns: str, md: Dict[str, Any]) -> None:
        if rt.namespaced and md.get("namespace") and md["namespace"] != ns:
            raise errors.bad_request("the namespace of the provided object does not match the namespace sent "
                                     "on the request")
        if rt.namespaced:
            md["namespace"] = ns
        else:
            md.pop("namespace", None)

    def _require(self, rt: ResourceType, ns: str, name: str) -> Obj:
        found = self.store.get(rt.key, ns, name)
        if found is None:
            raise errors.not_found(rt, name)
        return found

    # -- read --------------------------------------------------------------------------------

    def get(self, resource: Resource, name: str, namespace: Optional[str] = None) -> Obj:
        rt = self.resolve(resource)
        return self.decorate(rt, self._require(rt, self._namespace(rt, namespace), name))

    def find(self, resource: Resource, name: str, namespace: Optional[str] = None) -> Optional[Obj]:
        """Like ``get`` but None when missing (for tests)."""
        rt = self.resolve(resource)
        found = self.store.get(rt.key, self._namespace(rt, namespace), name)
        return self.decorate(rt, found) if found is not None else None

    def matcher(self, rt: ResourceType, namespace: Optional[str], label_selector: Optional[str],
                field_selector: Optional[str]) -> Callable[[Obj], bool]:
        try:
            labels = parse_label_selector(label_selector)
            fields = parse_field_selector(field_selector)
        except SelectorError as exc:
            raise errors.bad_request(str(exc)) from None
        supported = rt.supported_fields()
        for name, _, _ in fields:
            if name not in supported:
                raise errors.bad_request(f'field label not supported: {name}')

        def matches(obj: Obj) -> bool:
            if namespace is not None and rt.namespaced and (obj.get("metadata") or {}).get("namespace") != namespace:
                return False
            return labels.matches(labels_of(obj)) and field_selector_matches(fields, obj)
        return matches

    def list(self, resource: Resource, namespace: Optional[str] = None, label_selector: Optional[str] = None,
             field_selector: Optional[str] = None, limit: Optional[int] = None,
             continue_token: Optional[str] = None) -> Obj:
        rt = self.resolve(resource)
        ns = namespace if rt.namespaced else None
        matches = self.matcher(rt, ns, label_selector, field_selector)
        with self.store.lock:
            rv = self.store.current_rv
            items = [o for o in self.store.items(rt.key, ns) if matches(o)]
            if continue_token:
                token_rv, start = self._decode_continue(continue_token)
                if token_rv < self.store.expired_rv(rt.key):
                    raise self._continue_expired(start)
                rv = token_rv
                items = [o for o in items if key_string(obj_key(o)) >= start]
        md: Dict[str, Any] = {"resourceVersion": str(rv)}
        if limit and limit > 0 and len(items) > limit:
            remaining = len(items) - limit
            items = items[:limit]
            md["continue"] = self._encode_continue(rv, key_string(obj_key(items[-1])) + "\0")
            if not label_selector and not field_selector:
                md["remainingItemCount"] = remaining
        if rt.custom:
            items = [self.decorate(rt, o) for o in items]
        return {"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": md, "items": items}

    def items(self, resource: Resource, namespace: Optional[str] = None, label_selector: Optional[str] = None,
              field_selector: Optional[str] = None) -> List[Obj]:
        """Objects (with kind and apiVersion) matching the selectors, for tests."""
        rt = self.resolve(resource)
        listed = self.list(rt, namespace, label_selector, field_selector)
        return [self.decorate(rt, o) for o in listed["items"]]

    @staticmethod
    def _encode_continue(rv: int, start: str) -> str:
        raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}, separators=(",", ":"))
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @staticmethod
    def _decode_continue(token: str) -> Tuple[int, str]:
        try:
            padded = token + "=" * (-len(token) % 4)
            data = json.loads(base64.urlsafe_b64decode(padded.encode()))
            if data.get("v") != "meta.k8s.io/v1":
                raise ValueError("unexpected version")
            return int(data["rv"]), str(data["start"])
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise errors.bad_request(f"continue key is not valid: {exc}") from None

    def _continue_expired(self, start: str) -> ApiError:
        err = errors.expired(
            "The provided continue parameter is too old to display a consistent list result. You can start a "
            "new list without the continue parameter, or use the continue token in this response to retrieve "
            "the remainder of the results. Continuing with the provided token results in an inconsistent list "
            "- objects that were created, modified, or deleted between the time the first chunk was returned "
            "and now may show up in the list.")
        err.continue_token = self._encode_continue(-1, start)  # type: ignore[attr-defined]
        return err

    def watcher(self, resource: Resource, namespace: Optional[str] = None, label_selector: Optional[str] = None,
                field_selector: Optional[str] = None) -> Watcher:
        rt = self.resolve(resource)
        matches = self.matcher(rt, namespace if rt.namespaced else None, label_selector, field_selector)
        return Watcher(self.store, rt.key, matches, lambda o: self.decorate(rt, o),
                       {"kind": rt.kind, "apiVersion": rt.api_version}, typed=not rt.custom)

    # -- write -------------------------------------------------------------------------------

    def create(self, resource: Resource, body: Any, namespace: Optional[str] = None, dry_run: bool = False,
               keep_status: bool = False, keep_meta: bool = False) -> Obj:
        """POST. ``keep_status``/``keep_meta`` are for seeding: keep a written status, uid and timestamps."""
        rt = self.resolve(resource)
        obj = self._decode(rt, body)
        md = obj["metadata"]
        ns = self._namespace(rt, namespace, md)
        self._check_namespace_matches(rt, ns, md)
        with self.store.lock:
            if rt.namespaced and self.store.get("namespaces", "", ns) is None:
                raise errors.namespace_not_found(ns)
            if not md.get("name") and md.get("generateName"):
                md["name"] = md["generateName"] + "".join(random.choice(_GENERATE_CHARS) for _ in range(5))
            if md.get("resourceVersion") and not keep_meta:
                raise errors.ApiError(500, "", "resourceVersion should not be set on objects to be created")
            md.pop("resourceVersion", None)
            if not keep_meta:
                for key in SERVER_META + ("uid",):
                    md.pop(key, None)
            strategy.apply_defaults(rt, obj)
            strategy.prepare_for_create(rt, obj, keep_status)
            if not rt.custom:
                fill_zero_values(rt.kind, obj)
                self._normalize_times(rt, obj)
            problems = validate(rt, obj)
            if problems:
                raise errors.invalid(rt, md.get("name", ""), problems)
            if self.store.get(rt.key, ns, md["name"]) is not None:
                raise errors.already_exists(rt, md["name"])
            md.setdefault("uid", str(uuid.uuid4()))
            md.setdefault("creationTimestamp", self.now())
            if dry_run:
                return self.decorate(rt, obj)
            stored = self.store.write(rt.key, obj)
            self._after_write(rt, ns)
            return self.decorate(rt, self.store.get(rt.key, ns, md["name"]) or stored)

    def add(self, obj: Obj, keep_status: bool = True) -> Obj:
        """Seed an object from a full manifest (apiVersion and kind pick the resource)."""
        rt = self.types.by_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
        if rt is None:
            raise KeyError(f"no resource serves {obj.get('apiVersion')}/{obj.get('kind')}")
        return self.create(rt, obj, keep_status=keep_status)

    def update(self, resource: Resource, name: str, body: Any, namespace: Optional[str] = None,
               subresource: Optional[str] = None, dry_run: bool = False) -> Obj:
        rt = self.resolve(resource)
        obj = self._decode(rt, body)
        md = obj["metadata"]
        ns = self._namespace(rt, namespace, md)
        if md.get("name") and md["name"] != name:
            raise errors.bad_request(f"the name of the object ({md['name']}) does not match the name on the URL "
                                     f"({name})")
        self._check_namespace_matches(rt, ns, md)
        with self.store.lock:
            old = self._require(rt, ns, name)
            rv = md.get("resourceVersion")
            if rv:
                if rv != old["metadata"]["resourceVersion"]:
                    raise errors.conflict(rt, name)
            elif not rt.allow_unconditional_update:
                raise errors.invalid(rt, name, [errors.field_error(
                    "metadata.resourceVersion", "FieldValueInvalid", "0x0", "must be specified for an update")])
            return self._commit_update(rt, old, obj, subresource, dry_run)

    def patch(self, resource: Resource, name: str, body: Any, patch_type: str = "strategic",
              namespace: Optional[str] = None, subresource: Optional[str] = None, dry_run: bool = False) -> Obj:
        """PATCH with ``patch_type`` ``strategic``, ``merge`` or ``json``."""
        rt = self.resolve(resource)
        if patch_type == "strategic" and rt.custom:
            raise errors.unsupported_media_type("application/strategic-merge-patch+json",
                                                ["application/json-patch+json", "application/merge-patch+json"])
        ns = self._namespace(rt, namespace)
        with self.store.lock:
            old = self._require(rt, ns, name)
            try:
                patched = apply_patch(patch_type, self.decorate(rt, old), body, rt.schema())
            except PatchError as exc:
                raise self._patch_error(exc) from None
            if not isinstance(patched, dict):
                raise errors.bad_request("the patched object is not a JSON object")
            patched = self._decode(rt, patched)
            md = patched["metadata"]
            rv = md.get("resourceVersion")
            if rv and rv != old["metadata"]["resourceVersion"]:
                raise errors.conflict(rt, name)
            md["name"] = name
            self._check_namespace_matches(rt, ns, md)
            return self._commit_update(rt, old, patched, subresource, dry_run)

    @staticmethod
    def _normalize_times(rt: ResourceType, obj: Obj) -> None:
        try:
            strategy.normalize_times(obj)
        except strategy.BadTime as exc:
            raise errors.bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                                     f'{exc}') from None

    @staticmethod
    def _patch_error(exc: PatchError) -> ApiError:
        if exc.code == 422:
            return ApiError(422, "Invalid", "the server rejected our request due to an error in our request",
                            {"causes": [{"reason": "UnexpectedServerResponse", "message": str(exc)}]})
        if exc.code == 500:
            return ApiError(500, "", str(exc))
        return errors.generic(exc.code, str(exc))

    def _commit_update(self, rt: ResourceType, old: Obj, new: Obj, subresource: Optional[str],
                       dry_run: bool) -> Obj:
        old_md = old["metadata"]
        new = copy.deepcopy(new)
        strategy.apply_defaults(rt, new)
        if subresource == "status":
            merged = copy.deepcopy(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            new = merged
        else:
            if rt.status_subresource:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            md = new["metadata"]
            for key in SERVER_META:
                if key in old_md:
                    md[key] = old_md[key]
                else:
                    md.pop(key, None)
            if not md.get("uid"):
                md["uid"] = old_md.get("uid")
            if strategy.spec_changed(rt, old, new):
                md["generation"] = old_md.get("generation", 1) + 1
        if not rt.custom:
            fill_zero_values(rt.kind, new)
            self._normalize_times(rt, new)
        problems = validate_update(rt, old, new)
        if problems:
            raise errors.invalid(rt, old_md["name"], problems)
        new["metadata"]["resourceVersion"] = old_md["resourceVersion"]
        if new == old or dry_run:
            return self.decorate(rt, new)  # a no-op write keeps the resourceVersion and sends no event
        ns = old_md.get("namespace", "")
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers") \
                and not self._waiting_for_kubelet(rt, new):
            # emptying the finalizers of a deleting object deletes it: one DELETED event, no MODIFIED
            gone = self._remove(rt, new, "Background")
            return self.decorate(rt, gone)
        stored = self.store.write(rt.key, new)
        self._after_write(rt, ns)
        return self.decorate(rt, stored)

    # -- delete ------------------------------------------------------------------------------

    def delete(self, resource: Resource, name: str, namespace: Optional[str] = None,
               options: Optional[Dict[str, Any]] = None, dry_run: bool = False) -> Tuple[int, Obj]:
        """DELETE; returns (HTTP code, body): the object for pods, else a success Status."""
        rt = self.resolve(resource)
        opts = options or {}
        ns = self._namespace(rt, namespace)
        policy = opts.get("propagationPolicy") or ("Orphan" if opts.get("orphanDependents") else "Background")
        if policy not in ("Orphan", "Background", "Foreground"):
            raise errors.invalid(rt, name, [errors.field_error(
                "propagationPolicy", "FieldValueNotSupported", policy,
                'supported values: "Foreground", "Background", "Orphan", "nil"')])
        dry_run = dry_run or "All" in (opts.get("dryRun") or [])
        with self.store.lock:
            old = self._require(rt, ns, name)
            md = old["metadata"]
            pre = opts.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != md.get("uid"):
                raise errors.conflict(rt, name, f"Precondition failed: UID in precondition: {pre['uid']}, UID in "
                                                f"object meta: {md.get('uid')}")
            if pre.get("resourceVersion") and pre["resourceVersion"] != md.get("resourceVersion"):
                raise errors.conflict(rt, name, f"Precondition failed: ResourceVersion in precondition: "
                                                f"{pre['resourceVersion']}, ResourceVersion in meta: "
                                                f"{md.get('resourceVersion')}")
            if rt.plural == "namespaces" and name in PROTECTED_NAMESPACES:
                raise errors.ApiError(403, "Forbidden", f'namespaces "{name}" is forbidden: this namespace may '
                                      "not be deleted", {"name": name, "kind": "namespaces"})
            if dry_run:
                return 200, self._deleted_answer(rt, old)
            if md.get("deletionTimestamp"):
                return 200, self.decorate(rt, old)
            grace = opts.get("gracePeriodSeconds")
            if md.get("finalizers") or self._graceful_pod(rt, old, grace):
                return 200, self.decorate(rt, self._mark_deleting(rt, old, grace))
            gone = self._remove(rt, old, policy)
            return 200, self._deleted_answer(rt, gone)

    def _deleted_answer(self, rt: ResourceType, obj: Obj) -> Obj:
        if rt.return_deleted_object:
            return self.decorate(rt, obj)
        details: Dict[str, Any] = {"name": obj["metadata"]["name"]}
        if rt.group:
            details["group"] = rt.group
        details["kind"] = rt.plural
        details["uid"] = obj["metadata"].get("uid", "")
        # the real store answers with a Status that has no code (finalizeDelete)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}

    def _graceful_pod(self, rt: ResourceType, pod: Obj, grace: Optional[int]) -> bool:
        if rt.custom or rt.kind != "Pod" or self.pod_deletion_delay <= 0 or grace == 0:
            return False
        phase = (pod.get("status") or {}).get("phase")
        return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")

    def _waiting_for_kubelet(self, rt: ResourceType, obj: Obj) -> bool:
        return rt.kind == "Pod" and not rt.custom and obj["metadata"].get("deletionGracePeriodSeconds", 0) > 0

    def _mark_deleting(self, rt: ResourceType, obj: Obj, grace: Optional[int]) -> Obj:
        md = obj["metadata"]
        graceful = self._graceful_pod(rt, obj, grace)
        seconds = 0
        if graceful:
            seconds = grace if grace is not None else (obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        md["deletionTimestamp"] = rfc3339(self.clock() + seconds)
        md["deletionGracePeriodSeconds"] = seconds
        if rt.has_generation:
            md["generation"] = md.get("generation", 1) + 1
        stored = self.store.write(rt.key, obj)
        self._after_write(rt, md.get("namespace", ""))
        if graceful:
            self._schedule_kubelet_delete(rt, md.get("namespace", ""), md["name"], md["uid"])
        return stored

    def _schedule_kubelet_delete(self, rt: ResourceType, ns: str, name: str, uid: str) -> None:
        def finish() -> None:
            with self.store.lock:
                cur = self.store.get(rt.key, ns, name)
                if cur is None or cur["metadata"].get("uid") != uid or self.store.closed:
                    return
                cur["metadata"]["deletionGracePeriodSeconds"] = 0
                if cur["metadata"].get("finalizers"):
                    self.store.write(rt.key, cur)
                else:
                    self._remove(rt, cur, "Background")
        timer = threading.Timer(self.pod_deletion_delay, finish)
        timer.daemon = True
        self._timers = [t for t in self._timers if t.is_alive()] + [timer]
        timer.start()

    def _remove(self, rt: ResourceType, obj: Obj, policy: str) -> Obj:
        md = obj["metadata"]
        ns = md.get("namespace", "")
        gone = self.store.remove(rt.key, ns, md["name"])
        if gone is None:
            return obj
        if rt.plural == "namespaces" and not rt.custom:
            for other in self.types.all():
                if other.namespaced:
                    for child in self.store.items(other.key, md["name"]):
                        self.store.remove(other.key, md["name"], child["metadata"]["name"])
        elif policy != "Orphan":
            self._collect_dependents(md.get("uid"))
        self._after_write(rt, ns)
        return gone

    def _collect_dependents(self, uid: Optional[str]) -> None:
        """Garbage-collect objects owned by ``uid`` (done at once; the real collector is async)."""
        if not uid:
            return
        for rt in self.types.all():
            for obj in self.store.items(rt.key):
                refs = obj["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == uid for r in refs):
                    if obj["metadata"].get("finalizers"):
                        if not obj["metadata"].get("deletionTimestamp"):
                            self._mark_deleting(rt, obj, 0)
                    else:
                        self._remove(rt, obj, "Background")

    def delete_collection(self, resource: Resource, namespace: Optional[str] = None,
                          label_selector: Optional[str] = None, field_selector: Optional[str] = None,
                          options: Optional[Dict[str, Any]] = None, dry_run: bool = False) -> Obj:
        rt = self.resolve(resource)
        listed = self.list(rt, namespace, label_selector, field_selector)
        deleted = []
        for obj in listed["items"]:
            md = obj["metadata"]
            try:
                _, body = self.delete(rt, md["name"], md.get("namespace"), options, dry_run)
            except ApiError:
                continue
            deleted.append({k: v for k, v in body.items() if k not in ("kind", "apiVersion")}
                           if body.get("kind") == rt.kind else obj)
        return {"kind": rt.list_kind, "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": str(self.store.current_rv)}, "items": deleted}

    # -- eviction ----------------------------------------------------------------------------

    def evict(self, name: str, namespace: str, body: Optional[Dict[str, Any]] = None,
              dry_run: bool = False) -> Obj:
        """POST pods/{name}/eviction; returns the 201 success Status or raises (404, 429, 500...)."""
        pods = self.types.by_url("", "v1", "pods")
        assert pods is not None
        body = body if body is not None else {"metadata": {"name": name, "namespace": namespace}}
        if not isinstance(body, dict):
            raise errors.bad_request("not a Eviction object")
        if body.get("kind") not in (None, "Eviction"):
            raise errors.bad_request(f"not a Eviction object: {body.get('kind')}")
        if (body.get("metadata") or {}).get("name") != name:
            raise errors.bad_request("name in URL does not match name in Eviction object")
        options = dict(body.get("deleteOptions") or {})
        dry_run = dry_run or "All" in (options.get("dryRun") or [])
        options.pop("dryRun", None)
        with self.store.lock:
            pod = self._require(pods, namespace, name)
            if not disruption.can_ignore_pdb(pod):
                pdb_type = self.types.by_url("policy", "v1", "poddisruptionbudgets")
                assert pdb_type is not None
                pdb = disruption.check_eviction(pod, self.store.items(pdb_type.key, namespace))
                if pdb is not None and not dry_run:
                    status = pdb.setdefault("status", {})
                    status["disruptionsAllowed"] = status.get("disruptionsAllowed", 0) - 1
                    status.setdefault("disruptedPods", {})[name] = self.now()
                    self.store.write(pdb_type.key, pdb)
            if not dry_run:
                self.delete(pods, name, namespace, options)
        return status_object("Success", 201)

    # -- controllers -------------------------------------------------------------------------

    def _after_write(self, rt: ResourceType, namespace: str) -> None:
        """Run the controllers the fake simulates synchronously: disruption and CRD establishing."""
        if rt.key == crds.CRD_KEY:
            self._sync_crds()
        elif not rt.custom and rt.kind in ("Pod", "PodDisruptionBudget") and namespace:
            self._sync_pdbs(namespace)

    def _sync_pdbs(self, namespace: str) -> None:
        pdb_type = self.types.by_url("policy", "v1", "poddisruptionbudgets")
        pod_type = self.types.by_url("", "v1", "pods")
        if pdb_type is None or pod_type is None:
            return
        pdbs = self.store.items(pdb_type.key, namespace)
        if not pdbs:  # no budget to keep current: do not copy every pod of the namespace on each pod write
            return
        pods = self.store.items(pod_type.key, namespace)
        for pdb in pdbs:
            status = disruption.compute_status(pdb, pods, self.now())
            if status != pdb.get("status"):
                pdb["status"] = status
                self.store.write(pdb_type.key, pdb)

    def _sync_crds(self) -> None:
        """Serve what the stored CRDs define; stop serving (and drop the objects of) deleted ones."""
        wanted: Dict[Tuple[str, str, str], ResourceType] = {}
        for crd in self.store.items(crds.CRD_KEY):
            if crd["metadata"].get("deletionTimestamp"):
                continue
            for rt in crds.types_of(crd):
                wanted[(rt.group, rt.version, rt.plural)] = rt
            status = crds.established_status(crd, self.now())
            if status != crd.get("status"):
                crd["status"] = status
                self.store.write(crds.CRD_KEY, crd)
        for key, rt in list(self._crd_types.items()):
            if key not in wanted:
                self.types.remove(rt)
                if not any(t.key == rt.key for t in self.types.all()):
                    for obj in self.store.items(rt.key):
                        self.store.remove(rt.key, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        for rt in wanted.values():
            self.types.add(rt)
        self._crd_types = wanted

    # -- lifecycle ---------------------------------------------------------------------------

    def seed_namespaces(self) -> None:
        for ns in DEFAULT_NAMESPACES:
            if self.store.get("namespaces", "", ns) is None:
                self.create("namespaces", {"metadata": {"name": ns}})

    def reset(self) -> None:
        """Drop every object (watch history too) and recreate the default namespaces."""
        self.store.clear()
        self._sync_crds()
        self.seed_namespaces()

    def dump(self) -> List[Obj]:
        """Every object with kind and apiVersion, namespaces first (for the state file)."""
        out: List[Obj] = []
        for rt in sorted(self.types.all(), key=lambda t: t.plural != "namespaces"):
            out.extend(self.decorate(rt, o) for o in self.store.items(rt.key))
        return out

    def load(self, objects: List[Obj]) -> None:
        """Create saved objects (keeping uid, timestamps and status). Afterwards every older
        resourceVersion is compacted away: a client still holding one gets 410 and relists."""
        for obj in objects:
            rt = self.types.by_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
            if rt is None:
                continue
            md = obj.get("metadata") or {}
            if self.store.get(rt.key, md.get("namespace", "") if rt.namespaced else "", md.get("name", "")):
                continue
            self.create(rt, obj, keep_status=True, keep_meta=True)
        self.store.compact()

    def cancel_timers(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers = []
