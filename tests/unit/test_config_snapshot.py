"""The config snapshot (autoheal.config.snapshot): used only when trusted and current; every other case
parses the TOML as before."""

from __future__ import annotations

import json
import os
import stat

import pytest

import autoheal
from autoheal.config import load_config, parse_config
from autoheal.config import snapshot as snap

CONF = '[hooks]\nexpected_gpus = 4\nstate_dir = "/tmp/x/{node}"\n[journal]\nfsync = false\n'


@pytest.fixture()
def conf(tmp_path, monkeypatch):
    """A config file, the snapshot directory in tmp_path, and this test's user as the trusted one (the
    checks are the same; as root it is root)."""
    path = tmp_path / "autoheal.toml"
    path.write_text(CONF)
    monkeypatch.setattr(snap, "SNAPSHOT_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(snap, "TRUSTED_UID", os.geteuid())
    monkeypatch.setenv("AUTOHEAL_CONFIG", str(path))
    return path


def snapshot_file(conf) -> str:
    return snap.snapshot_path(str(conf))


def parsed_from_toml(monkeypatch) -> list:
    """Calls of parse_config from here on (the slow path)."""
    import autoheal.config as config

    calls: list = []
    real = config.parse_config

    def spy(text, source="<string>"):
        calls.append(source)
        return real(text, source)

    monkeypatch.setattr(config, "parse_config", spy)
    return calls


def rewrite(path: str, change) -> None:
    """Change the snapshot's JSON in place, keeping its owner and mode (so only the content is wrong)."""
    doc = json.loads(open(path, "rb").read())
    change(doc)
    with open(path, "w") as fh:
        fh.write(json.dumps(doc))


def test_first_load_parses_and_writes_a_private_snapshot(conf, monkeypatch):
    calls = parsed_from_toml(monkeypatch)
    cfg = load_config(snapshot=True)
    assert calls == [str(conf)] and cfg.hooks.expected_gpus == 4
    st = os.stat(snapshot_file(conf))
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert stat.S_IMODE(os.stat(snap.SNAPSHOT_DIR).st_mode) == 0o700


def test_second_load_uses_the_snapshot_and_equals_the_parse(conf, monkeypatch):
    first = load_config(snapshot=True)
    calls = parsed_from_toml(monkeypatch)
    again = load_config(snapshot=True)
    assert calls == [] and again == first == parse_config(CONF, str(conf))


def test_the_snapshot_is_what_is_used(conf):
    load_config(snapshot=True)
    rewrite(snapshot_file(conf), lambda d: d["config"]["hooks"].update(expected_gpus=7))
    assert load_config(snapshot=True).hooks.expected_gpus == 7  # read from the snapshot, not the file
    assert load_config().hooks.expected_gpus == 4  # callers that did not ask for it parse


def test_without_snapshot_nothing_is_written(conf):
    load_config()
    assert not os.path.exists(snap.SNAPSHOT_DIR)


@pytest.mark.parametrize("edit", ["content", "touch", "replace"])
def test_a_changed_config_file_is_parsed_again(conf, monkeypatch, edit):
    load_config(snapshot=True)
    if edit == "content":
        conf.write_text(CONF.replace("expected_gpus = 4", "expected_gpus = 6"))
    elif edit == "touch":  # same bytes, new mtime: the same config, the snapshot still serves
        st = os.stat(conf)
        os.utime(conf, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    else:  # an editor's new file (new inode), same size
        new = conf.with_name("new.toml")
        new.write_text(CONF.replace("expected_gpus = 4", "expected_gpus = 5"))
        os.replace(new, conf)
    calls = parsed_from_toml(monkeypatch)
    cfg = load_config(snapshot=True)
    assert calls == ([] if edit == "touch" else [str(conf)])
    assert cfg.hooks.expected_gpus == {"content": 6, "touch": 4, "replace": 5}[edit]
    assert load_config(snapshot=True) == cfg  # and the new snapshot is used next time


def test_another_package_version_is_parsed_again(conf, monkeypatch):
    load_config(snapshot=True)
    monkeypatch.setattr(autoheal, "__version__", autoheal.__version__ + ".post1")
    assert snap.load(str(conf)) is None


def test_changed_config_code_is_parsed_again(conf, monkeypatch):
    load_config(snapshot=True)
    key = snap.code_key()
    monkeypatch.setattr(snap, "code_key", lambda: key[:-1] + [[1, 2]])  # one module's size/mtime changed
    assert snap.load(str(conf)) is None


def test_a_snapshot_of_another_config_path_is_not_used(conf, tmp_path):
    load_config(snapshot=True)
    other = tmp_path / "other.toml"
    other.write_text(CONF)
    os.link(snapshot_file(conf), snap.snapshot_path(str(other)))
    os.unlink(snapshot_file(conf))  # keep one link: only the key differs
    assert snap.load(str(other)) is None


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_snapshot_others_can_write_is_not_used(conf, mode):
    load_config(snapshot=True)
    os.chmod(snapshot_file(conf), mode)
    assert snap.load(str(conf)) is None


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o1777])
def test_a_directory_others_can_write_is_neither_read_nor_written(conf, mode):
    load_config(snapshot=True)
    os.chmod(snap.SNAPSHOT_DIR, mode)
    assert snap.load(str(conf)) is None
    os.unlink(snapshot_file(conf))
    load_config(snapshot=True)
    assert not os.path.exists(snapshot_file(conf))


