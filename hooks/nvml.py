"""The NVML calls of a health pass (``gather.read_gpu``), through ctypes, with pynvml's semantics.

Why not pynvml here: its 8,000-line module creates some 200 classes (ctypes structures, error
subclasses) and imports ``ctypes.util`` (``shutil``, ``tempfile``, ``random``) at import, about a quarter
of a healthy healthcheck's CPU time, paid by every HealthCheckProgram, prolog and epilog run (issue 24
section 6). This module makes the same library calls pynvml makes for the functions the pass uses
(same symbols, the ``_v2``/``_v3`` ones where pynvml picks them, the same buffer sizes, the same
two-call size query for retired pages) and returns what pynvml returns: ints, tuples, ``str`` for the
string getters, the PCI info and field-value structures with the same field layout. Errors are
``NVMLError`` with ``.value`` and pynvml's messages. xid-watch's event loop, which runs once per boot,
keeps the real pynvml (tests/integration/test_hooks_nvml.py runs both against the fake library).
"""

from __future__ import annotations

import ctypes
import threading

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Tuple

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_TEMPERATURE_GPU = 0
NVML_VOLATILE_ECC = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1

#: pynvml's buffer sizes (NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE,
#: NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE / _V2_SIZE).
DRIVER_VERSION_SIZE, UUID_SIZE, NAME_SIZE, BUS_ID_SIZE, BUS_ID_LEGACY_SIZE = 80, 96, 96, 32, 16

#: pynvml's NVMLError._errcode_to_string: the text ``str(NVMLError(code))`` gives for known codes.
_MESSAGES = {
    1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 4: "Insufficient Permissions",
    5: "Already Initialized", 6: "Not Found", 7: "Insufficient Size", 8: "Insufficient External Power",
    9: "Driver Not Loaded", 10: "Timeout", 11: "Interrupt Request Issue", 12: "NVML Shared Library Not Found",
    13: "Function Not Found", 14: "Corrupted infoROM", 15: "GPU is lost", 16: "GPU requires restart",
    17: "The operating system has blocked the request.", 18: "RM has detected an NVML/RM version mismatch.",
    20: "Insufficient Memory", 999: "Unknown Error",
}


class NVMLError(Exception):
    """An NVML return code other than success; ``value`` is the code (as pynvml's NVMLError)."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        if self.value in _MESSAGES:
            return _MESSAGES[self.value]
        try:  # a code newer than this table: the library's own text (pynvml asks it too)
            fn = _function("nvmlErrorString")
            fn.restype = ctypes.c_char_p
            text = fn(self.value)
            return text.decode(errors="replace") if text else f"NVML Error with code {self.value}"
        except NVMLError:
            return f"NVML Error with code {self.value}"


class PciInfo(ctypes.Structure):
    """nvmlPciInfo_t as nvmlDeviceGetPciInfo_v3 fills it (pynvml's nvmlPciInfo_t)."""

    _fields_ = [("busIdLegacy", ctypes.c_char * BUS_ID_LEGACY_SIZE), ("domain", ctypes.c_uint),
                ("bus", ctypes.c_uint), ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint),
                ("pciSubSystemId", ctypes.c_uint), ("busId", ctypes.c_char * BUS_ID_SIZE)]


class Value(ctypes.Union):
    """nvmlValue_t (pynvml's c_nvmlValue_t)."""

    _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ulVal", ctypes.c_ulong),
                ("ullVal", ctypes.c_ulonglong), ("sllVal", ctypes.c_longlong), ("siVal", ctypes.c_int),
                ("usVal", ctypes.c_ushort)]


class FieldValue(ctypes.Structure):
    """nvmlFieldValue_t (pynvml's c_nvmlFieldValue_t)."""

    _fields_ = [("fieldId", ctypes.c_uint32), ("scopeId", ctypes.c_uint32), ("timestamp", ctypes.c_int64),
                ("latencyUsec", ctypes.c_int64), ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                ("value", Value)]


_lock = threading.Lock()
_lib: Any = None
_functions: Dict[str, Callable[..., int]] = {}


def _load() -> None:
    """dlopen libnvidia-ml.so.1 once (as pynvml: a missing library is NVML_ERROR_LIBRARY_NOT_FOUND)."""
    global _lib
    with _lock:
        if _lib is None:
            try:
                _lib = ctypes.CDLL("libnvidia-ml.so.1")
            except OSError:
                raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND) from None


def _function(name: str) -> Any:
    with _lock:
        fn = _functions.get(name)
        if fn is None:
            if _lib is None:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            try:
                fn = _functions[name] = getattr(_lib, name)
            except AttributeError:
                raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND) from None
        return fn


def _call(name: str, *args: Any) -> None:
    ret = _function(name)(*args)
    if ret != NVML_SUCCESS:
        raise NVMLError(ret)


