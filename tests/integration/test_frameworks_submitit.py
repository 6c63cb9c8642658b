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
run's.

Two ranks, one task on each of two nodes, through ``autoheal sbatch``, the fault on rank 1's GPU:

- no collective, XID 79: rank 1's step fails and it signals the step; rank 0 (its GPU works) checkpoints
  its replica on submitit's handler and requeues; rank 1 leaves on the requeue's SIGTERM, with no
  result of its own; the job resumes from rank 0's pickle;
- ``--collective`` (an allreduce every step), XID 79 / uncorrectable ECC (rank 1 aborts) / NVLink down
  (the collective hangs): rank 0 blocks in the collective with the signal held, as under NCCL; the
  runner's hang rule ends the step (not the collective's 600 s timeout) and the job resumes from its
  last durable save, losing at most ``EVERY`` steps.

The lab runs with ``hooks.grace_signal = "USR2"``: the setting that made a plain submitit job end FAILED
before (the USR2 also hit, and killed, the batch shell); tests/unit/test_jobside_signal.py shows the
same for every allowed grace_signal.
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
            _heal(lab, env, slurm, node)


def _heal(lab, env, slurm, node: str) -> None:
    """The node as before the test: its fault cleared, its fault counts cleared, back in service."""
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


# ---- two ranks (one task on each of two nodes), the fault on rank 1's GPU, under `autoheal sbatch`

# short steps: rank 1 meets the fault (its next step) before xid-watch's signal reaches rank 0 more often
RANK_STEPS, RANK_STEP_SECONDS = 40, 0.1


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(lab, tmp_path, kind: str, collective: bool) -> dict:
    """The recipe with 2 tasks on 2 nodes (``--collective``: a real allreduce every step) through
    ``autoheal sbatch``; once rank 0 saved its first durable checkpoint and rank 1 is half an interval
    past it, ``kind`` on rank 1's GPU. Returns what the judges need once the client returned."""
    # every lab node is this machine: the hub is reachable on loopback; a port of its own (other labs
    # run beside this one and the port from the job id could be theirs)
    env = dict(lab.slurm_env(), PATH=os.path.dirname(PY) + os.pathsep + lab.slurm_env().get("PATH", ""),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    slurm = CliSlurm(slurm_conf=str(lab.layout().slurm_conf), env=env)
    folder, client = tmp_path / "ranks", tmp_path / "ranks.client"
    argv = [PY, str(EXAMPLE), "--folder", str(folder), "--steps", str(RANK_STEPS), "--step-seconds",
            str(RANK_STEP_SECONDS), "--grace", str(GRACE), "--wait", "300", "--gpus-per-node", "1", "--nodes", "2",
            "--device", "lab", "--checkpoint-every", str(EVERY), "--log-every", "1", "--via-autoheal-sbatch"]
    if collective:
        argv.append("--collective")
    with open(client, "w") as fh:
        proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=tmp_path)
    jid, node = "", ""
    try:
        jid = _wait(lambda: re.search(r"(?m)^submitted (\d+)$", _read(client)), 60, "submitted").group(1)
        log0, log1 = folder / f"{jid}_0_log.out", folder / f"{jid}_1_log.out"
        _wait(lambda: f"submitit-trainer: checkpoint saved step={EVERY} " in _read(log0), 120,
              f"job {jid}: rank 0's first durable checkpoint")
        _wait(lambda: re.search(rf"(?m)^submitit-trainer: step={EVERY + 5}\b", _read(log1)), 60,
              f"job {jid}: rank 1 past it")
        gpu = int(re.search(r"(?m)^submitit-trainer: device lab gpus=(\d+)$", _read(log1)).group(1))
        node = re.search(r"(?m)^submitit-trainer: start step=0 node=(\S+) ", _read(log1)).group(1)
        assert node != re.search(r"(?m)^submitit-trainer: start step=0 node=(\S+) ", _read(log0)).group(1)
        fault = inject(lab, node, gpu, {"xid79": "xid", "ecc": "ecc-dbe", "nvlink": "nvlink-down"}[kind],
                       **({"xid": 79} if kind == "xid79" else {}))["time"]
        rc = proc.wait(timeout=300)
        text = _read(client)
        assert rc == 0, f"client exit {rc}:\n{text[-2000:]}\n{_read(log0)[-3000:]}\n{_read(log1)[-3000:]}"
        result = json.loads(re.search(r"(?m)^result (.*)$", text).group(1))
        job = _wait(lambda: (lambda j: j if j.state not in ("RUNNING", "PENDING", "COMPLETING") else None)(
            slurm.get_job(jid)), 60, f"job {jid} finished")
        assert job.state == "COMPLETED", f"{job}\n{_read(log0)[-3000:]}"
        batch = _read(folder / f"{jid}_0_log.err") + _read(log0)  # the runner's own lines
        return {"jid": jid, "log0": _read(log0), "log1": _read(log1), "runner": batch, "result": result,
                "err1": _read(folder / f"{jid}_1_log.err"),
                "node": node, "gpu": gpu, "fault": fault}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if jid:
            subprocess.run(["scancel", jid], env=env, capture_output=True, timeout=20)
        if node:
            _heal(lab, env, slurm, node)


