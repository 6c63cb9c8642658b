"""API faults without a fake API server: a fault-injecting HTTPS proxy in front of the lab's real
kube-apiserver (issue 21).

The proxy terminates TLS with its own serving certificate from the lab's CA (so a client that trusts the
lab's CA cannot tell it from the API server) and forwards every request to the real server with the
client's own credentials: a bearer token (the sync's ServiceAccount token) is passed on as it came. A
client certificate cannot be passed on by a proxy that terminates TLS (it is bound to the TLS session), so a
request that came with a verified lab client certificate and no token is forwarded under the proxy's admin
certificate with ``Impersonate-User``/``Impersonate-Group`` set to that certificate's CN and O, which the
real server authorizes as that user (how kube-rbac-proxy and the aggregator pass identities on).

In the windows it is told (``FaultRule``: method, path, watch or not, a wall-clock window, a number of hits),
a request gets instead of, or on top of, the real answer:

- ``status`` 5xx / 429: a ``Status`` worded as kube-apiserver words it, with ``Retry-After`` (and
  ``details.retryAfterSeconds``) when ``retry_after`` is given, as the API server's max-in-flight filter and
  priority-and-fairness answer an overloaded server;
- ``latency_ms``: the real answer, that much later (a slow server);
- ``disconnect``: the connection is closed with no answer (a server or load balancer that went away);
- ``drop_after_ms`` (watches): the real watch stream, cut after that long (what a restarting API server or
  an idle-timeout load balancer does to a watch).

Rules are set from Python (``FaultProxy.rules``, in a test's process) or over HTTPS at ``/_autoheal/faults``
on the proxy's own port, answered only for the lab's admin client certificate (any other client's request
to that path goes to the real server, which does not serve it). ``python -m autoheal_lab.apifaults`` runs the
proxy as a lab process (``autoheal lab up --kube`` starts it; the sync's kubeconfig points at it).

Exec/attach/port-forward (connection upgrades) are not proxied: nothing behind the proxy uses them.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import socket
import ssl
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

CONTROL_PATH = "/_autoheal/faults"
PROXY_PROC = "kube-api-faults"
#: Headers that belong to one hop (RFC 9110 7.6.1) and are never passed on.
HOP_HEADERS = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
               "transfer-encoding", "upgrade", "host", "content-length"}
#: What kube-apiserver answers for each code it uses when overloaded or failing (reason, message).
STATUS_WORDS = {
    429: ("TooManyRequests", "Too many requests, please try again later."),
    500: ("InternalError", "Internal error occurred: etcdserver: request timed out"),
    502: ("InternalError", "Internal error occurred: error trying to reach service"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: ("Timeout", "Timeout: request did not complete within the allowed duration"),
}
RULE_FIELDS = ("method", "path_regex", "status", "retry_after", "latency_ms", "disconnect", "drop_after_ms",
               "watch", "times", "skip", "start", "end")


@dataclass
class FaultRule:
    """One kind of fault for the requests it matches (``re.search`` of ``path_regex`` in the path)."""

    method: str = "*"
    path_regex: str = ".*"
    status: Optional[int] = None
    retry_after: Optional[int] = None
    latency_ms: int = 0
    disconnect: bool = False
    drop_after_ms: Optional[int] = None
    watch: Optional[bool] = None  # True: watches only; False: everything but watches
    times: Optional[int] = None  # hits before the rule is spent (None: no limit)
    skip: int = 0  # matching requests let through untouched first
    start: Optional[float] = None  # wall-clock window [start, end); None: open on that side
    end: Optional[float] = None
    id: int = 0
    hits: int = 0
    _pattern: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.method = (self.method or "*").upper()
        self._pattern = re.compile(self.path_regex)
        if self.status is not None and not 400 <= int(self.status) <= 599:
            raise ValueError(f"status must be an HTTP error code (400-599), got {self.status!r}")

    def live(self, now: float) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        return (self.start is None or now >= self.start) and (self.end is None or now < self.end)

    def matches(self, method: str, path: str, is_watch: bool) -> bool:
        return (self.method in ("*", method.upper()) and (self.watch is None or self.watch == is_watch)
                and bool(self._pattern.search(path)))

    def to_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out.pop("_pattern", None)
        return out


class FaultRules:
    """The proxy's rules, checked in the order they were added; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: List[FaultRule] = []
        self._next = 1

    def add(self, **spec: Any) -> FaultRule:
        unknown = set(spec) - set(RULE_FIELDS)
        if unknown:
            raise ValueError(f"unknown fault fields: {', '.join(sorted(unknown))}")
        rule = FaultRule(**spec)
        with self._lock:
            rule.id, self._next = self._next, self._next + 1
            self._rules.append(rule)
        return rule

    def remove(self, rule_id: int) -> bool:
        with self._lock:
            before = len(self._rules)
            self._rules = [r for r in self._rules if r.id != rule_id]
            return len(self._rules) != before

    def clear(self) -> None:
        with self._lock:
            self._rules = []

    def rules(self) -> List[FaultRule]:
        with self._lock:
            return list(self._rules)

    def match(self, method: str, path: str, is_watch: bool, now: Optional[float] = None) -> Optional[FaultRule]:
        """The first live rule for this request, its hit counted; None: forward it untouched."""
        now = time.time() if now is None else now
        with self._lock:
            for rule in self._rules:
                if not rule.live(now) or not rule.matches(method, path, is_watch):
                    continue
                if rule.skip > 0:
                    rule.skip -= 1
                    continue
                rule.hits += 1
                return rule
        return None


