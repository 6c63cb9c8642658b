"""The Slurm hook programs and their command line: ``--help`` helps and runs nothing; stray arguments
are reported and ignored (Slurm passes none; the hook still does its job)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autoheal.hooks.hookargs import early_exit

PROGRAMS = {"healthcheck": "autoheal.hooks.healthcheck", "prolog": "autoheal.hooks.prolog",
            "epilog": "autoheal.hooks.epilog"}


def _run(tmp_path, module, *args):
    journal = tmp_path / "journal.jsonl"
    conf = tmp_path / "autoheal.toml"
    conf.write_text(f'[journal]\npath = "{journal}"\n[hooks]\nstate_dir = "{tmp_path}/state"\n'
                    f'kernel_log = "{tmp_path}/no-kmsg"\n')
    env = {"PATH": "/usr/bin:/bin", "AUTOHEAL_CONFIG": str(conf), "SLURMD_NODENAME": "n1",
           "SLURM_JOB_ID": "7", "LD_LIBRARY_PATH": str(tmp_path / "no-nvml")}
    res = subprocess.run([sys.executable, "-c", f"from {module} import main; main()", *args], env=env,
                         capture_output=True, text=True, timeout=60)
    return res, journal, tmp_path / "state"


@pytest.mark.parametrize("kind", sorted(PROGRAMS))
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_docstring_and_checks_nothing(tmp_path, kind, flag):
    res, journal, state = _run(tmp_path, PROGRAMS[kind], flag)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"usage: autoheal-{kind}") and "Slurm" in res.stdout
    assert not journal.exists() and not state.exists()  # no health pass, no record, no node state


def test_stray_arguments_are_reported_and_the_hook_still_runs(tmp_path):
    res, journal, _ = _run(tmp_path, PROGRAMS["prolog"], "--bogus", "x\ny")
    assert res.returncode == 0, res.stderr  # a prolog never fails Slurm for its own trouble
    assert "autoheal-prolog: warning: arguments ignored (Slurm passes none): '--bogus x\\ny'" in res.stderr
    res, _, _ = _run(tmp_path, PROGRAMS["healthcheck"], "now")
    assert "arguments ignored" in res.stderr
    assert res.returncode in (1, 2)  # it ran: no NVML here, so a failure or "could not tell", not help


def test_early_exit_is_pure(capsys):
    assert early_exit("p", "Doc.", []) is None
    assert capsys.readouterr() == ("", "")
    assert early_exit("p", "Doc.", ["a", "--help"]) == 0
    assert capsys.readouterr().out == "usage: p   (run by Slurm with no arguments)\n\nDoc.\n"
    assert early_exit("p", None, ["x" * 500]) is None
    assert len(capsys.readouterr().err) < 300
