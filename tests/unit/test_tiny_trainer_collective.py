"""The tiny trainer's collective: 2 real ranks over loopback. A dead peer blocks the survivor (as NCCL
does, until its timeout), and while blocked the grace signal's handler does not run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import autoheal.sbatch_helpers

TINY = Path(autoheal.sbatch_helpers.__file__).parent / "examples" / "tiny_trainer.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rank:
    def __init__(self, rank: int, port: int, ckpt: Path, *args: str):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOHEAL_", "SLURM_"))}
        env.update(SLURM_PROCID=str(rank), SLURM_NTASKS="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        self.proc = subprocess.Popen([sys.executable, str(TINY), "--collective", "--checkpoint-dir", str(ckpt),
                                      "--checkpoint-every", "1000", *args], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def wait_line(self, prefix: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ln in list(self.lines):
                if ln.startswith(f"autoheal-trainer: {prefix}"):
                    return ln
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.02)
        raise AssertionError(f"no {prefix!r} line; got {self.lines[-10:]}")

    def finish(self, timeout: float = 30.0) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.finish()


def _pending(pid: int) -> int:
    """The process's pending-signal bits (ShdPnd in /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as fh:
        return next(int(ln.split()[1], 16) for ln in fh if ln.startswith("ShdPnd:"))


def test_signals_blocked_holds_the_handler_until_the_block_ends():
    from autoheal.sbatch_helpers.examples.tiny_trainer import signals_blocked

    seen = []
    old = signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
    try:
        with signals_blocked({signal.SIGUSR1}):
            # to this thread: a process-directed signal may go to another thread (pytest-xdist's), whose
            # C handler then has the main thread run the Python handler at its next bytecode
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
            time.sleep(0.2)  # PEP 475: a sleep interrupted by a signal runs its handler; this one is held
            assert seen == []
        assert seen == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, old)


@pytest.fixture
def ranks(tmp_path):
    made = []

    def start(*args: str):
        port = _port()
        pair = [Rank(r, port, tmp_path / "ckpt", *args) for r in (0, 1)]
        made.extend(pair)
        return pair

    yield start
    for r in made:
        r.kill()


def test_two_ranks_allreduce_every_step_and_finish_with_the_uninterrupted_state(ranks):
    from autoheal.sbatch_helpers.examples.tiny_trainer import expected_final_state

    r0, r1 = ranks("--steps", "20", "--step-seconds", "0", "--timestamps")
    assert r0.finish() == 0 and r1.finish() == 0
    assert any(ln.startswith("autoheal-trainer: collective ranks=2 hub=127.0.0.1:") for ln in r0.lines)
    for r in (r0, r1):
        assert f"autoheal-trainer: done step=20 final_state={expected_final_state(20)}" in r.lines
        assert any(ln.startswith("autoheal-trainer: step=20 time=") for ln in r.lines)


def test_a_dead_peer_blocks_the_survivor_until_the_timeout_and_the_signal_waits_for_it(ranks):
    r0, r1 = ranks("--steps", "100000", "--step-seconds", "0.05", "--collective-timeout", "6")
    r0.wait_line("step=5")
    r1.kill()  # kill -9: no FIN-time goodbye the survivor could act on beyond EOF
    time.sleep(1.0)
    steps_then = [ln for ln in r0.lines if ln.startswith("autoheal-trainer: step=")]
    r0.proc.send_signal(signal.SIGUSR2)  # the grace signal, while rank 0 is blocked in the collective
    time.sleep(1.0)
    assert r0.proc.poll() is None, r0.lines[-5:]  # blocked, not failed fast on the EOF
    assert [ln for ln in r0.lines if ln.startswith("autoheal-trainer: step=")] == steps_then  # no progress
    # the signal is held pending by the mask (a handler that ran would have consumed it)
    assert _pending(r0.proc.pid) & (1 << (signal.SIGUSR2 - 1)), _pending(r0.proc.pid)
    assert r0.finish() == 1
    failed = r0.lines.index(r0.wait_line("collective failed"))
    assert "peer_gone" in r0.lines[failed]
    assert not any("checkpoint saved" in ln or "preempted" in ln for ln in r0.lines)


def test_the_signal_delivered_outside_the_collective_still_saves(ranks):
    r0, r1 = ranks("--steps", "100000", "--step-seconds", "0.2")
    r0.wait_line("step=3")
    r1.wait_line("step=3")
    for r in (r0, r1):
        r.proc.send_signal(signal.SIGUSR2)
    assert r0.finish() == 99 and r1.finish() == 99
    assert r0.wait_line("preempted step=").split()[-2].startswith("checkpoint=/")


def test_rendezvous_follows_the_step():
    from autoheal.sbatch_helpers.examples.tiny_trainer import rendezvous

    assert rendezvous({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}) == ("10.0.0.1", 1234)
    a = rendezvous({"SLURM_STEP_NODELIST": "gpu[03-05,07]", "SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0"})
    b = rendezvous({"SLURM_STEP_NODELIST": "gpu[03-05,07]", "SLURM_JOB_ID": "41", "SLURM_STEP_ID": "1"})
    assert a[0] == "gpu03" and a[1] != b[1] and 20000 <= a[1] < 32000
