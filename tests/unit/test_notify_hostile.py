"""Webhooks that hang, trickle, redirect or answer garbage (issue 16, finding 6).

Healing never waits for a notification: ``send`` returns at once, one attempt ends within its total
deadline however the server behaves, ``flush`` returns by its timeout. Real servers on 127.0.0.1 speak
raw TCP so they can misbehave exactly; no test asserts a duration, only that waits that would never end
without the fix do end (bounded, generous waits).
"""

from __future__ import annotations

import socket
import threading

import pytest

from autoheal.journal import Journal, Record
from autoheal.notify import Notifier

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


class _RawServer:
    """Accepts connections and hands each to ``behave(conn, server)`` in its own thread."""

    def __init__(self, behave):
        self.behave = behave
        self.stop = threading.Event()      # set at teardown: every behaviour must end then
        self.requests = []                 # raw request heads, in arrival order
        self.arrived = threading.Semaphore(0)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/services/T0/B0/SECRET"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn):
        with conn:
            conn.settimeout(5)
            try:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    head += chunk
                self.requests.append(head)
                self.arrived.release()
                self.behave(conn, self)
            except OSError:
                pass  # the client gave up (that is the point of most tests here)

    def close(self):
        self.stop.set()
        self.sock.close()
        for t in self._threads:
            t.join(10)


@pytest.fixture
def server():
    made = []

    def make(behave):
        srv = _RawServer(behave)
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.close()


def _rec(**kw) -> Record:
    base = dict(event="drain", node="gpu1", message="xid 79", severity="action", job_ids=["7"], time=1.0, host="h")
    base.update(kw)
    return Record(**base)


def _hang(conn, srv):
    srv.stop.wait(60)


def _trickle_status(conn, srv):
    for ch in OK:  # one byte at a time, each well inside any per-read timeout
        if srv.stop.wait(0.05):
            return
        conn.sendall(bytes([ch]))


def _trickle_headers(conn, srv):
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    while not srv.stop.wait(0.05):
        conn.sendall(b"X")  # a header line that never ends


@pytest.mark.parametrize("behave", [_hang, _trickle_status, _trickle_headers], ids=["hang", "trickle-status",
                                                                                    "trickle-headers"])
def test_an_attempt_ends_at_its_total_deadline(server, tmp_path, behave):
    srv = server(behave)
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    n = Notifier([srv.url], timeout=0.5, retries=1, journal=journal, sleep=lambda s: None)
    n.send(_rec())
    # The trickling server would keep a per-read timeout alive for ~3 s per attempt (status) or for as
    # long as it runs (headers); the total deadline ends each attempt after 0.5 s.
    assert n.flush(30), "the sender outlived its deadline"
    assert n.results == [{"url": srv.url, "ok": False, "attempts": 2, "error": "no complete answer within 0.5s"}]
    assert len(srv.requests) == 2
    failed = list(journal.read(events=["notify-failed"]))
    assert len(failed) == 1 and "no complete answer within 0.5s" in failed[0].message
    assert "SECRET" not in failed[0].message


def test_send_never_waits_for_the_server_and_flush_returns_by_its_timeout(server):
    gate = threading.Event()
    srv = server(lambda conn, s: gate.wait(60) and conn.sendall(OK))
    n = Notifier([srv.url], timeout=30, retries=0)
    n.send(_rec())  # would block until the gate opens if sending were synchronous
    assert srv.arrived.acquire(timeout=30)
    assert n.results == []
    assert n.flush(0.2) is False  # the answer is still held back: flush gave up by its timeout
    gate.set()
    assert n.flush(30) is True
    assert n.results == [{"url": srv.url, "ok": True, "attempts": 1}]


def test_a_hung_webhook_does_not_delay_another(server):
    gate = threading.Event()
    hung = server(lambda conn, s: gate.wait(60))
    good = server(lambda conn, s: conn.sendall(OK))
    n = Notifier([hung.url, good.url], timeout=30, retries=0)
    n.send(_rec())
    assert good.arrived.acquire(timeout=30)
    for _ in range(300):
        if n.results:
            break
        gate.wait(0.1)
    assert n.results == [{"url": good.url, "ok": True, "attempts": 1}]
    gate.set()
    assert n.flush(30)


def test_full_queue_drops_and_journals_instead_of_growing(server, tmp_path):
    gate = threading.Event()
    srv = server(lambda conn, s: gate.wait(60) and conn.sendall(OK))
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    n = Notifier([srv.url], timeout=30, retries=0, journal=journal, queue_max=3)
    n.send(_rec(message="first"))
    assert srv.arrived.acquire(timeout=30)  # the first is in flight, the queue is empty
    for i in range(9):
        n.send(_rec(message=f"r{i}"))
    assert [r["error"] for r in n.results] == ["queue full"] * 6
    gate.set()
    assert n.flush(30)
    assert sum(r["ok"] for r in n.results) == 4
    dropped = [r for r in journal.read(events=["notify-failed"]) if "dropped" in r.message]
    assert len(dropped) == 1 and "6 records dropped" in dropped[0].message


def test_redirect_is_not_followed(server):
    def redirect(conn, srv):
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    srv = server(redirect)
    n = Notifier([srv.url], timeout=5, retries=3, sleep=lambda s: None)
    n.send(_rec())
    assert n.flush(30)
    assert n.results == [{"url": srv.url, "ok": False, "attempts": 1,
                          "error": "HTTP 302 (redirects are not followed)"}]
    assert len(srv.requests) == 1 and srv.requests[0].startswith(b"POST ")


@pytest.mark.parametrize("answer", [b"garbage\r\n\r\n", b"HTTP/1.1 2000 OK\r\n\r\n",
                                    b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 200 + b"\r\n"])
def test_garbage_answer_is_a_failed_attempt_not_a_dead_thread(server, tmp_path, answer):
    srv = server(lambda conn, s: conn.sendall(answer))
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    n = Notifier([srv.url], timeout=5, retries=1, journal=journal, sleep=lambda s: None)
    n.send(_rec())
    assert n.flush(30)
    assert n.results[0]["ok"] is False and n.results[0]["attempts"] == 2
    assert n.results[0]["error"].startswith("bad answer")
    assert len(list(journal.read(events=["notify-failed"]))) == 1


def test_the_same_url_twice_is_sent_once(server):
    srv = server(lambda conn, s: conn.sendall(OK))
    n = Notifier([srv.url], timeout=5, retries=0)
    n.send(_rec(), extra_urls=[srv.url])
    assert n.flush(30)
    assert len(srv.requests) == 1


def test_https_handshake_that_never_ends_is_cut_at_the_deadline(server):
    srv = server(_hang)  # plain TCP: the ClientHello is never answered
    url = srv.url.replace("http://", "https://")
    n = Notifier([url], timeout=0.5, retries=0)
    n.send(_rec())
    assert n.flush(30)
    assert n.results == [{"url": url, "ok": False, "attempts": 1, "error": "no complete answer within 0.5s"}]


def test_results_of_a_long_lived_notifier_stay_bounded(server, monkeypatch):
    import autoheal.notify as notify

    monkeypatch.setattr(notify, "RESULTS_MAX", 5)
    srv = server(lambda conn, s: conn.sendall(OK))
    n = Notifier([srv.url], timeout=5, retries=0)
    for i in range(12):
        n.send(_rec(message=str(i)))
    assert n.flush(60)
    assert len(srv.requests) == 12
    assert n.results == [{"url": srv.url, "ok": True, "attempts": 1}] * 5
