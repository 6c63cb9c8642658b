"""The example trainers as a job would run them: subprocess, grace signal, exit code, resume."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import autoheal.sbatch_helpers
from autoheal.sbatch_helpers import checkpoint as ck
from autoheal.sbatch_helpers.progress import HEARTBEAT_DIR

EXAMPLES = Path(autoheal.sbatch_helpers.__file__).parent / "examples"
TINY = EXAMPLES / "tiny_trainer.py"
DDP = EXAMPLES / "ddp_trainer.py"


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tiny = _load(TINY)


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AUTOHEAL_", "SLURM_")) and k not in ("RANK", "WORLD_SIZE")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(args, env=None, timeout=20):
    return subprocess.run([sys.executable, str(TINY), *map(str, args)], env=env or clean_env(),
                          capture_output=True, text=True, timeout=timeout)


def lines(out: str) -> list:
    return [ln[len("autoheal-trainer: "):] for ln in out.splitlines() if ln.startswith("autoheal-trainer: ")]


def field(out: str, pattern: str) -> str:
    m = re.search(pattern, out, re.M)
    assert m, f"{pattern!r} not in output:\n{out}"
    return m.group(1)


def run_until_signal(args, sig, after_step, env=None):
    """Start the trainer, send ``sig`` once it printed ``step=<after_step>``; return (rc, stdout)."""
    proc = subprocess.Popen([sys.executable, str(TINY), *map(str, args)], env=env or clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    deadline = time.monotonic() + 20
    try:
        for line in proc.stdout:
            out.append(line)
            if line.strip() == f"autoheal-trainer: step={after_step}":
                proc.send_signal(sig)
                break
            assert time.monotonic() < deadline, "".join(out)
        rest, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    return proc.returncode, "".join(out) + rest, err


UNINTERRUPTED = tiny.expected_final_state(40)


def test_uninterrupted_run(tmp_path):
    r = run(["--steps", 40, "--step-seconds", 0, "--checkpoint-every", 10, "--checkpoint-dir", tmp_path])
    assert r.returncode == 0, r.stderr
    ls = lines(r.stdout)
    assert ls[0].startswith("start step=0 resumed_from=none restart=0 host=")
    assert " rank=0 world=1 steps=40 reason=none" in ls[0]
    assert ls[1] == "step=1"
    assert f"checkpoint saved step=10 path={tmp_path / 'ckpt-00000010'}" in ls
    assert ls[-1] == f"done step=40 final_state={UNINTERRUPTED}"
    assert ck.CheckpointManager(tmp_path).load().step == 40
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000020", "ckpt-00000030", "ckpt-00000040", "latest"]


def test_state_is_order_sensitive():
    assert tiny.expected_final_state(3) == tiny.advance(tiny.advance(tiny.advance(0, 0), 1), 2)
    assert tiny.advance(tiny.advance(0, 1), 0) != tiny.advance(tiny.advance(0, 0), 1)


def test_preempt_saves_exits_99_and_resume_matches_uninterrupted(tmp_path):
    # 100 steps of 30 ms: the signal lands long before the end even on a loaded machine
    args = ["--steps", 100, "--step-seconds", 0.03, "--checkpoint-every", 10, "--checkpoint-dir", tmp_path]
    rc, out, err = run_until_signal(args, signal.SIGUSR2, after_step=13)
    assert rc == tiny.EXIT_PREEMPTED == 99, err
    stop = int(field(out, r"^autoheal-trainer: preempted step=(\d+) "))
    got_at = int(field(out, r"^autoheal-trainer: signal received USR2 at step=(\d+)$"))
    assert 13 <= got_at <= stop < 100
    assert stop - got_at in (0, 1)  # saved at the next step boundary (maybe the one it arrived at)
    path = tmp_path / ck.checkpoint_name(stop)
    assert f"autoheal-trainer: checkpoint saved step={stop} path={path}" in out
    assert f"checkpoint={path} exit=99" in out
    assert ck.find_resume_point(tmp_path) == path

    env = clean_env(AUTOHEAL_RESUME_FROM=path, AUTOHEAL_RESTART_COUNT=1,
                    AUTOHEAL_REQUEUE_REASON="preempted by high prio", SLURMD_NODENAME="gpu07")
    r = run(args[:2] + ["--step-seconds", 0] + args[4:], env=env)
    assert r.returncode == 0, r.stderr
    ls = lines(r.stdout)
    assert ls[0] == (f"start step={stop} resumed_from={path} restart=1 host=gpu07 rank=0 world=1 steps=100 "
                     "reason=preempted_by_high_prio")
    assert ls[1] == f"step={stop + 1}"
    assert ls[-1] == f"done step=100 final_state={tiny.expected_final_state(100)}"


def test_sigterm_also_saves(tmp_path):
    args = ["--steps", 100, "--step-seconds", 0.03, "--checkpoint-every", 100, "--checkpoint-dir", tmp_path]
    rc, out, _ = run_until_signal(args, signal.SIGTERM, after_step=5)
    assert rc == 99
    assert "signal received TERM" in out
    stop = int(field(out, r"preempted step=(\d+) "))
    assert ck.CheckpointManager(tmp_path).load().step == stop


def test_grace_signal_from_env(tmp_path):
    env = clean_env(AUTOHEAL_GRACE_SIGNAL="USR1")
    args = ["--steps", 100, "--step-seconds", 0.03, "--checkpoint-dir", tmp_path]
    rc, out, _ = run_until_signal(args, signal.SIGUSR1, after_step=3, env=env)
    assert rc == 99 and "signal received USR1" in out


def test_resume_from_dir_skips_torn_newest(tmp_path):
    r = run(["--steps", 20, "--step-seconds", 0, "--checkpoint-every", 5, "--checkpoint-dir", tmp_path])
    assert r.returncode == 0
    (tmp_path / "ckpt-00000020" / "COMPLETE").unlink()  # as if killed while saving the last one
    r = run(["--steps", 40, "--step-seconds", 0, "--checkpoint-every", 5, "--checkpoint-dir", tmp_path])
    ls = lines(r.stdout)
    assert "warning skipped ckpt-00000020: marker COMPLETE missing (torn or unfinished save)" in ls
    assert any(ln.startswith(f"start step=15 resumed_from={tmp_path / 'ckpt-00000015'}") for ln in ls)
    assert ls[-1] == f"done step=40 final_state={UNINTERRUPTED}"


def test_bad_resume_env_falls_back_to_dir(tmp_path):
    run(["--steps", 10, "--step-seconds", 0, "--checkpoint-every", 5, "--checkpoint-dir", tmp_path])
    env = clean_env(AUTOHEAL_RESUME_FROM=tmp_path / "ckpt-00000099", AUTOHEAL_CHECKPOINT_DIR=tmp_path)
    r = run(["--steps", 40, "--step-seconds", 0], env=env)
    assert r.returncode == 0
    assert "warning AUTOHEAL_RESUME_FROM ignored" in r.stdout
    assert f"start step=10 resumed_from={tmp_path / 'ckpt-00000010'}" in r.stdout
    assert f"final_state={UNINTERRUPTED}" in r.stdout


def test_other_ranks_never_write(tmp_path):
    env = clean_env(SLURM_PROCID=1, SLURM_NTASKS=2, AUTOHEAL_CHECKPOINT_DIR=tmp_path)
    r = run(["--steps", 12, "--step-seconds", 0, "--checkpoint-every", 5], env=env)
    assert r.returncode == 0
    assert "rank=1 world=2" in r.stdout and "checkpoint saved" not in r.stdout
    # only its heartbeat (every rank has one, for the runner's hang detection), never a checkpoint
    assert [n for n in os.listdir(tmp_path) if n != HEARTBEAT_DIR] == []
    assert os.listdir(tmp_path / HEARTBEAT_DIR) == ["rank-1"]
    rc, out, _ = run_until_signal(["--steps", 100, "--step-seconds", 0.03], signal.SIGUSR2, 3, env=env)
    assert rc == 99 and "checkpoint=rank0 exit=99" in out
    assert [n for n in os.listdir(tmp_path) if n != HEARTBEAT_DIR] == []


def test_preempt_without_checkpoint_dir_exits_98(tmp_path):
    rc, out, _ = run_until_signal(["--steps", 100, "--step-seconds", 0.03], signal.SIGUSR2, 3)
    assert "warning no checkpoint dir" in out
    assert rc == tiny.EXIT_PREEMPTED_NOT_SAVED == 98
    assert "checkpoint=none exit=98" in out


def test_crash_at_step_exits_1_keeping_earlier_checkpoints(tmp_path):
    r = run(["--steps", 40, "--step-seconds", 0, "--checkpoint-every", 5, "--crash-at-step", 12,
             "--checkpoint-dir", tmp_path])
    assert r.returncode == 1
    assert "crash requested at step=12" in r.stdout
    assert ck.find_resume_point(tmp_path) == tmp_path / "ckpt-00000010"


def test_finished_run_restarted_is_done_at_once(tmp_path):
    run(["--steps", 10, "--step-seconds", 0, "--checkpoint-dir", tmp_path])
    r = run(["--steps", 10, "--step-seconds", 0, "--checkpoint-dir", tmp_path])
    assert r.returncode == 0
    assert lines(r.stdout)[1:] == [f"done step=10 final_state={tiny.expected_final_state(10)}"]


def test_usage_errors():
    assert run(["--checkpoint-every", 0]).returncode == 2


# ---------------------------------------------------------------- ddp_trainer


def _torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


@pytest.mark.skipif(_torch_available(), reason="torch is installed")
def test_ddp_trainer_without_torch_says_so():
    r = subprocess.run([sys.executable, str(DDP), "--steps", "1"], env=clean_env(),
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 3
    assert "needs PyTorch" in r.stderr and "Traceback" not in r.stderr
    assert _load(DDP).first_host("gpu[03-05,07],cpu1") == "gpu03"


@pytest.mark.skipif(not _torch_available(), reason="torch is not installed")
def test_ddp_trainer_preempt_and_resume(tmp_path):
    def start(extra_env, step_seconds):
        env = clean_env(MASTER_ADDR="127.0.0.1", **extra_env)
        args = ["--steps", 20, "--checkpoint-every", 5, "--step-seconds", step_seconds,
                "--checkpoint-dir", tmp_path / "a"]
        return subprocess.Popen([sys.executable, str(DDP), *map(str, args)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    proc = start({}, 0.05)
    out = []
    for line in proc.stdout:
        out.append(line)
        if line.startswith("autoheal-trainer: step=7 "):
            proc.send_signal(signal.SIGUSR2)
            break
    rest, err = proc.communicate(timeout=60)
    text = "".join(out) + rest
    assert proc.returncode == 99, err
    stop = int(field(text, r"preempted step=(\d+) "))
    proc = start({"AUTOHEAL_RESUME_FROM": tmp_path / "a" / ck.checkpoint_name(stop)}, 0)
    resumed, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"start step={stop} " in resumed
    fresh = subprocess.run([sys.executable, str(DDP), "--steps", "20", "--checkpoint-dir", str(tmp_path / "b")],
                           env=clean_env(MASTER_ADDR="127.0.0.1"), capture_output=True, text=True, timeout=60)
    assert field(resumed, r"final_state=(\w+)") == field(fresh.stdout, r"final_state=(\w+)")


def test_a_new_job_with_an_old_job_id_starts_fresh_instead_of_resuming_the_old_jobs_state(tmp_path):
    """Issue 17 item 4, as the trainer sees it: old job 1's step-600 checkpoint sits in the folder (and
    even in AUTOHEAL_RESUME_FROM, as an older job runner would export it); the new job 1 starts at 0."""
    old = ck.CheckpointManager(tmp_path, rank=0, environ={"SLURM_JOB_ID": "1", "AUTOHEAL_SUBMIT_TOKEN": "old0000000"})
    old.save(600, b'{"trainer": "tiny", "step": 600, "state": 1}')
    env = clean_env(SLURM_JOB_ID="1", AUTOHEAL_SUBMIT_TOKEN="new0000000",
                    AUTOHEAL_RESUME_FROM=tmp_path / "ckpt-00000600")
    r = run(["--steps", 20, "--step-seconds", 0, "--checkpoint-every", 10, "--checkpoint-dir", tmp_path], env=env)
    assert r.returncode == 0, r.stderr
    assert "start step=0 resumed_from=none" in r.stdout
    assert "warning AUTOHEAL_RESUME_FROM ignored" in r.stdout and "earlier job 1" in r.stdout
    assert "warning skipped ckpt-00000600: written by an earlier job 1 (submission old0000000)" in r.stdout
    assert f"done step=20 final_state={tiny.expected_final_state(20)}" in r.stdout
    # its own checkpoints carry its owner; a restart of it resumes them; the old one is still there
    again = run(["--steps", 30, "--step-seconds", 0, "--checkpoint-dir", tmp_path],
                env=clean_env(SLURM_JOB_ID="1", AUTOHEAL_SUBMIT_TOKEN="new0000000"))
    assert "start step=20 " in again.stdout, again.stdout
    assert (tmp_path / "ckpt-00000600").is_dir()
    # asked to, it resumes the old job's state
    allowed = run(["--steps", 601, "--step-seconds", 0, "--checkpoint-dir", tmp_path],
                  env=clean_env(SLURM_JOB_ID="1", AUTOHEAL_SUBMIT_TOKEN="new0000000",
                                AUTOHEAL_ALLOW_FOREIGN_CHECKPOINT="1"))
    assert "start step=600 " in allowed.stdout, allowed.stdout


def test_event_times_put_the_trainers_own_clock_on_every_line(tmp_path):
    """--event-times (the drill's): each line carries time=<epoch> from the trainer's clock, so the drill
    stamps a checkpoint or a start from when it happened, not from when its poll read the output."""
    before = time.time()
    res = run(["--steps", "12", "--step-seconds", "0", "--checkpoint-every", "5", "--checkpoint-dir", tmp_path,
               "--event-times"])
    after = time.time()
    assert res.returncode == 0, res.stderr
    out = lines(res.stdout)
    assert any(ln.startswith("start step=0 ") for ln in out) and any(ln.startswith("checkpoint saved") for ln in out)
    stamps = [float(re.search(r" time=([\d.]+)$", ln).group(1)) for ln in out if not ln.startswith("warning")]
    assert len(stamps) == len([ln for ln in out if not ln.startswith("warning")])  # every line, once
    assert all(before - 0.01 <= t <= after + 0.01 for t in stamps) and stamps == sorted(stamps)
    assert sum(ln.count(" time=") for ln in out) == len(out)
    plain = lines(run(["--steps", "3", "--step-seconds", "0"]).stdout)
    assert not any("time=" in ln for ln in plain)  # off by default: the example's output unchanged
