"""The sync's steps are declared in one list (``steps.SYNC_STEPS``) and return what they found.

Regression for issue 24: the remediate step registered itself on import of ``remediate_step`` (a pass
planned without that import silently had no remediation) and reported its problems, breaker and opt-outs
by writing into the context every step shares."""

from __future__ import annotations

import dataclasses

import pytest
from sync_helpers import node_obj, pod_obj, sync_cfg

from autoheal.config.sync_section import STEPS as CONFIG_STEPS
from autoheal.k8s_sync import steps
from autoheal.k8s_sync.plan import Snapshot, StepResult, make_context
from autoheal.k8s_sync.remediate_step import RemediationResult
from autoheal.slurm.model import Node

ALL = ["slurm-to-pods", "health-to-nodes", "nodes-to-slurm", "remediate"]


def snapshot() -> Snapshot:
    slurm = {"a": Node("a", "IDLE"), "b": Node("b", "IDLE")}
    knodes = {f"k8s-{n}": node_obj(f"k8s-{n}") for n in slurm}
    pods = {f"slurmd-{n}": pod_obj(f"slurmd-{n}", f"k8s-{n}", n) for n in slurm}
    return Snapshot(slurm, knodes, pods, "2026-01-01T00:00:00Z")


def test_the_config_knows_exactly_the_declared_steps_in_their_order():
    assert [s.name for s in steps.SYNC_STEPS] == list(CONFIG_STEPS) == ALL


def test_enabled_steps_follow_the_config_order_and_skip_unknown_names():
    assert [s.name for s in steps.enabled(["remediate", "nope", "slurm-to-pods"])] == ["remediate", "slurm-to-pods"]


def test_every_step_returns_its_result_and_leaves_the_context_as_it_was():
    snap = snapshot()
    ctx = make_context(snap, sync_cfg(enabled_steps=ALL))
    before = dataclasses.astuple(ctx)
    for step in steps.SYNC_STEPS:
        assert isinstance(step.run(ctx), StepResult), step.name
    assert dataclasses.astuple(ctx) == before
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.mapping_problems = ("x",)  # type: ignore[misc]


def test_the_remediate_step_reports_in_its_result_not_in_the_context():
    # the breaker and the Slurm jobs were not read (as in a pass that could not read them)
    ctx = make_context(snapshot(), sync_cfg(enabled_steps=ALL))
    result = steps.named("remediate").run(ctx)
    assert isinstance(result, RemediationResult) and result.breaker is None and not result.actions
    assert result.problems == ["remediation: breaker state or Slurm jobs not read; no remediation this pass"]
    assert ctx.mapping_problems == ()


def test_plan_runs_remediation_from_the_list_and_gathers_every_steps_problems():
    planned, problems = steps.plan(snapshot(), sync_cfg(enabled_steps=ALL))
    assert list(planned) == ALL
    assert "remediation: breaker state or Slurm jobs not read; no remediation this pass" in problems
