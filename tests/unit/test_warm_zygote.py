"""The warm interpreter's intake of one request (``warm_zygote.Zygote._accept``), in this process: a real
listening unix socket and a real client socket, nothing forked (``os.fork`` is made to fail where a fork
would come). The whole processes are in tests/integration/test_warm_local.py."""

from __future__ import annotations

import os
import signal
import socket
import sys

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