def _steps_done(run: str) -> int:
    return max(int(s) for s in re.findall(r"(?m)^submitit-trainer: step=(\d+)\b", run))


def _judge_ranks(got: dict) -> tuple:
    """Both ranks finished with an uninterrupted run's state, the second run started elsewhere; returns
    (rank 0's first run, rank 1's first run, the step the second run resumed from and from what)."""
    res = got["result"]
    assert res["step"] == RANK_STEPS and res["final_state"] == _expected(RANK_STEPS), res
    assert res["ranks"] == [{"step": RANK_STEPS, "final_state": _expected(RANK_STEPS)}] * 2, res
    # the result's runs are those the pickle it resumed from knew: with no pickle after the fault (a
    # resume from the durable save) only the completed run's own
    assert res["runs"][-1]["restart"] >= 1 and res["runs"][-1]["start"] > 0, res["runs"]
    starts = re.findall(r"(?m)^submitit-trainer: start step=(\d+) node=\S+ job=\S+ resumed_from=(\S+) ", got["log0"])
    assert len(starts) >= 2 and res["runs"][-1]["start"] == int(starts[-1][0]), (starts, res["runs"])
    nodes1 = re.findall(r"(?m)^submitit-trainer: start step=\d+ node=(\S+) ", got["log1"])
    assert len(nodes1) >= 2 and got["node"] not in nodes1[1:], nodes1  # the drained node took no rank again
    return _first_run(got["log0"]), _first_run(got["log1"]), int(starts[1][0]), starts[1][1]


def test_submitit_rank_above_0_whose_gpu_fell_off_the_bus_has_rank_0_checkpoint_its_replica(fwlab, tmp_path):
    """XID 79 on rank 1's GPU, no collective between the ranks (each a replica of the same state, as an
    ensemble or a job whose ranks sync rarely): rank 1's next step fails and it signals the step (rank 0,
    whose GPU works, checkpoints on submitit's handler and requeues); its own failure writes no error
    result. The job resumes from rank 0's pickle, i.e. rank 0 loses nothing."""
    got = _run_ranks(fwlab, tmp_path, "xid79", collective=False)
    run0, run1, start, source = _judge_ranks(got)
    assert re.search(r"(?m)^submitit-trainer: device error step=\d+ error=DeviceLost ", run1), run1[-3000:]
    ckpt = [int(s) for s in re.findall(r"(?m)^submitit-trainer: checkpoint step=(\d+)$", run0)]
    assert ckpt and source == "pickle" and start == ckpt[0], (ckpt, source, start, run0[-3000:])
    # the pickle holds rank 0's state when the handler ran: its last step, or one more (the handler ran
    # between the step and its line)
    assert 0 <= ckpt[0] - _steps_done(run0) <= 1, (ckpt, run0[-2000:])
    asked = "asked rank 0 to checkpoint and requeue" in run1
    if asked:  # then it leaves on the requeue's SIGTERM, not after KillWait (the requeued job waits for it)
        assert "ended by signal SIGTERM after asking rank 0 to requeue" in run1, run1[-2000:]
    print(f"\nSUBMITIT ranks xid79 (no collective): rank 1's GPU {got['gpu']} on {got['node']} lost; rank 1 "
          f"{'signalled the step' if asked else 'was ended before it signalled (the fault signal came first)'}; "
          f"rank 0 pickled step {ckpt[0]} (its last step {_steps_done(run0)}), rank 1 had done {_steps_done(run1)}; "
          f"resumed from step {start}")


