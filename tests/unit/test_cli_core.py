"""The ``autoheal`` CLI core (version, help, config, events) and Slurm binary discovery."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from autoheal import __version__
from autoheal.cli.events_cmd import parse_since
from autoheal.cli.main import cli
from autoheal.errors import ConfigError, SlurmError
from autoheal.journal import Journal, Record
from autoheal.slurm import binaries


@pytest.fixture
def run(monkeypatch):
    monkeypatch.delenv("AUTOHEAL_CONFIG", raising=False)
    runner = CliRunner()

    def invoke(*args, **kw):
        return runner.invoke(cli, list(args), catch_exceptions=False, **kw)

    return invoke


def test_version(run):
    res = run("--version")
    assert res.exit_code == 0
    assert res.stdout.strip() == f"autoheal, version {__version__}"


def test_help_lists_core_commands(run):
    res = run("--help")
    assert res.exit_code == 0
    assert "Self-healing Slurm GPU clusters." in res.stdout
    commands = res.stdout.split("Commands:", 1)[1]
    for name in ("config", "events", "node"):
        assert f"  {name} " in commands or f"  {name}\n" in commands


def test_config_validate_good(run, tmp_path):
    f = tmp_path / "ok.toml"
    f.write_text("[slurm]\nretries = 3\n")
    res = run("config", "validate", str(f))
    assert res.exit_code == 0
    assert res.stdout.strip() == f"{f}: ok"
    res = run("config", "validate", str(f), "--json")
    assert json.loads(res.stdout) == {"ok": True, "file": str(f), "notes": []}


@pytest.mark.parametrize("text, fragment", [
    ("[slurm]\nretries = 'x'\n", "slurm.retries: expected an integer"),
    ("[slurm\n", "not valid TOML"),
    ("[slurm]\nbakend = 'cli'\n", "did you mean 'slurm.backend'"),
    # issue 16: configs that crashed the loader (every prolog exited 1) or passed though they cannot work
    ("a = " + "[" * 3000 + "]" * 3000 + "\n", "not valid TOML: nested too deeply"),
    ("[sync]\nreplacement_action = 'custom-resource'\nreplacement_template = '{\"apiVersion\": 1, \"kind\": \"K\"}'\n",
     "sync.replacement_template: apiVersion 1 must be a string"),
    ('[hooks]\nstate_dir = "/var/lib/a\\u0000b"\n', "hooks.state_dir: '/var/lib/a\\x00b' holds the control character"),
    ("[sbatch]\nsignal = 'USR2; rm -rf /'\n", "sbatch.signal: 'USR2; rm -rf /' is not a signal name"),
    ("[sbatch]\nmax_restarts = 3\nmax-restarts = 4\n", "'sbatch.max_restarts' and 'sbatch.max-restarts' are the same"),
])
def test_config_validate_bad(run, tmp_path, text, fragment):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    res = run("config", "validate", str(f))
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"autoheal: error: {f}: ")
    assert fragment in err
    assert res.stdout == ""


def test_config_validate_missing_file(run, tmp_path):
    res = run("config", "validate", str(tmp_path / "none.toml"))
    assert res.exit_code == 2
    assert "config file not found" in res.stderr


def test_config_validate_bad_json_envelope(run, tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[slurm]\nretries = -5\n")
    res = run("config", "validate", str(f), "--json")
    assert res.exit_code == 2
    out = json.loads(res.stdout)
    assert out["ok"] is False and out["type"] == "ConfigError" and "below the minimum" in out["error"]


def test_config_show_json_reflects_file(run, tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[slurm]\nretries = 5\nbin_dir = '/opt/slurm/bin'\n[notify]\nwebhooks = ['https://h/x']\n")
    res = run("config", "show", "--json", "--config", str(f))
    assert res.exit_code == 0
    data = json.loads(res.stdout)
    assert data["slurm"]["retries"] == 5
    assert data["slurm"]["bin_dir"] == "/opt/slurm/bin"
    assert data["slurm"]["timeout"] == 10.0
    assert data["notify"]["webhooks"] == ["https://h/x"]
    assert data["source"] == str(f)


def test_config_show_uses_env(run, tmp_path, monkeypatch):
    f = tmp_path / "c.toml"
    f.write_text("[journal]\nfsync = false\n")
    monkeypatch.setenv("AUTOHEAL_CONFIG", str(f))
    data = json.loads(run("config", "show", "--json").stdout)
    assert data["journal"]["fsync"] is False


def test_config_show_text(run, tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[slurm]\nretries = 5\n")
    res = run("config", "show", "--config", str(f))
    assert res.exit_code == 0
    assert res.stdout.startswith(f"# effective config (source: {f})")
    assert "[slurm]\n" in res.stdout and "retries = 5\n" in res.stdout
    assert "fsync = true\n" in res.stdout


def test_config_show_bad_file_exit_2(run, tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[slurm]\nbackend = 'rest'\n")
    res = run("config", "show", "--config", str(f))
    assert res.exit_code == 2
    assert "slurm.rest_url: must be set" in res.stderr


def test_config_show_docs(run):
    res = run("config", "show", "--docs")
    assert res.exit_code == 0
    assert "slurm.backend = 'cli'\n    Slurm backend:" in res.stdout
    res = run("config", "show", "--docs", "--json")
    rows = json.loads(res.stdout)
    by = {r["key"]: r for r in rows}
    assert by["slurm.timeout"]["default"] == 10.0
    assert by["slurm.timeout"]["doc"].startswith("Seconds before a Slurm command")
    assert all(r["doc"] for r in rows)


# ---- events ------------------------------------------------------------------------------------------------

@pytest.fixture
def journal_file(tmp_path):
    path = tmp_path / "journal.jsonl"
    j = Journal(path, fsync=False)
    now = time.time()
    j.append(Record(event="detection", node="gpu1", check="xid", time=now - 7200, message="old"))
    j.append(Record(event="drain", node="gpu1", job_ids=["7"], time=now - 300, outcome="drained"))
    j.append(Record(event="requeue", node="gpu2", job_ids=["8"], time=now - 60))
    return path


def test_events_json_all(run, journal_file):
    res = run("events", "--journal", str(journal_file), "--json")
    assert res.exit_code == 0
    out = json.loads(res.stdout)
    assert [r["event"] for r in out["events"]] == ["detection", "drain", "requeue"]
    assert out["skipped"] == 0 and out["journal"] == str(journal_file)
    assert res.stderr == ""


@pytest.mark.parametrize("args, events", [
    (["--node", "gpu1"], ["detection", "drain"]),
    (["--job", "8"], ["requeue"]),
    (["--since", "10m"], ["drain", "requeue"]),
    (["--since", "2m"], ["requeue"]),
    (["--node", "gpu1", "--since", "1h"], ["drain"]),
    (["--node", "nope"], []),
])
def test_events_filters(run, journal_file, args, events):
    res = run("events", "--journal", str(journal_file), "--json", *args)
    assert res.exit_code == 0
    assert [r["event"] for r in json.loads(res.stdout)["events"]] == events


def test_events_text(run, journal_file):
    res = run("events", "--journal", str(journal_file), "--node", "gpu1")
    lines = res.stdout.splitlines()
    assert len(lines) == 2
    assert "gpu1" in lines[1] and "drain" in lines[1] and "jobs=7" in lines[1] and "-> drained" in lines[1]
    assert "[xid]" in lines[0]


def test_events_empty(run, tmp_path):
    res = run("events", "--journal", str(tmp_path / "none.jsonl"))
    assert res.exit_code == 0 and res.stdout.startswith("no events in ")
    res = run("events", "--journal", str(tmp_path / "none.jsonl"), "--node", "x")
    assert "matching the filters" in res.stdout


def test_events_journal_from_config(run, journal_file, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[journal]\npath = '{journal_file}'\n")
    res = run("events", "--config", str(cfg), "--json", "--job", "7")
    assert [r["event"] for r in json.loads(res.stdout)["events"]] == ["drain"]


# ---- issue 16, finding 12: lines that are not records are skipped and counted, never a traceback --------

_BAD_LINES = [
    '{"event": "drain", "node": "gpu9", "time": "yesterday"}',    # time not a number (compared with --since)
    '{"event": "drain", "node": "gpu9", "job_ids": 7}',           # job_ids not a list (filtered with --job)
    '{"event": "drain", "node": "gpu9", "job_ids": [[7]]}',
    '{"event": "drain", "node": ["gpu9"]}',
    '{"event": 5}',
    '{"node": "gpu9"}',                                           # no event
    '{"event": "drain", "evidence": "xid"}',
    '{"event": "drain", "time": true}',
    '{"event": "drain", "time": 1e999}',                          # inf: no calendar shows it
    '[1, 2]', '"text"', "null", "42",
    '{"event": "dr',                                              # torn by a crash
    "\x00\x01garbage \x1b[2J",
    "[" * 100000,                                                 # nests past the decoder's stack
]


@pytest.fixture
def damaged_journal(journal_file):
    with open(journal_file, "a") as fh:
        for line in _BAD_LINES:
            fh.write(line + "\n")
    Journal(journal_file, fsync=False).append(Record(event="resume", node="gpu1", job_ids=["7"], time=time.time()))
    return journal_file


@pytest.mark.parametrize("args", [[], ["--job", "7"], ["--since", "1h"], ["--node", "gpu1"]])
def test_events_skips_and_counts_lines_that_are_not_records(run, damaged_journal, args):
    res = run("events", "--journal", str(damaged_journal), *args)
    assert res.exit_code == 0
    assert "gpu9" not in res.stdout
    assert "resume" in res.stdout
    warning = res.stderr.strip()
    assert len(warning.splitlines()) == 1
    assert f"skipped {len(_BAD_LINES)} line(s) that are not journal records (first: line 4)" in warning


def test_events_json_reports_skipped(run, damaged_journal):
    res = run("events", "--journal", str(damaged_journal), "--json", "--job", "7")
    assert res.exit_code == 0
    out = json.loads(res.stdout)
    assert [r["event"] for r in out["events"]] == ["drain", "resume"]
    assert out["skipped"] == len(_BAD_LINES)
    assert "skipped" in res.stderr


def test_events_journal_with_no_record_at_all_is_a_problem(run, tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text("\n".join(_BAD_LINES) + "\n")
    res = run("events", "--journal", str(path), "--json")
    assert res.exit_code == 1
    assert json.loads(res.stdout) == {"events": [], "skipped": len(_BAD_LINES), "journal": str(path)}


def test_events_text_cannot_drive_the_terminal(run, tmp_path):
    path = tmp_path / "j.jsonl"
    Journal(path, fsync=False).append(Record(event="drain\x1b[2J", node="gpu1\nFAKE 2026 line", check="x\x07",
                                             outcome="\x1b]0;title\x07", time=1.0))
    res = run("events", "--journal", str(path))
    assert res.exit_code == 0
    assert len(res.stdout.splitlines()) == 1
    assert not any(not ch.isprintable() for ch in res.stdout.rstrip("\n"))


@pytest.mark.parametrize("bad", ["yesterday", "10x", "-5m", "nan", "inf"])
def test_events_bad_since_exit_2(run, journal_file, bad):
    res = run("events", "--journal", str(journal_file), "--since", bad)
    assert res.exit_code == 2
    assert "--since" in res.stderr and "not a duration" in res.stderr


def test_parse_since_forms():
    now = 1_000_000.0
    assert parse_since("90s", now) == now - 90
    assert parse_since("10m", now) == now - 600
    assert parse_since("2h", now) == now - 7200
    assert parse_since("1d", now) == now - 86400
    assert parse_since("1.5h", now) == now - 5400
    assert parse_since("12345", now) == 12345.0
    assert parse_since("2026-01-01T00:00:00", now) > 1.7e9
    with pytest.raises(ConfigError):
        parse_since("soon", now)


# ---- Slurm binary discovery ------------------------------------------------------------------------------

def _exe(path):
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(binaries, "FALLBACK_DIRS", (str(tmp_path / "fb1"), str(tmp_path / "fb2")))
    return tmp_path


def test_bin_dir_first(isolated, monkeypatch):
    (isolated / "bin").mkdir()
    (isolated / "path").mkdir()
    mine = _exe(isolated / "bin" / "scontrol")
    _exe(isolated / "path" / "scontrol")
    monkeypatch.setenv("PATH", str(isolated / "path"))
    assert binaries.find_binary("scontrol", str(isolated / "bin")) == str(mine)


def test_path_used_when_no_bin_dir(isolated, monkeypatch):
    (isolated / "path").mkdir()
    on_path = _exe(isolated / "path" / "sinfo")
    monkeypatch.setenv("PATH", str(isolated / "path"))
    assert binaries.find_binary("sinfo") == str(on_path)
    assert binaries.find_binary("sinfo", str(isolated / "missing-dir")) == str(on_path)


def test_fallback_dirs(isolated):
    (isolated / "fb2").mkdir()
    fb = _exe(isolated / "fb2" / "squeue")
    assert binaries.find_binary("squeue") == str(fb)


def test_non_executable_skipped(isolated):
    (isolated / "bin").mkdir()
    (isolated / "bin" / "scontrol").write_text("not executable")
    (isolated / "fb1").mkdir()
    fb = _exe(isolated / "fb1" / "scontrol")
    assert binaries.find_binary("scontrol", str(isolated / "bin")) == str(fb)


def test_absent_names_bin_dir_setting(isolated):
    with pytest.raises(SlurmError) as err:
        binaries.find_binary("scontrol", "/opt/nowhere")
    msg = str(err.value)
    assert msg.startswith("scontrol not found")
    assert "/opt/nowhere" in msg and str(isolated / "fb1") in msg
    assert "set slurm.bin_dir" in msg
    assert binaries.maybe_binary("scontrol") is None
