"""The peer-memory checkpoint tier on a real lab cluster: a node dies (``kill -9`` of its slurmd and every
process on it, and its memory wiped), its peer's copy serves the restart, and at most K steps are lost.

One lab for the module: 4 nodes, each with its own loopback address (Slurm's NodeAddr), the hooks (the
epilog frees the copies), ``SlurmdTimeout=10``. The tiny trainer runs on 2 nodes with the durable tier
every 1000 steps (never reached) and the memory tier every K steps, so whatever it resumes from came out
of memory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cancel_job, wait_for, wait_text

import autoheal.sbatch_helpers as sbh
from autoheal import memtier_files
from autoheal.slurm.cli_backend import CliSlurm
from autoheal_lab.cluster import Lab

TRAINER = Path(sbh.__file__).parent / "examples" / "tiny_trainer.py"
PY = sys.executable
K = 2
START = r"(\d+): autoheal-trainer: start step=(\d+) resumed_from=(\S+) restart=(\d+) host=(\S+) .*reason=(\S+)"


class MtLab:
    def __init__(self, lab: Lab):
        self.lab = lab
        self.layout = lab.layout()
        self.env = dict(lab.slurm_env(), AUTOHEAL_MEMORY_TIER="1")
        self.slurm = CliSlurm(slurm_conf=str(self.layout.slurm_conf), env=self.env)

    def submit(self, workdir: Path, *extra: str):
        script = workdir / "job.sh"
        script.write_text(f"#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1 -o {workdir}/out.txt\n"
                          f"srun -l {PY} {TRAINER} --steps 100000 --step-seconds 0.1 --checkpoint-every 1000 "
                          f"--memory-every {K}\n")
        res = subprocess.run([PY, "-m", "autoheal.cli.main", "sbatch", "--grace", "30", *extra, "--parsable",
                              str(script)], cwd=workdir, env=self.env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        jid = res.stdout.strip().split(";")[0]
        out = workdir / "out.txt"
        wait_text(out, r"memory tier: agents on (\S+)", 90)
        wait_text(out, r"1: autoheal-trainer: memory saved step=(\d+) nodes=\S+,\S+", 90, count=5)
        return jid, out

    def memory_dirs(self, jid: str):
        return {n: memtier_files.job_dir(n, os.geteuid(), jid, self.env).exists() for n in self.layout.all_nodes}


@pytest.fixture(scope="module")
def mtlab(tmp_path_factory):
    from conftest import _require_slurm

    _require_slurm()
    lab = Lab(tmp_path_factory.mktemp("memtierlab"))
    try:
        lab.up(nodes=4, gpus=1, spares=0, hooks=True, xid_watch=False, install=False,
               extra_conf=["SlurmdTimeout=10"])
        yield MtLab(lab)
    finally:
        lab.down()


def _last_step(text: str, rank: str) -> int:
    return max(int(s) for s in re.findall(rf"^{rank}: autoheal-trainer: step=(\d+)$", text, re.M))


def _agents_of(jid: str):
    out = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if b"memtier_agent" in cmd and f"SLURM_JOB_ID={jid}".encode() in env:
            out.append(int(pid))
    return out


def _victim(mtlab, jid):
    job = mtlab.slurm.get_job(jid)
    return job, next(n for n in job.nodes if n != job.batch_host)


def _heal(mtlab, node):
    mtlab.lab.start_slurmd(node)
    wait_for(lambda: mtlab.slurm.get_node(node).responding, 60, f"{node} responding again")
    n = mtlab.slurm.get_node(node)
    if n.drain or n.down:
        mtlab.slurm.resume(node)


def test_node_killed_hot_spare_resumes_from_the_peers_memory(mtlab, tmp_path):
    jid, out = mtlab.submit(tmp_path, "--spare-nodes", "1")
    job = mtlab.slurm.get_job(jid)
    active = wait_text(out, r"hot spares: steps run on (\S+);", 10)[0].split(",")
    victim = next(n for n in active if n != job.batch_host)
    rank = [r for r, _, _, _, h, _ in wait_text(out, START, 10, count=2) if h == victim][0]
    try:
        mtlab.lab.crash_node(victim)
        assert not mtlab.memory_dirs(jid)[victim]  # its memory went with it
        starts = wait_text(out, START, 120, count=4)[2:]
        text = out.read_text()
        lost = _last_step(text.split("hot-spare-swap")[0], rank)  # the victim rank's last step before the swap
        moved = next(s for s in starts if s[0] == rank)
        assert moved[5] == "hot-spare-swap" and moved[4] != victim, starts
        assert moved[2].startswith("memory:") and victim not in moved[2], moved  # not from the dead node
        assert lost - int(moved[1]) <= K, (lost, moved)
    finally:
        cancel_job(mtlab.env, jid)
        _heal(mtlab, victim)
    wait_for(lambda: mtlab.slurm.get_job(jid).state not in ("RUNNING", "COMPLETING"), 120, "the job to end")
    wait_for(lambda: not any(mtlab.memory_dirs(jid).values()) and not _agents_of(jid), 60,
             "the epilogs to free the copies and the agents to end")


def _copies(mtlab, node, jid, rank):
    d = memtier_files.job_dir(node, os.geteuid(), jid, mtlab.env)
    try:
        names = os.listdir(d)
    except OSError:
        return []
    return sorted(int(n[8:16]) for n in names if n.startswith(f"r{int(rank):05d}-s") and n.endswith(".copy"))


def test_node_killed_requeue_keeps_the_survivors_copies_and_loses_at_most_k_steps(mtlab, tmp_path):
    """Slurm requeues the job off the dead node; the survivor's epilog keeps the job's copies (it is
    PENDING), the new run on the survivor and a fresh node reaches them, and once the job is over the
    survivor's next epilog frees them.

    In today's lab the surviving rank is not blocked in a collective and saves a durable checkpoint on
    Slurm's SIGTERM, which is then the newest: the restart takes whichever is newer, never an older one."""
    spare = mtlab.layout.all_nodes[-1]
    mtlab.slurm.drain(spare, "memtier test: the requeue must land on the survivor")
    mtlab.env["AUTOHEAL_MEMTIER_COPIES"] = "500"  # run 0's copies stay in sight after the restart
    try:
        jid, out = mtlab.submit(tmp_path)
    finally:
        del mtlab.env["AUTOHEAL_MEMTIER_COPIES"]
    job, victim = _victim(mtlab, jid)
    rank = [r for r, _, _, _, h, _ in wait_text(out, START, 10, count=2) if h == victim][0]
    try:
        mtlab.lab.crash_node(victim)
        starts = wait_text(out, START, 240, count=4)[2:]
        before = out.read_text().split(" restart=1 ")[0]
        assert {s[3] for s in starts} == {"1"} and {s[4] for s in starts} == {job.batch_host, "gpu3"}, starts
        # rank `rank` replicated its state to the survivor in run 0; the requeue's epilog kept it there
        kept = [s for s in _copies(mtlab, job.batch_host, jid, rank) if s <= _last_step(before, rank)]
        assert kept and max(kept) >= _last_step(before, rank) - K, kept
        resumed = {s[0]: int(s[1]) for s in starts}
        lost = {r: _last_step(before, r) - resumed[r] for r in resumed}
        assert max(lost.values()) <= K, (lost, starts)
    finally:
        cancel_job(mtlab.env, jid)
        _heal(mtlab, victim)
        mtlab.slurm.resume(spare)
    wait_for(lambda: mtlab.slurm.get_job(jid).state not in ("RUNNING", "COMPLETING", "PENDING"), 120, "job end")
    wait_for(lambda: not any(mtlab.memory_dirs(jid).values()) and not _agents_of(jid), 60,
             "the epilogs to free the copies and the agents to end")


