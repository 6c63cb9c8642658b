"""Issue 27: a node state without a kernel-log cursor never acts on history alone; a reboot still judges
every record of the new boot (hooks/xids.py read_kernel_log)."""

from __future__ import annotations

from autoheal.hooks import xids
from autoheal.hooks.xids import LogCursor, read_kernel_log
from autoheal_lab.fakenvml import state as gstate


def record(seq: int, xid: int = 79, pci: str = "0000:3b:00.0") -> str:
    return gstate.kmsg_record(gstate.kernel_log_line(pci, xid), seq=seq, usec=1000 + seq)


def test_no_cursor_on_a_file_with_an_old_xid_starts_at_the_end(tmp_path):
    log = tmp_path / "kmsg.log"
    log.write_text(record(1) + record(2, xid=48))  # XIDs of long ago, judged and repaired before the wipe
    events, cur = read_kernel_log(str(log), LogCursor())
    assert events == [] and cur.skipped == 2
    assert cur.offset == log.stat().st_size and cur.max_seq == 2
    with open(log, "a") as fh:  # a new XID after the restart is judged at once
        fh.write(record(3, xid=94))
    events, cur = read_kernel_log(str(log), LogCursor.from_dict(cur.to_dict()))
    assert [e.xid for e in events] == [94] and cur.skipped == 0


def test_no_cursor_on_kmsg_starts_at_the_end_and_a_reboot_judges_the_new_boot(monkeypatch):
    buffer = [record(1).rstrip("\n"), record(2, xid=48).rstrip("\n")]
    monkeypatch.setattr(xids, "_read_kmsg_device", lambda path: list(buffer))
    monkeypatch.setattr(xids, "boot_id", lambda: "boot-a")
    events, cur = read_kernel_log("/dev/kmsg", LogCursor())
    assert events == [] and cur.skipped == 2 and (cur.boot_id, cur.max_seq) == ("boot-a", 2)
    buffer.append(record(3, xid=94).rstrip("\n"))
    events, cur = read_kernel_log("/dev/kmsg", LogCursor.from_dict(cur.to_dict()))
    assert [e.xid for e in events] == [94]
    # a reboot, the state kept: this boot's records (sequence restarts at 0) are all new, all judged
    monkeypatch.setattr(xids, "boot_id", lambda: "boot-b")
    buffer[:] = [record(0, xid=79).rstrip("\n"), record(1, xid=48).rstrip("\n")]
    events, cur = read_kernel_log("/dev/kmsg", LogCursor.from_dict(cur.to_dict()))
    assert [e.xid for e in events] == [79, 48] and cur.skipped == 0 and cur.boot_id == "boot-b"


def test_unreadable_log_keeps_the_cursor_as_it_was(monkeypatch, tmp_path):
    monkeypatch.setattr(xids, "_read_kmsg_device", lambda path: None)
    events, cur = read_kernel_log("/dev/kmsg", LogCursor())
    # still no position: the first read that works starts at the end, not at the boot's first record
    assert events == [] and cur.fresh
    events, cur = read_kernel_log(str(tmp_path / "missing.log"), LogCursor())
    assert events == [] and cur.fresh


def test_a_reboot_does_not_start_a_file_log_over(monkeypatch, tmp_path):
    log = tmp_path / "kmsg.log"
    log.write_text("")
    monkeypatch.setattr(xids, "boot_id", lambda: "boot-a")
    _, cur = read_kernel_log(str(log), LogCursor())
    with open(log, "a") as fh:
        fh.write(record(5))
    events, cur = read_kernel_log(str(log), cur)
    assert [e.xid for e in events] == [79]
    # the file spans boots: after a reboot it goes on after what was read, with the new boot's sequence
    monkeypatch.setattr(xids, "boot_id", lambda: "boot-b")
    with open(log, "a") as fh:
        fh.write(record(0, xid=48))
    events, cur = read_kernel_log(str(log), LogCursor.from_dict(cur.to_dict()))
    assert [e.xid for e in events] == [48] and cur.boot_id == "boot-b"


def test_a_cursor_into_another_log_counts_as_none(tmp_path):
    old, new = tmp_path / "old.log", tmp_path / "new.log"
    old.write_text("")
    new.write_text(record(1))  # history in the log the site switched to
    _, cur = read_kernel_log(str(old), LogCursor())
    assert cur.to_dict()["path"] == str(old)
    events, cur = read_kernel_log(str(new), LogCursor.from_dict(cur.to_dict()))
    assert events == [] and cur.skipped == 1 and cur.path == str(new)
    # a cursor of an older release (no path) is taken as a position in the configured log
    legacy = {k: v for k, v in cur.to_dict().items() if k != "path"}
    with open(new, "a") as fh:
        fh.write(record(2, xid=48))
    events, _ = read_kernel_log(str(new), LogCursor.from_dict(legacy))
    assert [e.xid for e in events] == [48]
