"""A tiny "CUDA" for the lab's trainers: the fault reaches the job as it does on real hardware.

A job step is given GPUs by Slurm (its GRES); Slurm names them in the step's environment
(``SLURM_STEP_GPUS``, ``CUDA_VISIBLE_DEVICES``). :class:`FakeDevice` maps those to the node's fake GPU
state file (the same per-node hardware state the fake NVML reads, ``autoheal_lab.fakenvml.state``), and
every "GPU call" of the trainer (:meth:`FakeDevice.step` for a training step, :meth:`FakeDevice.copy_to_host`
before a save) looks at the hardware as CUDA would meet it:

- the GPU fell off the bus (XID 79, NVML's GPU lost): the call raises :class:`DeviceLost`, as CUDA's
  calls fail with ``cudaErrorDevicesUnavailable``; the rank cannot copy its state off the GPU;
- an uncorrectable ECC error (a DBE, XID 48/94/95/140): the process dies at once (CUDA kills the
  context; PyTorch aborts) without saving;
- an NVLink fault (XID 74, a link down): compute still works, but :meth:`FakeDevice.links_ok` is False and
  the trainer's collective hangs, as NCCL's does;
- a hung GPU (``hang_ms``): the call takes that long.

:meth:`FakeDevice.collective` runs a trainer's real collective (torch's gloo ``all_reduce``, DDP's
gradient reduction inside ``backward()``) as NCCL would meet it: over a link that is down it never
completes, and a peer that is gone (gloo notices the closed connection and raises at once; NCCL does
not) leaves the rank blocked until the process group's timeout, with the grace signals held pending.

It reads only the fake hardware (the state file and its NVML event queue), never autoheal's own state
(drain reasons, journal, hook state): a trainer must find out about a fault the way a real one does.
"""

from __future__ import annotations

import contextlib
import enum
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Mapping, Optional, Sequence, TypeVar

from autoheal_lab.fakenvml import state as gstate

#: XIDs after which CUDA kills every context on the GPU (the process crashes): double-bit / uncorrectable
#: ECC (48), contained and uncontained ECC (94, 95), unrecovered ECC (140).
CRASH_XIDS = frozenset({48, 94, 95, 140})
LOST_XIDS = frozenset({79})  # fallen off the bus
LINK_XIDS = frozenset({74})  # NVLink fatal error: the collective over that link hangs
ENV_STATE = "AUTOHEAL_FAKE_NVML_STATE"


class DeviceError(RuntimeError):
    """A GPU call failed (what ``torch.cuda`` raises as ``RuntimeError: CUDA error: ...``)."""


class DeviceLost(DeviceError):
    """The GPU is gone (fallen off the bus): every call on it fails, nothing can be copied off it."""


class CollectiveTimeout(DeviceError):
    """A collective did not complete within the process group's timeout (NCCL's watchdog then aborts)."""


T = TypeVar("T")