def test_an_over_jobs_copies_are_freed_where_no_epilog_of_it_comes_again(mtlab, tmp_path):
    """A requeued job's epilogs keep its copies on its nodes for its next run; when that run never comes
    there (it ran on other nodes, or the job was held and cancelled, as here), no epilog of that job
    frees them. The next job's prolog on such a node frees them before that job starts (the bench saw a
    node holding a cancelled job's 4 copies beside the running job's 4), and the healthcheck frees them
    on a node that runs nothing."""
    first, second, *others = mtlab.layout.all_nodes
    for node in others:  # the job lands on `first` and `second`
        mtlab.slurm.drain(node, "memtier test: the job must land on the first two nodes")
    try:
        jid, _ = mtlab.submit(tmp_path)
        mtlab.slurm.requeue(jid, hold=True)
        wait_for(lambda: mtlab.slurm.get_job(jid).state not in ("RUNNING", "COMPLETING"), 120, "the requeue")
        assert mtlab.memory_dirs(jid)[first] and mtlab.memory_dirs(jid)[second]  # kept for its next run
        cancel_job(mtlab.env, jid)
        kept = mtlab.memory_dirs(jid)
        assert kept[first] and kept[second], kept  # over, and no epilog of it comes to free them
        where = memtier_files.job_dir(first, os.geteuid(), jid, mtlab.env)
        script = tmp_path / "next.sh"
        script.write_text(f"#!/bin/bash\n#SBATCH -N 1 -w {first} -o {tmp_path}/next.txt\n"
                          f"test -e {where} && echo copies-of-{jid}-present || echo copies-of-{jid}-absent\n")
        subprocess.run(["sbatch", str(script)], env=mtlab.env, check=True, capture_output=True, timeout=30)
        wait_text(tmp_path / "next.txt", rf"copies-of-{jid}-absent|copies-of-{jid}-present", 90)
        assert f"copies-of-{jid}-absent" in (tmp_path / "next.txt").read_text()  # the prolog freed them
        # `second` runs nothing: its healthcheck (every HealthCheckInterval, 30 s in the lab) frees them
        wait_for(lambda: not mtlab.memory_dirs(jid)[second], 120, f"the healthcheck on {second} to free them")
    finally:
        for node in others:
            mtlab.slurm.resume(node)
