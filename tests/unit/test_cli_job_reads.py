"""Which of squeue's outputs the CLI backend reads jobs from (cli_backend.job_read_format, the one owner of
that choice), fed real recorded output (tests/fixtures/slurm-*/squeue-text) through a stand-in for the
subprocess call: listings read text on every version (26.05's JSON of a 10,000-job pending list took 15 s),
one job reads the JSON where its -j works (23.02+: one record, with the submit line), and the ambiguous
requeue hold is resolved from the JSON of those jobs alone on 23.02+ (22.05: the whole cluster's)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List

import pytest

from autoheal.errors import SlurmUnavailable
from autoheal.slurm import squeue_text
from autoheal.slurm.cli_backend import JSON, TEXT, CliSlurm, job_read_format
from autoheal.slurm.model import SlurmVersion
from autoheal.slurm.parse import _num

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.fixture(autouse=True)
def utc_and_token(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")  # squeue printed local times of a UTC machine
    time.tzset()
    monkeypatch.setattr(squeue_text, "new_token", lambda: TOKEN)  # the token the fixtures were recorded with
    yield
    monkeypatch.delenv("TZ")
    time.tzset()


class Recorded(CliSlurm):
    """squeue answers from a fixture folder; every call is logged. The text listings are the recorded ones
    whatever the filters (the tests check the filters asked for); ``json_fails``: squeue --json times out."""

    def __init__(self, version: str, json_fails: bool = False):
        super().__init__(env={}, retries=0)
        self._version = SlurmVersion.parse(version)
        self.fix = FIXTURES / f"slurm-{version[:5]}" / "squeue-text"
        self.calls: List[List[str]] = []
        self.json_fails = json_fails

    def run(self, tool, *args, timeout=None, env=None):
        assert tool == "squeue"
        self.calls.append(list(args))
        if "--json" in args:
            if self.json_fails:
                raise SlurmUnavailable("squeue --json: no answer within 60s")
            data = json.loads((self.fix / "squeue.json").read_text())
            if "-j" in args and self._version.at_least(23, 2):  # 22.05's JSON ignores -j (observed)
                ids = set(args[args.index("-j") + 1].split(","))
                data["jobs"] = [j for j in data["jobs"] if str(_num(j["job_id"])) in ids
                                or str(_num(j["array_job_id"])) in ids]
            return json.dumps(data)
        name = "o.txt" if "-o" in args else "cap.txt"
        return (self.fix / name).read_text()


def test_listings_read_text_everywhere_and_one_job_json_from_23_02_on():
    for v in ("22.05.8", "23.02.1", "24.11.5", "26.05.5"):
        assert job_read_format(SlurmVersion.parse(v), one_job=False) == TEXT
    assert job_read_format(SlurmVersion.parse("22.05.8"), one_job=True) == TEXT
    for v in ("23.02.1", "24.11.5", "26.05.5"):
        assert job_read_format(SlurmVersion.parse(v), one_job=True) == JSON


def test_26_05_pending_list_is_text_and_the_requeue_hold_is_read_from_that_jobs_json_alone():
    slurm = Recorded("26.05.5")
    pending = {j.job_id: j for j in slurm.list_jobs(states=["PENDING"])}
    assert set(pending) == {"3", "4", "5", "6"}
    assert pending["5"].requeue_held and pending["5"].state_reason == "JobHeldUser"  # resolved, not guessed
    assert not pending["6"].requeue_held and pending["6"].held  # an admin's hold: never the guard's
    listing, json_calls = [c for c in slurm.calls if "--json" not in c], [c for c in slurm.calls if "--json" in c]
    assert len(listing) == 2 and all("--states=PENDING" in c for c in listing)
    assert json_calls == [["--json", "--states=all", "-j", "5"]]


def test_22_05_resolves_from_the_whole_json_its_squeue_prints():
    slurm = Recorded("22.05.8")
    pending = {j.job_id: j for j in slurm.list_jobs(states=["PENDING"])}
    assert pending["5"].requeue_held
    assert [c for c in slurm.calls if "--json" in c] == [["--json"]]


def test_a_json_that_does_not_answer_leaves_the_hold_unresolved_never_released():
    slurm = Recorded("26.05.5", json_fails=True)
    pending = {j.job_id: j for j in slurm.list_jobs(states=["PENDING"])}
    assert not pending["5"].requeue_held and pending["5"].held and set(pending) == {"3", "4", "5", "6"}


def test_one_job_on_26_05_is_its_json_record_with_the_submit_line():
    slurm = Recorded("26.05.5")
    job = slurm.get_job("2")
    assert slurm.calls == [["--json", "--states=all", "-j", "2"]]
    assert job.running and job.comment == "run\nfake" and "--comment=run\nfake" in job.submit_line


def test_one_job_on_22_05_is_text():
    slurm = Recorded("22.05.8")
    job = slurm.get_job("1_1")
    text = [c for c in slurm.calls if "--json" not in c]
    assert len(text) == 2 and all(c[c.index("-j") + 1] == "1_1" for c in text)
    assert job.array_task_id == "1" and job.nodes == ("gpu2",)


def test_a_node_listing_keeps_real_allocations_only():
    slurm = Recorded("26.05.5")
    on_gpu2 = slurm.list_jobs(node="gpu2")
    assert sorted(j.job_id for j in on_gpu2) == ["1_0", "1_1"]
    text = [c for c in slurm.calls if "--json" not in c]
    assert len(text) == 2 and all(f"--states={','.join(squeue_text.NODE_STATES)}" in c and "-w" in c for c in text)


def test_an_unfiltered_listing_asks_what_the_json_listed_on_each_version():
    new, old = Recorded("26.05.5"), Recorded("22.05.8")
    assert len(new.list_jobs()) == len(old.list_jobs()) == 8
    # 23.02+: squeue's default state filter, as its JSON had
    assert all(not any(a.startswith("--states") for a in c) for c in new.calls if "--json" not in c)
    assert all("--states=all" in c for c in old.calls if "--json" not in c)
