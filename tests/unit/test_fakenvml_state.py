"""Unit tests of the Python side of the fake NVML library: state file, inject, kernel-log lines."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from autoheal_lab import fakenvml
from autoheal_lab.fakenvml import state as st

FACTS_XID_RE = re.compile(r"NVRM: Xid \(((?:PCI:)?[0-9a-fA-F:.]+)\).*?: (\d+),")


@pytest.fixture
def node(tmp_path: Path) -> Path:
    path = tmp_path / "node1.state"
    st.write_state(path, st.default_state("node1", 8))
    return path


# --------------------------------------------------------------------------- default state


def test_default_state_is_a_healthy_h100_node():
    s = st.default_state("gpu-node-07", 8)
    assert s.node_name == "gpu-node-07"
    assert s.driver_version == "550.54.15"
    assert s.driver_loaded is True
    assert [g.index for g in s.gpus] == list(range(8))
    assert [g.pci_bus_id for g in s.gpus] == [
        "0000:1b:00.0", "0000:3b:00.0", "0000:4c:00.0", "0000:5d:00.0",
        "0000:9b:00.0", "0000:bb:00.0", "0000:cb:00.0", "0000:db:00.0",
    ]
    uuids = [g.uuid for g in s.gpus]
    assert len(set(uuids)) == 8
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", u) for u in uuids)
    assert len({g.serial for g in s.gpus}) == 8
    for g in s.gpus:
        assert g.name == "NVIDIA H100 80GB HBM3"
        assert (g.pcie_max_gen, g.pcie_max_width) == (5, 16)
        assert (g.pcie_curr_gen, g.pcie_curr_width) == (5, 16)
        assert g.nvlink_count == 18 and g.nvlink_down == []
        assert g.temperature == 35
        assert g.persistence_mode is True
        assert g.ecc_volatile_uncorrected == g.ecc_aggregate_uncorrected == 0
        assert g.remapped_rows_correctable == g.remapped_rows_uncorrectable == 0
        assert not g.remap_pending and not g.remap_failure
        assert g.recovery_action == 0
        assert not g.lost and g.hang_ms == 0


def test_uuids_are_derived_from_node_name_and_index():
    a1 = st.default_state("node-a", 4)
    a2 = st.default_state("node-a", 4)
    b = st.default_state("node-b", 4)
    assert [g.uuid for g in a1.gpus] == [g.uuid for g in a2.gpus]
    assert not {g.uuid for g in a1.gpus} & {g.uuid for g in b.gpus}


def test_default_state_rejects_absurd_gpu_counts():
    with pytest.raises(ValueError):
        st.default_state("n", 65)
    assert len(st.default_state("n", 12).gpus) == 12
    assert len({g.pci_bus_id for g in st.default_state("n", 12).gpus}) == 12


# --------------------------------------------------------------------------- round trip


def test_state_round_trip(tmp_path: Path):
    s = st.default_state("node9", 3)
    s.driver_loaded = False
    s.init_hang_ms = 250
    s.driver_version = "535.161.08"
    g = s.gpus[1]
    g.lost = True
    g.hang_ms = 1500
    g.nvlink_down = [0, 7, 17]
    g.clocks_event_reasons = 0x68
    g.unsupported = ["recovery_action", "serial"]
    g.arch = "volta"
    g.ecc_aggregate_uncorrected = 12345678901
    g.name = "Tesla V100-SXM2-32GB"
    path = tmp_path / "s"
    st.write_state(path, s)
    assert st.read_state(path) == s
    text = path.read_text()
    assert "gpu.1.nvlink_down=0,7,17\n" in text
    assert "gpu.1.clocks_event_reasons=0x68\n" in text
    assert "gpu.1.lost=1\n" in text
    assert "driver_loaded=0\n" in text
    assert "gpu_count=3\n" in text


def test_write_state_is_atomic_and_leaves_no_temp_files(tmp_path: Path):
    path = tmp_path / "s"
    st.write_state(path, st.default_state("n", 2))
    inode = path.stat().st_ino
    good = path.read_text()
    bad = st.default_state("n", 2)
    bad.gpus[0].name = "evil\ngpu_count=0"
    with pytest.raises(ValueError):
        st.write_state(path, bad)
    assert path.read_text() == good
    st.write_state(path, st.default_state("n", 3))
    assert path.stat().st_ino != inode  # replaced, not rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_parse_ignores_unknown_keys_and_defaults_missing_ones():
    text = (
        "# hand-written\n"
        "gpu_count=2\n"
        "node_name = lab1\n"
        "some_future_key=7\n"
        "gpu.1.lost=1\n"
        "gpu.1.temperature=0x50\n"
        "gpu.1.future_field=3\n"
        "gpu.9.lost=1\n"
        "garbage line\n"
    )
    s = st.parse_state(text)
    assert s.node_name == "lab1"
    assert len(s.gpus) == 2
    assert s.gpus[0] == st.GpuState(index=0)
    assert s.gpus[1].lost is True
    assert s.gpus[1].temperature == 80


def test_update_state_context_manager(node: Path):
    with st.update_state(node) as s:
        s.gpus[4].temperature = 71
    assert st.read_state(node).gpus[4].temperature == 71


# --------------------------------------------------------------------------- inject


def _gpu(path: Path, i: int) -> st.GpuState:
    return st.read_state(path).gpus[i]


def test_inject_xid_queues_an_event_only(node: Path):
    before = st.read_state(node)
    assert st.inject(node, 2, "xid", xid=13) == 13
    assert st.read_state(node) == before
    evs = st.read_events(node)
    assert [(e.gpu, e.xid, e.event_type) for e in evs] == [(2, 13, st.EVENT_XID)]


def test_inject_xid_79_marks_the_gpu_lost(node: Path):
    assert st.inject(node, 1, "xid", xid=79) == 79
    assert _gpu(node, 1).lost is True
    assert _gpu(node, 0).lost is False
    assert [(e.gpu, e.xid) for e in st.read_events(node)] == [(1, 79)]


def test_inject_ecc_dbe_on_hopper(node: Path):
    assert st.inject(node, 3, "ecc-dbe") == 48
    g = _gpu(node, 3)
    assert g.ecc_volatile_uncorrected == 1 and g.ecc_aggregate_uncorrected == 1
    assert g.remapped_rows_uncorrectable == 1 and g.remap_pending is True
    assert g.retired_pages_dbe == 0
    assert g.recovery_action == st.RECOVERY_GPU_RESET
    evs = st.read_events(node)
    assert [(e.gpu, e.xid, e.event_type) for e in evs] == [
        (3, 48, st.EVENT_XID),
        (3, 0, st.EVENT_DOUBLE_BIT_ECC),
    ]
    st.inject(node, 3, "ecc-dbe")
    assert _gpu(node, 3).ecc_volatile_uncorrected == 2


def test_inject_ecc_dbe_before_ampere_retires_pages(node: Path):
    with st.update_state(node) as s:
        s.gpus[0].arch = "volta"
    st.inject(node, 0, "ecc-dbe")
    g = _gpu(node, 0)
    assert g.retired_pages_dbe == 1 and g.retired_pages_pending is True
    assert g.remapped_rows_uncorrectable == 0 and not g.remap_pending


def test_inject_remap_kinds(node: Path):
    assert st.inject(node, 0, "remap-pending") == 63
    assert st.inject(node, 1, "remap-failure") == 64
    g0, g1 = _gpu(node, 0), _gpu(node, 1)
    assert g0.remap_pending and not g0.remap_failure and g0.remapped_rows_uncorrectable == 1
    assert g1.remap_failure and not g1.remap_pending
    assert [(e.gpu, e.xid) for e in st.read_events(node)] == [(0, 63), (1, 64)]


def test_inject_thermal_lost_pcie_nvlink_hang(node: Path):
    assert st.inject(node, 0, "thermal") is None
    g = _gpu(node, 0)
    assert g.temperature >= 90
    assert g.clocks_event_reasons & st.CLOCKS_HW_SLOWDOWN
    assert g.clocks_event_reasons & st.CLOCKS_HW_THERMAL
    assert not g.clocks_event_reasons & st.CLOCKS_GPU_IDLE

    assert st.inject(node, 1, "lost") is None
    assert _gpu(node, 1).lost

    st.inject(node, 2, "pcie-degraded")
    g = _gpu(node, 2)
    assert (g.pcie_curr_gen, g.pcie_curr_width) == (5, 8)
    assert (g.pcie_max_gen, g.pcie_max_width) == (5, 16)

    assert st.inject(node, 3, "nvlink-down") == 74
    assert st.inject(node, 3, "nvlink-down", link=11) == 74
    assert _gpu(node, 3).nvlink_down == [0, 11]
    with pytest.raises(ValueError):
        st.inject(node, 3, "nvlink-down", link=18)

    st.inject(node, 4, "hang")
    assert _gpu(node, 4).hang_ms == st.DEFAULT_HANG_MS
    st.inject(node, 5, "hang", hang_ms=750)
    assert _gpu(node, 5).hang_ms == 750
    # no events for thermal/lost/pcie/hang
    assert [(e.gpu, e.xid) for e in st.read_events(node)] == [(3, 74), (3, 74)]


def test_inject_clear_restores_health_and_keeps_identity(node: Path):
    healthy = _gpu(node, 6)
    for kind in ("ecc-dbe", "remap-failure", "thermal", "lost", "pcie-degraded", "nvlink-down"):
        st.inject(node, 6, kind)
    st.inject(node, 6, "hang", hang_ms=10)
    assert _gpu(node, 6) != healthy
    assert st.inject(node, 6, "clear") is None
    assert _gpu(node, 6) == healthy
    # events are history: clear does not remove them
    assert [e.xid for e in st.read_events(node)] == [48, 0, 64, 74]


def test_inject_rejects_bad_arguments(node: Path):
    with pytest.raises(ValueError, match="unknown inject kind"):
        st.inject(node, 0, "melt")
    with pytest.raises(ValueError, match="needs an xid"):
        st.inject(node, 0, "xid")
    with pytest.raises(ValueError, match="out of range"):
        st.inject(node, 8, "lost")
    assert st.read_events(node) == []


def test_event_sequence_numbers_increase(node: Path):
    for i in range(20):
        st.append_event(node, i % 8, 13)
    seqs = [e.seq for e in st.read_events(node)]
    assert len(seqs) == 20
    assert all(b > a for a, b in zip(seqs, seqs[1:]))


def test_read_events_ignores_a_partial_trailing_line(node: Path):
    st.append_event(node, 0, 31)
    with open(st.events_path(node), "a") as f:
        f.write("99999999999999999999 1 4")  # writer mid-line
    assert [(e.gpu, e.xid) for e in st.read_events(node)] == [(0, 31)]


# --------------------------------------------------------------------------- kernel log


def test_kernel_log_line_exact_79():
    assert st.kernel_log_line("0000:3b:00.0", 79) == (
        "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    )


@pytest.mark.parametrize("xid", sorted(set(st.XID_MESSAGES) | {13, 31, 43, 48, 63, 64, 74, 79, 94, 95, 119, 12345}))
@pytest.mark.parametrize("pci", ["0000:3b:00.0", "00000000:3B:00.0", "3b:00.0"])
def test_kernel_log_line_matches_the_scanner_regex(xid: int, pci: str):
    line = st.kernel_log_line(pci, xid)
    m = FACTS_XID_RE.search(line)
    assert m is not None, line
    assert m.group(1) == "PCI:0000:3b:00"
    assert int(m.group(2)) == xid
    assert st.XID_LINE_RE.search(line).groups() == m.groups()


def test_kernel_log_line_messages_and_pid_form():
    assert "double bit error (DBE)" in st.kernel_log_line("0000:1b:00.0", 48)
    assert "Row Remapper: New row" in st.kernel_log_line("0000:1b:00.0", 63)
    assert "Row Remapper Error" in st.kernel_log_line("0000:1b:00.0", 64)
    assert "NVLink: fatal error detected on link 5(" in st.kernel_log_line("0000:1b:00.0", 74, link=5)
    assert "Contained:" in st.kernel_log_line("0000:1b:00.0", 94)
    assert "Uncontained:" in st.kernel_log_line("0000:1b:00.0", 95)
    line = st.kernel_log_line("0000:9b:00.0", 119, pid=2024380, name="nvidia-smi", gpu=4)
    assert line.startswith("NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s")
    assert "GPU4 GSP" in line
    assert st.kernel_log_line("0000:1b:00.0", 43, message="Ch 00000010").endswith(", Ch 00000010")
    with pytest.raises(ValueError):
        st.kernel_log_line("not-a-bus-id", 79)


def test_fallen_off_bus_line():
    assert st.fallen_off_bus_line("00000000:DB:00.0") == "NVRM: GPU 0000:db:00.0: GPU has fallen off the bus."


def test_kmsg_prefix_and_record():
    assert st.kmsg_prefix(17, 123456) == "4,17,123456,-;"
    assert st.kmsg_prefix(1, 2, priority=st.KERN_ERR) == "3,1,2,-;"
    assert st.kmsg_prefix(1, 2, priority=6, facility=3) == "30,1,2,-;"
    rec = st.kmsg_record("a\\b\tc", 5, 99)
    assert rec == "4,5,99,-;a\\x5cb\\x09c\n"
    # usec defaults to the monotonic clock (how the lab CLI calls it)
    m = re.fullmatch(r"4,6,(\d+),-;NVRM: x\n", st.kmsg_record("NVRM: x", seq=6))
    assert m is not None and int(m.group(1)) > 0


def test_append_kmsg_continues_sequence(tmp_path: Path):
    log = tmp_path / "kmsg"
    r0 = st.append_kmsg(log, st.kernel_log_line("0000:3b:00.0", 79))
    r1 = st.append_kmsg(log, "NVRM: something else", priority=st.KERN_INFO)
    lines = log.read_text().splitlines()
    assert lines == [r0.rstrip("\n"), r1.rstrip("\n")]
    head0, _, body0 = lines[0].partition(";")
    prio, seq0, usec0, flags = head0.split(",")
    assert (prio, seq0, flags) == ("4", "0", "-")
    assert FACTS_XID_RE.search(body0).groups() == ("PCI:0000:3b:00", "79")
    prio1, seq1, usec1, _ = lines[1].partition(";")[0].split(",")
    assert (prio1, seq1) == ("6", "1")
    assert int(usec1) >= int(usec0)


# --------------------------------------------------------------------------- package helpers


def test_state_env_name():
    assert fakenvml.STATE_ENV == "AUTOHEAL_FAKE_NVML_STATE"


def test_find_nvml_header_error_names_the_pip_package(monkeypatch):
    monkeypatch.setattr(fakenvml, "_nvidia_dirs", list)
    monkeypatch.setattr(fakenvml, "_header_from_distribution", lambda: None)
    with pytest.raises(fakenvml.FakeNvmlBuildError, match="nvidia-nvml-dev"):
        fakenvml.find_nvml_header()


def test_find_nvml_header_searches_candidate_layouts(monkeypatch, tmp_path: Path):
    header = tmp_path / "cuda_nvml_dev" / "include" / "nvml.h"
    header.parent.mkdir(parents=True)
    header.write_text("/* nvml */\n")
    monkeypatch.setattr(fakenvml, "_nvidia_dirs", lambda: [tmp_path])
    assert fakenvml.find_nvml_header() == header


def test_state_module_is_stdlib_only():
    import ast
    import sys

    if not hasattr(sys, "stdlib_module_names"):  # Python < 3.10
        pytest.skip("sys.stdlib_module_names needs Python 3.10+")
    tree = ast.parse(Path(st.__file__).read_text())
    top = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            top |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            top.add(node.module.split(".")[0])
    assert top <= set(sys.stdlib_module_names) | {"__future__"}, top


def test_gpu_state_fields_are_all_serialised(tmp_path: Path):
    names = {f.name for f in dataclasses.fields(st.GpuState)} - {"index"}
    path = tmp_path / "s"
    st.write_state(path, st.default_state("n", 1))
    keys = {line.split("=", 1)[0] for line in path.read_text().splitlines() if line.startswith("gpu.0.")}
    assert keys == {f"gpu.0.{n}" for n in names}
    assert os.stat(path).st_mode & 0o777 == 0o644


def test_inject_recovery_action_sets_the_field_and_raises_xid_154(node: Path):
    """The lab's XID 154: NVML's recovery action (served by the fake library as field 230,
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) changes, and the driver's XID 154 is queued."""
    assert st.inject(node, 2, "recovery-action", action=st.RECOVERY_NODE_REBOOT) == 154
    assert _gpu(node, 2).recovery_action == 2 and _gpu(node, 1).recovery_action == 0
    assert [(e.gpu, e.xid, e.event_type) for e in st.read_events(node)] == [(2, 154, st.EVENT_XID)]
    assert st.inject(node, 2, "recovery-action", action=st.RECOVERY_NONE) == 154  # back to NONE: told too
    assert _gpu(node, 2).recovery_action == 0
    st.inject(node, 2, "recovery-action", action=st.RECOVERY_DRAIN_P2P)
    st.inject(node, 2, "clear")  # a reset in the lab
    assert _gpu(node, 2).recovery_action == st.RECOVERY_NONE
    with pytest.raises(ValueError, match="needs an action"):
        st.inject(node, 2, "recovery-action")
    assert st.recovery_message(0, 1) == "GPU recovery action changed from 0x0 (None) to 0x1 (Reset Required)"
    assert st.recovery_message(3, 0).endswith("from 0x3 (Drain P2P Required) to 0x0 (None)")
