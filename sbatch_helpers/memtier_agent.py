"""The memory tier's node agent: keeps this node's copies of the job's rank states and serves them.

``python -m autoheal.sbatch_helpers.memtier_agent`` -- one per node, started by the job runner as a
Slurm step (``memtier_launch.py``), so it lives and dies with the job (and the epilog kills it after a
kill -9 of the job: its pid is in the job's memory folder). It listens on the node's own address
(Slurm's NodeAddr) on a free port and prints one line on stdout, which srun carries back to the runner::

    autoheal-memtier-agent: ready node=<node> addr=<address> port=<port>

Requests (``memtier_wire`` frames, one per connection): STORE a copy (from a trainer on this node, or
from the trainer of a rank whose peer this node is), GET the newest valid copy of a rank. Every frame
is verified (HMAC with the job's key), so another user's process can neither plant a copy nor read one.
Exit: 0 on SIGTERM, 3 when the node's memory folder cannot be used (the tier is off on that node).
"""

from __future__ import annotations

import os
import signal
import socket
import socketserver
import sys
import threading
from typing import Mapping, Optional, Union

from autoheal import memtier_files
from autoheal.sbatch_helpers import memtier_wire as wire
from autoheal.sbatch_helpers.memtier_net import recv_frame
from autoheal.sbatch_helpers.memtier_store import CopyStore, StoreError

READY = "autoheal-memtier-agent: ready"
COPIES_ENV = "AUTOHEAL_MEMTIER_COPIES"
MAX_BYTES_ENV = "AUTOHEAL_MEMTIER_MAX_BYTES"
EXIT_UNAVAILABLE = 3
IO_TIMEOUT = 30.0


def node_address(node: str, environ: Mapping[str, str]) -> str:
    """The node's NodeAddr from Slurm (what other nodes reach it by), else its resolved name."""
    try:
        from autoheal.config import load_config
        from autoheal.slurm import get_adapter

        cfg = load_config(environ.get("AUTOHEAL_CONFIG") or None, secrets=False)
        address = get_adapter(cfg, timeout=10, retries=1).get_node(node).address
        if address:
            return address
    except Exception as exc:  # no config, Slurm not answering: the name is the next best thing
        print(f"autoheal-memtier-agent: NodeAddr of {node} unknown ({type(exc).__name__}: {exc})",
              file=sys.stderr)
    try:
        return socket.gethostbyname(node)
    except OSError:
        return socket.gethostbyname(socket.gethostname())


class Agent:
    """The store plus what each request needs to be checked against."""

    def __init__(self, store: CopyStore, key: bytes, job_id: str, max_payload: int):
        self.store, self.key, self.job_id, self.max_payload = store, key, job_id, max_payload
        self.lock = threading.Lock()  # one writer at a time: pruning must not race a publish

    def answer(self, data: Union[bytes, bytearray]) -> bytes:
        """The answer frame to one request (never raises on bad input: it says why)."""
        try:
            frame = wire.read_frame(wire.reader_of(data), self.key, self.max_payload)
        except wire.FrameError as exc:
            return wire.encode(wire.Kind.ACK, {"ok": False, "why": str(exc)}, b"", self.key)
        try:
            if frame.kind == wire.Kind.STORE:
                info = wire.copy_info(frame, self.job_id)
                with self.lock:
                    self.store.put(info.rank, info.step, data)
                return wire.encode(wire.Kind.ACK, {"ok": True, "step": info.step}, b"", self.key)
            if frame.kind == wire.Kind.LIST:
                with self.lock:
                    held = {str(r): s for r, s in self.store.steps().items()}
                return wire.encode(wire.Kind.ACK, {"ok": True, "held": held}, b"", self.key)
            if frame.kind == wire.Kind.GET:
                rank, step = frame.header.get("rank"), frame.header.get("step")
                if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                    raise wire.FrameError(f"GET of rank {rank!r}")
                with self.lock:
                    found = self.store.newest(rank, self.key, self.job_id, self.max_payload,
                                              only=step if isinstance(step, int) else None)
                if found is None:
                    return wire.encode(wire.Kind.NONE, {"why": f"no copy of rank {rank} here"}, b"", self.key)
                return wire.with_kind(found[1], wire.Kind.COPY)
            raise wire.FrameError(f"unexpected request {frame.kind.name}")
        except (wire.FrameError, OSError) as exc:
            return wire.encode(wire.Kind.ACK, {"ok": False, "why": str(exc)}, b"", self.key)


def _handler(agent: Agent) -> type:
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            sock: socket.socket = self.request
            sock.settimeout(IO_TIMEOUT)
            try:
                try:
                    data = recv_frame(sock, agent.max_payload)
                except wire.FrameError as exc:
                    sock.sendall(wire.encode(wire.Kind.ACK, {"ok": False, "why": str(exc)}, b"", agent.key))
                    return
                sock.sendall(agent.answer(data))
            except OSError:
                pass  # the trainer went away mid-request: nothing was stored from a torn frame

    return Handler


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


def main(environ: Optional[Mapping[str, str]] = None) -> int:
    env = dict(os.environ if environ is None else environ)
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    job_id = env.get("SLURM_JOB_ID", "")
    token = env.get("AUTOHEAL_SUBMIT_TOKEN", "").strip()
    if not token:  # the frames' key is the submission's secret: without one anybody could forge copies
        print(f"autoheal-memtier-agent: unavailable node={node} why=no AUTOHEAL_SUBMIT_TOKEN "
              f"(the memory tier needs autoheal sbatch)", flush=True)
        return EXIT_UNAVAILABLE
    key = wire.job_key(token, job_id)
    try:
        store = CopyStore(memtier_files.job_dir(node, os.geteuid(), job_id, env),
                          keep=max(1, int(env.get(COPIES_ENV, "2") or 2)))
    except (StoreError, OSError, ValueError) as exc:
        print(f"autoheal-memtier-agent: unavailable node={node} why={exc}", flush=True)
        return EXIT_UNAVAILABLE
    agent = Agent(store, key, job_id, int(env.get(MAX_BYTES_ENV, "") or wire.DEFAULT_MAX_PAYLOAD))
    addr = node_address(node, env)
    server = _Server((addr, 0), _handler(agent))
    restarts = env.get("SLURM_RESTART_COUNT", "0")
    store.write_pidfile(int(restarts) if restarts.isdigit() else 0)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    print(f"{READY} node={node} addr={addr} port={server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        store.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