def _uint(name: str, handle: Any, *args: Any) -> int:
    out = ctypes.c_uint()
    _call(name, handle, *args, ctypes.byref(out))
    return out.value


def _ulonglong(name: str, handle: Any, *args: Any) -> int:
    out = ctypes.c_ulonglong()
    _call(name, handle, *args, ctypes.byref(out))
    return out.value


def _string(name: str, size: int, *handle: Any) -> str:
    buf = ctypes.create_string_buffer(size)
    _call(name, *handle, buf, ctypes.c_uint(size))
    return buf.value.decode()


def nvmlInit() -> None:
    _load()
    _call("nvmlInitWithFlags", 0)


def nvmlSystemGetDriverVersion() -> str:
    return _string("nvmlSystemGetDriverVersion", DRIVER_VERSION_SIZE)


def nvmlDeviceGetCount() -> int:
    out = ctypes.c_uint()
    _call("nvmlDeviceGetCount_v2", ctypes.byref(out))
    return out.value


def nvmlDeviceGetHandleByIndex(index: int) -> ctypes.c_void_p:
    handle = ctypes.c_void_p()
    _call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
    return handle


def nvmlDeviceGetUUID(handle: Any) -> str:
    return _string("nvmlDeviceGetUUID", UUID_SIZE, handle)


def nvmlDeviceGetName(handle: Any) -> str:
    return _string("nvmlDeviceGetName", NAME_SIZE, handle)


def nvmlDeviceGetPciInfo(handle: Any) -> PciInfo:
    info = PciInfo()
    _call("nvmlDeviceGetPciInfo_v3", handle, ctypes.byref(info))
    return info


def nvmlDeviceGetTotalEccErrors(handle: Any, error_type: int, counter_type: int) -> int:
    return _ulonglong("nvmlDeviceGetTotalEccErrors", handle, ctypes.c_uint(error_type), ctypes.c_uint(counter_type))


def nvmlDeviceGetRemappedRows(handle: Any) -> Tuple[int, int, int, int]:
    out = [ctypes.c_uint() for _ in range(4)]
    _call("nvmlDeviceGetRemappedRows", handle, *(ctypes.byref(v) for v in out))
    return out[0].value, out[1].value, out[2].value, out[3].value


def nvmlDeviceGetPersistenceMode(handle: Any) -> int:
    return _uint("nvmlDeviceGetPersistenceMode", handle)


def nvmlDeviceGetTemperature(handle: Any, sensor: int) -> int:
    return _uint("nvmlDeviceGetTemperature", handle, ctypes.c_uint(sensor))


def nvmlDeviceGetRetiredPages(handle: Any, cause: int) -> List[int]:
    """As pynvml: ask the count, then read with room for pages retired in between (2n + 5)."""
    fn = _function("nvmlDeviceGetRetiredPages")
    count = ctypes.c_uint(0)
    ret = fn(handle, ctypes.c_uint(cause), ctypes.byref(count), None)
    if ret not in (NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE):
        raise NVMLError(ret)
    count.value = count.value * 2 + 5
    pages = (ctypes.c_ulonglong * count.value)()
    _call("nvmlDeviceGetRetiredPages", handle, ctypes.c_uint(cause), ctypes.byref(count), pages)
    return [int(p) for p in pages[0:count.value]]


def nvmlDeviceGetRetiredPagesPendingStatus(handle: Any) -> int:
    return _uint("nvmlDeviceGetRetiredPagesPendingStatus", handle)


def nvmlDeviceGetCurrPcieLinkGeneration(handle: Any) -> int:
    return _uint("nvmlDeviceGetCurrPcieLinkGeneration", handle)


def nvmlDeviceGetMaxPcieLinkGeneration(handle: Any) -> int:
    return _uint("nvmlDeviceGetMaxPcieLinkGeneration", handle)


def nvmlDeviceGetCurrPcieLinkWidth(handle: Any) -> int:
    return _uint("nvmlDeviceGetCurrPcieLinkWidth", handle)


def nvmlDeviceGetMaxPcieLinkWidth(handle: Any) -> int:
    return _uint("nvmlDeviceGetMaxPcieLinkWidth", handle)


def nvmlDeviceGetNvLinkState(handle: Any, link: int) -> int:
    return _uint("nvmlDeviceGetNvLinkState", handle, ctypes.c_uint(link))


def nvmlDeviceGetCurrentClocksEventReasons(handle: Any) -> int:
    return _ulonglong("nvmlDeviceGetCurrentClocksEventReasons", handle)


def nvmlDeviceGetFieldValues(handle: Any, field_ids: List[int]) -> Any:
    """The filled nvmlFieldValue_t array (each entry's ``nvmlReturn`` says whether it was read)."""
    values = (FieldValue * len(field_ids))()
    for i, field_id in enumerate(field_ids):
        values[i].fieldId = field_id
    _call("nvmlDeviceGetFieldValues", handle, ctypes.c_int32(len(field_ids)), ctypes.byref(values))
    return values