def test_a_snapshot_of_another_owner_is_not_used(conf, monkeypatch):
    load_config(snapshot=True)
    monkeypatch.setattr(snap, "TRUSTED_UID", os.geteuid() + 1)  # the file's owner is no longer the trusted one
    assert snap.load(str(conf)) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_snapshot_chowned_to_a_user_is_not_used(conf):
    load_config(snapshot=True)
    os.chown(snapshot_file(conf), 65534, 65534)
    assert snap.load(str(conf)) is None


def test_a_symlinked_snapshot_is_not_followed(conf, tmp_path):
    load_config(snapshot=True)
    real = tmp_path / "elsewhere"
    os.replace(snapshot_file(conf), real)
    os.symlink(real, snapshot_file(conf))
    assert snap.load(str(conf)) is None


def test_a_hard_linked_snapshot_is_not_used(conf, tmp_path):
    load_config(snapshot=True)
    os.link(snapshot_file(conf), tmp_path / "second-name")
    assert snap.load(str(conf)) is None


def test_a_symlinked_directory_is_not_trusted(conf, tmp_path):
    load_config(snapshot=True)
    os.replace(snap.SNAPSHOT_DIR, tmp_path / "real-run")
    os.symlink(tmp_path / "real-run", snap.SNAPSHOT_DIR)
    assert snap.load(str(conf)) is None


@pytest.mark.parametrize("garbage", [b"", b"{", b"[]", b"\xff\xfe", b'{"format": 1}', b"x" * 100])
def test_a_snapshot_that_is_not_one_is_parsed_again(conf, garbage):
    load_config(snapshot=True)
    with open(snapshot_file(conf), "wb") as fh:
        fh.write(garbage)
    assert snap.load(str(conf)) is None
    assert load_config(snapshot=True).hooks.expected_gpus == 4  # parsed, and a good snapshot written again
    assert snap.load(str(conf)) is not None


@pytest.mark.parametrize("change", [
    lambda d: d.update(format=2),
    lambda d: d["config"]["hooks"].update(no_such_setting=1),
    lambda d: d["config"]["hooks"].pop("expected_gpus"),
    lambda d: d["config"].update(hooks=[1, 2]),
    lambda d: d["config"].update(source="/etc/other.toml"),
    lambda d: d.update(config=None),
], ids=["format", "unknown-field", "missing-field", "not-a-table", "other-source", "no-config"])
def test_a_snapshot_of_the_wrong_shape_is_not_used(conf, change):
    load_config(snapshot=True)
    rewrite(snapshot_file(conf), change)
    assert snap.load(str(conf)) is None


def test_an_oversized_snapshot_is_not_read(conf):
    load_config(snapshot=True)
    with open(snapshot_file(conf), "ab") as fh:
        fh.write(b" " * (snap.MAX_BYTES + 1))
    assert snap.load(str(conf)) is None


def test_only_the_trusted_user_writes_one(conf, monkeypatch):
    monkeypatch.setattr(snap.os, "geteuid", lambda: snap.TRUSTED_UID + 1)
    assert load_config(snapshot=True).hooks.expected_gpus == 4
    assert not os.path.exists(snapshot_file(conf))


def test_a_bad_config_is_never_snapshotted(conf):
    from autoheal.config import ConfigError

    conf.write_text("[hooks]\nexpected_gpus = 'eight'\n")
    with pytest.raises(ConfigError):
        load_config(snapshot=True)
    assert not os.path.exists(snapshot_file(conf))


def test_no_config_file_means_defaults_and_no_snapshot(tmp_path, monkeypatch):
    monkeypatch.setattr(snap, "SNAPSHOT_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(snap, "TRUSTED_UID", os.geteuid())
    monkeypatch.delenv("AUTOHEAL_CONFIG", raising=False)
    import autoheal.config as config

    monkeypatch.setattr(config, "DEFAULT_PATH", str(tmp_path / "missing.toml"))
    assert load_config(snapshot=True) == config.Config()
    assert not os.path.exists(snap.SNAPSHOT_DIR)


def test_secrets_are_merged_after_a_snapshot_and_never_stored(conf, tmp_path):
    secrets = tmp_path / "secrets.toml"
    secrets.write_text('[notify]\nwebhooks = ["https://hooks.example/T0"]\n')
    os.chmod(secrets, 0o600)
    conf.write_text(CONF + f'[notify]\nsecrets_file = "{secrets}"\n')
    assert load_config(snapshot=True).notify.webhooks == ["https://hooks.example/T0"]
    assert b"hooks.example" not in open(snapshot_file(conf), "rb").read()
    assert load_config(snapshot=True).notify.webhooks == ["https://hooks.example/T0"]  # from the snapshot


def test_an_edit_applies_even_when_stat_still_shows_the_old_file(conf, monkeypatch):
    """An NFS client's attribute cache (up to 60 s) or a same-size rewrite within one coarse timestamp
    tick: a path ``stat`` still says "the same file" after an edit. The key is the bytes, so the edit
    applies at once."""
    load_config(snapshot=True)
    old = os.stat(conf)
    real_stat = os.stat

    def stale(path, *args, **kwargs):
        return old if os.fspath(path) == str(conf) else real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stale)
    conf.write_text(CONF.replace("expected_gpus = 4", "expected_gpus = 8"))  # same size, in place
    assert len(conf.read_bytes()) == old.st_size
    assert load_config(snapshot=True).hooks.expected_gpus == 8
    assert load_config(snapshot=True).hooks.expected_gpus == 8  # and the new snapshot holds the new value


