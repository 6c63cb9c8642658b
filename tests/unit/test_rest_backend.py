"""The slurmrestd backend against a local stub speaking slurmrestd's JSON; plus with_retries."""

from __future__ import annotations

import http.server
import json
import os
import socket
import socketserver
import threading
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from autoheal.errors import SlurmError, SlurmNotFound, SlurmNotSupported, SlurmParseError, SlurmUnavailable
from autoheal.slurm import base, rest_backend
from autoheal.slurm.model import JobUpdate
from autoheal.slurm.rest_backend import RestSlurm

FIX = Path(__file__).resolve().parents[1] / "fixtures"
SINFO_2205 = json.loads((FIX / "slurm-22.05" / "sinfo.json").read_text())
SQUEUE_2205 = json.loads((FIX / "slurm-22.05" / "squeue.json").read_text())
NODES_2411 = json.loads((FIX / "slurm-24.11" / "scontrol_show_node.json").read_text())
TOKEN = "eyJhbGciOiJIUzI1NiJ9.SECRET-JWT-VALUE.sig"


def _ping(version: str) -> dict:
    return {"meta": {"plugin": {"type": f"openapi/{version}"},
                     "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"}},
            "errors": [], "pings": [{"hostname": "ctl", "ping": "UP", "status": 0, "mode": "primary"}]}


class Stub:
    """Routes: (method, path) -> (status, body). Unknown paths: 404 with a non-JSON body, like slurmrestd."""

    def __init__(self, versions=("v0.0.38",)):
        self.routes = {}
        self.requests = []
        self.fail_next = []  # statuses to answer (then normal routing)
        for v in versions:
            self.routes[("GET", f"/slurm/{v}/ping")] = (200, _ping(v))

    def handler(self):
        stub = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                query = parse_qs(parts.query, keep_blank_values=True)
                stub.requests.append({"method": self.command, "path": parts.path, "query": query,
                                      "headers": dict(self.headers), "body": json.loads(raw) if raw else None})
                if stub.fail_next:
                    status, body = stub.fail_next.pop(0)
                else:
                    status, body = stub.routes.get((self.command, parts.path), (404, "Unable to find path"))
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _serve

            def log_message(self, *args):
                pass

        return H


@pytest.fixture
def tcp_stub():
    servers = []

    def start(stub: Stub) -> str:
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), stub.handler())
        srv.daemon_threads = True
        srv.block_on_close = False
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def no_sleep(monkeypatch):
    """Make the backend's retries instant, recording the delays."""
    delays = []
    real = base.with_retries
    monkeypatch.setattr(rest_backend, "with_retries",
                        lambda fn, retries: real(fn, retries, sleep=delays.append))
    return delays


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---- reads on v0.0.38 (Slurm 22.05) ------------------------------------------------------------------------

def test_v0038_reads_nodes_jobs_version(tcp_stub, no_sleep):
    stub = Stub(versions=("v0.0.38",))
    stub.routes[("GET", "/slurm/v0.0.38/nodes")] = (200, SINFO_2205)
    stub.routes[("GET", "/slurm/v0.0.38/jobs")] = (200, SQUEUE_2205)
    url = tcp_stub(stub)
    slurm = RestSlurm(url, user="autoheal", token=TOKEN, retries=0)
    nodes = slurm.list_nodes()
    assert [n.name for n in nodes] == ["gpu1", "gpu2", "gpu3", "spare1"]
    assert slurm.api == "v0.0.38"
    # auto-detection asked the newer versions first and got 404s
    probed = [r["path"] for r in stub.requests if r["path"].endswith("/ping")]
    assert probed == ["/slurm/v0.0.45/ping", "/slurm/v0.0.44/ping", "/slurm/v0.0.43/ping",
                      "/slurm/v0.0.42/ping", "/slurm/v0.0.41/ping", "/slurm/v0.0.40/ping",
                      "/slurm/v0.0.39/ping", "/slurm/v0.0.38/ping"]
    assert [j.job_id for j in slurm.list_jobs()] == ["1"]
    assert [j.job_id for j in slurm.list_jobs(node="gpu3")] == ["1"]
    assert slurm.list_jobs(node="gpu2") == []
    assert slurm.list_jobs(states=["pending"]) == []
    assert str(slurm.version()) == "22.05.8"
    assert slurm.ping() is True
    hdr = stub.requests[-1]["headers"]
    assert hdr["X-SLURM-USER-NAME"] == "autoheal"
    assert hdr["X-SLURM-USER-TOKEN"] == TOKEN


