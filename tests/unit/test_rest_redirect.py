"""The Slurm REST token never follows a redirect (issue 25, item 4).

``requests`` strips only ``Authorization`` when a redirect leaves the host; ``X-SLURM-USER-TOKEN`` is a
custom header and went along to any host a 3xx named. Two real HTTP servers on loopback, on two
ports: the first answers every request with a redirect to the second, which records the headers it
receives. The token must never reach the second one.
"""

from __future__ import annotations

import http.server
import threading

import pytest

from autoheal.errors import SlurmError
from autoheal.slurm.rest_backend import RestSlurm

TOKEN = "eyJhbGciOiJIUzI1NiJ9.REDIRECT-BAIT.sig"


class Recorder:
    def __init__(self):
        self.seen = []  # headers of every request the server received

    def handler(self, answer):
        rec = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                rec.seen.append({k.lower(): v for k, v in self.headers.items()})
                status, headers, body = answer(self.path)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _serve

            def log_message(self, *args):
                pass

        return H


@pytest.fixture
def servers():
    started = []

    def start(handler):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        started.append(srv)
        return srv.server_address[1]

    yield start
    for srv in started:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("status", [301, 302, 307, 308])
@pytest.mark.parametrize("call", ["ping", "list_nodes", "drain"])
def test_token_does_not_follow_a_redirect_to_another_port(servers, status, call):
    thief = Recorder()
    thief_port = servers(thief.handler(lambda path: (200, {"Content-Type": "application/json"},
                                                     b'{"errors": [], "nodes": [], "pings": []}')))
    front = Recorder()
    front_port = servers(front.handler(lambda path: (status, {"Location": f"http://127.0.0.1:{thief_port}{path}"},
                                                     b"")))
    slurm = RestSlurm(f"http://127.0.0.1:{front_port}", api_version="v0.0.40", user="autoheal", token=TOKEN,
                      timeout=5, retries=0)
    if call == "ping":
        assert slurm.ping() is False  # a redirect is no answer from slurmctld
    else:
        with pytest.raises(SlurmError, match=rf"HTTP {status} redirect to http://127.0.0.1:{thief_port} refused"):
            slurm.list_nodes() if call == "list_nodes" else slurm.drain("gpu1", "autoheal: test")
    assert front.seen and front.seen[0]["x-slurm-user-token"] == TOKEN  # the real address got it
    assert thief.seen == []  # the other port never even got a request, let alone the token


def test_redirect_error_names_only_the_origin(servers):
    # the Location's path and query are the redirecting server's text: the error keeps scheme://host:port
    front = Recorder()
    port = servers(front.handler(lambda path: (302, {"Location": "http://user:pw@evil.example:81/x?token=1"}, b"")))
    slurm = RestSlurm(f"http://127.0.0.1:{port}", api_version="v0.0.40", token=TOKEN, timeout=5, retries=0)
    with pytest.raises(SlurmError) as err:
        slurm.list_nodes()
    assert "redirect to http://evil.example:81 refused" in str(err.value)
    assert "pw" not in str(err.value) and "token=1" not in str(err.value) and TOKEN not in str(err.value)