@pytest.mark.parametrize("kind", ["xid79", "ecc", "nvlink"])
def test_submitit_ranks_in_a_collective_blocked_by_a_fault_on_rank_1_are_ended_by_the_hang_rule(
        fwlab, tmp_path, kind):
    """The ranks all-reduce every step. On rank 1's GPU: XID 79 (its next step fails, it signals the step),
    an uncorrectable ECC error (it aborts) or NVLink down (the collective hangs on both). Once rank 1 has
    met the fault, rank 0 blocks in the collective with the preemption signal held, as in NCCL: nobody
    can checkpoint on the signal. The runner's hang rule ends the step (no step heartbeat after the
    fault signal; not the collective's 600 s timeout) and requeues; the job resumes from its last
    durable save, losing at most EVERY steps. When the fault signal reaches rank 0 first (between two
    collectives, before rank 1 met the fault; rare with these short steps), rank 0 checkpoints its
    replica on it, as a healthy rank may: then the job resumes from that pickle, losing nothing."""
    got = _run_ranks(fwlab, tmp_path, kind, collective=True)
    run0, run1, start, source = _judge_ranks(got)
    assert "collective ranks=2 " in run0 and "collective ranks=2 " in run1, run0[-2000:]
    done = max(_steps_done(run0), _steps_done(run1))
    hung = re.search(r"the job's ranks are hung: no rank progressed for (\S+)s after the fault signal "
                     r"\(limit (\S+)s\).*?\((\S+)s after the signal", got["runner"])
    pickled = [int(s) for s in re.findall(r"(?m)^submitit-trainer: checkpoint step=(\d+)$", run0)]
    resumed = float(re.findall(r"(?m)^submitit-trainer: start step=\d+ .* time=(\S+)$", got["log0"])[1])
    if source == "pickle":  # the signal came first: rank 0's replica pickled on it
        assert pickled and start == pickled[0], (pickled, source, start)
        assert abs(done - start) <= 1, (done, start)  # its last step, or one more
        print(f"\nSUBMITIT ranks {kind} (collective): the fault signal reached rank 0 first; it pickled step "
              f"{start}; fault -> rank 0 running again {resumed - got['fault']:.1f}s")
        return
    # A "checkpoint step=" line may be there: the held signal's handler can run once the step is being
    # killed (seen: 5.7 s after the signal, as the runner ended the step), and the kill then ends its
    # pickle half way; submitit writes it to a temporary file and renames it, so the old pickle stays.
    saved = [int(s) for s in re.findall(r"(?m)^submitit-trainer: checkpoint saved step=(\d+) ", run0)]
    assert saved and source == "durable" and start == saved[-1], (saved, source, start)
    assert hung, got["runner"][-3000:]
    if kind == "xid79":  # it failed, asked rank 0 (which could not act on it) and was ended with the step
        assert re.search(r"(?m)^submitit-trainer: device error step=\d+ error=DeviceLost ", run1), run1[-3000:]
        assert "asked rank 0 to checkpoint and requeue" in run1, run1[-2000:]
    elif kind == "ecc":  # it aborted, as a CUDA process whose context an uncorrectable error killed
        assert "CUDA error: uncorrectable ECC error encountered" in got["err1"], got["err1"][-2000:]
    else:  # compute still worked: both ranks hung in the collective
        assert "device error" not in run1 and "device error" not in run0, run1[-2000:]
    lost = done - start
    assert 0 <= lost <= EVERY, (lost, start)
    print(f"\nSUBMITIT ranks {kind} (collective) on rank 1's GPU {got['gpu']} of {got['node']}: hang rule ended "
          f"the step {hung.group(3)}s after the signal (limit {hung.group(2)}s); last durable save {saved[-1]}, "
          f"lost {lost} steps; fault -> rank 0 running again {resumed - got['fault']:.1f}s")