def test_version_from_numbers_when_release_missing(tcp_stub):
    stub = Stub(versions=("v0.0.40",))
    stub.routes[("GET", "/slurm/v0.0.40/ping")] = (200, {"meta": {"slurm": {"version": {
        "major": "24", "minor": "11", "micro": "5"}}}, "pings": []})
    slurm = RestSlurm(tcp_stub(stub), api_version="v0.0.40", retries=0)
    v = slurm.version()
    assert (v.major, v.minor, v.patch) == (24, 11, 5)
    assert slurm.ping() is False  # no pings listed


def test_get_node_and_not_found(tcp_stub):
    stub = Stub(versions=("v0.0.40",))
    one = dict(NODES_2411, nodes=[NODES_2411["nodes"][2]])
    stub.routes[("GET", "/slurm/v0.0.40/node/node005")] = (200, one)
    stub.routes[("GET", "/slurm/v0.0.40/node/ghost")] = (
        404, {"errors": [{"description": "Invalid node name specified", "error_number": 2008,
                          "error": "Invalid node name specified", "source": "slurm_load_node_single"}]})
    slurm = RestSlurm(tcp_stub(stub), api_version="v0.0.40", retries=0)
    node = slurm.get_node("node005")
    assert node.state == "IDLE" and node.drain
    with pytest.raises(SlurmNotFound, match="Invalid node name"):
        slurm.get_node("ghost")


def test_get_job_by_array_id(tcp_stub):
    stub = Stub(versions=("v0.0.40",))
    stub.routes[("GET", "/slurm/v0.0.40/job/123_4")] = (200, {"jobs": [
        {"job_id": 130, "array_job_id": {"set": True, "number": 123}, "array_task_id": {"set": True, "number": 4},
         "job_state": ["RUNNING"], "nodes": "gpu1"}]})
    slurm = RestSlurm(tcp_stub(stub), api_version="v0.0.40", retries=0)
    job = slurm.get_job("123_4")
    assert job.job_id == "123_4" and job.raw_id == "130"
    assert stub.requests[-1]["path"] == "/slurm/v0.0.40/job/123_4"


# ---- writes ---------------------------------------------------------------------------------------------------

def test_v0040_writes_paths_methods_bodies(tcp_stub):
    stub = Stub(versions=("v0.0.40", "v0.0.38"))
    for path in ("/slurm/v0.0.40/node/gpu1", "/slurm/v0.0.40/job/42"):
        stub.routes[("POST", path)] = (200, {"errors": [], "warnings": []})
    stub.routes[("DELETE", "/slurm/v0.0.40/job/42")] = (200, {"errors": []})
    slurm = RestSlurm(tcp_stub(stub), token=TOKEN, user="root", retries=0)
    slurm.drain("gpu1", "autoheal: xid 79")
    slurm.resume("gpu1")
    slurm.set_reason("gpu1", "autoheal: ecc")
    slurm.update_job("42", JobUpdate(excluded_nodes=("gpu1", "gpu2"), comment="autoheal: moved"))
    slurm.release("42")
    slurm.signal_job("42", "USR2", batch=True)
    slurm.signal_job("42", "TERM", full=True)
    slurm.signal_job("42", "KILL")
    writes = [r for r in stub.requests if r["method"] != "GET"]
    assert [(r["method"], r["path"]) for r in writes] == [
        ("POST", "/slurm/v0.0.40/node/gpu1"), ("POST", "/slurm/v0.0.40/node/gpu1"),
        ("POST", "/slurm/v0.0.40/node/gpu1"), ("POST", "/slurm/v0.0.40/job/42"),
        ("POST", "/slurm/v0.0.40/job/42"), ("DELETE", "/slurm/v0.0.40/job/42"),
        ("DELETE", "/slurm/v0.0.40/job/42"), ("DELETE", "/slurm/v0.0.40/job/42")]
    assert writes[0]["body"] == {"state": ["DRAIN"], "reason": "autoheal: xid 79"}
    assert writes[1]["body"] == {"state": ["RESUME"]}
    assert writes[2]["body"] == {"state": ["DRAIN"], "reason": "autoheal: ecc"}
    assert writes[3]["body"] == {"excluded_nodes": ["gpu1", "gpu2"], "comment": "autoheal: moved"}
    assert writes[4]["body"] == {"hold": False}
    assert writes[5]["query"] == {"signal": ["USR2"], "flags": ["BATCH_JOB"]}
    assert writes[6]["query"] == {"signal": ["TERM"], "flags": ["FULL_JOB"]}
    assert writes[7]["query"] == {"signal": ["KILL"]}
    assert all(w["headers"]["X-SLURM-USER-TOKEN"] == TOKEN for w in writes)
    assert writes[0]["headers"]["Content-Type"] == "application/json"


