"""$AUTOHEAL_LAB_SLURM_CONF: a test's shorter Slurm timers for a lab started by a command (``lab drill``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoheal_lab.slurmconf import ENV_EXTRA_CONF, LabLayout, env_extra_conf, render_slurm_conf


def _layout(root: Path, extra=()) -> LabLayout:
    return LabLayout(root=root, nodes=["gpu1"], spares=[], gpus=1, ctld_port=1, node_ports={"gpu1": 2},
                     rest_port=3, extra_conf=list(extra))


def test_lines_from_the_environment_come_after_the_fragment_and_before_the_labs_own_extra_conf(tmp_path):
    text = render_slurm_conf(_layout(tmp_path, ["SlurmdTimeout=10"]), {}, ["KillWait=120"],
                             environ={ENV_EXTRA_CONF: "KillWait=10; MessageTimeout=5"})
    lines = text.splitlines()
    # Slurm takes a key's last line: the environment's KillWait wins over the fragment's
    assert lines.index("KillWait=120") < lines.index("KillWait=10") < lines.index("SlurmdTimeout=10")
    assert "MessageTimeout=5" in lines


def test_without_the_variable_the_conf_is_the_recommended_one(tmp_path):
    text = render_slurm_conf(_layout(tmp_path), {}, ["KillWait=120"], environ={})
    assert "KillWait=120" in text.splitlines() and ENV_EXTRA_CONF not in text
    assert env_extra_conf({ENV_EXTRA_CONF: " ; "}) == []


@pytest.mark.parametrize("bad", ["KillWait", "KillWait=", "=10", "Kill Wait=10", "KillWait=10\nPrologFlags=x"])
def test_a_line_that_is_not_key_value_is_refused(bad):
    with pytest.raises(ValueError, match=ENV_EXTRA_CONF):
        env_extra_conf({ENV_EXTRA_CONF: bad})
