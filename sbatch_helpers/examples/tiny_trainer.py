#!/usr/bin/env python3
"""A tiny deterministic "trainer" for requeue/resume drills and integration tests (stdlib only).

Its state is an order-sensitive running hash of the step numbers, so a run that was preempted and
resumed ends with the same ``final_state`` as an uninterrupted one only if no step was lost or
repeated. Every line it prints starts with ``autoheal-trainer:`` and is flushed at once; see
README.md beside this file for the line formats and exit codes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional

try:
    from autoheal.sbatch_helpers import checkpoint as ck
    from autoheal.sbatch_helpers import preempt
    from autoheal.sbatch_helpers import progress as hb
except ImportError:  # running from a source checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import checkpoint as ck  # type: ignore[no-redef]
    import preempt  # type: ignore[no-redef]
    import progress as hb  # type: ignore[no-redef]

EXIT_DONE = 0
EXIT_CRASH = 1  # --crash-at-step, or an unexpected error
EXIT_USAGE = 2
EXIT_PREEMPTED_NOT_SAVED = 98  # stopped on the grace signal, but no checkpoint could be written
EXIT_PREEMPTED = 99  # stopped on the grace signal after the checkpoint was saved (rank 0)

MODULUS = 2**61 - 1
NCCL_TIMEOUT = 600.0  # PyTorch's default process-group timeout for NCCL
_MSG = struct.Struct("!qq")  # one collective message: (step, value); the hello is (rank, step id)


def advance(state: int, step: int) -> int:
    """State after running step number ``step`` (0-based) from ``state``."""
    return (state * 1_000_003 + step + 1) % MODULUS


def expected_final_state(steps: int) -> int:
    state = 0
    for i in range(steps):
        state = advance(state, i)
    return state


class CollectiveTimeout(RuntimeError):
    """The collective did not complete within the timeout (NCCL's watchdog then aborts the rank)."""


@contextlib.contextmanager
def signals_blocked(signals) -> Iterator[None]:
    """Hold ``signals`` pending while inside: a Python handler cannot run while the main thread waits
    inside NCCL's C++ code, so the grace signal is noticed only once the collective returns."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, set(signals))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def first_host(nodelist: str) -> Optional[str]:
    """First host of a Slurm node list: ``gpu[03-05,07],cpu1`` -> ``gpu03``."""
    m = re.match(r"\s*([^,\[\s]+)(?:\[([^\]]+)\])?", nodelist or "")
    if not m:
        return None
    return m.group(1) + (m.group(2).split(",")[0].split("-")[0] if m.group(2) else "")


def rendezvous(environ: Optional[Dict[str, str]] = None) -> tuple:
    """Rank 0's address and port: ``MASTER_ADDR``/``MASTER_PORT``, else the step's first node and a
    port from the job and step ids (a new step, e.g. after a hot-spare swap, gets a new port)."""
    env = os.environ if environ is None else environ
    addr = env.get("MASTER_ADDR") or first_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", ""))
    port = env.get("MASTER_PORT", "")
    if not port.isdigit():
        job, step = env.get("SLURM_JOB_ID", ""), env.get("SLURM_STEP_ID", "0")
        port = str(20000 + (int(job) * 16 + int(step if step.isdigit() else 0)) % 12000) if job.isdigit() else "29400"
    return addr or "127.0.0.1", int(port)


class Collective:
    """A real allreduce (sum) among the job step's ranks over TCP, rank 0 the hub. Like NCCL it never
    fails fast: a peer that is gone (EOF, reset) or hung leaves the caller blocked until ``timeout``,
    with the grace signals held pending, then :class:`CollectiveTimeout`. ``links_ok`` is the device's
    NVLink check: with a link down the rank's part never moves, so the collective hangs."""

    def __init__(self, rank: int, world: int, addr: str, port: int, timeout: float = NCCL_TIMEOUT,
                 signals=(), links_ok: Callable[[], bool] = lambda: True):
        self.rank, self.world, self.addr, self.port = rank, world, addr, port
        self.timeout, self.signals, self.links_ok = timeout, tuple(signals), links_ok
        self.peers: Dict[int, socket.socket] = {}  # rank 0: every other rank; others: {0: hub}

    def connect(self) -> None:
        with signals_blocked(self.signals):
            deadline = time.monotonic() + self.timeout
            if self.rank == 0:
                self._accept(deadline)
            else:
                self.peers[0] = self._dial(deadline)
                self.peers[0].sendall(_MSG.pack(self.rank, 0))

    def _accept(self, deadline: float) -> None:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("", self.port))
        srv.listen(self.world)
        with srv:
            while len(self.peers) < self.world - 1:
                srv.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    conn, _ = srv.accept()
                except socket.timeout:
                    raise CollectiveTimeout(f"only {len(self.peers) + 1} of {self.world} ranks joined") from None
                peer, _ = _MSG.unpack(self._recv(conn, deadline))
                self.peers[peer] = conn

    def _dial(self, deadline: float) -> socket.socket:
        while True:
            try:
                return socket.create_connection((self.addr, self.port), timeout=5)
            except OSError:
                if time.monotonic() >= deadline:
                    raise CollectiveTimeout(f"rank 0 at {self.addr}:{self.port} never answered") from None
                time.sleep(0.2)

    def allreduce(self, step: int, value: int) -> int:
        with signals_blocked(self.signals):
            deadline = time.monotonic() + self.timeout
            if not self.links_ok():
                self._hang(deadline, "NVLink down")
            if self.rank != 0:
                self._send(self.peers[0], step, value, deadline)
                got, total = _MSG.unpack(self._recv(self.peers[0], deadline))
                return total
            total = value
            for peer in sorted(self.peers):
                got, part = _MSG.unpack(self._recv(self.peers[peer], deadline))
                if got != step:
                    raise CollectiveTimeout(f"rank {peer} is at step {got}, rank 0 at {step}: the ranks diverged")
                total += part
            for peer in sorted(self.peers):
                self._send(self.peers[peer], step, total, deadline)
            return total

    def _send(self, conn: socket.socket, step: int, value: int, deadline: float) -> None:
        try:
            conn.sendall(_MSG.pack(step, value))
        except OSError:
            self._hang(deadline, "peer gone")

    def _recv(self, conn: socket.socket, deadline: float) -> bytes:
        data = b""
        while len(data) < _MSG.size:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = conn.recv(_MSG.size - len(data))
            except socket.timeout:
                raise CollectiveTimeout(f"no answer within {self.timeout:g} s") from None
            except OSError:
                chunk = b""
            if not chunk:
                self._hang(deadline, "peer gone")
            data += chunk
        return data

    def _hang(self, deadline: float, why: str) -> None:
        """NCCL does not notice a dead peer: the rank waits out the timeout (one C call, signals held)."""
        time.sleep(max(0.0, deadline - time.monotonic()))
        raise CollectiveTimeout(f"{why}: no progress within {self.timeout:g} s")


