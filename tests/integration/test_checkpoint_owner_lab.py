"""Issue 17 item 4 on real Slurm: a job that gets an earlier job's id never resumes that job's checkpoint.

A fresh cluster hands out job 1 again; we cannot reset the lab's job counter between two jobs, so the
earlier job's checkpoint is planted where it would be: the job is submitted held, and the checkpoint
folder its job-scoped ``--checkpoint-dir .../%j`` expands to gets a step-600 checkpoint owned by the
same job id with another submission token. Then the job is released and runs under the real job
runner (unchanged: the token reaches it and the trainer through the generated script's environment).
Also checked: the default folder is unique per submission, and --allow-foreign-checkpoint resumes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import autoheal.sbatch_helpers as sbh
from autoheal.sbatch_helpers.checkpoint import CheckpointManager, Owner

TRAINER = Path(sbh.__file__).parent / "examples" / "tiny_trainer.py"
PY = sys.executable
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")
OLD_TOKEN = "0ldj0b0000"


def _submit(lab, wd: Path, *wrapper_args: str) -> str:
    script = wd / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH -o {wd}/out-%j.txt\n"
                      f"{PY} {TRAINER} --steps 30 --step-seconds 0.05 --checkpoint-every 10\n")
    res = subprocess.run([PY, "-m", "autoheal.cli.main", "sbatch", "--hold", *wrapper_args, "--parsable",
                          str(script)], cwd=wd, env=lab.env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"autoheal sbatch failed: {res.stderr}"
    return res.stdout.strip().split(";")[0]


def _plant_earlier_job(folder: Path, job_id: str, step: int) -> None:
    """What an earlier job with the same id left: a valid tiny_trainer checkpoint it owned."""
    old = CheckpointManager(folder, rank=0, owner=Owner(job_id, OLD_TOKEN))
    old.save(step, json.dumps({"trainer": "tiny", "step": step, "state": 12345}).encode(),
             {"trainer": "tiny", "state": 12345})


def _wait_finished(slurm, job_id: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    job = None
    while time.monotonic() < deadline:
        job = slurm.get_job(job_id)
        if job.state in FINISHED:
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not finish within {timeout}s (last: {job})")


def test_reused_job_id_never_resumes_a_foreign_checkpoint(plain_lab, tmp_path):
    slurm = plain_lab.adapter()
    wds = {name: tmp_path / name for name in ("scoped", "default", "allowed")}
    for wd in wds.values():
        wd.mkdir()
    jobs = {
        "scoped": _submit(plain_lab, wds["scoped"], "--checkpoint-dir", str(wds["scoped"] / "ck" / "%j")),
        "default": _submit(plain_lab, wds["default"]),
        "allowed": _submit(plain_lab, wds["allowed"], "--checkpoint-dir", str(wds["allowed"] / "ck" / "%j"),
                           "--allow-foreign-checkpoint"),
    }
    _plant_earlier_job(wds["scoped"] / "ck" / jobs["scoped"], jobs["scoped"], 600)
    _plant_earlier_job(wds["allowed"] / "ck" / jobs["allowed"], jobs["allowed"], 20)
    # the old default folder (autoheal-checkpoints/<id>) is where the earlier job 1 of issue 17 saved
    _plant_earlier_job(wds["default"] / "autoheal-checkpoints" / jobs["default"], jobs["default"], 600)
    for jid in jobs.values():
        slurm.release(jid)
    done = {name: _wait_finished(slurm, jid) for name, jid in jobs.items()}
    out = {name: (wds[name] / f"out-{jid}.txt").read_text() for name, jid in jobs.items()}
    for name in jobs:
        assert done[name].state == "COMPLETED", out[name][-3000:]

    # a job-scoped folder holding an earlier job's checkpoint: refused by the runner and the trainer
    text, jid = out["scoped"], jobs["scoped"]
    assert "resume from step none" in text, text
    assert f"ckpt-00000600: written by an earlier job {jid} (submission {OLD_TOKEN})" in text, text
    assert "autoheal-trainer: start step=0 resumed_from=none" in text
    assert "autoheal-trainer: done step=30 " in text
    ck = wds["scoped"] / "ck" / jid
    old = CheckpointManager(ck, rank=0, owner=Owner(jid, OLD_TOKEN)).load(600)  # kept, still the old job's
    assert old.owner == Owner(jid, OLD_TOKEN)
    mine = CheckpointManager(ck, rank=0, owner=None).load(30)
    assert mine.owner.job_id == jid and re.fullmatch(r"[0-9a-f]{10}", mine.owner.token)

    # the default folder is unique per submission: the old autoheal-checkpoints/<id> is not even looked at
    text, jid = out["default"], jobs["default"]
    folders = sorted(p.name for p in (wds["default"] / "autoheal-checkpoints").iterdir())
    assert len(folders) == 2 and folders[0] == jid and re.fullmatch(rf"{jid}-[0-9a-f]{{10}}", folders[1]), folders
    token = folders[1].split("-", 1)[1]
    assert f"checkpoint dir {wds['default'] / 'autoheal-checkpoints' / folders[1]}," in text, text
    assert "autoheal-trainer: start step=0 resumed_from=none" in text and "rejected" not in text
    got = CheckpointManager(wds["default"] / "autoheal-checkpoints" / folders[1], rank=0, owner=None).load()
    assert got.step == 30 and got.owner == Owner(jid, token)

    # asked to, the job resumes the earlier job's state
    text, jid = out["allowed"], jobs["allowed"]
    assert "resume from step 20" in text and "autoheal-trainer: start step=20 " in text, text
