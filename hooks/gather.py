"""Read GPU state through NVML once per run, with a time budget, into plain dataclasses.

The reads go through ``autoheal.hooks.nvml`` (the pass's few calls with pynvml's semantics, without
pynvml's import cost: issue 24 section 6). One ``nvmlInit`` per process and binding. The reads run in
worker threads (one per GPU after init) and the caller waits at most ``budget`` seconds: a GPU (or the
driver) that hangs is reported as not read (``GpuSample.error = "timeout"``), never as a hung hook. The
judges in ``checks`` only see these dataclasses, so they are pure and unit-testable without NVML.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, field

from autoheal.records import record

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Set

CLOCKS_GPU_IDLE = 0x1
FI_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
NVLINK_MAX_LINKS = 18


@record
class GpuSample:
    """What NVML said about one GPU. ``None`` fields were not supported or not read."""

    index: int
    ok: bool = False  # every essential read finished
    error: str = ""  # "", "lost", "timeout", or an NVML error string
    name: str = ""
    uuid: str = ""
    pci: str = ""  # "0000:3b:00.0"
    persistence: Optional[bool] = None
    temperature: Optional[int] = None
    ecc_dbe_volatile: Optional[int] = None
    remap_pending: Optional[bool] = None
    remap_failure: Optional[bool] = None
    remap_uncorrectable: Optional[int] = None
    retired_pages: Optional[int] = None
    retired_pending: Optional[bool] = None
    pcie_gen: Optional[int] = None
    pcie_gen_max: Optional[int] = None
    pcie_width: Optional[int] = None
    pcie_width_max: Optional[int] = None
    nvlinks_down: Optional[List[int]] = None
    clock_events: Optional[int] = None
    recovery_action: Optional[int] = None
    idle: Optional[bool] = None


@record
class NodeSample:
    """One gathering pass over the node."""

    node: str = ""
    time: float = 0.0
    init_error: str = ""  # nvmlInit failed or timed out: nothing is known
    driver_version: str = ""
    count: Optional[int] = None
    gpus: List[GpuSample] = field(default_factory=list)
    elapsed: float = 0.0

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> NodeSample:
        gpus = [GpuSample(**g) for g in d.get("gpus", [])]
        rest = {k: v for k, v in d.items() if k != "gpus" and k in cls.__dataclass_fields__}
        return cls(gpus=gpus, **rest)


_init_lock = threading.Lock()
#: The bindings (module names) whose nvmlInit has succeeded in this process: xid-watch inits pynvml for
#: its events and this module's binding for its polls; each must init its own library handle.
_initialised: Set[str] = set()


def _nvml() -> Any:
    from autoheal.hooks import nvml  # imported lazily: the CLI's --help must not pay for ctypes

    return nvml


def _init(nv: Any) -> None:
    with _init_lock:
        if nv.__name__ not in _initialised:
            nv.nvmlInit()
            _initialised.add(nv.__name__)


def _err(nv: Any, exc: Exception) -> str:
    if isinstance(exc, nv.NVMLError) and getattr(exc, "value", None) == nv.NVML_ERROR_GPU_IS_LOST:
        return "lost"
    return str(exc) or type(exc).__name__


def _opt(nv: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """One optional read: None when unsupported; GPU-lost propagates. ``nv``: the binding ``fn`` is of
    (its own NVMLError class: xid-watch reads through pynvml, the hooks through ``nvml``)."""
    try:
        return fn(*args)
    except nv.NVMLError as exc:
        if getattr(exc, "value", None) == nv.NVML_ERROR_GPU_IS_LOST:
            raise
        return None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _read_retired_pages(nv: Any, h: Any, sample: GpuSample) -> None:
    """Retired pages (both causes) and whether a retirement waits for a reset (GPUs before A100)."""
    pages = 0
    for cause in (nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                  nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR):
        got = _opt(nv, nv.nvmlDeviceGetRetiredPages, h, cause)
        if got is not None:
            pages += len(got)
    sample.retired_pages = pages
    pend = _opt(nv, nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
    sample.retired_pending = None if pend is None else bool(pend)


def _nvlinks_down(nv: Any, h: Any) -> Optional[List[int]]:
    """The NVLinks that are down; None when the GPU has none (link 0 not supported)."""
    down: List[int] = []
    supported = False
    for link in range(NVLINK_MAX_LINKS):
        st = _opt(nv, nv.nvmlDeviceGetNvLinkState, h, link)
        if st is None:
            if link == 0:
                break
            continue
        supported = True
        if not st:
            down.append(link)
    return down if supported else None


def read_gpu(nv: Any, index: int, sample: GpuSample, cheap: bool = False) -> None:
    """Fill ``sample`` for GPU ``index`` (in place, so a timeout keeps what was read)."""
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        sample.uuid = _text(nv.nvmlDeviceGetUUID(h))
        pci = nv.nvmlDeviceGetPciInfo(h)
        bus = _text(pci.busId)
        # NVML: "00000000:3B:00.0" -> "0000:3b:00.0"
        sample.pci = bus.lower()[-12:] if len(bus) >= 12 else bus.lower()
        sample.ecc_dbe_volatile = _opt(nv, nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                       nv.NVML_VOLATILE_ECC)
        rows = _opt(nv, nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            sample.remap_uncorrectable, sample.remap_pending, sample.remap_failure = (
                int(rows[1]), bool(rows[2]), bool(rows[3]))
        if cheap:
            sample.ok = True
            return
        sample.name = _text(_opt(nv, nv.nvmlDeviceGetName, h) or "")
        pm = _opt(nv, nv.nvmlDeviceGetPersistenceMode, h)
        sample.persistence = None if pm is None else bool(pm)
        sample.temperature = _opt(nv, nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        if rows is None:  # pre-A100: page retirement instead of row remapping
            _read_retired_pages(nv, h, sample)
        sample.pcie_gen = _opt(nv, nv.nvmlDeviceGetCurrPcieLinkGeneration, h)
        sample.pcie_gen_max = _opt(nv, nv.nvmlDeviceGetMaxPcieLinkGeneration, h)
        sample.pcie_width = _opt(nv, nv.nvmlDeviceGetCurrPcieLinkWidth, h)
        sample.pcie_width_max = _opt(nv, nv.nvmlDeviceGetMaxPcieLinkWidth, h)
        sample.nvlinks_down = _nvlinks_down(nv, h)
        getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        sample.clock_events = _opt(nv, getter, h)
        if sample.clock_events is not None:
            sample.idle = bool(sample.clock_events & CLOCKS_GPU_IDLE)
        fv = _opt(nv, nv.nvmlDeviceGetFieldValues, h, [FI_RECOVERY_ACTION])
        if fv and fv[0].nvmlReturn == 0:
            sample.recovery_action = int(fv[0].value.uiVal)
        sample.ok = True
    except nv.NVMLError as exc:
        sample.error = _err(nv, exc)
    except Exception as exc:  # a pynvml/driver mismatch must not crash the hook
        sample.error = f"{type(exc).__name__}: {exc}"


def gather(node: str = "", budget: float = 8.0, cheap: bool = False) -> NodeSample:
    """Read every GPU, waiting at most ``budget`` seconds in total. ``cheap``: identity, ECC and
    row-remap reads only (the prolog's live reads)."""
    start = time.monotonic()
    deadline = start + budget
    sample = NodeSample(node=node, time=time.time())
    done = threading.Event()
    threads: List[threading.Thread] = []

    def per_gpu(nv: Any, g: GpuSample) -> None:
        read_gpu(nv, g.index, g, cheap)

    def run() -> None:
        try:
            nv = _nvml()
            _init(nv)
            sample.driver_version = _text(nv.nvmlSystemGetDriverVersion())
            count = nv.nvmlDeviceGetCount()
            sample.count = count
            sample.gpus = [GpuSample(index=i) for i in range(count)]
            for g in sample.gpus:
                t = threading.Thread(target=per_gpu, args=(nv, g), daemon=True, name=f"nvml-gpu{g.index}")
                t.start()
                threads.append(t)
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
        except Exception as exc:  # NVMLError (driver not loaded, ...) or the library missing
            sample.init_error = str(exc) or type(exc).__name__
        finally:
            done.set()

    worker = threading.Thread(target=run, daemon=True, name="nvml-init")
    worker.start()
    if not done.wait(budget):
        if sample.count is None:
            sample.init_error = f"NVML did not answer within {budget:g}s (nvmlInit or device count hung)"
    for g in sample.gpus:
        if not g.ok and not g.error:
            g.error = "timeout"
    sample.elapsed = time.monotonic() - start
    return sample


def index_by_pci(sample: NodeSample) -> Dict[str, int]:
    """``"0000:3b:00"`` -> NVML index, for mapping kernel-log XIDs to GPUs."""
    from autoheal.hooks.xids import normalize_pci

    return {normalize_pci(g.pci): g.index for g in sample.gpus if g.pci}
