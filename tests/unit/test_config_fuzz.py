"""Fuzzing the config loader: any TOML document either loads or raises ConfigError (one line).

The loader runs in every prolog, epilog and health check; any other exception there is a traceback,
exit 1, and Slurm draining the node as "Prolog error". ``parse_config`` has a last-resort net that
turns a validator bug into a ConfigError, so the structured fuzz calls ``from_mapping`` directly: a
bug must show up here, not be hidden by the net.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoheal.config import Config, ConfigError, parse_config
from autoheal.config.schema import _hints, from_mapping

# AUTOHEAL_FUZZ_EXAMPLES=20000 for a longer hunt; the default keeps the suite quick.
FUZZ = settings(max_examples=int(os.environ.get("AUTOHEAL_FUZZ_EXAMPLES", "400")), deadline=None,
                suppress_health_check=list(HealthCheck))

# Strings that reach the interesting branches: valid and almost-valid values of every kind of setting.
_INTERESTING = ["", " ", "USR2", "usr2", "SIGKILL", "B:USR2@90", "USR2; rm -rf /", "http://h/x", "https://h:8443/",
                "http://", "http://h:99999/", "https://[::1", "unix:", "unix:/run/s.sock", "ftp://h", "a=b", "=b",
                "a=", "key:NoSchedule", "k=v:Bad", "autoheal: replace:", "autoheal:", "replace:", "Type=Maybe",
                "=True", "custom-resource", "webhook", "label", "delete-node", "remediate", "rest", "pyslurm",
                "v0.0.40", "v0/../x", "SLURM_JWT", "A=B", "/var/lib/autoheal", "/", "a" * 300, "/x/" + "b" * 256,
                '{"apiVersion": 1, "kind": "K", "metadata": {"name": "{node}"}}',
                '{"apiVersion": "a.io/v1", "kind": 5, "metadata": {"name": "n"}}',
                '{"apiVersion": "a.io/v1", "kind": "K", "metadata": []}',
                '{"apiVersion": "a.io/v1", "kind": "K", "metadata": {"name": "{node}"}}', "[" * 3000, "[]", "null",
                "\x00", "a\nb", "\x1b[31m", "\x85", "\udc80", "²", "079", "13", "0.0.0.0", "::", "bad host!",
                "SlurmNodeState", "Slurm Node", "autoheal.io/gpu-unhealthy", "UPPER.io/x"]


def _choices_of(tp) -> list:
    out = []
    for f in dataclasses.fields(tp):
        out.extend(f.metadata.get("choices") or ())
    return out


_ALL_CHOICES = [c for f in dataclasses.fields(Config) if dataclasses.is_dataclass(_hints(Config)[f.name])
                for c in _choices_of(_hints(Config)[f.name])]

_strings = st.one_of(st.sampled_from(_INTERESTING + _ALL_CHOICES), st.text(max_size=20))
_numbers = st.one_of(st.integers(), st.integers(min_value=10 ** 300, max_value=10 ** 320), st.floats(),
                     st.sampled_from([0, -1, 1, 2 ** 63, -(2 ** 63)]))
_scalars = st.one_of(_strings, _numbers, st.booleans(), st.datetimes(), st.dates(), st.times(),
                     st.datetimes(timezones=st.just(datetime.timezone.utc)))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(_strings, inner, max_size=4)),
                       max_leaves=8)


def _section(tp) -> st.SearchStrategy:
    names = [f.name for f in dataclasses.fields(tp)]
    keys = st.one_of(st.sampled_from(names + [n.replace("_", "-") for n in names]), st.text(max_size=8))
    return st.dictionaries(keys, _values, max_size=8)


_SECTIONS = {f.name: _hints(Config)[f.name] for f in dataclasses.fields(Config)
             if dataclasses.is_dataclass(_hints(Config)[f.name])}
_documents = st.fixed_dictionaries({}, optional={name: st.one_of(_section(tp), _values)
                                                 for name, tp in _SECTIONS.items()})


def _must_load_or_refuse(call) -> None:
    try:
        call()
    except ConfigError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg and "\r" not in msg, msg
        assert len(msg) <= 1000


@FUZZ
@given(_documents)
def test_any_document_validates_or_raises_config_error(data):
    _must_load_or_refuse(lambda: from_mapping(Config, data))


@FUZZ
@given(st.text(max_size=200))
def test_any_text_parses_or_raises_config_error(text):
    _must_load_or_refuse(lambda: parse_config(text, "fuzz.toml"))


_toml_fragments = st.sampled_from(["[slurm]\n", "[sync]\n", "[sbatch]\n", "[hooks]\n", "[notify]\n", "[journal]\n",
                                   "a = ", "x = [", "y = {", "]", "}", "'", '"', "\\u0000", "\\n", "\n", "=", ".",
                                   "1e999", "0x10", "nan", "inf", "1979-05-27T07:32:00Z", "true", ",", "[[a]]\n",
                                   "replacement_template = ", "signal = ", "state_dir = ", "max-restarts = 1\n",
                                   "max_restarts = 1\n"])


@FUZZ
@given(st.lists(st.one_of(_toml_fragments, st.text(max_size=5)), max_size=30))
def test_toml_shaped_garbage_parses_or_raises_config_error(parts):
    _must_load_or_refuse(lambda: parse_config("".join(parts), "fuzz.toml"))
