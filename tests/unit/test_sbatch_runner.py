"""The job runner against an in-memory fake Slurm, with real child processes."""

from __future__ import annotations

import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import FakeSlurm

from autoheal.journal import Journal
from autoheal.sbatch_helpers import runner as r
from autoheal.sbatch_helpers.checkpoint import CheckpointManager
from autoheal.sbatch_helpers.comment import merged_exclusions
from autoheal.slurm.model import Job, Node


@pytest.fixture(autouse=True)
def keep_signal_handlers(monkeypatch):
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    monkeypatch.setattr(r, "KILL_AFTER_TERM", 0.5)
    yield
    for s, h in saved.items():
        signal.signal(s, h)


# A child that saves a checkpoint (step 7) when the grace signal arrives and exits 99.
SAVER = """
import os, signal, sys, time
from pathlib import Path
from autoheal.sbatch_helpers.checkpoint import CheckpointManager
got = []
signal.signal(signal.SIGUSR2, lambda *a: got.append(1))
Path(os.environ["AUTOHEAL_CHECKPOINT_DIR"], "started").write_text(os.environ.get("AUTOHEAL_RESUME_FROM", "-"))
while not got:
    time.sleep(0.05)
CheckpointManager(os.environ["AUTOHEAL_CHECKPOINT_DIR"]).save(7, b"state")
sys.exit(99)
"""
IGNORER = """
import os, signal, time
from pathlib import Path
signal.signal(signal.SIGUSR2, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
Path(os.environ["AUTOHEAL_CHECKPOINT_DIR"], "started").write_text("x")
time.sleep(60)
"""


def make(tmp_path, *, job=None, nodes=(), restart=0, **opts):
    job = job or Job(job_id="42", raw_id="42", state="RUNNING", nodes=("gpu1", "gpu2"), comment="autoheal-runner",
                     excluded_nodes=("gpu9",), end_time=None)
    slurm = FakeSlurm(job, nodes)
    ident = r.JobIdentity(job_id=job.job_id, raw_id=job.raw_id, restart_count=restart, submit_dir=str(tmp_path))
    options = r.RunnerOptions(checkpoint_dir=str(tmp_path / "ck"), grace=10, **opts)
    journal = Journal(tmp_path / "journal.jsonl", fsync=False)
    return r.Runner(options, ident, slurm=slurm, journal=journal, env={"PATH": "/usr/bin:/bin"},
                    sacct=lambda j: None, adopt_orphans=False), slurm, journal


