"""Issue 25 item 7: text a user writes never reaches the on-call as mentions or markup, and one user's job
cannot flood them.

The attacks: a job comment (the user's to write with ``scontrol update``) whose ``excl=`` holds
``<!channel>`` and other non-node text; record text with every mention syntax we know; and a user who
loops ``scontrol requeuehold`` on their own job so that the guard releases it pass after pass.
"""

from __future__ import annotations

import json

import pytest
from helpers import WebhookRecorder

from autoheal.journal import Journal, Record
from autoheal.notify import JobRateLimit, Notifier, escape_markup, format_text
from autoheal.sbatch_helpers.comment import CommentState
from autoheal.sbatch_helpers.guard import RELEASE, Guard
from autoheal.slurm.model import Job, Node
from autoheal_lab.testing.slurm import MemorySlurm

NODES = [Node("gpu1", "IDLE"), Node("gpu2", "IDLE", frozenset({"DRAIN"}), reason="autoheal: xid 79"),
         Node("gpu3", "IDLE")]
HOSTILE = "<!channel> <!here> <!everyone> <@U024BE7LH> <#C024BE7LH> <!subteam^SAZ94GDB8> @channel @here " \
          "@everyone @all [click me](http://evil.example/x) ![img](http://evil.example/i) " \
          "<http://evil.example|your job failed, log in here> <b>bold</b> <at>Alice</at> &lt;!channel&gt;"
RAW = ["<!channel>", "<!here>", "<!everyone>", "<@U024BE7LH>", "<#C024BE7LH>", "<!subteam", "@channel", "@here",
       "@everyone", "@all", "](http", "<http", "<b>", "<at>"]


Hook = WebhookRecorder


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


def assert_inert(text):
    for raw in RAW:
        assert raw not in text, (raw, text)


def test_every_mention_and_markup_is_escaped_in_every_field():
    rec = Record(event=f"job-x {HOSTILE}", node=f"n1 {HOSTILE}", check=HOSTILE, message=HOSTILE,
                 outcome=HOSTILE, job_ids=["1", HOSTILE], severity="action", host="h")
    text = format_text(rec, cluster=HOSTILE)
    assert_inert(text)
    # still readable: the same words, Slack shows &lt; &gt; &amp; as < > &
    for word in ("channel", "here", "everyone", "click me", "evil.example", "your job failed", "bold"):
        assert word in text
    assert escape_markup("<!channel>") == "&lt;!channel&gt;"
    assert escape_markup("@here please") == "@\u200bhere please"
    assert escape_markup("mail alice@example.org") == "mail alice@example.org"  # an address is no mention
    assert escape_markup("[a](b)") == "[a]\u200b(b)"
    assert escape_markup("&lt;!here&gt;") == "&amp;lt;!here&amp;gt;"  # pre-escaped text stays text
    # a zero-width space the user wrote is no way around it: sanitize makes it a space, the escape follows
    assert_inert(format_text(Record(event="e", node="n", message="@\u200bchannel <\u200b!here>")))
    # the separators of our own format are untouched
    assert format_text(Record(event="drain", node="gpu1", outcome="drained")) == "gpu1: drain | -> drained"


def test_guard_keeps_only_node_names_from_the_users_excl(tmp_path, hook):
    """excl= is in the user's comment: only names of nodes Slurm knows reach the ExcNodeList, the
    comment the guard writes back, its journal record and the webhook."""
    comment = ("autoheal-runner restarts=1 last=node@gpu2 step=4 state=requeueing "
               "excl=<!channel>,gpu2,@here,[x](http://evil),not-a-node,<@U1> | mine")
    slurm = MemorySlurm(NODES, [Job(job_id="9", raw_id="9", state="RUNNING", nodes=("gpu2",), comment=comment,
                                    excluded_nodes=("gpu3",), requeue=True)])
    slurm.requeue("9", hold=True)
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    notifier = Notifier([hook.url], timeout=2, retries=0, journal=journal)
    [res] = Guard(slurm, journal=journal, notifier=notifier, release_after=0, say=lambda s: None).pass_once()
    assert res.done and res.action.kind == RELEASE
    job = slurm.jobs["9"]
    assert job.excluded_nodes == ("gpu3", "gpu2") and not job.held
    assert CommentState.parse(job.comment).excl == "gpu2"
    assert notifier.flush(5)
    [rec] = list(journal.read(events=["guard-release"]))
    written = (tmp_path / "j.jsonl").read_text()
    for bad in ("channel", "here", "evil", "not-a-node", "U1"):
        assert bad not in written, bad
        assert bad not in json.dumps(hook.bodies), bad
    assert rec.message.endswith("; excluded gpu2") and len(hook.bodies) == 1


