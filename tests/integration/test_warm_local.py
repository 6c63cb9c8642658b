"""Warm interpreters as processes, on this machine without Slurm: a real warm interpreter
(``python -m autoheal.sbatch_helpers.warm_zygote``) and real ``autoheal-warm`` clients, with the
environment a Slurm step gives them (node name, job id, the lab's per-node memory folder).

What a rank started through it must keep: its argv, environment, working directory, umask and stdio; the
grace signal reaches the script's handler; its exit code and its death by a signal come back to the
client; a client killed by SIGKILL takes the rank (and what it started) with it; with no warm
interpreter to use, the command runs afresh and one line says why; a preloaded module that keeps a thread
means no forking; the epilog ends a warm interpreter a killed job left, and its ranks with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_for

from autoheal import memtier_files

PY = sys.executable
CLIENT = str(Path(PY).parent / "autoheal-warm")
NODE, JOB = "n1", "42"

SCRIPT = r"""
import json, os, signal, subprocess, sys, time
mode = sys.argv[1]
if mode == "report":
    print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "x": os.environ.get("X"),
                      "warm": os.environ.get("AUTOHEAL_WARM"), "umask": os.umask(0o22), "name": __name__,
                      "path0": sys.path[0], "stdin": sys.stdin.read(),
                      "json_loaded_before": "json" in START_MODULES}), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    sys.exit(3)
if mode == "grace":
    got = []  # the handler only notes it (printing there could land inside the print below)
    signal.signal(signal.SIGUSR2, lambda *a: got.append(1))
    print("up", flush=True)
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    print("checkpoint saved on USR2" if got else "no signal", flush=True)
    sys.exit(99 if got else 1)
if mode == "sleeper":
    child = subprocess.Popen(["sleep", "60"])
    print(f"pids {os.getpid()} {child.pid}", flush=True)
    time.sleep(60)
