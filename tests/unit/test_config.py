"""Config loading and validation: TOML errors, unknown keys, types, bounds, sources."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import pytest

from autoheal.config import (
    DEFAULT_PATH,
    ENV_VAR,
    Config,
    ConfigError,
    config_path,
    describe,
    load_config,
    parse_config,
    schema,
    to_mapping,
)
from autoheal.config.schema import from_mapping, setting

# ---- parse_config: syntax and keys -----------------------------------------------------------------

def test_malformed_toml_names_source_and_says_not_valid():
    with pytest.raises(ConfigError) as err:
        parse_config("[slurm\nbackend = 'cli'", "/etc/autoheal/x.toml")
    msg = str(err.value)
    assert msg.startswith("/etc/autoheal/x.toml: ")
    assert "not valid TOML" in msg
    assert "\n" not in msg


def test_unknown_key_in_section_suggests_close_key():
    with pytest.raises(ConfigError) as err:
        parse_config("[slurm]\nbakend = 'cli'\n", "a.toml")
    msg = str(err.value)
    assert "unknown key 'slurm.bakend'" in msg
    assert "did you mean 'slurm.backend'" in msg
    assert msg.startswith("a.toml: ")


def test_unknown_top_level_section_suggests_close_section():
    with pytest.raises(ConfigError) as err:
        parse_config("[slurn]\nbackend = 'cli'\n")
    assert "did you mean 'slurm'" in str(err.value)


def test_unknown_key_without_close_match_lists_known_keys_but_no_suggestion():
    with pytest.raises(ConfigError) as err:
        parse_config("[journal]\nzzzzzz = 1\n")
    msg = str(err.value)
    assert "did you mean" not in msg
    assert "known here: fsync, job_spool, path" in msg


def test_source_key_is_not_settable_from_file():
    with pytest.raises(ConfigError, match="unknown key 'source'"):
        parse_config("source = '/tmp/x'\n")


def test_dashed_key_is_accepted_as_underscore():
    cfg = parse_config("[slurm]\nbin-dir = '/opt/slurm/bin'\n")
    assert cfg.slurm.bin_dir == "/opt/slurm/bin"


# ---- types ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("toml, fragment", [
    ("[slurm]\nbin_dir = 5\n", "slurm.bin_dir: expected a string, got 5"),
    ("[slurm]\ntimeout = '10'\n", "slurm.timeout: expected a number, got '10'"),
    ("[slurm]\nretries = true\n", "slurm.retries: expected an integer, got True"),
    ("[slurm]\nretries = 1.5\n", "slurm.retries: expected an integer, got 1.5"),
    ("[journal]\nfsync = 1\n", "journal.fsync: expected true or false, got 1"),
    ("[slurm]\ntimeout = true\n", "slurm.timeout: expected a number, got True"),
    ("slurm = 5\n", "slurm: expected a table, got 5"),
    ("[notify]\nwebhooks = 'http://x/'\n", "notify.webhooks: expected a list"),
    ("[notify]\nwebhooks = ['http://x/', 3]\n", "notify.webhooks[1]: expected a string, got 3"),
])
def test_wrong_types_name_key_and_value(toml, fragment):
    with pytest.raises(ConfigError) as err:
        parse_config(toml, "f.toml")
    assert fragment in str(err.value)


def test_int_accepted_for_float_and_converted():
    cfg = parse_config("[slurm]\ntimeout = 3\n")
    assert cfg.slurm.timeout == 3.0 and isinstance(cfg.slurm.timeout, float)


def test_choices_rejected_with_allowed_values():
    with pytest.raises(ConfigError) as err:
        parse_config("[slurm]\nbackend = 'slurmrestd'\n")
    msg = str(err.value)
    assert "slurm.backend: 'slurmrestd' is not allowed" in msg
    assert "'cli', 'rest', 'pyslurm'" in msg


@pytest.mark.parametrize("toml, fragment", [
    ("[slurm]\ntimeout = 0.05\n", "slurm.timeout: 0.05 is below the minimum 0.1"),
    ("[slurm]\ntimeout = 601\n", "slurm.timeout: 601.0 is above the maximum 600"),
    ("[slurm]\nretries = -1\n", "slurm.retries: -1 is below the minimum 0"),
    ("[notify]\nretries = 11\n", "notify.retries: 11 is above the maximum 10"),
    ("[sbatch]\ngrace = 4\n", "sbatch.grace: 4 is below the minimum 5"),
])
def test_bounds(toml, fragment):
    with pytest.raises(ConfigError) as err:
        parse_config(toml)
    assert fragment in str(err.value)


def test_bounds_inclusive():
    cfg = parse_config("[slurm]\ntimeout = 600\nretries = 0\n")
    assert cfg.slurm.timeout == 600.0 and cfg.slurm.retries == 0


def test_nan_float_rejected():
    with pytest.raises(ConfigError):
        parse_config("[slurm]\ntimeout = nan\n")


def test_values_from_file_over_defaults():
    cfg = parse_config("[slurm]\nbackend = 'cli'\nretries = 4\n[notify]\nwebhooks = ['https://h/a']\n"
                       "min_severity = 'error'\n", "x.toml")
    assert cfg.slurm.retries == 4
    assert cfg.slurm.timeout == 10.0  # untouched default
    assert cfg.notify.webhooks == ["https://h/a"]
    assert cfg.notify.min_severity == "error"
    assert cfg.source == "x.toml"


# ---- validate() hooks ---------------------------------------------------------------------------------

def test_rest_backend_requires_rest_url():
    with pytest.raises(ConfigError) as err:
        parse_config("[slurm]\nbackend = 'rest'\n", "c.toml")
    assert "c.toml: slurm.rest_url: must be set when slurm.backend = 'rest'" == str(err.value)


@pytest.mark.parametrize("url", ["http://127.0.0.1:6820", "http://localhost:6820", "https://h",
                                 "unix:/run/slurmrestd.sock"])
def test_rest_url_schemes_accepted(url):
    cfg = parse_config(f"[slurm]\nbackend = 'rest'\nrest_url = '{url}'\n")
    assert cfg.slurm.rest_url == url


@pytest.mark.parametrize("url", ["http://h:6820", "http://10.0.0.5:6820", "http://slurm-restapi.slurm.svc:6820"])
def test_rest_plain_http_to_another_host_needs_consent(url):
    # the JWT would cross the network in clear text: refused unless the site says the network is trusted
    with pytest.raises(ConfigError, match="slurm.rest_url: .* clear text to another host: use https://"):
        parse_config(f"[slurm]\nbackend = 'rest'\nrest_url = '{url}'\n")
    cfg = parse_config(f"[slurm]\nbackend = 'rest'\nrest_url = '{url}'\nrest_allow_http = true\n")
    assert cfg.slurm.rest_url == url and cfg.slurm.rest_allow_http


def test_rest_url_bad_scheme_rejected():
    with pytest.raises(ConfigError, match="must start with http://, https:// or unix:"):
        parse_config("[slurm]\nrest_url = 'ftp://h'\n")


# ---- generic schema (lists, dicts, Optional, nested) ---------------------------------------------------

@dataclasses.dataclass
class _Inner:
    level: int = setting(1, doc="a level", min=0, max=3)


@dataclasses.dataclass
class _Outer:
    inner: _Inner = setting(default_factory=_Inner, doc="nested")
    names: List[str] = setting(default_factory=list, doc="names")
    table: Dict[str, int] = setting(default_factory=dict, doc="table")
    maybe: Optional[str] = setting(None, doc="optional")


def test_schema_nested_list_dict_optional():
    obj = from_mapping(_Outer, {"inner": {"level": 2}, "names": ["a", "b"], "table": {"x": 1}, "maybe": "y"})
    assert obj.inner.level == 2 and obj.names == ["a", "b"] and obj.table == {"x": 1} and obj.maybe == "y"
    assert to_mapping(obj) == {"inner": {"level": 2}, "names": ["a", "b"], "table": {"x": 1}, "maybe": "y"}


@pytest.mark.parametrize("data, fragment", [
    ({"inner": {"level": 4}}, "inner.level: 4 is above the maximum 3"),
    ({"inner": {"levl": 1}}, "did you mean 'inner.level'"),
    ({"table": {"x": "1"}}, "table.x: expected an integer"),
    ({"table": [1]}, "table: expected a table"),
    ({"maybe": 3}, "maybe: expected a string"),
])
def test_schema_errors_name_full_key(data, fragment):
    with pytest.raises(ConfigError) as err:
        from_mapping(_Outer, data)
    assert fragment in str(err.value)


# ---- load_config: where the file comes from -------------------------------------------------------------

def test_explicit_missing_file_is_error(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as err:
        load_config(missing)
    assert str(err.value) == f"{missing}: config file not found"


def test_default_path_missing_means_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr("autoheal.config.DEFAULT_PATH", str(tmp_path / "absent.toml"))
    cfg = load_config()
    assert cfg == Config()
    assert cfg.source is None


def test_config_path_order(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert config_path() == (type(tmp_path)(DEFAULT_PATH), False)
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env.toml"))
    assert config_path() == (tmp_path / "env.toml", True)
    assert config_path(tmp_path / "cli.toml") == (tmp_path / "cli.toml", True)


def test_env_var_file_is_used(monkeypatch, tmp_path):
    f = tmp_path / "env.toml"
    f.write_text("[slurm]\nretries = 7\n")
    monkeypatch.setenv(ENV_VAR, str(f))
    cfg = load_config()
    assert cfg.slurm.retries == 7
    assert cfg.source == str(f)


def test_env_var_missing_file_is_error(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "gone.toml"))
    with pytest.raises(ConfigError, match="config file not found"):
        load_config()


def test_explicit_beats_env(monkeypatch, tmp_path):
    env_file = tmp_path / "env.toml"
    env_file.write_text("[slurm]\nretries = 7\n")
    cli_file = tmp_path / "cli.toml"
    cli_file.write_text("[slurm]\nretries = 3\n")
    monkeypatch.setenv(ENV_VAR, str(env_file))
    assert load_config(cli_file).slurm.retries == 3


def test_load_errors_name_the_file(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[slurm]\nretries = 'x'\n")
    with pytest.raises(ConfigError) as err:
        load_config(f)
    assert str(err.value).startswith(f"{f}: slurm.retries: expected an integer")


def test_unreadable_file_is_config_error(tmp_path):
    f = tmp_path / "bin.toml"
    f.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(f)


def test_directory_as_config_is_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path)


# ---- describe ------------------------------------------------------------------------------------------

def test_every_setting_has_a_doc():
    rows = describe(Config)
    assert len(rows) > 20
    undocumented = [key for key, doc, _ in rows if not doc.strip()]
    assert undocumented == []


def test_describe_walks_sections_depth_first_with_defaults():
    rows = {key: default for key, _, default in describe(Config)}
    assert rows["slurm.backend"] == "cli"
    assert rows["slurm.timeout"] == 10.0
    assert rows["notify.webhooks"] == []
    assert rows["journal.fsync"] is True
    assert "slurm" not in rows  # sections are expanded, not listed as settings


def test_describe_of_schema_class():
    assert schema.describe(_Outer) == [("inner.level", "a level", 1), ("names", "names", []),
                                       ("table", "table", {}), ("maybe", "optional", None)]
