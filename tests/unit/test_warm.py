"""Warm interpreters (``--preload``): the pure parts (sbatch_helpers/warm.py) and the option's plumbing.

The processes themselves (fork, signals, SIGKILL of a client, the epilog) are in
tests/integration/test_warm_local.py; the lab run with the torch trainer in test_warm_torch.py.
"""

from __future__ import annotations

import os
import signal
import struct
from pathlib import Path

import pytest

from autoheal.sbatch_helpers import warm, wrapper
from autoheal.sbatch_helpers.warm_launch import zygote_argv

EXE = "/opt/venv/bin/python"


def _req(argv=("python", "train.py"), exe=EXE, env=None, cwd="/work"):
    return warm.Request(tuple(argv), exe, dict(env or {}), cwd, 0o022, (0, 1))


def test_frames_round_trip_whole_split_and_several_at_once():
    env = {"A": "1", "BAD": "caf\udce9"}  # an undecodable byte of an environment (surrogate escape)
    one = warm.encode(_req(env=env).to_msg())
    two = warm.encode({"kill": int(signal.SIGUSR2)})
    reader = warm.FrameReader()
    got = []
    for i in range(0, len(one + two), 7):  # in pieces of 7 bytes
        got += reader.feed((one + two)[i:i + 7])
    assert [g.get("kill") for g in got] == [None, int(signal.SIGUSR2)]
    assert warm.Request.from_msg(got[0]) == _req(env=env)
    assert reader.take() is not None and reader.take() == {"kill": int(signal.SIGUSR2)} and reader.take() is None


@pytest.mark.parametrize("body, why", [(b"\xff\xfe", "not a frame"), (b"[1, 2]", "not an object"),
                                       (b"{nope", "not a frame")])
def test_frames_that_are_not_ours_are_refused(body, why):
    with pytest.raises(warm.WireError, match=why):
        warm.FrameReader().feed(struct.pack(">I", len(body)) + body)


def test_a_frame_longer_than_the_bound_is_refused_before_it_is_read():
    with pytest.raises(warm.WireError, match="at most"):
        warm.FrameReader().feed(struct.pack(">I", warm.MAX_FRAME + 1))
    with pytest.raises(warm.WireError, match="at most"):
        warm.encode({"env": {"X": "x" * warm.MAX_FRAME}})


@pytest.mark.parametrize("msg, why", [
    ({"v": 2}, "version"),
    ({"v": 1, "argv": [], "env": {}}, "argv"),
    ({"v": 1, "argv": ["python", 3], "env": {}}, "argv"),
    ({"v": 1, "argv": ["python"], "env": {"A": 1}}, "env"),
    ({"v": 1, "argv": ["python"], "env": {}, "cpus": [-1]}, "cpus"),
    ({"v": 1, "argv": ["python"], "env": {}, "exe": EXE, "cwd": "/", "umask": 0o7777}, "umask"),
    ({"v": 1, "argv": ["python"], "env": {}, "exe": None, "cwd": "/", "umask": 0}, "exe"),
])
def test_requests_with_wrong_fields_are_refused(msg, why):
    with pytest.raises(warm.WireError, match=why):
        warm.Request.from_msg(msg)


def test_exit_messages_say_the_code_or_the_signal():
    assert warm.exit_msg(3 << 8) == {"exit": 3}
    assert warm.exit_msg(0) == {"exit": 0}
    assert warm.exit_msg(int(signal.SIGKILL)) == {"signal": int(signal.SIGKILL)}
    assert warm.exit_msg(int(signal.SIGTERM) | 0x80) == {"signal": int(signal.SIGTERM)}  # with a core dump


@pytest.mark.parametrize("args, want", [
    (["train.py", "--lr", "0.1"], warm.Launch(False, "train.py", ("--lr", "0.1"))),
    (["-u", "train.py"], warm.Launch(False, "train.py", (), unbuffered=True)),
    (["-uB", "train.py", "-m", "x"], warm.Launch(False, "train.py", ("-m", "x"), True, True)),
    (["-m", "pkg.main", "-u"], warm.Launch(True, "pkg.main", ("-u",))),
    (["-u", "-mpkg.main", "a"], warm.Launch(True, "pkg.main", ("a",), unbuffered=True)),
    (["--", "train.py"], warm.Launch(False, "train.py", ())),
])
def test_the_python_options_the_child_honours(args, want):
    assert warm.parse_python_args(args) == want


