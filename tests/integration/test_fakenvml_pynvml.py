"""The fake libnvidia-ml.so.1 driven by the real, unmodified pynvml in subprocesses.

Each test writes a node state file, then runs a small python script with
``LD_LIBRARY_PATH=<build dir>`` and ``AUTOHEAL_FAKE_NVML_STATE=<state>``; the script prints JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autoheal_lab import fakenvml
from autoheal_lab.fakenvml import state as st

REPO = Path(__file__).resolve().parents[2]

PRELUDE = textwrap.dedent(
    """
    import json, os, sys, threading, time
    import pynvml as n
    from autoheal_lab.fakenvml import state as st
    STATE = os.environ["AUTOHEAL_FAKE_NVML_STATE"]
    out = {}
    def err(fn, *args):
        try:
            fn(*args)
        except n.NVMLError as e:
            return type(e).__name__
        return None
    """
)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    path = tmp_path / "gpu1.state"
    st.write_state(path, st.default_state("gpu1", 8))
    return path


def run_nvml(lib_dir: Path, state: Path | None, body: str, timeout: float = 15.0, env_extra=None) -> dict:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(lib_dir)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if state is None:
        env.pop(fakenvml.STATE_ENV, None)
    else:
        env[fakenvml.STATE_ENV] = str(state)
    env.update(env_extra or {})
    script = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    if state is None:
        script = script.replace('STATE = os.environ["AUTOHEAL_FAKE_NVML_STATE"]', "STATE = None")
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def nvml_bus_id(sysfs: str) -> str:
    dom, bus, rest = sysfs.split(":")
    dev = rest.split(".")[0]
    return f"{int(dom, 16):08X}:{int(bus, 16):02X}:{int(dev, 16):02X}.0"


# --------------------------------------------------------------------------- inventory


def test_library_exports_only_nvml_symbols(lib_dir: Path):
    res = run_nvml(
        lib_dir,
        None,
        """
        import ctypes
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        out["has"] = {s: hasattr(lib, s) for s in ("nvmlInitWithFlags", "nvmlInit_v2", "nvmlEventSetWait_v2",
                                                 "nvmlDeviceGetCount_v2", "refresh_locked", "dev_begin",
                                                 "nvmlDeviceGetBoardId", "g_state")}
        """,
    )
    assert res["has"] == {
        "nvmlInitWithFlags": True,
        "nvmlInit_v2": True,
        "nvmlEventSetWait_v2": True,
        "nvmlDeviceGetCount_v2": True,
        "refresh_locked": False,
        "dev_begin": False,
        "nvmlDeviceGetBoardId": False,
        "g_state": False,
    }


def test_inventory_matches_state(lib_dir: Path, node: Path):
    state = st.read_state(node)
    res = run_nvml(
        lib_dir,
        node,
        """
        n.nvmlInit()
        out["driver"] = n.nvmlSystemGetDriverVersion()
        out["nvml"] = n.nvmlSystemGetNVMLVersion()
        out["cuda"] = n.nvmlSystemGetCudaDriverVersion_v2()
        out["count"] = n.nvmlDeviceGetCount()
        gpus = []
        for i in range(out["count"]):
            h = n.nvmlDeviceGetHandleByIndex(i)
            pci = n.nvmlDeviceGetPciInfo(h)
            gpus.append({
                "name": n.nvmlDeviceGetName(h), "uuid": n.nvmlDeviceGetUUID(h),
                "serial": n.nvmlDeviceGetSerial(h), "index": n.nvmlDeviceGetIndex(h),
                "minor": n.nvmlDeviceGetMinorNumber(h), "busId": pci.busId,
                "busIdLegacy": pci.busIdLegacy, "bus": pci.bus, "domain": pci.domain,
                "pciDeviceId": pci.pciDeviceId,
                "persistence": n.nvmlDeviceGetPersistenceMode(h),
                "mem_total": n.nvmlDeviceGetMemoryInfo(h).total,
                "mem_v2_reserved": n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).reserved,
                "procs": n.nvmlDeviceGetComputeRunningProcesses(h),
                "power": n.nvmlDeviceGetPowerUsage(h),
                "util": n.nvmlDeviceGetUtilizationRates(h).gpu,
                "pcie": [n.nvmlDeviceGetMaxPcieLinkGeneration(h), n.nvmlDeviceGetMaxPcieLinkWidth(h),
                         n.nvmlDeviceGetCurrPcieLinkGeneration(h), n.nvmlDeviceGetCurrPcieLinkWidth(h)],
            })
        out["gpus"] = gpus
        # look-ups by sysfs-form and NVML-form bus id, and by UUID, map back to the same index
        out["by_pci_sysfs"] = n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId("0000:5d:00.0"))
        out["by_pci_nvml"] = n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId("00000000:BB:00.0"))
        out["by_uuid"] = n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(gpus[6]["uuid"]))
        out["missing_uuid"] = err(n.nvmlDeviceGetHandleByUUID, "GPU-00000000-0000-0000-0000-000000000000")
        out["missing_pci"] = err(n.nvmlDeviceGetHandleByPciBusId, "0000:01:00.0")
        out["bad_index"] = err(n.nvmlDeviceGetHandleByIndex, 8)
        n.nvmlShutdown()
        """,
    )
    assert res["driver"] == "550.54.15"
    assert res["nvml"] == "12.550.54.15"
    assert res["cuda"] == 12040
    assert res["count"] == 8
    for i, (g, want) in enumerate(zip(res["gpus"], state.gpus)):
        assert g["name"] == "NVIDIA H100 80GB HBM3"
        assert g["uuid"] == want.uuid
        assert g["serial"] == want.serial
        assert g["index"] == i and g["minor"] == i
        assert g["busId"] == nvml_bus_id(want.pci_bus_id)
        assert g["busIdLegacy"] == nvml_bus_id(want.pci_bus_id)[4:]
        assert g["bus"] == int(want.pci_bus_id.split(":")[1], 16) and g["domain"] == 0
        assert g["pciDeviceId"] == 0x233010DE
        assert g["persistence"] == 1
        assert g["mem_total"] == want.memory_total
        assert g["mem_v2_reserved"] == want.memory_reserved
        assert g["procs"] == []
        assert g["power"] == want.power_mw and g["util"] == 0
        assert g["pcie"] == [5, 16, 5, 16]
    assert res["gpus"][1]["busId"] == "00000000:3B:00.0"
    assert len({g["uuid"] for g in res["gpus"]}) == 8
    assert (res["by_pci_sysfs"], res["by_pci_nvml"], res["by_uuid"]) == (3, 5, 6)
    assert res["missing_uuid"] == res["missing_pci"] == "NVMLError_NotFound"
    assert res["bad_index"] == "NVMLError_InvalidArgument"


def test_not_present_gpu_lowers_the_count(lib_dir: Path, node: Path):
    with st.update_state(node) as s:
        s.gpus[2].present = False
    res = run_nvml(
        lib_dir,
        node,
        """
        n.nvmlInit()
        out["count"] = n.nvmlDeviceGetCount()
        out["buses"] = [n.nvmlDeviceGetPciInfo(n.nvmlDeviceGetHandleByIndex(i)).bus for i in range(out["count"])]
        out["idx_of_5d"] = n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId("0000:5d:00.0"))
        out["missing"] = err(n.nvmlDeviceGetHandleByPciBusId, "0000:4c:00.0")
        """,
    )
    assert res["count"] == 7
    assert res["buses"] == [0x1B, 0x3B, 0x5D, 0x9B, 0xBB, 0xCB, 0xDB]
    assert res["idx_of_5d"] == 2
    assert res["missing"] == "NVMLError_NotFound"


# --------------------------------------------------------------------------- health, live


def test_health_queries_follow_state_changes_without_reinit(lib_dir: Path, node: Path):
    res = run_nvml(
        lib_dir,
        node,
        """
        RA = n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
        def snap(i):
            h = n.nvmlDeviceGetHandleByIndex(i)
            fv = n.nvmlDeviceGetFieldValues(h, [RA, 9999])
            return {
                "ecc_dbe_vol": n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                             n.NVML_VOLATILE_ECC),
                "ecc_dbe_agg": n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                             n.NVML_AGGREGATE_ECC),
                "ecc_sbe_vol": n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                                             n.NVML_VOLATILE_ECC),
                "ecc_mode": n.nvmlDeviceGetEccMode(h),
                "remap": list(n.nvmlDeviceGetRemappedRows(h)),
                "nvlink": [n.nvmlDeviceGetNvLinkState(h, l) for l in range(18)],
                "nvlink_18": err(n.nvmlDeviceGetNvLinkState, h, 18),
                "nvlink_max": err(n.nvmlDeviceGetNvLinkState, h, n.NVML_NVLINK_MAX_LINKS),
                "reasons": n.nvmlDeviceGetCurrentClocksEventReasons(h),
                "reasons_old": n.nvmlDeviceGetCurrentClocksThrottleReasons(h),
                "temp": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
                "tempv": n.nvmlDeviceGetTemperatureV(h, n.NVML_TEMPERATURE_GPU),
                "ra": [fv[0].fieldId, fv[0].nvmlReturn, fv[0].valueType, fv[0].value.uiVal],
                "unknown_field_ret": fv[1].nvmlReturn,
                "pcie_width": n.nvmlDeviceGetCurrPcieLinkWidth(h),
                "retired": err(n.nvmlDeviceGetRetiredPages_v2, h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
                "events": n.nvmlDeviceGetSupportedEventTypes(h),
            }
        n.nvmlInit()
        out["before"] = snap(2)
        st.inject(STATE, 2, "ecc-dbe")
        st.inject(STATE, 2, "nvlink-down", link=3)
        st.inject(STATE, 2, "thermal")
        st.inject(STATE, 2, "pcie-degraded")
        out["after"] = snap(2)
        out["neighbour"] = snap(1)
        st.inject(STATE, 2, "remap-failure")
        out["failure"] = snap(2)["remap"]
        st.inject(STATE, 2, "clear")
        out["cleared"] = snap(2)
        """,
    )
    before, after = res["before"], res["after"]
    assert before["ecc_dbe_vol"] == before["ecc_dbe_agg"] == before["ecc_sbe_vol"] == 0
    assert before["ecc_mode"] == [1, 1]
    assert before["remap"] == [0, 0, 0, 0]
    assert before["nvlink"] == [1] * 18
    assert before["nvlink_18"] == "NVMLError_NotSupported"
    assert before["nvlink_max"] == "NVMLError_InvalidArgument"
    assert before["reasons"] == before["reasons_old"] == 0x1
    assert before["temp"] == before["tempv"] == 35
    assert before["ra"] == [230, 0, 1, 0]
    assert before["unknown_field_ret"] == 3  # NVML_ERROR_NOT_SUPPORTED inside the value
    assert before["pcie_width"] == 16
    assert before["retired"] == "NVMLError_NotSupported"  # H100: row remapping, no page retirement
    assert before["events"] & 0x8

    assert after["ecc_dbe_vol"] == after["ecc_dbe_agg"] == 1
    assert after["remap"] == [0, 1, 1, 0]
    assert after["nvlink"] == [1, 1, 1, 0] + [1] * 14
    assert after["reasons"] & 0x8 and after["reasons"] & 0x40 and not after["reasons"] & 0x1
    assert after["temp"] == 92
    assert after["ra"][3] == 1  # NVML_GPU_RECOVERY_ACTION_GPU_RESET
    assert after["pcie_width"] == 8
    assert res["neighbour"] == before
    assert res["failure"] == [0, 1, 1, 1]
    assert res["cleared"] == before


def test_unsupported_features_per_arch_and_explicit(lib_dir: Path, node: Path):
    with st.update_state(node) as s:
        v = s.gpus[0]
        v.arch = "volta"
        v.name = "Tesla V100-SXM2-32GB"
        v.retired_pages_dbe = 2
        v.retired_pages_sbe = 1
        v.retired_pages_pending = True
        s.gpus[1].unsupported = ["recovery_action", "serial"]
        s.gpus[2].nvlink_count = 0
        s.gpus[3].ecc_mode = False
    res = run_nvml(
        lib_dir,
        node,
        """
        import ctypes
        n.nvmlInit()
        h0, h1, h2, h3 = (n.nvmlDeviceGetHandleByIndex(i) for i in range(4))
        out["v100_remap"] = err(n.nvmlDeviceGetRemappedRows, h0)
        out["v100_dbe_pages"] = n.nvmlDeviceGetRetiredPages_v2(h0, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        out["v100_sbe_pages"] = n.nvmlDeviceGetRetiredPages(
            h0, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        out["v100_pending"] = n.nvmlDeviceGetRetiredPagesPendingStatus(h0)
        out["h100_pending"] = err(n.nvmlDeviceGetRetiredPagesPendingStatus, h1)
        fv = n.nvmlDeviceGetFieldValues(h1, [n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        out["ra_ret"] = fv[0].nvmlReturn
        out["serial"] = err(n.nvmlDeviceGetSerial, h1)
        out["no_nvlink"] = err(n.nvmlDeviceGetNvLinkState, h2, 0)
        out["ecc_off"] = n.nvmlDeviceGetEccMode(h3)
        out["ecc_off_count"] = err(n.nvmlDeviceGetTotalEccErrors, h3, 1, 0)
        # raw calls: the count protocol of the real library
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        cnt = ctypes.c_uint(0)
        out["raw_first"] = lib.nvmlDeviceGetRetiredPages(h0, 1, ctypes.byref(cnt), None)
        out["raw_needed"] = cnt.value
        buf = ctypes.create_string_buffer(4)
        out["raw_short_name"] = lib.nvmlDeviceGetName(h0, buf, 4)
        out["raw_null_name"] = lib.nvmlDeviceGetName(h0, None, 96)
        out["raw_bad_handle"] = lib.nvmlDeviceGetName(ctypes.c_void_p(12345), ctypes.create_string_buffer(96), 96)
        out["raw_short_driver"] = lib.nvmlSystemGetDriverVersion(buf, 4)
        out["raw_temp_bad_sensor"] = lib.nvmlDeviceGetTemperature(h0, 7, ctypes.byref(cnt))
        out["raw_fields_zero"] = lib.nvmlDeviceGetFieldValues(h0, 0, None)
        """,
    )
    assert res["v100_remap"] == "NVMLError_NotSupported"
    assert [p["address"] for p in res["v100_dbe_pages"]] and len(res["v100_dbe_pages"]) == 2
    assert all(p["timestamp"] > 0 for p in res["v100_dbe_pages"])
    assert len(res["v100_sbe_pages"]) == 1
    assert res["v100_pending"] == 1
    assert res["h100_pending"] == "NVMLError_NotSupported"
    assert res["ra_ret"] == 3
    assert res["serial"] == "NVMLError_NotSupported"
    assert res["no_nvlink"] == "NVMLError_NotSupported"
    assert res["ecc_off"] == [0, 0]
    assert res["ecc_off_count"] == "NVMLError_NotSupported"
    assert res["raw_first"] == 7 and res["raw_needed"] == 2  # INSUFFICIENT_SIZE + needed count
    assert res["raw_short_name"] == 7
    assert res["raw_null_name"] == 2
    assert res["raw_bad_handle"] == 2
    assert res["raw_short_driver"] == 7
    assert res["raw_temp_bad_sensor"] == 2
    assert res["raw_fields_zero"] == 2


# --------------------------------------------------------------------------- lost / hang


def test_gpu_lost(lib_dir: Path, node: Path):
    st.inject(node, 4, "lost")
    res = run_nvml(
        lib_dir,
        node,
        """
        n.nvmlInit()
        out["count"] = n.nvmlDeviceGetCount()
        out["handle4"] = err(n.nvmlDeviceGetHandleByIndex, 4)
        out["handle4_pci"] = err(n.nvmlDeviceGetHandleByPciBusId, "0000:9b:00.0")
        h5 = n.nvmlDeviceGetHandleByIndex(5)
        out["gpu5_ok"] = n.nvmlDeviceGetTemperature(h5, 0)
        # a handle taken while healthy fails once the GPU falls off the bus (XID 79)
        st.inject(STATE, 5, "xid", xid=79)
        out["gpu5_lost"] = [err(n.nvmlDeviceGetTemperature, h5, 0), err(n.nvmlDeviceGetUUID, h5),
                            err(n.nvmlDeviceGetFieldValues, h5, [n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])]
        out["gpu3_ok"] = n.nvmlDeviceGetName(n.nvmlDeviceGetHandleByIndex(3))
        st.inject(STATE, 5, "clear")
        out["gpu5_back"] = n.nvmlDeviceGetTemperature(h5, 0)
        """,
    )
    assert res["count"] == 8  # a lost GPU is still enumerated
    assert res["handle4"] == res["handle4_pci"] == "NVMLError_GpuIsLost"
    assert res["gpu5_ok"] == 35
    assert res["gpu5_lost"] == ["NVMLError_GpuIsLost"] * 3
    assert res["gpu3_ok"] == "NVIDIA H100 80GB HBM3"
    assert res["gpu5_back"] == 35


def test_hang_delays_only_that_gpu(lib_dir: Path, node: Path):
    st.inject(node, 1, "hang", hang_ms=500)
    res = run_nvml(
        lib_dir,
        node,
        """
        n.nvmlInit()
        h0 = n.nvmlDeviceGetHandleByIndex(0)
        t = time.monotonic(); h1 = n.nvmlDeviceGetHandleByIndex(1); out["handle_s"] = time.monotonic() - t
        other = {}
        def hung():
            t = time.monotonic(); n.nvmlDeviceGetTemperature(h1, 0); other["hung_s"] = time.monotonic() - t
        th = threading.Thread(target=hung); th.start()
        time.sleep(0.05)
        t = time.monotonic()
        for _ in range(20):
            n.nvmlDeviceGetTemperature(h0, 0)
        out["gpu0_20_calls_s"] = time.monotonic() - t
        th.join()
        out["hung_s"] = other["hung_s"]
        st.inject(STATE, 1, "clear")
        t = time.monotonic(); n.nvmlDeviceGetTemperature(h1, 0); out["cleared_s"] = time.monotonic() - t
        """,
    )
    assert 0.45 <= res["handle_s"] < 2.0
    assert 0.45 <= res["hung_s"] < 2.0
    assert res["gpu0_20_calls_s"] < 0.3  # the lock is not held while GPU 1 sleeps
    assert res["cleared_s"] < 0.1


def test_init_hang_and_driver_not_loaded(lib_dir: Path, node: Path, tmp_path: Path):
    with st.update_state(node) as s:
        s.init_hang_ms = 300
    res = run_nvml(
        lib_dir,
        node,
        """
        t = time.monotonic(); n.nvmlInit(); out["init_s"] = time.monotonic() - t
        """,
    )
    assert 0.28 <= res["init_s"] < 2.0

    with st.update_state(node) as s:
        s.init_hang_ms = 0
        s.driver_loaded = False
    body = """
    out["init"] = err(n.nvmlInit)
    """
    assert run_nvml(lib_dir, node, body)["init"] == "NVMLError_DriverNotLoaded"
    assert run_nvml(lib_dir, tmp_path / "missing.state", body)["init"] == "NVMLError_DriverNotLoaded"
    assert run_nvml(lib_dir, None, body)["init"] == "NVMLError_DriverNotLoaded"


# --------------------------------------------------------------------------- init / errors


def test_uninitialized_refcount_and_function_not_found(lib_dir: Path, node: Path):
    res = run_nvml(
        lib_dir,
        node,
        """
        out["before_init"] = err(n.nvmlDeviceGetCount)
        n.nvmlInit()
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        out["not_found"] = err(n.nvmlDeviceGetBoardId, h)
        n.nvmlShutdown()
        out["after_one_shutdown"] = n.nvmlDeviceGetCount()
        n.nvmlShutdown()
        # the library is loaded now, so these errors come from the fake library itself
        out["after_two_shutdowns"] = [err(n.nvmlDeviceGetCount), err(n.nvmlDeviceGetTemperature, h, 0),
                                      err(n.nvmlSystemGetDriverVersion), err(n.nvmlEventSetCreate)]
        out["third_shutdown"] = err(n.nvmlShutdown)
        out["nvml_version_no_init"] = n.nvmlSystemGetNVMLVersion()
        out["error_string"] = n.nvmlErrorString(n.NVML_ERROR_GPU_IS_LOST)
        out["error_string_unknown"] = n.nvmlErrorString(4242)
        """,
    )
    assert res["before_init"] == "NVMLError_Uninitialized"
    assert res["not_found"] == "NVMLError_FunctionNotFound"
    assert res["after_one_shutdown"] == 8
    assert res["after_two_shutdowns"] == ["NVMLError_Uninitialized"] * 4
    assert res["third_shutdown"] == "NVMLError_Uninitialized"
    assert res["nvml_version_no_init"] == "12.550.54.15"
    assert res["error_string"] == "GPU is lost"
    assert res["error_string_unknown"] == "Unknown Error"


# --------------------------------------------------------------------------- events


def test_xid_event_delivered_once_and_old_events_not_delivered(lib_dir: Path, node: Path):
    st.inject(node, 0, "xid", xid=13)  # before any event set exists: must never be delivered
    res = run_nvml(
        lib_dir,
        node,
        """
        n.nvmlInit()
        es = n.nvmlEventSetCreate()
        handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
        for h in handles:
            n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)
        out["old"] = err(n.nvmlEventSetWait_v2, es, 100)
        threading.Timer(0.15, lambda: st.inject(STATE, 3, "xid", xid=48)).start()
        t = time.monotonic()
        d = n.nvmlEventSetWait_v2(es, 3000)
        out["latency_s"] = time.monotonic() - t
        out["event"] = {"index": n.nvmlDeviceGetIndex(d.device), "type": d.eventType, "xid": d.eventData,
                        "gi": d.gpuInstanceId, "ci": d.computeInstanceId}
        t = time.monotonic()
        out["again"] = err(n.nvmlEventSetWait_v2, es, 200)
        out["again_s"] = time.monotonic() - t
        # a set created now does not see the earlier XIDs either
        es2 = n.nvmlEventSetCreate()
        n.nvmlDeviceRegisterEvents(handles[3], n.nvmlEventTypeXidCriticalError, es2)
        out["new_set"] = err(n.nvmlEventSetWait_v2, es2, 50)
        st.inject(STATE, 3, "xid", xid=94)
        out["both"] = [n.nvmlEventSetWait_v2(es, 1000).eventData, n.nvmlEventSetWait_v2(es2, 1000).eventData]
        out["legacy_wait"] = err(n.nvmlEventSetWait, es, 10)
        n.nvmlEventSetFree(es)
        n.nvmlEventSetFree(es2)
        """,
    )
    assert res["old"] == "NVMLError_Timeout"
    assert 0.1 <= res["latency_s"] < 1.0
    assert res["event"] == {"index": 3, "type": 0x8, "xid": 48, "gi": 0xFFFFFFFF, "ci": 0xFFFFFFFF}
    assert res["again"] == "NVMLError_Timeout"
    assert 0.18 <= res["again_s"] < 1.0
    assert res["new_set"] == "NVMLError_Timeout"
    assert res["both"] == [94, 94]
    assert res["legacy_wait"] == "NVMLError_Timeout"


def test_event_registration_filters_devices_and_types(lib_dir: Path, node: Path):
    res = run_nvml(
        lib_dir,
        node,
        """
        n.nvmlInit()
        h0, h5 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(5)
        es = n.nvmlEventSetCreate()
        out["unsupported_type"] = err(n.nvmlDeviceRegisterEvents, h0, n.nvmlEventTypeGpuRecoveryAction, es)
        n.nvmlDeviceRegisterEvents(h0, n.nvmlEventTypeXidCriticalError | n.nvmlEventTypeDoubleBitEccError, es)
        st.inject(STATE, 5, "xid", xid=31)           # GPU 5 is not registered yet ...
        n.nvmlDeviceRegisterEvents(h5, n.nvmlEventTypeXidCriticalError, es)  # ... so this must not replay it
        st.inject(STATE, 0, "ecc-dbe")               # XID 48 + a double-bit ECC event on GPU 0
        got = []
        while True:
            try:
                d = n.nvmlEventSetWait_v2(es, 100)
            except n.NVMLError_Timeout:
                break
            got.append([n.nvmlDeviceGetIndex(d.device), d.eventType, d.eventData])
        out["got"] = got
        # registering GPU 5 again (more types) does not replay anything either
        n.nvmlDeviceRegisterEvents(h5, n.nvmlEventTypeXidCriticalError | n.nvmlEventTypeDoubleBitEccError, es)
        out["late_register"] = err(n.nvmlEventSetWait_v2, es, 50)
        # a lost registered GPU: pending events first, then GPU_IS_LOST
        st.inject(STATE, 5, "xid", xid=79)
        d = n.nvmlEventSetWait_v2(es, 1000)
        import ctypes
        addr = lambda h: ctypes.cast(h, ctypes.c_void_p).value
        out["xid79"] = [addr(d.device) == addr(h5), d.eventData]
        out["after_79"] = err(n.nvmlEventSetWait_v2, es, 1000)
        out["register_lost"] = err(n.nvmlDeviceRegisterEvents, h5, n.nvmlEventTypeXidCriticalError, es)
        n.nvmlEventSetFree(es)
        """,
    )
    assert res["unsupported_type"] == "NVMLError_NotSupported"
    assert res["got"] == [[0, 0x8, 48], [0, 0x2, 0]]
    assert res["late_register"] == "NVMLError_Timeout"
    assert res["xid79"] == [True, 79]
    assert res["after_79"] == "NVMLError_GpuIsLost"
    assert res["register_lost"] == "NVMLError_GpuIsLost"


def test_concurrent_wait_and_reads(lib_dir: Path, node: Path):
    res = run_nvml(
        lib_dir,
        node,
        """
        n.nvmlInit()
        es = n.nvmlEventSetCreate()
        hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
        for h in hs:
            n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)
        res = {"reads": 0, "errors": [], "events": []}
        stop = threading.Event()
        def waiter():
            t = time.monotonic()
            while time.monotonic() - t < 3 and len(res["events"]) < 3:
                try:
                    d = n.nvmlEventSetWait_v2(es, 500)
                    res["events"].append([n.nvmlDeviceGetIndex(d.device), d.eventData])
                except n.NVMLError_Timeout:
                    pass
        def reader(k):
            while not stop.is_set():
                try:
                    h = hs[k % 8]
                    n.nvmlDeviceGetTemperature(h, 0); n.nvmlDeviceGetRemappedRows(h)
                    n.nvmlDeviceGetUUID(h); n.nvmlDeviceGetCount()
                    res["reads"] += 1
                except Exception as e:
                    res["errors"].append(repr(e))
                k += 1
        ws = [threading.Thread(target=waiter)]
        rs = [threading.Thread(target=reader, args=(k,)) for k in range(2)]
        for t in ws + rs: t.start()
        for i, x in enumerate((43, 74, 119)):
            time.sleep(0.1)
            st.inject(STATE, i + 1, "xid", xid=x)
        ws[0].join(5)
        stop.set()
        for t in rs: t.join(5)
        out.update(res)
        """,
    )
    assert res["errors"] == []
    assert res["reads"] > 50
    assert res["events"] == [[1, 43], [2, 74], [3, 119]]


# --------------------------------------------------------------------------- build


def test_build_library_rebuilds_only_when_inputs_change(lib_dir: Path, tmp_path: Path):
    out = tmp_path / "lib"
    lib = fakenvml.build_library(out)
    assert lib == out / "libnvidia-ml.so.1"
    ino = lib.stat().st_ino
    assert fakenvml.build_library(out).stat().st_ino == ino  # unchanged: no rebuild
    (out / "libnvidia-ml.so.1.sha256").write_text("stale\n")
    assert fakenvml.build_library(out).stat().st_ino != ino  # hash differs: rebuilt, replaced
    assert sorted(p.name for p in out.iterdir()) == ["libnvidia-ml.so.1", "libnvidia-ml.so.1.sha256"]
    soname = subprocess.run(["objdump", "-p", str(lib)], capture_output=True, text=True)
    if soname.returncode == 0:
        assert "SONAME               libnvidia-ml.so.1" in soname.stdout


def test_build_library_reports_compiler_errors_on_one_line(lib_dir: Path, tmp_path: Path, monkeypatch):
    broken = tmp_path / "fake_nvml.c"
    broken.write_text("#include <nvml.h>\nint oops( {\n")
    monkeypatch.setattr(fakenvml, "SOURCE", broken)
    out = tmp_path / "lib"
    with pytest.raises(fakenvml.FakeNvmlBuildError) as info:
        fakenvml.build_library(out)
    msg = str(info.value)
    assert "failed" in msg and "libnvidia-ml.so.1" in msg and "error" in msg
    assert "\n" not in msg
    assert not (out / "libnvidia-ml.so.1").exists()
    assert list(out.iterdir()) == []
