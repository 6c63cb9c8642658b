"""The remediation journal: append, read, filters, durability and failure modes."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time

import pytest

from autoheal.errors import JournalError
from autoheal.journal import Journal, Record


def test_append_and_read_roundtrip(tmp_path):
    j = Journal(tmp_path / "sub" / "journal.jsonl", fsync=False)
    rec = j.append(Record(event="drain", node="gpu1", job_ids=["12"], check="xid", evidence={"xid": 79},
                          action="drain", outcome="drained", message="gpu 3\nfell off", severity="action"))
    assert rec.time > 0 and rec.host
    got = list(j.read())
    assert len(got) == 1
    r = got[0]
    assert (r.event, r.node, r.job_ids, r.evidence, r.outcome, r.severity) == (
        "drain", "gpu1", ["12"], {"xid": 79}, "drained", "action")
    assert r.message == "gpu 3 fell off"  # sanitised on write
    line = (tmp_path / "sub" / "journal.jsonl").read_text()
    assert line.endswith("\n") and line.count("\n") == 1
    assert json.loads(line)["event"] == "drain"


def test_bad_severity_becomes_info(tmp_path):
    j = Journal(tmp_path / "j.jsonl", fsync=False)
    j.append(Record(event="x", severity="critical"))
    assert next(j.read()).severity == "info"


def test_explicit_time_and_host_kept(tmp_path):
    j = Journal(tmp_path / "j.jsonl", fsync=False)
    j.append(Record(event="x", time=123.0, host="h1"))
    r = next(j.read())
    assert r.time == 123.0 and r.host == "h1"


def test_read_missing_file_is_empty(tmp_path):
    assert list(Journal(tmp_path / "none.jsonl").read()) == []


def test_filters(tmp_path):
    j = Journal(tmp_path / "j.jsonl", fsync=False)
    now = time.time()
    j.append(Record(event="detection", node="gpu1", time=now - 3600))
    j.append(Record(event="drain", node="gpu1", job_ids=["7", "8"], time=now - 60))
    j.append(Record(event="requeue", node="gpu2", job_ids=["8"], time=now - 30))
    j.append(Record(event="resume", node="gpu2", time=now))
    assert [r.event for r in j.read(node="gpu1")] == ["detection", "drain"]
    assert [r.event for r in j.read(job="8")] == ["drain", "requeue"]
    assert [r.event for r in j.read(job=7)] == ["drain"]
    assert [r.event for r in j.read(since=now - 120)] == ["drain", "requeue", "resume"]
    assert [r.event for r in j.read(events=["drain", "resume"])] == ["drain", "resume"]
    assert [r.event for r in j.read(node="gpu2", since=now - 45, events=["resume"])] == ["resume"]
    assert list(j.read(node="gpu9")) == []


def test_fsync_flag(tmp_path, monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    Journal(tmp_path / "a.jsonl", fsync=True).append(Record(event="x"))
    assert len(calls) == 1
    Journal(tmp_path / "b.jsonl", fsync=False).append(Record(event="x"))
    assert len(calls) == 1


def test_from_config(tmp_path):
    from autoheal.config import parse_config

    cfg = parse_config(f"[journal]\npath = '{tmp_path / 'x.jsonl'}'\nfsync = false\n")
    j = Journal.from_config(cfg)
    assert j.path == tmp_path / "x.jsonl" and j.fsync is False


def _torn(path):
    j = Journal(path, fsync=False)
    j.append(Record(event="a"))
    j.append(Record(event="b"))
    full = Record(event="c", time=1.0, host="h").to_json() + "\n"
    with open(path, "a") as fh:
        fh.write(full[: len(full) // 2])  # crash mid-write
    return j


def test_torn_last_line_skipped(tmp_path):
    j = _torn(tmp_path / "j.jsonl")
    assert [r.event for r in j.read()] == ["a", "b"]


def test_record_after_torn_line_is_kept(tmp_path):
    j = _torn(tmp_path / "j.jsonl")
    j.append(Record(event="d"))
    assert [r.event for r in j.read()] == ["a", "b", "d"]


def test_garbage_lines_and_unknown_keys(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text('not json\n\n{"event": "ok", "new_field": 1}\n\xff\n')
    assert [r.event for r in Journal(path).read()] == ["ok"]


def test_non_object_json_line_skipped(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text('null\n{"event": "ok"}\n')
    assert [r.event for r in Journal(path).read()] == ["ok"]


def _append_many(path: str, tag: str, n: int) -> None:
    j = Journal(path, fsync=False)
    for i in range(n):
        j.append(Record(event="detection", node=tag, message=f"{tag}-{i} " + "x" * 3000))


def _check_whole_lines(path, expected: int) -> None:
    raw = open(path, "rb").read()
    assert raw.endswith(b"\n")
    lines = raw.split(b"\n")[:-1]
    assert len(lines) == expected
    for ln in lines:
        json.loads(ln)  # every line is a whole record


def test_concurrent_threads_whole_lines(tmp_path):
    path = str(tmp_path / "j.jsonl")
    threads = [threading.Thread(target=_append_many, args=(path, f"t{i}", 40)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    _check_whole_lines(path, 8 * 40)
    assert {r.node for r in Journal(path).read()} == {f"t{i}" for i in range(8)}


def test_concurrent_processes_whole_lines(tmp_path):
    path = str(tmp_path / "j.jsonl")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(path, f"p{i}", 100)) for i in range(2)]
    for p in procs:
        p.start()
    _append_many(path, "parent", 100)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    _check_whole_lines(path, 300)


def test_unwritable_path_under_regular_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    j = Journal(blocker / "journal.jsonl")
    with pytest.raises(JournalError) as err:
        j.append(Record(event="x"))
    assert str(blocker / "journal.jsonl") in str(err.value)
    assert "cannot open for writing" in str(err.value)


def test_directory_where_file_should_be(tmp_path):
    (tmp_path / "journal.jsonl").mkdir()
    with pytest.raises(JournalError, match="cannot open for writing"):
        Journal(tmp_path / "journal.jsonl").append(Record(event="x"))
    with pytest.raises(JournalError, match="cannot read"):
        list(Journal(tmp_path / "journal.jsonl").read())


def test_record_not_strict_warns_and_returns_none(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = Journal(blocker / "journal.jsonl").record("drain", node="gpu1")
    assert out is None
    err = capsys.readouterr().err
    assert err.startswith("autoheal: warning: journal ")
    assert "cannot open for writing" in err


def test_record_strict_raises(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(JournalError):
        Journal(blocker / "journal.jsonl").record("drain", strict=True, node="gpu1")


def test_record_success_returns_record(tmp_path):
    j = Journal(tmp_path / "j.jsonl", fsync=False)
    rec = j.record("resume", node="gpu1", severity="action")
    assert isinstance(rec, Record) and rec.event == "resume"
    assert [r.node for r in j.read()] == ["gpu1"]
