"""Slurm hostlist expressions."""

from __future__ import annotations

import pytest

from autoheal.errors import SlurmParseError
from autoheal.slurm.hostlist import expand


@pytest.mark.parametrize("expr, expected", [
    ("gpu1", ["gpu1"]),
    ("gpu[1-3]", ["gpu1", "gpu2", "gpu3"]),
    ("gpu[1-2,5]", ["gpu1", "gpu2", "gpu5"]),
    ("gpu[1,3]", ["gpu1", "gpu3"]),
    ("n[01-03]", ["n01", "n02", "n03"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("a,b,c", ["a", "b", "c"]),
    ("gpu[1-2],spare1", ["gpu1", "gpu2", "spare1"]),
    ("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"]),
    ("rack[1-2]-gpu[1-2]", ["rack1-gpu1", "rack1-gpu2", "rack2-gpu1", "rack2-gpu2"]),
    ("r[1-2]n[01,03],x[7]", ["r1n01", "r1n03", "r2n01", "r2n03", "x7"]),
    ("gpu[ 1 - 2 ]".replace(" ", ""), ["gpu1", "gpu2"]),
    ("", []),
    ("(null)", []),
    ("N/A", []),
])
def test_expand(expr, expected):
    assert expand(expr) == expected


@pytest.mark.parametrize("expr, fragment", [
    ("gpu[1-2", "unbalanced '['"),
    ("gpu1-2]", "unbalanced ']'"),
    ("gpu[1-2]]", "unbalanced ']'"),
    ("gpu[a-b]", "bad range 'a-b'"),
    ("gpu[1-2-3]", "bad range"),
    ("gpu[1-999999]", "implausibly large"),
])
def test_expand_errors(expr, fragment):
    with pytest.raises(SlurmParseError) as err:
        expand(expr)
    assert fragment in str(err.value)
    assert expr in str(err.value)


def test_reversed_range_is_error():
    with pytest.raises(SlurmParseError):
        expand("gpu[3-1]")
