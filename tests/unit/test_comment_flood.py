"""The runner comment parser under a user's long comment (issue 25, item 5): ``(\\w+)=`` without a word
boundary tried every letter of a long word as the start of a key, quadratic in its length: a 1,024-letter
comment took 14 ms, and a flood of 10,000 such pending jobs made every guard pass take about 140 s (found by
tests/integration/test_job_flood_lab.py). The fields read are the same as before."""

from __future__ import annotations

import re

import pytest

from autoheal.runner_comment import _FIELD, CommentState
from autoheal_lab import flood

BEFORE = re.compile(r"(\w+)=(\S*)")


@pytest.mark.parametrize("comment", [
    "autoheal-runner state=requeueing excl=gpu1,gpu2",
    "autoheal-runner restarts=2 last=79@gpu3 foo.bar=baz a=b=c _x=1 é=2 | user text k=v",
    "autoheal-runner x" + "y" * 50 + "=z",
    "autoheal-runner =bad ==x k=",
    flood._comment(7),
])
def test_same_fields_as_before(comment):
    assert _FIELD.findall(comment) == BEFORE.findall(comment)


def test_a_comment_as_long_as_slurm_allows_parses_to_its_fields():
    st = CommentState.parse(flood._comment(1))
    assert st.state == "requeueing" and st.excl == "gpu1,gpu2"
    word = "autoheal-runner " + "x" * 200_000 + " state=running"  # quadratic before: minutes; now linear
    assert CommentState.parse(word).state == "running"