@pytest.mark.parametrize("args, why", [
    (["-c", "print(1)"], "option -c"), (["-X", "importtime", "t.py"], "option -X"), (["-O", "t.py"], "option -O"),
    (["-I", "t.py"], "option -I"), ([], "no script"), (["-"], "no script"), (["-m"], "-m without"),
])
def test_python_options_that_change_the_interpreter_start_afresh(args, why):
    got = warm.parse_python_args(args)
    assert isinstance(got, warm.Refusal) and why in got.why


def test_import_time_variables_that_differ_are_named():
    started = {"PATH": "/a", "OMP_NUM_THREADS": "4", "PYTHONPATH": "/x", "PYTHONUNBUFFERED": "1"}
    same = dict(started, PATH="/b", CUDA_VISIBLE_DEVICES="1", SLURM_PROCID="1", PYTHONUNBUFFERED="")
    assert warm.import_time_differences(started, same) == []  # PATH, GPUs, ranks: read after the fork
    other = dict(started, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", LD_PRELOAD="/lib/x.so")
    del other["PYTHONPATH"]
    assert warm.import_time_differences(started, other) == ["LD_PRELOAD", "MKL_NUM_THREADS", "OMP_NUM_THREADS",
                                                            "PYTHONPATH"]


def test_the_same_interpreter_means_the_same_file_in_the_same_folder(tmp_path):
    real = tmp_path / "usr" / "python3.11"
    real.parent.mkdir()
    real.write_text("")
    for venv in ("a", "b"):
        (tmp_path / venv / "bin").mkdir(parents=True)
        (tmp_path / venv / "bin" / "python").symlink_to(real)
    a, b = str(tmp_path / "a" / "bin" / "python"), str(tmp_path / "b" / "bin" / "python")
    assert warm.same_interpreter(a, a)
    assert not warm.same_interpreter(a, b)  # two venvs on one Python: other site-packages
    assert not warm.same_interpreter(str(real), a) and not warm.same_interpreter("", a)


def test_judge_forks_only_what_a_fresh_interpreter_would_run_the_same(tmp_path):
    exe = str(tmp_path / "python")
    Path(exe).write_text("")
    facts = warm.Facts(exe, {"OMP_NUM_THREADS": "1"})
    ok = warm.judge(_req(argv=("python", "-u", "t.py", "a"), exe=exe, env={"OMP_NUM_THREADS": "1"}), facts)
    assert ok == warm.Launch(False, "t.py", ("a",), unbuffered=True)
    env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "x"}
    assert warm.judge(_req(exe=exe, env=env), facts) == warm.Launch(False, "train.py", (), True, True)
    other = warm.judge(_req(exe="/usr/bin/python3", env={"OMP_NUM_THREADS": "1"}), facts)
    assert isinstance(other, warm.Refusal) and "/usr/bin/python3" in other.why
    differ = warm.judge(_req(exe=exe, env={"OMP_NUM_THREADS": "8"}), facts)
    assert isinstance(differ, warm.Refusal)
    assert "OMP_NUM_THREADS" in differ.why and "before autoheal sbatch" in differ.why
    assert isinstance(warm.judge(_req(argv=("python", "-c", "1"), exe=exe, env={"OMP_NUM_THREADS": "1"}), facts),
                      warm.Refusal)


def test_forking_is_safe_with_one_thread_only(tmp_path):
    assert warm.fork_safe(1) is None
    assert "2 threads" in (warm.fork_safe(2) or "")
    assert "cannot count" in (warm.fork_safe(0) or "")
    tasks = tmp_path / "task"
    tasks.mkdir()
    for tid in ("100", "101", "102"):
        (tasks / tid).mkdir()
    assert warm.thread_count(str(tasks)) == 3
    assert warm.thread_count(str(tmp_path / "missing")) == 0
    assert warm.thread_count() >= 1  # this process's own


