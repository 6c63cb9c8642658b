"""Real submitit (from PyPI) on a lab with xid-watch: XID 79 under running ``Checkpointable`` jobs.

Two jobs run the recipe in sbatch_helpers/examples/submitit_job.py at once: a plain submitit job
(xid-watch gives it the ``--signal=USR2@<grace>`` submitit asked for, on its steps only) and one
submitted through ``autoheal sbatch`` (the runner gets the signal and forwards it). Each runs on the
fake GPU Slurm gave its step (``--device lab``): its steps, its durable saves (every ``EVERY`` steps)
and submitit's ``checkpoint()`` copy the state off that GPU, as a CUDA job does.

- XID 79 on another GPU of the job's node: the job's own GPU still works, so submitit's on-signal
  checkpoint is written; the job requeues itself and resumes from the step it pickled, elsewhere.
- XID 79 on the job's own GPU: its next step fails and so does the copy in ``checkpoint()``; the job
  is still requeued through submitit's handler and resumes from its last durable save before the
  fault, losing at most ``EVERY`` steps (measured from its own step lines).

Both must finish with an uninterrupted run's state, and the client's result must be the completed
run's. The lab runs with ``hooks.grace_signal = "USR2"``: the setting that made a plain submitit job
end FAILED before (the USR2 also hit, and killed, the batch shell); tests/unit/test_jobside_signal.py
shows the same for every allowed grace_signal.
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
from autoheal_lab.gpus import inject

EXAMPLE = Path(sbh.__file__).parent / "examples" / "submitit_job.py"
PY = sys.executable
STEPS, STEP_SECONDS, GRACE = 60, 0.5, 10
EVERY = 10  # the durable checkpoint interval (steps)
GPUS = 3  # per node: two 1-GPU jobs on one node still leave a GPU that neither holds


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
        lab.up(nodes=3, gpus=GPUS, spares=0, install=False)
        lab.down()
        conf = lab.layout().autoheal_conf
        text = conf.read_text()
        assert re.search(r"(?m)^grace_seconds = ", text), text
        conf.write_text(re.sub(r"(?m)^grace_seconds = .*$", f'grace_seconds = {GRACE}.0\ngrace_signal = "USR2"',
                               text, count=1))
        lab.up(nodes=3, gpus=GPUS, spares=0, install=False)
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


def _run_both(lab, tmp_path, own_gpu: bool):
    """Both jobs on their fake GPU; once each has saved its first durable checkpoint and run half an
    interval past it, XID 79 on its GPU (``own_gpu``) or on a GPU of its node that no job holds. Returns
    {mode: (job id, log text, client result, the node, the broken GPU)} once both clients returned."""
    env = dict(lab.slurm_env(), PATH=os.path.dirname(PY) + os.pathsep + lab.slurm_env().get("PATH", ""))
    slurm = CliSlurm(slurm_conf=str(lab.layout().slurm_conf), env=env)
    clients = {}
    for mode in ("plain", "autoheal-sbatch"):
        folder = tmp_path / mode
        out = tmp_path / f"{mode}.client"
        argv = [PY, str(EXAMPLE), "--folder", str(folder), "--steps", str(STEPS), "--step-seconds",
                str(STEP_SECONDS), "--grace", str(GRACE), "--wait", "300", "--gpus-per-node", "1", "--device", "lab",
                "--checkpoint-every", str(EVERY), "--log-every", "1"]
        if mode == "autoheal-sbatch":
            argv.append("--via-autoheal-sbatch")
        with open(out, "w") as fh:
            proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=tmp_path)
        clients[mode] = (proc, folder, out)
    bad = set()
    jobs = {}
    got = {}
    try:
        for mode, (_proc, _folder, out) in clients.items():
            m = _wait(lambda out=out: re.search(r"(?m)^submitted (\d+)$", _read(out)), 60, f"{mode} submitted")
            jobs[mode] = m.group(1)
        held = {}
        for mode, jid in jobs.items():
            log = clients[mode][1] / f"{jid}_0_log.out"
            _wait(lambda log=log: re.search(rf"(?m)^submitit-trainer: step={EVERY + 5}\b", _read(log)), 120,
                  f"{mode} job {jid} past its first durable checkpoint")
            assert f"submitit-trainer: checkpoint saved step={EVERY} " in _read(log), _read(log)[-2000:]
            gpu = int(re.search(r"(?m)^submitit-trainer: device lab gpus=(\d+)$", _read(log)).group(1))
            held[mode] = (slurm.get_job(jid).nodes[0], gpu)
        for mode, (node, gpu) in held.items():
            others = sorted({g for n, g in held.values() if n == node})
            got[mode] = (node, gpu if own_gpu else next(g for g in range(GPUS) if g not in others))
            bad.add(got[mode])
        # back to back, in this process: two jobs on one node each lose their GPU before xid-watch signals
        # them for the first fault (a second CLI start later, the other job's GPU would still work then)
        for node, target in sorted(bad):
            inject(lab, node, target, "xid", xid=79)
        out = {}
        for mode, (proc, folder, client) in clients.items():
            rc = proc.wait(timeout=300)
            text = _read(client)
            jid = jobs[mode]
            log = _read(folder / f"{jid}_0_log.out")
            assert rc == 0, f"{mode}: client exit {rc}:\n{text[-2000:]}\n{log[-3000:]}"
            result = json.loads(re.search(r"(?m)^result (.*)$", text).group(1))
            job = _wait(lambda jid=jid: (lambda j: j if j.state not in ("RUNNING", "PENDING", "COMPLETING") else None)(
                slurm.get_job(jid)), 60, f"{mode} job {jid} finished")
            assert job.state == "COMPLETED", f"{mode}: {job}\n{log[-3000:]}"
            out[mode] = (jid, log, result, *got[mode])
        return out
    finally:
        for proc, _f, _o in clients.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for jid in jobs.values():
            subprocess.run(["scancel", jid], env=env, capture_output=True, timeout=20)
        for node in sorted({n for n, _g in bad}):
            subprocess.run([PY, "-m", "autoheal.cli.main", "lab", "inject", "--dir", str(lab.root), "--node", node,
                            "--clear"], env=env, capture_output=True, timeout=30)
            subprocess.run([PY, "-m", "autoheal.cli.main", "check", "--clear-faults", "--node", node],
                           env=dict(env, **lab.node_env(node)), capture_output=True, timeout=60)
            if slurm.get_node(node).drain:
                nodeops.resume(slurm, node)


def _first_run(log: str) -> str:
    """The log of the run the fault hit: up to the second ``start`` line."""
    starts = [m.start() for m in re.finditer(r"(?m)^submitit-trainer: start step=", log)]
    assert len(starts) >= 2, log[-3000:]
    return log[:starts[1]]


def _judge_common(mode: str, jid: str, log: str, res: dict, node: str) -> None:
    assert res["step"] == STEPS and res["final_state"] == _expected(STEPS), res
    runs = res["runs"]
    # the client's result is the completed run's, which resumed from a checkpoint, elsewhere
    assert len(runs) >= 2 and runs[0]["node"] == node, (mode, runs, log[-3000:])
    assert runs[1]["start"] > 0 and runs[1]["node"] != node, (mode, runs)
    assert "Caught signal SIGUSR2" in _first_run(log), log[-3000:]


def _plain_signalled_by_xid_watch(lab, jid: str) -> None:
    """The plain job got its own signal from xid-watch, on its steps (the batch shell lived)."""
    from autoheal.config import load_config

    journal = Journal(load_config(lab.layout().autoheal_conf).journal.path)
    sig = [r for r in journal.read() if r.event == "signal" and jid in (r.job_ids or [])]
    assert sig and sig[0].outcome == "USR2" and f"--signal=USR2@{GRACE}" in sig[0].message, sig
    assert "not the batch shell" in sig[0].message


def test_submitit_jobs_whose_gpu_still_works_checkpoint_on_the_signal_and_resume_from_it(fwlab, tmp_path):
    """XID 79 on a GPU of the node that the job does not hold: the node is drained and the job signalled,
    and its own GPU can still give up the state: submitit's on-signal checkpoint is what it resumes from."""
    got = _run_both(fwlab, tmp_path, own_gpu=False)
    for mode, (jid, log, res, node, _gpu) in got.items():
        _judge_common(mode, jid, log, res, node)
        run0 = _first_run(log)
        assert "device error" not in run0 and "checkpoint failed" not in run0, run0[-3000:]
        ckpt = [int(s) for s in re.findall(r"(?m)^submitit-trainer: checkpoint step=(\d+)$", run0)]
        assert ckpt and res["runs"][1]["start"] == ckpt[0] and res["runs"][1]["from"] == "pickle", (mode, ckpt, res)
    _plain_signalled_by_xid_watch(fwlab, got["plain"][0])