def test_node_name_is_url_quoted(tcp_stub):
    stub = Stub(versions=("v0.0.40",))
    stub.routes[("POST", "/slurm/v0.0.40/node/a%20b")] = (200, {})
    slurm = RestSlurm(tcp_stub(stub), api_version="v0.0.40", retries=0)
    slurm.drain("a b", "autoheal: x")
    assert stub.requests[-1]["path"] == "/slurm/v0.0.40/node/a%20b"


def test_v0038_writes_refused_naming_cli_backend(tcp_stub):
    stub = Stub(versions=("v0.0.38",))
    slurm = RestSlurm(tcp_stub(stub), retries=0)
    for call in (lambda: slurm.drain("gpu1", "x"), lambda: slurm.resume("gpu1"),
                 lambda: slurm.update_job("1", JobUpdate(comment="x")), lambda: slurm.signal_job("1", "TERM")):
        with pytest.raises(SlurmError) as err:
            call()
        assert "slurm.backend = 'cli'" in str(err.value)
        assert "v0.0.38" in str(err.value)
    assert all(r["method"] == "GET" for r in stub.requests)


def test_cli_only_calls_without_scontrol_are_not_supported():
    slurm = RestSlurm("http://127.0.0.1:9", api_version="v0.0.40")
    for call in (lambda: slurm.reboot("gpu1", "x"), lambda: slurm.requeue("1"), slurm.show_config):
        with pytest.raises(SlurmNotSupported, match="scontrol is not installed"):
            call()
    caps = slurm.capabilities()
    assert caps["requeue"] == caps["reboot"] == caps["show-config"] == caps["resize-job"] == ""
    assert caps["drain"] == caps["release"] == "rest"


class RecordingCli:
    """Stands in for the CLI fallback: records what the REST backend hands over to it."""

    name = "cli"

    def __init__(self):
        self.calls = []

    def __getattr__(self, op):
        return lambda *a, **kw: self.calls.append((op, a, kw))


def test_requeue_and_reboot_go_through_the_cli_fallback():
    cli = RecordingCli()
    slurm = RestSlurm("http://127.0.0.1:9", api_version="v0.0.40", fallback=cli)
    slurm.requeue("7", hold=True)
    slurm.reboot("gpu1", "r", asap=True, nextstate="resume")
    assert [c[0] for c in cli.calls] == ["requeue", "reboot"]
    assert cli.calls[0] == ("requeue", ("7",), {"hold": True})
    caps = slurm.capabilities()
    assert caps["requeue"] == "cli" and caps["drain"] == "rest" and caps["read"] == "rest"
    assert caps["update-job"] == "rest" and caps["resize-job"] == "cli"  # update_job's resize goes to scontrol


