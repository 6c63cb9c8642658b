"""The sync's metrics server under a slow-loris client (issue 25, item 6): bounded reads, bounded
connections. Real sockets on loopback against the real HealthServer."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

pytest.importorskip("prometheus_client")

from autoheal.k8s_sync.metrics import MAX_CONNECTIONS, HealthServer, Metrics

READ_TIMEOUT = 2.0


@pytest.fixture
def server():
    srv = HealthServer(Metrics(), "127.0.0.1", 0, resync=1.0, read_timeout=READ_TIMEOUT).start()
    yield srv
    srv.stop()


def _scrape(port, timeout=5.0):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as resp:
        return resp.status, resp.read()


def test_a_byte_a_second_client_is_cut_off_and_others_are_served(server):
    slow = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    request = b"GET /metrics HTTP/1.0\r\nX-Slow: " + b"a" * 60
    closed_after = None
    stop = threading.Event()
    scrapes = []

    def scrape_meanwhile():
        while not stop.is_set():
            scrapes.append(_scrape(server.port)[0])
            time.sleep(0.2)

    t = threading.Thread(target=scrape_meanwhile, daemon=True)
    t.start()
    started = time.monotonic()
    try:
        for i in range(len(request)):  # one byte a second: each read returns well within any per-read timeout
            try:
                slow.sendall(request[i:i + 1])
                slow.settimeout(1.0)
                data = slow.recv(1)  # the server answers nothing until the request is complete...
                if data == b"":
                    closed_after = time.monotonic() - started  # ... or closes the connection
                    break
            except socket.timeout:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
    finally:
        stop.set()
        t.join(10)
        slow.close()
    assert closed_after is not None, "the slow client was never cut off"
    assert closed_after < len(request)  # cut before it could finish trickling its request in
    assert scrapes and set(scrapes) == {200}  # other scrapes kept answering meanwhile


def test_connections_beyond_the_limit_are_closed_not_queued(server):
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(MAX_CONNECTIONS)]
    try:
        deadline = time.monotonic() + 5
        while server.httpd.slots._value and time.monotonic() < deadline:  # all accepted, each holding a slot
            time.sleep(0.05)
        extra = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        extra.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        assert extra.recv(100) == b""  # closed at once: no thread, no answer
        extra.close()
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + READ_TIMEOUT + 5
    while True:  # the slots come back once those connections are gone
        try:
            assert _scrape(server.port, timeout=2)[0] == 200
            break
        except (OSError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
