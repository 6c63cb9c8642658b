"""``autoheal sbatch`` command line: the --dry-run output is locked by a recorded reference file.

Regenerate the reference after an intended change with ``AUTOHEAL_RECORD=1 pytest tests/unit/test_sbatch_cli.py``
and review the diff.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoheal.sbatch_helpers.cli import sbatch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sbatch"
REFERENCE = FIXTURES / "dry_run.txt"


def _run(*args, env=None):
    runner = CliRunner()
    return runner.invoke(sbatch, list(args), env={"AUTOHEAL_CONFIG": str(FIXTURES / "autoheal.toml"), **(env or {})},
                         catch_exceptions=False)


def _normalise(text: str) -> str:
    """The fixtures path and the random submission token vary from run to run."""
    import re

    text = re.sub(r"(AUTOHEAL_SUBMIT_TOKEN=)[0-9a-f]{10}\b", r"\1{token}", text)
    return text.replace(str(FIXTURES), "{fixtures}")


def test_dry_run_matches_recorded_reference():
    res = _run("--dry-run", "--notify", "https://hooks.example/T0", "--partition=gpu", "-t", "1:00:00",
               str(FIXTURES / "train.sh"), "--lr", "0.1 0.2")
    assert res.exit_code == 0, res.output
    got = _normalise(res.output)
    if os.environ.get("AUTOHEAL_RECORD"):
        REFERENCE.write_text(got)
    assert REFERENCE.exists(), "no reference yet: run with AUTOHEAL_RECORD=1"
    assert got == REFERENCE.read_text(), "dry-run output changed; re-record with AUTOHEAL_RECORD=1 if intended"


def test_dry_run_json_has_argv_and_script():
    import json

    res = _run("--dry-run", "--json", "--grace", "200", str(FIXTURES / "train.sh"))
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["argv"][:4] == ["sbatch", "--requeue", "--open-mode=append", "--signal=B:USR2@200"]
    assert data["options"]["max_restarts"] == 3  # from the #AUTOHEAL line
    assert data["script"].startswith("#!/bin/bash\n#SBATCH --job-name=tiny\n")


@pytest.mark.parametrize("args, message", [
    (["--no-requeue"], "--no-requeue conflicts"),
    (["--open-mode=truncate"], "--open-mode=truncate conflicts"),
    (["--grace", "1"], "--grace"),
    (["--signal", "KILL"], "cannot be caught"),
])
def test_conflicts_and_bad_options_exit_2(args, message):
    res = _run(*args, str(FIXTURES / "train.sh"))
    assert res.exit_code == 2
    assert message in res.output


def test_missing_and_unreadable_scripts_exit_2(tmp_path):
    res = _run(str(tmp_path / "nope.sh"))
    assert res.exit_code == 2 and "not found" in res.output
    noshebang = tmp_path / "plain.sh"
    noshebang.write_text("echo hi\n")
    res = _run(str(noshebang))
    assert res.exit_code == 2 and "#!" in res.output
    if os.geteuid() != 0:  # root reads anything
        secret = tmp_path / "secret.sh"
        secret.write_text("#!/bin/bash\n")
        secret.chmod(0)
        res = _run(str(secret))
        assert res.exit_code == 2 and "not readable" in res.output
    res = _run()
    assert res.exit_code == 2 and "no SCRIPT" in res.output


def test_sbatch_refusal_is_passed_through_with_exit_1(tmp_path):
    fake = tmp_path / "sbatch"
    fake.write_text("#!/bin/sh\n"
                    "echo 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2\n"
                    "exit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[sbatch]\nsbatch = "{fake}"\n')
    res = _run(str(FIXTURES / "train.sh"), env={"AUTOHEAL_CONFIG": str(cfg)})
    assert res.exit_code == 1
    assert "Invalid partition name specified" in res.output


def test_submission_passes_script_on_stdin_and_prints_job_id(tmp_path):
    fake = tmp_path / "sbatch"
    capture = tmp_path / "captured"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {capture}.args\ncat > {capture}.script\necho 'Submitted batch job 42'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[sbatch]\nsbatch = "{fake}"\n')
    res = _run("--max-restarts", "7", str(FIXTURES / "train.sh"), env={"AUTOHEAL_CONFIG": str(cfg)})
    assert res.exit_code == 0, res.output
    assert res.output == "Submitted batch job 42\n"
    args = (tmp_path / "captured.args").read_text()
    assert "--requeue --open-mode=append --signal=B:USR2@90 --comment=autoheal-runner" in args
    script = (tmp_path / "captured.script").read_text()
    assert "--max-restarts 7" in script and "autoheal.sbatch_helpers.runner" in script


def test_wrap_builds_a_script():
    res = _run("--dry-run", "--wrap", "echo hello")
    assert res.exit_code == 0, res.output
    assert "echo hello" in res.output and "--job-name=wrap" in res.output


def _capturing_sbatch(tmp_path):
    fake = tmp_path / "sbatch"
    capture = tmp_path / "captured"
    fake.write_text(f"#!/bin/sh\ncat > {capture}.script\necho 'Submitted batch job 42'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[sbatch]\nsbatch = "{fake}"\npython = "/py"\n')
    return cfg, tmp_path / "captured.script"


def test_script_path_with_a_newline_never_runs_a_command(tmp_path, monkeypatch):
    """Finding 5: `autoheal sbatch $'evil\\ntouch PWNED\\n#/job.sh'` ran `touch` in the batch shell."""
    cfg, captured = _capturing_sbatch(tmp_path)
    evil_dir = tmp_path / "evil\ntouch PWNED\n#"
    evil_dir.mkdir()
    (evil_dir / "job.sh").write_text("#!/bin/bash\necho hi\n")
    monkeypatch.chdir(tmp_path)
    for extra in ([], ["--dry-run"]):
        res = CliRunner().invoke(sbatch, [*extra, "evil\ntouch PWNED\n#/job.sh"], env={"AUTOHEAL_CONFIG": str(cfg)})
        assert res.exit_code == 2, res.output
        assert res.output.count("\n") == 1 and "control character" in res.output, res.output
        assert "/evil\\ntouch PWNED\\n#/job.sh'" in res.output  # shown escaped, as Python repr
    assert not captured.exists()  # sbatch was never called
    assert not (tmp_path / "PWNED").exists()


def test_arguments_with_newlines_reach_the_runner_intact(tmp_path, monkeypatch):
    cfg, captured = _capturing_sbatch(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ["x\ntouch PWNED", "$(touch PWNED)", "it's"]
    res = CliRunner().invoke(sbatch, [str(FIXTURES / "train.sh"), *args], env={"AUTOHEAL_CONFIG": str(cfg)})
    assert res.exit_code == 0, res.output
    script = captured.read_text()
    fake = tmp_path / "fakepy"
    fake.write_text('#!/bin/bash\nwhile [ "$1" != "--" ]; do shift; done\nshift\nprintf "%s\\0" "$@"\n')
    fake.chmod(0o755)
    gen = tmp_path / "gen.sh"
    gen.write_text(script.replace("exec /py ", f"exec {fake} ", 1))
    out = subprocess.run(["bash", str(gen)], capture_output=True, timeout=10, cwd=tmp_path,
                         env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}).stdout
    assert out.split(b"\0")[:-1] == [a.encode() for a in args]
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("opt", [["--checkpoint-dir", "/ck\n#SBATCH --uid=0"], ["--notify", "https://h/\nx"]])
def test_option_values_with_newlines_exit_2(opt):
    res = _run(*opt, str(FIXTURES / "train.sh"))
    assert res.exit_code == 2 and "control character" in res.output, res.output


def test_allow_foreign_checkpoint_flag_and_default_folder():
    import json

    res = _run("--dry-run", "--json", "--allow-foreign-checkpoint", str(FIXTURES / "train.sh"))
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["options"]["allow_foreign_checkpoint"] is True
    assert f"export AUTOHEAL_SUBMIT_TOKEN={data['submit_token']} " in data["script"]
    assert "export AUTOHEAL_ALLOW_FOREIGN_CHECKPOINT=1 " in data["script"]
    assert data["options"]["checkpoint_dir"] == "/shared/ckpt/%x/%j"  # the fixture config sets one


def test_default_checkpoint_folder_is_unique_per_submission(tmp_path):
    import json

    cfg = tmp_path / "c.toml"
    cfg.write_text('[sbatch]\npython = "/py"\n')
    dirs = set()
    for _ in range(2):
        res = _run("--dry-run", "--json", str(FIXTURES / "train.sh"), env={"AUTOHEAL_CONFIG": str(cfg)})
        data = json.loads(res.output)
        assert data["options"]["checkpoint_dir"] == f"autoheal-checkpoints/%j-{data['submit_token']}"
        assert f"--checkpoint-dir autoheal-checkpoints/%j-{data['submit_token']} " in data["script"]
        dirs.add(data["options"]["checkpoint_dir"])
    assert len(dirs) == 2


def test_invalid_utf8_in_a_wrap_command_is_submitted_byte_for_byte(tmp_path):
    cfg, captured = _capturing_sbatch(tmp_path)
    # argv bytes that are not UTF-8 reach Python as surrogate escapes (b"\xff" -> "\udcff")
    res = CliRunner().invoke(sbatch, ["--wrap", "echo \udcff"], env={"AUTOHEAL_CONFIG": str(cfg)})
    assert res.exit_code == 0, res.output
    assert b"\necho \xff\n" in captured.read_bytes()