def test_submitit_jobs_whose_gpu_fell_off_the_bus_resume_from_their_last_durable_checkpoint(fwlab, tmp_path):
    """XID 79 on the job's own GPU: its next step fails and submitit's ``checkpoint()`` cannot copy the
    state off it. The trainer hands over to submitit's handler, which pickles the last durable state and
    requeues the job; it resumes from that save elsewhere, losing at most EVERY steps, never back to 0."""
    got = _run_both(fwlab, tmp_path, own_gpu=True)
    for mode, (jid, log, res, node, _gpu) in got.items():
        _judge_common(mode, jid, log, res, node)
        run0 = _first_run(log)
        # the GPU call that failed: the next step's (the trainer then signals itself), or, when the signal
        # came first, the copy in checkpoint(); either way no on-signal checkpoint, the pickle holds the
        # last durable state
        error = re.search(r"(?m)^submitit-trainer: device error step=\d+ error=(\S+) ", run0)
        assert error is None or error.group(1) == "DeviceLost", run0[-3000:]
        assert not re.search(r"(?m)^submitit-trainer: checkpoint step=", run0), run0[-3000:]
        saved = [int(s) for s in re.findall(r"(?m)^submitit-trainer: checkpoint saved step=(\d+) ", run0)]
        failed = re.search(r"(?m)^submitit-trainer: checkpoint failed step=\d+ error=DeviceLost: .*durable step=(\d+)",
                           run0)
        assert saved and failed and int(failed.group(1)) == saved[-1], (mode, saved, run0[-3000:])
        assert res["runs"][1]["start"] == saved[-1], (mode, saved, res["runs"])
        last = max(int(s) for s in re.findall(r"(?m)^submitit-trainer: step=(\d+)\b", run0))
        lost = last - saved[-1]
        assert 0 < lost <= EVERY, (mode, last, saved)
        print(f"\nSUBMITIT {mode}: XID 79 on GPU {_gpu} of {node}; last durable save step {saved[-1]}, "
              f"last step done {last}: lost {lost} steps; failed first: {'step' if error else 'checkpoint copy'}; "
              f"resumed on {res['runs'][1]['node']}")
    # xid-watch's signal is what made the plain job checkpoint when its step had not failed first (when
    # it had, the job requeued itself, maybe before xid-watch looked at it)
    if "submitit-trainer: device error" not in _first_run(got["plain"][1]):
        _plain_signalled_by_xid_watch(fwlab, got["plain"][0])
