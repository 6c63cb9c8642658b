"""Issue 15: the Lightning and torchrun recipes of sbatch_helpers/examples, run for real on the lab under
an XID 79 on the job's node. Opt-in (``pytest -m torch``): torch and lightning are large and CI does
not install them; the tests skip where they are not importable.

The example files are copied as they ship and changed only where the lab differs from a cluster
(printed by each test): the Lightning run is paced (``--step-seconds``) so the fault lands mid-training,
and torchrun gets 2 processes per node instead of 8, the lab's loopback address as rendezvous host (the
lab's node names do not resolve) and a checkpoint every 10 steps. Each test prints what happened: the
step the job resumed from and fault -> running again, the figures the README quotes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import wait_for, wait_text

import autoheal.sbatch_helpers as sbh
from autoheal_lab.gpus import inject

pytestmark = pytest.mark.torch
EXAMPLES = Path(sbh.__file__).parent / "examples"
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


@pytest.fixture(scope="module")
def torchlab(tmp_path_factory):
    pytest.importorskip("torch")
    from conftest import _start

    handle = _start(tmp_path_factory.mktemp("torchlab"), nodes=3, gpus=2, spares=0)
    try:
        yield handle
    finally:
        handle.lab.down()


def _env(handle) -> dict:
    # `python`, `torchrun` and `autoheal` of this venv first, as a researcher's activated venv
    return dict(handle.env, PATH=os.path.dirname(sys.executable) + os.pathsep + handle.env.get("PATH", ""))


def _job(handle, jid: str) -> dict:
    out = subprocess.run(["scontrol", "-o", "show", "job", jid], env=handle.env, capture_output=True, text=True,
                         timeout=10).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _copy(name: str, dest: Path, changes=()) -> Path:
    text = (EXAMPLES / name).read_text()
    for old, new in changes:
        assert old in text, (name, old)
        text = text.replace(old, new)
    out = dest / name
    out.write_text(text)
    return out


def _fault_and_wait(handle, jid: str, out: Path, ready: str, timeout: float = 240.0, gpu: int = 1) -> dict:
    """XID 79 on GPU ``gpu`` of the job's (first) node once ``ready`` is in its output; returns what happened."""
    wait_for(lambda: re.search(ready, _read(out)), 180, f"job {jid}: {ready!r}", step=0.3)
    job = _job(handle, jid)
    node = re.sub(r"\[.*", "", job["BatchHost"])
    t0 = inject(handle.lab, node, gpu, "xid", xid=79)["time"]
    running_again = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = _job(handle, jid)
        if running_again is None and int(job.get("Restarts") or 0) >= 1 and job.get("JobState") == "RUNNING":
            running_again = time.time() - t0
            assert node not in job.get("NodeList", ""), job
        if job.get("JobState") in FINAL:
            break
        time.sleep(0.3)
    return {"node": node, "job": job, "running_again_s": running_again, "fault": t0}


def _heal(handle, node: str) -> None:
    from autoheal_lab.fakenvml import state as gstate

    for gpu in range(handle.layout.gpus):
        gstate.inject(handle.layout.gpu_state(node), gpu, "clear")
    env = dict(handle.env, **handle.lab.node_env(node))
    subprocess.run([sys.executable, "-m", "autoheal.cli.main", "check", "--clear-faults", "--node", node], env=env,
                   capture_output=True, timeout=60)
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=handle.env, capture_output=True,
                   timeout=10)


