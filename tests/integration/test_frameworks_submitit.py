"""Real submitit (from PyPI) on a lab with xid-watch: XID 79 under a running ``Checkpointable`` job.

Two jobs run the recipe in sbatch_helpers/examples/submitit_job.py at once: a plain submitit job
(xid-watch gives it the ``--signal=USR2@<grace>`` submitit asked for, on its steps only) and one
submitted through ``autoheal sbatch`` (the runner gets the signal and forwards it). Both must
checkpoint, requeue themselves, resume from the checkpointed step on another node and finish; the
client's result must be the completed run's. The lab runs with ``hooks.grace_signal = "USR2"``: the
setting that made a plain submitit job end FAILED before (the USR2 also hit, and killed, the batch
shell); tests/unit/test_jobside_signal.py shows the same for every allowed grace_signal.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import autoheal.sbatch_helpers as sbh
from autoheal import nodeops
from autoheal.journal import Journal
from autoheal.slurm.cli_backend import CliSlurm
from autoheal_lab.cluster import Lab

EXAMPLE = Path(sbh.__file__).parent / "examples" / "submitit_job.py"
PY = sys.executable
STEPS, STEP_SECONDS, GRACE = 60, 0.5, 10


def _expected(steps: int) -> int:
    state = 0
    for step in range(steps):
        state = (state * 31 + step + 1) % 1_000_003
    return state


@pytest.fixture(scope="module")
def fwlab(tmp_path_factory):
    from conftest import _require_slurm

    _require_slurm()
    try:
        import submitit  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("CI must install the test extras (submitit)")
        pytest.skip("submitit not installed (pip install -e .[test])")
    lab = Lab(tmp_path_factory.mktemp("fwlab"))
    try:
        # up once to write the lab's config, set hooks.grace_signal, up again (a lab keeps config edits)
        lab.up(nodes=3, gpus=2, spares=0, install=False)
        lab.down()
        conf = lab.layout().autoheal_conf
        text = conf.read_text()
        assert re.search(r"(?m)^grace_seconds = ", text), text
        conf.write_text(re.sub(r"(?m)^grace_seconds = .*$", f'grace_seconds = {GRACE}.0\ngrace_signal = "USR2"',
                               text, count=1))
        lab.up(nodes=3, gpus=2, spares=0, install=False)
        yield lab
    finally:
        lab.down()


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout}s")


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_submitit_jobs_checkpoint_requeue_themselves_and_resume_away_from_the_bad_node(fwlab, tmp_path):
    lab = fwlab
    env = dict(lab.slurm_env(), PATH=os.path.dirname(PY) + os.pathsep + lab.slurm_env().get("PATH", ""))
    slurm = CliSlurm(slurm_conf=str(lab.layout().slurm_conf), env=env)
    clients = {}
    for mode in ("plain", "autoheal-sbatch"):
        folder = tmp_path / mode
        out = tmp_path / f"{mode}.client"
        argv = [PY, str(EXAMPLE), "--folder", str(folder), "--steps", str(STEPS), "--step-seconds",
                str(STEP_SECONDS), "--grace", str(GRACE), "--wait", "240"]
        if mode == "autoheal-sbatch":
            argv.append("--via-autoheal-sbatch")
        with open(out, "w") as fh:
            proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=tmp_path)
        clients[mode] = (proc, folder, out)
    bad = set()
    jobs = {}
    try:
        for mode, (_proc, _folder, out) in clients.items():
            m = _wait(lambda out=out: re.search(r"(?m)^submitted (\d+)$", _read(out)), 60, f"{mode} submitted")
            jobs[mode] = m.group(1)
        for mode, jid in jobs.items():
            log = clients[mode][1] / f"{jid}_0_log.out"
            _wait(lambda log=log: "submitit-trainer: step=5" in _read(log), 90, f"{mode} job {jid} computing")
            bad.add(slurm.get_job(jid).nodes[0])
        for node in sorted(bad):  # XID 79 on every node under the jobs: xid-watch drains and signals
            res = subprocess.run([PY, "-m", "autoheal.cli.main", "lab", "inject", "--dir", str(lab.root), "--node",
                                  node, "--gpu", "0", "--xid", "79"], env=env, capture_output=True, text=True,
                                 timeout=30)
            assert res.returncode == 0, res.stderr
        results = {}
        for mode, (proc, _folder, out) in clients.items():
            rc = proc.wait(timeout=240)
            text = _read(out)
            assert rc == 0, f"{mode}: client exit {rc}:\n{text[-3000:]}"
            results[mode] = json.loads(re.search(r"(?m)^result (.*)$", text).group(1))
        for mode, jid in jobs.items():
            job = _wait(lambda jid=jid: (lambda j: j if j.state not in ("RUNNING", "PENDING", "COMPLETING") else None)(
                slurm.get_job(jid)), 60, f"{mode} job {jid} finished")
            log = _read(clients[mode][1] / f"{jid}_0_log.out")
            res = results[mode]
            assert job.state == "COMPLETED", f"{mode}: {job}\n{log[-3000:]}"
            assert res["step"] == STEPS and res["final_state"] == _expected(STEPS), res
            runs = res["runs"]
            # the client's result is the completed run's, which resumed from the checkpoint, elsewhere
            assert len(runs) >= 2 and runs[0]["node"] in bad, (mode, runs, log[-3000:])
            assert runs[1]["start"] > 0 and runs[1]["node"] not in bad, (mode, runs)
            ckpt = [int(s) for s in re.findall(r"submitit-trainer: checkpoint step=(\d+)", log)]
            assert ckpt and runs[1]["start"] == ckpt[0], (mode, ckpt, runs)
            assert "Caught signal SIGUSR2" in log, log[-3000:]
        # the plain job got its own signal from xid-watch, on its steps (the batch shell lived)
        from autoheal.config import load_config

        journal = Journal(load_config(lab.layout().autoheal_conf).journal.path)
        sig = [r for r in journal.read() if r.event == "signal" and jobs["plain"] in (r.job_ids or [])]
        assert sig and sig[0].outcome == "USR2" and f"--signal=USR2@{GRACE}" in sig[0].message, sig
        assert "not the batch shell" in sig[0].message
    finally:
        for proc, _f, _o in clients.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for jid in jobs.values():
            subprocess.run(["scancel", jid], env=env, capture_output=True, timeout=20)
        for node in bad:
            subprocess.run([PY, "-m", "autoheal.cli.main", "lab", "inject", "--dir", str(lab.root), "--node", node,
                            "--clear"], env=env, capture_output=True, timeout=30)
            if slurm.get_node(node).drain:
                nodeops.resume(slurm, node)