def test_a_requeuehold_loop_posts_the_first_release_and_one_summary(tmp_path, hook):
    """The user requeue-holds their own job again and again with state=requeueing in its comment: the
    guard releases it every time (as it must: it cannot tell), the journal has every release, the
    on-call gets the first and then one summary."""
    comment = "autoheal-runner restarts=1 last=node@gpu2 step=4 state=requeueing excl=gpu2"
    slurm = MemorySlurm(NODES, [Job(job_id="9", raw_id="9", state="RUNNING", nodes=("gpu1",), comment=comment,
                                    requeue=True)])
    journal = Journal(tmp_path / "j.jsonl", fsync=False)
    clock = [0.0]
    limit = JobRateLimit(burst=1, window=600, clock=lambda: clock[0])
    notifier = Notifier([hook.url], timeout=2, retries=0, journal=journal, job_limit=limit)
    guard = Guard(slurm, journal=journal, notifier=notifier, release_after=0, say=lambda s: None)
    for _ in range(30):
        slurm.start("9", ["gpu1"])
        slurm.set_job_comment("9", comment)  # the user's own update
        slurm.requeue("9", hold=True)  # the user's own scontrol requeuehold
        [res] = guard.pass_once()
        assert res.done and res.action.kind == RELEASE
        clock[0] += 2.0
    assert notifier.flush(5, summaries=False)
    assert len(list(journal.read(events=["guard-release"]))) == 30
    assert [b["autoheal"]["event"] for b in hook.bodies] == ["guard-release"]
    # the window ends: the next thing the guard posts brings the summary with it
    clock[0] = 700.0
    notifier.send(Record(event="guard-release", job_ids=["10"], severity="action", message="another job"))
    assert notifier.flush(5, summaries=False)
    events = [b["autoheal"]["event"] for b in hook.bodies]
    assert events == ["guard-release", "notify-summary", "guard-release"], events
    summary = hook.bodies[1]["autoheal"]
    assert summary["job_ids"] == ["9"]
    assert summary["message"].startswith("29 more 'guard-release' record(s) about job 9")
    # and a stopping guard posts what it still holds back
    for _ in range(3):
        notifier.send(Record(event="guard-release", job_ids=["10"], severity="action", message="again"))
    assert notifier.flush(5)
    assert [b["autoheal"]["event"] for b in hook.bodies][3:] == ["notify-summary"]
    assert hook.bodies[3]["autoheal"]["message"].startswith("3 more 'guard-release' record(s) about job 10")


def test_the_limit_never_holds_back_other_events_or_records_about_several_jobs():
    limit = JobRateLimit(burst=1, window=600, clock=lambda: 0.0)
    assert limit.admit(Record(event="job-requeue", job_ids=["1"]), [])[0]
    assert not limit.admit(Record(event="job-requeue", job_ids=["1"]), [])[0]
    assert limit.admit(Record(event="drain", job_ids=["1"]), [])[0]  # another event about the job
    assert limit.admit(Record(event="drain", job_ids=["1", "2"]), [])[0]  # a node's drain naming its jobs
    assert limit.admit(Record(event="drain", job_ids=["1", "2"]), [])[0]
    assert limit.admit(Record(event="drain"), [])[0]
    assert JobRateLimit(burst=0).admit(Record(event="e", job_ids=["1"]), [])[0]


def test_the_limit_remembers_a_bounded_number_of_jobs_and_summarises_the_ones_it_forgets():
    limit = JobRateLimit(burst=1, window=600, tracked=10, clock=lambda: 0.0)
    summaries = []
    for job in range(1000):
        for _ in range(3):
            _sent, due = limit.admit(Record(event="job-requeue", job_ids=[str(job)]), [])
            summaries.extend(due)
    assert len(limit._keys) == 10
    assert len(summaries) == 990 and all(s.message.startswith("2 more") for s, _ in summaries)


def test_from_config_uses_the_configured_limit(tmp_path):
    from autoheal.config import parse_config

    cfg = parse_config('[notify]\nwebhooks = ["http://127.0.0.1:9/x"]\njob_burst = 3\njob_window = 60\n')
    n = Notifier.from_config(cfg)
    assert (n.job_limit.burst, n.job_limit.window, n.job_limit.tracked) == (3, 60.0, 1000)
    assert Notifier.from_config(parse_config("[notify]\njob_burst = 0\n")).job_limit is None