def test_lightning_recipe_checkpoints_requeues_itself_and_resumes_elsewhere(torchlab, tmp_path):
    pytest.importorskip("lightning")
    handle = torchlab
    _copy("lightning_job.py", tmp_path)
    # 3 epochs of 128 steps, paced so that the fault comes mid-training; --device lab: the step's GPU is the
    # lab's fake one (its steps and saves are GPU calls), the fault hits the node's other GPU
    script = _copy("lightning_job.sbatch", tmp_path, [
        ("lightning_job.py --root",
         "lightning_job.py --epochs 3 --step-seconds 0.05 --log-every 20 --device lab --root")])
    res = subprocess.run(["sbatch", "--parsable", str(script)], env=_env(handle), capture_output=True, text=True,
                         timeout=30, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    jid = res.stdout.strip().split(";")[0]
    out = tmp_path / f"lightning-{jid}.out"
    try:
        held = int(wait_text(out, r"^lightning-job: device lab gpus=(\d+)$", 180)[0])
        # the node's other GPU: the job's own still works, so Lightning's hpc_ckpt on the signal can be written
        got = _fault_and_wait(handle, jid, out, r"lightning-job: global_step=40\b", gpu=1 - held)
    finally:
        subprocess.run(["scancel", jid], env=handle.env, capture_output=True, timeout=20)
    text = _read(out)
    _heal(handle, got["node"])
    assert got["job"].get("JobState") == "COMPLETED", (got["job"], text[-3000:])
    assert "Handling auto-requeue signal: 12" in text, text[-3000:]  # SIGUSR2, from xid-watch
    saved = [int(s) for s in re.findall(r"lightning-job: checkpoint global_step=(\d+)", text)]
    starts = re.findall(r"lightning-job: start global_step=(\d+) node=(\S+) restart=(\d+)", text)
    assert starts[0][2] == "0" and len(starts) >= 2, starts
    resumed, node, restart = int(starts[1][0]), starts[1][1], starts[1][2]
    assert restart == "1" and node != got["node"], starts
    assert resumed > 0 and resumed in saved, (resumed, saved)  # the hpc checkpoint Lightning saved on USR2
    assert "lightning-job: done global_step=384" in text, text[-2000:]
    assert "device error" not in text, text[-3000:]  # its own GPU was healthy throughout
    print(f"\nLIGHTNING: XID 79 on GPU {1 - held} of {got['node']} (the job's GPU {held} healthy) at global_step ~40; "
          f"checkpoint on the signal at step {saved[0]}; "
          f"resumed at global_step {resumed} on {node}; fault -> running again {got['running_again_s']:.1f} s; "
          f"final state {got['job']['JobState']} (restarts {got['job']['Restarts']})")


def test_torchrun_recipe_under_autoheal_sbatch_resumes_from_its_checkpoint(torchlab, tmp_path):
    handle = torchlab
    if shutil.which("torchrun", path=_env(handle)["PATH"]) is None:
        pytest.skip("torchrun not on PATH")
    _copy("ddp_trainer.py", tmp_path)
    script = _copy("torchrun_job.sbatch", tmp_path, [
        ("--gpus-per-node=8", "--gpus-per-node=2"),
        ("--nproc-per-node=8", "--nproc-per-node=2"),
        ('$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)', "127.0.0.1"),
        ("--steps 100000 --checkpoint-every 500", "--steps 150 --checkpoint-every 10 --step-seconds 0.2"),
    ])
    res = subprocess.run([sys.executable, "-m", "autoheal.cli.main", "sbatch", "--parsable",
                          "--checkpoint-dir", str(tmp_path / "ckpt"), str(script)], env=_env(handle),
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    jid = res.stdout.strip().splitlines()[-1].split(";")[0]
    out = tmp_path / f"torchrun-{jid}.out"
    try:
        got = _fault_and_wait(handle, jid, out, r"checkpoint saved step=20\b", timeout=300)
    finally:
        subprocess.run(["scancel", jid], env=handle.env, capture_output=True, timeout=20)
    text = _read(out)
    _heal(handle, got["node"])
    assert got["job"].get("JobState") == "COMPLETED", (got["job"], text[-3000:])
    pre = re.search(r"preempted step=(\d+) checkpoint=(\S+)", text)
    assert pre and pre.group(2) != "none", text[-3000:]
    starts = re.findall(r"start step=(\d+) resumed_from=(\S+) restart=(\d+) host=(\S+) rank=0", text)
    resumed = [s for s in starts if s[2] != "0"]
    assert resumed and int(resumed[0][0]) == int(pre.group(1)), (pre.group(0), starts)
    assert "done step=150" in text, text[-2000:]
    print(f"\nTORCHRUN: XID 79 on {got['node']} (batch host); {pre.group(0)}; resumed at step {resumed[0][0]} "
          f"(restart {resumed[0][2]}) on {resumed[0][3]}; fault -> running again {got['running_again_s']:.1f} s; "
          f"final state {got['job']['JobState']} (restarts {got['job']['Restarts']})")
