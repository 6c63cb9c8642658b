"""The rules root applies to a record a job left (``autoheal/job_records.py``): whatever the line claims,
the record says it is the user's, about their job, on one of their nodes."""

from __future__ import annotations

import json
import os
import time

from autoheal import job_records as JR

IDENT = JR.JobIdentity(job_id="77", uid=1000, user="alice", nodes=("n1", "n2"), array_id="70_7")


def line(**kw):
    return json.dumps(kw)


def test_identity_comes_from_slurms_environment():
    ident = JR.JobIdentity.from_env({"SLURM_JOB_ID": "77", "SLURM_JOB_UID": "1000", "SLURM_JOB_USER": "alice",
                                     "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_ARRAY_JOB_ID": "70",
                                     "SLURM_ARRAY_TASK_ID": "7"})
    assert ident == IDENT
    assert JR.JobIdentity.from_env({"SLURM_JOB_ID": "77"}) is None  # no uid: nothing is trusted
    assert JR.JobIdentity.from_env({"SLURM_JOB_ID": "../x", "SLURM_JOB_UID": "0"}) is None


def test_what_a_line_claims_about_itself_is_kept_aside():
    rec = JR.untrusted_record(line(event="drain", source="xid-watch", node="gpu9", job_ids=["1"], host="ctld",
                                   severity="error", message="<!channel>\nxid 79", check="xid",
                                   action="drain", outcome="drained"), IDENT, "n1")
    assert (rec.event, rec.source, rec.node, rec.job_ids, rec.check) == ("job-record", "job", "n1", ["77"], "")
    assert rec.message == "[user alice] <!channel> xid 79"  # one line; the notifier escapes it
    assert rec.severity == "error" and rec.host == os.uname().nodename
    assert rec.evidence["claimed"] == {"event": "drain", "source": "xid-watch", "node": "gpu9", "host": "ctld"}


def test_the_runners_own_records_keep_their_event_node_and_array_id():
    rec = JR.untrusted_record(line(event="job-requeue", node="n2", job_ids=["70_7"], severity="action",
                                   message="job 70_7 requeued", source="sbatch-runner"), IDENT, "n1")
    assert (rec.event, rec.node, rec.job_ids) == ("job-requeue", "n2", ["70_7"])
    assert rec.evidence["claimed"] == {"source": "sbatch-runner"}
    other = JR.untrusted_record(line(event="job-requeue", job_ids=["71_1"]), IDENT, "n1")
    assert other.job_ids == ["77"]


def test_times_far_from_now_and_unknown_severities_are_not_believed():
    now = time.time()
    assert JR.untrusted_record(line(event="job-x", time=now + 10 ** 9), IDENT, "n1").time >= now
    assert JR.untrusted_record(line(event="job-x", time=1.0), IDENT, "n1").time >= now
    assert JR.untrusted_record(line(event="job-x", time=now - 5), IDENT, "n1").time == now - 5
    assert JR.untrusted_record(line(event="job-x", severity="critical"), IDENT, "n1").severity == "info"
    assert JR.untrusted_record("[1, 2]", IDENT, "n1") is None
    assert JR.untrusted_record("{", IDENT, "n1") is None


def test_the_outbox_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(JR, "MAX_BYTES", 2000)
    said = []
    box = JR.JobOutbox(tmp_path, "77", say=said.append)
    kept = [box.record("job-x", message="m" * 300) for _ in range(20)]
    box.close()
    assert 1 <= sum(r is not None for r in kept) < 20
    assert (tmp_path / f"77.{os.geteuid()}.jsonl").stat().st_size <= 2000
    assert len(said) == 1 and "more than 2000 bytes of records" in said[0]


def test_the_epilog_looks_at_a_bounded_number_of_spool_files(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        import pytest

        pytest.skip("the spool is root's")
    spool = tmp_path / "spool"
    assert JR.ensure_spool(spool) is None and oct(spool.stat().st_mode & 0o7777) == "0o1733"
    for i in range(30):
        (spool / f"junk-{i}").write_text("")
    monkeypatch.setattr(JR, "MAX_SCAN", 10)
    found = JR.collect(spool, IDENT, "n1")
    assert found.records == [] and found.problems == [f"job spool {spool}: more than 10 files; the rest not looked at"]
