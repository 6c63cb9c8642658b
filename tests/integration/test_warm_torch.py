"""Warm interpreters (``autoheal sbatch --preload``) with a real PyTorch DDP job on the lab: a hot spare
and the peer-memory tier, a fault on the rank that is not on the batch host, and the restarted ranks
forked from their nodes' warm interpreters instead of importing torch again.

Opt-in (``pytest -m torch``), the lab of test_faults_reach_job_torch.py (3 nodes x 2 fake GPUs, hooks and
xid-watch, ``SlurmdTimeout=10``, ``KillWait=5``, a 3 s grace in the hooks). The job runs its ranks as
``srun autoheal-warm python ddp_trainer.py``, with ``OMP_NUM_THREADS=1`` set before ``autoheal sbatch``
(the warm interpreters import torch with it; set in the script instead, the ranks would start afresh).
Per fault (XID 79 on the rank's GPU; the rank's node killed with ``kill -9`` of its slurmd and every
process on it), the fault must still reach the rank as before (its device error; its death with its
node), the spare must take its place, every restarted rank must show, in its own start line, that torch
was already imported when the script began (``torch_preloaded=yes``) and which warm interpreter forked
it (``warm=<pid>``, the pid that interpreter printed on its node), the job must lose at most
``MEMORY_K`` steps and end with the weights of an uninterrupted run.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from helpers import cancel_job, module_lab, wait_for, wait_text

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import test_faults_reach_job_torch as ref  # noqa: E402
from test_faults_reach_job_lab import FaultLab, _break  # noqa: E402 (after the skip)
from test_faults_reach_job_torch import DDP, DONE, EVERY, MEMORY_K, PY, START, STEPS, THREADS  # noqa: E402

uninterrupted = ref.uninterrupted  # the reference run's fixture: the weights of the same run uninterrupted

CLIENT = Path(PY).parent / "autoheal-warm"
PRELOAD = "torch,torch.distributed,torch.nn.parallel"
READY = r"^autoheal-warm: (\S+): ready: imported \S+ in [\d.]+s \(pid (\d+)\)$"
WARM = r" torch_preloaded=(yes|no) warm=(\S+)"
MEASURED = {}


@pytest.fixture(scope="module")
def wlab(tmp_path_factory):
    try:
        with module_lab(tmp_path_factory, "warmtorch", nodes=3, gpus=2, spares=0, hooks=True, xid_watch=True,
                        extra_conf=["SlurmdTimeout=10", "KillWait=5"], hooks_conf={"grace_seconds": 3.0}) as lab:
            yield FaultLab(lab)
    finally:
        print(f"\nwarm interpreters, lost steps and restarted ranks' torch import (ms): {MEASURED}")


def _submit(wlab: FaultLab, workdir: Path) -> tuple:
    """The 2-rank DDP job with a spare, the memory tier every MEMORY_K steps and warm interpreters; once
    the three nodes' warm interpreters are ready and both ranks hold a memory copy newer than a durable
    save: (job id, output, victim node, victim rank, victim GPU, {node: warm interpreter pid})."""
    env = dict(wlab.env, AUTOHEAL_MEMORY_TIER="1", **THREADS)
    script = workdir / "job.sh"
    script.write_text(
        f"#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=1 --gres=gpu:1 -o {workdir}/out.txt\n"
        "export MASTER_ADDR=127.0.0.1\n"  # every lab node is this machine
        # 0.4 s steps: the warm interpreters import while the first ranks do; the fault comes after both
        f"srun -l {CLIENT} {PY} {DDP} --steps {STEPS} --step-seconds 0.4 --checkpoint-every {EVERY} "
        f"--device lab --timeout 600 --memory-every {MEMORY_K}\n")
    res = subprocess.run([PY, "-m", "autoheal.cli.main", "sbatch", "--grace", "5", "--spare-nodes", "1", "--preload",
                          PRELOAD, "--parsable", str(script)], cwd=workdir, env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    jid = res.stdout.strip().split(";")[0]
    out = workdir / "out.txt"
    starts = wait_text(out, START, 180, count=2)
    warm = dict(wait_text(out, READY, 180, count=3))
    job = wlab.slurm.get_job(jid)
    assert sorted(warm) == sorted(job.nodes), (warm, job.nodes)  # the spare has one too
    rank, _, _, _, victim = next(s for s in starts if s[4] != job.batch_host)
    gpu = int(wait_text(out, rf"^{rank}: autoheal-trainer: device lab gpus=(\d+)$", 30)[0])
    steps = [int(s) for s in re.findall(r"^0: autoheal-trainer: step=(\d+) ", out.read_text(), re.M)]
    at = (max(steps, default=0) // EVERY + 1) * EVERY + MEMORY_K  # a memory copy past the next durable save
    assert at + 2 * MEMORY_K < STEPS, f"training too far ({max(steps)}) when the warm interpreters were ready"
    wait_text(out, rf"^\d: autoheal-trainer: memory saved step={at} nodes=\S+,\S+$", 60, count=2)
    return jid, out, victim, rank, gpu, warm


@pytest.mark.parametrize("kind", ["xid79", "node-killed"])
def test_restarted_ranks_fork_from_the_warm_interpreters_and_the_job_resumes_from_memory(
        wlab, uninterrupted, tmp_path, kind):
    jid, out, victim, rank, gpu, warm = _submit(wlab, tmp_path)
    try:
        _break(wlab, kind, victim, gpu)
        wait_text(out, START, 180, count=4)
        wait_text(out, DONE, 180, count=2)
        lost, imports = _judge(out.read_text(), rank, victim, kind, warm, uninterrupted)
        MEASURED[kind] = {"lost": lost, "torch_import_ms": imports}
        assert 0 <= lost <= MEMORY_K, lost
        ref._wait_completed(wlab, jid)
    finally:
        cancel_job(wlab.env, jid)
        wlab.heal(victim)
        wait_for(lambda: all(n.state == "IDLE" for n in wlab.slurm.list_nodes()), 60, "nodes idle", step=0.5)


def _judge(text: str, rank: str, victim: str, kind: str, warm: dict, digest: str) -> tuple:
    """The fault reached the rank as without warm interpreters; the restart ran on the spare inside the
    allocation, every rank forked from its node's warm interpreter (torch imported before the script
    began) and resumed from a memory copy none of which was the lost node's; the final weights are the
    uninterrupted run's. Returns (lost steps, the restarted ranks' torch import times in ms)."""
    starts = list(re.finditer(START + r".*$", text, re.M))
    assert len(starts) >= 4, text[-3000:]
    run0, run1 = text[:starts[2].start()], starts[2:4]
    if kind == "xid79":  # its next GPU call failed: it could not save
        assert re.search(rf"^{rank}: autoheal-trainer: device error step=\d+ error=CUDA_error:\S+fallen_off_the_bus",
                         run0, re.M), run0[-3000:]
    else:  # killed with its node: it printed no step after the fault
        assert not re.search(rf"^{rank}: autoheal-trainer: (done|checkpoint saved|device error)", run0, re.M)
    imports = []
    for st in run1:  # (rank, step, resumed_from, restart, host)
        assert st.group(3).startswith("memory:") and not st.group(3).endswith(f"@{victim}"), st.group(0)
        assert st.group(4) == "0" and st.group(5) != victim, st.group(0)  # the spare, not a requeue
        m = re.search(WARM, st.group(0))
        assert m and m.group(1) == "yes" and m.group(2) == warm[st.group(5)], (st.group(0), warm)
        imports.append(int(re.search(r"torch_import_ms=(\d+)", st.group(0)).group(1)))
    # lost steps counted from the start lines found above, not by autoheal_lab.lostwork's reading of the
    # lines in order: srun interleaves the nodes' output as it gets it, and under load one rank's first
    # step line came before the other's start line (read as a restart at step 1)
    resumed = {int(st.group(2)) for st in run1}
    assert len(resumed) == 1, resumed
    done_before = [int(n) for n in re.findall(r"^\d+: autoheal-trainer: step=(\d+)\b", run0, re.M)]
    finals = re.findall(DONE, text, re.M)
    assert sorted(finals) == [(r, str(STEPS), digest) for r in ("0", "1")], (finals, digest, text[-3000:])
    return max(done_before) - resumed.pop(), imports
