"""xid-watch's NVML event set around a lost GPU, on an NVML that answers as scripted (what the fake
libnvidia-ml.so.1 cannot do: register a GPU that is lost). The lab side is
tests/integration/test_xidwatch_nvml_only_lab.py."""

from __future__ import annotations

import ctypes
import sys
import types

from autoheal.config.hooks_section import HooksSection
from autoheal.hooks import xid_watch as X
from autoheal_lab.testing.hooks import hook_context

TIMEOUT, LOST = 10, 15  # nvml.h's NVML_ERROR_TIMEOUT, NVML_ERROR_GPU_IS_LOST


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def scripted_nvml(monkeypatch, waits, gpus=2):
    """A ``pynvml`` whose nvmlEventSetWait_v2 answers from ``waits`` (an error code, or a GPU index: that
    GPU's XID 79), then LOST; returns the calls it saw."""
    calls: list = []
    handles = [ctypes.c_void_p(0x1000 + 0x10 * i) for i in range(gpus)]
    answers = iter(waits)

    def wait(evset, ms):
        calls.append("wait")
        a = next(answers, LOST)
        if a in (TIMEOUT, LOST):
            raise NVMLError(a)
        return types.SimpleNamespace(device=handles[a], eventData=79)

    nv = types.ModuleType("scripted_pynvml")
    nv.__dict__.update(
        NVMLError=NVMLError, NVML_ERROR_TIMEOUT=TIMEOUT, NVML_ERROR_GPU_IS_LOST=LOST, nvmlEventTypeXidCriticalError=8,
        nvmlInit=lambda: None, nvmlEventSetCreate=lambda: calls.append("create") or object(),
        nvmlDeviceGetCount=lambda: gpus, nvmlDeviceGetHandleByIndex=lambda i: handles[i],
        nvmlDeviceGetSupportedEventTypes=lambda h: 8, nvmlDeviceRegisterEvents=lambda h, m, s: None,
        nvmlEventSetWait_v2=wait, nvmlEventSetFree=lambda s: calls.append("free"))
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    return calls


def make_watch(tmp_path, monkeypatch):
    h = HooksSection(state_dir=str(tmp_path), kernel_log="", textfile_dir="", dcgm_mapping_dir="")
    watch = X.XidWatch(hook_context(h, source="xid-watch"))
    pauses: list = []
    monkeypatch.setattr(watch._stop, "wait", lambda t=None: pauses.append(t) or False)
    return watch, pauses


def test_a_set_lost_at_its_first_wait_is_rebuilt_after_a_pause_and_said_once(tmp_path, monkeypatch, capsys):
    # a lost GPU that NVML let us register: every new set says GPU_IS_LOST at once. The loop must not
    # spin on it, nor log a line per rebuild
    calls = scripted_nvml(monkeypatch, [])
    watch, pauses = make_watch(tmp_path, monkeypatch)
    for _ in range(3):
        watch._nvml_session()
    assert pauses == [X.LOST_REBUILD_PAUSE] * 3
    assert calls == ["create", "wait", "free"] * 3
    assert capsys.readouterr().out.count("xid-watch: NVML: XID events of GPU 0, 1\n") == 1
    assert watch.nvml_gpus == 0  # between sets


def test_a_set_that_waited_is_rebuilt_at_once_when_a_gpu_is_lost(tmp_path, monkeypatch):
    # an XID 79 told, then GPU_IS_LOST: the others' next XIDs go to a new set at once, not after a pause
    calls = scripted_nvml(monkeypatch, [TIMEOUT, 1, LOST])
    watch, pauses = make_watch(tmp_path, monkeypatch)
    watch._nvml_session()
    assert pauses == [] and calls == ["create", "wait", "wait", "wait", "free"]
    ev = watch.q.get_nowait()
    assert (ev.xid, ev.gpu, ev.source) == (79, 1, "nvml")