def test_v0045_requeues_through_slurmrestd(tcp_stub):
    """Slurm 26.05's v0.0.45 has GET /job/{id}/requeue with a Hold flag (the OpenAPI spec its slurmrestd
    generates); older versions keep the CLI fallback (test above)."""
    stub = Stub(versions=("v0.0.45",))
    stub.routes[("GET", "/slurm/v0.0.45/job/7/requeue")] = (200, {"errors": [], "warnings": []})
    cli = RecordingCli()
    slurm = RestSlurm(tcp_stub(stub), token=TOKEN, retries=0, fallback=cli)
    assert slurm.api == "v0.0.45" and slurm.capabilities()["requeue"] == "rest"
    slurm.requeue("7", hold=True)
    slurm.requeue("7")
    calls = [r for r in stub.requests if r["path"].endswith("/requeue")]
    # "Hold=true", never "Hold=": 26.05.5 takes an empty value for no hold (observed in the lab)
    assert [c["query"] for c in calls] == [{"Hold": ["true"]}, {}]
    assert cli.calls == []  # nothing went to scontrol
    assert slurm.capabilities()["reboot"] == "cli"  # still no reboot call in v0.0.45


def test_v0045_requeue_refusals_are_typed(tcp_stub):
    from autoheal.errors import SlurmRequeueDisabled

    stub = Stub(versions=("v0.0.45",))
    stub.routes[("GET", "/slurm/v0.0.45/job/8/requeue")] = (
        500, {"errors": [{"description": "Requeue of this job is disabled", "error_number": 2031,
                          "error": "Requeue of this job is disabled", "source": "slurm_requeue2()"}]})
    slurm = RestSlurm(tcp_stub(stub), retries=0)
    with pytest.raises(SlurmRequeueDisabled):
        slurm.requeue("8")


def test_v0038_writes_go_through_the_cli_fallback(tcp_stub):
    stub = Stub(versions=("v0.0.38",))
    cli = RecordingCli()
    slurm = RestSlurm(tcp_stub(stub), retries=0, fallback=cli)
    slurm.drain("gpu1", "autoheal: x")
    slurm.resume("gpu1")
    slurm.update_job("3", JobUpdate(excluded_nodes=("gpu2",)))
    slurm.release("3")
    slurm.signal_job("3", "USR2", batch=True)
    assert [c[0] for c in cli.calls] == ["drain", "resume", "update_job", "release", "signal_job"]
    assert all(r["method"] == "GET" for r in stub.requests)  # nothing written through v0.0.38
    assert slurm.capabilities()["drain"] == "cli"


@pytest.mark.parametrize("text,kind", [
    ("Job is no longer pending execution", "SlurmJobNotPending"),
    ("Job is pending execution", "SlurmJobAlreadyPending"),
    ("Job/step already completing or completed", "SlurmJobFinished"),
    ("Requested operation is presently disabled", "SlurmRequeueDisabled"),
    ("Job can not be altered now, try again later", "SlurmJobBusy"),
    ("Unexpected message received", "SlurmJobBusy"),
])
def test_job_write_refusals_are_typed(tcp_stub, text, kind):
    import autoheal.errors as E

    stub = Stub(versions=("v0.0.40",))
    stub.routes[("POST", "/slurm/v0.0.40/job/5")] = (
        500, {"errors": [{"description": "Job update failed", "error_number": 2000, "error": text}]})
    slurm = RestSlurm(tcp_stub(stub), api_version="v0.0.40", retries=0)
    with pytest.raises(getattr(E, kind)):
        slurm.update_job("5", JobUpdate(excluded_nodes=("gpu2",)))


# ---- errors ---------------------------------------------------------------------------------------------------

def test_token_never_in_repr_or_errors(tcp_stub, no_sleep, tmp_path):
    stub = Stub(versions=("v0.0.40",))
    stub.routes[("GET", "/slurm/v0.0.40/nodes")] = (401, "Authentication failure")
    slurm = RestSlurm(tcp_stub(stub), api_version="v0.0.40", user="root", token=TOKEN, retries=0)
    assert TOKEN not in repr(slurm) and "SECRET" not in repr(slurm)
    with pytest.raises(SlurmError) as err:
        slurm.list_nodes()
    assert "authentication refused" in str(err.value)
    assert "HTTP 401" in str(err.value)
    assert "SECRET" not in str(err.value)
    down = RestSlurm(f"http://127.0.0.1:{_closed_port()}", api_version="v0.0.40", token=TOKEN, retries=0)
    with pytest.raises(SlurmUnavailable) as err2:
        down.list_nodes()
    assert "SECRET" not in str(err2.value)


