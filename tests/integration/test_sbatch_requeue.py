"""``autoheal sbatch`` on a real lab cluster: drain/requeue/resume, restart budget, time limit, arrays.

One lab for the module (4 nodes, no spare, no hooks): the tests drain nodes and run several jobs at
once. The node side (xid-watch) is simulated the way it behaves: drain the node with an autoheal
reason, then ``scancel --signal=USR2 --batch``. When the lab's slurm.conf has no ``cred_expire`` yet,
the module adds ``AuthInfo=...,cred_expire=10`` so that a requeued job restarts in ~20 s, not ~121 s.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import wait_text

import autoheal.sbatch_helpers as sbh
from autoheal import nodeops
from autoheal.errors import SlurmError
from autoheal.journal import Journal
from autoheal.sbatch_helpers.checkpoint import CheckpointManager
from autoheal.slurm.cli_backend import CliSlurm
from autoheal_lab.cluster import Lab

TRAINER = Path(sbh.__file__).parent / "examples" / "tiny_trainer.py"
PY = sys.executable
REQUEUE_WAIT = 90  # seconds allowed from a requeue to the next run (cred_expire=10 gives ~20 s)
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")


def _tiny_trainer():
    spec = importlib.util.spec_from_file_location("tiny_trainer_for_tests", TRAINER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class SbLab:
    def __init__(self, lab: Lab):
        self.lab = lab
        self.layout = lab.layout()
        self.env = lab.slurm_env()
        self.slurm = CliSlurm(slurm_conf=str(self.layout.slurm_conf), env=self.env)
        self.journal = Journal(self._journal_path())

    def _journal_path(self) -> str:
        from autoheal.config import load_config

        return load_config(self.layout.autoheal_conf).journal.path

    def submit(self, workdir: Path, script: str, *wrapper_args: str) -> str:
        path = workdir / "job.sh"
        path.write_text(script)
        res = subprocess.run([PY, "-m", "autoheal.cli.main", "sbatch", *wrapper_args, "--parsable", str(path)],
                             cwd=workdir, env=self.env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, f"autoheal sbatch failed: {res.stderr}"
        return res.stdout.strip().split(";")[0]

    def job(self, job_id: str):
        return self.slurm.get_job(job_id)

    def wait_job(self, job_id: str, pred, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        job = None
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if pred(job):
                return job
            time.sleep(0.5)
        raise AssertionError(f"job {job_id}: {what} not reached within {timeout}s (last: {job})")



@pytest.fixture(scope="module")
def sblab(tmp_path_factory):
    from conftest import _require_slurm

    _require_slurm()
    lab = Lab(tmp_path_factory.mktemp("sbatchlab"))
    try:
        lab.up(nodes=4, gpus=2, spares=0, hooks=False, xid_watch=False, install=False)
        yield SbLab(lab)
    finally:
        lab.down()


@pytest.fixture(scope="module")
def time_limit_job(sblab, tmp_path_factory):
    """Submitted first so that its minute-long run overlaps the other tests (asserted at the end)."""
    wd = tmp_path_factory.mktemp("timelimit")
    script = (f"#!/bin/bash\n#SBATCH -w gpu4 --time=1 -o {wd}/out-%j.txt\n"
              f"{PY} {TRAINER} --steps 400 --step-seconds 0.1 --checkpoint-every 10\n")
    return wd, sblab.submit(wd, script, "--grace", "20")


def test_drain_requeues_multinode_job_away_from_node_and_resumes(sblab, time_limit_job, tmp_path):
    steps = 100
    script = (f"#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1 -o {tmp_path}/out-%j.txt\n#SBATCH --exclude=gpu4\n"
              f"srun {PY} {TRAINER} --steps {steps} --step-seconds 0.1 --checkpoint-every 5\n")
    jid = sblab.submit(tmp_path, script, "--grace", "30")
    out = tmp_path / f"out-{jid}.txt"
    wait_text(out, r"checkpoint saved step=(\d+)", 60, count=3)
    job = sblab.job(jid)
    assert job.comment.startswith("autoheal-runner"), job.comment
    bad = job.batch_host or job.nodes[0]
    try:
        nodeops.drain(sblab.slurm, bad, "autoheal: test: xid 79 on gpu 0")
        sblab.slurm.signal_job(jid, "USR2", batch=True)
        starts = wait_text(out, r"autoheal-trainer: start step=(\d+) .*restart=1 host=(\S+)", REQUEUE_WAIT, count=2)
        wait_text(out, r"autoheal-trainer: done step=(\d+) final_state=(\d+)", 60)
        done = sblab.wait_job(jid, lambda j: j.state in FINISHED, 30, "finished")
    finally:
        nodeops.resume(sblab.slurm, bad)
    text = out.read_text()
    assert done.state == "COMPLETED", text[-2000:]
    assert all(int(step) > 0 for step, _ in starts), starts
    assert bad not in {host for _, host in starts}, starts
    assert "reason=autoheal-drain" in text
    m = re.search(r"done step=(\d+) final_state=(\d+)", text)
    assert int(m.group(2)) == _tiny_trainer().expected_final_state(steps)
    assert {"gpu4", bad} <= set(done.excluded_nodes), done.excluded_nodes  # user's --exclude kept
    assert re.match(rf"autoheal-runner restarts=1 last=autoheal-drain@{bad} step=\d+ .*state=completed",
                    done.comment), done.comment
    recs = list(sblab.journal.read(job=jid, events=["job-requeue"]))
    assert recs and recs[0].evidence["cause"] == "autoheal-drain" and recs[0].node == bad


def _max_restarts_scenario(sblab: SbLab, wd: Path) -> dict:
    script = (f"#!/bin/bash\n#SBATCH -w gpu3 -o {wd}/out-%j.txt\n"
              f"{PY} {TRAINER} --steps 5000 --step-seconds 0.05 --checkpoint-every 10\n")
    jid = sblab.submit(wd, script, "--grace", "20", "--max-restarts", "1")
    out = wd / f"out-{jid}.txt"
    wait_text(out, r"checkpoint saved step=", 60)
    sblab.slurm.requeue(jid)  # from outside, like an admin or a preemption in REQUEUE mode
    first = wait_text(out, r"autoheal-trainer: start step=(\d+) .*restart=1 .*reason=(\S+)", REQUEUE_WAIT)
    wait_text(out, r"checkpoint saved step=", 60, count=len(re.findall("checkpoint saved", out.read_text())) + 1)
    sblab.slurm.requeue(jid)
    job = sblab.wait_job(jid, lambda j: j.state in FINISHED, REQUEUE_WAIT + 30, "the final state")
    return {"jid": jid, "first": first, "job": job, "text": out.read_text()}


def _no_progress_scenario(sblab: SbLab, wd: Path) -> dict:
    ck = wd / "ck"
    mgr = CheckpointManager(ck, keep=None, rank=0)
    mgr.save(5, b"five")
    torn = mgr.save(9, b"nine")
    (Path(torn) / "COMPLETE").unlink()  # the newest checkpoint is torn: must be skipped
    script = (f"#!/bin/bash\n#SBATCH -w gpu4 -o {wd}/out-%j.txt\n"
              "echo \"env restart=$AUTOHEAL_RESTART_COUNT resume=$AUTOHEAL_RESUME_FROM "
              "reason=$AUTOHEAL_REQUEUE_REASON\"\n"
              "trap '' USR2 TERM   # a script that ignores the grace signal and SIGTERM\n"
              "echo \"ignoring restart=$AUTOHEAL_RESTART_COUNT\"\n"
              "sleep 600\n")
    jid = sblab.submit(wd, script, "--grace", "5", "--checkpoint-dir", str(ck))
    out = wd / f"out-{jid}.txt"
    for restart in (0, 1):
        # the signal once the runner's child ignores it (it says so right after its trap)
        wait_text(out, rf"^ignoring restart={restart}$", REQUEUE_WAIT)
        sblab.slurm.signal_job(jid, "USR2", batch=True)
    job = sblab.wait_job(jid, lambda j: j.state in FINISHED, REQUEUE_WAIT + 30, "the final state")
    return {"jid": jid, "job": job, "text": out.read_text(), "ck": ck}


def test_restart_budget_max_restarts_and_no_progress(sblab, time_limit_job, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with ThreadPoolExecutor(2) as pool:  # two requeue cycles each: run them side by side
        fa = pool.submit(_max_restarts_scenario, sblab, tmp_path / "a")
        fb = pool.submit(_no_progress_scenario, sblab, tmp_path / "b")
        a, b = fa.result(), fb.result()

    # external requeue -> resumes; --max-restarts 1 -> the second restart stops with a clear state
    step, reason = a["first"][0]
    assert int(step) > 0 and reason == "external-requeue", a["first"]
    assert a["job"].state == "FAILED", a["text"][-2000:]
    assert "state=max-restarts" in a["job"].comment and "restarts=2" in a["job"].comment, a["job"].comment
    assert "exceeds --max-restarts 1" in a["text"]
    assert list(sblab.journal.read(job=a["jid"], events=["job-max-restarts"]))

    # the torn newest checkpoint is skipped; a script ignoring the signal is killed after the grace
    # window and still restarts; two restarts resuming from the same step stop the job (no progress)
    envs = re.findall(r"^env restart=(\d) resume=(\S*) reason=(\S*)", b["text"], re.M)
    assert [e[0] for e in envs] == ["0", "1"], b["text"][-2000:]
    assert all(e[1] == str(b["ck"] / "ckpt-00000005") for e in envs), envs
    assert envs[1][2] == "signal"
    assert "did not exit within 5s" in b["text"]
    assert b["job"].state == "FAILED" and "state=no-progress" in b["job"].comment, b["job"].comment
    assert "no progress" in b["text"]


def test_array_task_requeue_requeues_only_that_task(sblab, time_limit_job, tmp_path):
    script = (f"#!/bin/bash\n#SBATCH --array=0-1 -x gpu3,gpu4 -o {tmp_path}/out-%A_%a.txt\n"
              f"{PY} {TRAINER} --steps 200 --step-seconds 0.1 --checkpoint-every 5\n")
    jid = sblab.submit(tmp_path, script, "--grace", "20")
    out0, out1 = tmp_path / f"out-{jid}_0.txt", tmp_path / f"out-{jid}_1.txt"
    wait_text(out0, r"checkpoint saved", 60)
    wait_text(out1, r"checkpoint saved", 60)
    sblab.slurm.signal_job(f"{jid}_1", "USR2", batch=True)
    start = wait_text(out1, r"autoheal-trainer: start step=(\d+) .*restart=1 ", REQUEUE_WAIT)
    assert int(start[0]) > 0
    t0 = sblab.job(f"{jid}_0")
    t1 = sblab.job(f"{jid}_1")
    assert t0.restart_count == 0 and "restart=1" not in out0.read_text()
    assert t1.restart_count == 1 and "last=signal" in t1.comment, t1.comment
    for task in ("0", "1"):  # do not leave them running (a task may have finished already)
        with contextlib.suppress(SlurmError):
            sblab.slurm.signal_job(f"{jid}_{task}", "KILL")


def test_time_limit_checkpoints_and_requeues_before_the_end(sblab, time_limit_job):
    wd, jid = time_limit_job
    out = wd / f"out-{jid}.txt"
    start = wait_text(out, r"autoheal-trainer: start step=(\d+) .*restart=1 .*reason=(\S+)", 60 + REQUEUE_WAIT)
    assert int(start[0][0]) > 0 and start[0][1] == "time-limit", start
    wait_text(out, r"autoheal-trainer: done step=400 final_state=(\d+)", 60)
    job = sblab.wait_job(jid, lambda j: j.state in FINISHED, 30, "finished")
    text = out.read_text()
    assert job.state == "COMPLETED", text[-2000:]
    assert "TIME LIMIT" not in text and "DUE TO TIME" not in text
    assert "last=time-limit" in job.comment
