"""The fault reaches a real PyTorch job as on real hardware, and it resumes losing what its tier promises.

Opt-in (``pytest -m torch``): torch is large and CI does not install it; without it the file skips.
The lab is the one of test_faults_reach_job_lab.py (3 nodes x 2 fake GPUs, hooks and xid-watch,
``SlurmdTimeout=10``, ``KillWait=5``, a 3 s grace). The DDP trainer (gloo, CPU) runs 2 ranks on 2 nodes
under ``autoheal sbatch`` with ``--device lab``: the forward pass, the backward pass and the optimizer
step are "GPU calls" on the step's fake GPU, and DDP's gradient all-reduce (gloo, inside ``backward()``)
is the real collective, met as NCCL's (a dead peer blocks it until the timeout; a link down hangs it).
Per fault kind, on the GPU of the rank that is not on the batch host:

- XID 79: that rank's next GPU call fails (``device error``), it cannot save; its peer blocks;
- uncorrectable ECC: that rank aborts; its peer blocks;
- NVLink down: the collective hangs on both ranks;
- node killed: ``kill -9`` of the node's slurmd and every process on it; the peer blocks.

The job must resume from its newest durable checkpoint (every ``EVERY`` steps), finish with the weights
of an uninterrupted run (a digest of the final state dict, from a 2-process run outside Slurm), and
lose at most ``EVERY`` steps (measured from the trainer's own output).

With the peer-memory tier (``AUTOHEAL_MEMORY_TIER=1``, every ``MEMORY_K`` steps) and a hot spare, XID 79
on the rank that is not on the batch host: the spare takes its place inside the allocation, every rank
resumes from a memory copy (none from the lost node's), at most ``MEMORY_K`` steps are lost, and the
weights are the uninterrupted run's.

Lightning (its own ``SLURMEnvironment`` requeue on USR2 kept) on XID 79 under ``autoheal sbatch``: the
GPU is gone before its handler could copy the weights off it, so the run fails, the runner requeues it
and it resumes from its own newest valid checkpoint (one per epoch; a torn ``hpc_ckpt`` planted beside it,
newer, is skipped), with the weights of an uninterrupted run.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import cancel_job, module_lab, wait_for, wait_text

import autoheal.sbatch_helpers as sbh
from autoheal_lab.gpus import inject
from autoheal_lab.lostwork import resumes

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from test_faults_reach_job_lab import FaultLab, _break  # noqa: E402 (the same lab and faults, after the skip)

EXAMPLES = Path(sbh.__file__).parent / "examples"
DDP = EXAMPLES / "ddp_trainer.py"
PY = sys.executable
STEPS = 48
EVERY = 6  # durable checkpoint interval
MEMORY_K = 2  # memory tier interval (not 1: a copy older than the newest step must be what is resumed)
START = r"^(\d+): autoheal-trainer: start step=(\d+) resumed_from=(\S+) restart=(\d+) host=(\S+) "
DONE = r"^(\d+): autoheal-trainer: done step=(\d+) loss=\S+ final_state=([0-9a-f]+)$"
THREADS = {"OMP_NUM_THREADS": "1"}  # the same arithmetic inside and outside Slurm, whatever the CPU binding
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")
MEASURED = {}
TIMES = {}


@pytest.fixture(scope="module")
def tlab(tmp_path_factory):
    try:
        with module_lab(tmp_path_factory, "torchfaults", nodes=3, gpus=2, spares=0, hooks=True, xid_watch=True,
                        extra_conf=["SlurmdTimeout=10", "KillWait=5"],  # why: test_faults_reach_job_lab.py's fixture
                        hooks_conf={"grace_seconds": 3.0}) as lab:
            yield FaultLab(lab)
    finally:
        print(f"\nlost steps measured: {MEASURED}\nseconds per test: {TIMES}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> str:
    """The final-state digest of the same training run uninterrupted: 2 ranks on this machine, no Slurm,
    no device, no checkpoints."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2", **THREADS)
    for key in [k for k in env if k.startswith(("SLURM_", "AUTOHEAL_"))]:
        del env[key]
    procs = [subprocess.Popen([PY, str(DDP), "--steps", str(STEPS), "--timeout", "120"],
                              env=dict(env, RANK=str(rank)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    digests = {m.group(1) for out, _ in outs for m in re.finditer(r"done step=48 loss=\S+ final_state=(\S+)", out)}
    assert len(digests) == 1, outs
    return digests.pop()


def _submit(tlab: FaultLab, workdir: Path, memory_every: int = 0, spares: int = 0) -> tuple:
    """Submit the 2-rank DDP job under ``autoheal sbatch`` (``memory_every``: with the memory tier every K
    steps; ``spares``: hot spares); return (job id, output, victim node, victim rank, victim GPU) once a
    durable checkpoint exists and training is past it."""
    env = dict(tlab.env, AUTOHEAL_MEMORY_TIER="1") if memory_every else tlab.env
    script = workdir / "job.sh"
    script.write_text(
        f"#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1 --gres=gpu:1 -o {workdir}/out.txt\n"
        "export MASTER_ADDR=127.0.0.1 OMP_NUM_THREADS=1\n"  # every lab node is this machine
        f"srun -l {PY} {DDP} --steps {STEPS} --step-seconds 0.15 --checkpoint-every {EVERY} "
        f"--device lab --timeout 600 --memory-every {memory_every}\n")
    extra = ["--spare-nodes", str(spares)] if spares else []
    res = subprocess.run([PY, "-m", "autoheal.cli.main", "sbatch", "--grace", "5", *extra, "--parsable", str(script)],
                         cwd=workdir, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    jid = res.stdout.strip().split(";")[0]
    out = workdir / "out.txt"
    starts = wait_text(out, START, 180, count=2)
    job = tlab.slurm.get_job(jid)
    rank, _, _, _, victim = next(s for s in starts if s[4] != job.batch_host)
    gpu = int(wait_text(out, rf"^{rank}: autoheal-trainer: device lab gpus=(\d+)$", 30)[0])
    wait_text(out, rf"checkpoint saved step={EVERY}", 90)
    wait_text(out, rf"^0: autoheal-trainer: step={EVERY + 2} ", 60)  # between two durable saves
    return jid, out, victim, rank, gpu


def _wait_completed(tlab: FaultLab, jid: str) -> None:
    """The job ends by itself (the ranks leave the process group together), COMPLETED."""
    def state():
        job = tlab.slurm.get_job(jid)
        return job.state if job.state in FINAL else None

    got = wait_for(state, 90, f"job {jid} ended", step=0.5)
    assert got == "COMPLETED", got


EVIDENCE = {"xid79": r"device error step=\d+ error=CUDA_error:\S+fallen_off_the_bus", "ecc": None,
            "nvlink": None, "node-killed": None}


def _judge(text: str, rank: str, kind: str, digest: str) -> int:
    """Resumed (every rank) from the newest durable save, finished with the uninterrupted weights."""
    run0 = text.split(" restart=1 ")[0]
    if EVIDENCE[kind]:
        assert re.search(rf"^{rank}: autoheal-trainer: {EVIDENCE[kind]}", run0, re.M), run0[-3000:]
    assert not re.search(rf"^{rank}: autoheal-trainer: checkpoint saved", run0, re.M)  # rank 0 alone saves
    saved = [int(s) for s in re.findall(r"checkpoint saved step=(\d+)", run0)]
    (resume, *_more) = resumes(text)
    assert set(resume.resumed) == {"0", "1"} and set(resume.resumed.values()) == {max(saved)}, (resume, saved)
    finals = re.findall(DONE, text, re.M)
    assert sorted(finals) == [(r, str(STEPS), digest) for r in ("0", "1")], (finals, digest, text[-3000:])
    return resume.lost


@pytest.mark.parametrize("kind", ["xid79", "ecc", "nvlink", "node-killed"])
def test_ddp_fault_reaches_the_job_and_it_resumes_losing_at_most_the_durable_interval(
        tlab, uninterrupted, tmp_path, kind):
    t0 = time.monotonic()
    jid, out, victim, rank, gpu = _submit(tlab, tmp_path)
    try:
        _break(tlab, kind, victim, gpu)
        wait_text(out, r"restart=1 ", 180)
        wait_text(out, r"done step=\d+ loss=\S+ final_state=", 180, count=2)
        lost = _judge(out.read_text(), rank, kind, uninterrupted)
        MEASURED[f"ddp-{kind}"] = lost
        assert 0 <= lost <= EVERY, (kind, lost)
        _wait_completed(tlab, jid)
    finally:
        cancel_job(tlab.env, jid)
        tlab.heal(victim)
        TIMES[f"ddp-{kind}"] = round(time.monotonic() - t0, 1)


def test_ddp_with_the_memory_tier_and_a_hot_spare_loses_at_most_k_steps_on_xid79(tlab, uninterrupted, tmp_path):
    """XID 79 between two durable saves, with memory copies every MEMORY_K steps and one hot spare: the
    rank on the lost GPU cannot save, its peer blocks in DDP's all-reduce; the runner ends the step, swaps
    the spare in (no requeue) and every rank resumes from memory, losing at most MEMORY_K steps."""
    t0 = time.monotonic()
    jid, out, victim, rank, gpu = _submit(tlab, tmp_path, memory_every=MEMORY_K, spares=1)
    try:
        # both ranks hold a memory copy newer than the durable checkpoint at EVERY (each on two nodes)
        wait_text(out, rf"^\d: autoheal-trainer: memory saved step={EVERY + 2} nodes=\S+,\S+$", 30, count=2)
        _break(tlab, "xid79", victim, gpu)
        wait_text(out, START, 180, count=4)
        wait_text(out, DONE, 180, count=2)
        lost = _judge_memory(out.read_text(), rank, victim, uninterrupted)
        MEASURED["ddp-xid79+memory+spare"] = lost
        assert 0 <= lost <= MEMORY_K, lost
        _wait_completed(tlab, jid)
    finally:
        cancel_job(tlab.env, jid)
        tlab.heal(victim)
        TIMES["ddp-xid79+memory+spare"] = round(time.monotonic() - t0, 1)


def _judge_memory(text: str, rank: str, victim: str, digest: str) -> int:
    """The broken rank failed without saving; the restart ran inside the allocation (restart count 0, the
    lost node not in it) with every rank from a memory copy at least as new as the newest durable save,
    none of them from the lost node; the final weights are the uninterrupted run's. Returns the lost steps."""
    starts = list(re.finditer(START, text, re.M))
    assert len(starts) >= 4, text[-3000:]
    run0, run1 = text[:starts[2].start()], starts[2:4]
    assert re.search(rf"^{rank}: autoheal-trainer: {EVIDENCE['xid79']}", run0, re.M), run0[-3000:]
    saved = [int(s) for s in re.findall(r"checkpoint saved step=(\d+)", run0)]
    (resume, *_more) = resumes(text)
    assert set(resume.resumed) == {"0", "1"} and len(set(resume.resumed.values())) == 1, resume
    assert min(resume.resumed.values()) >= max(saved), (resume, saved)
    for st in run1:  # (rank, step, resumed_from, restart, host)
        assert st.group(3).startswith("memory:") and not st.group(3).endswith(f"@{victim}"), st.group(0)
        assert st.group(4) == "0" and st.group(5) != victim, st.group(0)  # the spare, not a requeue
    finals = re.findall(DONE, text, re.M)
    assert sorted(finals) == [(r, str(STEPS), digest) for r in ("0", "1")], (finals, digest, text[-3000:])
    return resume.lost


LIGHTNING_START = r"lightning-job: start global_step=(\d+) node=(\S*) restart=(\d+)"


def _no_slurm_env() -> dict:
    env = dict(os.environ, **THREADS)
    for key in [k for k in env if k.startswith(("SLURM_", "AUTOHEAL_"))]:
        del env[key]
    return env


@pytest.fixture(scope="module")
def lightning_uninterrupted(tmp_path_factory) -> str:
    """The final weights' digest of the Lightning recipe run uninterrupted on this machine (no Slurm)."""
    pytest.importorskip("lightning")
    root = tmp_path_factory.mktemp("lightning-ref")
    res = subprocess.run([PY, str(EXAMPLES / "lightning_job.py"), "--epochs", "3", "--log-every", "0", "--root",
                          str(root)], env=_no_slurm_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return re.search(r"lightning-job: done global_step=384 final_state=(\S+)", res.stdout).group(1)


def test_lightning_on_xid79_cannot_save_on_the_signal_and_resumes_from_its_own_regular_checkpoint(
        tlab, lightning_uninterrupted, tmp_path):
    """Lightning keeps its own handling (``SLURMEnvironment(auto_requeue=True)`` on USR2), submitted with
    ``autoheal sbatch``. The GPU fell off the bus: the next step's GPU call fails, and so would the
    handler's copy of the weights, so no ``hpc_ckpt`` is written; the runner requeues the job away from
    the node and it resumes from its regular (per-epoch) checkpoint, ending with the uninterrupted weights."""
    t0 = time.monotonic()
    for name in ("lightning_job.py", "lightning_job.sbatch"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    script = tmp_path / "lightning_job.sbatch"
    text = script.read_text()
    old = "lightning_job.py --root"
    assert old in text
    # paced so that the fault lands in the second epoch; --device lab: the lab's GPU (what the lab changes)
    script.write_text(text.replace(old, "lightning_job.py --epochs 3 --step-seconds 0.03 --log-every 1 "
                                        "--device lab --root"))
    env = dict(tlab.env, PATH=os.path.dirname(PY) + os.pathsep + tlab.env.get("PATH", ""), **THREADS)
    res = subprocess.run([PY, "-m", "autoheal.cli.main", "sbatch", "--parsable", str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    jid = res.stdout.strip().splitlines()[-1].split(";")[0]
    out = tmp_path / f"lightning-{jid}.out"
    node = ""
    try:
        gpu = int(wait_text(out, r"^lightning-job: device lab gpus=(\d+)$", 180)[0])
        wait_text(out, r"lightning-job: checkpoint global_step=128\b", 180)
        wait_text(out, r"lightning-job: global_step=140\b", 60)
        # what a save on the signal killed half way leaves (Lightning copies its temporary file into the
        # final name): a torn hpc_ckpt, newer than the regular checkpoint. Lightning's own hpc resume
        # would pick it and fail; the recipe must skip it for the regular one.
        (regular,) = (tmp_path / "lightning-runs" / "checkpoints").glob("*.ckpt")
        torn = tmp_path / "lightning-runs" / "hpc_ckpt_1.ckpt"
        torn.write_bytes(regular.read_bytes()[:regular.stat().st_size // 2])
        node = tlab.slurm.get_job(jid).batch_host
        inject(tlab.lab, node, gpu, "xid", xid=79)
        wait_text(out, r"lightning-job: start global_step=\d+ node=\S* restart=1\b", 240)
        wait_text(out, r"lightning-job: done global_step=\d+ final_state=", 240)
        _wait_completed(tlab, jid)
        lost = _judge_lightning(out.read_text(), node, lightning_uninterrupted)
        MEASURED["lightning-xid79"] = lost
    finally:
        cancel_job(tlab.env, jid)
        if node:
            tlab.heal(node)
        TIMES["lightning-xid79"] = round(time.monotonic() - t0, 1)


def _judge_lightning(text: str, node: str, digest: str) -> int:
    """The run on the lost GPU ended with a device error and no save after the fault; the next run, on
    another node, resumed from the regular checkpoint; the final weights are the uninterrupted ones.
    Returns the lost steps (the last step done before the fault minus the step resumed from)."""
    starts = re.findall(LIGHTNING_START, text)
    assert [s[2] for s in starts[:2]] == ["0", "1"] and starts[1][1] != node, starts
    run0 = text.split("lightning-job: start global_step=" + starts[1][0])[0]
    assert re.search(r"^lightning-job: device error .*fallen off the bus", run0, re.M), run0[-3000:]
    saved = [int(s) for s in re.findall(r"lightning-job: checkpoint global_step=(\d+)", run0)]
    assert saved == [128], saved  # the signal's hpc_ckpt could not be written: the GPU was gone
    assert int(starts[1][0]) == 128, starts
    assert re.search(r"^lightning-job: resume from=\S+/checkpoints/epoch=0-step=128\.ckpt$", text, re.M), text[-3000:]
    assert re.search(r"^lightning-job: skipped torn checkpoint \S+/hpc_ckpt_1\.ckpt: ", text, re.M), text[-3000:]
    last = max(int(s) for s in re.findall(r"^lightning-job: global_step=(\d+)$", run0, re.M))
    assert re.search(rf"lightning-job: done global_step=384 final_state={digest}$", text, re.M), text[-2000:]
    return last - int(starts[1][0])