def test_401_during_version_detection_is_auth_error(tcp_stub):
    stub = Stub(versions=())
    stub.fail_next = [(401, "")]
    slurm = RestSlurm(tcp_stub(stub), token=TOKEN, retries=0)
    with pytest.raises(SlurmError, match="authentication refused"):
        slurm.api  # noqa: B018
    assert len(stub.requests) == 1  # no point trying other versions


def test_no_known_version(tcp_stub):
    slurm = RestSlurm(tcp_stub(Stub(versions=())), retries=0)
    with pytest.raises(SlurmError, match="serves none of v0.0.45"):
        slurm.api  # noqa: B018


def test_500_retried_then_unavailable(tcp_stub, no_sleep):
    stub = Stub(versions=("v0.0.40",))
    stub.routes[("GET", "/slurm/v0.0.40/nodes")] = (500, "")
    slurm = RestSlurm(tcp_stub(stub), api_version="v0.0.40", retries=2)
    with pytest.raises(SlurmUnavailable, match="HTTP 500"):
        slurm.list_nodes()
    assert len([r for r in stub.requests if r["path"].endswith("/nodes")]) == 3
    assert no_sleep == [0.5, 1.0]


def test_500_then_success(tcp_stub, no_sleep):
    stub = Stub(versions=("v0.0.40",))
    stub.routes[("GET", "/slurm/v0.0.40/nodes")] = (200, NODES_2411)
    stub.fail_next = [(503, ""), (502, "")]
    slurm = RestSlurm(tcp_stub(stub), api_version="v0.0.40", retries=2)
    assert len(slurm.list_nodes()) == 4
    assert no_sleep == [0.5, 1.0]


def test_500_with_unable_to_contact_is_unavailable(tcp_stub, no_sleep):
    stub = Stub(versions=("v0.0.40",))
    stub.routes[("GET", "/slurm/v0.0.40/jobs")] = (500, {"errors": [
        {"description": "Unable to contact slurm controller (connect failure)", "error_number": 1007}]})
    slurm = RestSlurm(tcp_stub(stub), api_version="v0.0.40", retries=1)
    with pytest.raises(SlurmUnavailable, match="Unable to contact"):
        slurm.list_jobs()


def test_error_list_with_200_is_slurm_error(tcp_stub):
    stub = Stub(versions=("v0.0.40",))
    stub.routes[("POST", "/slurm/v0.0.40/node/gpu1")] = (200, {"errors": [{"error": "Access denied"}]})
    slurm = RestSlurm(tcp_stub(stub), api_version="v0.0.40", retries=0)
    with pytest.raises(SlurmError, match="Access denied") as err:
        slurm.drain("gpu1", "x")
    assert not isinstance(err.value, SlurmUnavailable)


def test_non_json_answer_is_parse_error(tcp_stub):
    stub = Stub(versions=("v0.0.40",))
    stub.routes[("GET", "/slurm/v0.0.40/nodes")] = (200, "<html>proxy</html>")
    slurm = RestSlurm(tcp_stub(stub), api_version="v0.0.40", retries=0)
    with pytest.raises(SlurmParseError, match="answer is not JSON"):
        slurm.list_nodes()


def test_connection_refused_is_unavailable(no_sleep):
    slurm = RestSlurm(f"http://127.0.0.1:{_closed_port()}", api_version="v0.0.40", retries=2)
    with pytest.raises(SlurmUnavailable, match="cannot connect"):
        slurm.list_nodes()
    assert no_sleep == [0.5, 1.0]
    assert slurm.ping() is False


def test_connection_refused_during_detection(no_sleep):
    slurm = RestSlurm(f"http://127.0.0.1:{_closed_port()}", retries=0)
    with pytest.raises(SlurmUnavailable):
        slurm.list_nodes()


# ---- from_config ------------------------------------------------------------------------------------------------

