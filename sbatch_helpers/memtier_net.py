"""TCP between the memory tier's trainers and agents: one request frame, one answer frame per connection.

Real sockets between nodes (the lab gives each node its own loopback address, as Slurm's NodeAddr), so
a node that died answers nothing (refused, or a timeout) and its memory is out of reach, as on real
hardware.
"""

from __future__ import annotations

import socket
from typing import Sequence, Tuple, Union

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


def recv_frame(sock: socket.socket, limit: int) -> Union[bytes, bytearray]:
    """One whole frame's bytes, read straight into one buffer (its prefix says how long it is); a frame
    longer than ``limit`` payload bytes, or cut short, is a FrameError."""
    prefix = recv_exact(sock)(wire.PREFIX.size)
    size = wire.frame_size(prefix)
    if size > limit + wire.PREFIX.size + wire.MAX_HEADER + wire.MAC_BYTES:
        raise wire.FrameError(f"frame of {size} bytes is over the limit")
    buf = bytearray(size)
    buf[:len(prefix)] = prefix
    view, got = memoryview(buf), len(prefix)
    while got < size:
        n = sock.recv_into(view[got:], min(size - got, 4 << 20))
        if not n:
            raise wire.FrameError(f"truncated: {got} of {size} bytes (torn copy)")
        got += n
    return bytes(buf) if size < 4096 else buf


def request(address: Address, frame: Union[bytes, Sequence[bytes]], key: bytes, timeout: float,
            max_payload: int) -> wire.Frame:
    """Send one frame (bytes, or its parts) and return the verified answer; OSError (unreachable) or
    FrameError."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for part in ([frame] if isinstance(frame, (bytes, bytearray)) else frame):
            sock.sendall(part)
        sock.shutdown(socket.SHUT_WR)
        return wire.read_frame(wire.reader_of(recv_frame(sock, max_payload)), key, max_payload)
