"""XIDs: parsing NVIDIA's kernel-log lines, reading the kernel log, and the per-XID policy table.

Pure parsing and policy here; the only I/O is :func:`read_kernel_log`, which reads new records from
``/dev/kmsg`` (non-blocking, one record per read) or from a file (from a remembered offset).
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

# The default policy is NVIDIA's Xid catalog through one rule per resolution bucket
# (autoheal.hooks.xid_catalog, read on first use); hooks.xid_policy overrides it per XID.
# reset/reboot/replace drain the node and name the first rung of the recovery ladder; human drains for a
# person; job/requeue are the application's (never a drain).

XID_TEXT: Dict[int, str] = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup", 48: "double-bit ECC error", 61: "microcontroller breakpoint",
    62: "microcontroller halt", 63: "row remap recorded", 64: "row remap failure", 68: "NVDEC exception",
    69: "graphics class error", 74: "NVLink error", 79: "fallen off the bus", 92: "high single-bit ECC rate",
    94: "contained ECC error", 95: "uncontained ECC error", 109: "context-switch timeout",
    119: "GSP RPC timeout", 120: "GSP error", 121: "C2C error", 140: "unrecovered ECC error",
    143: "GPU init failure", 154: "recovery action changed",
}
for _x in range(144, 151):
    XID_TEXT[_x] = "NVLink5 error"

# NVIDIA's real formats: "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., ..." and older "NVRM: Xid (0000:03:00): 14, ..."
XID_RE = re.compile(r"NVRM: Xid \(((?:PCI:)?[0-9a-fA-F:.]+)\).*?: (\d+),")
# "fallen off the bus" without an Xid line: "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
OFF_BUS_RE = re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?)"
                        r".*fallen off the bus", re.IGNORECASE)
# /dev/kmsg record: "<prio>,<seq>,<usec>,<flags>[,...];message"
KMSG_RE = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")


@dataclass(frozen=True)
class XidEvent:
    """One XID seen on this node."""

    xid: int
    pci: str = ""  # normalised "0000:3b:00" (domain:bus:device), "" when unknown
    gpu: Optional[int] = None  # NVML index when known
    source: str = "kmsg"  # kmsg | file | nvml
    seq: Optional[int] = None  # kmsg sequence number
    usec: Optional[int] = None  # kmsg timestamp (µs since boot)
    line: str = ""


def normalize_pci(text: str) -> str:
    """``PCI:0000:3b:00``, ``00000000:3B:00.0``, ``0000:3b:00.0``, ``03:00`` -> ``0000:3b:00``."""
    t = text.strip().lower()
    if t.startswith("pci:"):
        t = t[4:]
    t = t.split(".")[0]
    parts = t.split(":")
    if len(parts) == 2:
        parts = ["0"] + parts
    if len(parts) != 3:
        return t
    try:
        dom, bus, dev = (int(p, 16) for p in parts)
    except ValueError:
        return t
    return f"{dom:04x}:{bus:02x}:{dev:02x}"


def parse_line(line: str, source: str = "kmsg") -> Optional[XidEvent]:
    """An XidEvent from one kernel-log line (kmsg record or plain), or None (malformed lines too)."""
    if not line or "NVRM" not in line:
        return None
    seq = usec = None
    m = KMSG_RE.match(line)
    msg = line
    if m:
        try:
            seq, usec = int(m.group(2)), int(m.group(3))
        except ValueError:
            return None
        msg = m.group(4)
    x = XID_RE.search(msg)
    if x:
        try:
            xid = int(x.group(2))
        except ValueError:
            return None
        if xid <= 0 or xid > 100000:
            return None
        return XidEvent(xid=xid, pci=normalize_pci(x.group(1)), source=source, seq=seq, usec=usec,
                        line=msg.strip()[:300])
    b = OFF_BUS_RE.search(msg)
    if b:
        return XidEvent(xid=79, pci=normalize_pci(b.group(1)), source=source, seq=seq, usec=usec,
                        line=msg.strip()[:300])
    return None


def policy_for(xid: int, overrides: Optional[Dict[str, str]] = None) -> str:
    """The policy of one XID: config override, else NVIDIA's catalog by its bucket rule (an XID the
    catalog does not know: ``xid_catalog.FALLBACK``)."""
    if overrides and str(xid) in overrides:
        return overrides[str(xid)]
    from autoheal.hooks.xid_catalog import default_policy

    return default_policy(xid)


def describe(xid: int) -> str:
    """Short text for reasons: ours where earlier releases wrote one (reasons keep their bytes), else
    the catalog's description."""
    if xid in XID_TEXT:
        return XID_TEXT[xid]
    from autoheal.hooks.xid_catalog import entry

    e = entry(xid)
    if e is None or not e.description or e.description.lower() == "unused":
        return "unknown xid" if e is None else e.mnemonic.lower().replace("_", " ")[:60]
    return e.description[:60].rstrip(" .").lower()


