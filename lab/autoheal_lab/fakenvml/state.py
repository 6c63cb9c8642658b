"""State file of the fake NVML library, fault injection, and NVIDIA kernel-log lines.

The C library (``fake_nvml.c``) reads the file named by ``AUTOHEAL_FAKE_NVML_STATE``: one
``key=value`` per line, ``#`` comments, unknown keys ignored::

    driver_loaded=1            # 0: nvmlInit -> NVML_ERROR_DRIVER_NOT_LOADED
    init_hang_ms=0             # nvmlInit sleeps this long first
    driver_version=550.54.15
    gpu_count=8
    gpu.3.pci_bus_id=0000:5d:00.0
    gpu.3.lost=1               # calls on GPU 3 -> NVML_ERROR_GPU_IS_LOST
    gpu.3.nvlink_down=0,5
    ...

Every :class:`GpuState` field is written as ``gpu.<index>.<field>``. A missing or unreadable state
file also makes ``nvmlInit`` fail with ``NVML_ERROR_DRIVER_NOT_LOADED``. XID (and other NVML)
events are lines ``<seq> <gpu> <xid> <event type>`` appended to ``<state file>.events``.

Stdlib only: this module is imported by the lab CLI and by tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import re
import tempfile
import time
import uuid as _uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple, Union

__all__ = [
    "DEFAULT_HANG_MS",
    "H100_PCI_BUS_IDS",
    "INJECT_KINDS",
    "XID_LINE_RE",
    "XID_MESSAGES",
    "Event",
    "GpuState",
    "NodeGpuState",
    "append_event",
    "append_kmsg",
    "default_state",
    "events_path",
    "fallen_off_bus_line",
    "inject",
    "kernel_log_line",
    "kmsg_prefix",
    "kmsg_record",
    "read_events",
    "read_state",
    "update_state",
    "write_state",
]

PathLike = Union[str, "os.PathLike[str]"]

STATE_FORMAT = 1

# nvmlEventType bits (nvml.h)
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_PSTATE = 0x4
EVENT_XID = 0x8
EVENT_CLOCK = 0x10
DEFAULT_SUPPORTED_EVENTS = (
    EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_PSTATE | EVENT_XID | EVENT_CLOCK
)

# nvmlClocksEventReason bits (nvml.h)
CLOCKS_GPU_IDLE = 0x1
CLOCKS_HW_SLOWDOWN = 0x8
CLOCKS_SW_THERMAL = 0x20
CLOCKS_HW_THERMAL = 0x40

# nvmlDeviceGpuRecoveryAction_t
RECOVERY_NONE = 0
RECOVERY_GPU_RESET = 1
RECOVERY_NODE_REBOOT = 2
RECOVERY_DRAIN_P2P = 3
RECOVERY_DRAIN_AND_RESET = 4
#: How the driver's XID 154 line names an action ("... from 0x0 (None) to 0x1 (Reset Required)"; the
#: names of the others follow that pattern: the driver's exact words for them are not in our references).
RECOVERY_NAMES = {0: "None", 1: "Reset Required", 2: "Reboot Required", 3: "Drain P2P Required",
                  4: "Drain and Reset Required", 5: "Recover IMEX Domain Required", 6: "Bus Reset Required",
                  7: "System Reboot Required"}

PRE_AMPERE_ARCHES = frozenset({"kepler", "maxwell", "pascal", "volta", "turing"})

INJECT_KINDS = (
    "xid",
    "ecc-dbe",
    "remap-failure",
    "remap-pending",
    "thermal",
    "lost",
    "pcie-degraded",
    "nvlink-down",
    "hang",
    "recovery-action",
    "clear",
)
DEFAULT_HANG_MS = 20_000
THERMAL_TEMPERATURE = 92

H100_PCI_BUS_IDS = (
    "0000:1b:00.0",
    "0000:3b:00.0",
    "0000:4c:00.0",
    "0000:5d:00.0",
    "0000:9b:00.0",
    "0000:bb:00.0",
    "0000:cb:00.0",
    "0000:db:00.0",
)


@dataclass
class GpuState:
    """One GPU as the fake NVML library reports it (field name = state-file key)."""

    index: int
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    serial: str = ""
    pci_bus_id: str = "0000:1b:00.0"
    arch: str = "hopper"  # pre-Ampere arches: remapped rows NOT_SUPPORTED; others: retired pages
    pci_device_id: int = 0x233010DE
    pci_subsystem_id: int = 0x16C110DE
    minor_number: int = 0
    present: bool = True  # False: not enumerated (nvmlDeviceGetCount is lower)
    lost: bool = False  # True: NVML_ERROR_GPU_IS_LOST
    hang_ms: int = 0  # every NVML call on this GPU sleeps this long first
    temperature: int = 35
    persistence_mode: bool = True
    ecc_mode: bool = True
    ecc_volatile_corrected: int = 0
    ecc_volatile_uncorrected: int = 0
    ecc_aggregate_corrected: int = 0
    ecc_aggregate_uncorrected: int = 0
    remapped_rows_correctable: int = 0
    remapped_rows_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    retired_pages_sbe: int = 0
    retired_pages_dbe: int = 0
    retired_pages_pending: bool = False
    pcie_max_gen: int = 5
    pcie_max_width: int = 16
    pcie_curr_gen: int = 5
    pcie_curr_width: int = 16
    nvlink_count: int = 18
    nvlink_down: List[int] = field(default_factory=list)
    clocks_event_reasons: int = CLOCKS_GPU_IDLE
    recovery_action: int = RECOVERY_NONE
    memory_total: int = 85_520_809_984
    memory_reserved: int = 607_125_504
    memory_used: int = 0
    power_mw: int = 69_000
    util_gpu: int = 0
    util_memory: int = 0
    supported_events: int = DEFAULT_SUPPORTED_EVENTS
    # features answered with NVML_ERROR_NOT_SUPPORTED, on top of the arch defaults: ecc,
    # remapped_rows, retired_pages, nvlink, pcie, temperature, power, utilization,
    # persistence_mode, clocks_event_reasons, recovery_action, serial, events, memory
    unsupported: List[str] = field(default_factory=list)

    @property
    def pre_ampere(self) -> bool:
        return self.arch.lower() in PRE_AMPERE_ARCHES


@dataclass
class NodeGpuState:
    """All GPUs of one lab node plus driver-wide knobs."""

    node_name: str
    gpus: List[GpuState] = field(default_factory=list)
    driver_loaded: bool = True
    init_hang_ms: int = 0
    driver_version: str = "550.54.15"
    nvml_version: str = "12.550.54.15"
    cuda_driver_version: int = 12040


@dataclass(frozen=True)
class Event:
    seq: int
    gpu: int
    xid: int
    event_type: int = EVENT_XID


# Fields a GPU reset restores (inject kind "clear"); identity and configuration stay.
HEALTH_FIELDS = (
    "present",
    "lost",
    "hang_ms",
    "temperature",
    "ecc_volatile_corrected",
    "ecc_volatile_uncorrected",
    "ecc_aggregate_corrected",
    "ecc_aggregate_uncorrected",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remap_pending",
    "remap_failure",
    "retired_pages_sbe",
    "retired_pages_dbe",
    "retired_pages_pending",
    "nvlink_down",
    "clocks_event_reasons",
    "recovery_action",
)

_HEX_FIELDS = frozenset({"pci_device_id", "pci_subsystem_id", "clocks_event_reasons", "supported_events"})
_GPU_FIELDS = {f.name: f.type for f in dataclasses.fields(GpuState) if f.name != "index"}
_NODE_KEYS = {
    "node_name": "str",
    "driver_loaded": "bool",
    "init_hang_ms": "int",
    "driver_version": "str",
    "nvml_version": "str",
    "cuda_driver_version": "int",
}
_GPU_KEY_RE = re.compile(r"^gpu\.(\d+)\.([a-z_]+)$")


# ----------------------------------------------------------------------------- defaults


def _derived_uuid(node_name: str, index: int) -> str:
    digest = hashlib.sha256(f"autoheal-fake-gpu:{node_name}:{index}".encode()).digest()[:16]
    return "GPU-" + str(_uuid.UUID(bytes=digest))


def _derived_serial(node_name: str, index: int) -> str:
    digest = hashlib.sha256(f"autoheal-fake-serial:{node_name}:{index}".encode()).hexdigest()
    return "165492" + str(int(digest[:12], 16) % 10_000_000).zfill(7)


def _pci_bus_id_for(index: int) -> str:
    if index < len(H100_PCI_BUS_IDS):
        return H100_PCI_BUS_IDS[index]
    return f"0001:{(0x10 + index) & 0xFF:02x}:00.0"


def default_state(node_name: str, n_gpus: int = 8) -> NodeGpuState:
    """A healthy H100 node: distinct UUIDs/serials from ``node_name`` and index, driver 550.54.15."""
    if not 0 <= n_gpus <= 64:
        raise ValueError(f"n_gpus must be between 0 and 64, got {n_gpus}")
    gpus = [
        GpuState(
            index=i,
            uuid=_derived_uuid(node_name, i),
            serial=_derived_serial(node_name, i),
            pci_bus_id=_pci_bus_id_for(i),
            minor_number=i,
        )
        for i in range(n_gpus)
    ]
    return NodeGpuState(node_name=node_name, gpus=gpus)


# ----------------------------------------------------------------------------- (de)serialise


def _encode(name: str, kind: str, value: object) -> str:
    if kind == "bool":
        return "1" if value else "0"
    if kind == "int":
        if name in _HEX_FIELDS:
            return hex(int(value))  # type: ignore[arg-type]
        return str(int(value))  # type: ignore[arg-type]
    if kind.startswith("List"):
        text = ",".join(str(v) for v in value)  # type: ignore[attr-defined]
    else:
        text = str(value)
    if "\n" in text or "\r" in text or "\0" in text:
        raise ValueError(f"{name}: value must be a single line, got {text!r}")
    return text


def _decode(kind: str, text: str) -> object:
    if kind == "bool":
        return text.strip() not in ("", "0", "false", "False", "no")
    if kind == "int":
        return int(text.strip(), 0)
    if kind == "List[int]":
        return [int(p, 0) for p in text.replace(" ", "").split(",") if p]
    if kind == "List[str]":
        return [p for p in text.replace(" ", "").split(",") if p]
    return text


def format_state(state: NodeGpuState) -> str:
    """The text of a state file (what :func:`write_state` writes)."""
    lines = [
        "# autoheal fake NVML state; read by libnvidia-ml.so.1 via AUTOHEAL_FAKE_NVML_STATE",
        f"state_format={STATE_FORMAT}",
    ]
    for key, kind in _NODE_KEYS.items():
        lines.append(f"{key}={_encode(key, kind, getattr(state, key))}")
    lines.append(f"gpu_count={len(state.gpus)}")
    for pos, gpu in enumerate(state.gpus):
        if gpu.index != pos:
            raise ValueError(f"gpus[{pos}] has index {gpu.index}; indexes must be 0..n-1 in order")
        for name, kind in _GPU_FIELDS.items():
            lines.append(f"gpu.{pos}.{name}={_encode(name, kind, getattr(gpu, name))}")
    return "\n".join(lines) + "\n"


def parse_state(text: str) -> NodeGpuState:
    """Parse state-file text; unknown keys are ignored, missing ones take the defaults."""
    node: Dict[str, object] = {}
    gpu_values: Dict[int, Dict[str, object]] = {}
    gpu_count = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if key == "gpu_count":
            gpu_count = int(value, 0)
            continue
        if key in _NODE_KEYS:
            node[key] = _decode(_NODE_KEYS[key], value)
            continue
        m = _GPU_KEY_RE.match(key)
        if m and m.group(2) in _GPU_FIELDS:
            gpu_values.setdefault(int(m.group(1)), {})[m.group(2)] = _decode(
                _GPU_FIELDS[m.group(2)], value
            )
    gpus = [GpuState(index=i, **gpu_values.get(i, {})) for i in range(gpu_count)]  # type: ignore[arg-type]
    node.setdefault("node_name", "")
    return NodeGpuState(gpus=gpus, **node)  # type: ignore[arg-type]


def write_state(path: PathLike, state: NodeGpuState) -> None:
    """Write the state file atomically (temporary file in the same directory, then os.replace)."""
    path = Path(path)
    text = format_state(state)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_state(path: PathLike) -> NodeGpuState:
    return parse_state(Path(path).read_text())


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise read-modify-write cycles of one node's state (and its events file)."""
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def update_state(path: PathLike) -> Iterator[NodeGpuState]:
    """``with update_state(p) as st: st.gpus[0].temperature = 80`` - locked read-modify-write."""
    path = Path(path)
    with _locked(path):
        state = read_state(path)
        yield state
        write_state(path, state)


