"""The lab's fake GPUs: build the fake libnvidia-ml, write each node's GPU state, inject faults."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional

from autoheal_lab.cluster import Lab, LabError

INJECT_KINDS = ("xid", "ecc-dbe", "remap-failure", "remap-pending", "thermal", "lost", "pcie-degraded",
                "nvlink-down", "hang", "recovery-action", "clear")


def setup_gpus(lab: Lab) -> Optional[str]:
    """Build the fake NVML into the lab and write healthy state for every node. Returns the lib dir."""
    from autoheal_lab import fakenvml
    from autoheal_lab.fakenvml import state as gstate

    lay = lab.layout()
    lib_dir = lab.root / "lib"
    try:
        fakenvml.build_library(lib_dir)
    except Exception as exc:  # gcc or header missing: the lab still runs Slurm, say why GPUs are absent
        raise LabError(f"cannot build the fake NVML library: {exc}") from None
    for node in lay.all_nodes:
        path = lay.gpu_state(node)
        if not path.exists():
            gstate.write_state(path, gstate.default_state(node, lay.gpus))
    with lab.edit_state() as st:
        st["nvml_lib_dir"] = str(lib_dir)
    return str(lib_dir)


def _kmsg_seq(path: Path) -> int:
    try:
        return sum(1 for _ in open(path, "rb"))
    except OSError:
        return 0


def xid_message(xid: int) -> Optional[str]:
    """The text after ``pid=..., name=...,`` of a driver line: the fake driver's own, else the catalog's
    description (so any catalog XID can be raised with a plausible line), else the driver's default."""
    from autoheal.hooks.xid_catalog import entry
    from autoheal_lab.fakenvml.state import XID_MESSAGES

    if int(xid) in XID_MESSAGES:
        return None
    e = entry(int(xid))
    return e.description if e is not None and e.description and e.description != "Unused" else None


def inject(lab: Lab, node: str, gpu: int, kind: str, xid: Optional[int] = None, pid: Optional[int] = None,
           name: Optional[str] = None, action: Optional[int] = None) -> dict:
    """Break (or heal, ``clear``) one fake GPU: NVML state, an NVML XID event, a kernel-log line.
    ``pid``/``name``: the process the driver names in the line (an application XID's job is found from
    it); default: the driver's ``<unknown>``. ``action``: NVML's recovery action of ``recovery-action``
    (XID 154, its line naming the old and new action)."""
    from autoheal_lab.fakenvml import state as gstate

    lay = lab.layout()
    if node not in lay.all_nodes:
        raise LabError(f"no node {node!r} in this lab (nodes: {', '.join(lay.all_nodes)})")
    if not 0 <= gpu < lay.gpus:
        raise LabError(f"--gpu {gpu}: the lab's nodes have GPUs 0..{lay.gpus - 1}")
    if kind not in INJECT_KINDS:
        raise LabError(f"unknown fault {kind!r}; use one of {', '.join(INJECT_KINDS)}")
    path = lay.gpu_state(node)
    before = gstate.read_state(path)
    try:
        logged_xid = gstate.inject(path, gpu, kind, xid=xid, action=action)
    except ValueError as exc:
        raise LabError(str(exc)) from None
    result = {"node": node, "gpu": gpu, "kind": kind, "xid": logged_xid, "time": time.time(), "kernel_log": None}
    if logged_xid is not None:
        # The driver logs the XID on the node's kernel log too (what `dmesg` shows on a real node).
        message = (gstate.recovery_message(before.gpus[gpu].recovery_action, int(action))
                   if kind == "recovery-action" and action is not None else xid_message(logged_xid))
        line = gstate.kernel_log_line(before.gpus[gpu].pci_bus_id, logged_xid, pid=pid, name=name,
                                      message=message)
        kpath = lay.kernel_log(node)
        record = gstate.kmsg_record(line, seq=_kmsg_seq(kpath) + 1)
        with open(kpath, "a", encoding="utf-8") as fh:
            fh.write(record.rstrip("\n") + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        result["kernel_log"] = record.rstrip("\n")
    return result


def clear_all(lab: Lab, node: str) -> dict:
    """Heal every fake GPU of ``node`` (``lab inject --clear`` without ``--gpu``)."""
    lay = lab.layout()
    if node not in lay.all_nodes:
        raise LabError(f"no node {node!r} in this lab (nodes: {', '.join(lay.all_nodes)})")
    gpus = list(range(lay.gpus))
    for gpu in gpus:
        inject(lab, node, gpu, "clear")
    return {"node": node, "gpus": gpus, "kind": "clear", "time": time.time(), "kernel_log": None}
