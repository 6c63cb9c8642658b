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


# ---- issue 16, finding 12: lines with wrong field types are skipped and counted --------------------------

@pytest.mark.parametrize("data", [
    {"event": "drain", "time": "yesterday"}, {"event": "drain", "time": None}, {"event": "drain", "time": True},
    {"event": "drain", "time": float("nan")}, {"event": "drain", "job_ids": 7}, {"event": "drain", "job_ids": "7"},
    {"event": "drain", "job_ids": [True]}, {"event": "drain", "job_ids": [None]}, {"event": "drain", "node": 3},
    {"event": "drain", "message": {"x": 1}}, {"event": "drain", "evidence": []}, {"event": 79}, {"event": ""},
    {"node": "gpu1"}, [], "drain", None,
])
def test_from_dict_refuses_wrong_types(data):
    with pytest.raises(ValueError):
        Record.from_dict(data)


def test_from_dict_accepts_integer_job_ids_and_ignores_unknown_fields():
    rec = Record.from_dict({"event": "drain", "job_ids": [12, "13_4"], "time": 5, "future": {"x": 1}})
    assert rec.job_ids == ["12", "13_4"] and rec.time == 5.0


def _damaged(path):
    j = Journal(path, fsync=False)
    j.append(Record(event="drain", node="gpu1", job_ids=["7"], time=100.0))
    with open(path, "a") as fh:
        fh.write('{"event": "drain", "node": "gpu1", "time": "later"}\n')
        fh.write('{"event": "drain", "node": "gpu1", "job_ids": 7}\n')
        fh.write("\n   \n")  # blank lines are not counted
        fh.write("[" * 100000 + "\n")
    j.append(Record(event="resume", node="gpu1", job_ids=["7"], time=200.0))
    return j


def test_read_skips_wrong_types_with_every_filter(tmp_path):
    j = _damaged(tmp_path / "j.jsonl")
    assert [r.event for r in j.read()] == ["drain", "resume"]
    assert [r.event for r in j.read(job="7")] == ["drain", "resume"]
    assert [r.event for r in j.read(since=150.0)] == ["resume"]
    assert [r.event for r in j.read(node="gpu1", events=["drain"])] == ["drain"]


def test_read_all_counts_skipped_lines(tmp_path):
    res = _damaged(tmp_path / "j.jsonl").read_all(since=150.0)
    assert [r.event for r in res.records] == ["resume"]
    assert (res.skipped, res.first_skipped, res.readable) == (3, 2, 2)


def test_read_all_of_missing_journal(tmp_path):
    res = Journal(tmp_path / "none.jsonl").read_all()
    assert (res.records, res.skipped, res.first_skipped, res.readable) == ([], 0, 0, 0)


# ---- hostile files and writers ---------------------------------------------------------------------------

def _bounded(fn, fifo):
    """Run ``fn`` in a thread; if it blocks on the FIFO, unblock it and fail (never hang the suite)."""
    out = {}

    def target():
        try:
            out["value"] = fn()
        except JournalError as exc:
            out["error"] = str(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        os.write(fd, b"\n")
        os.close(fd)
        pytest.fail("blocked on a FIFO")
    return out


def test_fifo_journal_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "j.jsonl"
    os.mkfifo(fifo)
    j = Journal(fifo, fsync=False)
    assert "not a regular file" in _bounded(lambda: list(j.read()), fifo)["error"]
    assert "not a regular file" in _bounded(lambda: j.append(Record(event="x")), fifo)["error"]


def test_stuck_lock_holder_costs_the_lock_not_the_record(tmp_path, capsys):
    import fcntl

    path = tmp_path / "j.jsonl"
    j = Journal(path, fsync=False, lock_timeout=0.2)
    j.append(Record(event="first"))
    holder = os.open(j.lock_path(), os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # a writer SIGSTOPped mid-append
    try:
        j.append(Record(event="second"))  # waits 0.2 s, then writes without the lock
        assert j.record("third", node="gpu1") is not None
        err = capsys.readouterr().err
        assert "locked by another writer for 0.2s; record written without the lock" in err
    finally:
        os.close(holder)
    j.append(Record(event="fourth"))
    assert [r.event for r in j.read()] == ["first", "second", "third", "fourth"]


def test_unserialisable_evidence_keeps_the_record(tmp_path):
    loop: dict = {}
    loop["self"] = loop
    deep: list = []
    for _ in range(100000):
        deep = [deep]
    j = Journal(tmp_path / "j.jsonl", fsync=False)
    j.append(Record(event="drain", node="gpu1", job_ids=["7"], evidence=loop))
    j.append(Record(event="drain", node="gpu2", evidence={"deep": deep}))
    got = list(j.read())
    assert [(r.node, r.job_ids) for r in got] == [("gpu1", ["7"]), ("gpu2", [])]
    assert "unserialisable" in got[0].evidence and "unserialisable" in got[1].evidence


def test_unicode_and_surrogates_round_trip(tmp_path):
    j = Journal(tmp_path / "j.jsonl", fsync=False)
    j.append(Record(event="drain", node="gpü-\udc80", message="ÿ \u202e 😀"))
    r = next(j.read())
    assert r.node == "gpü-\udc80" and r.message == "ÿ 😀"  # bidi override removed by sanitize


def test_evidence_nested_past_what_we_write_is_skipped(tmp_path):
    path = tmp_path / "j.jsonl"
    deep = "[" * 500 + "]" * 500
    path.write_text('{"event": "drain", "evidence": {"x": %s}}\n{"event": "ok", "evidence": {"a": {"b": [1]}}}\n'
                    % deep)
    res = Journal(path).read_all()
    assert [r.event for r in res.records] == ["ok"] and res.skipped == 1


def test_what_we_write_we_read_back_whatever_the_caller_passed(tmp_path):
    j = Journal(tmp_path / "j.jsonl", fsync=False)
    j.append(Record(event="drain", node=5, job_ids=(12, "13"), time="now", evidence=["xid", 79], check=None))
    j.append(Record(event="", job_ids="99", time=float("inf"), evidence={(1, 2): "tuple key"}))
    res = j.read_all()
    assert res.skipped == 0
    a, b = res.records
    assert (a.node, a.job_ids, a.evidence, a.check) == ("5", ["12", "13"], {"value": ["xid", 79]}, "")
    assert isinstance(a.time, float) and a.time > 1e9
    assert (b.event, b.job_ids) == ("unknown", ["99"])
    assert "unserialisable" in b.evidence  # a tuple key cannot be JSON: the evidence goes, the record stays


def test_nul_in_the_path_is_a_journal_error(tmp_path):
    j = Journal(str(tmp_path / "a\x00b.jsonl"))
    with pytest.raises(JournalError, match="cannot open for writing"):
        j.append(Record(event="x"))
    with pytest.raises(JournalError, match="cannot read"):
        list(j.read())
    assert j.record("x") is None
