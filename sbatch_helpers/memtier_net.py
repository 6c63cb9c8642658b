"""TCP between the memory tier's trainers and agents: one request frame, one answer frame per connection.

Real sockets between nodes (the lab gives each node its own loopback address, as Slurm's NodeAddr), so
a node that died answers nothing (refused, or a timeout) and its memory is out of reach, as on real
hardware.
"""

from __future__ import annotations

import socket
from typing import Tuple

from autoheal.sbatch_helpers import memtier_wire as wire

Address = Tuple[str, int]


def parse_address(text: str) -> Address:
    """``127.0.0.11:40123`` -> (host, port); ValueError when it is not one."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port")
    return host.strip("[]"), int(port)


def recv_exact(sock: socket.socket) -> wire.ReadExact:
    """``read(n)`` over a socket: exactly n bytes, or fewer when the peer closed."""

    def read(n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            chunk = sock.recv(min(n - got, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    return read


def request(address: Address, frame: bytes, key: bytes, timeout: float, max_payload: int) -> wire.Frame:
    """Send one frame and return the verified answer; OSError (unreachable) or FrameError."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(frame)
        sock.shutdown(socket.SHUT_WR)
        return wire.read_frame(recv_exact(sock), key, max_payload)
