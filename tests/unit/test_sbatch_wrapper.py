"""Pure logic of ``autoheal sbatch``: option parsing, precedence, conflicts, the generated script."""

from __future__ import annotations

import subprocess

import pytest

from autoheal.config import parse_config
from autoheal.sbatch_helpers import wrapper as w

SCRIPT = "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --signal=B:USR1@300\n#AUTOHEAL --grace 60\necho run\n#SBATCH --ignored\n"


def plan(text=SCRIPT, sbatch_args=(), overrides=None, defaults=None, args=()):
    return w.build_plan(w.SubmitRequest(script_path="/x/job.sh", script_text=text, script_args=list(args),
                                        sbatch_args=list(sbatch_args), cli_overrides=overrides or {},
                                        defaults=defaults or w.WrapperOptions(), python="/py"))


def test_parse_sbatch_options_long_short_and_values():
    opts, rest = w.parse_sbatch_options(["-N2", "--time", "10", "--exclusive", "-x", "a,b", "--mem=1G",
                                         "job.sh", "--lr", "1"])
    assert [(o.name, o.value) for o in opts] == [("nodes", "2"), ("time", "10"), ("exclusive", None),
                                                 ("exclude", "a,b"), ("mem", "1G")]
    assert rest == ["job.sh", "--lr", "1"]
    with pytest.raises(w.WrapperError, match="needs a value"):
        w.parse_sbatch_options(["--time"])


def test_header_parsing_stops_at_first_command_like_sbatch():
    parsed = w.parse_script(SCRIPT)
    assert parsed.sbatch_lines == ["#SBATCH -N 2", "#SBATCH --signal=B:USR1@300"]
    assert parsed.autoheal_args == ["--grace", "60"]


def test_precedence_config_then_script_signal_then_autoheal_lines_then_cli():
    cfg = parse_config('[sbatch]\ngrace = 30\nmax_restarts = 9\nsignal = "USR2"\n')
    p = plan(defaults=w.defaults_from_config(cfg.sbatch))
    # script's B:USR1@300 beats config; #AUTOHEAL --grace 60 beats the script's @300
    assert (p.options.signal, p.options.grace, p.options.max_restarts) == ("USR1", 60, 9)
    p = plan(overrides={"grace": 45, "max_restarts": 2})
    assert (p.options.grace, p.options.max_restarts) == (45, 2)
    assert "--signal=B:USR1@45" in p.argv


def test_adds_requeue_append_signal_comment_and_job_name():
    p = plan(sbatch_args=["--comment", "mine", "-p", "gpu"])
    assert p.argv[:5] == ["sbatch", "--requeue", "--open-mode=append", "--signal=B:USR1@60",
                          "--comment=autoheal-runner | mine"]
    assert "--job-name=job.sh" in p.argv and p.argv[-2:] == ["-p", "gpu"]


def test_user_requeue_and_append_are_fine_conflicts_are_errors():
    assert "--requeue" not in plan(sbatch_args=["--requeue=expedite"]).argv[1:2]
    plan(sbatch_args=["--requeue", "--open-mode=append"])
    with pytest.raises(w.WrapperError, match="--no-requeue"):
        plan(text="#!/bin/bash\n#SBATCH --no-requeue\n")
    with pytest.raises(w.WrapperError, match="truncate"):
        plan(sbatch_args=["--open-mode", "truncate"])
    with pytest.raises(w.WrapperError, match="unknown option"):
        plan(text="#!/bin/bash\n#AUTOHEAL --bogus 1\n")


def test_non_batch_signal_in_script_is_replaced_with_a_warning():
    p = plan(text="#!/bin/bash\n#SBATCH --signal=USR1@90\n")
    assert any("replaced" in x for x in p.warnings)
    assert "--signal=B:USR2@120" in p.argv


def test_signal_spec_parsing():
    assert w.parse_signal_spec("B:USR2@90") == ("USR2", 90)
    assert w.parse_signal_spec("SIGTERM") == ("TERM", None)
    assert w.parse_signal_spec("12") == ("USR2", None)
    for bad in ("KILL", "NOPE", "B:USR2@x", "Q:USR2"):
        with pytest.raises(w.WrapperError):
            w.parse_signal_spec(bad)


def test_split_command_line_finds_wrapper_options_among_sbatch_options():
    sb, late, script, args = w.split_command_line(["-N", "2", "--grace", "50", "--parsable", "--exclude", "g3",
                                                   "job.sh", "--grace", "1"])
    assert sb == ["-N", "2", "--parsable", "--exclude", "g3"]
    assert late == {"grace": 50}
    assert script == "job.sh" and args == ["--grace", "1"]  # after SCRIPT: the script's own arguments


def test_generated_script_embeds_the_script_verbatim_and_runs_the_runner(tmp_path):
    tricky = "#!/bin/bash\n#SBATCH -N 1\necho '$HOME' \"$1\" `x`\nAUTOHEAL_USER_SCRIPT_X\n"
    p = plan(text=tricky, args=["a b", "$c"])
    script = p.script
    assert script.startswith("#!/bin/bash\n#SBATCH -N 1\n")
    # run the generated script with a fake "python" that prints its script argument's content
    fake = tmp_path / "py"
    fake.write_text('#!/bin/bash\nwhile [ "$1" != "--script" ]; do shift; done\ncat "$2"; shift 3; '
                    'printf "<%s>" "$@"\n')
    fake.chmod(0o755)
    gen = tmp_path / "gen.sh"
    gen.write_text(script.replace("exec /py", f"exec {fake}"))
    out = subprocess.run(["bash", str(gen)], capture_output=True, text=True, timeout=10,
                         env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}).stdout
    assert out == tricky + "<a b><$c>"


def test_wrap_script_matches_sbatch():
    assert w.wrap_script("hostname").startswith("#!/bin/sh\n")
