"""The HTTP request handler: routes kube-apiserver URLs to the registry, streams watches, serves discovery."""

from __future__ import annotations

import json
import select
import socket
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

from . import discovery, errors, protobuf, tables
from .admin import handle_admin
from .errors import ApiError
from .faults import fault_message
from .resources import ResourceType
from .store import TooOld

if TYPE_CHECKING:  # pragma: no cover
    from .server import FakeKubeServer

JSON = "application/json"
PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
}


def _media_types(header: Optional[str]) -> List[Tuple[str, Dict[str, str]]]:
    out = []
    for part in (header or "").split(","):
        bits = [b.strip() for b in part.split(";") if b.strip()]
        if not bits:
            continue
        params = {}
        for b in bits[1:]:
            k, _, v = b.partition("=")
            params[k.strip().lower()] = v.strip()
        out.append((bits[0].lower(), params))
    return out


def _truthy(value: Optional[str]) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes")


class ApiHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fakekube/1.32"
    app: FakeKubeServer

    def setup(self) -> None:
        super().setup()
        try:  # headers and body go out in separate writes: without this, delayed ACKs cost 40 ms
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        self.app._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.app._track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # -- plumbing ----------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, code: int, body: bytes, content_type: str, headers: Optional[Dict[str, str]] = None) -> None:
        self._status = code
        if self._entry is not None:
            self._entry["status"] = code
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Audit-Id", str(uuid.uuid4()))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, code: int, obj: Any, content_type: str = JSON,
                   headers: Optional[Dict[str, str]] = None) -> None:
        self._send(code, json.dumps(obj, separators=(",", ":")).encode() + b"\n", content_type, headers)

    def _send_error(self, err: ApiError) -> None:
        headers = {"Retry-After": str(err.retry_after)} if err.retry_after else None
        body = err.to_status()
        token = getattr(err, "continue_token", None)
        if token:
            body["metadata"] = {"continue": token}
        self._send_json(err.code, body, headers=headers)

    def _handle(self, method: str) -> None:
        self._status = 0
        self._entry: Optional[Dict[str, Any]] = None
        self._streaming = False
        started = time.time()
        parts = urlsplit(self.path)
        path = parts.path.rstrip("/") or "/"
        query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        self._dry_values = parse_qs(parts.query).get("dryRun", [])
        entry = {"method": method, "path": path, "query": query,
                 "content_type": self.headers.get("Content-Type", ""), "accept": self.headers.get("Accept", ""),
                 "status": 0}
        if not path.startswith("/_fake"):
            self._entry = entry
            self.app.requests.append(entry)  # logged first, so a client sees it once it has the answer
        try:
            body = self._read_body()
            entry["body"] = body.decode("utf-8", "replace")[:4000]
            if path.startswith("/_fake"):
                handle_admin(self, method, path, body)
                return
            if self.app.require_token and self.headers.get("Authorization") != f"Bearer {self.app.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            is_watch = _truthy(query.get("watch")) or "/watch/" in path
            fault = self.app.faults.match(method, path, is_watch)
            if fault is not None and self._apply_fault(fault, path):
                return
            self._route(method, path, query, body)
        except ApiError as err:
            self._send_error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # pragma: no cover - a bug in the fake answers like a server bug
            traceback.print_exc()
            if self._streaming:  # a watch already sent its headers: all we can do is hang up
                self.close_connection = True
            else:
                self._send_error(errors.internal(f"{type(exc).__name__}: {exc}"))
        finally:
            entry["status"] = self._status
            entry["duration_ms"] = round((time.time() - started) * 1000, 1)

    def _apply_fault(self, fault: Any, path: str) -> bool:
        if fault.latency_ms:
            time.sleep(fault.latency_ms / 1000.0)
        if fault.disconnect:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._status = -1
            return True
        if fault.status is None:
            return False
        code = int(fault.status)
        message = fault.message or fault_message(code, path)
        err = errors.generic(code, message, fault.reason, fault.retry_after)
        if code == 429 and not fault.retry_after:
            err.retry_after = 1
            err.details["retryAfterSeconds"] = 1
        self._send_error(err)
        return True

    def _decode_json(self, body: bytes) -> Any:
        """The request body as JSON data (protobuf only for the few kinds kubectl's generators send)."""
        ctype = self.headers.get("Content-Type", JSON).split(";")[0].strip().lower()
        if ctype == "application/vnd.kubernetes.protobuf":
            try:
                decoded = protobuf.decode_object(body)
            except protobuf.ProtobufError as exc:
                raise errors.bad_request(f"failed to decode protobuf body: {exc}") from None
            if decoded is None:
                raise errors.unsupported_media_type(ctype, [JSON])
            return decoded
        if "yaml" in ctype or "protobuf" in ctype or "cbor" in ctype:
            raise errors.unsupported_media_type(ctype, [JSON])
        try:
            return json.loads(body.decode("utf-8") or "null")
        except (ValueError, UnicodeDecodeError) as exc:
            raise errors.bad_request(f"couldn't get version/kind; json parse error: {exc}") from None

    def _dry_run(self) -> bool:
        for value in self._dry_values:
            if value != "All":
                raise errors.bad_request(f"Invalid dry run value: {value!r}")
        return bool(self._dry_values)

    # -- routing -----------------------------------------------------------------------------

    def _route(self, method: str, path: str, query: Dict[str, str], body: bytes) -> None:
        app = self.app
        if path in ("/healthz", "/livez", "/readyz") or path.startswith(("/healthz/", "/livez/", "/readyz/")):
            self._send(200, b"ok", "text/plain; charset=utf-8")
            return
        if path == "/version":
            self._send_json(200, discovery.VERSION_INFO)
            return
        if path in ("/api", "/apis"):
            self._discovery_root(path == "/api")
            return
        if path == "/openapi/v3":
            self._send_json(200, discovery.openapi_v3_root(app.types))
            return
        if path.startswith("/openapi/v3/"):
            gv = path[len("/openapi/v3/"):].split("/")
            group, version = ("", gv[1]) if gv[0] == "api" and len(gv) == 2 else (
                (gv[1], gv[2]) if gv[0] == "apis" and len(gv) == 3 else ("", ""))
            if version and version in app.types.groups().get(group, ()):
                self._send_json(200, discovery.openapi_v3_group_version(app.types, group, version))
                return
            raise _not_found_path()
        segs = path.strip("/").split("/")
        if segs[0] == "api" and len(segs) >= 2:
            group, version, rest = "", segs[1], segs[2:]
        elif segs[0] == "apis" and len(segs) >= 2:
            group = segs[1]
            if group not in app.types.groups() or not group:
                raise _not_found_path()
            if len(segs) == 2:
                self._send_json(200, discovery.api_group(app.types, group))
                return
            version, rest = segs[2], segs[3:]
        else:
            self._send(404, b"404 page not found\n", "text/plain; charset=utf-8")
            return
        if version not in app.types.groups().get(group, ()):
            raise _not_found_path()
        if not rest:
            self._send_json(200, discovery.api_resource_list(app.types, group, version))
            return
        self._resource(method, group, version, rest, query, body)

    def _discovery_root(self, core: bool) -> None:
        for mtype, params in _media_types(self.headers.get("Accept")):
            if self.app.aggregated_discovery and params.get("as") == "APIGroupDiscoveryList" \
                    and params.get("g") == "apidiscovery.k8s.io" and params.get("v") in ("v2", "v2beta1"):
                ctype = discovery.AGGREGATED_V2 if params["v"] == "v2" else discovery.AGGREGATED_V2BETA1
                self._send_json(200, discovery.aggregated(self.app.types, core, params["v"]), ctype)
                return
            if mtype in (JSON, "*/*", "application/*"):
                break
        host = self.headers.get("Host") or f"127.0.0.1:{self.app.port}"
        doc = discovery.api_versions(host) if core else discovery.api_group_list(self.app.types)
        self._send_json(200, doc)

    def _resource(self, method: str, group: str, version: str, rest: List[str], query: Dict[str, str],
                  body: bytes) -> None:
        types = self.app.types
        watch_path = False
        if rest[0] == "watch":
            watch_path, rest = True, rest[1:]
            if not rest:
                raise _not_found_path()
        namespace: Optional[str] = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            inner = types.by_url(group, version, rest[2])
            if inner is not None and inner.namespaced:
                namespace, rest = rest[1], rest[2:]
        rt = types.by_url(group, version, rest[0])
        if rt is None or len(rest) > 3 or (namespace is not None and not rt.namespaced):
            raise _not_found_path()
        if rt.namespaced and namespace is None and len(rest) > 1:
            raise _not_found_path()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if name is None:
            self._collection(method, rt, namespace, query, body, watch_path)
        elif sub is None:
            self._item(method, rt, namespace, name, query, body, watch_path)
        elif sub == "status" and rt.status_subresource and not watch_path:
            self._status_sub(method, rt, namespace, name, body)
        elif sub == "eviction" and any(s.name == "eviction" for s in rt.subresources) and not watch_path:
            if method != "POST":
                raise errors.method_not_allowed()
            result = self.app.store.evict(name, namespace or "", self._decode_json(body), self._dry_run())
            self._send_json(201, result)
        else:
            raise _not_found_path()

    def _collection(self, method: str, rt: ResourceType, namespace: Optional[str], query: Dict[str, str],
                    body: bytes, watch_path: bool) -> None:
        store = self.app.store
        if method == "GET":
            if watch_path or _truthy(query.get("watch")):
                self._watch(rt, namespace, query)
                return
            limit = _int_param(query, "limit")
            listed = store.list(rt, namespace, query.get("labelSelector"), query.get("fieldSelector"),
                                limit, query.get("continue"))
            self._send_object(rt, listed, query, is_list=True)
        elif method == "POST" and (namespace is not None or not rt.namespaced):
            created = store.create(rt, self._decode_json(body), namespace, dry_run=self._dry_run())
            self._send_json(201, created)
        elif method == "DELETE" and (namespace is not None or not rt.namespaced):
            options = self._delete_options(body, query)
            result = store.delete_collection(rt, namespace, query.get("labelSelector"), query.get("fieldSelector"),
                                             options, self._dry_run())
            self._send_json(200, result)
        else:
            raise errors.method_not_allowed()

    def _item(self, method: str, rt: ResourceType, namespace: Optional[str], name: str, query: Dict[str, str],
              body: bytes, watch_path: bool) -> None:
        store = self.app.store
        if watch_path:
            if method != "GET":
                raise errors.method_not_allowed()
            query = dict(query)
            query["fieldSelector"] = ",".join(filter(None, [query.get("fieldSelector"), f"metadata.name={name}"]))
            self._watch(rt, namespace, query)
        elif method == "GET":
            self._send_object(rt, store.get(rt, name, namespace), query, is_list=False)
        elif method == "PUT":
            self._send_json(200, store.update(rt, name, self._decode_json(body), namespace, dry_run=self._dry_run()))
        elif method == "PATCH":
            self._send_json(200, self._patch(rt, namespace, name, body, None))
        elif method == "DELETE":
            code, result = store.delete(rt, name, namespace, self._delete_options(body, query), self._dry_run())
            self._send_json(code, result)
        else:
            raise errors.method_not_allowed()

    def _status_sub(self, method: str, rt: ResourceType, namespace: Optional[str], name: str, body: bytes) -> None:
        store = self.app.store
        if method == "GET":
            self._send_json(200, store.get(rt, name, namespace))
        elif method == "PUT":
            self._send_json(200, store.update(rt, name, self._decode_json(body), namespace, "status",
                                              self._dry_run()))
        elif method == "PATCH":
            self._send_json(200, self._patch(rt, namespace, name, body, "status"))
        else:
            raise errors.method_not_allowed()

    def _patch(self, rt: ResourceType, namespace: Optional[str], name: str, body: bytes,
               sub: Optional[str]) -> Dict[str, Any]:
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        patch_type = PATCH_TYPES.get(ctype)
        if patch_type is None or (patch_type == "strategic" and rt.custom):
            accepted = ["application/json-patch+json", "application/merge-patch+json"]
            if not rt.custom:
                accepted.append("application/strategic-merge-patch+json")
            # server-side apply (application/apply-patch+yaml) is not implemented by the fake
            raise errors.unsupported_media_type(ctype, accepted)
        try:
            document = json.loads(body.decode("utf-8") or "null")
        except (ValueError, UnicodeDecodeError) as exc:
            raise errors.bad_request(f"error decoding patch: {exc}") from None
        return self.app.store.patch(rt, name, document, patch_type, namespace, sub, self._dry_run())

    def _delete_options(self, body: bytes, query: Dict[str, str]) -> Dict[str, Any]:
        options: Dict[str, Any] = {}
        if body.strip():
            decoded = self._decode_json(body)
            if not isinstance(decoded, dict):
                raise errors.bad_request("DeleteOptions must be a JSON object")
            options.update(decoded)
        if "gracePeriodSeconds" in query:
            options.setdefault("gracePeriodSeconds", _int_param(query, "gracePeriodSeconds"))
        if "propagationPolicy" in query:
            options.setdefault("propagationPolicy", query["propagationPolicy"])
        if "orphanDependents" in query:
            options.setdefault("orphanDependents", _truthy(query["orphanDependents"]))
        return options

    # -- output ------------------------------------------------------------------------------

    def _output_mode(self) -> Tuple[str, str]:
        """('table'|'metadata'|'json', content type) from the Accept header."""
        for mtype, params in _media_types(self.headers.get("Accept")):
            if params.get("as") == "Table" and params.get("g") == "meta.k8s.io":
                return "table", f"application/json;as=Table;v={params.get('v', 'v1')};g=meta.k8s.io"
            if params.get("as") in ("PartialObjectMetadata", "PartialObjectMetadataList") \
                    and params.get("g") == "meta.k8s.io":
                return "metadata", f"application/json;as={params['as']};v={params.get('v', 'v1')};g=meta.k8s.io"
            if mtype in (JSON, "*/*", "application/*"):
                break
        return "json", JSON

    def _send_object(self, rt: ResourceType, obj: Dict[str, Any], query: Dict[str, str], is_list: bool) -> None:
        mode, ctype = self._output_mode()
        if mode == "table":
            items = [self.app.store.decorate(rt, o) for o in obj["items"]] if is_list else [obj]
            meta = obj["metadata"] if is_list else {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
            self._send_json(200, tables.table(rt, items, meta, self.app.clock(),
                                              query.get("includeObject", "Metadata")), ctype)
        elif mode == "metadata":
            if is_list:
                doc = {"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                       "metadata": obj["metadata"],
                       "items": [{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                  "metadata": o.get("metadata", {})} for o in obj["items"]]}
            else:
                doc = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
            self._send_json(200, doc, ctype)
        else:
            self._send_json(200, obj)

    # -- watch -------------------------------------------------------------------------------

    def _watch(self, rt: ResourceType, namespace: Optional[str], query: Dict[str, str]) -> None:
        app = self.app
        watcher = app.store.watcher(rt, namespace, query.get("labelSelector"), query.get("fieldSelector"))
        rv = query.get("resourceVersion")
        if rv not in (None, "") and not rv.isdigit():
            raise errors.bad_request(f"invalid resource version: {rv!r}")
        timeout = _int_param(query, "timeoutSeconds")
        allow_bookmarks = _truthy(query.get("allowWatchBookmarks"))
        send_initial = _truthy(query.get("sendInitialEvents"))
        mode, ctype = self._output_mode()
        start = time.monotonic()
        deadline = start + (timeout if timeout is not None else app.max_watch_seconds)

        self._status = 200
        self._streaming = True
        if self._entry is not None:
            self._entry["status"] = 200
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Audit-Id", str(uuid.uuid4()))
        self.end_headers()
        first = [True]

        def emit(events: List[Dict[str, Any]]) -> None:
            for ev in events:
                if mode != "json" and ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    ev = {"type": ev["type"], "object": self._transform(rt, ev["object"], mode, query, first[0])}
                    first[0] = False
                self._chunk(json.dumps(ev, separators=(",", ":")).encode() + b"\n")

        try:
            if rv and not self._wait_for_revision(int(rv)):
                emit([{"type": "ERROR", "object": _too_large(int(rv), app.store.store.current_rv)}])
                self._chunk(b"")
                return
            try:
                emit(watcher.start(rv, send_initial, allow_bookmarks))
            except TooOld as exc:
                emit([{"type": "ERROR", "object": errors.expired(str(exc)).to_status()}])
                self._chunk(b"")
                return
            next_bookmark = self._next_bookmark(time.monotonic(), deadline) if allow_bookmarks else None
            while not app.stopping.is_set():
                now = time.monotonic()
                if now >= deadline:
                    break
                wake = min(deadline, now + 0.25, next_bookmark if next_bookmark is not None else deadline)
                events = watcher.next(max(0.0, wake - now))
                if events is None:
                    break
                emit(events)
                now = time.monotonic()
                if next_bookmark is not None and now >= next_bookmark:
                    emit([watcher.bookmark()])
                    next_bookmark = self._next_bookmark(now, deadline)
                if self._client_gone():
                    self.close_connection = True
                    return
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    def _wait_for_revision(self, rv: int, timeout: float = 3.0) -> bool:
        """A watch from a future resourceVersion waits for it, as the watch cache does (3 s)."""
        store = self.app.store.store
        deadline = time.monotonic() + timeout
        while store.current_rv < rv:
            left = deadline - time.monotonic()
            if left <= 0 or store.closed:
                return False
            store.wait(min(left, 0.25))
        return True

    def _next_bookmark(self, now: float, deadline: float) -> Optional[float]:
        """Like the watch cache: every interval, and 2 s before the watch times out."""
        at = min(now + self.app.bookmark_interval, deadline - 2.0)
        return at if at >= now else None

    def _transform(self, rt: ResourceType, obj: Dict[str, Any], mode: str, query: Dict[str, str],
                   headers: bool) -> Dict[str, Any]:
        if mode == "table":
            meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
            return tables.table(rt, [obj], meta, self.app.clock(), query.get("includeObject", "Metadata"),
                                headers=headers)
        return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if readable:
                return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True
        return False

def _too_large(requested: int, current: int) -> Dict[str, Any]:
    return ApiError(504, "Timeout", f"Too large resource version: {requested}, current: {current}",
                    {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                     "retryAfterSeconds": 1}).to_status()


def _not_found_path() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def _int_param(query: Dict[str, str], name: str) -> Optional[int]:
    value = query.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)  # type: ignore[arg-type]
    except ValueError:
        raise errors.bad_request(f"invalid {name}: {value!r}") from None
