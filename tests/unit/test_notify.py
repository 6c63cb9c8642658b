"""Webhook notifications against a local HTTP server."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import pytest

from autoheal.journal import Journal, Record
from autoheal.notify import Notifier, _redact, format_text


class _Hook:
    """A local webhook endpoint: records requests, answers with scripted status codes."""

    def __init__(self, statuses=(200,), delay: float = 0.0):
        self.statuses = list(statuses)
        self.delay = delay
        self.requests = []
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if hook.delay:
                    time.sleep(hook.delay)
                status = hook.statuses.pop(0) if len(hook.statuses) > 1 else hook.statuses[0]
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T000/B000/SECRETTOKEN"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook_factory():
    made = []

    def make(**kw):
        h = _Hook(**kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def _closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/services/T000/B000/SECRETTOKEN"


def _rec(**kw) -> Record:
    base = dict(event="drain", node="gpu1", check="xid", message="xid 79 on gpu 3", outcome="drained",
                job_ids=["12", "13"], severity="action", time=1.0, host="h")
    base.update(kw)
    return Record(**base)


def test_success_delivers_slack_json(hook_factory, tmp_path):
    hook = hook_factory()
    n = Notifier([hook.url], timeout=2, retries=0, cluster="lab")
    n.send(_rec())
    assert n.flush(5)
    assert len(hook.requests) == 1
    req = hook.requests[0]
    assert req["path"] == "/services/T000/B000/SECRETTOKEN"
    assert req["headers"]["Content-Type"] == "application/json"
    payload = json.loads(req["body"])
    assert payload["text"] == "[lab] gpu1: drain | check xid | xid 79 on gpu 3 | jobs 12,13 | -> drained"
    assert payload["autoheal"]["event"] == "drain"
    assert payload["autoheal"]["job_ids"] == ["12", "13"]
    assert n.results == [{"url": hook.url, "ok": True, "attempts": 1}]


def test_format_text_falls_back_to_host():
    assert format_text(Record(event="detection", host="h7")) == "h7: detection"


def test_endpoint_down_bounded_attempts_and_redacted_journal(tmp_path):
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    sleeps = []
    url = _closed_port_url()
    n = Notifier([url], timeout=1, retries=2, journal=journal, sleep=sleeps.append)
    t0 = time.monotonic()
    n.send(_rec())
    assert n.flush(5)
    assert time.monotonic() - t0 < 3
    assert n.results[0]["ok"] is False and n.results[0]["attempts"] == 3
    assert sleeps == [0.5, 1.0]
    failed = list(journal.read(events=["notify-failed"]))
    assert len(failed) == 1
    rec = failed[0]
    assert rec.severity == "error" and rec.node == "gpu1" and rec.job_ids == ["12", "13"]
    assert "after 3 attempts" in rec.message
    assert "SECRETTOKEN" not in rec.message and "/services" not in rec.message
    assert "127.0.0.1" in rec.message
    assert "SECRETTOKEN" not in (tmp_path / "j.jsonl").read_text()


def test_slow_endpoint_send_returns_at_once_and_flush_is_bounded(hook_factory):
    hook = hook_factory(delay=1.5)
    n = Notifier([hook.url], timeout=0.3, retries=1, sleep=lambda s: None)
    t0 = time.monotonic()
    n.send(_rec())
    assert time.monotonic() - t0 < 0.2
    t1 = time.monotonic()
    done = n.flush(0.2)
    assert time.monotonic() - t1 < 0.5
    assert done is False
    assert n.flush(3) is True  # timeouts end the delivery: 2 attempts x 0.3 s
    assert n.results[0]["ok"] is False and n.results[0]["attempts"] == 2


def test_4xx_not_retried(hook_factory):
    hook = hook_factory(statuses=(404,))
    sleeps = []
    n = Notifier([hook.url], timeout=2, retries=3, sleep=sleeps.append)
    n.send(_rec())
    assert n.flush(5)
    assert len(hook.requests) == 1
    assert n.results[0] == {"url": hook.url, "ok": False, "attempts": 1, "error": "HTTP 404"}
    assert sleeps == []


@pytest.mark.parametrize("first", [500, 503, 429])
def test_5xx_and_429_retried(hook_factory, first):
    hook = hook_factory(statuses=(first, first, 200))
    n = Notifier([hook.url], timeout=2, retries=3, sleep=lambda s: None)
    n.send(_rec())
    assert n.flush(5)
    assert len(hook.requests) == 3
    assert n.results[0] == {"url": hook.url, "ok": True, "attempts": 3}


def test_5xx_gives_up_after_retries(hook_factory):
    hook = hook_factory(statuses=(502,))
    n = Notifier([hook.url], timeout=2, retries=2, sleep=lambda s: None)
    n.send(_rec())
    assert n.flush(5)
    assert len(hook.requests) == 3
    assert n.results[0]["error"] == "HTTP 502"


@pytest.mark.parametrize("min_sev, sev, sent", [
    ("action", "info", False), ("action", "action", True), ("action", "error", True),
    ("error", "action", False), ("info", "info", True), ("bogus", "info", False), ("bogus", "action", True),
])
def test_min_severity(hook_factory, min_sev, sev, sent):
    hook = hook_factory()
    n = Notifier([hook.url], timeout=2, retries=0, min_severity=min_sev)
    n.send(_rec(severity=sev))
    assert n.flush(5)
    assert len(hook.requests) == (1 if sent else 0)


def test_force_and_extra_urls_bypass_severity(hook_factory):
    a, b = hook_factory(), hook_factory()
    n = Notifier([a.url], timeout=2, retries=0, min_severity="error")
    n.send(_rec(severity="info"), force=True)
    n.send(_rec(severity="info"), extra_urls=[b.url])
    assert n.flush(5)
    assert len(a.requests) == 2 and len(b.requests) == 1


def test_non_http_urls_ignored(hook_factory):
    hook = hook_factory()
    n = Notifier(["file:///etc/passwd", "ftp://h/x", "gopher://h", hook.url], timeout=2, retries=0)
    assert n.urls == [hook.url]
    n.send(_rec(), extra_urls=["file:///tmp/x"])
    assert n.flush(5)
    assert len(hook.requests) == 1
    assert [r["url"] for r in n.results] == [hook.url]


def test_no_urls_sends_nothing():
    n = Notifier(["file:///x"])
    n.send(_rec(severity="error"), force=True)
    assert n._workers == {} and n.flush(0.1)


def test_from_config(tmp_path):
    from autoheal.config import parse_config

    cfg = parse_config("[notify]\nwebhooks = ['https://h/a']\ntimeout = 1.5\nretries = 4\n"
                       "min_severity = 'error'\ncluster_name = 'c1'\n")
    n = Notifier.from_config(cfg)
    assert n.urls == ["https://h/a"] and n.timeout == 1.5 and n.retries == 4
    assert n.cluster == "c1" and n.min_level == 2


def test_redact():
    assert _redact("https://hooks.slack.com/services/T0/B0/XYZ") == "https://hooks.slack.com/..."
    assert _redact("no-scheme") == "<webhook>"
    assert _redact("https://user:s3cret@h.example:8443/x?token=1") == "https://h.example:8443/..."
    assert _redact("http://[::1]:9/x") == "http://[::1]:9/..."
    assert _redact("http://h:99999999/x") == "<webhook>"
