"""Each backend says what it cannot do, and `autoheal config validate` tells the admin."""

from __future__ import annotations

import json

from click.testing import CliRunner

from autoheal.cli.config_cmd import config
from autoheal.config import load_config
from autoheal.slurm import backend_notes


def _conf(tmp_path, body):
    p = tmp_path / "a.toml"
    p.write_text(body)
    return p


def test_rest_backend_with_scontrol_is_a_note(tmp_path):
    cfg = load_config(_conf(tmp_path, '[slurm]\nbackend = "rest"\nrest_url = "unix:/run/slurmrestd.sock"\n'))
    [(level, text)] = backend_notes(cfg.slurm, scontrol_found=True)
    assert level == "note" and "requeue" in text and "scontrol" in text
    assert "GPU indices" in text and "sacct" in text


def test_rest_backend_without_scontrol_fails_validate(tmp_path):
    conf = _conf(tmp_path, '[slurm]\nbackend = "rest"\nrest_url = "unix:/run/slurmrestd.sock"\n'
                           f'bin_dir = "{tmp_path}/nothing-here"\n')
    cfg = load_config(conf)
    [(level, text)] = backend_notes(cfg.slurm, scontrol_found=False)
    assert level == "error" and "requeue" in text
    res = CliRunner().invoke(config, ["validate", str(conf), "--json"],
                             env={"PATH": str(tmp_path / "nothing-here")})
    # the lookup also searches the usual install dirs: only assert the error path where scontrol is absent
    out = json.loads(res.stdout)
    if out["notes"][0]["level"] == "error":
        assert res.exit_code == 2 and not out["ok"]
    else:
        assert res.exit_code == 0 and out["ok"]


def test_cli_backend_has_nothing_to_say(tmp_path):
    cfg = load_config(_conf(tmp_path, ""))
    assert backend_notes(cfg.slurm, scontrol_found=True) == []
    res = CliRunner().invoke(config, ["validate", str(_conf(tmp_path, ""))])
    assert res.exit_code == 0 and res.stdout.strip().endswith(": ok")


def test_pyslurm_backend_notes_say_what_it_cannot_do(tmp_path):
    cfg = load_config(_conf(tmp_path, '[slurm]\nbackend = "pyslurm"\n'))
    notes = backend_notes(cfg.slurm, scontrol_found=True)
    assert [level for level, _ in notes] == ["note", "note"]
    assert "reboot" in notes[0][1] and "sacct" in notes[1][1]
