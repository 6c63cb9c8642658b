"""The alert rules (k8s_sync/deploy/chart/autoheal-sync/files/autoheal-rules.yaml), checked and unit-tested
with Debian's real promtool (package `prometheus`; `./dev test` installs it), and the chart's PrometheusRule
rendered with the lab's real helm when it is built. Without promtool the tests skip, except under CI
(``CI`` set), where a missing promtool fails them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

FILES = Path(__file__).resolve().parents[2] / "k8s_sync" / "deploy" / "chart" / "autoheal-sync" / "files"
RULES, RULE_TESTS = FILES / "autoheal-rules.yaml", FILES / "autoheal-rules.test.yaml"
#: What the issue asks the rules to cover, by alert name (a rule renamed or dropped fails here).
REQUIRED = {"AutohealBreakerTripped", "AutohealRemediationStuck", "AutohealFleetDrainedShareHigh",
            "AutohealXidWatchDown", "AutohealSyncNoLeader", "AutohealSyncNoSuccessfulPass",
            "AutohealSyncWritesDeferred", "AutohealGuardDown", "AutohealRequeuedJobNotRunning"}


def promtool() -> str:
    path = shutil.which("promtool")
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail("promtool is not installed (apt-get install prometheus; ./dev test does it)")
    pytest.skip("promtool is not installed (apt-get install prometheus)")


def run(argv, cwd=None):
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60)


def rules():
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_check_rules_accepts_the_file():
    res = run([promtool(), "check", "rules", str(RULES)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rules())} rules found" in res.stdout


def test_promtool_unit_tests_pass():
    res = run([promtool(), "test", "rules", RULE_TESTS.name], cwd=FILES)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_alert_has_a_summary_a_runbook_naming_a_command_and_a_severity():
    names = set()
    for r in rules():
        names.add(r["alert"])
        ann = r["annotations"]
        assert ann["summary"].strip() and len(ann["runbook"]) > 80, r["alert"]
        assert "`autoheal " in ann["runbook"], f"{r['alert']}: the runbook names no autoheal command"
        assert r["labels"]["severity"] in ("page", "ticket")
    assert REQUIRED <= names


def test_every_alert_is_tested_firing_and_quiet():
    fires, quiet = set(), set()
    for t in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for a in t["alert_rule_test"]:
            (fires if a.get("exp_alerts") else quiet).add(a["alertname"])
    names = {r["alert"] for r in rules()}
    assert names == fires, f"alerts never shown firing: {sorted(names - fires)}"
    assert names == quiet, f"alerts never shown quiet: {sorted(names - quiet)}"


def test_the_unit_tests_fail_when_a_threshold_is_wrong(tmp_path):
    """The promtool tests can fail: the same tests against rules whose drained-share threshold lets the
    20 % case page (and whose xid-watch staleness is far too lax) must not pass."""
    text = RULES.read_text()
    assert "> 0.2\n" in text and "> 30\n" in text
    (tmp_path / RULES.name).write_text(text.replace("> 0.2\n", "> 0.1\n").replace("> 30\n", "> 3000\n"))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    res = run([promtool(), "test", "rules", RULE_TESTS.name], cwd=tmp_path)
    assert res.returncode != 0
    assert "AutohealFleetDrainedShareHigh" in res.stdout + res.stderr
    assert "AutohealXidWatchDown" in res.stdout + res.stderr


def helm() -> str:
    from helpers import helm_or_skip

    return helm_or_skip()


@pytest.mark.parametrize("crd", [True, False], ids=["with-crd", "without-crd"])
def test_chart_renders_a_prometheusrule_only_when_the_crd_is_there(crd):
    chart = FILES.parent
    argv = [helm(), "template", "autoheal-sync", str(chart), "--namespace", "slurm"]
    if crd:
        argv += ["--api-versions", "monitoring.coreos.com/v1"]
    res = run(argv)
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    prs = [d for d in docs if d["kind"] == "PrometheusRule"]
    if not crd:
        assert prs == []
        return
    assert len(prs) == 1 and prs[0]["metadata"]["namespace"] == "slurm"
    assert prs[0]["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    off = run(argv + ["--set", "prometheusRule.enabled=false"])
    assert off.returncode == 0 and "PrometheusRule" not in off.stdout