def signal_when_started(runner, ckdir: Path, sig=signal.SIGUSR2):
    def go():
        deadline = time.monotonic() + 20
        while not (ckdir / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        runner._on_signal(int(sig), None)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_completed_run_exports_env_and_records_final_state(tmp_path):
    runner, slurm, _ = make(tmp_path)
    out = tmp_path / "env.txt"
    code = runner.run([sys.executable, "-c", f"import os; open({str(out)!r}, 'w').write(repr(sorted("
                       "(k, v) for k, v in os.environ.items() if k.startswith('AUTOHEAL_'))))"])
    assert code == 0
    env = dict(eval(out.read_text()))
    assert env["AUTOHEAL_RESTART_COUNT"] == "0" and env["AUTOHEAL_GRACE_SIGNAL"] == "USR2"
    assert env["AUTOHEAL_CHECKPOINT_DIR"] == str(tmp_path / "ck")
    assert "AUTOHEAL_RESUME_FROM" not in env and "AUTOHEAL_REQUEUE_REASON" not in env
    assert slurm.job.comment == "autoheal-runner resumed=none nodes=gpu1,gpu2 state=completed"


def test_failing_command_is_not_requeued(tmp_path):
    runner, slurm, _ = make(tmp_path)
    assert runner.run([sys.executable, "-c", "raise SystemExit(3)"]) == 3
    assert not [c for c in slurm.calls if c[0].startswith("requeue")]


def test_autoheal_drain_checkpoint_then_requeuehold_exclude_merged_release(tmp_path):
    drained = Node("gpu1", "MIXED", frozenset({"DRAIN"}), reason="autoheal: xid 79")
    runner, slurm, journal = make(tmp_path, nodes=[drained, Node("gpu2", "MIXED")])
    signal_when_started(runner, tmp_path / "ck")
    assert runner.run([sys.executable, "-c", SAVER]) == r.EXIT_REQUEUED
    writes = [c for c in slurm.calls if c[0] != "comment"]
    assert writes == [("requeuehold", "42"), ("update", "42", {"ExcNodeList": "gpu9,gpu1"}), ("release", "42")]
    comments = [c[2] for c in slurm.calls if c[0] == "comment"]
    # the restart record is in the comment before the requeue starts Slurm's kill sequence
    assert comments[-1].startswith("autoheal-runner restarts=1 last=autoheal-drain@gpu1 step=7")
    rec = list(journal.read(events=["job-requeue"]))[0]
    assert rec.evidence["cause"] == "autoheal-drain" and rec.evidence["checkpoint_step"] == "7"
    assert rec.evidence["child_exit"] == 99


def test_next_run_resumes_from_newest_valid_checkpoint_with_the_recorded_reason(tmp_path):
    ck = tmp_path / "ck"
    mgr = CheckpointManager(ck, keep=None, rank=0)
    mgr.save(5, b"a")
    torn = mgr.save(9, b"b")
    (torn / "COMPLETE").unlink()
    job = Job(job_id="42", raw_id="42", state="RUNNING", nodes=("gpu3",),
              comment="autoheal-runner restarts=1 last=autoheal-drain@gpu1 step=5 resumed=none | keep me")
    runner, slurm, _ = make(tmp_path, job=job, restart=1)
    out = tmp_path / "env.txt"
    code = runner.run([sys.executable, "-c", "import os; open(%r, 'w').write(os.environ['AUTOHEAL_RESUME_FROM'] + ' ' "
                       "+ os.environ['AUTOHEAL_REQUEUE_REASON'] + ' ' + os.environ['AUTOHEAL_RESTART_COUNT'])"
                       % str(out)])
    assert code == 0
    assert out.read_text() == f"{ck / 'ckpt-00000005'} autoheal-drain 1"
    assert slurm.job.comment.endswith("resumed=5 nodes=gpu3 state=completed | keep me")


def test_signal_ignoring_command_is_killed_after_grace_and_still_requeued(tmp_path):
    runner, slurm, journal = make(tmp_path, nodes=[Node("gpu1", "MIXED"), Node("gpu2", "MIXED")])
    runner.opts.grace = 1
    signal_when_started(runner, tmp_path / "ck")
    t0 = time.monotonic()
    assert runner.run([sys.executable, "-c", IGNORER]) == r.EXIT_REQUEUED
    assert time.monotonic() - t0 < 10
    assert ("requeue", "42") in slurm.calls  # no node problem: plain requeue, no exclusion
    rec = list(journal.read(events=["job-requeue"]))[0]
    assert rec.evidence["cause"] == "signal" and rec.evidence["child_exit"] == -signal.SIGKILL


def test_sigterm_of_a_cancel_is_never_turned_into_a_requeue(tmp_path):
    runner, slurm, _ = make(tmp_path)

    def cancel():
        deadline = time.monotonic() + 20
        while not (tmp_path / "ck" / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        slurm.job = replace(slurm.job, state="COMPLETING")  # what squeue says right after scancel
        runner._on_signal(int(signal.SIGTERM), None)

    threading.Thread(target=cancel, daemon=True).start()
    runner.run([sys.executable, "-c", SAVER.replace("SIGUSR2", "SIGTERM")])
    assert not [c for c in slurm.calls if c[0] in ("requeue", "requeuehold")]
    assert "state=cancelled" in slurm.job.comment


def test_time_limit_deadline_triggers_checkpoint_and_requeue(tmp_path):
    job = Job(job_id="7_3", raw_id="9", state="RUNNING", nodes=("gpu1",), comment="autoheal-runner",
              end_time=int(time.time()) + 10 + 5 + 2, array_job_id="7", array_task_id="3")
    runner, slurm, journal = make(tmp_path, job=job, nodes=[Node("gpu1", "MIXED")], requeue_margin=5)
    assert runner.run([sys.executable, "-c", SAVER]) == r.EXIT_REQUEUED
    assert ("requeue", "7_3") in slurm.calls  # array tasks are requeued as <array>_<task>
    assert "last=time-limit step=7" in slurm.job.comment


def test_max_restarts_and_no_progress_stop_before_running(tmp_path):
    marker = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    runner, slurm, journal = make(tmp_path, restart=3, max_restarts=2)
    assert runner.run(cmd) == r.EXIT_MAX_RESTARTS
    assert not marker.exists() and "state=max-restarts" in slurm.job.comment
    assert list(journal.read(events=["job-max-restarts"]))

    CheckpointManager(tmp_path / "ck", keep=None, rank=0).save(5, b"a")
    job = Job(job_id="42", raw_id="42", state="RUNNING", nodes=("gpu1",),
              comment="autoheal-runner restarts=2 last=signal step=5 resumed=5")
    runner, slurm, _ = make(tmp_path, job=job, restart=2)
    assert runner.run(cmd) == r.EXIT_NO_PROGRESS
    assert not marker.exists() and "state=no-progress" in slurm.job.comment


def test_max_restarts_reached_at_interrupt_does_not_requeue(tmp_path):
    runner, slurm, _ = make(tmp_path, restart=1, max_restarts=1, nodes=[Node("gpu1", "MIXED")])
    signal_when_started(runner, tmp_path / "ck")
    assert runner.run([sys.executable, "-c", SAVER]) == r.EXIT_MAX_RESTARTS
    assert not [c for c in slurm.calls if c[0] in ("requeue", "requeuehold")]


def test_comment_roundtrip_and_helpers(tmp_path):
    st = r.CommentState.parse("autoheal-runner restarts=2 last=node-failure@gpu2 step=40 resumed=30 "
                              "nodes=gpu1,gpu2 state=running | user text")
    assert (st.restarts, st.last, st.step, st.resumed, st.user_comment) == (2, "node-failure@gpu2", "40", "30",
                                                                           "user text")
    assert r.CommentState.parse(st.render()) == st
    assert r.CommentState.parse("someone else's").user_comment == "someone else's"
    assert r.no_progress(2, "5", "5") and not r.no_progress(1, "5", "5") and not r.no_progress(2, "5", "6")
    assert merged_exclusions(["a", "b"], ["b", "c"]) == ["a", "b", "c"]
    ident = r.JobIdentity.from_env({"SLURM_JOB_ID": "12", "SLURM_ARRAY_JOB_ID": "10", "SLURM_ARRAY_TASK_ID": "2",
                                    "SLURM_SUBMIT_DIR": "/home/u", "SLURM_JOB_NAME": "t"})
    assert (ident.job_id, ident.restart_count) == ("10_2", 0)
    assert r.expand_checkpoint_dir("", ident) == "/home/u/autoheal-checkpoints/10_2"
    assert r.expand_checkpoint_dir("/s/%x/%A-%a", ident) == "/s/t/10-2"


def test_notify_url_receives_the_final_state(tmp_path):
    import http.server
    import json

    from autoheal.notify import Notifier

    posts = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            posts.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        runner, slurm, journal = make(tmp_path, restart=3, max_restarts=2, notify=[url])
        runner.notifier = Notifier([], journal=journal)
        assert runner.run([sys.executable, "-c", "pass"]) == r.EXIT_MAX_RESTARTS
        assert runner.notifier.flush(10)
    finally:
        server.shutdown()
    by_event = {p["autoheal"]["event"]: p for p in posts}
    assert set(by_event) == {"job-restart", "job-max-restarts"}  # the restart Slurm did, then the stop
    assert "exceeds --max-restarts 2" in by_event["job-max-restarts"]["text"]


def test_job_history_comes_from_the_adapter_and_a_backend_without_it_is_no_accounting(tmp_path):
    from autoheal.errors import SlurmNotSupported

    runner, slurm, _ = make(tmp_path)
    runner = r.Runner(runner.opts, runner.ident, slurm=slurm, env={"PATH": "/usr/bin:/bin"}, adopt_orphans=False)
    slurm.job_state_history = lambda job_id: ["NODE_FAIL", "REQUEUED"] if job_id == "42" else None
    assert runner.sacct("42") == ["NODE_FAIL", "REQUEUED"]

    def unsupported(job_id):
        raise SlurmNotSupported("pyslurm")

    slurm.job_state_history = unsupported
    assert runner.sacct("42") is None
    assert r.Runner(runner.opts, runner.ident, slurm=None, env={}, adopt_orphans=False).sacct("42") is None


def test_final_comment_is_retried_while_slurmctld_restarts(tmp_path, monkeypatch):
    """Soak finding (issue 12): a job that ended while slurmctld was down kept ``state=running`` in its
    comment (the journal said job-completed): the final comment is now retried for a while."""
    from autoheal.errors import SlurmError, SlurmJobBusy, SlurmUnavailable

    runner, slurm, _journal = make(tmp_path)
    monkeypatch.setattr(r.time, "sleep", lambda s: None)

    fails = {"n": 2}
    real = slurm.set_job_comment

    def flaky(job_id, comment):
        if fails["n"]:
            fails["n"] -= 1
            if fails["n"]:
                raise SlurmUnavailable("scontrol update: no answer within 5s")
            # what an array task's update got from a slurmctld just restarted (seen in the soak): the
            # adapter types Slurm's "Unexpected message received for job 4_0" (test_rest_backend)
            raise SlurmJobBusy("scontrol update jobid=4_0: Unexpected message received for job 4_0")
        real(job_id, comment)

    slurm.set_job_comment = flaky
    assert runner.finish("completed", 0, "done", severity="info") == 0
    assert "state=completed" in slurm.job.comment and fails["n"] == 0
    # an outage longer than the retry window gives up (the job must end) without raising
    monkeypatch.setattr(r, "FINAL_COMMENT_RETRY", 0.0)
    fails["n"] = 5
    runner.finish("failed", 1, "boom")
    assert "state=completed" in slurm.job.comment
    # a refusal is not retried
    monkeypatch.setattr(r, "FINAL_COMMENT_RETRY", 30.0)
    calls = []

    def refuse(job_id, comment):
        calls.append(comment)
        raise SlurmError("scontrol update: Access/permission denied")

    slurm.set_job_comment = refuse
    runner.finish("failed", 1, "boom")
    assert len(calls) == 1