# ----------------------------------------------------------------------------- events


def events_path(path: PathLike) -> Path:
    return Path(f"{path}.events")


def read_events(path: PathLike) -> List[Event]:
    """Complete event lines of ``<state>.events`` (state path given), oldest first."""
    try:
        text = events_path(path).read_text()
    except FileNotFoundError:
        return []
    events = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        parts = line.split()
        if len(parts) < 3:
            continue
        etype = int(parts[3], 0) if len(parts) > 3 else EVENT_XID
        events.append(Event(int(parts[0]), int(parts[1]), int(parts[2]), etype))
    return events


def _append_event_unlocked(path: Path, gpu: int, xid: int, event_type: int) -> Event:
    existing = read_events(path)
    last = existing[-1].seq if existing else 0
    seq = max(time.time_ns(), last + 1)  # monotonic even if the events file is recreated
    ev = Event(seq, gpu, xid, event_type)
    line = f"{ev.seq} {ev.gpu} {ev.xid} {hex(ev.event_type)}\n".encode()
    fd = os.open(events_path(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return ev


def append_event(path: PathLike, gpu: int, xid: int, event_type: int = EVENT_XID) -> Event:
    """Queue one NVML event for GPU ``gpu`` (state index); ``xid`` is the event data for XIDs."""
    path = Path(path)
    with _locked(path):
        return _append_event_unlocked(path, gpu, xid, event_type)


# ----------------------------------------------------------------------------- inject


def _restore_health(gpu: GpuState) -> None:
    fresh = GpuState(index=gpu.index)
    for name in HEALTH_FIELDS:
        setattr(gpu, name, getattr(fresh, name))
    gpu.pcie_curr_gen = gpu.pcie_max_gen
    gpu.pcie_curr_width = gpu.pcie_max_width


def inject(
    path: PathLike,
    gpu: int,
    kind: str,
    xid: Optional[int] = None,
    *,
    hang_ms: Optional[int] = None,
    link: int = 0,
    action: Optional[int] = None,
) -> Optional[int]:
    """Apply one fault (or ``"clear"``) to GPU ``gpu`` (state index) of the node state at ``path``.

    Returns the XID the real driver would log for this fault (an XID event is also queued for
    it), or None. Kinds:

    - ``xid``: queue XID ``xid``; XID 79 also marks the GPU lost, like the real driver.
    - ``ecc-dbe``: +1 uncorrected ECC (volatile and aggregate), a pending row remap (page
      retirement before Ampere), recovery action GPU reset; XID 48 and a DBE event.
    - ``remap-pending``: +1 uncorrectable remapped row pending a reset; XID 63.
    - ``remap-failure``: row remap failure; XID 64.
    - ``thermal``: 92 C with HW slowdown + HW/SW thermal slowdown clock event reasons.
    - ``lost``: NVML_ERROR_GPU_IS_LOST without an XID.
    - ``pcie-degraded``: current PCIe width halved (16 -> 8).
    - ``nvlink-down``: NVLink ``link`` inactive; XID 74.
    - ``hang``: every NVML call on the GPU sleeps ``hang_ms`` (default 20 s).
    - ``recovery-action``: NVML's GPU recovery action becomes ``action`` (``RECOVERY_*``); XID 154, as
      the driver raises when it changes (also back to NONE, as after a drain of P2P traffic).
    - ``clear``: what a GPU reset does in the lab: healthy again (identity kept).
    """
    if kind not in INJECT_KINDS:
        raise ValueError(f"unknown inject kind {kind!r}; expected one of {', '.join(INJECT_KINDS)}")
    if kind == "xid" and xid is None:
        raise ValueError("inject kind 'xid' needs an xid")
    if kind == "recovery-action" and (action is None or not 0 <= int(action) <= 0xFFFFFFFF):
        raise ValueError("inject kind 'recovery-action' needs an action (0 NONE .. 7, nvml.h)")
    path = Path(path)
    with _locked(path):
        state = read_state(path)
        if not 0 <= gpu < len(state.gpus):
            raise ValueError(f"GPU index {gpu} out of range (node has {len(state.gpus)} GPUs)")
        g = state.gpus[gpu]
        events: List[Tuple[int, int]] = []  # (xid, event type), queued after the state is written
        events_first = False
        logged_xid: Optional[int] = None

        if kind == "xid":
            assert xid is not None
            logged_xid = int(xid)
            events.append((logged_xid, EVENT_XID))
            if logged_xid == 79:
                g.lost = True
                events_first = True  # the XID is raised as the GPU goes away
        elif kind == "ecc-dbe":
            g.ecc_volatile_uncorrected += 1
            g.ecc_aggregate_uncorrected += 1
            if g.pre_ampere:
                g.retired_pages_dbe += 1
                g.retired_pages_pending = True
            else:
                g.remapped_rows_uncorrectable += 1
                g.remap_pending = True
            g.recovery_action = RECOVERY_GPU_RESET
            logged_xid = 48
            events += [(48, EVENT_XID), (0, EVENT_DOUBLE_BIT_ECC)]
        elif kind == "remap-pending":
            if g.pre_ampere:
                g.retired_pages_dbe += 1
                g.retired_pages_pending = True
            else:
                g.remapped_rows_uncorrectable += 1
                g.remap_pending = True
            logged_xid = 63
            events.append((63, EVENT_XID))
        elif kind == "remap-failure":
            g.remap_failure = True
            logged_xid = 64
            events.append((64, EVENT_XID))
        elif kind == "thermal":
            g.temperature = THERMAL_TEMPERATURE
            g.clocks_event_reasons = (
                g.clocks_event_reasons & ~CLOCKS_GPU_IDLE
            ) | CLOCKS_HW_SLOWDOWN | CLOCKS_HW_THERMAL | CLOCKS_SW_THERMAL
        elif kind == "lost":
            g.lost = True
        elif kind == "pcie-degraded":
            g.pcie_curr_width = max(1, g.pcie_max_width // 2)
        elif kind == "nvlink-down":
            if not 0 <= link < g.nvlink_count:
                raise ValueError(f"GPU {gpu} has {g.nvlink_count} NVLinks; link {link} does not exist")
            if link not in g.nvlink_down:
                g.nvlink_down = sorted(g.nvlink_down + [link])
            logged_xid = 74
            events.append((74, EVENT_XID))
        elif kind == "hang":
            g.hang_ms = DEFAULT_HANG_MS if hang_ms is None else int(hang_ms)
        elif kind == "recovery-action":
            assert action is not None
            g.recovery_action = int(action)
            logged_xid = 154
            events.append((154, EVENT_XID))
        elif kind == "clear":
            _restore_health(g)

        if events_first:
            for ev_xid, ev_type in events:
                _append_event_unlocked(path, gpu, ev_xid, ev_type)
        write_state(path, state)
        if not events_first:
            for ev_xid, ev_type in events:
                _append_event_unlocked(path, gpu, ev_xid, ev_type)
    return logged_xid


# ----------------------------------------------------------------------------- kernel log

XID_MESSAGES: Dict[int, str] = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: (
        "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
        "0x7f3c_a0000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
    ),
    43: "Ch 00000008",
    45: "Ch 00000008",
    48: (
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
        "at partition 3, subpartition 1."
    ),
    61: "0cec(2d8c) 00000000 00000000",
    62: "2f6f(26c4) 00000000 00000000",
    63: "Row Remapper: New row (0x00000003ffd1c400) marked for remapping, reset gpu to activate.",
    64: "Row Remapper Error: (0x00000003ffd1c400) - All reserved rows for bank are remapped",
    74: "NVLink: fatal error detected on link {link}(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    109: "CTX SWITCH TIMEOUT, Info 0x3c009",
    119: (
        "Timeout after 6s of waiting for RPC response from GPU{gpu} GSP! Expected function 76 "
        "(GSP_RM_CONTROL) (0x20800a4c 0x4)."
    ),
    120: "GSP task exception: Task 1 raised error code 0x5 for reason 0x0 at 0x32e76cc",
    140: (
        "An unrecovered ECC error has been detected on GPU in the framebuffer at partition 3, "
        "subpartition 1."
    ),
    143: "GPU Initialization Failure",
    154: "GPU recovery action changed from 0x0 (None) to 0x1 (Reset Required)",  # recovery_message()
}

def recovery_message(old: int, new: int) -> str:
    """The text of the driver's XID 154 line for a change of the recovery action from ``old`` to ``new``."""
    def name(v: int) -> str:
        return f"0x{v:x} ({RECOVERY_NAMES.get(v, 'Unknown')})"

    return f"GPU recovery action changed from {name(old)} to {name(new)}"


# The regex from gpu-health-facts.md that log scanners use.
XID_LINE_RE = re.compile(r"NVRM: Xid \(((?:PCI:)?[0-9a-fA-F:.]+)\).*?: (\d+),")

_PCI_RE = re.compile(
    r"^(?:PCI:)?(?:(?P<dom>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})"
    r"(?:\.(?P<fn>[0-7]))?$"
)


def _parse_pci(pci_bus_id: str) -> Tuple[int, int, int]:
    m = _PCI_RE.match(pci_bus_id.strip())
    if not m:
        raise ValueError(f"not a PCI bus id: {pci_bus_id!r}")
    return int(m.group("dom") or "0", 16), int(m.group("bus"), 16), int(m.group("dev"), 16)


def kernel_log_line(
    pci_bus_id: str,
    xid: int,
    *,
    pid: Optional[int] = None,
    name: Optional[str] = None,
    message: Optional[str] = None,
    link: int = 0,
    gpu: int = 0,
) -> str:
    """An NVIDIA driver Xid line as it appears in the kernel log, e.g.

    ``NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.``

    ``pci_bus_id`` may be in sysfs (``0000:3b:00.0``) or NVML (``00000000:3B:00.0``) form.
    ``pid``/``name`` default to the driver's ``<unknown>`` form; ``link`` (XID 74) and ``gpu``
    (XID 119) fill the message.
    """
    dom, bus, dev = _parse_pci(pci_bus_id)
    if message is None:
        message = XID_MESSAGES.get(int(xid), "Unknown Error").format(link=link, gpu=gpu)
    who = (
        "pid='<unknown>', name=<unknown>"
        if pid is None
        else f"pid={int(pid)}, name={name if name else '<unknown>'}"
    )
    return f"NVRM: Xid (PCI:{dom:04x}:{bus:02x}:{dev:02x}): {int(xid)}, {who}, {message}"


def fallen_off_bus_line(pci_bus_id: str) -> str:
    """The line the driver logs when a GPU drops off the bus without an Xid line."""
    dom, bus, dev = _parse_pci(pci_bus_id)
    return f"NVRM: GPU {dom:04x}:{bus:02x}:{dev:02x}.0: GPU has fallen off the bus."


# ----------------------------------------------------------------------------- /dev/kmsg

KERN_ERR = 3
KERN_WARNING = 4
KERN_INFO = 6


def _now_usec() -> int:
    return time.monotonic_ns() // 1000


def kmsg_prefix(
    seq: int, usec: Optional[int] = None, priority: int = KERN_WARNING, facility: int = 0
) -> str:
    """The ``/dev/kmsg`` record prefix ``<prio>,<seq>,<usec>,-;`` (prio = facility*8 + level).

    ``usec`` defaults to CLOCK_MONOTONIC in microseconds, like the kernel's timestamps.
    """
    if usec is None:
        usec = _now_usec()
    return f"{(facility << 3) | priority},{int(seq)},{int(usec)},-;"


def kmsg_record(
    message: str,
    seq: int,
    usec: Optional[int] = None,
    priority: int = KERN_WARNING,
    facility: int = 0,
) -> str:
    """One ``/dev/kmsg`` record, newline-terminated; bytes outside 32..126 and ``\\`` escaped as ``\\xNN``
    like the kernel does."""
    escaped = "".join(
        chr(b) if 32 <= b < 127 and b != 0x5C else f"\\x{b:02x}" for b in message.encode()
    )
    return kmsg_prefix(seq, usec, priority, facility) + escaped + "\n"


_KMSG_HEAD_RE = re.compile(r"^\d+,(\d+),")


def append_kmsg(path: PathLike, message: str, priority: int = KERN_WARNING) -> str:
    """Append ``message`` to a lab kernel-log file in ``/dev/kmsg`` format and return the record.

    The sequence number continues the file's last one; the timestamp is CLOCK_MONOTONIC in
    microseconds, like the kernel's.
    """
    path = Path(path)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        last_seq = -1
        if size:
            tail = os.pread(fd, min(size, 65536), max(0, size - 65536)).decode(errors="replace")
            for line in reversed(tail.splitlines()):
                m = _KMSG_HEAD_RE.match(line)
                if m:
                    last_seq = int(m.group(1))
                    break
        record = kmsg_record(message, last_seq + 1, _now_usec(), priority)
        os.write(fd, record.encode())
        return record
    finally:
        os.close(fd)