def test_from_config_token_file_and_env(tmp_path, monkeypatch):
    from autoheal.config import parse_config

    tok = tmp_path / "jwt"
    tok.write_text(TOKEN + "\n")
    cfg = parse_config(f"[slurm]\nbackend = 'rest'\nrest_url = 'http://h:6820'\nrest_user = 'u'\n"
                       f"rest_allow_http = true\nrest_token_file = '{tok}'\nrest_api_version = 'v0.0.40'\n")
    slurm = RestSlurm.from_config(cfg.slurm)
    assert slurm._session.headers["X-SLURM-USER-TOKEN"] == TOKEN
    assert slurm.api == "v0.0.40"
    monkeypatch.setenv("MY_JWT", "envtoken")
    cfg2 = parse_config("[slurm]\nbackend = 'rest'\nrest_url = 'https://h'\nrest_token_env = 'MY_JWT'\n")
    assert RestSlurm.from_config(cfg2.slurm)._session.headers["X-SLURM-USER-TOKEN"] == "envtoken"


def test_from_config_missing_token_file(tmp_path):
    from autoheal.config import parse_config

    cfg = parse_config(f"[slurm]\nbackend = 'rest'\nrest_url = 'https://h'\n"
                       f"rest_token_file = '{tmp_path / 'none'}'\n")
    with pytest.raises(SlurmError, match="rest_token_file .* cannot read"):
        RestSlurm.from_config(cfg.slurm)


# ---- unix socket ----------------------------------------------------------------------------------------------

def test_unix_socket_transport(tmp_path):
    stub = Stub(versions=("v0.0.40",))
    stub.routes[("GET", "/slurm/v0.0.40/nodes")] = (200, NODES_2411)
    stub.routes[("POST", "/slurm/v0.0.40/node/node003")] = (200, {"errors": []})
    sock_path = str(tmp_path / "slurmrestd.sock")

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True
        block_on_close = False

    srv = Server(sock_path, stub.handler())
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        slurm = RestSlurm(f"unix:{sock_path}", retries=0)
        assert [n.name for n in slurm.list_nodes()] == ["node001", "node003", "node005", "node009"]
        assert slurm.api == "v0.0.40"
        slurm.drain("node003", "autoheal: xid 79")
        assert stub.requests[-1]["method"] == "POST"
        assert stub.requests[-1]["body"] == {"state": ["DRAIN"], "reason": "autoheal: xid 79"}
        assert "X-SLURM-USER-TOKEN" not in stub.requests[-1]["headers"]  # local auth
    finally:
        srv.shutdown()
        srv.server_close()
    os.unlink(sock_path)
    with pytest.raises(SlurmUnavailable):
        RestSlurm(f"unix:{sock_path}", api_version="v0.0.40", retries=0).list_nodes()


# ---- with_retries --------------------------------------------------------------------------------------------

def test_with_retries_doubles_delay_and_caps():
    delays, calls = [], []

    def fn():
        calls.append(1)
        raise SlurmUnavailable("down")

    with pytest.raises(SlurmUnavailable):
        base.with_retries(fn, retries=6, base_delay=0.5, sleep=delays.append)
    assert len(calls) == 7
    assert delays == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_with_retries_returns_after_transient_failure():
    delays, results = [], iter([SlurmUnavailable("a"), SlurmUnavailable("b"), "ok"])

    def fn():
        r = next(results)
        if isinstance(r, Exception):
            raise r
        return r

    assert base.with_retries(fn, retries=3, base_delay=0.1, sleep=delays.append) == "ok"
    assert delays == [0.1, 0.2]


@pytest.mark.parametrize("exc", [SlurmError("refused"), SlurmNotFound("gone"), SlurmParseError("bad"),
                                 ValueError("bug")])
def test_with_retries_does_not_retry_other_errors(exc):
    delays, calls = [], []

    def fn():
        calls.append(1)
        raise exc

    with pytest.raises(type(exc)):
        base.with_retries(fn, retries=5, sleep=delays.append)
    assert calls == [1] and delays == []


def test_with_retries_zero_retries():
    calls = []

    def fn():
        calls.append(1)
        raise SlurmUnavailable("x")

    with pytest.raises(SlurmUnavailable):
        base.with_retries(fn, retries=0, sleep=lambda s: pytest.fail("slept"))
    assert calls == [1]