def test_the_key_is_the_content():
    assert snap.file_key(b"a = 1\n") == snap.file_key(b"a = 1\n") != snap.file_key(b"a = 2\n")
    assert snap.file_key(b"") == [0, 0] and snap.file_key(b"\0")[0] == 1  # the length is part of it


def _secrets_conf(conf, tmp_path, hooks='["https://hooks.example/T0"]'):
    secrets = tmp_path / "secrets.toml"
    secrets.write_text(f"[notify]\nwebhooks = {hooks}\n")
    os.chmod(secrets, 0o600)
    conf.write_text(CONF + f'[notify]\nsecrets_file = "{secrets}"\n')
    return secrets


def secrets_parsed(monkeypatch) -> list:
    """Calls of the secrets file's TOML parse from here on (the slow path)."""
    from autoheal.config import secrets as sec

    calls: list = []
    real = sec._parse

    def spy(path, data):
        calls.append(path)
        return real(path, data)

    monkeypatch.setattr(sec, "_parse", spy)
    return calls


def test_the_secrets_webhooks_have_a_private_snapshot_of_their_own_keyed_by_the_files_bytes(conf, tmp_path,
                                                                                             monkeypatch):
    secrets = _secrets_conf(conf, tmp_path)
    calls = secrets_parsed(monkeypatch)
    assert load_config(snapshot=True).notify.webhooks == ["https://hooks.example/T0"]
    kept = snap.secrets_path(str(secrets))
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600 and calls == [str(secrets)]
    assert load_config(snapshot=True).notify.webhooks == ["https://hooks.example/T0"]
    assert calls == [str(secrets)]  # the second hook parsed no TOML
    secrets.write_text('[notify]\nwebhooks = ["https://hooks.example/T1"]\n')  # same length: the bytes decide
    assert load_config(snapshot=True).notify.webhooks == ["https://hooks.example/T1"] and len(calls) == 2


def test_without_snapshot_the_secrets_are_parsed_and_nothing_is_kept(conf, tmp_path, monkeypatch):
    secrets = _secrets_conf(conf, tmp_path)
    calls = secrets_parsed(monkeypatch)
    for _ in range(2):
        assert load_config().notify.webhooks == ["https://hooks.example/T0"]
    assert len(calls) == 2 and not os.path.exists(snap.secrets_path(str(secrets)))


def test_an_unsafe_secrets_file_is_refused_even_with_a_snapshot_of_it(conf, tmp_path):
    from autoheal.errors import ConfigError

    secrets = _secrets_conf(conf, tmp_path)
    load_config(snapshot=True)
    os.chmod(secrets, 0o622)  # others may write it now: whoever can redirects every alert
    with pytest.raises(ConfigError, match="other users can change the secrets file"):
        load_config(snapshot=True)


@pytest.mark.parametrize("change", [lambda d: d.update(webhooks="https://x"), lambda d: d.update(webhooks=[1]),
                                    lambda d: d["key"].update(path="/elsewhere"), lambda d: d.update(format=0)])
def test_a_secrets_snapshot_of_the_wrong_shape_or_key_is_parsed_again(conf, tmp_path, monkeypatch, change):
    secrets = _secrets_conf(conf, tmp_path)
    load_config(snapshot=True)
    rewrite(snap.secrets_path(str(secrets)), change)
    calls = secrets_parsed(monkeypatch)
    assert load_config(snapshot=True).notify.webhooks == ["https://hooks.example/T0"] and calls == [str(secrets)]


def test_a_secrets_snapshot_others_can_write_is_not_used(conf, tmp_path, monkeypatch):
    secrets = _secrets_conf(conf, tmp_path)
    load_config(snapshot=True)
    kept = snap.secrets_path(str(secrets))
    rewrite(kept, lambda d: d.update(webhooks=["https://attacker.example/"]))
    os.chmod(kept, 0o666)
    assert load_config(snapshot=True).notify.webhooks == ["https://hooks.example/T0"]
