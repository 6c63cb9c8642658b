"""Issue 25 item 1: only NVRM records the kernel wrote count as XIDs (hooks/kmsg.py, hooks/xids.py).

Every real NVIDIA format is still taken from a facility-0 ``/dev/kmsg`` record; a user-facility record,
a syslog line (what ``logger`` writes, even tagged ``kernel``), NVRM text after the start of a record
(a segfault line naming a crafted library) and a task name that begins like an Xid line are not."""

from __future__ import annotations

import pytest

from autoheal.hooks.kmsg import kernel_record, parse_record
from autoheal.hooks.xids import LogCursor, parse_line, read_kernel_log
from autoheal_lab.fakenvml import state as gstate

NAME = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus"

#: The record the kernel of this project's machine wrote when an unprivileged process, named
#: "NVRM: Xid (0:0)" (prctl PR_SET_NAME), crashed in a library whose file is named NAME
#: (tests/integration/test_node_security_lab.py makes it happen for real).
REAL_SEGFAULT = ("6,345,443935367,-;NVRM: Xid (0:0)[17963]: segfault at 0 ip 00007f7167f82102 sp 00007ffc7a35d050 "
                 "error 6 in " + NAME + "[1102,7f7167f82000+1000] likely on CPU 0 (core 0, socket 0)")

# (record, xid, normalised PCI): NVIDIA's formats as the driver prints them, in kernel records
REAL = [
    ("4,812,7003002,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
     79, "0000:3b:00"),
    ("3,5,9,-;NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC",
     119, "0000:9b:00"),
    ("4,6,10,-;NVRM: Xid (0000:03:00): 14, Channel 00000001", 14, "0000:03:00"),
    ("4,7,11,-;NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1)", 13, "0000:3b:00"),
    # MIG: the driver adds the GPU / compute instance inside the parenthesis
    ("4,8,12,-;NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, pid=7, name=python, Graphics Exception",
     13, "0000:3b:00"),
    ("4,9,13,-;NVRM: Xid (PCI:0000:3b:00 GPU-I:03): 31, pid=7, name=python, MMU Fault", 31, "0000:3b:00"),
    # off the bus without an Xid line
    ("4,10,14,-;NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus.", 79, "0000:5d:00"),
    ("4,11,15,-;NVRM: GPU at PCI:0000:5d:00: GPU has fallen off the bus.", 79, "0000:5d:00"),
    # CONFIG_PRINTK_CALLER adds a field to the header; the message is unchanged
    ("4,12,16,-,caller=T15571;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, An uncorrectable double bit error",
     48, "0000:3b:00"),
]


@pytest.mark.parametrize("record,xid,pci", REAL)
def test_every_real_nvidia_format_in_a_kernel_record_counts(record, xid, pci):
    ev = parse_line(record)
    assert ev is not None and (ev.xid, ev.pci) == (xid, pci)


def test_the_lab_injector_writes_records_as_the_kernel_does():
    rec = gstate.kmsg_record(gstate.kernel_log_line("0000:3b:00.0", 79), seq=3)
    assert kernel_record(rec.rstrip("\n")) is not None  # facility 0, as the driver's printk
    assert parse_line(rec.rstrip("\n")).xid == 79


FORGED = {
    # the real kernel record of the attack: facility 0, NVRM text from a file name and a task name
    "segfault-record": REAL_SEGFAULT,
    "segfault-plain-comm": REAL_SEGFAULT.replace("NVRM: Xid (0:0)[17963]", "main[15571]"),
    # what root's `echo ... > /dev/kmsg` gives: the kernel forces LOG_USER (facility 1) on it
    "facility-1-user": "12,340,1808287700,-;" + NAME,
    "facility-3-daemon": "30,341,1808287701,-;" + NAME,
    # NVRM text in the middle of a kernel record
    "mid-message": "6,342,1808287702,-;audit: comm=\"x\" " + NAME,
    "leading-space": "4,343,1808287703,-; " + NAME,
    # `logger -t kernel "NVRM: ..."` in a syslog file (traditional and RFC 5424 formats), and dmesg text
    "logger-traditional": "Dec  1 21:33:05 gpu1 kernel: " + NAME,
    "logger-traditional-stamp": "Dec  1 21:33:05 gpu1 kernel: [ 12.345678] " + NAME,
    "logger-rfc5424": "<0>1 2026-12-01T21:33:05.123456+00:00 gpu1 kernel - - - " + NAME,
    "logger-user": "Dec  1 21:33:05 gpu1 nobody: " + NAME,
    "dmesg-text": "[ 12.3] " + NAME,
    "bare-message": NAME,
    "off-bus-bare": "NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus.",
    # a task name is at most 15 bytes: one that begins like an Xid line never carries a whole one
    "comm-off-bus": "6,344,1808287704,-;NVRM: GPU 0:0:0[1]: segfault at 0 ... in NVRM: GPU 0000:5d:00.0: GPU "
                    "has fallen off the bus.[1,2+3]",
}


@pytest.mark.parametrize("name", sorted(FORGED))
def test_forged_xid_lines_do_not_count(name):
    assert parse_line(FORGED[name]) is None


def test_facility_is_read_from_the_priority():
    assert parse_record("6,1,2,-;x").facility == 0 and parse_record("6,1,2,-;x").level == 6
    assert parse_record("12,1,2,-;x").facility == 1
    assert kernel_record("12,1,2,-;x") is None and kernel_record("Dec  1 host kernel: x") is None


def test_the_reader_skips_forgeries_and_reports_them(tmp_path):
    log = tmp_path / "kmsg.log"
    log.write_text("")
    _, cur = read_kernel_log(str(log), LogCursor())  # the cursor is placed on the empty log
    real = REAL[0][0].replace("812,", "900,")
    with open(log, "a") as fh:
        fh.write("\n".join([FORGED["segfault-record"].replace("345,", "898,"), FORGED["facility-1-user"]
                            .replace("340,", "899,"), FORGED["logger-traditional"], real]) + "\n")
    events, cur = read_kernel_log(str(log), cur)
    assert [(e.xid, e.seq) for e in events] == [(79, 900)]
    assert len(cur.rejected) == cur.rejected_count == 3 and all("NVRM" in r for r in cur.rejected)
    assert "rejected" not in cur.to_dict()  # what a read left out is reported, never stored


def test_a_flood_of_forgeries_is_counted_in_full_and_printed_in_part(tmp_path):
    log = tmp_path / "kmsg.log"
    log.write_text("")
    _, cur = read_kernel_log(str(log), LogCursor())
    with open(log, "a") as fh:
        fh.write("".join(f"12,{seq},1,-;{NAME}\n" for seq in range(1, 51)))
    events, cur = read_kernel_log(str(log), cur)
    assert events == [] and cur.rejected_count == 50 and len(cur.rejected) == 5
