"""Job listings from squeue's text formats (22.05, whose --json ignores every filter): real recorded output
(tests/fixtures/slurm-22.05/squeue-text) read the same as the JSON of the same jobs, hostile comments that
forge records read as the text they are, and the one reason text cannot tell left to the JSON."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from autoheal.errors import SlurmParseError
from autoheal.slurm import parse, squeue_text

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm-22.05" / "squeue-text"
TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")  # squeue printed local times of a UTC machine
    time.tzset()
    yield
    monkeypatch.delenv("TZ")
    time.tzset()


def text_jobs():
    return {j.job_id: j for j in squeue_text.jobs_from_text((FIX / "o.txt").read_text(), (FIX / "cap.txt").read_text(),
                                                            TOKEN)}


def json_jobs():
    return {j.job_id: j for j in parse.jobs_from_json((FIX / "squeue.json").read_text())}


FIELDS = ("raw_id", "state", "nodes", "user", "comment", "excluded_nodes", "requeue", "restart_count", "batch_host",
          "priority", "array_job_id", "array_task_id", "eligible_time", "name")


def test_text_reads_what_the_json_of_the_same_jobs_says():
    text, js = text_jobs(), json_jobs()
    assert set(text) == set(js) == {"10001_0", "10001_1", "10003", "10004", "10005", "10006", "10008"}
    for jid, j in js.items():
        t = text[jid]
        for f in FIELDS:
            assert getattr(t, f) == getattr(j, f), (jid, f, getattr(t, f), getattr(j, f))
        if j.state_description != squeue_text.REQUEUE_HELD_DESCRIPTION:
            # squeue prints the description instead of the code when there is one; else the code
            assert t.state_reason == (j.state_description or j.state_reason)
    assert text["10004"].held and text["10008"].held and not text["10003"].held


def test_a_comment_that_forges_records_stays_one_comment():
    jobs = text_jobs()
    assert "99999" not in jobs
    assert jobs["10004"].comment == "evil\nTOKENR99999TOKENFRUNNING" and jobs["10004"].name == "name\twith tab"
    assert jobs["10003"].comment == "run\nfake" and jobs["10003"].state == "RUNNING"


def test_requeue_held_needs_the_json_to_tell_user_from_admin():
    t, j = text_jobs()["10005"], json_jobs()["10005"]
    assert squeue_text.needs_reason(t) and not t.requeue_held  # never guessed from the text
    assert j.requeue_held  # what the JSON read resolves it to (CliSlurm._text_jobs)
    assert not squeue_text.needs_reason(text_jobs()["10008"]) and not text_jobs()["10008"].requeue_held


def test_a_record_with_the_wrong_shape_is_an_error_not_a_guess():
    o = (FIX / "o.txt").read_text()
    with pytest.raises(SlurmParseError, match="fields"):
        squeue_text.parse_o(o.replace(f"{TOKEN}F", "|", 1), TOKEN)
    with pytest.raises(SlurmParseError, match="before the first record"):
        squeue_text.parse_o("junk\n" + o, TOKEN)
    with pytest.raises(SlurmParseError, match="unexpected line"):
        squeue_text.parse_cap("10005 1 N/A\n", TOKEN)


def test_every_call_draws_its_own_token():
    tokens = {squeue_text.new_token() for _ in range(50)}
    assert len(tokens) == 50 and all(len(t) == 32 for t in tokens)