@contextlib.contextmanager
def signals_held(signals: Sequence[int]) -> Iterator[None]:
    """Hold ``signals`` pending in this thread while inside: a Python handler does not run while the main
    thread waits inside NCCL's C++ code, so a grace signal is noticed only once the collective returns."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, set(signals)) if signals else None
    try:
        yield
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


class Health(enum.Enum):
    OK = "ok"
    LOST = "lost"
    CRASH = "crash"  # uncorrectable ECC: the context is dead, the process with it
    LINK_DOWN = "link-down"


@dataclass(frozen=True)
class GpuView:
    """What one GPU call sees of one GPU."""

    index: int
    health: Health
    hang_ms: int = 0
    why: str = ""


def judge(gpu: Optional[gstate.GpuState], index: int, events: Sequence[gstate.Event], since_ns: int) -> GpuView:
    """The health a GPU call meets on GPU ``index`` (``gpu`` None: not in the state file: lost).

    ``events``: the node's NVML event queue; only this GPU's events after ``since_ns`` (when the device
    was opened) count, as a context only dies of errors raised while it lives. The state counts too: a
    GPU marked lost or holding an uncorrected ECC error fails every call, whenever it happened."""
    if gpu is None or not gpu.present or gpu.lost:
        return GpuView(index, Health.LOST, why="GPU is lost (fallen off the bus)")
    mine = {e.xid for e in events if e.gpu == index and e.seq > since_ns and e.event_type == gstate.EVENT_XID}
    if mine & LOST_XIDS:
        return GpuView(index, Health.LOST, why="XID 79: GPU has fallen off the bus")
    crash = sorted(mine & CRASH_XIDS)
    if gpu.ecc_volatile_uncorrected > 0 or crash:
        what = f"XID {crash[0]}" if crash else f"{gpu.ecc_volatile_uncorrected} uncorrectable ECC error(s)"
        return GpuView(index, Health.CRASH, gpu.hang_ms, why=f"{what}: uncorrectable ECC error")
    if gpu.nvlink_down or mine & LINK_XIDS:
        return GpuView(index, Health.LINK_DOWN, gpu.hang_ms, why=f"NVLink down (links {gpu.nvlink_down or '?'})")
    return GpuView(index, Health.OK, gpu.hang_ms)


def step_gpus(environ: Mapping[str, str]) -> List[int]:
    """The GPU indexes (gres.conf ``File=`` order, the fake state's index) the job step was given.

    ``SLURM_STEP_GPUS`` holds Slurm's own index of each GRES; ``CUDA_VISIBLE_DEVICES`` is the same
    without device constraints (with ``ConstrainDevices`` Slurm renumbers it from 0), so it is only the
    fallback."""
    for key in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        raw = (environ.get(key) or "").strip()
        if raw:
            try:
                return [int(p) for p in raw.split(",") if p.strip()]
            except ValueError:
                raise DeviceError(f"{key}={raw!r}: not a list of GPU indexes") from None
    return []


def _crash(why: str) -> None:
    """What CUDA does to a process whose context an uncorrectable error killed: it aborts (no core file:
    the lab runs many of these)."""
    sys.stderr.write(f"terminate called after throwing an instance of 'c10::Error'\n  what():  CUDA error: "
                     f"uncorrectable ECC error encountered ({why})\n")
    sys.stderr.flush()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.abort()


class FakeDevice:
    """The GPUs of one rank. ``crash`` and ``sleep`` are injectable so unit tests can watch them."""

    def __init__(self, state_path: Path, gpus: Sequence[int], crash: Callable[[str], None] = _crash,
                 sleep: Callable[[float], None] = time.sleep, opened_ns: Optional[int] = None):
        if not gpus:
            raise DeviceError("no CUDA-capable device is detected (the job step was given no GPU)")
        self.state_path = Path(state_path)
        self.gpus = list(gpus)
        self._crash = crash
        self._sleep = sleep
        self.opened_ns = time.time_ns() if opened_ns is None else opened_ns
        self._call("context creation")  # CUDA initialises on the first call: a GPU already gone fails here

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, **kw) -> FakeDevice:
        env = os.environ if environ is None else environ
        template = (env.get(ENV_STATE) or "").strip()
        node = (env.get("SLURMD_NODENAME") or env.get("AUTOHEAL_NODE") or "").strip()
        if not template or ("{node}" in template and not node):
            raise DeviceError(f"no fake GPU state: ${ENV_STATE} (and $SLURMD_NODENAME) must name the node's state")
        return cls(Path(template.replace("{node}", node)), step_gpus(env), **kw)

    def views(self) -> List[GpuView]:
        try:
            st = gstate.read_state(self.state_path)
        except (OSError, ValueError) as exc:  # no driver: every call fails, as with no GPU at all
            raise DeviceLost(f"CUDA driver unavailable: {exc}") from None
        events = gstate.read_events(self.state_path)
        by_index = {g.index: g for g in st.gpus}
        return [judge(by_index.get(i), i, events, self.opened_ns) for i in self.gpus]

    def _call(self, what: str) -> List[GpuView]:
        views = self.views()
        for v in views:
            if v.health is Health.LOST:
                raise DeviceLost(f"CUDA error: {what} on GPU {v.index}: {v.why}")
            if v.health is Health.CRASH:
                self._crash(f"GPU {v.index}: {v.why}")
                raise DeviceError(f"CUDA error: {what} on GPU {v.index}: {v.why}")  # crash returned (tests)
        hang = max(v.hang_ms for v in views)
        if hang:
            self._sleep(hang / 1000.0)
        return views

    def step(self) -> None:
        """One training step's kernels on every GPU of the rank."""
        self._call("kernel launch")

    def copy_to_host(self) -> None:
        """Copy the rank's state off its GPUs (before a save): impossible from a GPU that is gone."""
        self._call("device-to-host copy")

    def links_ok(self) -> bool:
        """False when a GPU's NVLink is down: a collective over it never completes."""
        return all(v.health is not Health.LINK_DOWN for v in self._call("NCCL collective"))

    def collective(self, call: Callable[[], T], timeout: float, signals: Sequence[int] = (),
                   peer_errors: tuple = (RuntimeError,), clock: Callable[[], float] = time.monotonic) -> T:
        """Run ``call`` (a real collective among the ranks) as NCCL would: with a link down it never
        completes; if it fails with one of ``peer_errors`` (gloo's "Connection closed by peer" when a
        peer died) the rank still waits out ``timeout`` first, as NCCL does not notice a dead peer. A
        GPU call that fails (:class:`DeviceError`) is raised as it is. After the wait:
        :class:`CollectiveTimeout`."""
        with signals_held(signals):
            deadline = clock() + timeout
            if not self.links_ok():
                raise self._wait_out(deadline, clock, "NVLink down", timeout)
            try:
                return call()
            except DeviceError:
                raise
            except peer_errors as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise self._wait_out(deadline, clock, f"peer gone ({first[:200]})", timeout) from None

    def _wait_out(self, deadline: float, clock: Callable[[], float], why: str, timeout: float) -> CollectiveTimeout:
        """Block until ``deadline`` (one C call in NCCL: nothing else of the rank runs); the error to raise."""
        self._sleep(max(0.0, deadline - clock()))
        return CollectiveTimeout(f"{why}: no progress within {timeout:g} s")

    def describe(self) -> str:
        return ",".join(str(g) for g in self.gpus)