def is_watch_request(path: str, query: str) -> bool:
    """``?watch=1|true`` or the legacy ``/watch/`` path prefix, as the API server decides it."""
    if re.search(r"(^|&)watch=(1|true)(&|$)", query or ""):
        return True
    return bool(re.match(r"^/(api/v1|apis/[^/]+/[^/]+)/watch/", path))


def status_body(code: int, retry_after: Optional[int] = None) -> bytes:
    """A ``Status`` object as kube-apiserver answers ``code``."""
    reason, message = STATUS_WORDS.get(code, ("InternalError", f"Internal error occurred: HTTP {code}"))
    body: Dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": message, "reason": reason, "code": code}
    if retry_after is not None:
        body["details"] = {"retryAfterSeconds": int(retry_after)}
    return json.dumps(body).encode() + b"\n"


def peer_identity(cert: Optional[Dict[str, Any]]) -> Tuple[str, List[str]]:
    """(CN, [O, ...]) of a verified client certificate as ``ssl`` gives it, ("", []) without one."""
    user, groups = "", []
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                user = value
            elif key == "organizationName":
                groups.append(value)
    return user, groups


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self._upstream: Dict[bool, http.client.HTTPSConnection] = {}
        self.connection.settimeout(None)

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: a soak makes thousands of requests
        return

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def _handle(self) -> None:
        split = urlsplit(self.path)
        body = self._read_body()
        user, groups = peer_identity(self.connection.getpeercert())
        proxy = self.server.proxy
        if split.path.rstrip("/").startswith(CONTROL_PATH) and user == proxy.control_user:
            return self._control(split.path, body)
        rule = proxy.rules.match(self.command, split.path, is_watch_request(split.path, split.query))
        if rule is not None and rule.latency_ms:
            time.sleep(rule.latency_ms / 1000.0)
        if rule is not None and rule.disconnect:
            return self._drop()
        if rule is not None and rule.status is not None:
            return self._answer_status(rule)
        self._forward(body, user, groups, rule.drop_after_ms if rule is not None else None)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _answer_status(self, rule: FaultRule) -> None:
        code = int(rule.status or 500)
        data = status_body(code, rule.retry_after)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-cache, private")
        if rule.retry_after is not None:
            self.send_header("Retry-After", str(int(rule.retry_after)))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _upstream_conn(self, impersonate: bool) -> http.client.HTTPSConnection:
        conn = self._upstream.get(impersonate)
        if conn is None:
            proxy = self.server.proxy
            conn = http.client.HTTPSConnection(proxy.upstream_host, proxy.upstream_port, timeout=None,
                                               context=proxy.admin_ctx if impersonate else proxy.plain_ctx)
            self._upstream[impersonate] = conn
        return conn

    def _upstream_headers(self, user: str, groups: List[str]) -> Tuple[Dict[str, str], bool]:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS
                   and not k.lower().startswith("impersonate-")}
        impersonate = bool(user) and "authorization" not in {k.lower() for k in headers}
        if impersonate:
            headers["Impersonate-User"] = user
        return headers, impersonate

    def _forward(self, body: bytes, user: str, groups: List[str], drop_after_ms: Optional[int]) -> None:
        headers, impersonate = self._upstream_headers(user, groups)
        conn = self._upstream_conn(impersonate)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", self.server.proxy.upstream_netloc)
            for key, value in headers.items():
                conn.putheader(key, value)
            for group in groups if impersonate else ():
                conn.putheader("Impersonate-Group", group)
            if body or self.command in ("POST", "PUT", "PATCH"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException):
            self._upstream.pop(impersonate, None)
            conn.close()
            return self._drop()  # the server went away under us: so does our answer
        timer = None
        if drop_after_ms is not None:
            timer = threading.Timer(drop_after_ms / 1000.0, self._cut, args=(conn,))
            timer.daemon = True
            timer.start()
        try:
            self._relay(resp)
        except (OSError, http.client.HTTPException, ValueError):
            self._upstream.pop(impersonate, None)
            conn.close()
            self._drop()
        finally:
            if timer is not None:
                timer.cancel()
        if resp.will_close or self.close_connection:
            self._upstream.pop(impersonate, None)
            conn.close()

    def _cut(self, conn: http.client.HTTPSConnection) -> None:
        """A watch stream cut mid-way: both sides' sockets shut, no final chunk."""
        for sock in (self.connection, conn.sock):
            try:
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _relay(self, resp: http.client.HTTPResponse) -> None:
        self.send_response_only(resp.status, resp.reason)
        for key, value in resp.getheaders():
            if key.lower() not in HOP_HEADERS:
                self.send_header(key, value)
        length = resp.getheader("Content-Length")
        if self.command == "HEAD" or resp.status in (204, 304):
            self.end_headers()
            resp.read()
            return
        if length is not None:
            data = resp.read()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while True:  # a watch (or any streamed answer): pass each piece on as it comes
            chunk = resp.read1(65536)
            if not chunk:
                break
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _control(self, path: str, body: bytes) -> None:
        rules = self.server.proxy.rules
        code, out = 200, {}
        try:
            tail = path.rstrip("/")[len(CONTROL_PATH):].strip("/")
            if self.command == "POST":
                out = {"faults": [rules.add(**json.loads(body or b"{}")).to_dict()]}
            elif self.command == "DELETE" and tail:
                code = 200 if rules.remove(int(tail)) else 404
            elif self.command == "DELETE":
                rules.clear()
            if self.command in ("GET", "DELETE"):
                out = {"faults": [r.to_dict() for r in rules.rules()]}
        except (ValueError, TypeError) as exc:
            code, out = 400, {"error": str(exc)}
        data = json.dumps(out).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            for conn in self._upstream.values():
                conn.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: FaultProxy

    def get_request(self):  # the TLS handshake in the handler's thread, not the accept loop's
        sock, addr = self.socket.accept()
        return self.proxy.server_ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def finish_request(self, request, client_address) -> None:
        try:
            request.do_handshake()
        except (OSError, ssl.SSLError):
            request.close()
            return
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address) -> None:  # a client gone mid-answer is not news
        return


