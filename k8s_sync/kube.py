"""The narrow Kubernetes adapter: every API call ``autoheal sync`` makes, and nothing else.

Objects travel as plain dicts in the API's JSON form (we ask the client for the raw response and
``json.loads`` it: no model classes, which is both faster at 10,000 nodes and what the pure planner
takes). The official ``kubernetes`` client is imported lazily, so ``autoheal --help`` stays fast.

Each method declares the RBAC permission it needs (``@needs``); ``autoheal.k8s_sync.rbac`` says which
methods each feature calls, where and on which named objects, and the tests check the chart renders
exactly those grants for each feature setting (``REQUIRED_PERMISSIONS``: the union over every method).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, Set, Tuple, TypeVar
from urllib.parse import quote

from autoheal.errors import AutohealError

#: Objects per page of a list (client-go's reflector pages by 500 too).
LIST_PAGE = 500
Transform = Callable[[Dict[str, Any]], Dict[str, Any]]
#: (apiGroup, resource, verb) -> True for every call the adapter can make.
REQUIRED_PERMISSIONS: Set[Tuple[str, str, str]] = set()
F = TypeVar("F", bound=Callable[..., Any])


def needs(*perms: Tuple[str, str, str]) -> Callable[[F], F]:
    """Declare the RBAC permissions a method uses (collected into REQUIRED_PERMISSIONS)."""
    def deco(fn: F) -> F:
        REQUIRED_PERMISSIONS.update(perms)
        fn.rbac = perms  # type: ignore[attr-defined]
        return fn
    return deco


class KubeError(AutohealError):
    """A Kubernetes API call failed; ``status`` is the HTTP code (0: no answer)."""

    def __init__(self, message: str, status: int = 0, retry_after: Optional[float] = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class Conflict(KubeError):
    """409: the object changed since we read it (or already exists)."""


class Gone(KubeError):
    """410: the resourceVersion we watch from is too old; relist."""


class NotFound(KubeError):
    """404."""


def _classify(exc: Exception, what: str) -> KubeError:
    status = int(getattr(exc, "status", 0) or 0)
    body = getattr(exc, "body", None) or ""
    message = ""
    try:
        message = json.loads(body).get("message", "") if body else ""
    except (ValueError, AttributeError):
        message = str(body)[:200]
    retry_after = None
    headers = getattr(exc, "headers", None) or {}
    try:
        if headers.get("Retry-After"):
            retry_after = float(headers["Retry-After"])
    except (TypeError, ValueError):
        retry_after = None
    text = f"{what}: HTTP {status}" + (f": {message}" if message else "") if status else \
        f"{what}: {type(exc).__name__}: {str(exc)[:200]}"
    cls = {409: Conflict, 410: Gone, 404: NotFound}.get(status, KubeError)
    return cls(text, status, retry_after)


def _drop_managed_fields(obj: Any) -> None:
    """Forget ``metadata.managedFields`` (server-side apply's bookkeeping, which the sync never reads): a
    real API server puts one entry per writer on every object, a third of a slurmd pod's JSON, and the
    watch caches hold 10,000 Nodes and 10,000 pods (controller-runtime strips it the same way,
    ``cache.TransformStripManagedFields``)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict):
        meta.pop("managedFields", None)


def load_client_config(kubeconfig: Optional[str] = None, in_cluster: bool = False) -> Any:
    """A kubernetes.client.Configuration from the pod's ServiceAccount or a kubeconfig file."""
    try:
        from kubernetes import client
        from kubernetes import config as kconfig
    except ImportError:  # pragma: no cover - the k8s extra is missing
        raise AutohealError("autoheal sync needs the kubernetes client: pip install 'slurm-autoheal[k8s]'") from None
    cfg = client.Configuration()
    try:
        if in_cluster:
            kconfig.load_incluster_config(client_configuration=cfg)
        else:
            kconfig.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    except Exception as exc:  # the loaders raise ConfigException, FileNotFoundError, TypeError...
        src = "in-cluster ServiceAccount" if in_cluster else (kubeconfig or "$KUBECONFIG / ~/.kube/config")
        raise AutohealError(f"cannot load Kubernetes credentials from {src}: {exc}") from None
    return cfg


