"""Hang detection on a real lab cluster (issue 23 §2, the runner's side).

Two ranks under srun write heartbeats through the checkpoint API, then block the way ranks blocked in
a collective do: no signal handler of theirs runs (here they ignore USR2 and TERM; only SIGKILL ends
them). The runner must end the step itself, without the batch shell (itself) being killed, and requeue
the job, whose second run completes. The fault lab (another test) makes real faults block the ranks;
this one needs no fake device: it checks the runner's half, squeue --steps and scancel of the steps
on real Slurm included.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import JobLab, cancel_job, module_lab, wait_for, wait_text

PY = sys.executable
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")
RANK = """
import os, signal, time
from autoheal.sbatch_helpers import heartbeat
restart = int(os.environ.get("AUTOHEAL_RESTART_COUNT", "0"))
rank = os.environ.get("SLURM_PROCID", "0")
print(f"rank {rank} start restart={restart} t={time.time():.3f}", flush=True)
signal.signal(signal.SIGUSR2, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
wait_for = os.environ.get("HANG_WAIT_FOR", "")  # heartbeat until this file exists, then block
i = 0
while i < 30 or (restart == 0 and wait_for and not os.path.exists(wait_for)):
    heartbeat(i)
    i += 1
    time.sleep(0.1)
if restart == 0:
    print(f"rank {rank} blocked t={time.time():.3f}", flush=True)
    time.sleep(900)
print(f"rank {rank} done", flush=True)
"""


class HangLab(JobLab):
    def submit(self, wd: Path, *wrapper_args: str, wait_for: str = "") -> str:
        (wd / "rank.py").write_text(RANK)
        (wd / "job.sh").write_text(f"#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1 -o {wd}/out-%j.txt\n"
                                   f"export HANG_WAIT_FOR={wait_for}\nsrun {PY} {wd}/rank.py\n")
        res = subprocess.run([PY, "-m", "autoheal.cli.main", "sbatch", *wrapper_args, "--parsable",
                              str(wd / "job.sh")], cwd=wd, env=self.env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return res.stdout.strip().split(";")[0]

    def wait_finished(self, jid: str, timeout: float):
        deadline = time.monotonic() + timeout
        job = self.slurm.get_job(jid)
        while job.state not in FINISHED and time.monotonic() < deadline:
            time.sleep(0.5)
            job = self.slurm.get_job(jid)
        return job


@pytest.fixture(scope="module")
def hlab(tmp_path_factory):
    # SlurmdTimeout=15: the slurmd-killed test waits for the node to go DOWN (the lab's usual 60 s was most
    # of this file's time); KillWait=5: Slurm completes a job with a dead node only after it
    with module_lab(tmp_path_factory, "hanglab", nodes=3, gpus=1, spares=0, hooks=False, xid_watch=False,
                    extra_conf=["SlurmdTimeout=15", "KillWait=5"]) as lab:
        yield HangLab(lab)


def _restart_delay(text: str, blocked_line: str) -> float:
    import re

    blocked = max(float(t) for t in re.findall(blocked_line, text))
    restarted = min(float(t) for t in re.findall(r"rank \d start restart=1 t=([\d.]+)", text))
    return restarted - blocked


def test_watchdog_ends_ranks_blocked_with_no_signal_and_the_job_resumes(hlab, tmp_path):
    jid = hlab.submit(tmp_path, "--watchdog", "5", "--grace", "60")
    out = tmp_path / f"out-{jid}.txt"
    wait_text(out, r"rank \d blocked", 90, count=2)
    wait_text(out, r"rank \d done", 180, count=2)
    job = hlab.wait_finished(jid, 60)
    text = out.read_text()
    assert job.state == "COMPLETED", text[-3000:]
    assert "last=hang " in job.comment + " ", job.comment
    hang = list(hlab.journal.read(job=jid, events=["job-hang"]))
    assert hang and hang[0].evidence["hang"] == "watchdog", text[-3000:]
    req = list(hlab.journal.read(job=jid, events=["job-requeue"]))
    assert req and req[0].evidence["cause"] == "hang"
    delay = _restart_delay(text, r"blocked t=([\d.]+)")
    print(f"watchdog 5 s: blocked -> next run started {delay:.1f} s")


def test_ranks_blocked_after_the_grace_signal_are_ended_before_the_grace(hlab, tmp_path):
    jid = hlab.submit(tmp_path, "--hang-after-fault", "3", "--grace", "120", "--watchdog", "0")
    out = tmp_path / f"out-{jid}.txt"
    wait_text(out, r"rank \d blocked", 90, count=2)
    signalled = time.time()
    hlab.slurm.signal_job(jid, "USR2", batch=True)  # what xid-watch sends the batch shell of a runner job
    wait_text(out, r"rank \d done", 180, count=2)
    job = hlab.wait_finished(jid, 60)
    text = out.read_text()
    assert job.state == "COMPLETED", text[-3000:]
    req = list(hlab.journal.read(job=jid, events=["job-requeue"]))
    assert req and req[0].evidence["hang"] == "hung-after-fault", text[-3000:]
    print(f"hang-after-fault 3 s, grace 120 s: the runner waited {req[0].evidence['waited']} s; "
          f"signal -> requeue record {req[0].time - signalled:.1f} s")


def test_watchdog_waits_for_a_node_whose_slurmd_died_then_requeues_away_from_it(hlab, tmp_path):
    """The pitfall of the first build: requeued while a node was NOT_RESPONDING, slurmctld restarted the
    job with a broken GRES allocation and every srun failed. The runner waits until the node is DOWN."""
    block = tmp_path / "block"
    jid = hlab.submit(tmp_path, "--watchdog", "5", "--grace", "60", wait_for=str(block))
    out = tmp_path / f"out-{jid}.txt"
    wait_text(out, r"rank \d start restart=0", 90, count=2)
    job = hlab.slurm.get_job(jid)
    batch = job.batch_host or job.nodes[0]
    victim = next(n for n in job.nodes if n != batch)
    os.kill(hlab.lab.records()[f"slurmd-{victim}"].pid, signal.SIGKILL)  # its ranks live on, unheard of
    try:
        wait_for(lambda: not hlab.slurm.get_node(victim).responding, 120, f"{victim} NOT_RESPONDING")
        block.write_text("now")  # the ranks block: no fault signal comes, only the watchdog can tell
        wait_text(out, r"rank \d done", 420, count=2)
        done = hlab.wait_finished(jid, 60)
        text = out.read_text()
        assert done.state == "COMPLETED", text[-3000:]
        # Slurm itself requeues the job once the node is DOWN (node failure): the runner records it and
        # names the node; a DOWN node is not picked for the next run either way
        assert victim not in done.nodes, done
        assert f"last=hang@{victim}" in done.comment, done.comment
        # with SlurmdTimeout=15 the node is often DOWN (Slurm requeues the job itself) by the time the runner
        # has ended the step (its scancel waits on the dead slurmd): either the runner waited for DOWN, or it
        # found Slurm had requeued the job; the wait itself is test_runner_hang's
        assert re.search(rf"node\(s\) {victim} not responding: waiting|was requeued by Slurm.*\(hang@{victim}\)",
                         text), text[-3000:]
        req = list(hlab.journal.read(job=jid, events=["job-requeue"]))
        assert req and req[0].evidence["cause"] == "hang" and req[0].evidence["node"] == victim, req
        blocked = max(float(t) for t in re.findall(r"blocked t=([\d.]+)", text))
        print(f"slurmd of {victim} killed, ranks blocked: next run started "
              f"{_restart_delay(text, r'blocked t=([0-9.]+)'):.1f} s after the block; requeue record "
              f"{req[0].time - blocked:.1f} s after it (SlurmdTimeout 15 s)")
    finally:
        cancel_job(hlab.env, jid)
        hlab.lab.start_slurmd(victim)
        wait_for(lambda: hlab.slurm.get_node(victim).responding, 90, f"{victim} responding again")
        node = hlab.slurm.get_node(victim)
        if node.down:
            hlab.slurm.resume(victim)