if mode == "die":
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
"""


@pytest.fixture
def site(tmp_path):
    base = tmp_path / "mem" / "{node}"
    (tmp_path / "mem" / NODE).mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "AUTOHEAL_"))}
    env.update(SLURMD_NODENAME=NODE, SLURM_JOB_ID=JOB, AUTOHEAL_MEMTIER_BASE=str(base))
    script = tmp_path / "rank.py"
    script.write_text("import sys\nSTART_MODULES = set(sys.modules)\n" + SCRIPT)
    work = tmp_path / "work"
    work.mkdir()
    return {"env": env, "script": str(script), "work": work, "tmp": tmp_path}


class Zygote:
    def __init__(self, env: dict, preload: str = "json"):
        self.proc = subprocess.Popen([PY, "-m", "autoheal.sbatch_helpers.warm_zygote", "--preload", preload], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        self.first = self.proc.stdout.readline()  # "ready", or why it does not serve

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def zygote(site):
    z = Zygote(site["env"])
    assert " ready: imported json " in z.first, z.first
    yield z
    z.stop()


def _client_env(site, **extra):
    return dict(site["env"], AUTOHEAL_PRELOAD="json", **extra)


def _run(site, *args, env=None, **kw):
    return subprocess.run([CLIENT, PY, site["script"], *args], env=env or _client_env(site), cwd=site["work"],
                          capture_output=True, text=True, timeout=60, **kw)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"  # a zombie no one reaped yet is gone too
    except FileNotFoundError:
        return True


def test_a_rank_runs_in_the_warm_interpreter_with_the_clients_surroundings(site, zygote):
    res = _run(site, "report", "--lr", "0.1", env=_client_env(site, X="from-the-step"), input="hello",
               umask=0o027)
    assert res.returncode == 3, res.stderr
    got = json.loads(res.stdout.splitlines()[0])
    assert got["warm"] == str(zygote.proc.pid)  # forked from it: its pid in the marker
    assert got["json_loaded_before"]  # preloaded: the script found json imported at its first line
    assert got["argv"] == [site["script"], "report", "--lr", "0.1"] and got["name"] == "__main__"
    assert (got["cwd"], got["x"], got["umask"], got["stdin"]) == (str(site["work"]), "from-the-step", 0o027, "hello")
    assert got["path0"] == str(Path(site["script"]).parent)
    assert "to stderr" in res.stderr and "afresh" not in res.stderr


def test_the_grace_signal_reaches_the_scripts_handler_and_its_exit_code_comes_back(site, zygote):
    proc = subprocess.Popen([CLIENT, PY, site["script"], "grace"], env=_client_env(site), cwd=site["work"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "up\n"
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(30) == 99
    assert "checkpoint saved on USR2" in proc.stdout.read()
    proc.stdout.close()


def test_a_client_killed_by_sigkill_takes_the_rank_and_what_it_started_with_it(site, zygote):
    proc = subprocess.Popen([CLIENT, PY, site["script"], "sleeper"], env=_client_env(site), cwd=site["work"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    rank, child = (int(p) for p in proc.stdout.readline().split()[1:])
    proc.kill()
    assert proc.wait(10) == -signal.SIGKILL
    wait_for(lambda: _gone(rank) and _gone(child), 20, "the rank and its sleep gone")
    proc.stdout.close()
    assert zygote.proc.poll() is None  # the warm interpreter serves on


def test_a_rank_that_dies_of_a_signal_kills_its_client_with_the_same_signal(site, zygote):
    assert _run(site, "die").returncode == -signal.SIGTERM


def test_without_a_warm_interpreter_to_use_the_command_runs_afresh_saying_why(site, zygote):
    plain = _run(site, "report", env=site["env"], input="")  # the job has no --preload
    assert plain.returncode == 3 and json.loads(plain.stdout.splitlines()[0])["warm"] is None
    assert "submitted without --preload: starting" in plain.stderr
    other_job = _run(site, "report", env=_client_env(site, SLURM_JOB_ID="43"), input="")
    assert other_job.returncode == 3 and "no warm interpreter on this node" in other_job.stderr
    differ = _run(site, "report", env=_client_env(site, OMP_NUM_THREADS="7"), input="")
    assert differ.returncode == 3 and json.loads(differ.stdout.splitlines()[0])["warm"] is None
    assert "OMP_NUM_THREADS differ from the warm interpreter's" in differ.stderr
    flags = subprocess.run([CLIENT, PY, "-c", "print('ran')"], env=_client_env(site), capture_output=True, text=True,
                           timeout=60)
    assert flags.stdout == "ran\n" and "option -c" in flags.stderr
    missing = subprocess.run([CLIENT, "no-such-command-here"], env=_client_env(site), capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 127 and "not on PATH" in missing.stderr


def test_a_preloaded_module_that_keeps_a_thread_means_no_forking(site):
    (site["tmp"] / "threaded.py").write_text("import threading, time\n"
                                             "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    env = dict(site["env"], PYTHONPATH=str(site["tmp"]))
    z = Zygote(env, preload="threaded")
    try:
        assert "not serving: the warm interpreter has 2 threads" in z.first, z.first
        assert z.proc.wait(30) == 0
        res = _run(site, "report", env=dict(env, AUTOHEAL_PRELOAD="threaded"), input="")
        assert res.returncode == 3 and "no warm interpreter on this node" in res.stderr
    finally:
        z.stop()


def test_sigterm_ends_the_warm_interpreter_once_its_ranks_have_ended(site, zygote):
    proc = subprocess.Popen([CLIENT, PY, site["script"], "grace"], env=_client_env(site), cwd=site["work"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    zygote.proc.send_signal(signal.SIGTERM)  # Slurm ending the job: every step gets it, the ranks too
    wait_for(lambda: "no warm interpreter" in _run(site, "report", input="").stderr, 20, "no new ranks taken")
    assert zygote.proc.poll() is None  # a rank still runs (its own SIGTERM came through its own client)
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(30) == 99
    assert zygote.proc.wait(30) == 0
    proc.stdout.close()


def test_the_epilog_ends_a_warm_interpreter_a_killed_job_left_and_its_ranks_die_with_it(site, zygote):
    proc = subprocess.Popen([CLIENT, PY, site["script"], "sleeper"], env=_client_env(site), cwd=site["work"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    rank, sleep = (int(p) for p in proc.stdout.readline().split()[1:])
    lines = memtier_files.epilog_cleanup(NODE, os.geteuid(), JOB, lambda job: ("GONE", 0), site["env"])
    assert f"killed warm interpreter {zygote.proc.pid} of job {JOB}" in lines, lines
    assert zygote.proc.wait(10) == -signal.SIGKILL
    wait_for(lambda: _gone(rank), 20, "the rank gone with its warm interpreter")
    assert proc.wait(10) == -signal.SIGKILL  # its client says how the rank ended
    assert not (site["tmp"] / "mem" / NODE / f"autoheal-memtier-{os.geteuid()}" / JOB).exists()
    proc.stdout.close()
    # what the rank started is left to Slurm, which ends the warm interpreters' step with the job (its
    # processes are that step's); here there is no Slurm
    with contextlib.suppress(ProcessLookupError):
        os.kill(sleep, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_a_signal_that_reaches_the_rank_before_its_handlers_are_reset_is_not_lost(site, sig):
    # The client forwards a signal as soon as it knows the child's pid, which can be before the child has
    # put its signals back to a fresh interpreter's defaults: there the warm interpreter ignores USR1 and
    # notes TERM in its own handler. A preloaded module's at-fork hook sends the signal at that instant;
    # a fresh Python dies of a USR1 or TERM that comes before its script handles it, and so must the rank.
    (site["tmp"] / "early.py").write_text(
        "import os, signal\n"
        f"os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), {int(sig)}))\n")
    env = dict(site["env"], PYTHONPATH=str(site["tmp"]))
    z = Zygote(env, preload="early")
    try:
        assert " ready: imported early " in z.first, z.first
        res = _run(site, "report", env=dict(env, AUTOHEAL_PRELOAD="early"), input="")
        assert res.returncode == -sig, (res.returncode, res.stdout, res.stderr)
        assert z.proc.poll() is None  # the warm interpreter serves on
    finally:
        z.stop()


def test_a_memory_folder_that_is_not_the_users_own_private_one_is_never_used(site, zygote):
    # The memory base is world-writable like /dev/shm: anyone can make autoheal-memtier-<uid> for another
    # user before that user does, a symlink or a folder with a warm.sock symlink to a socket the user
    # serves (here: the warm interpreter of the user's job on node n1), which the peer check passes.
    uid = os.getuid()
    real = site["tmp"] / "mem" / NODE / f"autoheal-memtier-{uid}"
    (site["tmp"] / "mem" / "n2").mkdir()
    (site["tmp"] / "mem" / "n2" / f"autoheal-memtier-{uid}").symlink_to(real)
    linked = _run(site, "report", env=_client_env(site, SLURMD_NODENAME="n2"), input="")
    assert linked.returncode == 3 and json.loads(linked.stdout.splitlines()[0])["warm"] is None, linked.stderr
    assert "no warm interpreter to trust on this node" in linked.stderr
    if os.geteuid() != 0:
        return  # a folder of another owner: only root can make one here
    planted = site["tmp"] / "mem" / "n3" / f"autoheal-memtier-{uid}" / JOB
    planted.mkdir(parents=True)
    (planted / "warm.sock").symlink_to(real / JOB / "warm.sock")
    for folder in (planted, planted.parent):
        os.chown(folder, 65534, 65534)
    res = _run(site, "report", env=_client_env(site, SLURMD_NODENAME="n3"), input="")
    assert res.returncode == 3 and json.loads(res.stdout.splitlines()[0])["warm"] is None, res.stderr
    assert "not this user's private folder" in res.stderr


def test_a_warm_interpreter_that_dies_mid_job_takes_its_ranks_and_the_next_ranks_start_afresh(site, zygote):
    proc = subprocess.Popen([CLIENT, PY, site["script"], "sleeper"], env=_client_env(site), cwd=site["work"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    rank, sleep = (int(p) for p in proc.stdout.readline().split()[1:])
    zygote.proc.kill()  # the OOM killer, a bug in a preloaded module
    assert proc.wait(30) == -signal.SIGKILL  # the client says how the rank ended: killed with it
    wait_for(lambda: _gone(rank), 20, "the rank gone with its warm interpreter")
    # what the rank started is left to Slurm (no Slurm here); it holds the client's stderr open
    with contextlib.suppress(ProcessLookupError):
        os.kill(sleep, signal.SIGKILL)
    assert "the warm interpreter ended before the rank did" in proc.stderr.read()
    after = _run(site, "report", input="")  # its socket is still there, nobody listens on it
    assert after.returncode == 3 and json.loads(after.stdout.splitlines()[0])["warm"] is None
    assert "no warm interpreter on this node (still importing, or ended)" in after.stderr
    proc.stdout.close()
    proc.stderr.close()