#: How often (seconds) the client's credential refresh hook may run: at most once a second, not per request.
REFRESH_EVERY = 1.0


def throttled_refresh(hook: Callable[[Any], None], every: float = REFRESH_EVERY,
                      clock: Callable[[], float] = time.monotonic) -> Callable[[Any], None]:
    """``hook`` (the client's ``refresh_api_key_hook``), run at most once per ``every`` seconds.

    The kubeconfig and in-cluster loaders install a hook that the client calls before *every* request;
    it checks whether the token expired and then writes the whole configuration back, and setting
    ``host`` re-reads the proxy settings from the environment (``urllib.request.getproxies``): some 0.5 ms
    of the sync's CPU per write, a quarter of it (measured with cProfile at 2,000 Nodes, 2026-12-02). The
    hook still runs, so an expiring token (exec plugin, OIDC, the in-cluster token re-read every minute)
    is refreshed at most ``every`` seconds later than before; the calls are serialised, which the hook's
    unlocked writes to the shared configuration need anyway with the write pool's threads."""
    lock = threading.Lock()
    last = [float("-inf")]
    inner = [hook]

    def refresh(configuration: Any) -> None:
        with lock:
            now = clock()
            if now - last[0] < every:
                return
            inner[0](configuration)
            last[0] = now  # after the hook: one that raised is tried again on the next request
            # the loaders' hook installs itself again each time it runs: keep it behind this one
            again = getattr(configuration, "refresh_api_key_hook", None)
            if again is not refresh and again is not None:
                inner[0] = again
                configuration.refresh_api_key_hook = refresh
    return refresh


_PATCH_TYPES = {"strategic": "application/strategic-merge-patch+json", "merge": "application/merge-patch+json",
                "json": "application/json-patch+json"}


class KubeClient(Protocol):
    """What the sync engine, the leader election and the informers use of Kubernetes: ``KubeApi`` (the
    real API server) and ``autoheal_lab.testing.kube.MemoryKube`` (tests, benches) both provide it.
    Objects are plain dicts as the API serves them; errors are ``KubeError`` and its subclasses."""

    def list_nodes(self, transform: Optional[Transform] = None) -> Tuple[Dict[str, Dict[str, Any]], str]: ...
    def list_pods(self, namespace: str, selector: str,
                  transform: Optional[Transform] = None) -> Tuple[Dict[str, Dict[str, Any]], str]: ...
    def watch_nodes(self, resource_version: str, timeout: int) -> Iterator[Tuple[str, Dict[str, Any]]]: ...
    def watch_pods(self, namespace: str, selector: str, resource_version: str,
                   timeout: int) -> Iterator[Tuple[str, Dict[str, Any]]]: ...
    def patch_node(self, name: str, body: Dict[str, Any], patch_type: str = ...) -> Dict[str, Any]: ...
    def patch_node_status(self, name: str, body: Dict[str, Any], patch_type: str = ...) -> Dict[str, Any]: ...
    def patch_pod_status(self, namespace: str, name: str, body: Dict[str, Any],
                         patch_type: str = ...) -> Dict[str, Any]: ...
    def create_event(self, namespace: str, node: Dict[str, Any], reason: str, message: str,
                     etype: str = ..., now: str = ..., kind: str = ...) -> Dict[str, Any]: ...
    def list_node_pods(self, node: str) -> List[Dict[str, Any]]: ...
    def evict_pod(self, namespace: str, name: str) -> None: ...
    def delete_node(self, name: str) -> None: ...
    def create_custom(self, group: str, version: str, namespace: str, plural: str,
                      body: Dict[str, Any]) -> Dict[str, Any]: ...
    def delete_custom(self, group: str, version: str, namespace: str, plural: str, name: str) -> None: ...
    def list_custom(self, group: str, version: str, namespace: str, plural: str) -> Dict[str, Dict[str, Any]]: ...
    def get_configmap(self, namespace: str, name: str) -> Optional[Dict[str, Any]]: ...
    def create_configmap(self, namespace: str, body: Dict[str, Any]) -> Dict[str, Any]: ...
    def patch_configmap(self, namespace: str, name: str, body: Dict[str, Any]) -> Dict[str, Any]: ...
    def get_lease(self, namespace: str, name: str) -> Optional[Dict[str, Any]]: ...
    def create_lease(self, namespace: str, body: Dict[str, Any]) -> Dict[str, Any]: ...
    def replace_lease(self, namespace: str, name: str, body: Dict[str, Any]) -> Dict[str, Any]: ...


