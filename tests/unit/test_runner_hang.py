"""The runner's hang detection (issue 23 §2) with real child processes and an in-memory fake Slurm.

The children stand for ranks: they write heartbeats through the checkpoint API, then block the way a
rank blocked in a collective does (its signal handlers never run: here they ignore the signals)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import FakeSlurm

from autoheal.config import Config
from autoheal.journal import Journal
from autoheal.sbatch_helpers import progress
from autoheal.sbatch_helpers import runner as r
from autoheal.sbatch_helpers.wrapper import WrapperOptions, runner_argv
from autoheal.slurm.model import Job, Node


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    monkeypatch.setattr(r, "KILL_AFTER_TERM", 0.5)
    monkeypatch.setattr(r, "SRUN_EXIT_WAIT", 0.3)
    monkeypatch.setattr(r, "HEARTBEAT_POLL", 0.1)
    monkeypatch.setattr(r, "HEARTBEAT_POLL_FAULT", 0.1)
    monkeypatch.setattr(r, "NODE_SETTLE_PAUSE", 0.05)
    yield
    for s, h in saved.items():
        signal.signal(s, h)


UP = [Node("gpu1", "MIXED"), Node("gpu2", "MIXED")]


def make(tmp_path, nodes=UP, node_script=None, **opts):
    job = Job(job_id="42", raw_id="42", state="RUNNING", nodes=("gpu1", "gpu2"), comment="autoheal-runner",
              end_time=None)
    slurm = FakeSlurm(job, nodes, node_script)
    ident = r.JobIdentity(job_id="42", raw_id="42", restart_count=0, submit_dir=str(tmp_path))
    options = r.RunnerOptions(checkpoint_dir=str(tmp_path / "ck"), **{"grace": 120, **opts})
    journal = Journal(tmp_path / "journal.jsonl", fsync=False)
    runner = r.Runner(options, ident, slurm=slurm, journal=journal, env={"PATH": "/usr/bin:/bin"},
                      sacct=lambda j: None, adopt_orphans=False)
    return runner, slurm, journal


def signal_when_started(runner, ckdir: Path, sig=signal.SIGUSR2):
    def go():
        deadline = time.monotonic() + 20
        while not (ckdir / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        runner._on_signal(int(sig), None)

    threading.Thread(target=go, daemon=True).start()


# Trains (heartbeats steps 0..9), then blocks like a rank whose peer is gone: no handler runs.
BLOCKED = """
import os, signal, time
from pathlib import Path
from autoheal.sbatch_helpers import heartbeat
signal.signal(signal.SIGUSR2, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
for i in range(10):
    heartbeat(i)
    time.sleep(0.1)
Path(os.environ["AUTOHEAL_CHECKPOINT_DIR"], "started").write_text("x")
time.sleep(300)
"""

# Trains, and on the grace signal saves for SAVE_S seconds (longer than --hang-after-fault), then exits.
SLOW_SAVER = """
import os, signal, sys, time
from pathlib import Path
from autoheal.sbatch_helpers import heartbeat
from autoheal.sbatch_helpers.checkpoint import CheckpointManager
got = []
signal.signal(signal.SIGUSR2, lambda *a: got.append(1))
i = 0
while not got:
    heartbeat(i)
    i += 1
    if i == 5:
        Path(os.environ["AUTOHEAL_CHECKPOINT_DIR"], "started").write_text("x")
    time.sleep(0.1)
def slow(f):
    time.sleep(%(save)s)
    f.write(b"state")
CheckpointManager(os.environ["AUTOHEAL_CHECKPOINT_DIR"]).save(7, slow)
sys.exit(99)
"""


def _requeue_record(journal):
    return list(journal.read(events=["job-requeue"]))[0]


def test_ranks_blocked_after_the_grace_signal_are_ended_without_waiting_the_grace(tmp_path):
    runner, slurm, journal = make(tmp_path, hang_after_fault=1, grace=120)
    signal_when_started(runner, tmp_path / "ck")
    t0 = time.monotonic()
    assert runner.run([sys.executable, "-c", BLOCKED]) == r.EXIT_REQUEUED
    assert time.monotonic() - t0 < 60  # far from the 120 s grace (then TERM, KILL) a blocked rank cost
    rec = _requeue_record(journal)
    assert rec.evidence["hang"] == "hung-after-fault" and rec.evidence["child_exit"] == -signal.SIGKILL
    assert rec.evidence["cause"] == "signal"  # the cause is still the fault's (here: no node problem)
    # the user's step only: not the batch shell (this runner), not the memory-tier agents
    assert [c for c in slurm.calls if c[0] == "signal"] == [("signal", "42.1", "KILL", False, False)]
    assert ("requeue", "42") in slurm.calls


def test_a_rank_saving_after_the_signal_is_waited_for_past_hang_after_fault(tmp_path):
    runner, slurm, journal = make(tmp_path, hang_after_fault=1)
    signal_when_started(runner, tmp_path / "ck")
    assert runner.run([sys.executable, "-c", SLOW_SAVER % {"save": 3}]) == r.EXIT_REQUEUED
    rec = _requeue_record(journal)
    assert rec.evidence["checkpoint_step"] == "7" and rec.evidence["child_exit"] == 99
    assert "hang" not in rec.evidence
    assert not [c for c in slurm.calls if c[0] == "signal"]


def test_the_hooks_backstop_bounds_hang_after_fault(tmp_path):
    runner, _, _ = make(tmp_path, hang_after_fault=10)
    runner.hooks_grace = 4.0
    assert runner.hang_options().backstop == 4.0
    assert r._hooks_grace(Config()) == Config().hooks.grace_seconds
    assert r._hooks_grace(object()) is None


def test_watchdog_ends_a_step_that_stopped_with_no_signal_and_requeues_it_as_a_hang(tmp_path):
    runner, slurm, journal = make(tmp_path, watchdog=2)
    assert runner.run([sys.executable, "-c", BLOCKED]) == r.EXIT_REQUEUED
    hang_rec = list(journal.read(events=["job-hang"]))[0]
    assert hang_rec.evidence["hang"] == "watchdog" and "no rank progressed" in hang_rec.message
    rec = _requeue_record(journal)
    assert rec.evidence["cause"] == "hang" and rec.evidence["hang"] == "watchdog"
    assert [c for c in slurm.calls if c[0] == "signal"] == [("signal", "42.1", "KILL", False, False)]
    assert ("requeue", "42") in slurm.calls  # no node found bad: a plain requeue
    assert "last=hang " in slurm.job.comment + " "


def test_watchdog_waits_for_a_node_not_responding_to_be_down_then_excludes_it(tmp_path):
    half_dead = [Node("gpu1", "MIXED"), Node("gpu2", "MIXED", frozenset({"NOT_RESPONDING"}))]
    down = [Node("gpu1", "MIXED"), Node("gpu2", "DOWN", frozenset({"NOT_RESPONDING"}), reason="Not responding")]
    runner, slurm, journal = make(tmp_path, nodes=UP, node_script=[half_dead] * 4 + [down], watchdog=2)
    assert runner.run([sys.executable, "-c", BLOCKED]) == r.EXIT_REQUEUED
    assert slurm.node_script == []  # it kept asking until the node was DOWN
    writes = [c for c in slurm.calls if c[0] in ("requeuehold", "update", "release")]
    assert writes == [("requeuehold", "42"), ("update", "42", {"ExcNodeList": "gpu2"}), ("release", "42")]
    rec = _requeue_record(journal)
    assert rec.evidence["cause"] == "hang" and rec.evidence["node"] == "gpu2"
    assert "last=hang@gpu2" in slurm.job.comment


def test_the_node_wait_is_bounded(tmp_path, monkeypatch):
    half_dead = [Node("gpu1", "MIXED"), Node("gpu2", "MIXED", frozenset({"NOT_RESPONDING"}))]
    monkeypatch.setattr(r, "NODE_SETTLE_BUDGET", 0.5)
    runner, slurm, journal = make(tmp_path, nodes=half_dead, watchdog=2)
    assert runner.run([sys.executable, "-c", BLOCKED]) == r.EXIT_REQUEUED
    assert _requeue_record(journal).evidence["node"] == "gpu2"  # still excluded: it is not responding


def test_watchdog_never_ends_a_job_that_writes_no_heartbeats(tmp_path):
    runner, slurm, journal = make(tmp_path, watchdog=1)
    code = runner.run([sys.executable, "-c", "import time; time.sleep(4)"])
    assert code == 0 and not list(journal.read(events=["job-hang"]))


def test_watchdog_never_ends_a_long_save(tmp_path):
    child = """
import time
from autoheal.sbatch_helpers import heartbeat, saving
for i in range(5):
    heartbeat(i)
    time.sleep(0.1)
with saving(5):
    time.sleep(4)
"""
    runner, slurm, journal = make(tmp_path, watchdog=1)
    assert runner.run([sys.executable, "-c", child]) == 0
    assert not list(journal.read(events=["job-hang"]))
    assert progress.read_heartbeats(tmp_path / "ck")[0].phase == "saved"


def test_watchdog_zero_is_off(tmp_path, monkeypatch):
    runner, slurm, journal = make(tmp_path, watchdog=0)
    child = BLOCKED.replace("time.sleep(300)", "time.sleep(4)")
    assert runner.run([sys.executable, "-c", child]) == 0
    assert not list(journal.read(events=["job-hang"]))


def test_options_reach_the_runner():
    opts = r.parse_args(["--hang-after-fault", "7", "--watchdog", "0", "--", "x"])
    assert (opts.hang_after_fault, opts.watchdog) == (7, 0)
    defaults = r.parse_args(["--", "x"])
    assert (defaults.hang_after_fault, defaults.watchdog) == (10, 300)
    assert "--watchdog" not in runner_argv(WrapperOptions())  # an older runner still reads the script
    argv = runner_argv(WrapperOptions(watchdog=120, hang_after_fault=5))
    assert argv[argv.index("--watchdog") + 1] == "120" and argv[argv.index("--hang-after-fault") + 1] == "5"


def test_the_cli_backend_lists_a_jobs_steps_with_squeue(tmp_path):
    import os

    from autoheal.slurm.cli_backend import CliSlurm

    squeue = tmp_path / "squeue"
    args = tmp_path / "args"
    squeue.write_text(f"#!/bin/sh\necho \"$@\" > {args}\nprintf '42.0 autoheal-memtier\\n42.1 python train.py\\n"
                      "42.batch batch\\n\\n'\n")
    os.chmod(squeue, 0o755)
    steps = CliSlurm(bin_dir=str(tmp_path), retries=0).job_steps("42")
    assert steps == [("42.0", "autoheal-memtier"), ("42.1", "python train.py"), ("42.batch", "batch")]
    assert args.read_text().split() == ["-h", "--steps", "--jobs=42", "-o", "%i", "%j"]


def test_a_hot_spare_swap_stops_a_hung_step_without_waiting_the_grace(tmp_path):
    runner, slurm, _ = make(tmp_path, hang_after_fault=1, grace=120)
    ck = tmp_path / "ck"
    ck.mkdir()
    env = {"PATH": "/usr/bin:/bin", "AUTOHEAL_CHECKPOINT_DIR": str(ck)}
    runner.checkpoint_dir = str(ck)
    runner.watch = r.HangWatch(str(ck), runner.hang_options())
    child = r.Child([sys.executable, "-c", BLOCKED], env, reap_all=False)
    try:
        deadline = time.monotonic() + 20
        while not (ck / "started").exists() and time.monotonic() < deadline:
            runner.watch.poll(None)
            time.sleep(0.05)
        runner._on_signal(int(signal.SIGUSR2), None)
        waited = runner._stop_step(child)  # the hot-spare path's stop (hotspare_runner)
    finally:
        child.signal(signal.SIGKILL)
    assert runner.hang_decision is not None and runner.hang_decision.verdict == "hung-after-fault"
    assert waited < 60 and not child.group_alive
    assert [c for c in slurm.calls if c[0] == "signal"] == [("signal", "42.1", "KILL", False, False)]


def test_a_job_slurm_already_restarted_elsewhere_still_names_the_node_that_stopped_this_run(tmp_path):
    # Lab (SlurmdTimeout 15 s): gpu2's slurmd died, Slurm marked it DOWN and requeued the job onto gpu1,gpu3
    # before the watchdog fired; the runner read the new allocation and recorded a hang with no node.
    runner, slurm, journal = make(tmp_path, watchdog=2)
    ckdir = tmp_path / "ck"

    def slurm_moves_the_job():
        deadline = time.monotonic() + 20
        while not (ckdir / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        slurm.nodes = [Node("gpu1", "MIXED"), Node("gpu2", "DOWN", frozenset({"NOT_RESPONDING"}),
                                                   reason="Not responding"), Node("gpu3", "MIXED")]
        slurm.job = replace(slurm.job, nodes=("gpu1", "gpu3"), restart_count=1)

    threading.Thread(target=slurm_moves_the_job, daemon=True).start()
    runner.run([sys.executable, "-c", BLOCKED])
    rec = _requeue_record(journal)
    assert rec.evidence["cause"] == "hang" and rec.evidence["node"] == "gpu2", rec.evidence
    assert "last=hang@gpu2" in slurm.job.comment, slurm.job.comment
    assert not any(c[0] in ("requeue", "requeuehold") for c in slurm.calls)  # Slurm requeued it already


class HotSlurm(FakeSlurm):
    """FakeSlurm with the hot-spare calls (a resize) and a 4-node cluster."""

    def shrink_job(self, job_id, keep):
        self.calls.append(("shrink", job_id, list(keep)))
        self.job = replace(self.job, nodes=tuple(keep))

    def set_node_count(self, job_id, low, high):
        self.calls.append(("numnodes", job_id, low, high))


# Blocked like BLOCKED; a run started after a swap finds its job requeued under it (srun refused: exit 1).
BLOCKED_THEN_REFUSED = """
import os, sys
if os.environ.get("AUTOHEAL_SWAP_COUNT"):
    sys.exit(1)
""" + BLOCKED


def test_a_hot_spare_job_slurm_requeued_during_the_wait_blames_the_faulty_node_never_the_spare(tmp_path, monkeypatch):
    # Lab, before hang detection ended blocked steps: XID 79 on gpu2 (active), grace signal, the runner chose
    # to swap in the spare gpu3 and waited for the blocked ranks; meanwhile the job was requeued (xid-watch's
    # own requeue at the end of its grace) and restarted on gpu1,gpu4. The runner "swapped" anyway (nothing
    # of the new allocation to release), ran the script again, saw it fail, judged its sets (gpu1,gpu3
    # active) by the new allocation: gpu3 "removed by Slurm", requeued and recorded last=node-failure@gpu3.
    drained = Node("gpu2", "MIXED", frozenset({"DRAIN"}), reason="autoheal: replace: xid 79 on GPU 0")
    nodes = [Node("gpu1", "MIXED"), drained, Node("gpu3", "IDLE"), Node("gpu4", "IDLE")]
    runner, _, journal = make(tmp_path, nodes=nodes, hang_after_fault=60, grace=120, spare_nodes=1, active_nodes=2)
    slurm = HotSlurm(replace(runner.slurm.job, nodes=("gpu1", "gpu2", "gpu3"), batch_host="gpu1"), nodes)
    runner.slurm = slurm
    ckdir = tmp_path / "ck"
    signal_when_started(runner, ckdir)

    def slurm_requeues_the_job():
        deadline = time.monotonic() + 20
        while runner.received is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the runner is waiting for the blocked step (its hang detection is 60 s away)
        slurm.job = replace(slurm.job, nodes=("gpu1", "gpu4"), restart_count=1)
        runner.child.signal(signal.SIGKILL)  # Slurm's requeue kills the steps

    threading.Thread(target=slurm_requeues_the_job, daemon=True).start()
    real_child = r.Child

    def keep_child(*a, **kw):  # the test's handle on the step, for Slurm's kill
        runner.child = real_child(*a, **kw)
        return runner.child

    monkeypatch.setattr(r, "Child", keep_child)
    code = runner.run([sys.executable, "-c", BLOCKED_THEN_REFUSED])
    recs = list(journal.read())
    assert not [x for x in recs if x.node == "gpu3"], [(x.event, x.node, x.message) for x in recs]
    assert "@gpu3" not in slurm.job.comment, slurm.job.comment
    assert "last=autoheal-drain@gpu2" in slurm.job.comment, slurm.job.comment
    assert code == r.EXIT_REQUEUED
    assert not [x for x in recs if x.event == "job-hot-swap"], recs  # the job had moved on: no swap in it
    assert not any(c[0] in ("requeue", "requeuehold", "shrink") for c in slurm.calls), slurm.calls
