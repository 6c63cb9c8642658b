"""XIDs: parsing NVIDIA's kernel-log lines, reading the kernel log, and the per-XID policy table.

Pure parsing and policy here; the only I/O is :func:`read_kernel_log`, which reads new records from
``/dev/kmsg`` (non-blocking, one record per read) or from a file (from a remembered offset).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import field

from autoheal.hooks.kmsg import kernel_record, parse_record
from autoheal.lazyre import LazyPattern
from autoheal.records import record

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple, TypedDict

    class CursorDict(TypedDict, total=False):
        """``LogCursor.to_dict()``, as the node state keeps it (``kmsg``); for mypy only."""

        boot_id: str
        max_seq: int
        inode: int
        offset: int
        path: str

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

# NVIDIA's real formats, matched from the first byte of a kernel record's message (hooks/kmsg.py says
# which records are the kernel's). The driver prints (open-gpu-kernel-modules, kernel_rc.c)
#   "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., <message>"
#   "NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, ..."   (MIG: GPU / compute instance)
# and older drivers "NVRM: Xid (0000:03:00): 14, ...". Nothing may stand between the parenthesis and the
# XID number: a task named "NVRM: Xid (0:0)" that crashes in a file named "...: 79, ..." makes the kernel
# log "NVRM: Xid (0:0)[pid]: segfault ... in ...: 79, ..." (seen on this project's kernel), which a looser
# pattern read as XID 79.
_PCI = r"(?:[0-9a-fA-F]{1,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
XID_RE = LazyPattern(r"NVRM: Xid \(((?:PCI:)?" + _PCI + r")(?: GPU-I:\d{1,3})?(?: GPU-CI:\d{1,3})?\): (\d{1,6}),")
# "fallen off the bus" without an Xid line: "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
OFF_BUS_RE = LazyPattern(r"NVRM: GPU (?:at )?(?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?)"
                        r"[:\s].*fallen off the bus", re.IGNORECASE)


@record(frozen=True)
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
    """An XidEvent from one kernel-log line, or None. Only a ``/dev/kmsg`` record the kernel printed
    (facility 0) whose message *begins* with one of NVIDIA's formats counts; a user-facility record, a
    syslog or dmesg text line (``logger`` writes those), NVRM text later in a record (a segfault line
    naming a crafted file) and malformed lines give None (``autoheal.hooks.kmsg``)."""
    if not line or "NVRM" not in line:
        return None
    rec = kernel_record(line)
    if rec is None:
        return None
    return parse_kernel_message(rec.message, source, rec.seq, rec.usec)


def parse_kernel_message(msg: str, source: str = "kmsg", seq: Optional[int] = None,
                         usec: Optional[int] = None) -> Optional[XidEvent]:
    """An XidEvent from the message of a record already proven the kernel's (see ``parse_line``): the
    message must begin with NVIDIA's format, nothing before it."""
    x = XID_RE.match(msg)
    if x:
        xid = int(x.group(2))
        if xid <= 0 or xid > 100000:
            return None
        return XidEvent(xid=xid, pci=normalize_pci(x.group(1)), source=source, seq=seq, usec=usec,
                        line=msg.strip()[:300])
    b = OFF_BUS_RE.match(msg)
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

@record
class LogCursor:
    """Where the last read stopped: kmsg sequence per boot, or a file's inode and offset.

    ``skipped``, ``rejected`` and ``rejected_count`` are not stored: what the last read left out (see
    ``read_kernel_log``), for the caller to report."""

    boot_id: str = ""
    max_seq: int = -1
    inode: int = 0
    offset: int = 0
    path: str = ""  # the log it is a position in ("" in cursors of older releases: taken as the same log)
    skipped: int = field(default=0, compare=False)
    rejected: List[str] = field(default_factory=list, compare=False)
    rejected_count: int = field(default=0, compare=False)

    def to_dict(self) -> CursorDict:
        return {"boot_id": self.boot_id, "max_seq": self.max_seq, "inode": self.inode, "offset": self.offset,
                "path": self.path}

    @classmethod
    def from_dict(cls, d: Optional[CursorDict]) -> LogCursor:
        d = d or {}
        return cls(str(d.get("boot_id", "")), int(d.get("max_seq", -1)), int(d.get("inode", 0)),
                   int(d.get("offset", 0)), str(d.get("path", "")))

    @property
    def fresh(self) -> bool:
        """No position at all: a new install, or a node state that was wiped or lost."""
        return not self.boot_id and self.max_seq < 0 and not self.inode and not self.offset


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


#: At most this many rejected lines are handed back per read (for the caller's log line).
MAX_REJECTED = 5


def read_kernel_log(path: str, cursor: LogCursor, max_bytes: int = 16 << 20) -> Tuple[List[XidEvent], LogCursor]:
    """New XID events since ``cursor`` and the advanced cursor. Records already seen (kmsg sequence
    at or below the cursor in the same boot) are dropped, so replays after restarts are not acted on
    twice. Unreadable sources give no events and leave the cursor as it was (the caller reports them).

    A cursor of another boot (the node rebooted; the state survived): every record of this boot is new,
    none of them can have been judged, all are. No cursor at all (a new install, a node state wiped or
    lost without a reboot, or a cursor into another log after ``hooks.kernel_log`` changed): the records
    in the log may all have been judged and repaired already, and acting on history alone would drain the
    node again for them, so the read starts at the log's end, judges nothing of what is there (counted in
    ``skipped``) and leaves the GPUs' present health to the live NVML checks. Lines that look like an XID
    but are not the kernel's (``parse_line``) are counted in ``rejected_count``, the first few returned in
    ``rejected``."""
    bid = boot_id()
    # a cursor into another log (``hooks.kernel_log`` changed) says nothing about this one: none
    fresh = cursor.fresh or bool(cursor.path and cursor.path != path)
    cur = LogCursor(path=path) if fresh else LogCursor(**cursor.to_dict())
    cur.path = path
    if cur.boot_id != bid:
        # a reboot since the cursor: kmsg sequence numbers restart; a file goes on where it was (it spans
        # boots: starting it over would judge every earlier boot's XIDs again)
        cur = LogCursor(boot_id=bid, inode=cur.inode, offset=cur.offset, path=path)
    lines: Optional[List[str]]
    if path == "/dev/kmsg":
        lines = _read_kmsg_device(path)
        source = "kmsg"
    else:
        lines, cur = _read_file(path, cur, max_bytes)
        source = "file"
    if lines is None:
        return [], cursor
    out: List[XidEvent] = []
    for line in lines:
        rec = parse_record(line)
        if rec is not None:
            if rec.seq <= cur.max_seq:
                continue
            cur.max_seq = rec.seq
        if "NVRM" not in line:
            continue
        ev = parse_line(line, source)
        if ev is not None:
            out.append(ev)
        elif XID_RE.search(line) or OFF_BUS_RE.search(line):  # looks like an XID, but not the driver's record
            cur.rejected_count += 1
            if len(cur.rejected) < MAX_REJECTED:
                cur.rejected.append(line[:300])
    if fresh:
        cur.skipped, out = len(out), []
    return out, cur


def _read_kmsg_device(path: str) -> Optional[List[str]]:
    lines: List[str] = []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
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


def _read_file(path: str, cur: LogCursor, max_bytes: int) -> Tuple[Optional[List[str]], LogCursor]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None, cur
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device named as a log file: nothing to follow
            return None, cur
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