class FaultProxy:
    """The proxy: ``start()`` serves on ``127.0.0.1:port`` (0: a free one) until ``stop()``."""

    def __init__(self, upstream: str, ca: Path, cert: Path, key: Path, admin_cert: Optional[Path] = None,
                 admin_key: Optional[Path] = None, port: int = 0, control_user: str = "autoheal-lab-admin",
                 rules: Optional[FaultRules] = None):
        split = urlsplit(upstream)
        self.upstream_host, self.upstream_port = split.hostname or "127.0.0.1", split.port or 443
        self.upstream_netloc = split.netloc
        self.rules = rules or FaultRules()
        self.control_user = control_user
        self.server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server_ctx.load_cert_chain(str(cert), str(key))
        self.server_ctx.load_verify_locations(cafile=str(ca))
        self.server_ctx.verify_mode = ssl.CERT_OPTIONAL  # a lab client certificate is verified when sent
        self.server_ctx.set_alpn_protocols(["http/1.1"])
        self.plain_ctx = ssl.create_default_context(cafile=str(ca))
        self.admin_ctx = ssl.create_default_context(cafile=str(ca))
        if admin_cert and admin_key:
            self.admin_ctx.load_cert_chain(str(admin_cert), str(admin_key))
        self._httpd = _Server(("127.0.0.1", port), _Handler)
        self._httpd.proxy = self
        self.port = self._httpd.server_address[1]
        self.url = f"https://127.0.0.1:{self.port}"
        self._thread: Optional[threading.Thread] = None

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="api-faults", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)


