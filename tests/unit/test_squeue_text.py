"""Job listings from squeue's text formats (every version's listings: cli_backend.job_read_format): real
recorded output of 22.05 and 26.05 (tests/fixtures/slurm-*/squeue-text, tools/record_squeue_text.py) read
the same as the JSON of the same jobs, hostile names and comments that forge records (newlines, tabs, a
near-token, the field separator of another token, ``|``, ``%``, non-ASCII) read as the text they are, and
the one reason text cannot tell left to the JSON."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from autoheal.errors import SlurmParseError
from autoheal.slurm import parse, squeue_text
from autoheal.slurm.model import Job

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
VERSIONS = ("22.05", "26.05")
TOKEN = "0123456789abcdef0123456789abcdef"
NEAR = TOKEN[:-1] + "0"  # what the recorded hostile jobs wrote (tools/record_squeue_text.py)


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")  # squeue printed local times of a UTC machine
    time.tzset()
    yield
    monkeypatch.delenv("TZ")
    time.tzset()


@pytest.fixture(params=VERSIONS)
def fix(request):
    return FIXTURES / f"slurm-{request.param}" / "squeue-text"


def text_jobs(fix):
    return {j.job_id: j for j in squeue_text.jobs_from_text((fix / "o.txt").read_text(), (fix / "cap.txt").read_text(),
                                                            TOKEN)}


def json_jobs(fix):
    return {j.job_id: j for j in parse.jobs_from_json((fix / "squeue.json").read_text())}


#: Every Job field but three: ``state_reason`` (below), ``submit_line`` (no text format has it: get_job reads
#: the JSON on 23.02+, cli_backend.job_read_format) and ``end_time`` (the JSON's "end" of a job without a
#: time limit is a year on, or 6091243917 after a requeue; the text says NONE: None, no time limit near)
FIELDS = ("job_id", "raw_id", "state", "nodes", "name", "user", "comment", "excluded_nodes", "requeue",
          "restart_count", "batch_host", "state_description", "priority", "array_job_id", "array_task_id",
          "command", "eligible_time", "start_time")


def test_the_fields_compared_are_every_field_but_the_three_named():
    names = {f.name for f in dataclasses.fields(Job)}
    assert names - set(FIELDS) == {"state_reason", "submit_line", "end_time"}


def test_text_reads_what_the_json_of_the_same_jobs_says(fix):
    text, js = text_jobs(fix), json_jobs(fix)
    assert set(text) == set(js) == {"1_0", "1_1", "2", "3", "4", "5", "6", "7"}
    for jid, j in js.items():
        t = text[jid]
        for f in FIELDS:
            if f == "state_description" and not squeue_text.needs_reason(t):
                continue  # text has one column for both: checked below
            assert getattr(t, f) == getattr(j, f), (jid, f, getattr(t, f), getattr(j, f))
        if j.state_description != squeue_text.REQUEUE_HELD_DESCRIPTION:
            # squeue prints the description instead of the code when there is one; else the code
            assert t.state_reason == (j.state_description or j.state_reason)
    assert text["3"].held and text["4"].held and text["6"].held and not text["2"].held
    assert text["5"].start_time is not None and text["3"].start_time is None  # the guard's lost-prolog clock


def test_hostile_names_and_comments_stay_the_text_they_are(fix):
    jobs = text_jobs(fix)
    assert "99999" not in jobs and "1" in {j.raw_id for j in jobs.values()}  # no forged record, no lost one
    assert jobs["3"].comment == f"evil\n{NEAR}R99999{NEAR}FRUNNING" and jobs["3"].name == "name\twith tab"
    assert jobs["3"].state == "PENDING" and jobs["3"].nodes == ()
    assert jobs["4"].name == f"x{NEAR}Fy|ünï 名前 🚀 100%"
    assert jobs["4"].comment == f"a|b{NEAR}R1{NEAR}F ü名🚀\n%j %k"
    assert jobs["2"].comment == "run\nfake" and jobs["2"].state == "RUNNING"


def test_the_recorded_token_in_a_comment_is_an_error_not_a_forged_job(fix):
    # what a user who knew the token (they cannot: a fresh one per call) would write: the record no longer
    # splits into its fields, and the whole listing is refused rather than read wrong
    o = (fix / "o.txt").read_text().replace(f"evil\n{NEAR}R99999{NEAR}F", f"evil\n{TOKEN}R99999{TOKEN}F")
    with pytest.raises(SlurmParseError, match="fields"):
        squeue_text.jobs_from_text(o, (fix / "cap.txt").read_text(), TOKEN)


def test_requeue_held_needs_the_json_to_tell_user_from_admin(fix):
    t, j = text_jobs(fix)["5"], json_jobs(fix)["5"]
    assert squeue_text.needs_reason(t) and not t.requeue_held  # never guessed from the text
    assert j.requeue_held  # what the JSON read resolves it to (CliSlurm._text_jobs)
    admin = text_jobs(fix)["6"]
    assert not squeue_text.needs_reason(admin) and not admin.requeue_held and admin.state_reason == "JobHeldAdmin"


def test_a_record_with_the_wrong_shape_is_an_error_not_a_guess(fix):
    o = (fix / "o.txt").read_text()
    with pytest.raises(SlurmParseError, match="fields"):
        squeue_text.parse_o(o.replace(f"{TOKEN}F", "|", 1), TOKEN)
    with pytest.raises(SlurmParseError, match="before the first record"):
        squeue_text.parse_o("junk\n" + o, TOKEN)
    with pytest.raises(SlurmParseError, match="unexpected line"):
        squeue_text.parse_cap("10005 1 N/A\n", TOKEN)


def test_every_call_draws_its_own_token():
    tokens = {squeue_text.new_token() for _ in range(50)}
    assert len(tokens) == 50 and all(len(t) == 32 for t in tokens)