#: --event-times: every line carries the trainer's own clock, so an observer (the lab's drill) can tell when
#: a thing happened rather than when it got round to reading it
EVENT_TIMES = False


def say(text: str) -> None:
    if EVENT_TIMES and " time=" not in text:
        text = f"{text} time={time.time():.3f}"
    sys.stdout.write(f"autoheal-trainer: {text}\n")
    sys.stdout.flush()


def _word(value: Optional[str], default: str = "none") -> str:
    value = (value or "").strip()
    return re.sub(r"\s+", "_", value) if value else default


def parse_args(argv: Optional[list]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100, help="total steps (default 100)")
    p.add_argument("--step-seconds", type=float, default=0.2, help="sleep per step (default 0.2)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="save every K steps (default 10)")
    p.add_argument(
        "--checkpoint-dir",
        default=os.environ.get("AUTOHEAL_CHECKPOINT_DIR") or None,
        help="checkpoint folder (default $AUTOHEAL_CHECKPOINT_DIR)",
    )
    p.add_argument("--keep", type=int, default=3, help="checkpoints to keep (default 3)")
    p.add_argument("--crash-at-step", type=int, default=None, help="exit 1 after this step, without saving")
    p.add_argument("--memory-every", type=int, default=0,
                   help="also keep the state in the peer-memory tier every K steps (submit with "
                        "AUTOHEAL_MEMORY_TIER=1; default 0: off)")
    p.add_argument("--device", choices=("none", "lab"), default="none",
                   help="lab: run each step on the step's fake GPUs (autoheal_lab.fakedevice): a lab fault reaches "
                        "the rank as on real hardware (default none: CPU only, stdlib only)")
    p.add_argument("--collective", action="store_true",
                   help="allreduce among the ranks each step over TCP (rank 0 the hub: MASTER_ADDR/MASTER_PORT, else "
                        "the step's first node); a rank whose peer is gone blocks, as in NCCL")
    p.add_argument("--collective-timeout", type=float, default=NCCL_TIMEOUT,
                   help=f"how long a collective may block before the rank gives up (default {NCCL_TIMEOUT:g}: NCCL's)")
    p.add_argument("--timestamps", action="store_true", help="add time=<epoch seconds> to each step line")
    p.add_argument("--event-times", action="store_true",
                   help="add time=<epoch seconds> to every line (start, device error, signal, checkpoint...)")
    args = p.parse_args(argv)
    if args.collective_timeout <= 0:
        p.error("--collective-timeout must be > 0")
    if args.steps < 0 or args.checkpoint_every < 1 or args.step_seconds < 0 or args.keep < 1:
        p.error("--steps >= 0, --checkpoint-every >= 1, --step-seconds >= 0 and --keep >= 1 are required")
    return args


def find_start(mgr: Optional[ck.CheckpointManager]) -> Optional[ck.Checkpoint]:
    resume = os.environ.get("AUTOHEAL_RESUME_FROM", "").strip()
    if resume:
        try:
            return ck.open_checkpoint(resume)
        except ck.NoValidCheckpoint as exc:
            say(f"warning AUTOHEAL_RESUME_FROM ignored: {exc}")
    if mgr is None:
        return None
    found = mgr.latest_valid()
    for r in mgr.rejections:
        say(f"warning skipped {r}")
    return found


def load_state(found: ck.Checkpoint) -> tuple:
    doc = json.loads(found.read_bytes().decode("utf-8"))
    if doc.get("step") != found.step or not isinstance(doc.get("state"), int):
        raise ValueError(f"checkpoint {found.path} does not hold a tiny_trainer state")
    return found.step, doc["state"]


class _NoDevice:
    """The default: a CPU-only trainer, no GPU calls (``--device lab`` puts a fakedevice.FakeDevice, which
    has the same methods, in its place)."""

    def step(self) -> None:
        pass

    def copy_to_host(self) -> None:
        pass

    def links_ok(self) -> bool:
        return True

    def describe(self) -> str:
        return "none"


DEVICE: Any = _NoDevice()
DEVICE_ERRORS: tuple = ()  # the device's error types (set by _open_device)


def _save(mgr: Optional[ck.CheckpointManager], rank: int, step: int, state: int, steps: int) -> Optional[Path]:
    """Rank 0 saves the state at ``step`` (the other ranks hold the same state: nothing to write);
    the state comes off the GPU first, which fails on a GPU that is gone."""
    if mgr is None or rank != 0:
        return None
    DEVICE.copy_to_host()
    payload = json.dumps({"trainer": "tiny", "step": step, "state": state}).encode()
    path = mgr.save(step, payload, {"trainer": "tiny", "state": state, "steps": steps})
    say(f"checkpoint saved step={step} path={path}")
    return path


def _preempted(mgr: Optional[ck.CheckpointManager], rank: int, step: int, state: int, steps: int,
               saved_step: Optional[int], signal_step: int) -> int:
    """The grace signal came: save (rank 0, unless this step is saved already) and say how it ended."""
    sig = preempt.received_signal()
    say(f"signal received {preempt.signal_name(sig) if sig else 'unknown'} at step={signal_step}")
    if rank != 0:
        say(f"preempted step={step} checkpoint=rank0 exit={EXIT_PREEMPTED}")
        return EXIT_PREEMPTED
    try:
        path = _save(mgr, rank, step, state, steps) if saved_step != step \
            else mgr.directory / ck.checkpoint_name(step)  # type: ignore[union-attr]
    except (OSError, ck.CheckpointError, *DEVICE_ERRORS) as exc:
        say(f"checkpoint failed step={step} error={_word(str(exc))}")
        path = None
    code = EXIT_PREEMPTED if path else EXIT_PREEMPTED_NOT_SAVED
    say(f"preempted step={step} state={state} checkpoint={path or 'none'} exit={code}")
    return code


def _memory_tier(args: argparse.Namespace):  # -> Optional[memtier.MemoryTier]; imported only when asked for
    if args.memory_every <= 0:
        return None
    from autoheal.sbatch_helpers import memtier

    tier = memtier.MemoryTier.from_env()
    if tier is None:
        say("warning --memory-every without the memory tier's agents (submit with AUTOHEAL_MEMORY_TIER=1)")
    return tier


def _from_memory(tier, found: Optional[ck.Checkpoint], step: int, state: int, origin: str,
                 consistent: bool = False) -> tuple:
    """The newest of the memory copy this rank can reach and the durable checkpoint. ``consistent``
    (ranks in a collective): the newest step every rank has a copy of, as data-parallel ranks must all
    start from one step."""
    copy = tier.newest(min_step=found.step if found else -1, consistent=consistent)
    if copy is None:
        return step, state, origin
    doc = json.loads(copy.payload.decode("utf-8"))
    if doc.get("step") != copy.step or not isinstance(doc.get("state"), int):
        say(f"warning memory copy from {copy.node} is not a tiny_trainer state; ignored")
        return step, state, origin
    return copy.step, doc["state"], f"memory:{copy.source}@{copy.node}"


def _open_device(args: argparse.Namespace) -> None:
    """``--device lab``: the step's fake GPUs (imported only then: the example stays stdlib-only)."""
    global DEVICE, DEVICE_ERRORS
    if args.device == "lab":
        from autoheal_lab import fakedevice

        DEVICE_ERRORS = (fakedevice.DeviceError,)
        DEVICE = fakedevice.FakeDevice.from_env()
        say(f"device lab gpus={DEVICE.describe()}")


def _open_collective(args: argparse.Namespace, rank: int, world: int) -> Optional[Collective]:
    if not args.collective or world < 2:
        return None
    addr, port = rendezvous()
    coll = Collective(rank, world, addr, port, args.collective_timeout, preempt.default_signals(), DEVICE.links_ok)
    coll.connect()
    say(f"collective ranks={world} hub={addr}:{port} timeout={args.collective_timeout:g}")
    return coll


def _start(args: argparse.Namespace, mgr, rank: int, world: int) -> tuple:
    """Where this run starts: the newest of the durable checkpoint and the memory copy; says so."""
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    restart = os.environ.get("AUTOHEAL_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT") or "0"
    reason = _word(os.environ.get("AUTOHEAL_REQUEUE_REASON"))
    found = find_start(mgr)
    step, state = load_state(found) if found else (0, 0)
    origin = str(found.path) if found else "none"
    tier = _memory_tier(args)
    if tier is not None:
        step, state, origin = _from_memory(tier, found, step, state, origin, consistent=args.collective)
    say(
        f"start step={step} resumed_from={origin} restart={_word(restart, '0')} "
        f"host={host} rank={rank} world={world} steps={args.steps} reason={reason}"
    )
    return step, state, tier, (step if found else None)


def _train_step(args: argparse.Namespace, coll: Optional[Collective], step: int, state: int) -> int:
    """One step: the kernels on the GPU, the gradients' allreduce, the update. Returns the new state."""
    if args.step_seconds:
        time.sleep(args.step_seconds)
    DEVICE.step()
    if coll is not None:
        total = coll.allreduce(step + 1, state)
        if total != state * coll.world:  # data-parallel replicas hold the same state
            raise CollectiveTimeout(f"allreduce at step {step + 1}: the replicas differ")
    return advance(state, step)


def main(argv: Optional[list] = None) -> int:
    global EVENT_TIMES
    args = parse_args(argv)
    EVENT_TIMES = args.event_times
    rank, world = ck.env_rank(), ck.env_world_size()
    mgr = ck.CheckpointManager(args.checkpoint_dir, keep=args.keep, rank=rank) if args.checkpoint_dir else None
    if mgr is None:
        say("warning no checkpoint dir (--checkpoint-dir or AUTOHEAL_CHECKPOINT_DIR): not saving")
    progress = {"step": 0}
    preempt.on_preempt(lambda signum: progress.setdefault("signal_step", progress["step"]))
    step = 0
    try:
        _open_device(args)
        step, state, tier, saved_step = _start(args, mgr, rank, world)
        progress["step"] = step
        coll = _open_collective(args, rank, world)
        return _loop(args, mgr, tier, coll, rank, progress, step, state, saved_step)
    except CollectiveTimeout as exc:  # NCCL's watchdog aborts the rank
        say(f"collective failed step={progress['step']} error={_word(str(exc))} exit={EXIT_CRASH}")
        return EXIT_CRASH
    except DEVICE_ERRORS as exc:  # an uncaught CUDA error ends the rank without saving
        say(f"device error step={progress['step']} error={_word(str(exc))} exit={EXIT_CRASH}")
        return EXIT_CRASH


def _loop(args, mgr, tier, coll, rank: int, progress: dict, step: int, state: int, saved_step) -> int:
    while step < args.steps:
        state = _train_step(args, coll, step, state)
        step += 1
        progress["step"] = step
        hb.heartbeat(step)  # the runner's hang detection: this rank made progress (a no-op outside autoheal sbatch)
        say(f"step={step} time={time.time():.3f}" if args.timestamps else f"step={step}")
        if args.crash_at_step is not None and step >= args.crash_at_step:
            say(f"crash requested at step={step}")
            return EXIT_CRASH
        if preempt.preempt_requested():
            return _preempted(mgr, rank, step, state, args.steps, saved_step, progress["signal_step"])
        if step % args.checkpoint_every == 0 and step < args.steps:
            _save(mgr, rank, step, state, args.steps)
            saved_step = step
        if tier is not None and step % args.memory_every == 0 and step < args.steps:
            DEVICE.copy_to_host()
            kept = tier.save(step, json.dumps({"trainer": "tiny", "step": step, "state": state}).encode())
            say(f"memory saved step={step} nodes={','.join(kept.stored) or 'none'}")
    if saved_step != step:
        _save(mgr, rank, step, state, args.steps)
    say(f"done step={step} final_state={state}")
    return EXIT_DONE


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