# ---- reading the kernel log ------------------------------------------------------------------------

@dataclass
class LogCursor:
    """Where the last read stopped: kmsg sequence per boot, or a file's inode and offset."""

    boot_id: str = ""
    max_seq: int = -1
    inode: int = 0
    offset: int = 0

    def to_dict(self) -> Dict[str, Any]:
        return {"boot_id": self.boot_id, "max_seq": self.max_seq, "inode": self.inode, "offset": self.offset}

    @classmethod
    def from_dict(cls, d: Optional[Dict[str, Any]]) -> LogCursor:
        d = d or {}
        return cls(str(d.get("boot_id", "")), int(d.get("max_seq", -1)), int(d.get("inode", 0)),
                   int(d.get("offset", 0)))


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def read_kernel_log(path: str, cursor: LogCursor, max_bytes: int = 16 << 20) -> Tuple[List[XidEvent], LogCursor]:
    """New XID events since ``cursor`` and the advanced cursor. Records already seen (kmsg sequence
    at or below the cursor in the same boot) are dropped, so replays after restarts are not acted on
    twice. Unreadable sources give no events (the caller reports them)."""
    bid = boot_id()
    cur = LogCursor(**cursor.to_dict())
    if cur.boot_id != bid:  # new boot: sequence numbers restart
        cur = LogCursor(boot_id=bid)
    if path == "/dev/kmsg":
        lines = _read_kmsg_device(path)
        source = "kmsg"
    else:
        lines, cur = _read_file(path, cur, max_bytes)
        source = "file"
    out: List[XidEvent] = []
    for line in lines:
        m = KMSG_RE.match(line)
        if m:
            try:
                seq = int(m.group(2))
            except ValueError:
                continue
            if seq <= cur.max_seq:
                continue
            cur.max_seq = seq
        ev = parse_line(line, source)
        if ev is not None:
            out.append(ev)
    return out, cur


def _read_kmsg_device(path: str) -> List[str]:
    lines: List[str] = []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return lines
    try:
        while True:
            try:
                data = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while reading: continue with the next record
                    continue
                break  # EAGAIN: end of the buffer
            if not data:
                break
            lines.append(data.decode("utf-8", "replace").split("\n", 1)[0])
    finally:
        os.close(fd)
    return lines


def _read_file(path: str, cur: LogCursor, max_bytes: int) -> Tuple[List[str], LogCursor]:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return [], cur
    try:
        st = os.fstat(fd)
        if st.st_ino != cur.inode or st.st_size < cur.offset:  # rotated or truncated: start over
            cur.inode, cur.offset = st.st_ino, 0
        if st.st_size == cur.offset:
            return [], cur
        start = max(cur.offset, st.st_size - max_bytes)
        data = os.pread(fd, st.st_size - start, start)
    finally:
        os.close(fd)
    end = data.rfind(b"\n")
    if end < 0:  # no complete line yet
        return [], cur
    cur.offset = start + end + 1
    return data[:end].decode("utf-8", "replace").splitlines(), cur
