"""The warm interpreter's intake of one request (``warm_zygote.Zygote._accept``), in this process: a real
listening unix socket and a real client socket, nothing forked (``os.fork`` is made to fail where a fork
would come). The whole processes are in tests/integration/test_warm_local.py."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import sys
import threading

import pytest

from autoheal.sbatch_helpers import warm, warm_zygote


@pytest.fixture
def zyg(tmp_path):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "warm.sock"))
    listener.listen(4)
    z = warm_zygote.Zygote(listener, warm.Facts(sys.executable, {"SLURM_JOB_ID": "42"}), "n1")
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(30)
    client.connect(str(tmp_path / "warm.sock"))
    stdio = [os.open(os.devnull, os.O_RDWR) for _ in range(3)]
    socket.send_fds(client, [b"F"], stdio)
    yield z, client
    client.close()
    listener.close()
    warm_zygote._close([z.wake_r, z.wake_w, *stdio])


def _reply(client: socket.socket) -> dict:
    reader = warm.FrameReader()
    while not reader.pending:
        data = client.recv(4096)
        assert data, "the warm interpreter closed without a word"
        reader.feed(data)
    return reader.take() or {}


def test_a_request_longer_than_the_bound_is_refused_with_a_reason_the_client_can_show(zyg):
    z, client = zyg
    client.sendall(struct.pack(">I", warm.MAX_FRAME + 1))  # a length it never reads that much of
    assert z._accept() is None
    got = _reply(client)
    assert "refused the request" in got["refused"] and f"at most {warm.MAX_FRAME}" in got["refused"]


def test_a_request_trickled_in_is_refused_at_one_bound_for_the_whole_request(zyg, monkeypatch):
    # each read came within the time allowed, so a client sending a byte at a time held the warm
    # interpreter (and every running rank's signals, which wait for its loop) for as long as it liked
    z, client = zyg
    monkeypatch.setattr(warm, "REQUEST_TIMEOUT", 0.5)
    frame = warm.encode(warm.Request(("python", "t.py"), sys.executable, {"SLURM_JOB_ID": "42"}, "/", 0o22).to_msg())
    stop, sent_all = threading.Event(), threading.Event()

    def trickle() -> None:
        for i in range(len(frame)):
            if stop.wait(0.05):
                return
            with contextlib.suppress(OSError):
                client.send(frame[i:i + 1])
        sent_all.set()

    t = threading.Thread(target=trickle)
    t.start()
    try:
        assert z._accept() is None
    finally:
        stop.set()
        t.join()
    assert not sent_all.is_set()  # refused while the request was still coming
    assert "not whole within 0.5s" in _reply(client)["refused"]


def test_a_fork_that_fails_refuses_that_rank_and_leaves_the_signal_mask_as_it_was(zyg, monkeypatch):
    z, client = zyg
    monkeypatch.setattr(warm, "thread_count", lambda task_dir="": 1)

    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    client.sendall(warm.encode(warm.Request(("python", "t.py"), sys.executable, {"SLURM_JOB_ID": "42"}, "/",
                                            0o22).to_msg()))
    assert z._accept() is None
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
    assert "cannot fork (Resource temporarily unavailable)" in _reply(client)["refused"]