def issue_cert(pki: Path, name: str = "api-faults") -> Tuple[Path, Path]:
    """A serving certificate for the proxy (127.0.0.1, localhost) from the lab's CA in ``pki``; made once."""
    from autoheal_lab.controlplane import _openssl

    crt, key = pki / f"{name}.crt", pki / f"{name}.key"
    if crt.exists() and key.exists():
        return crt, key
    ext = pki / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key.name, "-out", f"{name}.csr",
             "-subj", f"/CN={name}", cwd=pki)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", crt.name, "-days", "30", "-extfile", ext.name, cwd=pki)
    for f in (crt, key):
        f.chmod(0o600)
    return crt, key


def for_control_plane(cp: Any, port: int = 0) -> FaultProxy:
    """A proxy in front of a started ``controlplane.ControlPlane`` (its PKI, its admin for impersonation)."""
    pki = cp.root / "pki"
    crt, key = issue_cert(pki)
    return FaultProxy(cp.server, pki / "ca.crt", crt, key, pki / "admin.crt", pki / "admin.key", port=port)


class Control:
    """The rules of a proxy running as another process, over its ``/_autoheal/faults`` (lab admin cert)."""

    def __init__(self, url: str, ca: Path, cert: Path, key: Path):
        self.url = url.rstrip("/")
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.ctx.load_cert_chain(str(cert), str(key))

    def _call(self, method: str, path: str, body: Optional[dict] = None) -> dict:
        import urllib.request

        req = urllib.request.Request(self.url + CONTROL_PATH + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10, context=self.ctx) as resp:
            return json.loads(resp.read().decode() or "{}")

    def add(self, **spec: Any) -> dict:
        return self._call("POST", "", spec)["faults"][0]

    def remove(self, rule_id: int) -> None:
        self._call("DELETE", f"/{rule_id}")

    def rules(self) -> List[dict]:
        return self._call("GET", "")["faults"]

    def clear(self) -> None:
        self._call("DELETE", "")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autoheal_lab.apifaults", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", required=True, help="the real API server, https://127.0.0.1:PORT")
    p.add_argument("--pki", required=True, type=Path, help="the control plane's pki/ (CA, admin certificate)")
    p.add_argument("--port", type=int, default=0, help="port to serve on (0: a free one)")
    p.add_argument("--port-file", type=Path, help="write the port served on here once listening")
    args = p.parse_args(argv)
    crt, key = issue_cert(args.pki)
    proxy = FaultProxy(args.upstream, args.pki / "ca.crt", crt, key, args.pki / "admin.crt",
                       args.pki / "admin.key", port=args.port)
    if args.port_file:
        tmp = args.port_file.with_suffix(".tmp")
        tmp.write_text(str(proxy.port))
        tmp.replace(args.port_file)
    print(f"api-faults: {proxy.url} -> {args.upstream}", flush=True)
    try:
        proxy.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
