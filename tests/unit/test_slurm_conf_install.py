"""doctor's installation checks against temporary files (read-only by design)."""

from __future__ import annotations

import os
import threading

from autoheal.slurm_conf import install_checks as ic


def test_hooks_missing_not_executable_ok(tmp_path):
    good = tmp_path / "hc.sh"
    good.write_text("#!/bin/sh\n")
    good.chmod(0o755)
    noexec = tmp_path / "prolog.sh"
    noexec.write_text("#!/bin/sh\n")
    noexec.chmod(0o644)
    conf = {"HealthCheckProgram": str(good), "Prolog": str(noexec), "Epilog": str(tmp_path / "gone.sh")}
    found = {f.id: f for f in ic.check_hooks(conf)}
    assert found["hook_healthcheckprogram"].status == "ok"
    assert found["hook_prolog"].status == "fail" and "not executable" in found["hook_prolog"].effect
    assert found["hook_epilog"].status == "fail" and "missing" in found["hook_epilog"].effect
    assert ic.check_hooks({"Prolog": "(null)"}) == []
    assert ic.check_hooks({"Prolog": "relative.sh"})[0].status == "fail"


def test_hook_globs(tmp_path):
    d = tmp_path / "prolog.d"
    d.mkdir()
    (d / "10-autoheal").write_text("#!/bin/sh\n")
    (d / "10-autoheal").chmod(0o755)
    assert ic.check_hooks({"Prolog": f"{d}/*"})[0].status == "ok"
    assert ic.check_hooks({"Prolog": f"{tmp_path}/none.d/*"})[0].status == "fail"


def test_journal_checked_without_writing(tmp_path):
    j = tmp_path / "journal.jsonl"
    j.write_text("x\n")
    before = (j.read_bytes(), j.stat().st_mtime_ns)
    assert ic.check_journal(str(j)).status == "ok"
    assert (j.read_bytes(), j.stat().st_mtime_ns) == before
    assert ic.check_journal(str(tmp_path / "sub" / "new.jsonl")).status == "ok"
    assert not (tmp_path / "sub").exists()
    if os.geteuid() != 0:  # root can write anywhere
        j.chmod(0o444)
        assert ic.check_journal(str(j)).status == "fail"


def test_xid_watch_scan(tmp_path):
    proc = tmp_path / "proc"
    (proc / "123").mkdir(parents=True)
    (proc / "123" / "cmdline").write_bytes(b"/usr/bin/python3\0-m\0autoheal.cli.main\0xid-watch\0--node\0g1\0")
    (proc / "124").mkdir()
    (proc / "124" / "cmdline").write_bytes(b"vim\0notes-xid-watch.txt\0")
    (proc / "self").mkdir()
    assert ic.xid_watch_pids(str(proc)) == [123]
    assert ic.check_xid_watch(str(proc)).status == "ok"
    (proc / "123" / "cmdline").unlink()
    assert ic.check_xid_watch(str(proc)).status == "warn"


def test_nvml_skip_error_count_and_hang():
    assert ic.check_nvml(0).status == "skip"
    assert ic.check_nvml(8, probe=lambda: 8).status == "ok"
    assert ic.check_nvml(8, probe=lambda: 7).status == "warn"

    def broken():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    f = ic.check_nvml(8, probe=broken)
    assert f.status == "fail" and "libnvidia-ml" in f.current
    release = threading.Event()
    f = ic.check_nvml(8, timeout=0.2, probe=lambda: release.wait(5) and 8)
    release.set()
    assert f.status == "fail" and "no answer" in f.current


def test_config_check(tmp_path):
    good = tmp_path / "ok.toml"
    good.write_text("[journal]\npath = '/tmp/j.jsonl'\n")
    f, cfg = ic.check_config(str(good))
    assert f.status == "ok" and cfg is not None
    bad = tmp_path / "bad.toml"
    bad.write_text("[journal]\nnot_a_key = 1\n")
    f, cfg = ic.check_config(str(bad))
    assert f.status == "fail" and cfg is None and "not_a_key" in f.effect