@pytest.mark.parametrize("msg, expected", [
    ("slurm_load_jobs error: Unable to contact slurm controller (connect failure)", True),
    ("Socket timed out on send/recv operation", True),
    ("Invalid job id specified", False),
    ("Access/permission denied", False),
])
def test_unavailable_if(msg, expected):
    assert base.unavailable_if(msg) is expected


def test_batch_script_goes_through_the_cli_fallback_like_requeue():
    # issue 15: xid-watch reads a job's #SBATCH --signal from its script; slurmrestd has no call for it,
    # and the REST backend answered SlurmNotSupported even with scontrol installed beside it
    cli = RecordingCli()
    slurm = RestSlurm("http://127.0.0.1:9", api_version="v0.0.40", fallback=cli)
    slurm.batch_script("7")
    assert cli.calls == [("batch_script", ("7",), {})]
    assert slurm.capabilities()["batch-script"] == "cli"
    alone = RestSlurm("http://127.0.0.1:9", api_version="v0.0.40")
    with pytest.raises(SlurmNotSupported, match="scontrol is not installed"):
        alone.batch_script("7")
    assert alone.capabilities()["batch-script"] == ""


def test_unserved_endpoint_is_typed_not_supported_and_version_probe_stops_on_other_errors(tcp_stub, no_sleep):
    stub = Stub(versions=("v0.0.38",))
    url = tcp_stub(stub)
    slurm = RestSlurm(url, user="autoheal", token=TOKEN, retries=0)
    with pytest.raises(SlurmNotSupported, match="endpoint not served"):
        slurm._request("GET", "/slurm/v0.0.38/no-such-endpoint")
    # a refused token is not "this version is missing": the probe stops at the first answer
    stub.fail_next = [(401, {"errors": []})]
    fresh = RestSlurm(url, user="autoheal", token=TOKEN, retries=0)
    with pytest.raises(SlurmError, match="authentication refused") as caught:
        _ = fresh.api
    assert not isinstance(caught.value, SlurmNotSupported)
    assert [r["path"] for r in stub.requests][-1] == "/slurm/v0.0.45/ping"


def test_job_gpus_and_history_go_through_the_cli_fallback():
    cli = RecordingCli()
    slurm = RestSlurm("http://127.0.0.1:9", api_version="v0.0.40", fallback=cli)
    slurm.job_gpus("7", "gpu1", timeout=3)
    slurm.job_state_history("7")
    assert cli.calls == [("job_gpus", ("7", "gpu1"), {"timeout": 3}), ("job_state_history", ("7",), {})]
    assert slurm.capabilities()["job-gpus"] == slurm.capabilities()["job-history"] == "cli"
    alone = RestSlurm("http://127.0.0.1:9", api_version="v0.0.40")
    for call in (lambda: alone.job_gpus("7", "gpu1"), lambda: alone.job_state_history("7")):
        with pytest.raises(SlurmNotSupported, match="scontrol is not installed"):
            call()
    assert alone.capabilities()["job-gpus"] == alone.capabilities()["job-history"] == ""


@pytest.mark.parametrize("msg,expected", [
    ("Invalid node name specified", True),
    ("Invalid job id specified", True),
    ("scontrol: error: Node gpu9 not found", True),
    ("Invalid node state specified", False),
    ("Access/permission denied", False),
])
def test_not_found_words_are_shared_by_the_backends(msg, expected):
    assert base.not_found_if(msg) is expected


def test_a_resize_goes_through_the_cli_fallback_as_capabilities_say():
    cli = RecordingCli()
    slurm = RestSlurm("http://127.0.0.1:9", api_version="v0.0.40", fallback=cli)
    slurm.update_job("8", JobUpdate(nodes=("gpu1", "gpu3")))
    slurm.update_job("8", JobUpdate(node_count=(2, 2)))
    assert [c[0] for c in cli.calls] == ["update_job", "update_job"]  # nothing was posted to slurmrestd
    assert slurm.capabilities()["resize-job"] == "cli"