class KubeApi:
    """The real adapter, over the official client."""

    def __init__(self, client_config: Any, timeout: float = 10.0, connections: int = 0) -> None:
        """``connections``: requests this client may have open at once (the engine's write pool, two
        watches, the Lease): the connection pool keeps that many, so no request pays a new TLS handshake
        (urllib3 discards connections beyond its pool size, ``cpu_count() * 5`` by default)."""
        from kubernetes import client

        self._client_mod = client
        if connections > (client_config.connection_pool_maxsize or 0):
            client_config.connection_pool_maxsize = connections
        if client_config.refresh_api_key_hook is not None:
            client_config.refresh_api_key_hook = throttled_refresh(client_config.refresh_api_key_hook)
        self.api_client = client.ApiClient(client_config)
        self.core = client.CoreV1Api(self.api_client)
        self.coord = client.CoordinationV1Api(self.api_client)
        self.timeout = timeout
        import urllib3

        self._urllib3_timeout = urllib3.Timeout(total=timeout)  # what the client makes of _request_timeout
        self.calls: Dict[str, int] = {}  # method -> count, for metrics and tests
        self._calls_lock = threading.Lock()  # the write pool's threads count too

    @classmethod
    def from_settings(cls, kubeconfig: Optional[str] = None, in_cluster: bool = False,
                      timeout: float = 10.0, connections: int = 0) -> KubeApi:
        return cls(load_client_config(kubeconfig, in_cluster), timeout, connections)

    def _count(self, what: str) -> None:
        with self._calls_lock:
            self.calls[what] = self.calls.get(what, 0) + 1

    # ---- plumbing --------------------------------------------------------------------------------
    def _raw(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Dict[str, Any]:
        self._count(what)
        kwargs.setdefault("_request_timeout", self.timeout)
        try:
            resp = fn(*args, _preload_content=False, **kwargs)
            data = resp.data
        except Exception as exc:  # ApiException, urllib3 errors, timeouts: all become KubeError
            raise _classify(exc, what) from None
        try:
            obj: Dict[str, Any] = json.loads(data) if data else {}  # the API answers with an object
        except ValueError:
            raise KubeError(f"{what}: answer is not JSON") from None
        _drop_managed_fields(obj)
        for item in obj.get("items") or ():
            _drop_managed_fields(item)
        return obj

    def _send_json(self, method: str, path: str, body: Dict[str, Any], _preload_content: bool = False,
                   _request_timeout: Any = None) -> Any:
        """``body`` sent as the JSON it is, past the client's model classes (what ``_raw`` calls instead of a
        generated method). The generated methods of client 37 validate a dict body into its model, which
        turns a MicroTime string into a datetime and writes it back with ``isoformat()``: without its
        fraction when the microseconds are 0 (``...:00+00:00``), which the real API server refuses (400:
        MicroTime is RFC 3339 with exactly 6 digits). The Lease's renewTime/acquireTime are ours to word."""
        from kubernetes.client.exceptions import ApiException

        params = self.api_client.param_serialize(
            method=method, resource_path=path, body=body, auth_settings=["BearerToken"],
            header_params={"Accept": "application/json", "Content-Type": "application/json"})
        resp = self.api_client.call_api(*params, _request_timeout=_request_timeout)
        if not 200 <= resp.status <= 299:
            resp.read()
            raise ApiException.from_response(http_resp=resp, body=None, data=None)
        return resp.response

    def _patch(self, what: str, fn: Callable[..., Any], *args: Any, body: Any, patch_type: str) -> Dict[str, Any]:
        return self._raw(what, fn, *args, body=body, _content_type=_PATCH_TYPES[patch_type])

    def _write(self, what: str, method: str, path: str, body: Dict[str, Any], content_type: str) -> Dict[str, Any]:
        """One write of the mirror's hot path (pod and Node patches, Events), sent on the client's own
        connection pool, TLS settings and credentials, past its generated method: that one validates every
        argument (pydantic), walks the body to sanitize it and rebuilds the headers, some 0.3 ms of the
        sync's CPU per request, a quarter of it (1.37 -> 1.03 ms per pod status patch, measured against
        kube-apiserver 1.37 on 2026-12-02), and a 1,000-node drain is 4,000 such requests. The answer is
        read as ``_raw`` reads it; errors are classified as ``_raw``'s."""
        from kubernetes.client.exceptions import ApiException

        self._count(what)
        api = self.api_client
        headers = {**api.default_headers, "Accept": "application/json", "Content-Type": content_type}
        api.update_params_for_auth(headers, None, ["BearerToken"], path, method, body)
        try:
            resp = api.rest_client.pool_manager.request(
                method, api.configuration.host + path, body=json.dumps(body, separators=(",", ":")).encode(),
                headers=headers, timeout=self._urllib3_timeout, preload_content=False)
            data = resp.data
        except Exception as exc:  # urllib3 errors, timeouts: KubeError with no status (as ``_raw``)
            raise _classify(exc, what) from None
        if not 200 <= resp.status <= 299:
            error = ApiException(status=resp.status, reason=resp.reason)
            error.body, error.headers = data.decode("utf-8", "replace"), resp.headers
            raise _classify(error, what)
        try:
            obj: Dict[str, Any] = json.loads(data) if data else {}
        except ValueError:
            raise KubeError(f"{what}: answer is not JSON") from None
        _drop_managed_fields(obj)
        return obj

    @staticmethod
    def _by_name(items: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
        return {(i.get("metadata") or {}).get("name", ""): i for i in items}

    # ---- reads -----------------------------------------------------------------------------------
    def _list(self, what: str, fn: Callable[..., Any], *args: Any, transform: Optional[Transform] = None,
              **kwargs: Any) -> Tuple[Dict[str, Dict[str, Any]], str]:
        """Every object of a list, ``LIST_PAGE`` at a time (``limit``/``continue``: one consistent snapshot
        at the first page's resourceVersion), each through ``transform`` as its page arrives: a cache
        never holds 10,000 whole objects at once to keep a part of each. A continue token that expired
        answers 410 (Gone): the caller lists again."""
        out: Dict[str, Dict[str, Any]] = {}
        token, rv = None, ""
        while True:
            data = self._raw(what, fn, *args, limit=LIST_PAGE, **({"_continue": token} if token else {}), **kwargs)
            meta = data.get("metadata") or {}
            rv = rv or meta.get("resourceVersion", "")
            for item in data.get("items") or []:
                out[(item.get("metadata") or {}).get("name", "")] = transform(item) if transform else item
            token = meta.get("continue")
            if not token:
                return out, rv

    @needs(("", "nodes", "list"))
    def list_nodes(self, transform: Optional[Transform] = None) -> Tuple[Dict[str, Dict[str, Any]], str]:
        return self._list("list_nodes", self.core.list_node, transform=transform)

    @needs(("", "pods", "list"))
    def list_pods(self, namespace: str, selector: str,
                  transform: Optional[Transform] = None) -> Tuple[Dict[str, Dict[str, Any]], str]:
        return self._list("list_pods", self.core.list_namespaced_pod, namespace, transform=transform,
                          label_selector=selector or None)

    def _watch(self, what: str, fn: Callable[..., Any], *args: Any, resource_version: str, timeout: int,
               **kwargs: Any) -> Iterator[Tuple[str, Dict[str, Any]]]:
        """Events of one watch request from ``resource_version``; Gone on 410 (caller relists)."""
        self._count(what)
        try:
            resp = fn(*args, watch=True, resource_version=resource_version, timeout_seconds=timeout,
                      allow_watch_bookmarks=True, _preload_content=False,
                      _request_timeout=(self.timeout, timeout + self.timeout), **kwargs)
        except Exception as exc:
            raise _classify(exc, what) from None
        try:
            buf = b""
            for chunk in resp.stream(65536, decode_content=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    etype, obj = event.get("type"), event.get("object") or {}
                    _drop_managed_fields(obj)
                    if etype == "ERROR":
                        code = int(obj.get("code") or 0)
                        cls = Gone if code == 410 else KubeError
                        raise cls(f"{what}: watch error {code}: {obj.get('message', '')}", code)
                    yield etype, obj
        except KubeError:
            raise
        except (ValueError, OSError, socket.timeout, Exception) as exc:  # connection reset, read timeout
            if isinstance(exc, GeneratorExit):
                raise
            raise _classify(exc, what) from None
        finally:
            resp.release_conn()

    @needs(("", "nodes", "watch"))
    def watch_nodes(self, resource_version: str, timeout: int) -> Iterator[Tuple[str, Dict[str, Any]]]:
        return self._watch("watch_nodes", self.core.list_node, resource_version=resource_version,
                           timeout=timeout)

    @needs(("", "pods", "watch"))
    def watch_pods(self, namespace: str, selector: str, resource_version: str,
                   timeout: int) -> Iterator[Tuple[str, Dict[str, Any]]]:
        return self._watch("watch_pods", self.core.list_namespaced_pod, namespace,
                           label_selector=selector or None, resource_version=resource_version, timeout=timeout)

    # ---- writes ----------------------------------------------------------------------------------
    @needs(("", "nodes", "patch"))
    def patch_node(self, name: str, body: Dict[str, Any], patch_type: str = "strategic") -> Dict[str, Any]:
        return self._write("patch_node", "PATCH", f"/api/v1/nodes/{quote(name, safe='')}", body,
                           _PATCH_TYPES[patch_type])

    @needs(("", "nodes/status", "patch"))
    def patch_node_status(self, name: str, body: Dict[str, Any], patch_type: str = "strategic") -> Dict[str, Any]:
        return self._write("patch_node_status", "PATCH", f"/api/v1/nodes/{quote(name, safe='')}/status", body,
                           _PATCH_TYPES[patch_type])

    @needs(("", "pods/status", "patch"))
    def patch_pod_status(self, namespace: str, name: str, body: Dict[str, Any],
                         patch_type: str = "strategic") -> Dict[str, Any]:
        return self._write("patch_pod_status", "PATCH",
                           f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/status",
                           body, _PATCH_TYPES[patch_type])

    @needs(("", "events", "create"))
    def create_event(self, namespace: str, node: Dict[str, Any], reason: str, message: str,
                     etype: str = "Normal", now: str = "", kind: str = "Node") -> Dict[str, Any]:
        # Events about cluster-scoped objects (Nodes) live in "default", as the kubelet's do: the API
        # server rejects them elsewhere (involvedObject.namespace must match the Event's namespace).
        if kind == "Node":
            namespace = "default"
        body = event_body(namespace, node, reason, message, etype, now, kind)
        return self._write("create_event", "POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", body,
                           "application/json")

    # ---- remediation -----------------------------------------------------------------------------
    @needs(("", "pods", "list"))
    def list_node_pods(self, node: str) -> List[Dict[str, Any]]:
        """Every pod bound to ``node``, in all namespaces (field selector spec.nodeName)."""
        data = self._raw("list_node_pods", self.core.list_pod_for_all_namespaces,
                         field_selector=f"spec.nodeName={node}")
        return list(data.get("items") or [])

    @needs(("", "pods/eviction", "create"))
    def evict_pod(self, namespace: str, name: str) -> None:
        """Evict through the Eviction API (honours PodDisruptionBudgets: 429 when one forbids it).
        A pod already gone counts as evicted."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        try:
            self._raw("evict_pod", self.core.create_namespaced_pod_eviction, name, namespace, body)
        except NotFound:
            return

    @needs(("", "nodes", "delete"))
    def delete_node(self, name: str) -> None:
        try:
            self._raw("delete_node", self.core.delete_node, name)
        except NotFound:
            return

    def _custom(self) -> Any:
        return self._client_mod.CustomObjectsApi(self.api_client)

    @needs(("autoheal.io", "nodereplacements", "create"))
    def create_custom(self, group: str, version: str, namespace: str, plural: str,
                      body: Dict[str, Any]) -> Dict[str, Any]:
        """Create a custom resource (the replacement request); one that exists already is returned."""
        try:
            return self._raw("create_custom", self._custom().create_namespaced_custom_object, group, version,
                             namespace, plural, body)
        except Conflict:
            return body

    @needs(("autoheal.io", "nodereplacements", "delete"))
    def delete_custom(self, group: str, version: str, namespace: str, plural: str, name: str) -> None:
        """Delete a replacement request that is no longer needed; one already gone counts as deleted."""
        try:
            self._raw("delete_custom", self._custom().delete_namespaced_custom_object, group, version, namespace,
                      plural, name)
        except NotFound:
            return

    @needs(("autoheal.io", "nodereplacements", "list"))
    def list_custom(self, group: str, version: str, namespace: str, plural: str) -> Dict[str, Dict[str, Any]]:
        try:
            data = self._raw("list_custom", self._custom().list_namespaced_custom_object, group, version,
                             namespace, plural)
        except NotFound as exc:
            # a real API server answers a resource it does not serve with a bare "404 page not found": say
            # which CRD is missing (the chart ships the default one in its crds/)
            raise NotFound(f"list_custom: the API server does not serve {plural}.{group}/{version}: install its "
                           f"CustomResourceDefinition (the Helm chart's crds/ has the default NodeReplacement) "
                           f"({exc})", 404) from None
        return self._by_name(data.get("items") or [])

    @needs(("", "configmaps", "get"))
    def get_configmap(self, namespace: str, name: str) -> Optional[Dict[str, Any]]:
        try:
            return self._raw("get_configmap", self.core.read_namespaced_config_map, name, namespace)
        except NotFound:
            return None

    @needs(("", "configmaps", "create"))
    def create_configmap(self, namespace: str, body: Dict[str, Any]) -> Dict[str, Any]:
        return self._raw("create_configmap", self.core.create_namespaced_config_map, namespace, body)

    @needs(("", "configmaps", "patch"))
    def patch_configmap(self, namespace: str, name: str, body: Dict[str, Any]) -> Dict[str, Any]:
        return self._patch("patch_configmap", self.core.patch_namespaced_config_map, name, namespace, body=body,
                           patch_type="merge")

    # ---- leases ----------------------------------------------------------------------------------
    @needs(("coordination.k8s.io", "leases", "get"))
    def get_lease(self, namespace: str, name: str) -> Optional[Dict[str, Any]]:
        try:
            return self._raw("get_lease", self.coord.read_namespaced_lease, name, namespace)
        except NotFound:
            return None

    @needs(("coordination.k8s.io", "leases", "create"))
    def create_lease(self, namespace: str, body: Dict[str, Any]) -> Dict[str, Any]:
        return self._raw("create_lease", self._send_json, "POST", _lease_path(namespace), body)

    @needs(("coordination.k8s.io", "leases", "update"))
    def replace_lease(self, namespace: str, name: str, body: Dict[str, Any]) -> Dict[str, Any]:
        return self._raw("replace_lease", self._send_json, "PUT", f"{_lease_path(namespace)}/{quote(name, safe='')}",
                         body)


def _lease_path(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"


def event_body(namespace: str, node: Dict[str, Any], reason: str, message: str, etype: str,
               now: str, kind: str = "Node") -> Dict[str, Any]:
    """A core/v1 Event about a Node (or another object of ``kind``), from autoheal-sync."""
    import uuid

    from autoheal.reasons import sanitize

    meta = node.get("metadata") or {}
    name = meta.get("name", "")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": kind, "name": name, "uid": meta.get("uid", ""),
                           **({"namespace": namespace} if kind != "Node" else {})},
        "reason": reason[:128], "message": sanitize(message, 1024), "type": etype,
        "source": {"component": "autoheal-sync"}, "reportingComponent": "autoheal-sync",
        "reportingInstance": socket.gethostname()[:128],
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }
