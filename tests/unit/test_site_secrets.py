"""Issue 25 item 4: the webhook URLs live in a root-only secrets file, not in the config every user reads."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from autoheal.config import load_config
from autoheal.config import secrets as S
from autoheal.errors import ConfigError
from autoheal.notify import Notifier

SITE = "https://hooks.example/services/T/B/SITE"
OLD = "https://hooks.example/services/T/B/OLD"


def write(path, text, mode):
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture
def site(tmp_path):
    S._WARNED.clear()
    main = write(tmp_path / "autoheal.toml", f'[notify]\nsecrets_file = "{tmp_path}/secrets.toml"\n', 0o644)
    return main, tmp_path / "secrets.toml"


def as_uid(uid, fn):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(uid)
            os.setuid(uid)
            out = {"ok": fn()}
        except BaseException as exc:
            out = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def test_root_reads_the_0600_secrets_file(site):
    main, secrets = site
    write(secrets, f'[notify]\nwebhooks = ["{SITE}"]\n', 0o600)
    cfg = load_config(main)
    assert cfg.notify.webhooks == [SITE]
    assert Notifier.from_config(cfg).urls == [SITE]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to a user")
def test_a_user_loads_the_config_without_the_secrets_and_without_an_error():
    d = Path(tempfile.mkdtemp(prefix="autoheal-secrets-", dir="/tmp"))
    try:
        d.chmod(0o755)
        main = write(d / "autoheal.toml", f'[notify]\nsecrets_file = "{d}/secrets.toml"\n', 0o644)
        write(d / "secrets.toml", f'[notify]\nwebhooks = ["{SITE}"]\n', 0o600)
        assert as_uid(65534, lambda: load_config(main).notify.webhooks) == {"ok": []}
        assert load_config(main).notify.webhooks == [SITE]
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_the_runner_path_never_opens_the_secrets_file(site):
    main, secrets = site
    write(secrets, "this is not TOML [[[", 0o600)
    assert load_config(main, secrets=False).notify.webhooks == []
    with pytest.raises(ConfigError, match="secrets.toml: not a valid secrets file"):
        load_config(main)


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_secrets_file_others_can_change_is_refused(site, mode):
    main, secrets = site
    write(secrets, f'[notify]\nwebhooks = ["{SITE}"]\n', mode)
    with pytest.raises(ConfigError, match=r"other users can change the secrets file: not used \(chmod 0600"):
        load_config(main)


def test_a_secrets_file_of_another_user_is_refused(site):
    main, secrets = site
    write(secrets, f'[notify]\nwebhooks = ["{SITE}"]\n', 0o600)
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    os.chown(secrets, 1234, 1234)
    with pytest.raises(ConfigError, match="owned by uid 1234, not root"):
        load_config(main)


def test_a_readable_secrets_file_works_with_a_warning(site, capsys):
    main, secrets = site
    write(secrets, f'[notify]\nwebhooks = ["{SITE}"]\n', 0o644)
    assert load_config(main).notify.webhooks == [SITE]
    assert "other users can read the secrets file: chmod 0600" in capsys.readouterr().err


def test_unknown_keys_in_the_secrets_file_are_named(site):
    main, secrets = site
    write(secrets, '[notify]\nwebhook = ["https://x.example/"]\n', 0o600)
    with pytest.raises(ConfigError, match=r"secrets.toml: unknown key 'notify.webhook'; did you mean"):
        load_config(main)


@pytest.mark.skipif(os.geteuid() != 0, reason="the warning is for root's processes")
def test_an_old_config_with_webhooks_in_the_main_file_keeps_working_with_a_warning(tmp_path, capsys):
    S._WARNED.clear()
    main = write(tmp_path / "autoheal.toml", f'[notify]\nwebhooks = ["{OLD}"]\n'
                 f'secrets_file = "{tmp_path}/secrets.toml"\n', 0o644)
    cfg = load_config(main)
    assert cfg.notify.webhooks == [OLD]
    err = capsys.readouterr().err
    assert "notify.webhooks can be read by every user, who can then post fake alerts: move them to" in err
    write(tmp_path / "secrets.toml", f'[notify]\nwebhooks = ["{SITE}", "{OLD}"]\n', 0o600)
    assert load_config(main).notify.webhooks == [OLD, SITE]  # both, once each
    main.chmod(0o600)  # nobody else can read it: nothing to warn about
    S._WARNED.clear()
    load_config(main)
    assert "can be read by every user" not in capsys.readouterr().err


def test_config_show_never_prints_the_secrets_and_validate_checks_them(site):
    from click.testing import CliRunner

    from autoheal.cli.main import cli

    main, secrets = site
    write(secrets, f'[notify]\nwebhooks = ["{SITE}"]\n', 0o600)
    for args in (["config", "show", "--config", str(main)], ["config", "show", "--json", "--config", str(main)]):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 0 and "SITE" not in res.output, res.output
    secrets.chmod(0o666)
    res = CliRunner().invoke(cli, ["config", "validate", str(main)])
    assert res.exit_code == 2 and "other users can change the secrets file" in res.output


@pytest.mark.skipif(os.geteuid() != 0, reason="the runner reads the secrets only as root")
def test_a_root_runner_with_a_broken_secrets_file_keeps_the_rest_of_the_config(tmp_path, monkeypatch, capsys):
    from autoheal.journal import Journal
    from autoheal.sbatch_helpers import runner

    journal = tmp_path / "journal.jsonl"
    main = write(tmp_path / "autoheal.toml", f'[journal]\npath = "{journal}"\nfsync = false\n'
                 f'[slurm]\nbin_dir = "{tmp_path}"\n[notify]\nsecrets_file = "{tmp_path}/secrets.toml"\n', 0o644)
    write(tmp_path / "secrets.toml", f'[notify]\nwebhooks = ["{SITE}"]\n', 0o666)
    for k, v in {"AUTOHEAL_CONFIG": str(main), "SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "3"}.items():
        monkeypatch.setenv(k, v)
    assert runner.main(["--max-restarts", "1", "--", "/bin/true"]) == runner.EXIT_MAX_RESTARTS
    err = capsys.readouterr().err
    assert "other users can change the secrets file" in err and "going on without the site's secrets" in err
    assert [r.event for r in Journal(journal).read()][-1] == "job-max-restarts"  # the configured journal
