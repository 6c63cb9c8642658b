"""One owner for "replace this node" and one test of "is this a health drain?" (issue 22, section 2):
the hooks decide the rung, the sync acts on what the reason says."""

from __future__ import annotations

import sys

import pytest
from sync_helpers import k8s_name
from test_remediation_flow import K, recon, state, world

from autoheal import nodeops
from autoheal.config import parse_config
from autoheal.config.hooks_section import HooksSection
from autoheal.hooks import checks as C
from autoheal.hooks import engine
from autoheal.hooks.jobside import is_health_reason as hooks_says_health
from autoheal.hooks.xids import XidEvent
from autoheal.k8s_sync.names import is_health_reason as sync_says_health
from autoheal.reasons import admin_reason, is_health_drain
from autoheal_lab.testing.hooks import hook_context


def hooks_ctx(tmp_path, slurm, **hooks):
    h = HooksSection(reset_command=[sys.executable, "-c", "raise SystemExit(1)"], **hooks)  # resets fail
    return hook_context(h, state_dir=str(tmp_path / "state"), slurm=slurm)


def xid79_through_the_hooks(ctx, now):
    """xid-watch's judgement and drain, then the healthcheck's ladder on the idle node."""
    with ctx.store.locked() as st:
        results = engine.xid_results(ctx, st, [XidEvent(79, pci="0000:3b:00", gpu=3)], {}, now)
    failure = C.worst_failure(results)
    engine.drain_for(ctx, failure)
    return failure, engine.maybe_repair(ctx, results, now + 30)


@pytest.mark.parametrize("policy, replaced", [(None, True), ("reset", False), ("reboot", False)])
def test_xid_79_is_replaced_only_when_the_hooks_say_so(tmp_path, policy, replaced):
    slurm, kube, cfg, clock = world()
    ctx = hooks_ctx(tmp_path, slurm, xid_policy={"79": policy} if policy else {})
    failure, done = xid79_through_the_hooks(ctx, 1000.0)
    assert [a.kind for a in done] == [{None: C.REPLACE, "reset": C.RESET, "reboot": C.REBOOT}[policy]]
    r = recon(slurm, kube, cfg, clock)
    for _ in range(4):
        assert r.run_pass().ok
    if replaced:
        assert state(kube, "n1") in ("quarantined", "draining", "replacing")
    else:  # the lab's finding: with 79 = "reset" gpu1 was retired and replaced within 45 s
        assert state(kube, "n1") == "" and not kube.customs, (slurm.nodes["n1"].reason, kube.customs)
        assert "retired" not in slurm.nodes["n1"].reason


def test_old_remediate_xids_config_loads_is_ignored_and_warned_about():
    cfg = parse_config("[sync]\nremediate_xids = [64, 79, 143]\n")
    assert cfg.sync.remediate_xids == [64, 79, 143]
    assert any("ignored" in w and "hooks.xid_policy" in w for w in cfg.sync.deprecations())
    assert parse_config("").sync.deprecations() == []


def test_config_validate_warns_about_remediate_xids(tmp_path):
    from click.testing import CliRunner

    from autoheal.cli.main import cli

    f = tmp_path / "a.toml"
    f.write_text("[sync]\nremediate_xids = [79]\n")
    res = CliRunner().invoke(cli, ["config", "validate", str(f)])
    assert res.exit_code == 0 and "warning: sync.remediate_xids" in res.output, res.output


def test_admin_maintenance_drain_gets_no_taint_and_no_remediation():
    slurm, kube, cfg, clock = world(enabled_steps=["slurm-to-pods", "health-to-nodes", "nodes-to-slurm",
                                                   "remediate"])
    # what `autoheal node drain n2 --reason "maintenance by bob"` does
    out = nodeops.drain(slurm, "n2", admin_reason("maintenance by bob"))
    assert out.action == nodeops.DRAINED and slurm.nodes["n2"].reason == "autoheal: admin: maintenance by bob"
    r = recon(slurm, kube, cfg, clock)
    for _ in range(4):
        assert r.run_pass().ok
    node = kube.nodes[k8s_name("n2")]
    assert not any(c.get("type") == "GPUHealthy" for c in node.get("status", {}).get("conditions", []))
    assert not any(t.get("key", "").startswith("autoheal.io/gpu") for t in node.get("spec", {}).get("taints", []))
    assert state(kube, "n2") == "" and not kube.customs
    assert K["state"] not in (node["metadata"].get("annotations") or {})


@pytest.mark.parametrize("reason, health", [
    ("autoheal: xid 79 on GPU 3 of gpu2 (0000:3b:00.0): fallen off the bus", True),
    ("autoheal: ecc: GPU 1 of n1: 2 uncorrectable ECC errors", True),
    ("autoheal: reboot: xid 79 on GPU 3 of gpu2", True),
    ("autoheal: replace: xid 79 on GPU 3 of gpu2", True),
    ("autoheal: lemon: 3 faults in 7 d (xid 79, 48, 79)", True),
    ("autoheal: xid=79 gpu=3", True),  # an older release's free form
    ("autoheal: ecc-dbe on gpu 3", True),
    ("autoheal: admin: maintenance by bob", False),
    ("autoheal: maintenance by bob", False),  # an older `autoheal node drain --reason`
    ("autoheal: pre-emptive swap: remap-pending: GPU 1 of n1", False),
    ("autoheal: spare: held in the spare pool", False),
    ("autoheal: spare pool: waiting", False),
    ("autoheal: retired: replaced by spare1", False),
    ("autoheal: k8s: node cordoned", False),
    ("maintenance", False),
    ("", False),
])
def test_one_answer_to_is_this_a_health_drain(reason, health):
    # the hooks' job side and the sync used to disagree on preswap, spare pool, spare, retired and admin
    assert is_health_drain(reason) is health
    assert hooks_says_health(reason) is health and sync_says_health(reason) is health
