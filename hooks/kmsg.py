"""Which kernel-log lines are the kernel's own: the envelope check in front of the XID parser.

Users can put text into kernel records: the kernel prints a crashing task's name and the file name of
the mapping it crashed in (``comm[pid]: segfault at 0 ... in <file name>[...]``), and root's
``/dev/kmsg`` writes and any user's ``logger`` reach the logs too. So a line counts only when its
envelope proves the kernel wrote it:

- a ``/dev/kmsg`` record, ``<pri>,<seq>,<usec>,<flags>[,<fields>];<message>``, of facility 0
  (``pri >> 3``). The kernel gives every record written from userspace (``/dev/kmsg`` is root-only for
  writing, and even then) a non-zero facility: LOG_USER unless the writer names another non-zero one, so
  facility 0 is a record printed by kernel code;
- nothing else: a syslog or ``dmesg`` text line carries no facility or one its sender chose (``logger -t
  kernel -p kern.err`` writes ``host kernel: ...`` exactly as the kernel's would appear), so it is never
  taken as the kernel's (docs/security.md, "Node side").

What the kernel prints in a facility-0 record may still start with user text (a task name, at most 15
bytes): the XID parser matches NVIDIA's whole format from the first byte (``autoheal.hooks.xids``).
"""

from __future__ import annotations

from autoheal.lazyre import LazyPattern
from autoheal.records import record

TYPE_CHECKING = False  # typing is for mypy only: not imported at run time (the hooks start fast)
if TYPE_CHECKING:
    from typing import Optional

#: ``<pri>,<seq>,<usec>,<flags>[,<more fields>];<message>`` (Documentation/ABI/testing/dev-kmsg).
KMSG_RE = LazyPattern(r"^(\d{1,10}),(\d{1,20}),(\d{1,20}),[^;]*;(.*)$")
#: The kernel's own facility.
KERNEL_FACILITY = 0


@record(frozen=True)
class KmsgRecord:
    """One ``/dev/kmsg`` record's header and message (the first line only: continuation lines that
    start with a space are the record's dictionary, never part of the message)."""

    facility: int
    level: int
    seq: int
    usec: int
    message: str

    @property
    def from_kernel(self) -> bool:
        return self.facility == KERNEL_FACILITY


def parse_record(line: str) -> Optional[KmsgRecord]:
    """The record of one ``/dev/kmsg``-format line, or None when the line is not one."""
    m = KMSG_RE.match(line)
    if not m:
        return None
    pri, seq, usec = int(m.group(1)), int(m.group(2)), int(m.group(3))
    return KmsgRecord(facility=pri >> 3, level=pri & 7, seq=seq, usec=usec, message=m.group(4))


def kernel_record(line: str) -> Optional[KmsgRecord]:
    """The record when ``line`` is a ``/dev/kmsg`` record the kernel itself printed (facility 0), else
    None (a user-facility record, a syslog or dmesg text line, garbage)."""
    rec = parse_record(line)
    return rec if rec is not None and rec.from_kernel else None
