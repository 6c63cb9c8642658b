"""A job flood on a real lab (issue 25, item 5): 10,000 held jobs submitted as an unprivileged user, each
with 4.3 kB of user text (lab/autoheal_lab/flood.py: a 1,024-character comment, Slurm's limit, that looks
like autoheal's own, plus a long job name and output and error paths). The lab's guard and xid-watch
must still do their work: xid-watch requeues the job on a node with an XID 79, the guard releases a job a
killed runner left held by its requeue. Before the fix every look-up of theirs was `squeue --json` of
the whole cluster (22.05's JSON ignores every filter): 70 MB, about 5 s of squeue and 2 s of parsing per
look-up on this machine, past the adapter's timeout. On 26.05 (forky chroot) the filtered JSON of the
pending jobs alone took 15 s (188 MB): listings read squeue's text on every version since (issue 28).

Each test prints what it measured (flood submission, time to requeue, time to release)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import cancel_job, wait_epilogs_done, wait_for

from autoheal_lab import flood
from autoheal_lab.fakenvml import state as gstate
from autoheal_lab.gpus import inject

FLOOD = 10_000


@pytest.fixture(scope="module")
def flood_lab():
    from conftest import _start

    # the flood user must read slurm.conf and reach munged, as any user of a real cluster can: not under
    # pytest's private (0700) tmp directory
    root = Path(tempfile.mkdtemp(prefix="autoheal-floodlab-"))
    root.chmod(0o755)
    try:
        handle = _start(root, nodes=3, gpus=2, spares=0, extra_conf=flood.FLOOD_CONF)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        t0 = time.monotonic()
        ids = flood.submit(handle.env, FLOOD)
        print(f"\nflood lab: {len(ids)} held jobs submitted as nobody in {time.monotonic() - t0:.0f}s")
        yield handle
    finally:
        flood.cancel(handle.env)
        handle.lab.down()
        shutil.rmtree(root, ignore_errors=True)


def _sbatch(handle, *args):
    res = subprocess.run(["sbatch", "--parsable", "-N1", "--requeue", "-o", "/dev/null", *args, "--wrap", "sleep 600"],
                         env=handle.env, capture_output=True, text=True, timeout=60, cwd="/tmp")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def _flood_intact(slurm):
    pending = slurm.list_jobs(states=["PENDING"])
    mine = [j for j in pending if j.user == flood.flood_user().pw_name]
    assert len(mine) == FLOOD and all(j.held for j in mine)  # never released, requeued or touched


def test_reads_answer_within_the_adapter_timeout_under_the_flood(flood_lab):
    # 3 s and no retry: the old whole-cluster JSON took longer than that for any single look-up
    slurm = flood_lab.adapter(timeout=3.0, retries=0)
    job = _sbatch(flood_lab, "-w", "gpu1", "--comment", "autoheal-runner state=running")
    try:
        wait_for(lambda: slurm.get_job(job).running, 60, f"job {job} to run")
        on_node = slurm.list_jobs(node="gpu1")
        assert [j.job_id for j in on_node] == [job]  # the flood's jobs (none on a node) are not even listed
        _flood_intact(slurm)
    finally:
        cancel_job(flood_lab.env, job)


def _heal(handle, node):
    wait_epilogs_done(handle.env, node)
    for gpu in range(handle.layout.gpus):
        gstate.inject(handle.layout.gpu_state(node), gpu, "clear")
    env = dict(handle.env, **handle.lab.node_env(node))
    subprocess.run([sys.executable, "-m", "autoheal.cli.main", "check", "--clear-faults", "--node", node], env=env,
                   capture_output=True, timeout=60)
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=handle.env, capture_output=True,
                   timeout=30)


def test_xid_watch_requeues_the_job_of_a_faulted_node_under_the_flood(flood_lab):
    slurm = flood_lab.adapter(timeout=30.0)
    job = _sbatch(flood_lab, "-w", "gpu2")
    try:
        wait_for(lambda: slurm.get_job(job).running, 60, f"job {job} to run")
        t0 = time.monotonic()
        inject(flood_lab.lab, "gpu2", 1, "xid", xid=79)
        # hooks.grace_seconds is 10 s in the lab; the signal, the grace and the requeue, with room for a
        # loaded machine
        wait_for(lambda: slurm.get_job(job).restart_count >= 1, 90, f"xid-watch to requeue job {job}", step=0.5)
        print(f"\nflood lab: XID 79 -> job {job} requeued in {time.monotonic() - t0:.1f}s")
        assert slurm.get_node("gpu2").drain
        _flood_intact(slurm)
    finally:
        _heal(flood_lab, "gpu2")
        cancel_job(flood_lab.env, job)


def test_guard_releases_a_job_left_held_by_a_killed_runner_under_the_flood(flood_lab):
    slurm = flood_lab.adapter(timeout=30.0)
    job = _sbatch(flood_lab, "-w", "gpu3", "--comment", "autoheal-runner state=running")
    try:
        wait_for(lambda: slurm.get_job(job).running, 60, f"job {job} to run")
        # what a runner killed right after its hold leaves: the intent in the comment, the job requeue-held
        slurm.set_job_comment(job, "autoheal-runner state=requeueing excl=gpu3")
        t0 = time.monotonic()
        slurm.requeue(job, hold=True)
        wait_for(lambda: slurm.get_job(job).requeue_held, 30, "the requeue hold")
        # the lab's guard: every second, releasing after 3 s held
        try:
            released = wait_for(lambda: (lambda j: j if "guard=released" in j.comment and not j.held else None)(
                slurm.get_job(job)), 90, f"the guard to release job {job}", step=0.5)
        except AssertionError as exc:
            log = flood_lab.root / "log" / "guard.log"
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else ["(no guard.log)"]
            raise AssertionError(f"{exc}\nguard.log:\n" + "\n".join(tail)) from None
        print(f"\nflood lab: requeue hold -> released by the guard in {time.monotonic() - t0:.1f}s")
        assert released.state == "PENDING" or released.running
        wait_for(lambda: slurm.get_job(job).running, 120, f"job {job} to run again", step=1.0)
        print(f"flood lab: requeue hold -> running again in {time.monotonic() - t0:.1f}s")
        _flood_intact(slurm)
    finally:
        cancel_job(flood_lab.env, job)