def test_preload_lists_are_dotted_module_names():
    assert warm.parse_preload(" torch, torch.optim ,torch._dynamo,torch") == ("torch", "torch.optim", "torch._dynamo")
    assert warm.parse_preload("") == ()
    for bad in ("torch;rm -rf /", "../x", "torch.", "1torch", "a b"):
        with pytest.raises(ValueError, match="not a module name"):
            warm.parse_preload(bad)


def test_the_socket_is_in_the_jobs_private_memory_folder(tmp_path):
    env = {"AUTOHEAL_MEMTIER_BASE": str(tmp_path / "{node}")}
    assert warm.socket_path("gpu1", 1000, "42", env) == str(tmp_path / "gpu1" / "autoheal-memtier-1000" / "42" /
                                                            "warm.sock")
    for job, node in (("42;x", "gpu1"), ("", "gpu1"), ("4" * 13, "gpu1"), ("42", "../etc")):
        with pytest.raises(ValueError):
            warm.socket_path(node, 1000, job, env)


def test_the_warm_step_runs_on_every_node_overlapping_with_all_its_cpus():
    argv = zygote_argv("/usr/bin/srun", ["gpu1", "gpu2", "gpu3"], ("torch", "torch.optim"))
    assert argv[:4] == ["/usr/bin/srun", "--overlap", "--no-kill", "--kill-on-bad-exit=0"]
    assert f"--job-name={warm.STEP_NAME}" in argv and "--nodelist=gpu1,gpu2,gpu3" in argv
    assert not any(a.startswith(("--cpus-per-task", "-c", "--exact")) for a in argv)  # the ranks run in its cgroup
    assert argv[-2:] == ["--preload", "torch,torch.optim"]


def test_preload_reaches_the_runner_and_bad_names_are_refused_at_submission():
    opts = wrapper.check_options(wrapper.WrapperOptions(preload="torch, torch.optim"))
    assert opts.preload == "torch,torch.optim"
    argv = wrapper.runner_argv(opts)
    assert argv[argv.index("--preload") + 1] == "torch,torch.optim"
    assert "--preload" not in wrapper.runner_argv(wrapper.WrapperOptions())  # a job without it pays nothing
    with pytest.raises(wrapper.WrapperError, match="--preload"):
        wrapper.check_options(wrapper.WrapperOptions(preload="torch;id"))
    assert wrapper.parse_wrapper_args(["--preload", "torch"], "#AUTOHEAL") == {"preload": "torch"}
    from autoheal.sbatch_helpers.runner import parse_args

    assert parse_args(["--preload", "torch", "--", "job.sh"]).preload == "torch"
    assert parse_args(["--", "job.sh"]).preload == ""


def test_the_runner_never_ends_the_warm_step_as_a_hung_users_step():
    from autoheal.sbatch_helpers.runner import JobIdentity, Runner, RunnerOptions

    class Steps:
        def job_steps(self, job_id):
            return [("5.batch", "batch"), ("5.0", "autoheal-memtier"), ("5.1", warm.STEP_NAME), ("5.2", "train"),
                    ("5.3", "autoheal-warm")]  # srun's default step name: the command's (srun autoheal-warm ...)

    runner = Runner(RunnerOptions(), JobIdentity("5", "5", 0), slurm=Steps(), env={})  # type: ignore[arg-type]
    assert runner._user_steps() == ["5.2", "5.3"]


def test_the_client_forwards_every_catchable_signal_but_sigchld():
    sigs = __import__("autoheal.sbatch_helpers.warm_client", fromlist=["forwarded"]).forwarded()
    assert {signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGCONT} <= sigs
    assert not sigs & {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}
    assert os.getpid() > 0


def test_a_rank_of_another_job_is_never_forked(tmp_path):
    exe = str(tmp_path / "python")
    Path(exe).write_text("")
    facts = warm.Facts(exe, {"SLURM_JOB_ID": "42"})
    assert isinstance(warm.judge(_req(exe=exe, env={"SLURM_JOB_ID": "42"}), facts), warm.Launch)
    for env in ({"SLURM_JOB_ID": "43"}, {}):
        other = warm.judge(_req(exe=exe, env=env), facts)
        assert isinstance(other, warm.Refusal) and "the warm interpreter of job 42" in other.why
