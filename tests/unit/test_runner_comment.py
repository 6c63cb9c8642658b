"""The runner's job comment: one model in the core, read by the hooks and written by sbatch_helpers."""

from __future__ import annotations

import pytest

from autoheal.hooks import jobside, preswap
from autoheal.runner_comment import CommentState, RunnerState
from autoheal.sbatch_helpers import comment


def test_the_parts_share_the_core_model():
    assert comment.CommentState is CommentState and comment.RunnerState is RunnerState


@pytest.mark.parametrize("state", list(RunnerState))
def test_every_runner_state_round_trips(state):
    st = CommentState(restarts=2, state=state, nodes="gpu1,gpu2", user_comment="mine")
    back = CommentState.parse(st.render())
    assert back == st and back.runner_state is state


def test_an_unknown_or_missing_state_is_none_and_the_users_part_is_never_read():
    assert CommentState.parse("autoheal-runner state=dancing").runner_state is None
    assert CommentState.parse("autoheal-runner | state=running spares=gpu9").runner_state is None
    assert not CommentState.parse("autoheal-runner | spares=gpu9").hot_spare
    assert CommentState.parse("someone else's state=running").state == ""


def test_a_site_marker_is_read_the_same_way_by_the_hooks():
    text = "site-runner restarts=1 state=running nodes=gpu1 spares=gpu3 | spares=none"
    assert CommentState.parse(text).state == ""  # not the default marker
    assert jobside.runner_state(text, "site-runner") == "running"
    st = {"job_actions": {"7@f": {}}}
    jobside.mark_hot_spare(st, "7@f", text, "site-runner")
    assert st["job_actions"]["7@f"]["hot_spare"] is True
    parsed = preswap.runner_state_of(text, "site-runner")
    assert parsed is not None and parsed.hot_spare and parsed.nodes == "gpu1"
    assert preswap.runner_state_of(text, "autoheal-runner") is None
